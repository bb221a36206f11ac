"""The doctor's Spark task: what one executor slot would give a node, as a JSON-able dict.

Shipped *by value* (``cloudpickle.register_pickle_by_value``) and written against the
standard library and pyspark only, so that it runs — and says what is wrong — on an
executor whose Python has neither TensorFlow nor tfos_nb (the executor id comes from
``executor/identity.py``, which travels by value with it).  Versions and the TensorFlow
import come from a child Python (the executor's own interpreter) with a deadline, so a
broken TensorFlow cannot hang the task.  Nothing here decides OK or FAIL: the driver does
(``doctor/verdicts.py``).

One task per requested node, in one barrier stage:

1. facts: executor, host (the address a node would register), Python, ``PYSPARK_PYTHON``,
   versions, the task's Spark GPUs and what ``nvidia-smi`` shows;
2. each task listens on a port like the ones the nodes use, on that host address, writes a
   token into the export directory, and publishes both through ``allGather``;
3. each task connects to every other task's port (and the driver's, on a classic session)
   and reads every other task's token; a second ``barrier()`` keeps every listener open
   until all have tried; then each closes its socket and removes its token.
"""

from __future__ import annotations

import errno
import json
import os
import random
import secrets
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..executor.identity import executor_id

CONNECT_TIMEOUT_S = 3.0

# Run by the executor's Python: one JSON line of versions as soon as they are known, then one
# with TensorFlow's import (so a TensorFlow that hangs still leaves the versions behind).
_VERSIONS = r"""
import json, sys, time
from importlib import metadata
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable}
for dist in ("tensorflow", "tensorflow-cpu", "keras", "tf_keras", "pyspark", "tensorflow-io"):
    try:
        out[dist] = metadata.version(dist)
    except Exception:
        out[dist] = None
try:
    import pyspark
    out["pyspark_module"] = pyspark.__version__
except Exception as exc:
    out["pyspark_module"] = None
try:
    import tfos_nb
    out["tfos_nb"] = tfos_nb.__version__
    out["tfos_nb_path"] = tfos_nb.__file__
except Exception as exc:
    out["tfos_nb"] = None
    out["tfos_nb_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out), flush=True)
t0 = time.monotonic()
try:
    import tensorflow as tf
    tf_out = {"tf_import_s": time.monotonic() - t0, "tf_module": tf.__version__}
except BaseException as exc:
    tf_out = {"tf_import_s": time.monotonic() - t0, "tf_error": "%s: %s" % (type(exc).__name__, exc)}
print(json.dumps(tf_out), flush=True)
"""


def _versions(timeout: float) -> dict[str, Any]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1")
    for var in ("PYTHON_WORKER_FACTORY_SECRET", "_PYSPARK_DRIVER_CONN_INFO_PATH"):
        env.pop(var, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # what this worker imports (Spark's zips too)
    proc = subprocess.Popen([sys.executable, "-c", _VERSIONS], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.kill()
        out, err = proc.communicate()
    facts: dict[str, Any] = {}
    for line in out.splitlines():
        try:
            part = json.loads(line)
        except ValueError:
            continue
        if isinstance(part, dict):
            facts.update(part)
    if timed_out and "tf_import_s" not in facts:
        facts["tf_error"] = f"importing TensorFlow took longer than {timeout:.0f} s (killed)"
        facts["tf_timed_out"] = True
    if "python" not in facts:
        facts["versions_error"] = f"the executor's Python failed ({proc.returncode}): {err.strip()[-500:]}"
    return facts


def _host(towards: str | None) -> str:
    """The address a node's supervisor registers: the local address towards the driver (classic sessions)."""
    if towards:
        family = socket.AF_INET6 if ":" in towards else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.connect((towards, 9))
                return str(s.getsockname()[0])
            except OSError:
                pass
    try:
        return str(socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)[0][4][0])
    except OSError:
        return "127.0.0.1"


def _listen(host: str) -> socket.socket:
    """A listener on ``host`` at a port below the ephemeral range, where the nodes' TensorFlow ports are picked."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    lo, hi = max(1024, low - 12000), low - 1
    for port in [random.randint(lo, hi) for _ in range(32)] + [0]:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
            sock.listen(64)
            return sock
        except OSError:
            sock.close()
    raise OSError(f"cannot listen on {host}")


def _connect(host: str, port: int) -> str | None:
    """None when a TCP connection to ``host:port`` opens within the timeout, else why not."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _gpus(tctx: Any) -> dict[str, Any]:
    import csv
    import io
    import shutil

    res = tctx.resources().get("gpu")
    out: dict[str, Any] = {"spark_gpus": list(res.addresses) if res is not None else [], "nvidia_smi": None}
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return out
    try:
        run = subprocess.run([exe, "--query-gpu=index,uuid,name", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["nvidia_smi_error"] = f"{type(exc).__name__}: {exc}"
        return out
    if run.returncode != 0:
        out["nvidia_smi_error"] = f"nvidia-smi exited {run.returncode}: {run.stderr.strip()[-300:]}"
        return out
    out["nvidia_smi"] = [{"index": r[0].strip(), "uuid": r[1].strip(), "name": r[2].strip()}
                         for r in csv.reader(io.StringIO(run.stdout)) if len(r) >= 3]
    return out


def _absolute(path: str, default_fs: str) -> str:
    """The path as ``ctx.absolute_path`` gives it to a node (tfos_nb's rule when tfos_nb imports here)."""
    try:
        from tfos_nb.runtime.executor.context import hdfs_path
    except ImportError:
        return path
    return str(hdfs_path(type("Ctx", (), {"defaultFS": default_fs, "working_dir": os.getcwd()})(), path))


def _hadoop_env() -> dict[str, Any]:
    classpath = os.environ.get("CLASSPATH", "")
    dirs = [os.environ.get("ARROW_LIBHDFS_DIR", ""), os.environ.get("HADOOP_HDFS_HOME", ""), os.environ.get("HADOOP_HOME", "")]
    candidates = [os.path.join(d, "libhdfs.so") for d in dirs[:1] if d]
    candidates += [os.path.join(d, "lib", "native", "libhdfs.so") for d in dirs[1:] if d]
    candidates += [os.path.join(d, "libhdfs.so") for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    return {
        "classpath_set": "hadoop" in classpath.lower(),
        "libhdfs": next((c for c in candidates if os.path.isfile(c)), None),
        "java_home": os.environ.get("JAVA_HOME"),
        "hadoop_home": os.environ.get("HADOOP_HOME") or os.environ.get("HADOOP_HDFS_HOME"),
    }


_TOKEN_MAX = 64  # bytes read of a peer's token file (a token is 16)


def _write_token(directory: str, name: str, token: str) -> str | None:
    """None when the token file was written (the directory made if missing), else why not.

    The directory may be shared (an export folder others can write, like /tmp) and the name is predictable
    once the first task's file shows the run's id: the file is made new (``O_EXCL``), never through a symlink
    (``O_NOFOLLOW``), 0600.  A file or link already there is a reason, never written through.  By hand, not
    with tfos_nb's ``private`` helpers: this task runs where tfos_nb may not be installed.
    """
    path = os.path.join(directory, name)
    try:
        os.makedirs(directory, exist_ok=True)  # FileExistsError too when a file has the directory's name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        if not os.path.isdir(directory):
            return f"FileExistsError: {directory} is not a directory"
        return (f"something is already at {path} (a file or a symlink someone else put there?): "
                "not written through; remove it, or choose a directory other users cannot write")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _read_token(directory: str, name: str, token: str) -> str | None:
    """None when the peer's token file holds ``token``, else why not: a symlink is not followed, and a file that is
    not a regular file of this user's is not taken for the peer's (the peers run as this user)."""
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"a symlink is at {path}, not the peer's token (not followed)"
        return f"{type(exc).__name__}: {exc}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is not a regular file (not the peer's token)"
        if st.st_uid != os.geteuid():
            return f"{path} is owned by uid {st.st_uid}, not this user ({os.geteuid()}): not the peer's token"
        got = os.read(fd, _TOKEN_MAX).decode("utf-8", "replace")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        os.close(fd)
    return None if got == token else "another file is there (not this task's token)"


def probe(plan: dict[str, Any], tctx: Any) -> dict[str, Any]:
    """This task's facts (one node's view); every task of the barrier stage must call it."""
    t0 = time.monotonic()
    task = tctx.partitionId()
    driver = plan.get("driver")  # [host, port] of the doctor's listener on a classic driver
    facts: dict[str, Any] = {
        "task": task, "executor": executor_id() or "?", "pid": os.getpid(), "hostname": socket.gethostname(),
        "host": _host(driver[0] if driver else plan.get("towards")), "cwd": os.getcwd(),
        "pyspark_python_env": os.environ.get("PYSPARK_PYTHON"), "python_executable": sys.executable,
        "task_cpus": _task_cpus(tctx),
    }
    facts.update(_gpus(tctx))
    facts.update(_versions(float(plan.get("import_timeout", 60))))
    sock: socket.socket | None = None
    try:
        sock = _listen(facts["host"])
        facts["port"] = sock.getsockname()[1]
    except OSError as exc:
        facts["listen_error"] = f"{type(exc).__name__}: {exc}"
    export, token, name = plan.get("export_dir"), secrets.token_hex(8), f".tfos_doctor-{plan['run']}-{task}"
    local = None
    if export:
        local = _absolute(str(export), str(plan.get("default_fs", "file:///")))
        facts["export_path"] = local
        if "://" in local and not local.startswith("file://"):
            facts["export_remote"] = True
            facts.update(_hadoop_env())
        else:
            local = local[len("file://"):] if local.startswith("file://") else local
            facts["write_error"] = _write_token(local, name, token)
    mine = {"task": task, "host": facts["host"], "port": facts.get("port"), "executor": facts["executor"],
            "token": token if export and facts.get("write_error") is None and local else None}
    peers = [json.loads(s) for s in tctx.allGather(json.dumps(mine))]
    reach: dict[str, str | None] = {}
    seen: dict[str, str | None] = {}
    for p in peers:
        if p["task"] == task:
            continue
        if p.get("port") is not None:
            reach[str(p["task"])] = _connect(p["host"], int(p["port"]))
        if p.get("token") and local:
            seen[str(p["task"])] = _read_token(local, f".tfos_doctor-{plan['run']}-{p['task']}", p["token"])
    facts["reach"], facts["seen"] = reach, seen
    if driver:
        facts["driver_error"] = _connect(str(driver[0]), int(driver[1]))
    tctx.barrier()  # every peer has tried every listener and token
    if sock is not None:
        sock.close()
    if mine["token"] and local:
        try:
            os.remove(os.path.join(local, name))
        except OSError:
            pass
    facts["probe_s"] = time.monotonic() - t0
    return facts


def _task_cpus(tctx: Any) -> int | None:
    try:
        return int(tctx.cpus())
    except Exception:  # noqa: BLE001 - older pyspark
        return None


def classic_task(plan: dict[str, Any]) -> Callable[[Iterable[Any]], Iterator[str]]:
    """The barrier ``mapPartitions`` body of a classic session."""

    def task(_: Iterable[Any]) -> Iterator[str]:
        from pyspark import BarrierTaskContext

        yield json.dumps(probe(plan, BarrierTaskContext.get()))

    return task


def connect_task(plan: dict[str, Any]) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The barrier ``mapInArrow`` body of a Spark Connect session (one string column ``s``)."""

    def task(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import BarrierTaskContext

        for _ in batches:
            pass
        out = json.dumps(probe(plan, BarrierTaskContext.get()))
        yield pa.RecordBatch.from_pydict({"s": [out]}, schema=pa.schema([("s", pa.string())]))

    return task
