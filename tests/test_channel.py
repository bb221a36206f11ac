"""The control server against anyone who can reach its port: idle and trickling connections, floods of idle and
junk connections from another user, what they buffer and log, and running out of file descriptors.  Real servers
on loopback; the deadlines are shortened for speed."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time

import pytest

from tests.conftest import wait_until
from tests.server_abuse import SECRET, closed_by_server, flood_as_nobody, idle_connections, starved, trickle
from tfos_nb.runtime import net
from tfos_nb.runtime.protocol import channel, messages, unverified
from tfos_nb.runtime.protocol.channel import ControlClient, ControlServer

DEADLINE = 1.0  # the first-frame deadline these servers get (FIRST_FRAME_DEADLINE_S is 10 s)
CAP = 8
RATE = 250  # connections a second of the floods below: more than the 200 issue 67 names
# a frame announced at the largest size, 64 kB of it sent and the rest never: bytes an unverified connection holds
PARTIAL = messages.HEADER.pack(messages.MAX_FRAME) + b"x" * (64 << 10)


def codec(sender: str) -> messages.Codec:
    return messages.Codec(SECRET, "cid", sender)


@pytest.fixture
def server():
    srv = ControlServer(codec("driver"), lambda msg: messages.Reply(ok=True), "127.0.0.1", first_frame_deadline=DEADLINE,
                        max_unverified=CAP)
    srv.start()
    yield srv
    srv.stop()


def test_idle_connections_are_closed_at_the_deadline_and_do_not_keep_a_peer_out(server):
    port = server.address[1]
    idle = idle_connections(port, 3 * CAP)
    started = time.monotonic()
    # a peer that sends its frame at once is served whatever the flood (the oldest idle ones make room)
    client = ControlClient(codec("node"), server.address, timeout=5)
    assert client.request(messages.AwaitSpec(node=0)).ok
    # beyond the cap, the oldest are closed at once: at most CAP are held
    assert wait_until(lambda: sum(closed_by_server(s) for s in idle) >= 2 * CAP, DEADLINE * 0.8), "no cap"
    # and the rest at the deadline (the select loop wakes for it; 3 s of margin for a loaded machine)
    assert wait_until(lambda: all(closed_by_server(s) for s in idle), DEADLINE + 3.0), (
        f"idle connections still open {time.monotonic() - started:.1f} s after they connected")
    # the verified connection has no deadline: it is still served long after
    assert client.request(messages.AwaitSpec(node=1)).ok
    client.close()
    for s in idle:
        s.close()


def test_a_burst_of_peers_that_send_at_once_is_served_whole():
    """Hundreds of nodes registering at the same moment (a launch stage of 512 tasks; the scale benchmark found
    this): each sends its frame as soon as it connects, so none may be closed as an idle connection to make room
    -- before the fix, the accept loop took the whole backlog before reading any of it and closed all but the
    last CAP as "too many unverified connections"."""
    srv = ControlServer(codec("driver"), lambda msg: messages.Reply(ok=True), "127.0.0.1")  # the default pool
    srv.start()
    n = 320
    start = threading.Barrier(n)
    errors: list[str] = []

    def node(i: int) -> None:
        client = ControlClient(codec(f"node{i}"), srv.address, timeout=30)
        start.wait()
        try:
            if not client.request(messages.AwaitSpec(node=i)).ok:
                errors.append(f"node {i}: refused")
        except OSError as exc:
            errors.append(f"node {i}: {exc!r}")
        finally:
            client.close()

    threads = [threading.Thread(target=node, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    srv.stop()
    assert not errors, f"{len(errors)} of {n} peers were not served, e.g. {errors[:3]}"


def test_peers_whose_frames_come_a_moment_after_their_connections_are_all_served():
    """Hundreds of nodes connect before any frame arrives (a launch of 512 tasks on loaded executors; the scale
    benchmark failed 1 run in 3 this way): the server's pool holds as many unverified connections as the largest
    launch (MAX_UNVERIFIED; a quarter of the process's descriptors when that is fewer), so none is closed unread."""
    srv = ControlServer(codec("driver"), lambda msg: messages.Reply(ok=True), "127.0.0.1")  # the default pool
    srv.start()
    n = srv.max_unverified
    socks = []
    try:
        for _ in range(n):  # every peer connects first ...
            socks.append(socket.create_connection(srv.address, timeout=30))
        peers = [codec(f"node{i}") for i in range(n)]
        requests = []
        for i, s in enumerate(socks):  # ... then each sends its first frame
            frame, request_id = peers[i].encode_request(messages.AwaitSpec(node=i))
            s.sendall(frame)
            requests.append(request_id)
        refused = []
        for i, s in enumerate(socks):
            try:
                assert peers[i].decode_reply(messages.read_frame(s), requests[i]).ok
            except (OSError, messages.ProtocolError) as exc:
                refused.append(f"node {i}: {exc!r}")
        assert not refused, f"{len(refused)} of {n} peers were closed unserved, e.g. {refused[:3]}"
    finally:
        for s in socks:
            s.close()
        srv.stop()


def test_a_byte_at_a_time_sender_is_cut_at_the_first_frame_deadline(server):
    frame = codec("slow").encode(messages.Register(node=0, host="h" * 200, port=1, executor_id="0", pid=1))
    with socket.create_connection(server.address, timeout=5) as s:
        # a byte every 0.1 s: the whole frame would take over 20 s; each byte is far inside any per-read timeout
        took = trickle(s, frame, every=0.1, limit=DEADLINE + 3.0)
    assert took is not None, "a byte-at-a-time sender kept its connection open past the deadline"
    assert took >= DEADLINE * 0.9  # the deadline, not some other refusal
    assert ControlClient(codec("node"), server.address, timeout=5).request(messages.AwaitSpec(node=0)).ok


def test_a_verified_connection_is_never_timed_out(server):
    client = ControlClient(codec("node"), server.address, timeout=5)
    assert client.request(messages.AwaitSpec(node=0)).ok
    sock = client._sock  # the same connection must carry the next request
    t0 = time.monotonic()  # twice the deadline of an unverified connection, then the same connection again
    wait_until(lambda: time.monotonic() - t0 >= 2 * DEADLINE, 2 * DEADLINE + 1)
    assert client.request(messages.AwaitSpec(node=1)).ok and client._sock is sock
    client.close()


def test_running_out_of_descriptors_does_not_spin_and_serving_resumes():
    with starved("control") as srv:
        assert srv.command("fill") == "full"
        client = ControlClient(codec("node"), ("127.0.0.1", srv.port), timeout=30)
        answer: dict[str, object] = {}
        t = threading.Thread(target=lambda: answer.update(reply=client.request(messages.AwaitSpec(node=0))))
        t.start()  # connected (the kernel queues it), unaccepted: accept() fails with EMFILE meanwhile
        used = srv.cpu_share(2.0)
        # a back-off retries every ACCEPT_BACKOFF_S for microseconds each; a spin takes all the CPU it gets
        assert used < 0.25, f"the control server used {used:.0%} of a CPU while it could not accept"
        assert not answer, "served while out of descriptors?"
        assert srv.command("free") == "freed"
        t.join(net.ACCEPT_BACKOFF_S + 10)
        assert answer.get("reply") is not None and answer["reply"].ok  # type: ignore[union-attr]
        client.close()


def test_an_unbindable_address_is_an_error_not_every_interface():
    srv = ControlServer(codec("driver"), lambda msg: messages.Reply(ok=True), "192.0.2.1")  # TEST-NET-1: not this host
    with pytest.raises(OSError, match="cannot listen on 192.0.2.1"):
        srv.start()


def registration_time(address: tuple[str, int], node: int) -> float:
    """A node's registration as its supervisor sends it, on a connection of its own: seconds until the reply."""
    client = ControlClient(codec(f"node{node}"), address, timeout=30)
    started = time.monotonic()
    try:
        reply = client.request(messages.Register(node=node, host="127.0.0.1", port=1, executor_id=str(node), pid=1))
        assert reply.ok
        return time.monotonic() - started
    finally:
        client.close()


@pytest.mark.parametrize("payload", [b"", PARTIAL], ids=["idle", "partial-junk-frames"])
def test_a_flood_of_connections_from_another_user_does_not_delay_a_registration(payload):
    """Issue 67, finding 1: another user opens 250 connections a second from 8 addresses, idle or holding part of a
    junk frame; a node registering meanwhile is answered within 1 s.  Before the fix the server took 32 a second
    (the oldest closed only once a second old, accepting paused until then): 12 s at 100 a second."""
    srv = ControlServer(codec("driver"), lambda msg: messages.Reply(ok=True), "127.0.0.1")  # defaults: 10 s, pool
    srv.start()
    took = []
    try:
        with flood_as_nobody(srv.address[1], RATE, 6.0, payload) as flood:
            for node, after in enumerate((2.0, 3.5, 5.0)):  # seconds into the flood
                assert wait_until(lambda: flood.connected() >= after * RATE, after + 5.0, interval=0.02), (
                    f"the flood opened {flood.connected()} connections in {after + 5.0:g} s")
                took.append(registration_time(srv.address, node))
    finally:
        srv.stop()
    assert max(took) < 1.0, f"registrations answered after {', '.join(f'{t:.2f}' for t in took)} s under the flood"


def test_what_unverified_connections_buffer_is_bounded_under_a_flood():
    """Hundreds of unverified connections each holding 64 kB of a frame that never ends (twice the budget in all
    while the pool holds them): what the server buffers for them stays within UNVERIFIED_BYTES, and a node still
    registers."""
    srv = ControlServer(codec("driver"), lambda msg: messages.Reply(ok=True), "127.0.0.1")
    srv.start()
    peak = 0

    def flooded(flood, n: int) -> bool:
        nonlocal peak
        peak = max(peak, srv.unverified_bytes)
        return flood.connected() >= n

    try:
        offered = 2 * unverified.UNVERIFIED_BYTES // len(PARTIAL) + 1
        with flood_as_nobody(srv.address[1], RATE, offered / RATE + 1.0, PARTIAL) as flood:
            assert wait_until(lambda: flooded(flood, offered), offered / RATE + 5.0, interval=0.01), (
                f"the flood opened {flood.connected()} of {offered} connections")
            registration_time(srv.address, 0)
            wait_until(lambda: flooded(flood, offered + RATE // 2), 5.0, interval=0.01)  # half a second more
            opened = flood.wait()
    finally:
        srv.stop()
    assert opened * len(PARTIAL) > 2 * unverified.UNVERIFIED_BYTES
    assert 0 < peak <= unverified.UNVERIFIED_BYTES, f"unverified connections buffered {peak >> 20} MiB"


def test_thousands_of_junk_frames_log_one_warning_and_a_summary(caplog):
    """Issue 67, finding 5: thousands of unsigned frames (each on a connection of its own, from 8 addresses) make
    one warning and a summary line (logged at the latest when the server stops) counting them, not a line each:
    before the fix each was a warning in the notebook's output."""
    srv = ControlServer(codec("driver"), lambda msg: messages.Reply(ok=True), "127.0.0.1")
    junk = messages.HEADER.pack(200) + bytes(200)  # a frame, its signature wrong
    with caplog.at_level(logging.WARNING, logger=channel.__name__):
        srv.start()
        try:
            with flood_as_nobody(srv.address[1], 1000, 3.0, junk) as flood:
                sent = flood.wait()
            assert wait_until(lambda: srv.rejected >= sent, 10.0), f"{srv.rejected} of {sent} junk frames rejected"
            assert registration_time(srv.address, 0) < 1.0
        finally:
            srv.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == channel.__name__]
    assert srv.rejected >= 2000 and len(lines) <= 2, f"{len(lines)} lines logged for {srv.rejected} rejected frames"
    assert "rejected a message from 127.0.0." in lines[0] and "bad signature" in lines[0]
    summary = re.search(r"rejected (\d+) more messages in \d+ s from 8 addresses", lines[-1])
    assert summary and int(summary.group(1)) == srv.rejected - 1, lines[-1]
