"""The embedded Spark the magics start (no Spark session in the kernel) listens on loopback only.

On a laptop, nothing of it may be reachable from the local network: a real kernel calls
``spark_session()`` (what ``%%tfos_cluster`` does when the kernel has no Spark), runs a
fed cluster with TensorBoard in the background, and while it runs every listening socket
of the kernel (tfos_nb's control server), the driver JVM (the local-cluster's master and
workers run inside it), the executor JVMs, their Python workers, the supervisors, the
node processes (data servers) and TensorBoard is on 127.0.0.1.

TensorFlow's own gRPC server (``tf.distribute`` strategies) binds the wildcard address in
TensorFlow's C++ code, whatever tfos_nb asks; the cell does not start one (README: Safe by
default).
"""

from __future__ import annotations

import ipaddress
import os
import sys

import psutil
import pytest

from tests.conftest import KERNEL, NODE_ENV, kernel_execute, wait_until
from tests.server_abuse import as_nobody, fork_as_nobody

pytestmark = pytest.mark.slow

NODE_CELL = """\
%%tfos_cluster --workers 2 --data df --epochs 1 --tensorboard --logdir {logdir} --background --name lb
import os
import time

while not os.path.exists({stop!r}):  # the test says when it has looked
    time.sleep(0.1)
n = 0
feed = ctx.get_data_feed()
while not feed.should_stop():
    n += len(feed.next_batch(100))
ctx.report(rows=n)
"""


def _tree(kernel_pid: int) -> dict[int, str]:
    """pid -> what it is, for the kernel, its descendants, and the runtime processes it started."""
    procs: dict[int, str] = {}
    kernel = psutil.Process(kernel_pid)
    roots = [kernel, *(p for p in psutil.process_iter() if _driver_pid(p) == kernel_pid)]
    for root in roots:
        for p in [root, *root.children(recursive=True)]:
            try:
                cmd = p.cmdline()
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.Error:
                continue
            if p.pid == kernel_pid:
                what = "kernel"
            elif "tfos_nb.runtime" in cmd:
                what = "node" if "node" in cmd else "supervisor"
            elif any("tensorboard" in c for c in cmd):
                what = "tensorboard"
            elif "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd:
                what = "executor"
            elif "org.apache.spark.deploy.SparkSubmit" in cmd:
                what = "driver-jvm"
            else:
                what = os.path.basename(cmd[0]) if cmd else "?"
            procs[p.pid] = what
    return procs


def _driver_pid(p: psutil.Process) -> int | None:
    try:
        if "tfos_nb.runtime" not in " ".join(p.cmdline()):
            return None
        return int(p.environ().get("TFOS_DRIVER_PID", "0"))
    except (psutil.Error, ValueError):
        return None


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a JVM's IPv6 socket bound to 127.0.0.1 shows as ::ffff:127.0.0.1
    return ip.is_loopback


def _listeners(procs: dict[int, str]) -> list[tuple[str, int, str, int]]:
    """(what, pid, address, port) of every listening TCP socket of these processes."""
    found = []
    for pid, what in procs.items():
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        found += [(what, pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def test_embedded_spark_and_cluster_listen_on_loopback_only(kernel_specs, tmp_path):
    from jupyter_client.manager import KernelManager

    stop = tmp_path / "stop"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, **NODE_ENV)
    env.pop("SPARK_LOCAL_IP", None)  # the default a laptop user has
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()

    def execute(code: str, timeout: float = 300) -> str:
        return kernel_execute(kc, code, timeout)

    try:
        kc.wait_for_ready(timeout=120)
        out = execute("%load_ext tfos_nb\n%config TFOSMagics.renderer = 'none'\n"
                      "from tfos_nb.magics import spark_session\n"
                      "spark = spark_session(nodes=2)\n"
                      "df = spark.range(0, 400, numPartitions=4).selectExpr('cast(id as float) as x')\n")
        assert "starting an embedded one (local-cluster[2,1,1024]; Spark and tfos_nb listen on 127.0.0.1 only, " \
            "but TensorFlow's own gRPC ports listen on all interfaces" in out, out
        execute(NODE_CELL.format(logdir=str(tmp_path / "logs"), stop=str(stop)))
        kernel_pid = km.provisioner.pid

        def everything_up() -> bool:
            procs = _tree(kernel_pid)
            kinds = set(procs.values())
            listening = {what for what, _, _, _ in _listeners(procs)}
            return (sum(1 for w in procs.values() if w == "node") == 2 and "executor" in kinds
                    and {"kernel", "driver-jvm", "executor", "node", "tensorboard"} <= listening)

        assert wait_until(everything_up, 240, interval=0.5), (_tree(kernel_pid), _listeners(_tree(kernel_pid)))
        procs = _tree(kernel_pid)
        listeners = _listeners(procs)
        exposed = [entry for entry in listeners if not _loopback(entry[2])]
        assert not exposed, f"listening beyond loopback: {exposed}"
        # every executor JVM and every node has its own listener (block manager; data server)
        pids_listening = {pid for _, pid, _, _ in listeners}
        for what in ("executor", "node"):
            pids = [pid for pid, w in procs.items() if w == what]
            assert len(pids) == 2 and set(pids) <= pids_listening, (what, procs, listeners)

        _assert_spark_refuses_a_client_without_the_secret(execute, procs, listeners)

        stop.write_text("stop")
        out = execute("lb.wait(timeout=120)\nprint(lb.result['state'], sum(m.get('rows', 0) for m in lb.result['metrics'].values()))")
        assert out.split() == ["finished", "400"], out
        execute("spark.stop()")
    finally:
        if not stop.exists():
            stop.write_text("stop")
        kc.stop_channels()
        km.shutdown_kernel()  # a shutdown request, as Jupyter sends: its Spark stops with it


def _assert_spark_refuses_a_client_without_the_secret(execute, procs: dict[int, str], listeners: list) -> None:
    """The embedded Spark's RPC is authenticated: another local user's Spark client cannot use its master.

    Spark's own client (``deploy.Client kill``, a few seconds' JVM) is pointed at every port the driver JVM
    listens on (the local-cluster's master and workers live in it): without ``spark.authenticate`` the
    master answers it (its ``ClientEndpoint`` goes on to poll the master: the door to running code as this
    user); with it, each server refuses the unauthenticated connection.  The secret never appears on a
    command line (``/proc/PID/cmdline`` is readable by everyone).
    """
    import re
    import subprocess

    from pyspark.find_spark_home import _find_spark_home

    out = execute("print(spark.sparkContext.getConf().get('spark.authenticate'), "
                  "spark.sparkContext.getConf().get('spark.authenticate.secret'))")
    enabled, secret = out.split()
    assert enabled == "true" and re.fullmatch(r"[0-9a-f]{64}", secret), out
    for p in psutil.process_iter():
        try:
            assert secret not in " ".join(p.cmdline()), (p.pid, "the secret is on a command line")
        except psutil.Error:
            continue
    spark_class = os.path.join(_find_spark_home(), "bin", "spark-class")
    driver_ports = sorted({port for what, _, _, port in listeners if what == "driver-jvm"})
    assert len(driver_ports) >= 3, listeners  # the driver's RPC, the master's, the workers'
    answered = []
    for port in driver_ports:
        run = subprocess.run([spark_class, "org.apache.spark.deploy.Client", "kill", f"spark://127.0.0.1:{port}", "driver-0"],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
        if "ClientEndpoint" in run.stdout + run.stderr:
            answered.append((port, (run.stdout + run.stderr)[-600:]))
    assert not answered, answered


# A process holding an embedded Spark (``spark_session``, as a notebook calls it) with executors and their Python
# workers up; it prints the secrets to look for (the Spark RPC secret from the JVM's SparkConf, Spark Connect's token
# from this process's environment, where pyspark's client reads it), then stops the Spark when its stdin says so.
_HOLDER = """\
import json, os, sys
from tfos_nb.magics import spark_session
from tfos_nb.magics._spark import stop_embedded
spark = spark_session(nodes=2, connect={connect})
assert spark.range(0, 4, 1, 2).mapInPandas(lambda batches: batches, "id long").count() == 4
from pyspark import SparkContext
conf = SparkContext._active_spark_context.getConf()  # the JVM's own context (in Connect mode, the server's)
print("HOLDING", json.dumps({{"secret": conf.get("spark.authenticate.secret"),
                             "token": os.environ.get("SPARK_CONNECT_AUTHENTICATE_TOKEN", ""),
                             "port": conf.get("spark.connect.grpc.binding.port", "")}}), flush=True)
sys.stdin.readline()
stop_embedded()
"""


def _read_proc_as_nobody(needles: dict[str, bytes]) -> tuple[list[str], set[int]]:
    """As uid nobody: which of ``needles`` each readable ``/proc/PID/cmdline`` and ``/proc/PID/environ`` holds
    (``"PID/file: name"``), and the pids whose command line it could read."""
    r, w = os.pipe()

    def scan() -> None:
        os.close(r)
        lines = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            for part in ("cmdline", "environ"):
                try:
                    with open(f"/proc/{name}/{part}", "rb") as f:
                        data = f.read()
                except OSError:  # not readable by nobody (environ: another uid's), or the process ended
                    continue
                if part == "cmdline":
                    lines.append(f"read {name}")
                lines += [f"found {name}/{part}: {what}" for what, needle in needles.items() if needle in data]
        with os.fdopen(w, "w") as out:
            out.write("\n".join(lines))

    pid = fork_as_nobody(scan)
    os.close(w)
    with os.fdopen(r) as answer:
        lines = answer.read().splitlines()
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"the scan as nobody failed ({status})"
    found = [line.removeprefix("found ") for line in lines if line.startswith("found ")]
    return found, {int(line.split()[1]) for line in lines if line.startswith("read ")}


@pytest.mark.parametrize("connect", [False, True], ids=["classic", "connect"])
def test_no_other_user_reads_the_embedded_spark_secrets(connect):
    """Another local user reads every process's command line (``/proc/PID/cmdline``) and the environment of its
    own processes: neither holds the embedded Spark's RPC secret nor, in Connect mode, the Connect server's token
    (with either, that user could join the master, the workers or the driver, or drive the server, as this user)."""
    import json
    import subprocess
    import threading

    as_nobody()
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE",
                        "SPARK_CONNECT_AUTHENTICATE_TOKEN", "TFOS_NB_SPARK_CONNECT", "SPARK_LOCAL_IP")}
    env.update(NODE_ENV, PYSPARK_PYTHON=sys.executable)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER.format(connect=connect)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env, text=True)
    assert holder.stdin is not None and holder.stdout is not None
    deadline = threading.Timer(300, holder.kill)  # a Spark that never comes up ends the readline below
    deadline.start()
    try:
        output = []
        for line in holder.stdout:  # until the holder holds (EOF: it failed, or the deadline killed it)
            output.append(line)
            if line.startswith("HOLDING "):
                break
        deadline.cancel()
        assert output and output[-1].startswith("HOLDING "), (holder.poll(), "".join(output)[-2000:])
        held = json.loads(output[-1].removeprefix("HOLDING "))
        secret, token = held["secret"], held["token"]
        assert secret and len(secret) == 64, held
        needles = {"the Spark RPC secret": secret.encode()}
        if connect:
            assert token, held
            needles["the Spark Connect token"] = token.encode()
        spark_procs = psutil.Process(holder.pid).children(recursive=True)
        jvms = [p.pid for p in spark_procs if p.name() == "java"]
        assert len(jvms) >= 3, [p.cmdline() for p in spark_procs]  # the driver's JVM and two executors'

        found, read = _read_proc_as_nobody(needles)
        assert not found, f"readable by uid nobody: {found}"
        assert set(jvms) <= read, (jvms, "nobody could not read these command lines: the scan proves nothing")
        if connect:
            _assert_connect_server_refuses_a_client_without_the_token(int(held["port"]), env)
    finally:
        deadline.cancel()
        if holder.poll() is None:
            holder.stdin.write("stop\n")
            holder.stdin.flush()
        try:
            holder.wait(120)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait(10)


def _assert_connect_server_refuses_a_client_without_the_token(port: int, env: dict[str, str]) -> None:
    """The token guards the server: a Spark Connect client without it (what another user has) runs nothing."""
    import subprocess

    client = ("from pyspark.sql.connect.session import SparkSession\n"
              f"SparkSession.builder.remote('sc://127.0.0.1:{port}').getOrCreate().range(1).collect()\n")
    run = subprocess.run([sys.executable, "-c", client], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode != 0 and "UNAUTHENTICATED" in run.stderr, (run.returncode, run.stderr[-2000:])
