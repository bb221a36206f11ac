"""The driver's control port becomes unreachable mid-training (issue 41's fault matrix), on a real cluster.

There is no firewall to program here (no iptables), so the nodes reach the driver's control server through a relay
this test owns: cut, it swallows every byte both ways and forwards no new connection, as a firewall that drops
packets would.  The driver names the cause (every node silent at once) within its heartbeat timeout, and the
nodes, cut off, end themselves: nothing is left.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

import cloudpickle
import pytest

from tests.conftest import runtime_processes, spark_fixture, start_cluster, wait_until
from tfos_nb import TFCluster
from tfos_nb.runtime.driver.job import DriverJob

pytestmark = [pytest.mark.slow, pytest.mark.faults]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

spark = spark_fixture(2)

NAMED_WITHIN_S = 30  # issue 41


class Relay:
    """A TCP relay to ``target``; :meth:`cut` makes it a black hole (bytes read and dropped, nothing forwarded)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.cut_event = threading.Event()
        self.listener = socket.create_server((target[0], 0))
        self.address = (target[0], self.listener.getsockname()[1])
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="test-relay").start()

    def cut(self) -> None:
        self.cut_event.set()

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for s in self.socks:
                s.close()

    def _keep(self, *socks: socket.socket) -> None:
        with self.lock:
            self.socks.extend(socks)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.cut_event.is_set():  # held open, never answered
                self._keep(conn)
                threading.Thread(target=self._pump, args=(conn, None), daemon=True).start()
                continue
            upstream = socket.create_connection(self.target)
            self._keep(conn, upstream)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket | None) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if dst is not None and not self.cut_event.is_set():
                try:
                    dst.sendall(data)
                except OSError:
                    return


def steps_until_told(args, ctx):
    """Reports a step every 0.1 s for up to 10 minutes (the nodes end long before: the driver is cut off)."""
    import time as t

    for step in range(1, 6000):
        ctx.report(step=step)
        t.sleep(0.1)


def test_a_control_port_cut_off_mid_training_is_named_and_the_nodes_end(sc, monkeypatch, no_leaks):
    relays: list[Relay] = []
    open_control = DriverJob.open_control

    def through_a_relay(self):
        relay = Relay(open_control(self))
        relays.append(relay)
        return relay.address  # what the launch meta gives the executors

    monkeypatch.setattr(DriverJob, "open_control", through_a_relay)
    cluster = start_cluster(sc, steps_until_told, {}, 2, master_node="chief",
                            input_mode=TFCluster.InputMode.TENSORFLOW)
    try:
        assert wait_until(lambda: all((n.step or 0) >= 5 for n in cluster.status().nodes), 120), cluster.status()
        relays[0].cut()
        cut_at = time.monotonic()
        with pytest.raises(TFCluster.TFClusterError) as info:
            cluster.shutdown(timeout=120)
        named = time.monotonic() - cut_at
    finally:
        for relay in relays:
            relay.close()
    text = str(info.value)
    assert text.startswith("chief:0 failed on host "), text
    assert (f"no heartbeat from any of the 2 nodes for 10 s: their executors cannot reach the driver's control server "
            f"at {relays[0].target[0]}:{relays[0].target[1]} (a firewall") in text, text
    assert named <= NAMED_WITHIN_S, (named, text)
    # cut off, each supervisor ends its node once the driver has not answered for its timeout
    assert wait_until(lambda: not runtime_processes(), 60), runtime_processes()
    print(f"\ncontrol port cut off: named in {named:.1f} s: {text.splitlines()[0]}")
