"""A reservation that times out names the nodes it waits for: each one on a small cluster; on a launch of hundreds
(the scale benchmark's 512 simulated nodes listed every one, 20 kB in one sentence) the first ones and the rest
counted by state."""

from __future__ import annotations

from types import SimpleNamespace

from tfos_nb.runtime.driver.launch.awaiting import NAMED_NODES, waited_for


def nodes(states: list[str]) -> list[SimpleNamespace]:
    return [SimpleNamespace(label="chief:0" if i == 0 else f"worker:{i - 1}", state=s) for i, s in enumerate(states)]


def test_a_small_cluster_names_every_node_it_waits_for():
    assert waited_for(nodes(["pending", "registered"])) == "chief:0 (pending), worker:0 (registered)"


def test_hundreds_of_nodes_are_named_up_to_the_limit_and_counted_beyond_it():
    text = waited_for(nodes(["pending"] * 300 + ["registered"] * 200))
    assert text.startswith("500 nodes: chief:0 (pending), worker:0 (pending), ")
    assert text.count("(pending)") == NAMED_NODES
    assert text.endswith(f" and {500 - NAMED_NODES} more (pending {300 - NAMED_NODES}, registered 200)")
    assert len(text) < 400


def test_the_architecture_page_states_the_bounds_the_code_has():
    """The "At scale" section's figures are the constants: the unverified-connection bound, the nodes a timeout
    names, and the history each node keeps."""
    from pathlib import Path

    from tfos_nb.runtime.driver.control import state as cluster_state
    from tfos_nb.runtime.protocol.unverified import MAX_UNVERIFIED

    text = " ".join((Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text().split())
    assert f"secret ({MAX_UNVERIFIED} at once" in text
    assert f"names the first {NAMED_NODES} nodes it waits for" in text
    assert (f"The chief keeps its last {cluster_state.HISTORY_KEPT:,} and the other nodes share "
            f"{cluster_state.HISTORY_TOTAL - cluster_state.HISTORY_KEPT:,} beyond 4 nodes") in text
