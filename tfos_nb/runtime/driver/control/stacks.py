"""``cluster.stacks()``: every thread's Python stack in a cluster's node processes, on demand.

The driver asks a node with its next heartbeat's reply (``BeatCommand.stacks``); the node's
supervisor signals its process, whose :mod:`faulthandler` writes every thread's stack into a file
only the two of them hold (see :mod:`..executor.phases`), and sends the text back with its next
heartbeat, over the signed control channel.  No debugger, no ptrace, no extra privileges.
"""

from __future__ import annotations

from . import state as cluster_state
from .plane import ControlPlane

UNAVAILABLE_ON_CONNECT = ("stacks are not available on Spark Connect yet: the nodes answer the coordinator, not "
                          "the notebook; run the cluster on a classic SparkContext to see them")

STACKS_TIMEOUT_S = 10.0


def pick(state: cluster_state.ClusterState, node: str | int | None) -> list[cluster_state.NodeRecord]:
    """The nodes ``node`` names (``"worker:1"`` or an index; None: all); KeyError naming the nodes there are."""
    nodes = [n for n in state.nodes if node is None or node in (n.index, n.label)]
    if not nodes:
        msg = f"no node {node!r}; nodes are {[n.label for n in state.nodes]}"
        raise KeyError(msg)
    return nodes


def collect(state: cluster_state.ClusterState, controller: ControlPlane, node: str | int | None = None,
            timeout: float = STACKS_TIMEOUT_S) -> dict[str, str]:
    """``role:index`` → the text of its threads' stacks (or, in parentheses, why there is none).

    ``RuntimeError`` where the control plane cannot ask for stacks (Spark Connect)."""
    nodes = pick(state, node)
    if not controller.stacks_available:
        raise RuntimeError(UNAVAILABLE_ON_CONNECT)
    ask = controller.request_stacks
    out: dict[str, str] = {}
    with state.lock:
        live = [n.index for n in nodes if n.state in (cluster_state.STARTING, cluster_state.RUNNING)]
        for n in nodes:
            if n.state in (cluster_state.PENDING, cluster_state.REGISTERED):
                out[n.label] = f"({n.label} has no process yet: {n.current_phase()})"
            elif n.state in cluster_state.TERMINAL:
                out[n.label] = f"({n.label} is {n.state}: its process is gone)"
    asked = ask(live) if live else {}

    def answered() -> bool:
        return all(state.nodes[i].stacks[0] >= sid or state.nodes[i].state in cluster_state.TERMINAL for i, sid in asked.items())

    with state.changed:
        state.changed.wait_for(answered, timeout)
        for i, sid in asked.items():
            n = state.nodes[i]
            if n.stacks[0] >= sid:
                out[n.label] = n.stacks[1]
            elif n.state in cluster_state.TERMINAL:
                out[n.label] = f"({n.label} is {n.state}: its process is gone)"
            else:
                out[n.label] = f"({n.label} did not answer within {timeout:.0f} s)"
    return {n.label: out[n.label] for n in nodes}
