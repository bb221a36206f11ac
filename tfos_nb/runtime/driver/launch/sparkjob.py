"""One Spark job run from a thread of its own, so the caller can watch and cancel it.

The caller waits in short slices (so a KeyboardInterrupt lands at once and
node failures are noticed while the job runs); ``cancel()`` cancels the job
group, which also kills the job's Python workers.  On Spark Connect the same with a
job tag (:class:`~.connect.spark_jobs.ConnectSparkJob` overrides the two hooks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class SparkJob:
    def __init__(self, sc: Any, group: str, description: str, action: Callable[[], Any]) -> None:
        self._sc = sc
        self.group = group
        self._description = description
        self._action = action
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name=f"tfos-job-{group}", daemon=True)

    def start(self) -> SparkJob:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._result = self._labelled(self._action)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._error = exc
        finally:
            self._done.set()

    def _labelled(self, action: Callable[[], Any]) -> Any:
        """Run ``action`` in this thread with the job's label (its job group)."""
        self._sc.setJobGroup(self.group, self._description, interruptOnCancel=True)
        return action()

    def _cancel_label(self) -> None:
        self._sc.cancelJobGroup(self.group)

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def tasks_launched(self) -> bool:
        """Whether every task of the job's last stage has started (or the job ended).

        Once that holds for the stage that feeds, a job submitted later cannot take
        an executor slot one of this job's tasks still needs (``TFCluster.train``
        also checks that the feeding stage runs).  Read from Spark's status
        tracker; a task waiting for a retry is not started.
        """
        if self._done.is_set():
            return True
        tracker = self._sc.statusTracker()
        ids = tracker.getJobIdsForGroup(self.group)
        if not ids:
            return False
        for job_id in ids:
            info = tracker.getJobInfo(job_id)
            if info is None or not info.stageIds:
                return False
            if info.status in ("SUCCEEDED", "FAILED"):
                continue
            stage = _last_stage(tracker, info)
            if stage is None or stage.numActiveTasks + stage.numCompletedTasks < stage.numTasks:
                return False
        return True

    def feeding_tasks(self) -> int | None:
        """The number of tasks of the last stage of the group's latest job (None until Spark knows it).

        Asked once a task of the feeding stage ran, when the feeding job is the
        group's latest (a DataFrame's shuffle may run first as a job of its own).
        """
        tracker = self._sc.statusTracker()
        ids = tracker.getJobIdsForGroup(self.group)
        stage = _last_stage(tracker, tracker.getJobInfo(max(ids))) if ids else None
        return None if stage is None else int(stage.numTasks)

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def error(self) -> BaseException | None:
        return self._error

    def cancel(self, join_timeout: float = 10.0) -> None:
        """Cancel the job group or tag (once) and wait up to ``join_timeout`` s for the job to end."""
        if not self._done.is_set() and not self._cancelled:
            self._cancelled = True
            try:
                self._cancel_label()
            except Exception:  # noqa: BLE001 - the context or session may be stopping already
                pass
        if join_timeout > 0 and self._thread.is_alive():
            self._thread.join(timeout=join_timeout)


def _last_stage(tracker: Any, info: Any) -> Any:
    """A job's last stage (the one that returns its results; its parents have lower ids), None until Spark knows it."""
    if info is None or not info.stageIds:
        return None
    return tracker.getStageInfo(max(info.stageIds))
