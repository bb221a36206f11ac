"""The notebook's side of a cluster on Spark Connect: a mirror of the coordinator's state, and its teardown.

The coordinator (``coordinator.py``) runs the cluster's Controller on an
executor.  Here, :class:`ConnectDriverJob` (a :class:`~..job.DriverJob`) keeps a
*mirror* :class:`~..state.ClusterState` that the panel, ``TFCluster`` and errors
read as they read the driver's state on a classic session: a poller thread
fetches a snapshot every ``POLL_S`` through a one-task Spark job
(:func:`~.spark_jobs.ask`), and :class:`RemoteController` sends the
transitions ``TFCluster`` asks for (epochs, stop, kill, cancel) the same way.
While feeding tasks hold every task slot, those jobs wait for a free slot: the
mirror is then updated between feeding tasks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ...protocol import messages, remote
from ...protocol.bodies import Body
from ..control import stacks
from ..control import state as cluster_state
from ..control.controller import Controller
from ..job import DriverJob
from ..launch.slots import connect_slots, not_enough_executors
from .snapshot import Mirror
from .spark_jobs import ConnectSparkJob, CoordinatorError, ask

if TYPE_CHECKING:
    from ..options import JobOptions

KERNEL_TIMEOUT_S = 120.0  # default: the coordinator stops the job when the notebook was not heard of for this long
POLL_S = 0.2  # pause between two snapshot jobs
LOST_AFTER = 5  # failed snapshots in a row before the coordinator counts as lost
COMMAND_TIMEOUT_S = 600.0  # a command job may wait for a task slot behind feeding tasks

_B = TypeVar("_B", bound=Body)


def bind_hint(spark: Any) -> str | None:
    """Loopback when Spark runs on this machine only (``local``/``local-cluster``); else the executor's address."""
    try:
        master = str(spark.conf.get("spark.master", "") or "")
    except Exception:  # noqa: BLE001 - a hosted session may hide it
        master = ""
    return "127.0.0.1" if master.startswith("local") else None


class RemoteController:
    """The :class:`~tfos_nb.runtime.driver.control.plane.ControlPlane` of a job whose Controller is the coordinator's.

    Each transition is sent to the coordinator (the local Controller writes the mirror's own
    transitions: a cancel before the coordinator is up, the final state).
    """

    def __init__(self, state: cluster_state.ClusterState, local: Controller) -> None:
        self.state = state
        self.local = local  # writes the mirror's own transitions (cancel before launch, the final state)
        self.heartbeat_timeout = local.heartbeat_timeout
        self.job: ConnectDriverJob | None = None

    stacks_available = False  # the nodes answer the coordinator, not the notebook
    pipelines_epochs = False  # end_epoch is a Spark job: it would wait behind the next epoch's feeding tasks

    def request_stacks(self, indices: list[int]) -> dict[int, int]:
        raise RuntimeError(stacks.UNAVAILABLE_ON_CONNECT)

    @property
    def feed_errors(self) -> list[str]:
        return self.job.mirror.feed_errors if self.job is not None else []

    @property
    def data_errors(self) -> list[str]:
        return []  # not mirrored from the coordinator: a node's error may come first here

    @property
    def lost_feeds(self) -> int:
        return self.job.mirror.lost_feeds if self.job is not None else 0

    def _send(self, op: str, **kw: Any) -> None:
        """Send a command whose reply tells nothing (:class:`remote.Done`); none before the coordinator is up."""
        if self.job is not None and self.job.meta is not None:
            self.job.command(op, remote.Done, **kw)

    def set_running(self) -> None:
        self._send("set_running")
        self.local.set_running()

    def request_stop(self) -> None:
        self._send("request_stop")

    def request_kill(self) -> None:
        self._send("request_kill")

    def cancel(self, reason: str) -> None:
        self.local.cancel(reason)
        if self.job is not None:
            self.job.cancel_jobs()
        try:
            self._send("cancel", reason=reason)
        except Exception:  # noqa: BLE001 - the mirror failed already; the coordinator ends on its own
            pass

    def open_epoch(self, remaining: int | None = None) -> int:
        job = self.job
        if job is not None and job.meta is not None:
            epoch = job.command("open_epoch", remote.EpochOpened, remaining=-1 if remaining is None else remaining).epoch
        else:
            epoch = self.state.feed_epoch + 1
        with self.state.lock:
            self.state.feed_epoch = epoch
        return epoch

    def end_epoch(self, epoch: int) -> None:
        self._send("end_epoch", epoch=epoch)

    def open_set(self, name: str, passes: int = 1) -> int:
        job = self.job
        assert job is not None and job.meta is not None  # a cluster's train() runs once it is connected
        return job.command("open_set", remote.EpochOpened, reason=name, remaining=passes).epoch

    def end_set(self, name: str, version: int) -> None:
        self._send("end_set", reason=name, epoch=version)

    def set_rows(self, name: str) -> dict[int, int]:
        """Not mirrored: the coordinator keeps who holds what."""
        return {}

    def unread_sets(self) -> dict[str, int]:
        """Not mirrored (nothing is said of an unread set on Spark Connect)."""
        return {}

    def feeding_started(self, epoch: int) -> bool:
        """Whether ``epoch`` was opened: ``TFCluster.train`` does not pipeline epochs on Spark Connect (an epoch's
        end is itself a Spark job), so it never waits for a feeding stage to start here, and it tells the epoch's
        feeding tasks (counted before) once the epoch is open."""
        return epoch <= self.state.feed_epoch

    def set_feed_tasks(self, epoch: int, tasks: int) -> None:
        """Tell the coordinator's controller ``epoch``'s feeding tasks (``TFCluster.train`` counted the partitions
        with a job of its own: a Connect client has no status tracker)."""
        self._send("set_feed_tasks", epoch=epoch, tasks=tasks)

    def count_epoch(self, epoch: int, rows: dict[int, int]) -> None:
        """Not on Spark Connect: ``TFCluster.train`` does not count there (its epochs stay of unknown length)."""

    def reset_feed_errors(self) -> None:
        self._send("reset_feed_errors")
        if self.job is not None:
            self.job.mirror.feed_errors, self.job.mirror.lost_feeds = [], 0

    def finish(self, finished: Callable[[list[cluster_state.NodeRecord]], bool]) -> str:
        return self.local.finish(finished)


class ConnectDriverJob(DriverJob):
    """A :class:`DriverJob` whose control server is the coordinator in the cluster (Spark Connect)."""

    rdds_available = False  # a Spark Connect session has DataFrames only
    streams_on_server = True  # foreachBatch runs on the Connect server: it reports to the coordinator
    counts_tasks = False  # a Connect client has no status tracker: train() counts an epoch's partitions itself

    def __init__(self, spark: Any, state: cluster_state.ClusterState, controller: RemoteController, **kw: Any) -> None:
        super().__init__(spark, state, controller, **kw)
        self.remote = controller  # ``controller`` as what it is here: for its local half (the mirror's writer)
        controller.job = self
        self.mirror = Mirror(state)
        self.meta: dict[str, Any] | None = None
        self._poll_stop = threading.Event()
        self._poller: threading.Thread | None = None
        self.polls = 0
        self._polled = threading.Condition()
        self._asked = 0  # snapshots asked for, and the last one of them answered (or failed)
        self._answered = 0

    # -- start -------------------------------------------------------------------
    def open_control(self) -> tuple[str, int]:
        return ("", 0)  # the coordinator is started by the launch stage

    def default_fs(self) -> str:
        try:
            return str(self.sc.conf.get("spark.hadoop.fs.defaultFS", None) or "file:///")
        except Exception:  # noqa: BLE001
            return "file:///"

    def launch_meta(self, address: tuple[str, int], options: JobOptions, **kw: Any) -> messages.LaunchMeta:
        meta = super().launch_meta(address, options, **kw)
        return meta.__class__(**{**meta.to_dict(), "default_fs": self.default_fs()})

    def coordinator_meta(self, kind: str, kernel_timeout: float) -> messages.CoordinatorMeta:
        """The launch meta's ``coordinator`` section: the coordinator's controller is set up as the local one."""
        local = self.remote.local
        return messages.CoordinatorMeta(name=self.name, input_mode_spark=bool(local.input_mode_spark),
                                 tensorboard=bool(local.tensorboard), log_dir=local.log_dir, num_gpus=int(local.num_gpus),
                                 heartbeat_timeout=float(local.heartbeat_timeout), kernel_timeout=float(kernel_timeout),
                                 bind=bind_hint(self.sc), kind=kind, ordered_feed=bool(local.feed.ordered))

    def wait_for_slots(self, needed: int, timeout: float) -> None:
        """Refuse at once when the session's configuration says ``needed`` tasks cannot run together.

        A Connect client cannot ask the scheduler: when the configuration does not say, a barrier
        stage too big waits for Spark's own check.
        """
        found = connect_slots(self.sc)
        if found is not None and found[0] < needed:
            raise RuntimeError(not_enough_executors(needed, found[0], str(found[1])))

    def coordinator_section(self, kind: str, notebook_timeout: float) -> dict[str, Any]:
        """The coordinator this job's launch starts (see :meth:`coordinator_meta`)."""
        if not notebook_timeout > 0:
            msg = f"notebook_timeout must be a positive number of seconds, got {notebook_timeout!r}"
            raise ValueError(msg)
        return self.coordinator_meta(kind, notebook_timeout).to_dict()

    def launched(self, meta: dict[str, Any], statuses: list[messages.LaunchStatus]) -> None:
        """The launch stage is over: its task 0 says where the coordinator listens (``meta["control"]`` from now
        on, for every later task: feeding, streams), and the mirror follows it."""
        started = next((s.coordinator for s in statuses if s.coordinator is not None), None)
        if started is not None and started.ok:
            meta["control"] = started.address
            self.connected(meta)

    reach_hint = ""  # the nodes reach the coordinator, on an executor of their own cluster

    def spark_job(self, suffix: str, description: str, action: Callable[[], Any]) -> ConnectSparkJob:
        job = ConnectSparkJob(self.sc, f"{self.state.job_group}-{suffix}", description, action)
        self.jobs.append(job)
        job.start()
        return job

    def connected(self, meta: dict[str, Any]) -> None:
        """The coordinator listens at ``meta["control"]``: start polling it."""
        self.meta = meta
        self._poller = threading.Thread(target=self._poll_loop, name=f"tfos-poll-{self.cluster_id}", daemon=True)
        self._poller.start()

    def command(self, op: str, kind: type[_B], **kw: Any) -> _B:
        """Send one command through a one-task Spark job; its reply body, parsed as ``kind`` (the body ``op`` is
        answered with, see :class:`remote.Command`).  Raises when the coordinator refused or was not reached."""
        assert self.meta is not None
        meta = self.meta
        job = ConnectSparkJob(self.sc, f"{self.state.job_group}-ctl", f"tfos_nb {self.name}: {op}",
                              lambda: ask(self.sc, meta, remote.Command(op=op, **kw), kind))
        job.start()
        if not job.wait(COMMAND_TIMEOUT_S):
            job.cancel(join_timeout=1)
            msg = f"{self.name}: the coordinator did not answer {op!r} within {COMMAND_TIMEOUT_S:.0f} s"
            raise TimeoutError(msg)
        try:
            out = job.result()
        except CoordinatorError as exc:
            why = "did not reach the coordinator" if exc.unreachable else "was refused by the coordinator"
            raise RuntimeError(f"{self.name}: {op!r} {why}: {exc}") from None
        assert isinstance(out, kind)
        return out

    def _poll_once(self) -> remote.ClusterSnapshot | str:
        """A snapshot of the coordinator's state, or why there is none."""
        assert self.meta is not None
        msg = remote.Snapshot(logs=list(self.mirror.logs_seen), history=list(self.mirror.history_seen))
        try:
            return ask(self.sc, self.meta, msg, remote.ClusterSnapshot)
        except CoordinatorError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - counted; the loop decides
            return f"{type(exc).__name__}: {exc}"

    def _poll_loop(self) -> None:
        tag = f"{self.state.job_group}-poll"
        self.sc.addTag(tag)
        failures = 0
        try:
            while not self._poll_stop.is_set():
                with self._polled:
                    self._asked += 1
                    asked = self._asked
                out = self._poll_once()
                if isinstance(out, remote.ClusterSnapshot):
                    failures = 0
                    self.polls += 1
                    self.mirror.apply(out)
                elif not self._poll_stop.is_set():
                    failures += 1
                    if failures >= LOST_AFTER and not self.state.ended:
                        self.remote.local.fail(f"the coordinator is unreachable: {out}")
                with self._polled:
                    self._answered = asked
                    self._polled.notify_all()
                self._poll_stop.wait(POLL_S)
        finally:
            self.sc.removeTag(tag)
            with self._polled:
                self._answered = self._asked = self._asked + 1  # nothing more comes: refresh() waits no longer
                self._polled.notify_all()

    def refresh(self, timeout: float = 30.0) -> None:
        """Wait until the mirror got a snapshot the coordinator took after this call (or ``timeout`` s passed).

        What the coordinator knew when this was called is then in the mirror: a failed node, a
        stream's counts.  Returns at once when no poller runs.
        """
        with self._polled:
            if self._poller is None or not self._poller.is_alive():
                return
            target = self._asked + 1
            self._polled.wait_for(lambda: self._answered >= target, timeout)

    def stream_counts(self, epoch: int) -> remote.StreamCounts | None:
        """What the coordinator counted for the training stream of ``epoch`` (as of the last snapshot)."""
        return self.mirror.streams.get(str(epoch))

    # -- stop ----------------------------------------------------------------------
    cancel_jobs_first = True  # feeding tasks and runs free their slots, so snapshot jobs get through

    def _send_kill(self) -> None:
        if self.meta is not None:
            try:
                self.controller.request_kill()
            except Exception:  # noqa: BLE001 - the coordinator may be gone; the nodes then stop on their own
                pass

    def _nodes_followed(self) -> bool:
        return self.meta is not None and self._poller is not None  # the mirror follows the nodes

    def _release_control(self) -> None:
        """Stop polling, tell the coordinator to close, and apply its final snapshot to the mirror."""
        self._poll_stop.set()
        if self._poller is not None:
            self._poller.join(timeout=30)
        if self.meta is not None:
            try:
                self.command("close", remote.Closed)
                final = self._poll_once()
                if isinstance(final, remote.ClusterSnapshot):
                    self.mirror.apply(final)
            except Exception:  # noqa: BLE001 - a coordinator that cannot be reached ends on its own
                pass
