"""Resources per role: what each node's Spark task (and, with dynamic allocation, its executor) asks for.

``resources={"ps": {"cpus": 1}, "worker": {"cpus": 1, "gpus": 1}}`` (or the magic's
``"ps: cpus=1; worker: cpus=1 gpus=1"``) becomes one :class:`Resources`, checked once.  The launch
groups the nodes by the request their role resolves to (``*`` is every role's default) and starts one
stage per group with a Spark ``ResourceProfile`` (stage-level scheduling): with dynamic allocation off,
a *task* profile (what each task takes from the application's executors); with it on, an executor
profile too (Spark brings executors of that shape).  :func:`problems` says, from the session's
configuration alone, why Spark could not place a request, before anything starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from .slots import dynamic_in

__all__ = ["ROLES", "Request", "Resources"]

#: the roles a request may name; ``*`` is the default of every role, ``master`` is spelt ``chief``
ROLES = ("chief", "worker", "ps", "evaluator", "*")
#: the named amounts; any other ``name=amount`` is a custom Spark resource (``spark.executor.resource.NAME.*``)
NAMED = ("cpus", "gpus", "memory", "memory_overhead")
_SIZE = re.compile(r"\d+[kmgtp]?b?", re.IGNORECASE)  # Spark's size strings: 4g, 512m, 2048 (MiB)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


@dataclasses.dataclass(frozen=True)
class Request:
    """One role's request: ``cpus`` per task, task amounts of ``gpu`` and custom resources (``amounts``, by
    Spark's resource name), and the executor's ``memory``/``memory_overhead`` (dynamic allocation only)."""

    cpus: int | None = None
    amounts: tuple[tuple[str, float], ...] = ()
    memory: str | None = None
    memory_overhead: str | None = None

    @property
    def empty(self) -> bool:
        return self == Request()

    def merged(self, over: Request) -> Request:
        """This request with ``over``'s amounts in place of its own."""
        amounts = dict(self.amounts)
        amounts.update(over.amounts)
        return Request(over.cpus if over.cpus is not None else self.cpus, tuple(sorted(amounts.items())),
                       over.memory or self.memory, over.memory_overhead or self.memory_overhead)

    def text(self) -> str:
        """``cpus=1 gpus=1 memory=4g``: the magic's spelling."""
        parts = [] if self.cpus is None else [f"cpus={self.cpus}"]
        parts += [f"{'gpus' if k == 'gpu' else k}={_amount_text(v)}" for k, v in self.amounts]
        parts += [f"{k}={v}" for k, v in (("memory", self.memory), ("memory_overhead", self.memory_overhead)) if v]
        return " ".join(parts)

    def profile(self, dynamic: bool, conf: Callable[[str], str | None]) -> Any:
        """This request as a Spark ``ResourceProfile`` (None when empty: the stage keeps the default profile).

        ``dynamic``: dynamic allocation is on, so the profile also says what its executors hold (cores = the
        task's cpus, each resource rounded up to whole units, found by the discovery script ``conf`` names).
        """
        if self.empty:
            return None
        from pyspark.resource import ExecutorResourceRequests, ResourceProfileBuilder, TaskResourceRequests

        task = TaskResourceRequests()
        if self.cpus is not None:
            task.cpus(self.cpus)
        for name, amount in self.amounts:
            task.resource(name, amount)
        builder = ResourceProfileBuilder().require(task)
        if dynamic:
            executor = ExecutorResourceRequests()
            if self.cpus is not None:
                executor.cores(self.cpus)
            if self.memory:
                executor.memory(self.memory)
            if self.memory_overhead:
                executor.memoryOverhead(self.memory_overhead)
            for name, amount in self.amounts:
                executor.resource(name, max(1, math.ceil(amount)),
                                  conf(f"spark.executor.resource.{name}.discoveryScript") or "")
            builder.require(executor)
        return builder.build


@dataclasses.dataclass(frozen=True)
class Resources:
    """The requests by role (``*``: the default of every role); see :func:`Resources.of`."""

    roles: tuple[tuple[str, Request], ...]

    @classmethod
    def of(cls, value: Any) -> Resources | None:
        """``value`` (a mapping ``{role: {name: amount}}``, the magic's string, or a Resources) checked; None for
        None or nothing asked.  A ``ValueError`` names the first bad role, name or amount."""
        if value is None or isinstance(value, Resources):
            return value
        if isinstance(value, str):
            value = parse(value)
        if not isinstance(value, Mapping):
            msg = (f"resources must map roles to their requests, e.g. {{'worker': {{'cpus': 1, 'gpus': 1}}}}, "
                   f"got {value!r}")
            raise ValueError(msg)
        roles = []
        for role, asked in value.items():
            key = "chief" if role == "master" else role
            if key not in ROLES:
                near = difflib.get_close_matches(str(role), ROLES, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                msg = f"resources: unknown role {role!r}{hint}; the roles are {', '.join(ROLES)}"
                raise ValueError(msg)
            if not isinstance(asked, Mapping):
                msg = f"resources[{role!r}] must map names to amounts, e.g. {{'cpus': 1, 'gpus': 1}}, got {asked!r}"
                raise ValueError(msg)
            roles.append((key, _request(key, asked)))
        roles = [(r, q) for r, q in roles if not q.empty]
        return cls(tuple(sorted(roles))) if roles else None

    def request(self, role: str) -> Request:
        """What a node of ``role`` asks: ``*``'s request with the role's own over it; a chief that asks nothing of
        its own asks what a worker does (it is the worker that also saves and logs)."""
        mine = dict(self.roles)
        key = "chief" if role == "master" else role
        if key == "chief" and key not in mine:
            key = "worker"
        return mine.get("*", Request()).merged(mine.get(key, Request()))

    def groups(self, roles: list[tuple[str, int]], first_node: int = 0) -> list[tuple[Request, list[int]]]:
        """The nodes ``roles[first_node:]`` grouped by their request, each group's nodes in order, the groups in
        the order of their first node."""
        out: dict[Request, list[int]] = {}
        for i in range(first_node, len(roles)):
            out.setdefault(self.request(roles[i][0]), []).append(i)
        return list(out.items())

    def text(self) -> str:
        """``ps: cpus=1; worker: cpus=1 gpus=1``: the magic's spelling (parsed back by :func:`parse`)."""
        return "; ".join(f"{role}: {req.text()}" for role, req in self.roles)

    def dynamic_only(self) -> list[str]:
        """The roles that ask what only new executors can give (memory): refused without dynamic allocation."""
        return [role for role, req in self.roles if req.memory or req.memory_overhead]


def parse(text: str) -> dict[str, dict[str, str]]:
    """``"ps: cpus=1; worker: cpus=1 gpus=1"`` → ``{"ps": {"cpus": "1"}, "worker": {"cpus": "1", "gpus": "1"}}``."""
    out: dict[str, dict[str, str]] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        role, sep, rest = part.partition(":")
        if not sep or not role.strip():
            msg = f"resources: {part!r} is not 'ROLE: NAME=AMOUNT ...' (e.g. 'worker: cpus=1 gpus=1')"
            raise ValueError(msg)
        asked: dict[str, str] = {}
        for item in rest.replace(",", " ").split():
            name, eq, amount = item.partition("=")
            if not eq or not name or not amount:
                msg = f"resources: {item!r} (for {role.strip()}) is not NAME=AMOUNT (e.g. gpus=1)"
                raise ValueError(msg)
            asked[name] = amount
        out[role.strip()] = asked
    return out


def _request(role: str, asked: Mapping[str, Any]) -> Request:
    cpus = memory = overhead = None
    amounts: dict[str, float] = {}
    for name, value in asked.items():
        where = f"resources[{role!r}][{name!r}]"
        if name == "cpus":
            cpus = _whole(where, value)
        elif name in ("memory", "memory_overhead"):
            size = str(value).strip()
            if isinstance(value, bool) or not _SIZE.fullmatch(size) or not re.match(r"0*[1-9]", size):
                msg = f"{where} must be a size in Spark's spelling (e.g. 4g, 512m), got {value!r}"
                raise ValueError(msg)
            memory, overhead = (size, overhead) if name == "memory" else (memory, size)
        elif isinstance(name, str) and _NAME.fullmatch(name):
            amounts["gpu" if name in ("gpus", "gpu") else name] = _task_amount(where, value)
        else:
            msg = f"{where}: not a resource name (cpus, gpus, memory, memory_overhead, or a Spark resource's name)"
            raise ValueError(msg)
    return Request(cpus, tuple(sorted(amounts.items())), memory, overhead)


def _number(where: str, value: Any) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        msg = f"{where} must be a positive number, got {value!r}"
        raise ValueError(msg)
    return number


def _whole(where: str, value: Any) -> int:
    number = _number(where, value)
    if number != int(number):
        msg = f"{where} must be a whole number, got {value!r}"
        raise ValueError(msg)
    return int(number)


def _task_amount(where: str, value: Any) -> float:
    """A task's amount of a resource: Spark takes a fraction of one unit (up to 0.5: tasks share it) or whole
    units, nothing between."""
    number = _number(where, value)
    if number > 0.5 and number != int(number):
        msg = (f"{where} must be whole, or a fraction of one up to 0.5 (tasks sharing a unit), got {value!r}: "
               "Spark gives a task no other share")
        raise ValueError(msg)
    return number


def _amount_text(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def problems(resources: Resources, roles: list[tuple[str, int]] | None, conf: Callable[[str], str | None],
             master: str) -> list[tuple[str, str]]:
    """Why Spark could not give these nodes (``roles``; None: any) what they ask, read from the session's
    configuration: ``(what, fix)`` pairs, empty when nothing is known to be wrong."""
    if master == "local" or master.startswith("local["):
        return [(f"resources= needs a cluster manager, and Spark's local mode ({master}) has no stage-level "
                 "scheduling", "use local-cluster[N,C,MB], standalone, YARN or Kubernetes, or drop resources=")]
    out: list[tuple[str, str]] = []
    dynamic = dynamic_in(conf)
    cores = _int(conf("spark.executor.cores")) or _local_cluster_cores(master)
    wanted = None if roles is None else {"chief" if role == "master" else role for role, _ in roles}
    for role, req in resources.roles:
        if wanted is not None and role not in ("*", *wanted):
            out.append((f"resources name {role}, but this cluster has no {role} node", f"drop {role} from resources="))
            continue
        if dynamic:
            continue  # new executors of the profile's own shape: only the cluster manager knows what it offers
        if req.memory or req.memory_overhead:
            out.append((f"{role} asks executor memory ({req.text()}), which only new executors can have",
                        "turn on dynamic allocation (spark.dynamicAllocation.enabled=true with "
                        "spark.dynamicAllocation.shuffleTracking.enabled=true), or drop memory=/memory_overhead="))
        if req.cpus is not None and cores is not None and req.cpus > cores:
            out.append((f"{role} asks {req.cpus} cpus per task, but each executor has {cores} core(s) "
                        "(spark.executor.cores)", "ask at most that, or start executors with more cores"))
        for name, amount in req.amounts:
            has = conf(f"spark.executor.resource.{name}.amount")
            unit = "gpus" if name == "gpu" else name
            if has is None:
                out.append((f"{role} asks {unit}={_amount_text(amount)}, but the executors have no {name} "
                            f"(spark.executor.resource.{name}.amount is not set)",
                            f"start Spark with it and a discovery script "
                            f"(spark.executor.resource.{name}.discoveryScript), or drop {unit}= from {role}"))
            elif _number_or_none(has) is not None and amount > float(has):
                out.append((f"{role} asks {unit}={_amount_text(amount)} per task, but each executor has {has} "
                            f"(spark.executor.resource.{name}.amount)", "ask at most that"))
    return out


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


def _number_or_none(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _local_cluster_cores(master: str) -> int | None:
    match = re.fullmatch(r"local-cluster\[\s*\d+\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    return int(match.group(1)) if match else None



def offer_text(conf: Callable[[str], str | None], master: str, names: tuple[str, ...] = ("gpu",)) -> str:
    """What the application's executors hold of cores and of the resources ``names``, as its configuration says:
    ``1 core(s) each, gpu 1 (dynamic allocation off)``."""
    known = _local_cluster_cores(master)
    parts = [f"{conf('spark.executor.cores') or known or '?'} core(s) each"]
    for name in dict.fromkeys(names):
        amount = conf(f"spark.executor.resource.{name}.amount")
        parts.append(f"{name} {amount if amount is not None else 'none'}")
    return ", ".join(parts) + f" (dynamic allocation {'on' if dynamic_in(conf) else 'off'})"
