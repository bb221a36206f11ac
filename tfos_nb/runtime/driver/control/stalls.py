"""Which nodes have not moved for too long, and who they are waiting for: the stall flag.

A chief/worker node *moves* when its phase changes, it reports progress, or its main thread's
stack changes (see :mod:`..executor.phases`).  One that has not moved for the cluster's
``stall_after`` seconds is flagged with where it is, and with the training nodes that have
not reached that phase yet (a collective waits for every worker):
``chief:0: no step for 20 s, building the strategy (its first collective) — worker:1 (running
the node function) has not reached it``.  ps nodes (``server.join()``) and the evaluator
(waiting for checkpoints) sit still by design and are never flagged.

Who waits for whom on the data path: a node waiting for data names the feeding tasks (Spark's
partitions) open to it, or says none is; a node that sits elsewhere (a callback that sleeps, a
read outside the step) while feeding tasks are open to it names them as waiting for it, and its
place in the user's code (``executor.process.phases.where``):
``worker:0: no step for 31 s, training, in on_epoch_end (cell.py:12) — the feeding task of
partition 3 (executor 1, open 40 s) waits for it to take rows``.  The flag names; it does not end
the job (a long callback or a slow upstream computation may be the user's intent): ■ or the
cell's ``--timeout`` ends it, and the stall lines are part of that message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ...executor.process import phases
from ...option_error import Named, OptionError
from ...protocol.bodies import BeatPhase, BeatStacks

TRAINERS = ("chief", "master", "worker")
NAMED_BEHIND = 8  # nodes a stall line names as not having reached its phase; the rest are counted
DEFAULT_STALL_AFTER = 20.0  # a stuck job is named within 30 s (the flag says; it ends nothing)

WHERE = {
    phases.REGISTERING: "still registering (its launch task has not started its supervisor)",
    phases.WAITING_FOR_SPEC: "waiting for the cluster spec",
    phases.STARTING: "starting its process",
    phases.IMPORTING: "importing TensorFlow",
    phases.RUNNING: "in the node function",
    phases.STRATEGY: "building the strategy (its first collective)",
    phases.FIRST_STEP: "in the first step (the first collective)",
    phases.TRAINING: "training",
    phases.WAITING_FOR_DATA: "waiting for data",
    phases.EXPORTING: "exporting",
}


def check_stall_after(value: Any) -> float | None:
    """``stall_after`` as a number of seconds (None or 0: never flag); an OptionError (a ValueError) for anything
    else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise OptionError(Named("stall_after"), f" must be a number of seconds (0 or None: off), got {value!r}")
    return float(value) or None


def stall_line(node: Any, nodes: Sequence[Any], stall_after: float | None, pending: Sequence[int] = ()) -> str | None:
    """Why ``node`` (a NodeView) counts as stalled among ``nodes``, or None; ``pending``: the partitions of the open
    epochs whose feeding task has not asked for a node yet."""
    if not stall_after or node.job_name not in TRAINERS or node.phase not in WHERE:
        return None
    still = node.still_for
    if still is None or still < stall_after:
        return None
    line = f"{node.label}: no step for {still:.0f} s, {WHERE[node.phase]}"
    if node.where:
        line += f", in {node.where}"
    if node.phase == phases.WAITING_FOR_DATA:
        if node.feeders:
            return line + f" — it waits for {_feeders(node.feeders)}"
        if pending:
            some = ", ".join(str(p) for p in pending[:8]) + (f" and {len(pending) - 8} more" if len(pending) > 8 else "")
            return line + (f" — no feeding task is connected to it; partition{'s' if len(pending) > 1 else ''} {some} "
                           "reached no node yet (a Spark task waiting for a slot, or computing its first rows)")
        elsewhere = [f"partition {p} at {n.label}" for n in nodes if n is not node for p, _, _ in n.feeders]
        if elsewhere:  # its epoch ends once those are taken
            return line + f" — no feeding task is connected to it; the epoch waits for {', '.join(elsewhere[:4])}"
        return line + " — no feeding task is connected to it now"
    if node.feeders:
        return line + f" — {_feeders(node.feeders)} {'waits' if len(node.feeders) == 1 else 'wait'} for it to take rows"
    here = phases.rank(node.phase)
    behind = [n for n in nodes if n is not node and n.job_name in TRAINERS and n.phase is not None
              and (r := phases.rank(n.phase)) is not None and here is not None and r < here]
    if behind:
        who = ", ".join(f"{n.label} ({n.phase})" for n in behind[:NAMED_BEHIND])
        if len(behind) > NAMED_BEHIND:  # hundreds of workers still importing TensorFlow: a line, not a page
            who += f" and {len(behind) - NAMED_BEHIND} more"
        line += f" — {who} {'has' if len(behind) == 1 else 'have'} not reached it"
    return line


def _feeders(feeders: Sequence[tuple[int, str, float]]) -> str:
    """``the feeding task of partition 3 (executor 1, open 40 s)``, or several joined."""
    parts = [f"partition {p} (executor {e or '?'}, open {s:.0f} s)" for p, e, s in feeders[:4]]
    more = f" and {len(feeders) - 4} more" if len(feeders) > 4 else ""
    return f"the feeding task{'s' if len(feeders) > 1 else ''} of {', '.join(parts)}{more}"


def with_stalls(nodes: tuple[Any, ...], stall_after: float | None,
                pending: Sequence[int] = ()) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """``nodes`` (NodeViews) with their ``stall`` set, and the stall lines."""
    lines = [stall_line(n, nodes, stall_after, pending) for n in nodes]
    out = tuple(dataclasses.replace(n, stall=line) if line else n for n, line in zip(nodes, lines))
    return out, tuple(line for line in lines if line)


def apply_news(node: Any, phase: BeatPhase, stacks: BeatStacks, now: float) -> None:
    """A heartbeat's ``phase`` and ``stacks`` applied to the driver's node (its state's lock held); a phase this
    version does not know is left out."""
    for p in [*phase.seen, phase.phase]:
        if p in phases.PHASES and (not node.phase_log or node.phase_log[-1] != p):
            node.phase_log.append(p)
    if phase.phase in phases.PHASES:
        node.phase = phase.phase
        node.where = phase.where[:200]
        if phase.still_s is not None:
            node.moved_at = now - max(0.0, float(phase.still_s))
    if stacks.id > node.stacks[0]:
        node.stacks = (stacks.id, stacks.text)


def ask_stacks(node: Any) -> int:
    """The id of a new stack dump asked of ``node`` (sent with its heartbeats' replies; lock held)."""
    node.stacks_asked = max(node.stacks_asked, node.stacks[0]) + 1
    return int(node.stacks_asked)
