"""The runtime's wings (one package a cross-cutting feature: the doctor, recovery, deterministic mode,
TensorBoard) keep the layer rules of ``test_layers.py`` inside them, and TensorBoard's sides share one port finder and one URL checker."""

from __future__ import annotations

from tests.test_layers import DRIVER, EXECUTOR, IMPORTS, NOTEBOOK_TB, PROXY, _under, reachable, violations

RUNTIME_TB = "tfos_nb.runtime.tensorboard"

#: the runtime's wings, one package a cross-cutting feature, each keeping the process wall inside it: the module
#: of each that runs on the driver's side, the one on the executors'; the wing's other modules are shared by both
#: (and import neither side).  A new module of a wing is shared until it is listed here.
WINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "tfos_nb.runtime.doctor": {
        "driver": ("tfos_nb.runtime.doctor.job",),  # doctor() runs the probe, shipped to executors by value
        "executor": ("tfos_nb.runtime.doctor.probe",),
    },
    "tfos_nb.runtime.recovery": {
        "driver": ("tfos_nb.runtime.recovery.restart",),  # what each attempt restores and feeds
        "executor": ("tfos_nb.runtime.recovery.keras_backup",),  # the Keras backup ctx.progress_callback() keeps
    },
    "tfos_nb.runtime.determinism": {
        "driver": ("tfos_nb.runtime.determinism.order",),  # which node reads a partition, after which one
        "executor": ("tfos_nb.runtime.determinism.seeding", "tfos_nb.runtime.determinism.turns"),
    },
    "tfos_nb.runtime.tensorboard": {
        "driver": ("tfos_nb.runtime.tensorboard.news",),
        "executor": ("tfos_nb.runtime.tensorboard.chief",),
    },
}


def _side(module: str, side: str) -> bool:
    """Whether ``module`` runs on ``side`` ("driver", "executor"): in that side's package, or a wing's module of it."""
    return _under(module, ((DRIVER,) if side == "driver" else (EXECUTOR,))) or any(
        module in wing[side] for wing in WINGS.values())


def _wing_modules(wing: str) -> set[str]:
    return {i.source for i in IMPORTS if _under(i.source, (wing,))}


def test_no_executor_half_imports_a_driver_half():
    """Executor code (Spark tasks, supervisors, nodes, the wings' executor halves) reaches the driver only over
    the wire: it imports no driver module, the wings' driver halves included."""
    found = sorted(str(i) for i in IMPORTS if _side(i.source, "executor") and _side(i.target, "driver"))
    assert found == []


def test_the_wings_keep_the_process_wall():
    """Each wing keeps its halves on their side: the executor's half loads no driver module, even inside its
    functions (through its parent package too); the modules both sides share import neither half."""
    for wing, sides in WINGS.items():
        modules = _wing_modules(wing)
        assert set(sides["driver"] + sides["executor"]) <= modules, wing  # a renamed module would pass vacuously
        for executor_half in sides["executor"]:
            loaded = reachable(IMPORTS, executor_half, module_level_only=False)
            assert [path for name, path in loaded.items() if _side(name, "driver")] == [], executor_half
        shared = tuple(sorted(modules - set(sides["driver"] + sides["executor"])))
        assert shared, wing
        assert [str(i) for i in IMPORTS if i.source in shared
                and (_side(i.target, "driver") or _side(i.target, "executor"))] == [], wing


def test_the_doctor_knows_nothing_of_starting_a_cluster():
    """``driver/launch/start.py`` runs the doctor before a start (``preflight=True``); the doctor, even inside its
    functions, reaches neither the start nor a cluster: no tie back to its caller."""
    everything = reachable(IMPORTS, "tfos_nb.runtime.doctor.job", module_level_only=False)
    assert f"{DRIVER}.launch.slots" in everything  # the scan follows the doctor into the driver (else this is vacuous)
    assert [path for name, path in everything.items()
            if name in (f"{DRIVER}.launch.start", f"{DRIVER}.cluster", f"{DRIVER}.job")] == []


def test_tensorboard_has_one_port_finder_and_one_url_checker():
    """Which port a TensorBoard listens on is read in ``runtime/tensorboard/ports.py`` (from ``/proc``), and a
    TensorBoard's URL is taken apart in ``runtime/tensorboard/urls.py``: every side (chief, driver, kernel, proxy)
    calls them and none carries a copy: no psutil anywhere, no URL parsing elsewhere in TensorBoard's modules but
    for the proxy's request paths and the page's proxy paths, which are no TensorBoard address."""
    ports, urls = f"{RUNTIME_TB}.ports", f"{RUNTIME_TB}.urls"
    assert violations(IMPORTS, ("tfos_nb",), ("psutil",)) == []
    tensorboard = tuple(_wing_modules(RUNTIME_TB) | _wing_modules(NOTEBOOK_TB) | {PROXY[1]})
    paths = (urls, f"{PROXY[0]}._urls", f"{NOTEBOOK_TB}._html")
    assert sorted({i.source for i in IMPORTS if i.source in tensorboard and i.target == "urllib.parse"}) == sorted(paths)
    callers = {i.source for i in IMPORTS if i.target in (ports, urls)}
    assert {f"{RUNTIME_TB}.chief", f"{RUNTIME_TB}.news", f"{NOTEBOOK_TB}._kernel", f"{NOTEBOOK_TB}._records",
            f"{PROXY[0]}._handlers"} <= callers
