"""A feeder on its node's host hands batches over shared memory (``protocol/shared.py``): a real DataServer and
FeedHub, the real feeder's connection and send path, and a second user (``nobody``) and a killed node process."""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import wait_until
from tests.server_abuse import SECRET, as_nobody, as_nobody_wait
from tests.test_feed import node, serve  # noqa: F401 - the fixture
from tfos_nb.runtime.batches import columns
from tfos_nb.runtime.executor.feed.data_feed import DataFeed
from tfos_nb.runtime.executor.feed.hub import FeedHub
from tfos_nb.runtime.executor.feeding import feeder as feeding
from tfos_nb.runtime.executor.feeding import slots
from tfos_nb.runtime.protocol import dataplane, messages, shared


@pytest.fixture(autouse=True)
def _no_region_kept():
    """Each test starts and ends with no region in this process's pool (a test's small slots stay its own)."""
    close_pool()
    yield
    close_pool()


def close_pool():
    while shared._pool:
        shared._pool.pop().close()


def a_feeder(port: int, partition: int = 0, timeout: float = 30) -> feeding.Feeder:
    """The feeding task's own connection code, its node assigned by hand (no driver: nothing here asks one)."""
    meta = messages.LaunchMeta(cluster_id="c", secret=SECRET.hex(), control=["127.0.0.1", 9], hb_interval=1.0,
                               driver_timeout=5.0, env={}, keras="", default_fs="", driver_pid=0)
    f = feeding.Feeder(meta, partition, 1, "train", timeout)
    f.node = messages.FeedAssignment(node=0, label="chief:0", host="127.0.0.1", port=port)
    return f


def batches(rows: int, per: int, width: int = 4, start: int = 0) -> list[pa.RecordBatch]:
    ids = np.arange(start, start + rows)
    return [columns.rows_to_batch([([float(i)] * width, int(i)) for i in ids[k:k + per]]) for k in range(0, rows, per)]


def feed(f: feeding.Feeder, parts: list[pa.RecordBatch], hub: FeedHub) -> tuple[list[int], dict]:
    """One partition of at most the hub's bound of batches through ``f``: connect, every batch, END; then the
    rows the node's reader gets (once all are queued: a lost batch fails the wait, never hangs the read) and the
    node's answer."""
    n = sum(b.num_rows for b in parts)
    sock = f.connect()
    try:
        for b in parts:
            f.send(sock, b)
        dataplane.send_frame(sock, dataplane.Kind.END)
        wait_until(lambda: sum(hub.queued_rows().values()) == n, 30, what=f"the node's hub holding all {n} rows")
        data = DataFeed(hub)
        got = [int(r[1]) for r in data.next_batch(n)]
        done = slots.recv_answer(sock)
        f.close_slots(answered=True)
        return got, done
    finally:
        sock.close()
        f.close_slots(answered=False)


def memfds() -> set[int]:
    """The feeding regions this process holds open (their inodes: a map holds a descriptor of its own)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "tfos_nb-feed" in os.readlink(f"/proc/self/fd/{fd}"):
                out.add(os.stat(f"/proc/self/fd/{fd}").st_ino)
        except OSError:
            pass
    return out


def test_a_feeder_on_its_nodes_host_hands_every_batch_over_shared_memory(node):  # noqa: F811
    """More batches than slots: slots are given back and written again, each row arrives once and in order, and
    the node's answer says every row came through the region."""
    hub, server = node
    got, done = feed(a_feeder(server.port), batches(1200, 100), hub)  # 12 batches, 4 slots
    assert got == list(range(1200))
    assert done == {"rows": 1200, "skipped": 0, "shared": 1200}
    assert shared.is_local("127.0.0.1") and not shared.is_local("192.0.2.1")  # TEST-NET-1: no host's own


def test_the_feeding_process_keeps_one_region_for_its_connections_and_closes_a_broken_ones(node):  # noqa: F811
    hub, server = node
    assert feed(a_feeder(server.port, 0), batches(300, 100), hub)[1]["shared"] == 300
    assert len(shared._pool) == 1 and len(memfds()) == 1  # kept for the next connection
    kept = shared._pool[0]
    got, done = feed(a_feeder(server.port, 1), batches(300, 100, start=300), hub)
    assert got == list(range(300, 600)) and done["shared"] == 300
    assert shared._pool == [kept] and len(memfds()) == 1  # the same one, not made again
    # a connection that ends without the node's answer: its region is closed, never handed to the next
    third = a_feeder(server.port, 2)
    sock = third.connect()
    assert third.slots is not None and third.slots.region is kept and not shared._pool  # checked out
    sock.close()
    third.close_slots(answered=False)
    assert not shared._pool  # closed here; the node's map of it goes once its reader sees the connection end
    assert wait_until(lambda: memfds() == set(), 30, what="the node's map of the region closed")


def test_a_batch_bigger_than_a_slot_goes_through_the_socket(node, monkeypatch):  # noqa: F811
    hub, server = node
    monkeypatch.setattr(shared, "SLOT_BYTES", 4096)  # both ends are this process: they agree
    parts = batches(40, 10) + batches(400, 400, width=8, start=40)  # 10 rows fit a slot; 400 rows of 8 do not
    got, done = feed(a_feeder(server.port), parts, hub)
    assert got == list(range(440)) and done == {"rows": 440, "skipped": 0, "shared": 40}


def test_a_region_the_node_cannot_map_leaves_every_batch_to_the_socket(node, monkeypatch):  # noqa: F811
    """A descriptor that is not the feeder's region (another process's, a wrong token: what a pid of another
    namespace or a reused descriptor number gives) is refused by the node before it maps anything; the feed
    goes on through the socket."""
    hub, server = node
    real = shared.FeederRegion.offer
    offers = [lambda self: {**real(self), "token": "00" * shared.TOKEN},
              lambda self: {**real(self), "pid": 1, "fd": 0},
              lambda self: {**real(self), "size": "a lot"},
              lambda self: "not an offer"]
    for k, offer in enumerate(offers):
        monkeypatch.setattr(shared.FeederRegion, "offer", offer)
        got, done = feed(a_feeder(server.port, k), batches(200, 50, start=200 * k), hub)
        assert got == list(range(200 * k, 200 * (k + 1))) and done == {"rows": 200, "skipped": 0, "shared": 0}


def test_a_slot_frame_out_of_bounds_or_without_a_region_is_refused(node):  # noqa: F811
    """What a peer that passed the handshake sends about the region is checked before any read: a slot or a
    length outside it, or a slot frame on a connection with no region, ends the connection."""
    hub, server = node
    region = shared.FeederRegion()
    offer = {"shared": region.offer()}
    for header, payload, error in [
        (offer, shared.SLOT_FRAME.pack(shared.SLOTS, 10), "outside the region"),
        (offer, shared.SLOT_FRAME.pack(0, shared.SLOT_BYTES + 1), "outside the region"),
        (offer, shared.SLOT_FRAME.pack(0, 0), "outside the region"),
        (offer, b"\x00" * 3, "a slot frame of 3 bytes"),
        ({}, shared.SLOT_FRAME.pack(0, 10), "unexpected frame"),
    ]:
        sock = dataplane.client_connect("127.0.0.1", server.port, SECRET, {"partition": 0, "gen": 1, "mode": "train",
                                                                            **header}, 10)
        if header:
            kind, body = dataplane.recv_frame(sock, None)
            assert kind is dataplane.Kind.REGION and dataplane.parse_json(body) == {"mapped": True}
        dataplane.send_frame(sock, dataplane.Kind.SLOT, payload)
        kind, body = dataplane.recv_frame(sock, None)
        assert kind is dataplane.Kind.ERROR and error in dataplane.parse_json(body)["error"]
        sock.close()
    region.close()
    assert hub.queued_rows() == {}


def test_another_user_cannot_open_the_region(node):  # noqa: F811
    """The region has no name; its descriptor, through ``/proc``, is this user's alone: ``nobody`` cannot open it
    (nor map it as a node would), though it knows the pid and the descriptor's number."""
    as_nobody()
    region = shared.FeederRegion()
    try:
        offer = region.offer()

        def work() -> None:
            try:
                shared.NodeRegion(offer)
            except PermissionError:
                return
            raise AssertionError("nobody mapped the region")

        as_nobody_wait(work)
        own = shared.NodeRegion(offer)  # this user's node maps it
        own.close()
    finally:
        region.close()


NODE = textwrap.dedent("""
    import sys
    from tfos_nb.runtime.executor.feed.hub import FeedHub
    from tfos_nb.runtime.executor.feed.server import DataServer
    server = DataServer(FeedHub(max_batches=1), b"s" * 32, "127.0.0.1").start()  # never read: it fills
    print(server.port, flush=True)
    sys.stdin.read()
""")


def test_a_killed_node_leaves_its_feeder_no_region_and_a_clear_error():
    """A node process killed while its feeder waits for a slot: the feeder's wait ends with the connection's
    error (the feeding task's verdict path, as for a send to a dead node), its region is closed, and nothing
    of it stays (a ``memfd`` has no file to remove)."""
    proc = subprocess.Popen([sys.executable, "-c", NODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        f = a_feeder(port, timeout=60)
        sock = f.connect()
        assert f.slots is not None and f.slots.region is not None
        parts = batches(2000, 100)
        sent = 0

        def kill_when_stuck():
            # the node's queue holds one batch, its reader one more, the slots four: the feeder waits after that
            wait_until(lambda: not f.slots.region.free, 30, what="the feeder out of slots")
            os.kill(proc.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_stuck)
        killer.start()
        with pytest.raises((ConnectionError, OSError)) as caught:
            for b in parts:
                f.send(sock, b)
                sent += 1
        killer.join(30)
        assert sent < len(parts) and not isinstance(caught.value, TimeoutError)
        sock.close()
        f.close_slots(answered=False)
        assert f.slots is None and not shared._pool and memfds() == set()
    finally:
        proc.kill()
        proc.wait(30)


