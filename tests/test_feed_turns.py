"""Deterministic mode on a node's data plane (``determinism/turns.py``), over real sockets: a DataServer and
feeder connections that name the partition their node reads before theirs."""

import os

import pytest

from tests.server_abuse import SECRET
from tests.test_feed import serve, take_in_thread
from tfos_nb.runtime.batches import columns
from tfos_nb.runtime.executor.feed.hub import FeedHub
from tfos_nb.runtime.protocol import dataplane


@pytest.fixture
def node():
    yield from serve(FeedHub())


def send_after(port, rows, partition, after, gen=1):
    """A deterministic-mode feeder: its partition is read after partition ``after`` (the driver's assignment)."""
    header = {"partition": partition, "gen": gen, "mode": "train"}
    if after >= 0:
        header["after"] = after
    sock = dataplane.client_connect("127.0.0.1", port, SECRET, header, 10)
    for row in rows:
        dataplane.send_frame(sock, dataplane.Kind.DATA, columns.encode_ipc(columns.rows_to_batch([row])))
    dataplane.send_frame(sock, dataplane.Kind.END)
    kind, payload = dataplane.recv_frame(sock)
    sock.close()
    return kind, dataplane.parse_json(payload)


def test_deterministic_mode_reads_partitions_in_order_and_answers_early_ones_at_once(node):
    """Partitions 0, 2, 4 of an epoch come to this node (n = 2) in the order 4, 2, 0, each one-row batch at a time,
    40 rows each (more than the queue's bound of 16 batches): 4 and 2 are kept aside and answered as soon as they
    are in (their feeding tasks end, freeing their Spark slots), and the read takes 0, then 2, then 4, whole."""
    hub, server = node
    hub.epoch_assigned(1, 3)
    answers = {p: send_after(server.port, [(float(p), i) for i in range(40)], p, p - 2) for p in (4, 2)}
    done = (dataplane.Kind.DONE, {"rows": 40, "skipped": 0, "shared": 0})
    assert answers == {4: done, 2: done}
    assert hub.queued_rows() == {1: 80}  # kept, not read: partition 0 has not come
    epoch = [0]
    reader, got = take_in_thread(hub, 1000, epoch)
    first = send_after(server.port, [(0.0, i) for i in range(40)], 0, -1)
    reader.join(10)
    assert not reader.is_alive() and first == (dataplane.Kind.DONE, {"rows": 40, "skipped": 0, "shared": 0})
    order = [(p, i) for _, b in got["pieces"] for p, i in zip(b.column(0).to_pylist(), b.column(1).to_pylist(),
                                                              strict=True)]
    assert order == [(float(p), i) for p in (0, 2, 4) for i in range(40)]
    assert hub.take(10, True, epoch) == [] and hub.queued_rows() == {}


def test_deterministic_mode_an_empty_partition_passes_its_turn_on(node):
    hub, server = node
    hub.epoch_assigned(1, 3)
    assert send_after(server.port, [(4.0, 0)], 4, 2)[0] is dataplane.Kind.DONE
    assert send_after(server.port, [], 2, 0)[0] is dataplane.Kind.DONE  # empty: answered at once all the same
    epoch = [0]
    reader, got = take_in_thread(hub, 1000, epoch)
    assert send_after(server.port, [(0.0, 0), (0.0, 1)], 0, -1)[0] is dataplane.Kind.DONE
    reader.join(10)
    assert [v for _, b in got["pieces"] for v in b.column(0).to_pylist()] == [0.0, 0.0, 4.0]


@pytest.fixture
def small_node():
    """A node that keeps at most ~2 KB of early partitions in memory: the rest goes to disk."""
    yield from serve(FeedHub(hold_bytes=2048))


def test_early_partitions_past_the_memory_budget_are_kept_on_disk_and_read_back_in_order(small_node):
    """Partitions 2 and 4 (300 one-row batches each, far past the budget and the queue's bound) come before 0:
    they are answered at once, kept mostly on disk in a private folder, read back in order once their turn comes,
    and the files are gone after."""
    hub, server = small_node
    hub.epoch_assigned(1, 3)
    for p in (4, 2):
        assert send_after(server.port, [(float(p), i) for i in range(300)], p, p - 2) == (
            dataplane.Kind.DONE, {"rows": 300, "skipped": 0, "shared": 0})
    turns = hub._turns
    assert turns.spilled == 2 and turns.held_bytes <= 2048 and hub.queued_rows() == {1: 600}
    folder = turns._folder
    assert oct(os.stat(folder).st_mode & 0o777) == "0o700" and len(os.listdir(folder)) == 2
    epoch = [0]
    reader, got = take_in_thread(hub, 10_000, epoch)
    assert send_after(server.port, [(0.0, i) for i in range(300)], 0, -1)[0] is dataplane.Kind.DONE
    reader.join(10)
    assert not reader.is_alive()
    order = [(p, i) for _, b in got["pieces"] for p, i in zip(b.column(0).to_pylist(), b.column(1).to_pylist(),
                                                              strict=True)]
    assert order == [(float(p), i) for p in (0, 2, 4) for i in range(300)]
    assert os.listdir(folder) == [] and turns.held_bytes == 0
    hub.close()
    assert not os.path.exists(folder)


def test_a_node_that_stops_reading_counts_its_spilled_rows_as_skipped(small_node):
    hub, server = small_node
    hub.epoch_assigned(1, 2)
    assert send_after(server.port, [(2.0, i) for i in range(200)], 2, 0)[0] is dataplane.Kind.DONE
    folder = hub._turns._folder
    hub.close()  # terminate(): nothing more is read
    assert hub.skipped == 200 and not os.path.exists(folder)


def test_a_spilled_partition_whose_turn_comes_while_it_still_arrives_joins_the_queue_once_all_of_it_is_in():
    """The hub alone, connections over socket pairs: partition 2 spills (no memory budget) and its turn comes while
    its feeder still sends; the read waits for its end, then takes every row in order."""
    import socket

    from tfos_nb.runtime.executor.feed.conn import Conn

    hub = FeedHub(hold_bytes=0)
    pairs = [socket.socketpair() for _ in range(2)]
    c0 = Conn(pairs[0][0], {"partition": 0, "gen": 1})
    c2 = Conn(pairs[1][0], {"partition": 2, "gen": 1, "after": 0})

    def batch(p, lo, hi):
        return columns.rows_to_batch([(float(p), i) for i in range(lo, hi)])

    try:
        hub.epoch_assigned(1, 2)
        hub.put(c2, 1, batch(2, 0, 10))
        hub.put(c0, 1, batch(0, 0, 5))
        hub.end_conn(c0)
        epoch = [0]
        reader, got = take_in_thread(hub, 100, epoch)
        hub.put(c2, 1, batch(2, 10, 20))  # once c0 is read c2's turn comes, but c2 still arrives: kept aside
        assert hub._turns.spilled == 1
        hub.end_conn(c2)
        reader.join(10)
        assert not reader.is_alive()
        rows = [(p, i) for _, b in got["pieces"] for p, i in zip(b.column(0).to_pylist(), b.column(1).to_pylist(),
                                                                 strict=True)]
        assert rows == [(0.0, i) for i in range(5)] + [(2.0, i) for i in range(20)]
    finally:
        hub.close()
        for a, b in pairs:
            a.close()
            b.close()
