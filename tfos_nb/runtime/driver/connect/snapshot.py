"""A cluster's state as plain JSON, and applying it to a mirror (Spark Connect).

The coordinator (in the cluster) answers :class:`~...protocol.remote.Snapshot`
with :func:`to_json`; the notebook applies it to its *mirror* ClusterState
with :func:`apply`, so the panel, ``logs()``, ``history()`` and errors read
the mirror exactly as they read the driver's state on a classic session.
Log lines and reports travel once: the notebook says how many of each it has
(per node) and gets the rest, at most ``MAX_LINES``/``MAX_REPORTS`` a time.
Nothing here unpickles.
"""

from __future__ import annotations

from typing import Any

from .. import state as S

MAX_LINES = 400  # log lines per node per snapshot (the rest come with the next one)
MAX_REPORTS = 1000  # reports per node per snapshot

_NODE_FIELDS = ("state", "host", "port", "executor_id", "pid", "child_pid", "data_port", "gpus", "step",
                "total_steps", "total_epochs", "metrics", "rows_fed", "feed_closed", "error", "exit_code",
                "tail", "tensorboard", "tensorboard_error", "value", "working_dir", "phase")


class LogBook:
    """Every node's output lines with a running count, so a reader can ask for 'the lines after n'."""

    def __init__(self, n_nodes: int, kept: int = S.LOG_LINES_KEPT) -> None:
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


def to_json(state: S.ClusterState, logbook: LogBook, logs_seen: list[int], history_seen: list[int],
            feed_errors: list[str], lost_feeds: int, streams: dict[str, Any] | None = None) -> dict[str, Any]:
    """The state as plain JSON, with the log lines and reports after ``logs_seen``/``history_seen``.

    ``streams``: the training streams' counts by epoch (see :class:`~...protocol.remote.StreamBatch`).
    """
    now = state.clock()
    nodes = []
    with state.lock:
        for n in state.nodes:
            d: dict[str, Any] = {k: getattr(n, k) for k in _NODE_FIELDS}
            d["tail"] = list(n.tail)
            d["rate"] = n.rate
            d["age"] = None if n.last_heartbeat is None else now - n.last_heartbeat
            d["still"] = None if n.moved_at is None else now - n.moved_at  # an age: the clocks differ
            seen = logs_seen[n.index] if n.index < len(logs_seen) else 0
            d["logs"], d["logs_count"] = logbook.since(n.index, seen)
            h_seen = history_seen[n.index] if n.index < len(history_seen) else 0
            hist = list(n.history)[h_seen : h_seen + MAX_REPORTS]
            d["reports"] = [{"time": t, "step": step, "metrics": metrics} for t, step, metrics in hist]
            d["history_count"] = h_seen + len(hist)
            nodes.append(d)
        return {
            "state": state.state, "error": state.error, "feed_epoch": state.feed_epoch,
            "epoch_done": state.epoch_done, "stop_requested": state.stop_requested,
            "kill_requested": state.kill_requested, "nodes": nodes,
            "feed_errors": list(feed_errors), "lost_feeds": lost_feeds,
            "streams": {k: dict(v) for k, v in (streams or {}).items()},
        }


class Mirror:
    """The notebook's copy of a cluster hosted elsewhere: applies the coordinator's snapshots to a ClusterState."""

    def __init__(self, state: S.ClusterState) -> None:
        self.state = state
        self.logs_seen = [0] * len(state.nodes)
        self.history_seen = [0] * len(state.nodes)
        self.feed_errors: list[str] = []
        self.lost_feeds = 0
        self.streams: dict[str, dict[str, Any]] = {}  # the training streams' counts, by epoch

    def apply(self, data: dict[str, Any]) -> None:
        st = self.state
        new_logs: list[tuple[str, list[str]]] = []
        now = st.clock()
        with st.lock:
            for n, d in zip(st.nodes, data.get("nodes", [])):
                for key in _NODE_FIELDS:
                    if key in d:
                        setattr(n, key, d[key])
                n.gpus = list(n.gpus or [])
                n.tail = list(n.tail or [])
                n.metrics = dict(n.metrics or {})
                age = d.get("age")
                n.last_heartbeat = None if age is None else now - float(age)
                still = d.get("still")
                n.moved_at = None if still is None else now - float(still)
                if d.get("reports"):
                    st.record_reports(n, d["reports"])
                if d.get("rate") is not None:
                    n.rate = d["rate"]
                self.history_seen[n.index] = int(d.get("history_count", self.history_seen[n.index]))
                lines = [str(x) for x in d.get("logs", [])]
                if lines:
                    n.logs.extend(lines)
                    new_logs.append((n.label, lines))
                self.logs_seen[n.index] = int(d.get("logs_count", self.logs_seen[n.index]))
            for key in ("feed_epoch", "epoch_done", "stop_requested", "kill_requested"):
                if key in data:
                    setattr(st, key, data[key])
            self.feed_errors = list(data.get("feed_errors", []))
            self.lost_feeds = int(data.get("lost_feeds", 0))
            self.streams = {str(k): dict(v) for k, v in (data.get("streams") or {}).items()}
            if not st.ended and data.get("state"):
                st.state = data["state"]
                st.error = data.get("error") or st.error
                if st.ended:
                    st.ended_at = now
        for label, lines in new_logs:
            st.emit_logs(label, lines)
        st.notify()
