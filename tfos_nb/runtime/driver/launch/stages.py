"""The launch stages of a cluster: one Spark stage for every node, or one per group of nodes asking the same
resources (:mod:`.resources`), each with its ResourceProfile.

What each mode keeps: with dynamic allocation off, each group's stage is a *barrier* stage (its nodes start
together or not at all) and the groups are joined by tfos_nb's reservation (the cluster forms when every node
registered; a node that never does is named when the reservation times out, with its group's request); with
it on, Spark cannot run a barrier stage (SPARK-24942), so the stages are plain ones, started at once, and the
reservation alone is the all-or-nothing: nothing trains until every node registered, and one failed stage
fails the start, whose teardown cancels the others.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...executor.process.launch import LAUNCH_SCHEMA, make_launcher
from ...protocol import messages
from .resources import Request, Resources, offer_text, problems
from .slots import conf_value, dynamic_allocation, session_master

if TYPE_CHECKING:
    from ..job import DriverJob
    from .sparkjob import SparkJob


class Stage:
    """One launch stage: its ``nodes`` (indexes in the cluster's roles), their ``request``, its ResourceProfile."""

    def __init__(self, nodes: list[int], request: Request, profile: Any) -> None:
        self.nodes = nodes
        self.request = request
        self.profile = profile
        self.profile_id: int | None = None if profile is None else int(profile.id)
        self.job: SparkJob | None = None


class Launch:
    """The launch stages of one cluster, watched as one Spark job (``done``, ``error``, ``result()``).

    On Spark Connect the stage of node ``first_node`` starts first: its task 0 starts the cluster's coordinator,
    whose address the other stages' nodes need; they start once that stage is over.
    """

    def __init__(self, job: DriverJob, meta: dict[str, Any], blob: bytes, stages: list[Stage], *, barrier: bool,
                 labels: list[str]) -> None:
        if meta.get("coordinator") and not barrier and len(stages[0].nodes) > 1:
            # no barrier, so no allGather to hand the coordinator's address around: its task starts alone
            first = stages[0]
            stages = [Stage(first.nodes[:1], first.request, first.profile),
                      Stage(first.nodes[1:], first.request, first.profile), *stages[1:]]
        self._job = job
        self._meta = meta
        self._blob = blob
        self.stages = stages
        self._barrier = barrier
        self._labels = labels

    def start(self) -> Launch:
        first = self.stages[:1] if self._meta.get("coordinator") else self.stages
        for stage in first:
            self._start(stage, self._meta)
        return self

    def _start(self, stage: Stage, meta: dict[str, Any]) -> None:
        from .slots import spark_session

        grouped = len(self.stages) > 1 or stage.profile is not None
        stage_meta = {**meta, "nodes": stage.nodes, "barrier": self._barrier, "profile_id": stage.profile_id} \
            if grouped else meta
        launcher = make_launcher(stage_meta, self._blob)
        session = spark_session(self._job.sc)
        n = len(stage.nodes)
        extra = {"profile": stage.profile} if stage.profile is not None else {}

        def launch() -> list[messages.LaunchStatus]:
            frame = session.range(0, n, 1, n).mapInArrow(launcher, LAUNCH_SCHEMA, barrier=self._barrier, **extra)
            return [messages.LaunchStatus.from_dict(json.loads(r["s"])) for r in frame.collect()]

        who = ", ".join(self._labels[i] for i in stage.nodes) if len(stage.nodes) <= 4 else f"{n} nodes"
        asks = f" ({stage.request.text()})" if not stage.request.empty else ""
        suffix = "launch" if not grouped else f"launch-{self.stages.index(stage)}"
        stage.job = self._job.spark_job(suffix, f"tfos_nb {self._job.name}: start {who}{asks}", launch)

    @property
    def done(self) -> bool:
        started = [s for s in self.stages if s.job is not None]
        if any(s.job.done and s.job.error is not None for s in started if s.job is not None):
            return True
        if not all(s.job is not None and s.job.done for s in started):
            return False
        if len(started) < len(self.stages):  # Spark Connect: the coordinator's stage is over; now the others
            statuses = self._results(started)
            coordinator = next((s.coordinator for s in statuses if s.coordinator is not None), None)
            if coordinator is None or not coordinator.ok or any(not s.ok for s in statuses):
                return True  # await_running names what failed
            later = {**self._meta, "coordinator": {}, "control": list(coordinator.address)}
            for stage in self.stages[len(started):]:
                self._start(stage, later)
            return False
        return True

    @property
    def error(self) -> BaseException | None:
        return next((s.job.error for s in self.stages if s.job is not None and s.job.error is not None), None)

    def result(self) -> list[messages.LaunchStatus]:
        return self._results([s for s in self.stages if s.job is not None])

    @staticmethod
    def _results(stages: list[Stage]) -> list[messages.LaunchStatus]:
        return [status for s in stages if s.job is not None for status in s.job.result()]

    def waiting(self) -> str:
        """The stages whose tasks did not all start, with what they ask and what the executors offer."""
        out = []
        for s in self.stages:
            if s.job is None or s.job.done or s.job.tasks_launched():
                continue
            who = ", ".join(self._labels[i] for i in s.nodes)
            asks = f"asking {s.request.text()}" if not s.request.empty else "in the default profile"
            profile = f", profile {s.profile_id}" if s.profile_id is not None else ""
            out.append(f"the stage of {who} ({asks}{profile}) has not started all its tasks")
        if not out:
            return ""
        names = tuple(name for s in self.stages for name, _ in s.request.amounts) or ("gpu",)
        offer = offer_text(_conf_reader(self._job.sc), session_master(self._job.sc), names)
        return "; ".join(out) + f"; the executors offer {offer}"

    def forget(self) -> None:
        for s in self.stages:
            if s.job is not None:
                self._job.forget(s.job)


def stages(sc: Any, resources: Resources | None, roles: list[tuple[str, int]], first_node: int) -> list[Stage]:
    """The launch stages of the nodes ``roles[first_node:]``: one, or one per group asking the same resources.

    Raises a ``ValueError`` (one sentence per problem) before any Spark job when the session cannot give what
    ``resources`` asks (see :func:`.resources.problems`), or when this PySpark cannot run a stage with a profile.
    """
    nodes = list(range(first_node, len(roles)))
    if resources is None:
        return [Stage(nodes, Request(), None)]
    check(sc, resources, roles)
    dynamic, conf = dynamic_allocation(sc), _conf_reader(sc)
    return [Stage(group, request, request.profile(dynamic, conf)) for request, group in
            resources.groups(roles, first_node)]


def check(sc: Any, resources: Resources, roles: list[tuple[str, int]]) -> None:
    """A ``ValueError`` (one sentence per problem, with its fix) when ``sc``'s session cannot give the nodes
    ``roles`` what ``resources`` asks, as its configuration says; runs no Spark job."""
    from .slots import spark_context, spark_session

    sc = spark_context(sc)
    frame = type(spark_session(sc).range(0))
    if "profile" not in inspect.signature(frame.mapInArrow).parameters:
        import pyspark

        msg = (f"resources= needs PySpark 4.0 or later (a stage's ResourceProfile on mapInArrow); this is PySpark "
               f"{pyspark.__version__}")
        raise ValueError(msg)
    found = problems(resources, roles, _conf_reader(sc), session_master(sc))
    if found:
        raise ValueError("; ".join(f"{what}: {fix}" for what, fix in found))


def _conf_reader(sc: Any) -> Callable[[str], str | None]:
    return lambda key: conf_value(sc, key)
