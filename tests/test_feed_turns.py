"""Deterministic mode on a node's data plane (``executor/feed_turns.py``), over real sockets: a DataServer and
feeder connections that name the partition their node reads before theirs."""

import threading

import pytest

from tests.server_abuse import SECRET
from tfos_nb.runtime import columns as C
from tfos_nb.runtime.executor.data_server import DataServer
from tfos_nb.runtime.executor.feed_hub import FeedHub
from tfos_nb.runtime.protocol import dataplane as dp


@pytest.fixture
def node():
    hub = FeedHub()
    server = DataServer(hub, SECRET, "127.0.0.1").start()
    yield hub, server
    hub.close()
    server.stop()


def take_in_thread(hub, n, epoch):
    out = {}
    t = threading.Thread(target=lambda: out.update(pieces=hub.take(n, True, epoch)))
    t.start()
    return t, out


def send_after(port, rows, partition, after, gen=1):
    """A deterministic-mode feeder: its partition is read after partition ``after`` (the driver's assignment)."""
    header = {"partition": partition, "gen": gen, "mode": "train"}
    if after >= 0:
        header["after"] = after
    sock = dp.client_connect("127.0.0.1", port, SECRET, header, 10)
    for row in rows:
        dp.send_frame(sock, dp.Kind.DATA, C.encode_ipc(C.rows_to_batch([row])))
    dp.send_frame(sock, dp.Kind.END)
    kind, payload = dp.recv_frame(sock)
    sock.close()
    return kind, dp.parse_json(payload)


def test_deterministic_mode_reads_partitions_in_order_and_answers_early_ones_at_once(node):
    """Partitions 0, 2, 4 of an epoch come to this node (n = 2) in the order 4, 2, 0, each one-row batch at a time,
    40 rows each (more than the queue's bound of 16 batches): 4 and 2 are kept aside and answered as soon as they
    are in (their feeding tasks end, freeing their Spark slots), and the read takes 0, then 2, then 4, whole."""
    hub, server = node
    hub.epoch_assigned(1, 3)
    answers = {p: send_after(server.port, [(float(p), i) for i in range(40)], p, p - 2) for p in (4, 2)}
    assert answers == {4: (dp.Kind.DONE, {"rows": 40, "skipped": 0}), 2: (dp.Kind.DONE, {"rows": 40, "skipped": 0})}
    assert hub.queued_rows() == {1: 80}  # kept, not read: partition 0 has not come
    epoch = [0]
    reader, got = take_in_thread(hub, 1000, epoch)
    first = send_after(server.port, [(0.0, i) for i in range(40)], 0, -1)
    reader.join(10)
    assert not reader.is_alive() and first == (dp.Kind.DONE, {"rows": 40, "skipped": 0})
    order = [(p, i) for _, b in got["pieces"] for p, i in zip(b.column(0).to_pylist(), b.column(1).to_pylist(),
                                                              strict=True)]
    assert order == [(float(p), i) for p in (0, 2, 4) for i in range(40)]
    assert hub.take(10, True, epoch) == [] and hub.queued_rows() == {}


def test_deterministic_mode_an_empty_partition_passes_its_turn_on(node):
    hub, server = node
    hub.epoch_assigned(1, 3)
    assert send_after(server.port, [(4.0, 0)], 4, 2)[0] is dp.Kind.DONE
    assert send_after(server.port, [], 2, 0)[0] is dp.Kind.DONE  # empty: answered at once all the same
    epoch = [0]
    reader, got = take_in_thread(hub, 1000, epoch)
    assert send_after(server.port, [(0.0, 0), (0.0, 1)], 0, -1)[0] is dp.Kind.DONE
    reader.join(10)
    assert [v for _, b in got["pieces"] for v in b.column(0).to_pylist()] == [0.0, 0.0, 4.0]
