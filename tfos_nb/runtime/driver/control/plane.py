"""The control plane as the driver's code drives it: one interface, wherever the Controller runs.

Classic Spark: the :class:`~.controller.Controller` runs in the notebook's process, behind
the driver's control server.  Spark Connect: it runs in the coordinator on an executor, and the
notebook holds a :class:`~.connect.job.RemoteController` that sends it the same transitions
through tiny Spark jobs.  A job (:class:`~.job.DriverJob`), a cluster
(:class:`~.cluster.TFCluster` and its streams) and parallel runs drive either through
:class:`ControlPlane` only: exactly the methods they call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from . import state


class ControlPlane(Protocol):
    """What the driver asks of a job's controller: transitions, epochs, and what feeding went wrong."""

    @property
    def heartbeat_timeout(self) -> float:
        """Seconds without a heartbeat before a node counts as lost."""
        ...

    @property
    def feed_errors(self) -> list[str]:
        """The feeding tasks' errors since the last :meth:`reset_feed_errors`."""
        ...

    @property
    def lost_feeds(self) -> int:
        """Feeding tasks whose connection to their node broke (the node may be dying)."""
        ...

    def set_running(self) -> None: ...
    def request_stop(self) -> None: ...
    def request_kill(self) -> None: ...
    def cancel(self, reason: str) -> None: ...
    def open_epoch(self, remaining: int | None = None) -> int: ...
    def end_epoch(self, epoch: int) -> None: ...
    def open_set(self, name: str, passes: int = 1) -> int: ...
    def end_set(self, name: str, version: int) -> None: ...
    def set_rows(self, name: str) -> dict[int, int]: ...
    def unread_sets(self) -> dict[str, int]: ...
    def reset_feed_errors(self) -> None: ...
    def feeding_started(self, epoch: int) -> bool: ...
    def set_feed_tasks(self, epoch: int, tasks: int) -> None: ...
    def finish(self, finished: Callable[[list[state.NodeRecord]], bool]) -> str: ...

    #: whether :meth:`request_stacks` works here (False on Spark Connect: the nodes answer the coordinator)
    stacks_available: bool
    #: whether ``TFCluster.train`` may keep two epochs' feeding jobs in flight (False on Spark Connect, where
    #: :meth:`end_epoch` is itself a Spark job that would queue behind the next epoch's feeding tasks)
    pipelines_epochs: bool

    def request_stacks(self, indices: list[int]) -> dict[int, int]:
        """Ask these nodes for their threads' stacks; the id each answers (with its next heartbeat)."""
        ...
