"""The notebook handle (``RunHandle``) with a fake driver job and an injected clock: no Spark, milliseconds.

``ClusterHandle`` gets a stand-in for ``runtime.driver.launch.start.run`` (a real
``ClusterState``, a fake ``TFCluster`` whose ``shutdown`` waits for the test);
``ParallelHandle`` a stand-in for ``runtime.driver.parallel.start``.
"""

from __future__ import annotations

import threading

import pytest

from tfos_nb.magics import ClusterFailed, ClusterHandle, ParallelFailed, ParallelHandle, RunFailed, RunHandle
from tfos_nb.runtime.driver.cluster import TFClusterError
from tfos_nb.runtime.driver.control import state as cluster_state
from tfos_nb.runtime.driver.options import ClusterShape, RetryPolicy
from tfos_nb.runtime.driver.parallel.runs import ParallelView, RunResult, TFParallelError

WAIT_S = 10.0  # generous deadline for events that come within milliseconds


def set_state(st: cluster_state.ClusterState, state: str, error: str | None = None) -> None:
    """The fake driver's one writer of the cluster state (the real one is the Controller)."""
    with st.lock:
        if st.ended:
            return
        st.state = state
        st.error = st.error or error
    st.notify()


class FakeJob:
    """What run()'s on_start hook hands over: the start in progress, cancellable from any thread."""

    def __init__(self, st: cluster_state.ClusterState) -> None:
        self.state = st
        self.cancels: list[str] = []

    def cancel(self, reason: str) -> None:
        self.cancels.append(reason)
        set_state(self.state, cluster_state.C_STOPPED, f"stopped ({reason})")  # as Controller.cancel does


class FakeCluster:
    """What the handle calls on a TFCluster: train, shutdown, close, last_feed."""

    def __init__(self, st: cluster_state.ClusterState, release: threading.Event, error: BaseException | None) -> None:
        self.st, self.release, self.error = st, release, error
        self.last_feed: dict = {}
        self.teardowns = 0
        self.torn_down = threading.Event()

    def train(self, data, epochs, feed_timeout=None) -> None:  # pragma: no cover - these tests feed no data
        raise AssertionError("no --data in these tests")

    def shutdown(self, grace_secs=0, timeout=None) -> None:
        while not self.release.wait(0.01):
            if self.torn_down.is_set():
                set_state(self.st, cluster_state.C_STOPPED)
                return
        if self.error is not None:
            set_state(self.st, cluster_state.C_FAILED, str(self.error).splitlines()[0])
            raise self.error
        set_state(self.st, cluster_state.C_FINISHED)

    def close(self, wait: float | None = None) -> None:
        self.teardowns += 1
        self.torn_down.set()


class FakeStart:
    """Stands in for ``runtime.driver.launch.start.run``: a real ClusterState, reserving → running, then a FakeCluster."""

    def __init__(self, error: BaseException | None = None, hold_start: bool = False) -> None:
        self.error = error
        self.hold_start = hold_start  # stay in "reserving" until the state ends (a start being cancelled)
        self.running = threading.Event()
        self.release = threading.Event()
        self.cluster: FakeCluster | None = None
        self.calls: list[dict] = []

    def __call__(self, sc, fn, args, shape, options, **kwargs) -> FakeCluster:
        self.calls.append(dict(kwargs, num_nodes=shape.num_nodes, env=options.env))
        st = cluster_state.ClusterState("c1", options.name, shape.roles())
        st.add_listener(options.on_state)
        self.job = FakeJob(st)
        options.on_start(self.job)
        set_state(st, cluster_state.C_RESERVING)
        options.log_callback("chief:0", ["hello"])
        if self.hold_start:
            with st.lock:
                ended = st.changed.wait_for(lambda: st.state in (cluster_state.C_FAILED, cluster_state.C_STOPPED), WAIT_S)
            assert ended
            raise TFClusterError(f"cluster {kwargs['name']} failed: {st.error}")
        set_state(st, cluster_state.C_RUNNING)
        self.cluster = FakeCluster(st, self.release, self.error)
        self.running.set()
        return self.cluster


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _cluster(start: FakeStart, retries: int = 0, **kwargs) -> ClusterHandle:
    return ClusterHandle("t", sc=None, fn=None, args=None, shape=ClusterShape(2, chief="chief"),
                         policy=RetryPolicy(retries), start_cluster=start, clock=Clock(), **kwargs)


def _node_error() -> TFClusterError:
    err = TFClusterError("worker:0 failed on host h1 (executor 3): ValueError: boom\n  Traceback …\n  ValueError: boom")
    err.node, err.host, err.executor_id, err.exit_code = "worker:0", "h1", "3", 1
    err.tail = ["Traceback …", "ValueError: boom"]
    return err


class FlakyStart(FakeStart):
    """A FakeStart whose n-th cluster fails at shutdown with ``errors[n]`` (None: it finishes)."""

    def __init__(self, errors: list[BaseException | None]) -> None:
        super().__init__()
        self.errors = list(errors)
        self.release.set()

    def __call__(self, *args, **kwargs) -> FakeCluster:
        self.error = self.errors.pop(0) if self.errors else None
        return super().__call__(*args, **kwargs)


def test_retries_run_the_runtimes_retry_loop():
    """``--retries``: a node failure starts the cluster again (attempt 2 sees TFOS_ATTEMPT=2); the result
    counts the attempts and keeps the failure's first line; the cell shows one line for the restart."""
    start = FlakyStart([_node_error(), None])
    h = _cluster(start, retries=1)
    h.start()
    result = h.wait(WAIT_S)
    assert result["state"] == "finished" and result["attempts"] == 2, result
    assert result["failures"] == ["worker:0 failed on host h1 (executor 3): ValueError: boom"]
    assert [c["env"]["TFOS_ATTEMPT"] for c in start.calls] == ["1", "2"]
    assert "[tfos] worker:0 failed on host h1 (executor 3): ValueError: boom; starting again (attempt 2 of 2)" in h.output
    assert [attempt for attempt, _ in h._states] == [1, 2]  # the history's attempt column


def test_the_retry_loop_stops_retrying_once_stopped_and_names_earlier_failures():
    from tfos_nb.runtime.driver import retry

    calls: list[int] = []

    def always_fails(attempt: int) -> None:
        calls.append(attempt)
        raise TFClusterError(f"worker:0 failed: attempt {attempt}\ntail")

    failures: list[str] = []
    with pytest.raises(TFClusterError) as info:
        retry.attempts(always_fails, 2, failures=failures)
    assert calls == [1, 2, 3] and failures == ["worker:0 failed: attempt 1", "worker:0 failed: attempt 2"]
    assert info.value.__notes__ == ["(attempt 3 of 3; earlier attempts: worker:0 failed: attempt 1; "
                                    "worker:0 failed: attempt 2)"]
    calls.clear()
    with pytest.raises(TFClusterError, match="attempt 1"):
        retry.attempts(always_fails, 5, stopped=lambda: True)
    assert calls == [1]
    assert retry.attempts(lambda attempt: attempt * 10, 0) == (10, 1)


def test_one_handle_family():
    assert issubclass(ClusterHandle, RunHandle) and issubclass(ParallelHandle, RunHandle)
    assert issubclass(ClusterFailed, RunFailed) and issubclass(ParallelFailed, RunFailed)
    assert issubclass(ParallelFailed, TFParallelError) and issubclass(ClusterFailed, TFClusterError)


def test_state_goes_starting_running_finished_and_observers_hear_the_end_once():
    start = FakeStart()
    h = _cluster(start)
    seen: list[tuple[str, bool]] = []
    h.add_observer(lambda view, final: seen.append((view.state, final)))
    assert h.state == "starting" and not h.done and h.nodes == () and h.started_at == 1000.0
    assert h.result["state"] == "starting" and h.result["elapsed"] == 0.0  # the injected clock
    h.start()
    assert h.start() is h  # a second start() starts nothing
    assert start.running.wait(WAIT_S)
    assert h.state == "running" and [n.label for n in h.nodes] == ["chief:0", "worker:0"]
    start.release.set()
    result = h.wait(WAIT_S)
    assert h.done and h.state == "finished" and result["state"] == "finished" and result["error"] is None
    assert result["attempts"] == 1 and result["stopped"] is None
    assert len(start.calls) == 1 and start.calls[0]["env"] == {"TFOS_ATTEMPT": "1"}
    assert h.output == ["[chief:0] hello"] and h.lines is not None and h.lines.get_nowait() == ["[chief:0] hello"]
    assert [s for s, _ in seen if s == "running"] and seen[-1] == ("finished", True)
    assert [final for _, final in seen].count(True) == 1
    assert start.cluster is not None and start.cluster.teardowns == 1  # closed once, by the handle's thread
    assert repr(h).startswith("<tfos_nb cluster 't': finished, 2 node(s), ")


def test_a_node_error_is_wrapped_once_with_its_node_host_and_tail():
    start = FakeStart(error=_node_error())
    h = _cluster(start)
    seen: list[tuple[str, bool]] = []
    h.add_observer(lambda view, final: seen.append((view.state, final)))
    h.start()
    start.release.set()
    with pytest.raises(ClusterFailed) as info:
        h.wait(WAIT_S)
    exc = info.value
    assert (exc.node, exc.host, exc.executor_id, exc.exit_code) == ("worker:0", "h1", "3", 1)
    assert exc.tail == ["Traceback …", "ValueError: boom"]
    assert type(h.error) is TFClusterError and str(exc) == str(h.error)  # the runtime's error, wrapped once
    assert exc.__cause__ is None and exc.__suppress_context__  # no frames of the magic behind it
    assert ClusterFailed.wrap(exc, "t") is exc
    shown = exc._render_traceback_()
    assert shown[0] == "\x1b[0;31mTFClusterError\x1b[0m: worker:0 failed on host h1 (executor 3): ValueError: boom"
    assert shown[-1].strip() == "ValueError: boom"
    assert h.state == "failed" and h.result["error"].startswith("worker:0 failed on host h1")
    assert h.final_status().state == "failed" and seen[-1] == ("failed", True)
    assert [final for _, final in seen].count(True) == 1


def test_an_error_that_is_not_a_nodes_is_named_by_the_cell():
    exc = ClusterFailed.wrap(OSError("no route"), "digits")
    assert str(exc) == "cluster digits: OSError: no route" and exc.node is None and exc.tail == []
    run_err = TFParallelError("run:2 failed on host h2")
    run_err.run, run_err.run_args, run_err.tail = 2, {"lr": 0.1}, ["x"]
    wrapped = ParallelFailed.wrap(run_err, "sweep")
    assert (wrapped.run, wrapped.run_args, wrapped.tail) == (2, {"lr": 0.1}, ["x"]) and wrapped.__cause__ is run_err
    assert str(ParallelFailed.wrap(KeyError("k"), "sweep")) == "sweep: KeyError: 'k'"
    assert wrapped._render_traceback_()[0] == "\x1b[0;31mTFParallelError\x1b[0m: run:2 failed on host h2"


def test_stop_is_idempotent_and_tears_down_once():
    start = FakeStart()
    h = _cluster(start)
    finals: list[str] = []
    h.add_observer(lambda view, final: final and finals.append(view.state))
    h.start()
    assert start.running.wait(WAIT_S)
    h.stop("shut down")
    h.stop("again")  # the first reason stays; no second teardown thread
    assert h.join(WAIT_S)
    h.stop("after the end")  # nothing left to stop
    assert h.shutdown() == h.result
    assert start.cluster is not None and start.cluster.teardowns == 2  # the stopper's and the handle thread's close
    assert h.state == "stopped" and h.error is None and h.result["stopped"] == "shut down"
    assert h.wait(0)["stopped"] == "shut down" and finals == ["stopped"]


def test_stop_during_the_start_cancels_it():
    start = FakeStart(hold_start=True)
    h = _cluster(start)
    h.start()
    assert h.join(0.05) is False  # held in reserving
    h.stop("interrupted")
    assert h.join(WAIT_S)
    assert h.error is None and h.result["stopped"] == "interrupted"
    assert h.status().error == "stopped (interrupted)" and start.cluster is None
    assert h.state == "stopped"


def test_timeout_stops_the_run_and_fails_the_cell():
    start = FakeStart()
    h = _cluster(start, timeout=0.05)
    h.start()
    assert h.join(WAIT_S)  # the timer stopped it; nothing released the fake's shutdown
    with pytest.raises(ClusterFailed, match="cluster t: TimeoutError: did not finish within 0.05 s"):
        h.wait(0)
    assert h.state == "failed" and h.result["stopped"] == "timeout"


def test_wait_with_a_deadline_says_what_the_run_is_doing():
    start = FakeStart()
    h = _cluster(start).start()
    assert start.running.wait(WAIT_S)
    with pytest.raises(TimeoutError, match="cluster t is still running after 0.01 s"):
        h.wait(0.01)
    start.release.set()
    assert h.wait(WAIT_S)["state"] == "finished"


class FakeRuns:
    """What ParallelHandle calls on ParallelRuns: wait, stop, close, status, logs."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.stopped: list[str] = []
        self.closed = 0
        self.state = "running"
        self.go = threading.Event()

    def wait(self, timeout=None) -> list[RunResult]:
        while not self.go.wait(0.01):
            if self.stopped:
                self.state = "stopped"
                raise TFParallelError("runs stopped")
        self.state = "finished"
        return [RunResult(i, {"i": i}, {"acc": i / 10}, {"acc": i / 10}) for i in range(self.n)]

    def stop(self, reason: str) -> None:
        self.stopped.append(reason)

    def close(self) -> None:
        self.closed += 1

    def status(self):
        return ParallelView(cluster_id="p1", name="sweep", state=self.state, started_at=0.0, elapsed=1.5, nodes=(),
                             error=None, tensorboard=None, rows_fed=0, feed_epoch=0, job_group="")

    def logs(self, run=None, tail=100):
        return {f"run:{i}": [f"line {i}"] for i in range(self.n)}


def _parallel(runs: FakeRuns) -> ParallelHandle:
    return ParallelHandle("sweep", sc=None, fn=None, runs_args=[{}] * runs.n, params=None, metric="acc",
                          mode="max", start_runs=lambda *a, **kw: runs, clock=Clock())


def test_parallel_runs_finish_and_the_best_is_found():
    runs = FakeRuns(3)
    h = _parallel(runs).start()
    finals: list[str] = []
    h.add_observer(lambda view, final: final and finals.append(view.state))
    runs.go.set()
    results = h.wait(WAIT_S)
    assert [r.index for r in results] == [0, 1, 2] and h.best.index == 2 and h.state == "finished"
    assert runs.closed == 1 and finals == ["finished"]
    assert h.logs("run:1") == {"run:1": ["line 1"]}
    with pytest.raises(KeyError, match="no run 'run:7' in sweep; runs: run:0 … run:2"):
        h.logs("run:7")
    assert repr(h) == "<tfos_nb parallel runs 'sweep': finished, 3 run(s)>"


def test_parallel_stop_is_idempotent_and_wait_says_the_runs_were_stopped():
    runs = FakeRuns(2)
    h = _parallel(runs).start()
    h.stop("shut down")
    h.stop("shut down")
    assert h.join(WAIT_S) and h.state == "stopped" and h.error is None and runs.closed == 1
    assert runs.stopped[0] == "shut down"
    with pytest.raises(RuntimeError, match=r"runs sweep were stopped \(shut down\)"):
        h.wait(0)
    assert h.shutdown() is None
