"""The coordinator: a cluster's control server hosted on an executor (Spark Connect).

On Spark Connect the notebook's process cannot be reached from the executors.
Barrier task 0 of the launch stage starts this process (``python -m
tfos_nb.runtime coordinator``, detached like a node supervisor) with the launch
meta on stdin; it prints its address and runs the same
:class:`~..controller.Controller` and :class:`~..state.ClusterState` the classic
driver runs.  Node supervisors and feeding tasks talk to it directly; the
notebook reaches it through tiny Spark jobs (``Snapshot`` and ``Command``
messages, see :mod:`...protocol.remote`).

Why an executor hosts a Controller, and why this module is on the driver's side
of the layering (``runtime/driver``) though it runs on an executor: it *is* the
driver's control plane, moved to where the nodes can reach it.  Nodes and
feeding tasks speak to it over the same signed wire they speak to the classic
driver's server; executor code never imports it (``runtime/executor`` reaches
the driver only over the wire).  Its imports load neither pyspark nor
TensorFlow (``tests/test_layers.py`` checks it): it starts in a bare Python.

It ends when the notebook says ``close``, or when the notebook has not been
heard of (no snapshot, command or feeding task) for ``kernel_timeout`` s: then
it fails the cluster, so every node is killed at its next heartbeat, as the
classic driver-lost path does.  Either way it exits once the nodes stopped
heartbeating (at most ``EXIT_WAIT_S`` later).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from ...protocol import messages, remote
from ...protocol.channel import ControlServer
from ..control import state
from ..control.controller import Controller
from ..control.roles import all_finished, trainers_finished
from ..options import JobOptions
from ..parallel.control import RunController
from . import snapshot

EXIT_WAIT_S = 15.0
QUIET_S = 2.0  # after close: exit once no node spoke for this long


class Coordinator:
    def __init__(self, launch_meta: Mapping[str, Any] | messages.LaunchMeta, settings: messages.CoordinatorMeta | None = None) -> None:
        """``settings``: the meta's ``coordinator`` section, when the caller parsed it already."""
        meta = messages.LaunchMeta.parse(launch_meta)
        c = settings if settings is not None else messages.CoordinatorMeta.from_dict(meta.coordinator)
        roles = [(str(job), int(idx)) for job, idx in meta.roles]
        self.state = state.ClusterState(meta.cluster_id, c.name, roles)
        # kind "parallel": TFParallel's runs, which are tasks of the notebook's own Spark job (they speak
        # only while that job runs, so they count as the notebook being heard of)
        self.runs = c.kind == "parallel"
        self.finished = all_finished if self.runs else trainers_finished
        options = JobOptions(num_gpus=c.num_gpus, heartbeat_timeout=c.heartbeat_timeout, deterministic=c.ordered_feed)
        self.controller = (RunController if self.runs else Controller)(
            self.state, options, input_mode_spark=c.input_mode_spark, tensorboard=c.tensorboard, log_dir=c.log_dir)
        self.kernel_timeout = c.kernel_timeout
        self.logbook = snapshot.LogBook(len(roles))
        self.state.add_log_listener(self._log)
        self._labels = {n.label: n.index for n in self.state.nodes}
        self.last_kernel = time.monotonic()
        self.last_node = time.monotonic()
        self.closing_since: float | None = None
        self.streams: dict[str, remote.StreamCounts] = {}  # a training stream's counts, by its epoch (see StreamBatch)
        self.done = threading.Event()
        secret = bytes.fromhex(meta.secret)
        self.server = ControlServer(messages.Codec(secret, meta.cluster_id, "coordinator"), self.handle,
                                    c.bind or "127.0.0.1", on_tick=self.tick)

    def _log(self, label: str, lines: list[str]) -> None:
        self.logbook.add(self._labels[label], lines)

    def handle(self, msg: messages.Message) -> messages.Reply:
        now = time.monotonic()
        if isinstance(msg, remote.Snapshot):
            self.last_kernel = now
            return messages.Reply(ok=True, body=self._snapshot(msg.logs, msg.history).to_dict())
        if isinstance(msg, remote.Command):
            self.last_kernel = now
            return self._command(msg)
        if isinstance(msg, remote.StreamBatch):
            self.last_kernel = now  # a stream's foreachBatch runs only while the notebook's query runs
            return self._stream_batch(msg)
        if isinstance(msg, (messages.FeedAssign, messages.FeedRelease, messages.FeedCheck)):
            self.last_kernel = now  # feeding tasks run only while the notebook waits for them
        else:
            self.last_node = now
            if self.runs:
                self.last_kernel = now
        return self.controller.handle(msg)

    def _snapshot(self, logs: list[Any], history: list[Any]) -> remote.ClusterSnapshot:
        return snapshot.take(self.state, self.logbook, [int(x) for x in logs], [int(x) for x in history],
                                self.controller.feed_errors, self.controller.lost_feeds, self.streams)

    def _stream_batch(self, msg: remote.StreamBatch) -> messages.Reply:
        with self.state.lock:
            got = self.streams.get(str(msg.epoch), remote.StreamCounts())
            if msg.error is not None:
                if got.error is None:
                    got = dataclasses.replace(got, error=msg.error, failed_batch=msg.batch)
            else:
                got = dataclasses.replace(got, batches=got.batches + 1, rows=got.rows + msg.rows,
                                          skipped=got.skipped + msg.skipped, partitions=got.partitions + msg.partitions)
            self.streams[str(msg.epoch)] = got
        return messages.Reply(ok=True)

    def _command(self, msg: remote.Command) -> messages.Reply:
        """Obey ``msg``; the reply's body is the op's typed body (see :class:`remote.Command`)."""
        ctl = self.controller
        body: remote.Done | remote.EpochOpened | remote.Closed = remote.Done()
        if msg.op == "open_epoch":
            body = remote.EpochOpened(epoch=ctl.open_epoch(None if msg.remaining < 0 else msg.remaining))
        elif msg.op == "end_epoch":
            ctl.end_epoch(msg.epoch)
        elif msg.op == "open_set":
            body = remote.EpochOpened(epoch=ctl.open_set(msg.reason, msg.remaining))
        elif msg.op == "end_set":
            ctl.end_set(msg.reason, msg.epoch)
        elif msg.op == "request_stop":
            ctl.request_stop()
        elif msg.op == "request_kill":
            ctl.request_kill()
        elif msg.op == "cancel":
            ctl.cancel(msg.reason or "cancelled")
        elif msg.op == "set_running":
            ctl.set_running()
        elif msg.op == "reset_feed_errors":
            ctl.reset_feed_errors()
        elif msg.op == "set_feed_tasks":
            ctl.set_feed_tasks(msg.epoch, msg.tasks)
        elif msg.op == "close":
            ctl.request_kill()
            body = remote.Closed(final=ctl.finish(self.finished))
            self._close()
        else:
            return messages.Reply(ok=False, error=f"unknown command {msg.op!r}")
        return messages.Reply(ok=True, body=body.to_dict())

    def _close(self) -> None:
        if self.closing_since is None:
            self.closing_since = time.monotonic()

    def tick(self) -> None:
        self.controller.tick()
        now = time.monotonic()
        if self.closing_since is None and now - self.last_kernel > self.kernel_timeout:
            self.controller.fail(f"the notebook was not heard of for {self.kernel_timeout:.0f} s")
            self._close()
        if self.closing_since is not None:
            quiet = now - max(self.last_node, self.closing_since) > QUIET_S
            if quiet or now - self.closing_since > EXIT_WAIT_S:
                self.done.set()


def bind_address(hint: str | None) -> str:
    """Where the coordinator listens: the hint (loopback when Spark is local), else this host's address."""
    if hint:
        return hint
    host = os.environ.get("SPARK_LOCAL_IP") or socket.gethostname()
    from ...net import resolve

    return resolve(host)


def main() -> int:
    meta = messages.LaunchMeta.parse(json.loads(sys.stdin.buffer.readline()))
    sys.stdin.close()
    settings = messages.CoordinatorMeta.from_dict(meta.coordinator)
    coord = Coordinator(meta, dataclasses.replace(settings, bind=bind_address(settings.bind)))
    try:
        host, port = coord.server.start()
        if isinstance(coord.controller, Controller):
            coord.controller.address = (host, port)  # named when every node falls silent at once
    except OSError as exc:  # never every interface instead: the port would be open to every network
        error = (f"{exc.strerror}; the executor's address (SPARK_LOCAL_IP, else its host name) must be an address "
                 "of that machine")
        sys.stdout.write(json.dumps({"ok": False, "error": error}) + "\n")
        sys.stdout.flush()
        return 1
    sys.stdout.write(json.dumps({"ok": True, "control": [host, port], "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    sys.stdout.close()
    try:
        coord.done.wait()
    finally:
        coord.server.stop()
    return 0
