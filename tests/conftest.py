"""Fixtures shared by the test modules: real Spark, waiting on a condition, leak checks.

Each module that needs Spark gets one ``local-cluster`` session (real master,
workers and executor JVMs): ``spark = spark_fixture(2)`` at module level makes the
module-scoped ``spark`` fixture (``sc`` is its SparkContext), stopped at the end of
the module; :func:`spark_session` builds one directly.  TensorFlow gets one
intra-op thread per node (``NODE_ENV``).  Tests wait on a condition with
:func:`wait_until` (a deadline, never a bare sleep).

Tiers (markers, pytest.ini): ``slow`` is everything that starts Spark, TensorFlow, a
kernel or a server (``-m "not slow"`` is the fast tier); ``browser``, ``multihost`` and
``faults`` pick the heaviest slow modules.  ``bash test.sh`` runs them all.
"""

from __future__ import annotations

import collections
import importlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import psutil
import pytest

from tfos_nb.runtime import net

# One Keras for the whole test process, whatever module first touches ``tf.keras``: tf_keras, the Keras the nodes
# train with by default (``TFCluster.run(keras="tf_keras")``) and the one ``TFModel`` rebuilds checkpoints with.
# TensorFlow picks the flavour at the first ``tf.keras`` access; a test building a Keras 3 model in this process
# before test_pipeline made its checkpoint style fail ("Keras 3 only supports V3 .keras files").
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

NODE_ENV = {
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "2",
    "OMP_NUM_THREADS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


# Every Spark JVM the tests start (test sessions, kernels' embedded Spark, Connect servers, spark-submit) lives for
# seconds to minutes: the client JIT alone (no C2 compiler threads taking the 2 cores from the nodes) and the serial
# collector, by a spark-defaults.conf of the test run's own (SPARK_CONF_DIR, inherited by every child process).
# Measured on tests/test_runtime_spark.py, 3 runs each: 132-147 s against 155-160 s.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_spark_conf_dir: tempfile.TemporaryDirectory | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _spark_conf_dir
    if "SPARK_CONF_DIR" in os.environ:  # the caller's own Spark configuration wins
        return
    _spark_conf_dir = tempfile.TemporaryDirectory(prefix="tfos-nb-test-spark-conf-")
    os.chmod(_spark_conf_dir.name, 0o755)  # tests run some processes as another user
    defaults = os.path.join(_spark_conf_dir.name, "spark-defaults.conf")
    with open(defaults, "w") as f:
        f.write(f"spark.driver.extraJavaOptions {TEST_JVM_OPTIONS}\nspark.executor.extraJavaOptions {TEST_JVM_OPTIONS}\n")
    os.chmod(defaults, 0o644)
    os.environ["SPARK_CONF_DIR"] = _spark_conf_dir.name


def pytest_unconfigure(config: pytest.Config) -> None:
    if _spark_conf_dir is not None:
        os.environ.pop("SPARK_CONF_DIR", None)
        _spark_conf_dir.cleanup()


KERNEL = "tfos-nb-test"

# Set (to anything but 0) where every tier must run: .ci/run sets it, so in CI a test this machine cannot run fails
REQUIRE_ALL_TIERS = "TFOS_NB_REQUIRE_ALL_TIERS"


def skip_environment(reason: str) -> NoReturn:
    """Skip a test that this machine cannot run (no root, no network namespaces, a package missing).

    With ``TFOS_NB_REQUIRE_ALL_TIERS`` set (CI) the test fails with ``reason`` instead: a tier cannot vanish
    from CI as a line of skips.  Every skip that depends on the environment goes through here.
    """
    if os.environ.get(REQUIRE_ALL_TIERS, "0") not in ("", "0"):
        pytest.fail(f"{reason}; {REQUIRE_ALL_TIERS} is set: every tier must run here", pytrace=False)
    pytest.skip(reason)


def import_or_skip(name: str) -> Any:
    """``pytest.importorskip(name)``, through :func:`skip_environment` (in CI a missing package fails)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        skip_environment(f"cannot import {name}: {exc}")


def kernel_spec_manager(kernels: Any, *extra_argv: str, name: str = KERNEL) -> Any:
    """A kernelspec ``name`` in the folder ``kernels`` running this interpreter (the project's venv), whatever
    python3 means elsewhere, with ``extra_argv`` for ipykernel; the ``KernelSpecManager`` that finds it."""
    import json

    from jupyter_client.kernelspec import KernelSpecManager

    spec = kernels / name
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}", *extra_argv],
        "display_name": "tfos_nb tests", "language": "python",
    }))
    return KernelSpecManager(kernel_dirs=[str(kernels)])


@pytest.fixture(scope="session")
def kernel_specs(tmp_path_factory):
    """:func:`kernel_spec_manager` for the session: kernel :data:`KERNEL`."""
    return kernel_spec_manager(tmp_path_factory.mktemp("kernels"))


@pytest.fixture(scope="module", autouse=True)
def _global_shell_forgets_its_clusters() -> Iterator[None]:
    """At each module's end, the process's one global IPython shell (``IPython.testing.globalipapp``, used by
    several modules) forgets the clusters and parallel runs its magics hold, and its ``%config TFOSMagics.…``
    settings go back to their defaults: the next module's magics start with none and with the defaults, whatever
    order the modules run in (a module's ``stall_after = 3`` once reached a later module's cells)."""
    yield
    if "IPython" not in sys.modules:
        return
    import IPython

    shell = IPython.get_ipython()
    magics = shell.magics_manager.registry.get("TFOSMagics") if shell is not None else None
    if magics is not None:
        magics.handles.clear()
        for name, trait in magics.traits(config=True).items():
            if getattr(magics, name) != trait.default_value:
                setattr(magics, name, trait.default_value)


def global_shell_with(spark: Any, name: str) -> Iterator[Any]:
    """A module-scoped ``ip`` fixture's body: the global IPython shell with tfos_nb loaded and ``spark`` in its
    namespace; at the end its clusters are stopped and forgotten, and the handle ``name`` leaves the namespace."""
    shell = ipython_with_tfos_nb()
    shell.user_ns["spark"] = spark
    yield shell
    magics = shell.magics_manager.registry["TFOSMagics"]
    magics.shutdown_all()
    magics.handles.clear()  # the shell is the process's one global shell: later modules start with no clusters
    shell.user_ns.pop(name, None)


def binary_frame(spark: Any, rows: int, width: int, informative: int, partitions: int) -> Any:
    """A seeded two-class DataFrame (``x array<float>``, ``y float``): the label is whether the sum of the first
    ``informative`` features is positive (a tutorial's separable set)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, width)).astype("float32")
    y = (x[:, :informative].sum(axis=1) > 0).astype("float32")
    return spark.createDataFrame([(r.tolist(), float(t)) for r, t in zip(x, y)], "x array<float>, y float").repartition(
        partitions)


def start_cluster(spark: Any, fn: Callable[..., Any], args: Any, n: int = 2, **kw: Any) -> Any:
    """``TFCluster.run`` as the tests call it: each node's TensorFlow with one thread (:data:`NODE_ENV`) unless
    ``env`` says otherwise."""
    from tfos_nb import TFCluster

    kw.setdefault("env", NODE_ENV)
    return TFCluster.run(spark, fn, args, n, **kw)


def spark_session(executors: int, memory_mb: int = 1024, conf: dict[str, str] | None = None,
                  python: str | None = None) -> Any:
    """A ``local-cluster`` session; ``python``: the executors' Python (``PYSPARK_PYTHON``; default this one)."""
    os.environ["PYSPARK_PYTHON"] = python or sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local-cluster[{executors},1,{memory_mb}]")
        .appName("tfos_nb-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.task.maxFailures", "1")
    )
    for key, value in NODE_ENV.items():  # executors, and so every node, get one TF thread each
        builder = builder.config(f"spark.executorEnv.{key}", value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


_SHARED_MODULES: dict[str, tuple] = {}  # test module -> the settings of what it may share with the next module
_shared: dict[str, Any] = {}  # "key", "value", "stop": the resource consecutive modules share (one at a time)


def shared_module_fixture(key: tuple, module: str, start: Callable[[pytest.TempPathFactory], Any],
                          stop: Callable[[Any], None], alive: Callable[[Any], bool] = lambda _: True) -> Any:
    """A module-scoped fixture whose value (made by ``start``) the next module reuses when it asks for the same
    ``key`` (:func:`share_with_next_module`); the last module of the run of them calls ``stop`` on it."""
    share_with_next_module(key, module)

    @pytest.fixture(scope="module")
    def fixture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        if _shared.get("key") != key or not alive(_shared["value"]):
            _stop_shared()
            _shared.update(key=key, value=start(tmp_path_factory), stop=stop)
        yield _shared["value"]
        if next_module_key(request) != key:
            _stop_shared()

    return fixture


def _stop_shared() -> None:
    stop, value = _shared.pop("stop", None), _shared.pop("value", None)
    _shared.pop("key", None)
    if stop is not None:
        stop(value)


def spark_fixture(executors: int, memory_mb: int = 1024, conf: dict[str, str] | None = None, *,
                  callback_server: bool = False) -> Any:
    """A module-scoped ``spark`` fixture: ``spark = spark_fixture(2)`` at a test module's top level.

    ``callback_server``: start PySpark's py4j callback server with the session (``foreachBatch``
    starts it, one per SparkContext, stopped with it), so ``no_leaks`` counts its port as Spark's.

    Modules asking for the same settings run one after another (:func:`pytest_collection_modifyitems`)
    and share one session (:func:`shared_module_fixture`).  A module that builds its own session
    (``spark_session``) never finds one left running.
    """

    def start(_: pytest.TempPathFactory) -> Any:
        session = spark_session(executors, memory_mb, conf)
        if callback_server:
            from pyspark.java_gateway import ensure_callback_server_started

            ensure_callback_server_started(session.sparkContext._gateway)
        return session

    key = ("spark", executors, memory_mb, tuple(sorted((conf or {}).items())), callback_server)
    return shared_module_fixture(key, sys._getframe(1).f_globals["__name__"], start, lambda s: s.stop(),
                                 alive=lambda s: s.sparkContext._jsc is not None)


def share_with_next_module(key: tuple, module: str) -> None:
    """Say that ``module`` (a test module's ``__name__``) uses a resource made with ``key``: the modules that say
    the same key run one after another, and a module's teardown can leave the resource to the next one."""
    _SHARED_MODULES[module] = key


def next_module_key(request: pytest.FixtureRequest) -> tuple | None:
    """The key the module run right after this one, in this process, gave :func:`share_with_next_module` (None:
    none)."""
    rest = items_after(request)
    return _SHARED_MODULES.get(rest[0].module.__name__) if rest else None


def items_after(request: pytest.FixtureRequest) -> list[pytest.Item]:
    """The tests this process runs after the last of ``request``'s module, as far as it knows them: the rest of
    the run; under pytest-xdist, the rest of the module's group (:func:`xdist_groups`: after it, this worker runs
    another group, whose modules share nothing with this one)."""
    items, here = request.session.items, request.module.__name__
    later = [i for i, item in enumerate(items) if item.module.__name__ == here]
    rest = items[(later[-1] + 1 if later else len(items)):]
    group = _XDIST_GROUP.get(here)
    return rest if group is None else [item for item in rest if _XDIST_GROUP.get(item.module.__name__) == group]


def group_modules(names: list[str], keys: dict[str, tuple]) -> list[str]:
    """``names`` (test modules in run order) with the modules of one ``keys`` entry moved up to the first of
    them, in their own order; the other modules keep their places."""
    order: list[str] = []
    for name in names:
        if name in order:
            continue
        key = keys.get(name)
        order += [name] if key is None else [n for n in names if keys.get(n) == key and n not in order]
    return order


_XDIST_GROUP: dict[str, str] = {}  # test module -> its pytest-xdist group, under --dist loadgroup (test.sh)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the modules that share a resource (:func:`share_with_next_module`: a classic Spark session, ~15 s of
    JVMs to start; the network-namespace cluster) one after another, tests inside a module in their own order.

    Under pytest-xdist's ``--dist loadgroup`` (test.sh: two worker processes) each module is an ``xdist_group``
    run whole by one worker, the modules that share a resource (or a Spark Connect server) one group.  The
    groups that start Spark, TensorFlow or a kernel go first, those of several modules before them, so that the
    fast tier's modules fill in at the end."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(getattr(item.module, "__name__", ""), []).append(item)
    order = group_modules(list(by_module), _SHARED_MODULES)
    if getattr(config.option, "loadgroup", False):  # a pytest-xdist worker's, from --dist loadgroup
        _XDIST_GROUP.update(xdist_groups(order, _SHARED_MODULES))
        slow = {_XDIST_GROUP[name] for name in order if any(i.get_closest_marker("slow") for i in by_module[name])}
        size = collections.Counter(_XDIST_GROUP.values())
        # stable: each group's modules stay together; the groups of several modules are the longest (minutes each)
        order.sort(key=lambda name: (_XDIST_GROUP[name] not in slow, -size[_XDIST_GROUP[name]]))
        for name in order:
            for item in by_module[name]:
                item.add_marker(pytest.mark.xdist_group(_XDIST_GROUP[name]))
    items[:] = [item for name in order for item in by_module[name]]


def xdist_groups(names: list[str], keys: dict[str, tuple]) -> dict[str, str]:
    """Each test module's pytest-xdist group: one for the modules of one :func:`share_with_next_module` key, one
    for the Spark Connect modules (``test_connect*``: consecutive ones share a server), the module's own else."""
    shared = list(dict.fromkeys(keys[name] for name in names if name in keys))
    groups = {}
    for name in names:
        short = name.rsplit(".", 1)[-1]
        groups[name] = (f"shared-{shared.index(keys[name])}" if name in keys else
                        "connect" if short.startswith("test_connect") else short)
    return groups


class StreamSource:
    """A directory a file-source stream reads, one file per trigger; each ``write(n)`` adds a JSON file of ``n``
    rows atomically (rename: the stream never sees a half-written file).  ``row(i)`` is the row of id ``i``;
    ``write(n, poison=True)`` gives those rows negative ids."""

    def __init__(self, root: Any, schema: str, row: Callable[[int], dict]) -> None:
        self.dir, self._staging = root / "in", root / "staging"
        self.dir.mkdir()
        self._staging.mkdir()
        self.files = self.next_id = 0
        self.schema, self._row = schema, row

    def write(self, n: int, poison: bool = False) -> None:
        import json

        rows = [dict(self._row(i), **({"id": -i} if poison else {})) for i in range(self.next_id, self.next_id + n)]
        self.next_id += n
        tmp = self._staging / f"part-{self.files:04d}.json"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.rename(tmp, self.dir / tmp.name)
        self.files += 1

    def stream(self, spark: Any) -> Any:
        return spark.readStream.schema(self.schema).option("maxFilesPerTrigger", 1).json(str(self.dir))


def free_port() -> int:
    """A loopback port free right now for a server a test starts (Spark Connect, Jupyter, TensorBoard).

    Picked below the ephemeral range: a port the kernel hands out for ``bind(0)`` comes from that range, where
    any outgoing connection of a busy machine (Spark, Py4J, the feeders) may take it before the server binds it.
    """
    return net.free_port("127.0.0.1")


def connect_session(executors: int, memory_mb: int = 1024, conf: dict[str, str] | None = None, *,
                    cores: int = 1, node_env: bool = True) -> Any:
    """A real local Spark Connect server (standalone master, ``executors`` executor JVMs of ``cores`` cores each)
    and its client session.

    What ``SparkSession.builder.remote("local-cluster[...]")`` does, but on a free loopback port (that
    path always takes 15002, on every interface), so two test processes can each have one.
    ``session.stop()`` stops the server and clears the environment it set, as for pyspark's own.
    ``node_env=False``: no :data:`NODE_ENV` in the executors' environment (nodes get tfos_nb's own thread counts).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    port = free_port()
    settings = {"spark.app.name": "tfos_nb-connect-tests", "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "4",
                "spark.task.maxFailures": "1", "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port),
                # a streaming query's foreachBatch process on the server connects back to the server's JVM
                # within this socket timeout (15 s by default): on a loaded test machine that is not always enough
                "spark.python.authenticate.socketTimeout": "120s"}
    if node_env:
        settings.update({f"spark.executorEnv.{k}": v for k, v in NODE_ENV.items()})
    settings.update(conf or {})
    from pyspark import SparkContext
    from pyspark.sql import SparkSession as ClassicSession

    if not node_env and SparkContext._jvm is not None:
        # pyspark starts the server's SparkContext with SparkConf(loadDefaults=True): an earlier session of this
        # process left its settings as the JVM's system properties, NODE_ENV's executorEnv among them
        for key in NODE_ENV:
            SparkContext._jvm.java.lang.System.clearProperty(f"spark.executorEnv.{key}")

    left = ClassicSession._instantiatedSession  # an earlier module's classic session (e.g. an embedded one)
    if left is not None and left._sc._jsc is not None:
        left.stop()  # pyspark cannot start a local Connect server beside a live SparkContext
    os.environ["SPARK_LOCAL_REMOTE"] = "1"  # pyspark's own markers of a local server (session.stop() removes them)
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    ConnectSession._start_connect_server(f"local-cluster[{executors},{cores},{memory_mb}]", dict(settings))
    return ConnectSession.builder.remote(f"sc://localhost:{port}").getOrCreate()  # (pyspark's builder: always 15002)


_CONNECT_MODULES: dict[str, tuple] = {}  # test module -> the settings of its Connect server
_connect_shared: dict[str, Any] = {}  # "key", "session": the Connect server the Connect modules share


def connect_fixture(executors: int, memory_mb: int = 1024, conf: dict[str, str] | None = None, *,
                    cores: int = 1, node_env: bool = True) -> Any:
    """A module-scoped ``spark`` fixture on Spark Connect: ``spark = connect_fixture(2)`` at module level.

    Consecutive Connect modules (``test_connect*``, run one after another) with the same settings share
    one server: a module's teardown stops it unless the next module run wants the same one (modules
    named ``test_connect*`` without Spark in this process in between are skipped over).  It is always
    stopped before any other module, since a classic session cannot start beside it.
    """
    key = (executors, memory_mb, tuple(sorted((conf or {}).items())), cores, node_env)
    _CONNECT_MODULES[sys._getframe(1).f_globals["__name__"]] = key

    @pytest.fixture(scope="module")
    def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
        if _connect_shared.get("key") != key:
            _stop_shared_connect()
            _connect_shared.update(key=key, session=connect_session(executors, memory_mb, conf, cores=cores,
                                                                    node_env=node_env))
        yield _connect_shared["session"]
        if _next_connect_module(request) != key:
            _stop_shared_connect()

    return spark


def _stop_shared_connect() -> None:
    session = _connect_shared.pop("session", None)
    _connect_shared.pop("key", None)
    if session is not None:
        session.stop()


def _next_connect_module(request: pytest.FixtureRequest) -> tuple | None:
    """The Connect settings the next module to run wants (None: it is no Connect module)."""
    for item in items_after(request):
        name = item.module.__name__
        if name in _CONNECT_MODULES:
            return _CONNECT_MODULES[name]
        if not name.rsplit(".", 1)[-1].startswith("test_connect"):
            return None
    return None


@pytest.fixture(scope="module")
def sc(spark: Any) -> Any:
    """The SparkContext of the module's ``spark`` fixture."""
    return spark.sparkContext


def runtime_processes() -> list[psutil.Process]:
    """Every process of the runtime (supervisors, nodes) started for this test process."""
    found = []
    me = str(os.getpid())
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if "tfos_nb.runtime" not in cmd:
            continue
        try:
            if p.environ().get("TFOS_DRIVER_PID") == me:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def listening_ports() -> set[int]:
    me = psutil.Process()
    ports = set()
    for c in me.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN:
            ports.add(c.laddr.port)
    return ports


def kernel_execute(kc, code: str, timeout: float = 300) -> str:
    """Run ``code`` in a real kernel (a jupyter_client ``kc``), assert it succeeded, return its printed output."""
    out: list[str] = []
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=lambda m: out.append(
        str(m["content"].get("text", m["content"].get("evalue", "")))))
    assert reply["content"]["status"] == "ok", (reply["content"], "".join(out)[-2000:])
    return "".join(out)


T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.1, *, what: str | None = None,
               proc: subprocess.Popen | None = None, ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``predicate`` every ``interval`` s until it returns something truthy, and return that.

    At the deadline: without ``what``, return the predicate's last (falsy) value, for the caller
    to assert with its own message; with ``what``, raise ``AssertionError`` naming it.
    ``proc``: a process the condition depends on; its exit ends the wait with an ``AssertionError``.
    ``ignore``: exceptions of the predicate that mean "not yet" (e.g. ``OSError`` while a server starts).
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what or 'waiting'}: process exited with {proc.returncode}")
        try:
            value = predicate()
        except ignore:
            value = None  # "not yet"
        if value or time.monotonic() > deadline:
            break
        time.sleep(interval)
    if not value and what is not None:
        raise AssertionError(f"{what}: not ready after {timeout} s")
    return value


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Fail the test if it leaves runtime processes, threads or listening ports behind."""
    before_ports = listening_ports()
    before_procs = {p.pid for p in runtime_processes()}
    yield
    assert wait_until(lambda: not [p for p in runtime_processes() if p.pid not in before_procs], 20), [
        " ".join(p.cmdline()) for p in runtime_processes()
    ]
    assert wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("tfos-")], 10), [
        t.name for t in threading.enumerate() if t.name.startswith("tfos-")
    ]
    # a server's socket is closed by its own thread as it ends: wait for it, as for the threads
    assert wait_until(lambda: not listening_ports() - before_ports, 10), (
        f"listening ports left open: {sorted(listening_ports() - before_ports)}"
    )


def run_notebook(nb: Any, kernel_specs: Any, cwd: Any, keep: Any, timeout: int = 600) -> None:
    """Execute ``nb`` in place in a real kernel of this interpreter (working directory ``cwd``), write the
    executed copy to ``keep`` (for a look when it fails), and end the kernel and its channels."""
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    client = NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute()
    finally:
        nbformat.write(nb, keep)
        end_notebook_kernel(client, km)  # km is ours, not the client's: it does not stop the kernel


def end_notebook_kernel(client: Any, km: Any) -> None:
    """End a ``NotebookClient`` run on a kernel manager the test owns.

    Given ``km``, nbclient leaves its kernel client's channels open (it cleans up only a manager it made). Left
    open, their ZeroMQ sockets reconnect to the dead kernel's ports every 100 ms for the rest of the session; a
    Spark barrier task's local server that later gets one of those ports reads ZeroMQ's greeting (FF 00 00 00 …)
    as an auth length, and its executor JVM exits (NegativeArraySizeException, code 50).
    """
    if getattr(client, "kc", None) is not None:
        client.kc.stop_channels()
    if km.has_kernel:
        km.shutdown_kernel()  # asked to shut down, as Jupyter does: killed, its Spark JVM logs executors it lost


@pytest.fixture
def test_comm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """ipywidgets' comms go to :class:`tests.panel_fakes.CountingComm` (records what each widget sends)."""
    import_or_skip("ipywidgets")
    import comm

    from tests.panel_fakes import CountingComm

    monkeypatch.setattr(comm, "create_comm", lambda **kw: CountingComm(**kw))
    monkeypatch.setattr(CountingComm, "sent", [])
    yield CountingComm


def ipython_with_tfos_nb() -> Any:
    """The process's one global IPython shell (IPython's test shell), with the tfos_nb extension loaded."""
    import IPython
    from IPython.testing.globalipapp import start_ipython

    start_ipython()
    shell = IPython.get_ipython()
    shell.run_line_magic("load_ext", "tfos_nb")
    return shell
