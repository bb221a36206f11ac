"""A real Spark standalone cluster whose workers live in their own network namespaces.

Used by ``tests/test_multihost.py``; also runnable by hand::

    sudo .venv/bin/python -m tests.netns_cluster      # prints the master URL, Ctrl-C tears down

Layout (one ``/24`` picked at random among unused ``10.200-249.x.0`` subnets, and a
random IPv6 ULA ``/64`` beside it)::

    root namespace: bridge tfbr-<tag>  10.a.b.1   Spark master :7077, the driver, Jupyter
                     ├─ veth ── namespace tfos-<tag>-w0: eth0 10.a.b.10   Worker
                     └─ veth ── namespace tfos-<tag>-w1: eth0 10.a.b.11   Worker

Every process started here (and so every executor, Python worker, tfos_nb supervisor
and node below them) carries ``TFOS_NETNS_TAG=<tag>`` in its environment, which is how
:meth:`NetnsCluster.leftovers` finds anything that outlived the teardown.
"""

from __future__ import annotations

import glob
import ipaddress
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
MASTER_PORT = 7077
TAG_ENV = "TFOS_NETNS_TAG"


class NamespacesUnavailable(Exception):
    """Network namespaces cannot be made here (not root, no iproute2, no CAP_NET_ADMIN)."""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _ip_ok(*args: str) -> None:
    res = _ip(*args)
    if res.returncode != 0:
        msg = f"`ip {' '.join(args)}` failed ({res.returncode}): {res.stderr.strip()}"
        raise RuntimeError(msg)


def pyspark_bin(name: str) -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", name)


def _free_subnet() -> str:
    """``10.a.b`` not used by any address or route of the root namespace."""
    used = _ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout
    rng = random.SystemRandom()
    for _ in range(200):
        prefix = f"10.{rng.randrange(200, 250)}.{rng.randrange(1, 255)}"
        if f"{prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test bridge")


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen
    log: Path

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class NetnsCluster:
    """Bridge + namespaces + master + workers; :meth:`start` and :meth:`stop` (idempotent)."""

    workdir: Path
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    tag: str = field(default_factory=lambda: secrets.token_hex(3))  # names stay under IFNAMSIZ: tfv-<tag>-0
    prefix: str = ""
    prefix6: str = field(default_factory=lambda: f"fd7f:{secrets.token_hex(2)}:{secrets.token_hex(2)}:")
    daemons: list[Daemon] = field(default_factory=list)
    _links: list[str] = field(default_factory=list)
    _namespaces: list[str] = field(default_factory=list)

    # -- addresses ---------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"tfbr-{self.tag}"

    @property
    def host_ip(self) -> str:
        """The root namespace's address on the bridge: master, driver, Jupyter."""
        return f"{self.prefix}.1"

    @property
    def master_url(self) -> str:
        return f"spark://{self.host_ip}:{MASTER_PORT}"

    def namespace(self, i: int) -> str:
        return f"tfos-{self.tag}-w{i}"

    def worker_ip(self, i: int) -> str:
        return f"{self.prefix}.{10 + i}"

    @property
    def host_ip6(self) -> str:
        """The root namespace's IPv6 (ULA) address on the bridge, in canonical form (as resolvers print it:
        a random group like ``0ec1`` is ``ec1``)."""
        return str(ipaddress.IPv6Address(f"{self.prefix6}:1"))

    def worker_ip6(self, i: int) -> str:
        return str(ipaddress.IPv6Address(f"{self.prefix6}:{10 + i}"))

    @property
    def worker_ips(self) -> list[str]:
        return [self.worker_ip(i) for i in range(self.workers)]

    def netns_inode(self, i: int) -> int:
        return os.stat(f"/run/netns/{self.namespace(i)}").st_ino

    # -- lifecycle ---------------------------------------------------------------
    def start(self, timeout: float = 120) -> NetnsCluster:
        try:
            self._network()
            self._spark(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        if os.geteuid() != 0:
            raise NamespacesUnavailable("network namespaces need root (ip netns add); running as uid %d" % os.geteuid())
        if shutil.which("ip") is None:
            raise NamespacesUnavailable("iproute2's `ip` is not installed")
        for _ in range(5):
            res = _ip("netns", "add", self.namespace(0))
            if res.returncode == 0 or "File exists" not in res.stderr:
                break
            self.tag = secrets.token_hex(3)  # another cluster (a concurrent test run) has this tag: take another
        if res.returncode != 0:
            raise NamespacesUnavailable(f"`ip netns add` failed: {res.stderr.strip()}")
        self._namespaces.append(self.namespace(0))
        self.prefix = _free_subnet()
        _ip_ok("link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        _ip_ok("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _ip_ok("addr", "add", f"{self.host_ip6}/64", "dev", self.bridge, "nodad")
        _ip_ok("link", "set", self.bridge, "up")
        for i in range(self.workers):
            ns, veth = self.namespace(i), f"tfv-{self.tag}-{i}"
            if ns not in self._namespaces:
                _ip_ok("netns", "add", ns)
                self._namespaces.append(ns)
            _ip_ok("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._links.insert(0, veth)
            _ip_ok("link", "set", veth, "master", self.bridge, "up")
            _ip_ok("-n", ns, "link", "set", "lo", "up")  # TensorBoard's data server talks over loopback
            _ip_ok("-n", ns, "addr", "add", f"{self.worker_ip(i)}/24", "dev", "eth0")
            _ip_ok("-n", ns, "addr", "add", f"{self.worker_ip6(i)}/64", "dev", "eth0", "nodad")
            _ip_ok("-n", ns, "link", "set", "eth0", "up")

    def daemon_env(self, local_ip: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                TAG_ENV: self.tag,
                "SPARK_LOCAL_IP": local_ip,
                "SPARK_DAEMON_MEMORY": "256m",
                "PYSPARK_PYTHON": sys.executable,
                "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            }
        )
        env.pop("SPARK_HOME", None)
        return env

    def _launch(self, name: str, cmd: list[str], env: dict[str, str]) -> Daemon:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        d = Daemon(name, proc, log)
        self.daemons.append(d)
        return d

    def _wait_log(self, d: Daemon, needle: str, deadline: float) -> None:
        while needle not in d.tail(400):
            if d.proc.poll() is not None:
                msg = f"{d.name} exited with {d.proc.returncode}:\n{d.tail()}"
                raise RuntimeError(msg)
            if time.monotonic() > deadline:
                msg = f"{d.name}: no {needle!r} in its log in time:\n{d.tail()}"
                raise RuntimeError(msg)
            time.sleep(0.2)

    def _spark(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        spark_class = pyspark_bin("spark-class")
        master = self._launch(
            "master",
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", self.host_ip, "--port", str(MASTER_PORT), "--webui-port", "0"],
            dict(self.daemon_env(self.host_ip), SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false"),
        )
        self._wait_log(master, "I have been elected leader", deadline)
        started = []
        for i in range(self.workers):
            work = self.workdir / f"worker{i}"
            work.mkdir(exist_ok=True)
            cmd = ["ip", "netns", "exec", self.namespace(i), spark_class, "org.apache.spark.deploy.worker.Worker"]
            cmd += ["--host", self.worker_ip(i), "--cores", str(self.worker_cores), "--memory", self.worker_memory]
            cmd += ["--work-dir", str(work), "--webui-port", "0", self.master_url]
            started.append(self._launch(f"worker{i}", cmd, self.daemon_env(self.worker_ip(i))))
        for w in started:
            self._wait_log(w, "Successfully registered with master", deadline)

    def stop(self) -> None:
        """Kill every daemon's process group, then remove links and namespaces."""
        for d in reversed(self.daemons):
            kill_group(d.proc)
        self.daemons.clear()
        for link in self._links:
            _ip("link", "del", link)
        self._links.clear()
        for ns in self._namespaces:
            _ip("netns", "del", ns)
        self._namespaces.clear()

    # -- leak checks ---------------------------------------------------------------
    def leftovers(self) -> list[str]:
        """Processes carrying this cluster's tag, links and namespaces still there."""
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.pid != os.getpid() and p.environ().get(TAG_ENV) == self.tag:
                    found.append(f"pid {p.pid}: {' '.join(p.info['cmdline'] or [])[:200]}")
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        links = _ip("-o", "link").stdout
        names = (self.bridge, *(f"tfv-{self.tag}-{i}" for i in range(self.workers)))
        found += [f"link {name}" for name in names if f" {name}:" in links or f" {name}@" in links]
        netns = _ip("netns", "list").stdout
        found += [f"netns {self.namespace(i)}" for i in range(self.workers) if self.namespace(i) in netns]
        found += [f"netns mount {p}" for p in glob.glob(f"/run/netns/tfos-{self.tag}-*")]
        return found

    def kill_leftovers(self) -> None:
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and p.environ().get(TAG_ENV) == self.tag:
                    p.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue


def netns_fixture(worker_cores: int, worker_memory: str) -> Any:
    """A module-scoped ``netns`` fixture (``netns = netns_fixture(2, "2g")`` at a test module's top level): a
    :class:`NetnsCluster` of two workers, skipped (failed in CI) where namespaces cannot be made.

    Modules asking for the same workers run one after another and share the cluster (its start is
    ~25 s); the last of them stops it and checks that nothing of it is left.
    """
    from tests.conftest import shared_module_fixture, skip_environment, wait_until

    def start(tmp_path_factory: Any) -> NetnsCluster:
        cluster = NetnsCluster(tmp_path_factory.mktemp("netns"), worker_cores=worker_cores,
                               worker_memory=worker_memory)
        t0 = time.monotonic()
        try:
            cluster.start()
        except NamespacesUnavailable as exc:
            skip_environment(f"cannot make network namespaces here: {exc}")
        print(f"\n[netns] standalone cluster up in {time.monotonic() - t0:.1f} s: {cluster.master_url}, "
              f"workers {cluster.worker_ips}")
        return cluster

    def stop(cluster: NetnsCluster) -> None:
        cluster.stop()
        gone = wait_until(lambda: not cluster.leftovers(), 20, 0.2)
        left = cluster.leftovers()
        if left:
            cluster.kill_leftovers()
        assert gone, f"left behind after teardown: {left}"

    return shared_module_fixture(("netns", worker_cores, worker_memory),
                                 sys._getframe(1).f_globals["__name__"], start, stop)


def kill_group(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the process group (Spark's daemons stop their executors), then SIGKILL what is left."""
    pgid = proc.pid  # started with start_new_session: the leader's pid is the group id
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def main() -> int:
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="tfos-netns-"))
    cluster = NetnsCluster(work)
    try:
        cluster.start()
    except NamespacesUnavailable as exc:
        print(f"cannot make network namespaces: {exc}", file=sys.stderr)
        return 2
    try:
        print(f"master {cluster.master_url}; driver address {cluster.host_ip}; workers {', '.join(cluster.worker_ips)}")
        print(f"logs in {work}; Ctrl-C to stop", flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
