"""The states of a node and of a cluster, the transitions allowed between them, and the one function that makes one.

A node's or a cluster's ``state`` is a :class:`Node` or :class:`Cluster` member.  Both are ``str`` enums, so a state
equals its string (``Node.RUNNING == "running"``): comparisons with strings, JSON snapshots, the heartbeats that
carry a node's state over the wire, the widgets and the tests read them as before.  Each member knows whether it is
:attr:`~Node.terminal`.

:func:`transition` is the only writer of a state (a test reads the package's source to keep it so): the
controller's handlers and the transitions the job's owner asks for, parallel runs' controller, the Spark Connect
mirror, and a record's first state.  It allows what :data:`NODE_TRANSITIONS` and :data:`CLUSTER_TRANSITIONS` list,
which is what the driver's code does; anything else raises :class:`IllegalTransition` before the state changes.
Such a transition is a bug in tfos_nb, never a user's or a node's doing, so it is loud everywhere, tests and
production alike: on the control server's thread the channel answers the request with the error and logs it (and
logs a tick's), so the server lives on and the state stays as it was; on the job owner's thread it reaches the
caller.  The Spark Connect mirror copies the coordinator's states, which that side's :func:`transition` allowed:
``mirror=True`` takes any state the table reaches from the current one, and keeps the current one when the
snapshot is older than it (a transition the notebook made itself, such as a cancel or a start it ended).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

log = logging.getLogger(__name__)


class Node(str, enum.Enum):
    """A node's state, in the order a healthy node goes through them."""

    PENDING = "pending"  # asked for, not registered yet
    REGISTERED = "registered"  # its supervisor registered; waiting for the whole cluster
    STARTING = "starting"  # the TensorFlow process is starting
    RUNNING = "running"  # the user's function runs
    FINISHED = "finished"  # the user's function returned
    FAILED = "failed"  # raised, crashed, or was lost
    STOPPED = "stopped"  # stopped by shutdown (ps/evaluator, or asked to stop)

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        """Its run is over: no heartbeat changes it (only a later verdict on that run, see the table)."""
        return self in (Node.FINISHED, Node.FAILED, Node.STOPPED)


class Cluster(str, enum.Enum):
    """A cluster's (or a set of parallel runs') state."""

    RESERVING = "reserving"  # its nodes are asked for and start
    RUNNING = "running"  # every node runs
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        """The job ended: its state never changes again."""
        return self in (Cluster.FINISHED, Cluster.FAILED, Cluster.STOPPED)


_ENDS = frozenset({Node.FINISHED, Node.FAILED, Node.STOPPED})

#: Where a node's state may go from each state.  A heartbeat moves a live node to what its supervisor says
#: (``starting``, ``running`` or an end), registration a pending one to REGISTERED (a parallel run's straight to
#: STARTING), the cluster's forming every node to STARTING, the tick a silent node to FAILED and the teardown
#: (``Controller.finish``) a live one to STOPPED.  Two verdicts on a run that is over come later: the driver finds
#: that a finished node's input ran out before its peers' (FAILED), and a parallel run's Spark task returns its
#: outcome, the last word on a run the teardown stopped first (Spark Connect) or on a function that returned
#: while its task failed.
NODE_TRANSITIONS: Mapping[Node, frozenset[Node]] = {
    Node.PENDING: frozenset({Node.REGISTERED, Node.STARTING, Node.RUNNING}) | _ENDS,
    Node.REGISTERED: frozenset({Node.STARTING, Node.RUNNING}) | _ENDS,
    Node.STARTING: frozenset({Node.RUNNING}) | _ENDS,
    Node.RUNNING: _ENDS,
    Node.STOPPED: frozenset({Node.FINISHED, Node.FAILED}),
    Node.FINISHED: frozenset({Node.FAILED}),
    Node.FAILED: frozenset(),
}

#: Where a cluster's state may go: it runs once every node runs (or the start is over), and it ends once.
CLUSTER_TRANSITIONS: Mapping[Cluster, frozenset[Cluster]] = {
    Cluster.RESERVING: frozenset({Cluster.RUNNING, Cluster.FINISHED, Cluster.FAILED, Cluster.STOPPED}),
    Cluster.RUNNING: frozenset({Cluster.FINISHED, Cluster.FAILED, Cluster.STOPPED}),
    Cluster.FINISHED: frozenset(),
    Cluster.FAILED: frozenset(),
    Cluster.STOPPED: frozenset(),
}

#: The state a record starts in: the only one :func:`transition` gives a record with no state yet.
FIRST: Mapping[type, Node | Cluster] = {Node: Node.PENDING, Cluster: Cluster.RESERVING}

S = TypeVar("S", Node, Cluster)


def _reach(table: Mapping[S, frozenset[S]]) -> dict[S, frozenset[S]]:
    """Every state a chain of the table's transitions leads to from each state."""
    reach: dict[S, frozenset[S]] = {}
    for start in table:
        seen: set[S] = set()
        todo = list(table[start])
        while todo:
            state = todo.pop()
            if state not in seen:
                seen.add(state)
                todo.extend(table[state])
        reach[start] = frozenset(seen)
    return reach


_TABLES: Mapping[type, Mapping[Any, frozenset[Any]]] = {Node: NODE_TRANSITIONS, Cluster: CLUSTER_TRANSITIONS}
_REACH: Mapping[type, Mapping[Any, frozenset[Any]]] = {Node: _reach(NODE_TRANSITIONS), Cluster: _reach(CLUSTER_TRANSITIONS)}


class IllegalTransition(RuntimeError):
    """A transition the table does not allow: a bug in tfos_nb (the state is left as it was)."""


class Stateful(Protocol[S]):
    """A record whose ``state`` :func:`transition` writes: a ``NodeRecord`` or a ``ClusterState``."""

    state: S


def _who(record: object) -> str:
    label = getattr(record, "label", None)
    return str(label) if label is not None else f"cluster {getattr(record, 'name', '?')}"


def transition(record: Stateful[S], to: S, *, why: str, mirror: bool = False) -> bool:
    """Set ``record.state`` to ``to`` (``why``: the cause, for the log and the error); whether it changed.

    A record with no state yet takes only its kind's first state (:data:`FIRST`); a transition to the state it is
    in changes nothing.  Anything the table does not allow raises :class:`IllegalTransition`.  ``mirror``: the
    Spark Connect mirror applying the coordinator's snapshot, which takes any state reachable from the current one
    and keeps the current one otherwise (the snapshot is older than it).
    """
    kind = type(to)
    now = getattr(record, "state", None)
    if now is None:
        if to is not FIRST[kind]:
            msg = f"{_who(record)} starts {FIRST[kind]}, not {to} ({why}): a bug in tfos_nb"
            raise IllegalTransition(msg)
    else:
        now = kind(now)  # a state a test set as a plain string
        if now is to:
            return False
        allowed = (_REACH if mirror else _TABLES)[kind][now]
        if to not in allowed:
            if mirror:
                log.debug("%s stays %s: the coordinator's snapshot says %s", _who(record), now, to)
                return False
            msg = (f"{_who(record)}: {now} -> {to} ({why}) is not a transition tfos_nb makes (from {now}: "
                   f"{', '.join(sorted(allowed)) or 'none'}): a bug in tfos_nb")
            raise IllegalTransition(msg)
        log.debug("%s: %s -> %s (%s)", _who(record), now, to, why)
    record.state = to
    return True
