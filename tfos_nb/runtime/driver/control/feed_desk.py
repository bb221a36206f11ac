"""The controller's feeding desk: which node reads each partition a feeding task brings, and what feeding went wrong.

Feeding tasks ask it for a node (:class:`messages.FeedAssign`), tell it when they are done
(:class:`messages.FeedRelease`) and ask what became of a node they lost (:class:`messages.FeedCheck`); the
:class:`~.controller.Controller` hands it those messages on the control server's thread, and the nodes'
heartbeats' feeding news (partitions cut short, named sets read) with the heartbeat's lock held.  It keeps who got
each epoch's partitions (:class:`~..feeding.shares.EpochShares`: each node ends its reads at its share), the named
sets (:class:`~..feeding.set_records.FeedSets`) and the feeding tasks' errors.  The job's owner reaches it through
the controller's methods (:class:`~.plane.ControlPlane`), which take the state's lock here.

A training partition goes to the least busy running node (local first on ties), or — deterministic mode — to the
node and after the partition :func:`~tfos_nb.runtime.determinism.order.reader` fixes.  A partition fed twice
(Spark retried a feeding task that had begun) fails the job :data:`REFED_GRACE_S` later, unless a truer error
(its executor's node lost) comes first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...determinism import order
from ...protocol import messages
from ..feeding.set_records import FeedSets
from ..feeding.shares import EpochShares
from . import state as cluster_state
from .roles import FEEDABLE

log = logging.getLogger(__name__)
# A training partition's feeding task started again by Spark is refused this long after it first asks: a lost
# executor's node fails meanwhile (its supervisor sees the JVM gone within a heartbeat), and that error comes first.
REFED_GRACE_S = 2.0


def refed_partition(partition: int, node: cluster_state.NodeRecord | None, rows: int | None = None) -> str:
    """The cluster's error when a training partition's feeding task died after it began to feed (its Python
    worker killed, its task lost; ``rows``: what reached the node, as the node saw its connection break) or Spark
    starts it again (``rows`` None): a second feed of the partition would train rows twice."""
    who = node.label if node is not None else "a node"
    what = (f"the feeding task of partition {partition} died after {rows} of its rows reached {who}" if rows is not None
            else f"Spark started the feeding task of partition {partition} again after an attempt that was feeding it "
                 f"to {who} died")
    return (f"{what} (its Python worker or task was killed): Spark's retry feeds a partition from its first row, "
            f"so rows {who} already took would be trained twice; the cluster stops. train() again on a new cluster, "
            "or give the job retries (run_job(retries=N), %%tfos_cluster --retries N)")


class FeedDesk:
    """The feeding side of one job's controller (see the module's docstring)."""

    def __init__(self, state: cluster_state.ClusterState, *, ordered: bool, fail: Callable[[str], None]) -> None:
        """``ordered``: deterministic mode's fixed feed; ``fail(error)``: the controller's, ending the job (lock
        held)."""
        self.state = state
        self.ordered = ordered
        self._fail = fail
        self._active: dict[int, int] = {}  # node -> feeding tasks now
        self._assigned: dict[int, int] = {}  # node -> partitions handed out
        self._gens_feeding: set[int] = set()  # feeding generations (epochs) a partition has asked a node for
        self.shares = EpochShares()  # who got each epoch's partitions (nodes end their reads at their share)
        state.pending_from(lambda: self.shares.pending(state.epoch_done))
        self.sets = FeedSets()  # named sets: sets fed once (a validation set), kept by the nodes
        # (epoch, partition) cut short or asked for again -> (its node, rows that reached it if known, when heard of)
        self._cut: dict[tuple[int, int], tuple[int, int | None, float]] = {}
        self.feed_errors: list[str] = []
        # the feeding tasks' own causes (a partition's rows: changed since counted, a UDF upstream raised), which a
        # node's failure that follows them (its feed ended) must not hide
        self.data_errors: list[str] = []
        self.lost_feeds = 0  # feeding tasks whose connection to a node broke (the node may be dying)

    def clock(self) -> float:
        return self.state.clock()  # read at each use: a test's clock replaces the state's

    # -- a heartbeat's feeding news, and what its answer tells the node (lock held) ----------
    def heard(self, node: cluster_state.NodeRecord, feed: messages.BeatFeed) -> None:
        """The node's training partitions cut short and the named sets its function read."""
        self.dropped(node, feed.dropped)
        self.sets.read_by(node.index, feed.sets_read)

    def told(self, node: cluster_state.NodeRecord, feed: messages.BeatFeed) -> dict[str, Any]:
        """The heartbeat answer's feeding fields (:class:`messages.BeatCommand`) for ``node``."""
        return {"epochs_assigned": self.shares.for_node(node.index), "feed_sample": self.sample_for(node, feed),
                "feed_sets": self.sets.for_node(node.index)}

    # -- the job's owner (any thread) ----------------------------------------------------------
    def open_set(self, name: str, passes: int = 1) -> int:
        with self.state.lock:
            version = self.sets.open(name, passes)
        self.state.notify()
        return version

    def end_set(self, name: str, version: int) -> None:
        with self.state.lock:
            self.sets.end(name, version)
        self.state.notify()

    def set_rows(self, name: str) -> dict[int, int]:
        with self.state.lock:
            return self.sets.rows(name)

    def unread_sets(self) -> dict[str, int]:
        with self.state.lock:
            return self.sets.unread()

    def count_epoch(self, epoch: int, rows: dict[int, int]) -> None:
        with self.state.lock:
            nodes = [n.index for n in self.state.nodes if n.job_name in FEEDABLE]
            self.shares.count(epoch, rows, nodes)
        self.state.notify()

    def set_feed_tasks(self, epoch: int, tasks: int) -> None:
        with self.state.lock:
            if epoch > self.state.epoch_done:
                self.shares.set_tasks(epoch, tasks)

    def feeding_started(self, epoch: int) -> bool:
        with self.state.lock:
            return epoch in self._gens_feeding

    def reset_feed_errors(self) -> None:
        with self.state.lock:
            self.feed_errors.clear()
            self.data_errors.clear()
            self.lost_feeds = 0

    # -- feeding tasks' messages (the control server's thread) ----------------------------------
    def sample_for(self, node: cluster_state.NodeRecord, feed: messages.BeatFeed) -> dict[str, Any]:
        """The running train()'s data shape for a node that has not confirmed it (a node given no row builds its
        dataset from it); lock held."""
        st = self.state
        node.sample_seen = max(node.sample_seen, feed.sample)
        if st.feed_plan is None or not st.feed_sample or node.sample_seen >= st.feed_sample_id:
            return {}
        return {**st.feed_sample, "id": st.feed_sample_id}

    def _batch_epoch(self, gen: int) -> bool:
        """Whether ``gen`` is an open epoch of the running ``train()`` call (lock held).  A stream's micro-batches
        are not: Spark's ``foreachBatch`` is at-least-once by its own contract (a failed batch is replayed)."""
        plan = self.state.feed_plan
        return gen > self.state.epoch_done and plan is not None and plan[0] <= gen <= plan[1]

    def dropped(self, node: cluster_state.NodeRecord, dropped: list[list[int]]) -> None:
        """A node's training partitions whose connection broke mid-partition (a heartbeat's news, each
        ``[epoch, partition, rows]``; lock held)."""
        for gen, partition, rows in dropped:
            if self._batch_epoch(gen):
                self._cut.setdefault((gen, partition), (node.index, rows, self.clock()))
        self._fail_cut()

    def _fail_cut(self) -> None:
        """Fail the cluster REFED_GRACE_S after a training partition was first heard of as cut short or asked for
        again (lock held), unless it ended or is being stopped meanwhile: a lost executor's node failing, the
        truer error, takes its feeding tasks with it and comes first."""
        st = self.state
        if st.ended or st.stop_requested or st.kill_requested:
            return
        for (_, partition), (index, rows, at) in sorted(self._cut.items()):
            if self.clock() - at >= REFED_GRACE_S:
                self._fail(refed_partition(partition, self.state.node(index), rows))
                return

    def assign(self, msg: messages.FeedAssign) -> messages.Reply:
        st = self.state
        if msg.feed != "input":
            return self._set_assign(msg)
        with st.lock:
            if msg.sample and not st.feed_sample and st.feed_plan is not None and msg.gen >= st.feed_plan[0]:
                st.feed_sample = dict(msg.sample)
            if st.state == cluster_state.C_FAILED:
                return messages.Reply(ok=False, error=st.error or "cluster failed")
            if st.state == cluster_state.C_STOPPED or st.kill_requested:
                return messages.Reply(ok=False, error="cluster stopped")
            if msg.mode == "train" and self._batch_epoch(msg.gen):
                earlier = self.shares.fed_to(msg.gen, msg.partition)
                if earlier is not None:  # Spark retried a feeding task that died after it began to feed
                    self._cut.setdefault((msg.gen, msg.partition), (earlier, None, self.clock()))
                    self._fail_cut()
                    if st.state == cluster_state.C_FAILED:
                        return messages.Reply(ok=False, error=st.error)
                    return messages.Reply(ok=False, body=messages.Retry(0.2).to_dict())
            self._gens_feeding.add(msg.gen)
            if self.ordered and msg.mode == "train":
                return self._ordered_assign(msg)
            feedable = self.fed_nodes()
            live = [n for n in feedable if n.state == cluster_state.RUNNING and not n.feed_closed]
            if not live:
                if feedable and all(n.state in cluster_state.TERMINAL or n.feed_closed for n in feedable):
                    if msg.mode == "train" and msg.gen > st.epoch_done:
                        return self._skipped(msg)
                    return messages.Reply(ok=False, error="no node is reading data any more (all finished)")
                return messages.Reply(ok=False, body=messages.Retry(0.1).to_dict())
            # The least busy node takes the partition (a node serves several inference feeders at once, each
            # one's results routed back in order), so that a feeder that never released its node (its Python
            # worker was killed) cannot make a re-run of the partition wait.
            def key(n: cluster_state.NodeRecord) -> tuple[int, int, bool, int]:
                local = n.executor_id == msg.executor_id if msg.executor_id else False
                return (self._active.get(n.index, 0), self._assigned.get(n.index, 0), not local, n.index)

            return self._hand_to(msg, min(live, key=key))

    def _ordered_assign(self, msg: messages.FeedAssign) -> messages.Reply:
        """Deterministic mode's feed (lock held): the partition's reader and the one it reads before it are fixed
        (:func:`~tfos_nb.runtime.determinism.order.reader`); a waiting feeding task never holds a Spark slot its node's next
        partition needs, as the node keeps an early partition aside (:mod:`~tfos_nb.runtime.determinism.turns`)."""
        nodes = sorted((n for n in self.state.nodes if n.job_name in FEEDABLE), key=lambda n: n.index)
        if not nodes or not all(n.data_port for n in nodes):
            return messages.Reply(ok=False, body=messages.Retry(0.1).to_dict())
        node, after = order.reader(msg.partition, nodes)
        if node.state in cluster_state.TERMINAL or node.feed_closed:  # the node reads no more, as in any mode: skipped
            return self._skipped(msg)
        if node.state != cluster_state.RUNNING:
            return messages.Reply(ok=False, body=messages.Retry(0.1).to_dict())
        return self._hand_to(msg, node, after=after)

    def _skipped(self, msg: messages.FeedAssign) -> messages.Reply:
        """A training partition no node will read (lock held): its feeder skips it (a node that ended reads no more:
        its peers' collectives ended with it)."""
        self.shares.handed_out(msg.gen, msg.partition, None)
        return messages.Reply(ok=True, body=messages.FeedAssignment(skip=True).to_dict())

    def _hand_to(self, msg: messages.FeedAssign, node: cluster_state.NodeRecord, after: int = -1) -> messages.Reply:
        """``msg``'s partition goes to ``node`` (``after``: deterministic mode's partition before it); lock held."""
        st = self.state
        self._active[node.index] = self._active.get(node.index, 0) + 1
        self._assigned[node.index] = self._assigned.get(node.index, 0) + 1
        rows = -1
        if msg.mode == "train" and msg.gen > st.epoch_done:
            self.shares.handed_out(msg.gen, msg.partition, node.index)
            rows = self.shares.expected(msg.gen, msg.partition)
        st.feeding[(msg.feed, msg.gen, msg.partition)] = (node.index, msg.executor_id, self.clock())
        log.debug("%s partition %d of epoch %d (executor %s) goes to %s%s", msg.mode, msg.partition, msg.gen,
                  msg.executor_id or "?", node.label, f", after partition {after}" if after >= 0 else "")
        return self._assigned_to(node, after, rows)

    def fed_nodes(self) -> list[cluster_state.NodeRecord]:
        """The nodes that read data (chief/worker of an InputMode.SPARK cluster) and said where (lock held)."""
        return [n for n in self.state.nodes if n.job_name in FEEDABLE and n.data_port]

    @staticmethod
    def _assigned_to(node: cluster_state.NodeRecord, after: int = -1, rows: int = -1) -> messages.Reply:
        target = messages.FeedAssignment(node=node.index, label=node.label, host=node.host, port=int(node.data_port or 0),
                                  after=max(after, -1), rows=rows)  # after - n < 0: the node's first partition
        return messages.Reply(ok=True, body=target.to_dict())

    def _set_assign(self, msg: messages.FeedAssign) -> messages.Reply:
        """A named set's partition goes to the node that had it (Spark's retry) or the one holding fewest."""
        st = self.state
        with st.lock:
            if st.state in (cluster_state.C_FAILED, cluster_state.C_STOPPED) or st.kill_requested:
                return messages.Reply(ok=False, error=st.error or f"cluster {st.state}")
            fed = self.fed_nodes()
            live = [n for n in fed if n.state == cluster_state.RUNNING]
            if not live:
                if fed and all(n.state in cluster_state.TERMINAL for n in fed):
                    return messages.Reply(ok=False, error=f"no node runs to take the feed {msg.feed!r} (all ended)")
                return messages.Reply(ok=False, body=messages.Retry(0.1).to_dict())
            node = self.sets.assign(msg.feed, msg.gen, msg.partition, msg.sample, live, msg.executor_id)
            if isinstance(node, str):
                return messages.Reply(ok=False, error=node)
            st.feeding[(msg.feed, msg.gen, msg.partition)] = (node.index, msg.executor_id, self.clock())
            return self._assigned_to(node)

    def check(self, msg: messages.FeedCheck) -> messages.Reply:
        """What became of a node a feeding task lost its connection to (see :class:`messages.FeedCheck`)."""
        st = self.state
        with st.lock:
            node = self.state.node(msg.node)
            if node is None:
                return messages.Reply(ok=False, error=f"no node {msg.node}")
            if node.state == cluster_state.FAILED or st.state == cluster_state.C_FAILED:
                verdict = messages.FeedVerdict("failed", st.error or f"{node.label} failed")
            elif node.state == cluster_state.FINISHED or node.feed_closed:
                verdict = messages.FeedVerdict("done")
            elif node.state == cluster_state.STOPPED or st.kill_requested or st.state == cluster_state.C_STOPPED:
                verdict = messages.FeedVerdict("stopped")
            else:
                verdict = messages.FeedVerdict("reading")
            return messages.Reply(ok=True, body=verdict.to_dict())

    def release(self, msg: messages.FeedRelease) -> messages.Reply:
        st = self.state
        with st.lock:
            node = self.state.node(msg.node)
            st.feeding.pop((msg.feed, msg.gen, msg.partition), None)
            log.debug("partition %d of %s %d done at %s: %d rows%s", msg.partition,
                      "epoch" if msg.feed == "input" else f"set {msg.feed!r} version", msg.gen,
                      node.label if node is not None else f"node {msg.node}", msg.rows,
                      f", error: {msg.error}" if msg.error else "")
            if msg.feed != "input":  # a named set's partition: held by its node once every row is in
                if node is not None and not msg.error and msg.rows > 0:
                    self.sets.held(msg.feed, msg.gen, msg.partition, node.index, msg.rows)
            elif node is not None:
                self._active[node.index] = max(0, self._active.get(node.index, 0) - 1)
                node.rows_fed += msg.rows
            if msg.error:
                to = f" (to {node.label} at {node.host})" if node is not None else ""
                self.feed_errors.append(f"partition {msg.partition}{to}: {msg.error}")
                if msg.error_kind is None:  # the feeding task's own (its node's trouble always comes with a kind)
                    self.data_errors.append(self.feed_errors[-1])
                if node is not None and msg.error_kind == messages.ERROR_LOST_CONNECTION:
                    self.lost_feeds += 1
            cluster_error = None
            if st.state == cluster_state.C_FAILED:
                cluster_error = st.error
        st.notify()
        return messages.Reply(ok=True, body=messages.FeedReleased(cluster_error).to_dict())
