"""Taking a cluster's state as a snapshot, and applying one to a mirror (Spark Connect).

The coordinator (in the cluster) answers :class:`~...protocol.remote.Snapshot`
with the :class:`~...protocol.remote.ClusterSnapshot` :func:`take` builds; the
notebook parses it (``ClusterSnapshot.from_dict``) and applies it to its *mirror*
ClusterState with :meth:`Mirror.apply`, so the panel, ``logs()``, ``history()`` and errors read
the mirror exactly as they read the driver's state on a classic session.
Log lines and reports travel once: the notebook says how many of each it has
(per node) and gets the rest, at most ``MAX_LINES``/``MAX_REPORTS`` a time.
Nothing here unpickles.
"""

from __future__ import annotations

import itertools

from ...protocol import remote
from ...protocol.bodies import BeatReport
from ..control import state as cluster_state
from ..control import states

MAX_LINES = 400  # log lines per node per snapshot (the rest come with the next one)
MAX_REPORTS = 1000  # reports per node per snapshot

# the node's attributes a NodeSnapshot carries as they are (the rest: its state, copies, or ages, or what is new)
_NODE_FIELDS = ("host", "port", "executor_id", "pid", "child_pid", "data_port", "step", "total_steps",
                "total_epochs", "rows_fed", "feed_closed", "error", "exit_code", "tensorboard", "tensorboard_error",
                "value", "working_dir", "phase", "where")


class LogBook:
    """Every node's output lines with a running count, so a reader can ask for 'the lines after n'."""

    def __init__(self, n_nodes: int, kept: int = cluster_state.LOG_LINES_KEPT) -> None:
        self.kept = kept
        self.lines: list[list[str]] = [[] for _ in range(n_nodes)]
        self.base = [0] * n_nodes  # how many lines were dropped from the front

    def add(self, index: int, lines: list[str]) -> None:
        buf = self.lines[index]
        buf.extend(lines)
        if len(buf) > self.kept:
            cut = len(buf) - self.kept
            del buf[:cut]
            self.base[index] += cut

    def since(self, index: int, count: int) -> tuple[list[str], int]:
        """Lines after the first ``count`` (those dropped meanwhile are skipped); returns them and the new count."""
        buf, base = self.lines[index], self.base[index]
        start = max(0, count - base)
        out = buf[start : start + MAX_LINES]
        return out, base + start + len(out)


def take(state: cluster_state.ClusterState, logbook: LogBook, logs_seen: list[int], history_seen: list[int],
         feed_errors: list[str], lost_feeds: int,
         streams: dict[str, remote.StreamCounts] | None = None) -> remote.ClusterSnapshot:
    """The state, with the log lines and reports after ``logs_seen``/``history_seen`` (its ``to_dict()`` travels).

    ``streams``: the training streams' counts by epoch (see :class:`~...protocol.remote.StreamBatch`).
    """
    now = state.clock()
    nodes = []
    with state.lock:
        for n in state.nodes:
            seen = logs_seen[n.index] if n.index < len(logs_seen) else 0
            logs, logs_count = logbook.since(n.index, seen)
            h_seen = history_seen[n.index] if n.index < len(history_seen) else 0
            start = max(0, h_seen - n.history_dropped)  # rows dropped from a full history are not sent again
            hist = list(itertools.islice(n.history, start, start + MAX_REPORTS))
            nodes.append(remote.NodeSnapshot(
                **{k: getattr(n, k) for k in _NODE_FIELDS}, state=n.state, tail=list(n.tail), gpus=list(n.gpus),
                metrics=dict(n.metrics), rate=n.rate,
                age=None if n.last_heartbeat is None else now - n.last_heartbeat,
                still=None if n.moved_at is None else now - n.moved_at,  # an age: the clocks differ
                failed=None if n.failed_at is None else now - n.failed_at,
                logs=logs, logs_count=logs_count,
                reports=[remote.Report(time=t, step=step, metrics=metrics, times=totals or {})
                         for t, step, metrics, totals in hist],
                history_count=n.history_dropped + start + len(hist), grant=n.grant.to_dict()))
        return remote.ClusterSnapshot(
            state=state.state, error=state.error, feed_epoch=state.feed_epoch, epoch_done=state.epoch_done,
            stop_requested=state.stop_requested, kill_requested=state.kill_requested, nodes=nodes,
            feed_errors=list(feed_errors), lost_feeds=lost_feeds, streams=dict(streams or {}),
            feeding=[[f, g, p, i, e, now - since] for (f, g, p), (i, e, since) in state.feeding.items()],
            feed_pending=list(state.feed_pending))


class Mirror:
    """The notebook's copy of a cluster hosted elsewhere: applies the coordinator's snapshots to a ClusterState."""

    def __init__(self, state: cluster_state.ClusterState) -> None:
        self.state = state
        self.logs_seen = [0] * len(state.nodes)
        self.history_seen = [0] * len(state.nodes)
        self.feed_errors: list[str] = []
        self.lost_feeds = 0
        self.streams: dict[str, remote.StreamCounts] = {}  # the training streams' counts, by epoch

    def apply(self, snap: remote.ClusterSnapshot) -> None:
        st = self.state
        new_logs: list[tuple[str, list[str]]] = []
        now = st.clock()
        with st.lock:
            for n, d in zip(st.nodes, snap.nodes):
                # the coordinator's transitions, as far as it went (states.transition's mirror path)
                states.transition(n, states.Node(d.state), why="the coordinator's snapshot", mirror=True)
                for key in _NODE_FIELDS:
                    setattr(n, key, getattr(d, key))
                n.gpus, n.tail, n.metrics = list(d.gpus), list(d.tail), dict(d.metrics)
                n.grant = cluster_state.Grant.of(d.grant)
                n.last_heartbeat = None if d.age is None else now - d.age
                n.moved_at = None if d.still is None else now - d.still
                n.failed_at = None if d.failed is None else now - d.failed
                if d.reports:
                    st.record_reports(n, [BeatReport(step=r.step, metrics=r.metrics, time=r.time, times=r.times)
                                          for r in d.reports])
                if d.rate is not None:
                    n.rate = d.rate
                self.history_seen[n.index] = d.history_count
                if d.logs:
                    n.logs.extend(d.logs)
                    new_logs.append((n.label, list(d.logs)))
                self.logs_seen[n.index] = d.logs_count
            st.feed_epoch, st.epoch_done = snap.feed_epoch, snap.epoch_done
            st.stop_requested, st.kill_requested = snap.stop_requested, snap.kill_requested
            self.feed_errors = list(snap.feed_errors)
            self.lost_feeds = snap.lost_feeds
            self.streams = dict(snap.streams)
            st.feeding = {(str(f), int(g), int(p)): (int(i), str(e), now - float(age))
                          for f, g, p, i, e, age in (row for row in snap.feeding if len(row) == 6)}
            st.feed_pending = tuple(int(p) for p in snap.feed_pending)
            if not st.ended and snap.state:
                states.transition(st, states.Cluster(snap.state), why="the coordinator's snapshot", mirror=True)
                st.error = snap.error or st.error
                if st.ended:
                    st.ended_at = now
        for label, lines in new_logs:
            st.emit_logs(label, lines)
        st.notify()
