"""The data server against anyone who can reach the data port: hostile bytes, idle and byte-at-a-time
connections, floods of silent connections, running out of descriptors, frames of unknown type.  After each
attack on a server, a real feeder is still served.  What a feeder and a node exchange is ``test_feed.py``.
"""

import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import wait_until
from tests.server_abuse import SECRET, closed_by_server, idle_connections, starved, trickle
from tfos_nb.runtime import net
from tfos_nb.runtime.executor.feed.hub import FeedHub
from tfos_nb.runtime.executor.feed.server import DataServer
from tfos_nb.runtime.protocol import dataplane

DEADLINE = 1.0  # the handshake deadline these servers get (HANDSHAKE_DEADLINE_S is 10 s)
CAP = 8


@pytest.fixture
def guarded():
    hub = FeedHub()
    server = DataServer(hub, SECRET, "127.0.0.1", handshake_deadline=DEADLINE, max_handshakes=CAP).start()
    yield hub, server
    hub.close()
    server.stop()


def _fed(port: int) -> bool:
    """A real feeder's whole conversation: handshake, header, end; the node acknowledges it."""
    sock = dataplane.client_connect("127.0.0.1", port, SECRET, {"partition": 0, "gen": 1, "mode": "train"}, 5)
    with sock:
        dataplane.send_frame(sock, dataplane.Kind.END)
        return dataplane.recv_frame(sock)[0] is dataplane.Kind.DONE


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=300))
def test_the_data_server_survives_hostile_bytes(guarded, data):
    # One server for all inputs, on purpose: it must survive every one of them.
    _, server = guarded
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(4096):
            got += chunk
    assert len(got) == len(dataplane.MAGIC) + dataplane.NONCE  # the greeting, and nothing more: no proof, no answer
    assert _fed(server.port)


def test_idle_connections_are_closed_at_the_deadline_and_do_not_keep_a_feeder_out(guarded):
    _, server = guarded
    idle = idle_connections(server.port, 3 * CAP)
    started = time.monotonic()
    assert _fed(server.port)  # a feeder that completes the handshake at once is served whatever the flood
    assert wait_until(lambda: sum(closed_by_server(s) for s in idle) >= 2 * CAP, DEADLINE / 2), "no cap"
    assert wait_until(lambda: all(closed_by_server(s) for s in idle), DEADLINE + 3.0), (
        f"idle connections still open {time.monotonic() - started:.1f} s after they connected")
    for s in idle:
        s.close()


def test_a_byte_at_a_time_sender_is_cut_at_the_handshake_deadline(guarded):
    _, server = guarded
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        # 64 bytes of "proof" a byte every 0.1 s: each byte is far inside a per-receive timeout
        took = trickle(s, bytes(2 * dataplane.NONCE), every=0.1, limit=DEADLINE + 3.0)
    assert took is not None, "a byte-at-a-time sender kept its connection open past the deadline"
    assert took >= DEADLINE * 0.9
    assert _fed(server.port)


def test_silent_connections_do_not_pile_up_threads():
    # a handshake deadline far beyond the wait below: only the cap can end the silent connections' threads in time
    hub = FeedHub()
    server = DataServer(hub, SECRET, "127.0.0.1", handshake_deadline=60.0, max_handshakes=CAP).start()

    def serving() -> int:  # the data servers' connection threads, by name (the process has others, e.g. Spark's)
        return sum(t.name == "tfos-data-conn" for t in threading.enumerate())

    before = serving()
    idle = idle_connections(server.port, 10 * CAP)
    try:
        # every connection is accepted (the last one gets the greeting) before the threads are counted
        wait_until(lambda: idle[-1].recv(len(dataplane.MAGIC) + dataplane.NONCE, socket.MSG_PEEK | socket.MSG_DONTWAIT), 5,
                   what="the last connection's greeting", ignore=(BlockingIOError,))
        # a connection cut to make room ends its thread at once (its receive returns), but on a loaded machine
        # that thread may not have run yet when the next one starts: wait for them, well inside the deadline
        assert wait_until(lambda: serving() <= before + CAP + 1, 20.0), serving() - before
        assert _fed(server.port)
    finally:
        for s in idle:
            s.close()
        hub.close()
        server.stop()


def test_running_out_of_descriptors_does_not_spin_and_serving_resumes():
    with starved("data") as srv:
        assert srv.command("fill") == "full"
        result: dict[str, object] = {}

        def feed() -> None:
            try:
                result["fed"] = _fed(srv.port)
            except Exception as exc:  # reported by the assertion below
                result["error"] = exc

        t = threading.Thread(target=feed)
        t.start()  # connected (the kernel queues it), unaccepted: accept() fails with EMFILE meanwhile
        used = srv.cpu_share(2.0)
        # a back-off retries every ACCEPT_BACKOFF_S for microseconds each; a spin takes all the CPU it gets
        assert used < 0.25, f"the data server used {used:.0%} of a CPU while it could not accept"
        assert not result, result
        assert srv.command("free") == "freed"
        t.join(net.ACCEPT_BACKOFF_S + 10)
        assert result == {"fed": True}


def test_a_frame_of_unknown_type_is_refused_and_kinds_are_typed():
    """Frame types are :class:`dataplane.Kind`; a byte that is none of them is a protocol error, not a frame."""
    import socket

    a, b = socket.socketpair()
    with a, b:
        a.sendall(dataplane.FRAME.pack(b"Z", 0))
        with pytest.raises(dataplane.DataPlaneError, match="unknown frame type b'Z'"):
            dataplane.recv_frame(b)
        dataplane.send_json(a, dataplane.Kind.DONE, {"rows": 3})
        kind, payload = dataplane.recv_frame(b)
        assert kind is dataplane.Kind.DONE and dataplane.parse_json(payload) == {"rows": 3}


def test_an_arrow_frame_is_received_into_an_aligned_buffer_of_arrows_pool_and_read_in_place():
    """B1's node profile: a frame received into a ``bytearray`` was zero-filled page by page first (memset and
    page faults, a fifth of a reader thread's CPU); Arrow's pool gives an uninitialised, aligned buffer whose record
    batch is read without a copy."""
    import socket

    import pyarrow as pa

    from tfos_nb.runtime.batches import columns

    batch = pa.RecordBatch.from_pydict({"x": pa.array(range(1000), pa.float32())})
    a, b = socket.socketpair()
    with a, b:
        dataplane.send_frame(a, dataplane.Kind.DATA, columns.encode_ipc(batch))
        kind, payload = dataplane.recv_frame(b)
        assert kind is dataplane.Kind.DATA and isinstance(payload, pa.Buffer) and payload.address % 64 == 0
        got = columns.decode_ipc(payload)
        assert got.equals(batch)
        start = got.column(0).buffers()[1].address
        assert payload.address <= start < payload.address + payload.size  # in place, not copied
        dataplane.send_json(a, dataplane.Kind.DONE, {"rows": 1})
        assert dataplane.parse_json(dataplane.recv_frame(b)[1]) == {"rows": 1}
