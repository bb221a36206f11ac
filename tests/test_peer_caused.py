"""A node whose collective a peer stopped answering fails on that peer's account: the job names the peer.

A worker stopped (SIGSTOP) is named by its supervisor ``STOPPED_S`` after it stopped; under
MultiWorkerMirroredStrategy its chief's collective may give up first (``UnavailableError``), and, now that a
function's raise reaches the driver at once (issue 67, finding 8), that error came first and named the chief
(``tests/test_faults.py::test_a_stopped_node_is_named_within_seconds[MWMS]``).  The driver's controller, on a clock
the test moves, waits :data:`PEER_GRACE_S` for the cause before it fails the job on such an error.
"""

from __future__ import annotations

from tests.test_input_ran_out import Cluster
from tfos_nb.runtime.driver.control import state
from tfos_nb.runtime.driver.control.controller import PEER_GRACE_S
from tfos_nb.runtime.driver.errors import error_for, peer_caused
from tfos_nb.runtime.protocol import messages

CHIEF_ERROR = "UnavailableError: Graph execution error"
STOPPED = "the node process was stopped (SIGSTOP, or a debugger held it) for 5 s: its peers and feeders wait for it; ended"


def _fail(c: Cluster, node: int, error: str) -> None:
    c.ctl.handle(messages.Heartbeat(node=node, state="failed", error=error))


def test_errors_a_peer_caused_are_told_from_errors_of_the_nodes_own():
    assert peer_caused(CHIEF_ERROR)
    assert peer_caused("CancelledError: [_Derived_]Collective ops is aborted by: Socket closed")
    assert not peer_caused(STOPPED)
    assert not peer_caused("ValueError: boom")
    assert not peer_caused(None)


def test_a_stopped_worker_named_after_its_chiefs_collective_gave_up_is_the_cause():
    c = Cluster()
    _fail(c, 0, CHIEF_ERROR)
    c.at(1.0)
    assert c.st.state != state.C_FAILED  # the cause may be named in a moment
    c.now = 4.0
    _fail(c, 1, STOPPED)
    assert c.st.state == state.C_FAILED
    err = error_for(c.st.snapshot())
    assert err.node == "worker:0" and "was stopped (SIGSTOP" in str(err), str(err)
    assert "also failed or stopped after it: chief:0" in str(err)


def test_a_peer_caused_failure_with_no_cause_named_fails_the_job_after_the_grace():
    c = Cluster()
    _fail(c, 0, CHIEF_ERROR)
    c.at(PEER_GRACE_S - 0.5)
    assert c.st.state != state.C_FAILED
    c.at(PEER_GRACE_S)
    assert c.st.state == state.C_FAILED and c.st.kill_requested
    assert error_for(c.st.snapshot()).node == "chief:0"


def test_a_nodes_own_error_fails_the_job_at_once():
    c = Cluster()
    _fail(c, 1, "ValueError: boom")
    assert c.st.state == state.C_FAILED
