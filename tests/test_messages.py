import json
import socket
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfos_nb.runtime.driver.options import JobOptions
from tfos_nb.runtime.protocol import messages
from tfos_nb.runtime.protocol.channel import ControlClient, ControlServer

SECRET = b"s" * 32


def codec(sender="t"):
    return messages.Codec(SECRET, "cid", sender)


def frame_body(data: bytes) -> bytes:
    return data[messages.HEADER.size :]


def test_roundtrip_keeps_fields_and_types():
    msg = messages.Register(node=1, host="h", port=5, executor_id="3", pid=9, gpus=[{"index": "0"}])
    got = codec("server").decode(frame_body(codec().encode(msg)))
    assert got == msg


def test_forged_signature_is_rejected():
    data = bytearray(frame_body(codec().encode(messages.AwaitSpec(node=0))))
    data[-2] ^= 1
    with pytest.raises(messages.ProtocolError, match="bad signature"):
        codec("server").decode(bytes(data))


def test_other_secret_is_rejected():
    other = messages.Codec(b"x" * 32, "cid", "evil")
    with pytest.raises(messages.ProtocolError, match="bad signature"):
        codec("server").decode(frame_body(other.encode(messages.AwaitSpec(node=0))))


def test_replay_is_rejected():
    server = codec("server")
    data = frame_body(codec().encode(messages.AwaitSpec(node=0)))
    server.decode(data)
    with pytest.raises(messages.ProtocolError, match="replayed"):
        server.decode(data)


def test_senders_whose_messages_went_stale_are_forgotten_and_their_replays_still_refused(monkeypatch):
    """One codec per Spark Connect status job: the receiver's replay table stays bounded."""
    import time

    server = codec("server")
    frames = [frame_body(codec().encode(messages.AwaitSpec(node=0))) for _ in range(messages.SEEN_PRUNE_AT)]
    for data in frames:
        server.decode(data)
    assert len(server._seen) == messages.SEEN_PRUNE_AT
    later = time.time() + messages.MAX_CLOCK_SKEW_S + 1
    monkeypatch.setattr(messages.time, "time", lambda: later)
    server.decode(frame_body(codec().encode(messages.AwaitSpec(node=0))))  # one more sender: the stale ones go
    assert len(server._seen) == 1
    with pytest.raises(messages.ProtocolError, match="stale"):
        server.decode(frames[0])
    live = codec()
    server.decode(frame_body(live.encode(messages.AwaitSpec(node=0))))
    data = frame_body(live.encode(messages.AwaitSpec(node=1)))
    server.decode(data)
    with pytest.raises(messages.ProtocolError, match="replayed"):  # a live sender's replays: refused by sequence
        server.decode(data)


def test_a_cluster_of_more_live_senders_than_the_prune_size_does_not_walk_the_table_on_every_message(monkeypatch):
    """512 nodes heartbeating: each message used to scan every sender (O(nodes) a message, O(nodes²) a second)."""
    server = codec("server")
    walks = []
    forget = server._forget_stale_senders
    monkeypatch.setattr(server, "_forget_stale_senders", lambda: (walks.append(len(server._seen)), forget()))
    senders = [codec() for _ in range(2 * messages.SEEN_PRUNE_AT)]
    for _ in range(3):  # three rounds of heartbeats from every node
        for sender in senders:
            server.decode(frame_body(sender.encode(messages.AwaitSpec(node=0))))
    assert len(server._seen) == len(senders)
    assert len(walks) <= 2, f"the table was walked {len(walks)} times for {3 * len(senders)} messages"


def _signed(env: dict) -> bytes:
    body = json.dumps(env).encode()
    return messages.sign(SECRET, body) + body


def test_signed_but_malformed_messages_are_rejected():
    base = {"v": messages.PROTOCOL_VERSION, "cid": "cid", "from": "x", "seq": 1, "ts": __import__("time").time(), "type": "await_spec"}
    cases = [
        ({**base, "v": messages.PROTOCOL_VERSION + 1, "body": {"node": 0}}, "protocol version mismatch"),
        ({**base, "cid": "other", "body": {"node": 0}}, "another cluster"),
        ({**base, "type": "nope", "body": {}}, "unknown message type"),
        ({**base, "body": {}}, "missing field 'node'"),
        ({**base, "body": {"node": "0"}}, "expected int"),
        ({**base, "body": {"node": True}}, "expected int"),
        ({**base, "ts": 0, "body": {"node": 0}}, "stale"),
        ({**base, "body": []}, "body is not an object"),
    ]
    for i, (env, why) in enumerate(cases):
        env = {**env, "from": f"s{i}"}
        with pytest.raises(messages.ProtocolError, match=why):
            codec("server").decode(_signed(env))


def test_oversized_frames_are_rejected():
    with pytest.raises(messages.ProtocolError, match="too large"):
        codec().decode(b"x" * (messages.MAX_FRAME + 1))


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_decode(data):
    with pytest.raises(messages.ProtocolError):
        codec("server").decode(data)


@pytest.fixture
def server():
    seen = []

    def handler(msg):
        seen.append(msg)
        return messages.Reply(ok=True, body={"n": len(seen)})

    srv = ControlServer(codec("driver"), handler, "127.0.0.1")
    srv.seen = seen
    srv.start()
    yield srv
    srv.stop()


def _raw(addr, payload: bytes) -> bytes:
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        try:
            return s.recv(1024)
        except OSError:
            return b""


def test_server_rejects_bad_frames_and_keeps_serving(server):
    addr = server.address
    good = codec("node").encode(messages.AwaitSpec(node=0))
    forged = bytearray(good)
    forged[-3] ^= 1
    bad = [
        bytes(forged),  # forged
        struct.pack(">I", 10) + b"garbage!!!",  # malformed
        struct.pack(">I", messages.MAX_FRAME + 10),  # oversized header
        b"\x00\x00",  # truncated
        good,  # replay of a frame the server will see below first
    ]
    client = ControlClient(codec("node2"), addr)
    assert client.request(messages.AwaitSpec(node=1)).ok
    _raw(addr, good)  # first delivery is accepted
    for payload in bad:
        assert _raw(addr, payload) == b""  # no reply: rejected, connection closed
    assert server.rejected == 4  # the truncated frame is only an early close
    reply = client.request(messages.AwaitSpec(node=2))  # still serving
    assert reply.ok and len(server.seen) == 3


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=300))
def test_server_survives_random_input(server, data):
    # One server for all inputs, on purpose: it must survive every one of them.
    _raw(server.address, data)
    assert all(isinstance(x, messages.AwaitSpec) for x in server.seen)
    assert ControlClient(codec("probe"), server.address).request(messages.AwaitSpec(node=0)).ok


def test_a_reply_names_the_request_it_answers_inside_its_signature():
    node, driver = codec("node"), codec("driver")
    frame, request_id = node.encode_request(messages.AwaitSpec(node=0))
    msg, answers = driver.decode_request(frame_body(frame))
    assert msg == messages.AwaitSpec(node=0) and answers == request_id
    reply = frame_body(driver.encode(messages.Reply(ok=True, body={"x": 1}), answers=answers))
    assert node.decode_reply(reply, request_id) == messages.Reply(ok=True, body={"x": 1})
    with pytest.raises(messages.ProtocolError, match="a reply not for this request"):
        codec("other").decode_reply(reply, codec("other").encode_request(messages.AwaitSpec(node=0))[1])
    with pytest.raises(messages.ProtocolError, match="a reply where a request was expected"):
        codec("server").decode(reply)  # nothing reads a reply without the request it answers
    with pytest.raises(messages.ProtocolError, match="expected a reply"):
        codec("n").decode_reply(frame_body(frame), request_id)
    with pytest.raises(ValueError, match="names the request it answers"):
        driver.encode(messages.Reply(ok=True))
    tampered = bytearray(reply)
    at = bytes(tampered).index(answers.encode())
    tampered[at] ^= 1  # another request's id, without the secret: the signature no longer holds
    with pytest.raises(messages.ProtocolError, match="bad signature"):
        codec("n").decode_reply(bytes(tampered), bytes(tampered[at : at + len(answers)]).decode())


class _Relay:
    """Someone on the path between clients and the control server: it records every reply frame the server sends
    (header included, as on the wire) and can answer a request with a recorded frame instead (``answer_with``), or
    forward a request and keep its reply from the client, closing the client's connection (``withhold``)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.replies: list[bytes] = []
        self.answer_with: bytes | None = None
        self.withhold = False
        self._socks: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed by close()
                return
            self._socks.append(conn)
            t = threading.Thread(target=self._pump, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _pump(self, conn: socket.socket) -> None:
        try:
            with conn, socket.create_connection(self.upstream, timeout=5) as up:
                self._socks.append(up)
                self._forward(conn, up)
        except OSError:  # the client went, or close() closed the sockets under it
            return

    def _forward(self, conn: socket.socket, up: socket.socket) -> None:
        while True:
            request = _whole_frame(conn)
            if self.answer_with is not None:
                conn.sendall(self.answer_with)
                continue
            up.sendall(request)
            reply = _whole_frame(up)
            self.replies.append(reply)
            if self.withhold:
                return
            conn.sendall(reply)

    def close(self) -> None:
        # shutdown() wakes a thread blocked in accept() or recv() on the socket; close() alone leaves it blocked
        for s in (self.listener, *self._socks):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:  # not connected (any more)
                pass
            s.close()
        for t in self._threads:
            t.join(5)
            assert not t.is_alive(), f"the relay's {t.name} did not end"


def _whole_frame(sock: socket.socket) -> bytes:
    frame = messages.read_frame(sock)
    return messages.HEADER.pack(len(frame)) + frame


@pytest.fixture
def relay(server):
    r = _Relay(server.address)
    yield r
    r.close()


def test_a_reply_captured_for_one_client_is_refused_by_another(server, relay):
    """Every feeding task starts a fresh codec: a signed reply meant for one (a redirect, a skip, a kill) must not be
    accepted by another as the answer to its own request."""
    a = ControlClient(codec("feeder-p0"), relay.address, timeout=5)
    b = ControlClient(codec("feeder-p1"), relay.address, timeout=5)
    assert a.request(messages.AwaitSpec(node=0)).body == {"n": 1}  # the normal request and reply, through the path
    relay.answer_with = relay.replies[-1]  # A's reply, as it was on the wire
    with pytest.raises(messages.ProtocolError, match="a reply not for this request"):
        b.request(messages.AwaitSpec(node=1))
    assert b._sock is None  # and the connection it came on is closed
    relay.answer_with = None
    assert b.request(messages.AwaitSpec(node=2)).body == {"n": 2}  # B's own request, answered by the server
    assert [m.node for m in server.seen] == [0, 2]


def test_a_reply_is_refused_as_the_answer_to_a_later_request_of_the_same_client(server, relay):
    """The path keeps a reply from its client, then hands it over as the answer to the client's next request."""
    a = ControlClient(codec("feeder-p0"), relay.address, timeout=5)
    relay.withhold = True
    with pytest.raises(ConnectionError):
        a.request(messages.AwaitSpec(node=0))  # the server answered; the client never saw it
    relay.withhold, relay.answer_with = False, relay.replies[-1]
    with pytest.raises(messages.ProtocolError, match="a reply not for this request"):
        a.request(messages.AwaitSpec(node=1))
    relay.answer_with = None
    assert a.request(messages.AwaitSpec(node=2)).body == {"n": 2}
    assert [m.node for m in server.seen] == [0, 2]


# The node function is pickled on the driver and reaches the node inside Spark's own task
# closure, then through the supervisor's pipe: these are the only places that unpickle it.
# The pipeline API persists the user's own functions (train_fn, model_fn) with the estimator or
# model, in the directory the user saves to and loads from (the trust of loading a SavedModel).
# child_main.py: the function blob from the owner's stdin pipe (it came in Spark's task closure);
# parallel/runs.py: a run's return value inside a Spark task result, the channel PySpark's own collect() unpickles;
# _cellfn / pipeline: notebook cells and saved pipeline stages (trusted directories). Never our sockets.
ALLOWED_UNPICKLING = {"runtime/executor/process/child_main.py", "runtime/driver/parallel/runs.py", "magics/_cellfn.py",
                      "pipeline/_params.py", "pipeline/_model_runners.py"}


def test_no_module_unpickles_socket_data():
    """Nothing unpickles except the node function's loaders (no socket data, ever)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).parent.parent / "tfos_nb"
    hits = []
    for path in root.rglob("*.py"):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(c?pickle|cloudpickle)\.loads?\(", line):
                hits.append(f"{path.relative_to(root)}:{i}")
    assert {h.split(":")[0] for h in hits} <= ALLOWED_UNPICKLING, hits


# -- the driver's liveness check ---------------------------------------------------------------------
def test_a_registered_node_polling_for_the_spec_is_alive_however_slow_the_others(monkeypatch):
    """A node that registered polls for the cluster spec while slower nodes start (a busy executor can
    take longer than the heartbeat timeout): every poll is a sign of life; silence is not."""

    from tfos_nb.runtime.driver.control import controller, state

    now = [1000.0]
    st = state.ClusterState("cid", "t", [("chief", 0), ("worker", 0)], clock=lambda: now[0])
    c = controller.Controller(st, JobOptions(num_gpus=0, heartbeat_timeout=10.0), input_mode_spark=False, tensorboard=False, log_dir=None)
    assert c.handle(messages.Register(node=0, host="h", port=1, executor_id="0", pid=1)).ok
    for _ in range(30):  # worker:0 registers 30 s later; chief:0 asks every second meanwhile
        now[0] += 1.0
        assert messages.Retry.from_dict(c.handle(messages.AwaitSpec(node=0)).body) == messages.Retry(0.1)
        c.tick()
    assert st.state == state.C_RESERVING and st.nodes[0].state == state.REGISTERED, st.nodes[0].error
    assert c.handle(messages.Register(node=1, host="h", port=2, executor_id="1", pid=2)).ok
    assert c.handle(messages.AwaitSpec(node=0)).ok and c.handle(messages.AwaitSpec(node=1)).ok
    now[0] += 11.0  # then chief:0 falls silent
    assert c.handle(messages.AwaitSpec(node=1)).ok
    c.tick()
    assert st.nodes[0].state == state.FAILED and st.nodes[0].error.startswith("no heartbeat for 11 s")
    assert st.nodes[1].state != state.FAILED and st.state == state.C_FAILED


def test_every_node_silent_at_once_names_the_path_to_the_driver():
    """Nodes on different executors all silent in the same heartbeat window: not each executor dying, but the
    executors cut off from the driver's control server (issue 41's "driver's control port unreachable")."""
    from tfos_nb.runtime.driver.control import controller, state

    now = [1000.0]
    st = state.ClusterState("cid", "t", [("chief", 0), ("worker", 0)], clock=lambda: now[0])
    c = controller.Controller(st, JobOptions(num_gpus=0, heartbeat_timeout=10.0), input_mode_spark=False, tensorboard=False, log_dir=None)
    c.address = ("10.0.0.1", 41234)
    for i in range(2):
        assert c.handle(messages.Register(node=i, host=f"h{i}", port=i + 1, executor_id=str(i), pid=i + 1)).ok
    for i in range(2):
        assert c.handle(messages.AwaitSpec(node=i)).ok
    now[0] += 9.5
    c.tick()
    assert st.state != state.C_FAILED  # within the timeout
    now[0] += 1.0
    c.tick()
    assert st.state == state.C_FAILED
    for n in st.nodes:
        assert n.state == state.FAILED
        assert n.error == ("no heartbeat from any of the 2 nodes for 10 s: their executors cannot reach the driver's "
                           "control server at 10.0.0.1:41234 (a firewall or a network change between them and this "
                           "machine), or every executor was lost"), n.error
