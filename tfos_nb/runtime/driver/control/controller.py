"""The control plane's server side: the writer of a job's :class:`ClusterState` where its control server runs.

Its message handlers run on the control server's thread: they keep the state
current, form the cluster once every node registered, hand feeding tasks to
nodes (balanced, local first on ties), and notice dead nodes by their missing
heartbeats (:meth:`Controller.tick`).  The job's owner (start, feeding,
shutdown, streaming, parallel runs) never writes the state itself: it asks
the controller (:meth:`~Controller.set_running`, :meth:`~Controller.request_stop`,
:meth:`~Controller.request_kill`, :meth:`~Controller.cancel`,
:meth:`~Controller.open_epoch`, :meth:`~Controller.end_epoch`,
:meth:`~Controller.finish`).  Each such method takes the state's lock, so the
writes stay serialised with the control thread's; this is simpler than a
queue drained by the control thread.  It runs in the notebook's process on
classic Spark and in the coordinator on Spark Connect, where the notebook's
copy of the state is written by ``connect/snapshot.py``'s ``Mirror`` (see ``state.py``).
Time comes from ``state.clock`` (injectable: tests run in milliseconds).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...determinism import order
from ...executor.feed.plan import AHEAD_S, out_of_step_message
from ...executor.process import phases
from ...gpus import assign as assign_gpus
from ...net import hostport
from ...protocol import messages
from ...tensorboard.news import tensorboard_news
from ..errors import peer_caused
from ..feeding.set_records import FeedSets
from ..feeding.shares import EpochShares
from . import stalls, states
from . import state as cluster_state
from .roles import FEEDABLE

if TYPE_CHECKING:
    from ..options import JobOptions

log = logging.getLogger(__name__)
# A training partition's feeding task started again by Spark is refused this long after it first asks: a lost
# executor's node fails meanwhile (its supervisor sees the JVM gone within a heartbeat), and that error comes first.
REFED_GRACE_S = 2.0
# A node whose function raised because a peer stopped answering its collective (errors.peer_caused) fails the job
# this long after it said so, unless its cause is named first: a node stopped (SIGSTOP) is named by its supervisor
# STOPPED_S after it stopped, and its peer's collective may give up before that.
PEER_GRACE_S = 7.0
STEPPING = (phases.FIRST_STEP, phases.TRAINING)  # a node in a step: under a synchronous strategy, in its collectives


def new_cluster(roles: list[tuple[str, int]], tf_args: Any, options: JobOptions, *, input_mode_spark: bool,
                tensorboard: bool, log_dir: str | None) -> Controller:
    """A new cluster's state (id, name, job group) and its controller; ``options.num_gpus`` defaults to
    ``tf_args.num_gpus`` or 1; ``options.deterministic``: the fixed feed (:meth:`Controller._ordered_assign`)."""
    cluster_id = uuid.uuid4().hex[:12]
    state = cluster_state.ClusterState(cluster_id, options.name or f"tfos-{cluster_id}", roles)
    state.job_group, state.stall_after = f"tfos-{cluster_id}", options.stall_after
    if options.num_gpus is None:
        num_gpus = int(getattr(tf_args, "num_gpus", 1) if not isinstance(tf_args, dict) else tf_args.get("num_gpus", 1))
        options = options.replace(num_gpus=num_gpus)
    return Controller(state, options, input_mode_spark=input_mode_spark, tensorboard=tensorboard, log_dir=log_dir)


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


class Controller:
    def __init__(self, state: cluster_state.ClusterState, options: JobOptions, *, input_mode_spark: bool,
                 tensorboard: bool, log_dir: str | None) -> None:
        """``options``: the job's, its ``num_gpus`` resolved (GPUs per node), its ``heartbeat_timeout`` and its
        ``deterministic`` (the fixed feed); on Spark Connect the coordinator's, from its launch settings."""
        self.state = state
        self.ordered_feed = options.deterministic
        self.clock = state.clock
        self.input_mode_spark = input_mode_spark
        self.tensorboard = tensorboard
        self.log_dir = log_dir
        self.num_gpus = 1 if options.num_gpus is None else options.num_gpus
        self.heartbeat_timeout = options.heartbeat_timeout
        self.address: tuple[str, int] | None = None  # where the nodes reach its control server (DriverJob.open_control)
        self._specs: dict[int, messages.NodeSpec] | None = None
        self._active: dict[int, int] = {}  # node -> feeding tasks now
        self._assigned: dict[int, int] = {}  # node -> partitions handed out
        self._gens_feeding: set[int] = set()  # feeding generations (epochs) a partition has asked a node for
        self._shares = EpochShares()  # who got each epoch's partitions (nodes end their reads at their share)
        state.pending_from(lambda: self._shares.pending(state.epoch_done))
        self._sets = FeedSets()  # named sets: sets fed once (a validation set), kept by the nodes
        # (epoch, partition) cut short or asked for again -> (its node, rows that reached it if known, when heard of)
        self._cut: dict[tuple[int, int], tuple[int, int | None, float]] = {}
        # node -> (epoch, rows, when heard): a read of the node waits past the running train()'s epochs (_ran_out)
        self._past: dict[int, tuple[int, int, float]] = {}
        self._peer_failed: dict[int, float] = {}  # node -> when it failed on a peer's account (PEER_GRACE_S)
        self.feed_errors: list[str] = []
        # the feeding tasks' own causes (a partition's rows: changed since counted, a UDF upstream raised), which a
        # node's failure that follows them (its feed ended) must not hide
        self.data_errors: list[str] = []
        self.lost_feeds = 0  # feeding tasks whose connection to a node broke (the node may be dying)
        self._handlers: dict[type, Callable[[Any], messages.Reply]] = {
            messages.Heartbeat: self._heartbeat, messages.FeedAssign: self._feed_assign, messages.FeedRelease: self._feed_release,
            messages.FeedCheck: self._feed_check, messages.Register: self._register, messages.AwaitSpec: self._await_spec}

    # -- dispatch -------------------------------------------------------------
    def handle(self, msg: messages.Message) -> messages.Reply:
        handler = self._handlers.get(type(msg))
        return handler(msg) if handler else messages.Reply(ok=False, error=f"unexpected message {msg.TYPE}")

    def _node(self, index: int) -> cluster_state.NodeRecord | None:
        if 0 <= index < len(self.state.nodes):
            return self.state.nodes[index]
        return None

    # -- reservation ------------------------------------------------------------
    def _register(self, msg: messages.Register) -> messages.Reply:
        st = self.state
        with st.lock:
            node = self._node(msg.node)
            if node is None:
                return messages.Reply(ok=False, error=f"no node {msg.node} in this cluster")
            if st.state != cluster_state.C_RESERVING:
                return messages.Reply(ok=False, error=f"cluster is {st.state}; not taking registrations")
            if node.state != cluster_state.PENDING:
                return messages.Reply(ok=False, error=f"{node.label} registered twice (Spark retried the launch; executor lost?)")
            states.transition(node, cluster_state.REGISTERED, why="its supervisor registered")
            node.host, node.port, node.pid = msg.host, msg.port, msg.pid
            node.executor_id = msg.executor_id
            node.working_dir = msg.working_dir
            node.gpus = list(msg.gpus)
            node.spark_gpus = list(msg.spark_gpus)
            node.grant = cluster_state.Grant(msg.task_cpus, tuple((k, tuple(v)) for k, v in sorted(msg.resources.items())),
                               msg.profile_id)
            node.last_heartbeat = node.moved_at = self.clock()
            log.info("%s registered: host %s, executor %s, supervisor pid %d", node.label, node.host,
                     node.executor_id or "?", node.pid)
            if all(n.state == cluster_state.REGISTERED for n in st.nodes):
                self._form_cluster()
        st.notify()
        return messages.Reply(ok=True)

    def _form_cluster(self) -> None:
        """Every node registered: build the one cluster spec they all get."""
        st = self.state
        spec: dict[str, list[str]] = {}
        for n in st.nodes:
            spec.setdefault(n.job_name, []).append(hostport(n.host, n.port))
        tf_cluster = {k: v for k, v in spec.items() if k != "evaluator"}
        by_host: dict[str, list[cluster_state.NodeRecord]] = {}
        for n in st.nodes:
            if n.job_name != "ps":
                by_host.setdefault(n.host, []).append(n)
        self._specs = {}
        for n in st.nodes:
            spark_gpus = n.spark_gpus
            if spark_gpus:
                known = {g["index"]: g for g in n.gpus}
                gpus = [known.get(a, {"index": a, "name": "GPU"}) for a in spark_gpus]
            elif n.job_name == "ps" or n.grant.profile_id is not None:  # a profile's node: Spark's GPUs or none
                gpus = []
            else:
                peers = by_host[n.host]
                gpus = assign_gpus(n.gpus, peers.index(n), len(peers), self.num_gpus)
            host_has_gpus = bool(n.gpus)
            n.gpus = gpus
            chief = n.job_name in ("chief", "master") or (
                "chief" not in spec and "master" not in spec and n.job_name == "worker" and n.task_index == 0
            )
            log_dir = self.log_dir or f"{n.working_dir}/tensorboard_{n.index}"
            # An evaluator is not part of the training cluster TensorFlow sees (its task says so).
            task = {"type": "evaluator", "index": 0} if n.job_name == "evaluator" else \
                {"type": n.job_name, "index": n.task_index}
            self._specs[n.index] = messages.NodeSpec(
                cluster_spec=spec,
                tf_config={"cluster": tf_cluster, "task": task},
                gpus=gpus,
                host_has_gpus=host_has_gpus,
                feed=self.input_mode_spark and n.job_name in FEEDABLE,
                tensorboard=self.tensorboard and chief,
                log_dir=log_dir,
            )
            states.transition(n, cluster_state.STARTING, why="every node registered: the cluster formed")
            n.moved_at = self.clock()

    def _await_spec(self, msg: messages.AwaitSpec) -> messages.Reply:
        st = self.state
        with st.lock:
            if st.state in (cluster_state.C_FAILED, cluster_state.C_STOPPED):
                return messages.Reply(ok=False, error=f"cluster {st.state}: {st.error or 'stopped'}")
            node = self._node(msg.node)
            if node is not None:
                # asking is a sign of life: slower nodes may take longer than the heartbeat timeout to register
                node.last_heartbeat = self.clock()
            if self._specs is None:
                return messages.Reply(ok=False, body=messages.Retry(0.1).to_dict())
            spec = self._specs.get(msg.node)
            if spec is None:
                return messages.Reply(ok=False, error=f"no node {msg.node}")
            return messages.Reply(ok=True, body=spec.to_dict())

    # -- liveness and progress ---------------------------------------------------
    def _heartbeat(self, msg: messages.Heartbeat) -> messages.Reply:
        st = self.state
        new_logs: list[str] = []
        with st.lock:
            node = self._node(msg.node)
            if node is None:
                return messages.Reply(ok=False, error=f"no node {msg.node}")
            node.last_heartbeat = self.clock()
            node.child_pid = msg.child_pid
            if msg.data_port is not None:
                node.data_port = msg.data_port
            if msg.feed.closed:
                node.feed_closed = True
            self._feeds_dropped(node, msg.feed.dropped)
            past = msg.feed.past
            if len(past) == 2 and self._past.get(node.index, (0,))[0] != past[0]:
                self._past[node.index] = (past[0], past[1], self.clock())
            self._sets.read_by(node.index, msg.feed.sets_read)
            stalls.apply_news(node, msg.phase, msg.stacks, self.clock())
            spec = (self._specs or {}).get(node.index)
            tb_lines = tensorboard_news(node, spec is not None and spec.tensorboard, msg)
            node.logs.extend(tb_lines)
            new_logs.extend(tb_lines)
            st.update_progress(node, msg.report)
            if msg.report.gpus:
                node.gpus = msg.report.gpus
            if msg.reports:
                st.record_reports(node, msg.reports)
            elif msg.report.time is not None and msg.report.time != node.last_report_time:
                st.record_reports(node, [msg.report])  # a peer that sends only its latest report (parallel runs)
            st.record_tick(node, msg.phase.times)  # after the reports: the node's clocks a second apart
            if "value" in msg.returned:
                node.value = msg.returned["value"]
            if msg.logs:
                node.logs.extend(msg.logs)
                new_logs = list(msg.logs)
            if msg.logs_dropped:
                node.logs.append(f"[tfos_nb: {msg.logs_dropped} output line(s) dropped]")
            if node.state not in cluster_state.TERMINAL:
                if msg.state in ("running", "starting"):
                    states.transition(node, states.Node(msg.state), why="its heartbeat")
                elif msg.state in cluster_state.TERMINAL:
                    states.transition(node, states.Node(msg.state), why="its heartbeat")
                    node.exit_code = msg.exit_code
                    if msg.state == cluster_state.FAILED:
                        node.error, node.failed_at = msg.error or "failed", self.clock()
                        node.tail = list(msg.tail)
                        if peer_caused(node.error):  # its cause may be named in a moment (tick)
                            self._peer_failed[node.index] = node.failed_at
                        else:
                            self._fail(f"{node.label} failed")
            cmd = messages.BeatCommand(epoch_done=st.epoch_done, stop=st.stop_requested,
                                kill=st.kill_requested or st.state == cluster_state.C_FAILED, grace=2.0,
                                epochs_assigned=self._shares.for_node(node.index), stacks=node.stacks_asked,
                                feed_plan=list(st.feed_plan or ()), feed_sample=self._sample_for(node, msg),
                                feed_sets=self._sets.for_node(node.index))
            if st.state == cluster_state.C_RESERVING and all(n.state == cluster_state.RUNNING for n in st.nodes):
                states.transition(st, cluster_state.C_RUNNING, why="every node runs")
        if new_logs:
            st.emit_logs(node.label, new_logs)
        st.notify()
        return messages.Reply(ok=True, body=cmd.to_dict())

    # -- transitions the job's owner asks for (any thread) -------------------------
    stacks_available = True
    pipelines_epochs = True

    def request_stacks(self, indices: list[int]) -> dict[int, int]:
        """Ask these nodes for their threads' stacks (answered by their next heartbeats); the id each answers."""
        with self.state.lock:
            return {i: stalls.ask_stacks(self.state.nodes[i]) for i in indices}

    def set_running(self) -> None:
        """Every node runs its function: the start is over."""
        self._set_cluster_state(cluster_state.C_RUNNING, "the start is over")

    def request_stop(self) -> None:
        """Nodes are told (next heartbeat) to stop when their function allows: end of feeding."""
        with self.state.lock:
            self.state.stop_requested = True
        self.state.notify()

    def request_kill(self) -> None:
        """Nodes are told (next heartbeat) to stop now: teardown."""
        with self.state.lock:
            self.state.stop_requested = True
            self.state.kill_requested = True
        self.state.notify()

    def cancel(self, reason: str) -> None:
        """The job's owner stops it (a shutdown, ■, a timeout, an interrupt): it ends STOPPED with the error
        ``stopped (reason)`` unless it ended; nodes are killed at their next beat (idempotent)."""
        self._end(cluster_state.C_STOPPED, f"stopped ({reason})")

    def fail(self, error: str) -> None:
        """The job failed from outside its nodes (its notebook or coordinator lost): it ends FAILED with ``error``
        unless it ended; nodes are killed at their next beat (idempotent)."""
        self._end(cluster_state.C_FAILED, error)

    def _end(self, state: states.Cluster, error: str) -> None:
        with self.state.lock:
            self._mark_ended(state, error)
        self.state.notify()

    def open_epoch(self, remaining: int | None = None) -> int:
        """A new feeding epoch; returns its number.  ``remaining``: how many more epochs the ``train()`` call that
        opens it will open (nodes learn the call's epochs: a read past them is out of step); None: a stream's."""
        with self.state.lock:
            st = self.state
            st.feed_epoch += 1
            epoch = st.feed_epoch
            if remaining is None:
                st.feed_plan = None
            else:
                last = epoch + max(0, int(remaining))
                first = st.feed_plan[0] if st.feed_plan is not None and st.feed_plan[1] == last else epoch
                if first == epoch:  # a new call: its data's shape is learnt again
                    st.feed_sample, st.feed_sample_id = {}, st.feed_sample_id + 1
                st.feed_plan = (first, last)
        self.state.notify()
        return epoch

    def open_set(self, name: str, passes: int = 1) -> int:
        """A named set (a set fed once, see :mod:`tfos_nb.runtime.driver.feeding.set_records`) is about to be fed; returns its version."""
        with self.state.lock:
            version = self._sets.open(name, passes)
        self.state.notify()
        return version

    def end_set(self, name: str, version: int) -> None:
        """Every partition of the named set's ``version`` is on its node: nodes may read it."""
        with self.state.lock:
            self._sets.end(name, version)
        self.state.notify()

    def set_rows(self, name: str) -> dict[int, int]:
        """Rows of the named set each node holds (by node index)."""
        with self.state.lock:
            return self._sets.rows(name)

    def unread_sets(self) -> dict[str, int]:
        """Named sets fed with rows that no node's function read (name -> rows)."""
        with self.state.lock:
            return self._sets.unread()

    def end_epoch(self, epoch: int) -> None:
        """Every row of ``epoch`` was taken: nodes reading with as_dataset() see its end."""
        with self.state.lock:
            self.state.epoch_done = max(self.state.epoch_done, epoch)
            self._shares.forget_through(self.state.epoch_done)
        self.state.notify()

    def count_epoch(self, epoch: int, rows: dict[int, int]) -> None:
        """Epoch ``epoch``'s partitions hold ``rows`` (partition -> rows; ``driver/feeding/counts.py``): feeding tasks
        carry their partition's count, and each node hears of its share's rows and the largest share's."""
        with self.state.lock:
            nodes = [n.index for n in self.state.nodes if n.job_name in FEEDABLE]
            self._shares.count(epoch, rows, nodes)
        self.state.notify()

    def set_feed_tasks(self, epoch: int, tasks: int) -> None:
        """The number of tasks of ``epoch``'s feeding stage (Spark's status tracker, once the stage runs)."""
        with self.state.lock:
            if epoch > self.state.epoch_done:
                self._shares.set_tasks(epoch, tasks)

    def feeding_started(self, epoch: int) -> bool:
        """Whether a feeding task of ``epoch`` has asked for a node: its job's feeding stage runs (not a stage before it)."""
        with self.state.lock:
            return epoch in self._gens_feeding

    def reset_feed_errors(self) -> None:
        with self.state.lock:
            self.feed_errors.clear()
            self.data_errors.clear()
            self.lost_feeds = 0

    def finish(self, finished: Callable[[list[cluster_state.NodeRecord]], bool]) -> str:
        """Teardown is over: nodes still live are STOPPED; the job ends FINISHED when ``finished(nodes)``, else STOPPED.

        A failed job stays failed.  Returns the final state.
        """
        with self.state.lock:
            for n in self.state.nodes:
                if n.state not in cluster_state.TERMINAL:
                    states.transition(n, cluster_state.STOPPED, why="still live when the teardown was over")
            final = cluster_state.C_FINISHED if finished(self.state.nodes) else cluster_state.C_STOPPED
        self._set_cluster_state(final, "the teardown is over")
        return self.state.state

    def _set_cluster_state(self, state: states.Cluster, why: str, error: str | None = None) -> None:
        st = self.state
        with st.lock:
            if st.ended:
                return
            states.transition(st, state, why=why)
            if error and not st.error:
                st.error = error
            if st.ended:
                st.ended_at = self.clock()
        st.notify()

    def _fail(self, error: str) -> None:
        """Mark the cluster failed (lock held); every node is told to stop at its next beat."""
        self._mark_ended(cluster_state.C_FAILED, error)

    def _mark_ended(self, state: states.Cluster, error: str) -> None:
        """End the cluster ``state`` with ``error`` unless it ended (lock held); nodes are killed at their next beat."""
        st = self.state
        if not st.ended:
            log.info("cluster %s %s: %s", st.name, state, error)
            states.transition(st, state, why=error)
            st.error = st.error or error
            st.kill_requested = True
            st.ended_at = self.clock()

    def tick(self) -> None:
        """Called about once a second: find nodes whose heartbeats stopped."""
        st = self.state
        now = self.clock()
        changed = False
        with st.lock:
            beating = [n for n in st.nodes if n.state not in cluster_state.TERMINAL and n.state != cluster_state.PENDING
                       and n.last_heartbeat is not None]
            silent = [n for n in beating if now - n.last_heartbeat > self.heartbeat_timeout]  # type: ignore[operator]
            # every node silent at once, on more than one executor: the path to this process, not each executor
            cut = len(silent) > 1 and len(silent) == len(beating) and len({n.executor_id for n in silent}) > 1
            for n in silent:
                assert n.last_heartbeat is not None
                states.transition(n, cluster_state.FAILED, why="no heartbeat")
                n.failed_at = now
                if cut:
                    where = f"{self.address[0]}:{self.address[1]}" if self.address else "this process"
                    n.error = (f"no heartbeat from any of the {len(silent)} nodes for {self.heartbeat_timeout:.0f} s: "
                               f"their executors cannot reach the driver's control server at {where} (a firewall "
                               "or a network change between them and this machine), or every executor was lost")
                else:
                    n.error = (
                        f"no heartbeat for {now - n.last_heartbeat:.0f} s: the node's supervisor or its "
                        f"executor ({n.executor_id or '?'} on {n.host}) died"
                    )
                n.tail = list(n.logs)[-20:]
                self._fail(f"{n.label} lost")
                changed = True
            changed = self._ran_out(now) or changed
            for index, at in list(self._peer_failed.items()):
                if now - at >= PEER_GRACE_S or st.ended:
                    del self._peer_failed[index]
                    self._fail(f"{st.nodes[index].label} failed")
                    changed = True
        if changed:
            st.notify()
        st.tell_held()

    def _ran_out(self, now: float) -> bool:
        """Fail the node whose input ran out before its peers' (lock held; whether it did).

        The running ``train()``'s epochs are all taken from the nodes' feeds, but not all stepped: a node's read
        has waited :data:`~tfos_nb.runtime.executor.feed.plan.AHEAD_S` past them (it read all its rows and asked for more: a
        dataset that repeats, ``steps_per_epoch`` above its rows) while every other node is in a step and has not
        moved for as long — under a synchronous strategy, waiting for it in a collective, for ever (the stop that
        ends its read only moves it to other collectives).  While the last epoch is still read somewhere, the
        node's own feed names it (``FeedHub._ahead``)."""
        st, plan = self.state, self.state.feed_plan
        if plan is None or st.ended or st.epoch_done < plan[1]:
            return False
        fed = [n for n in self._fed_nodes() if n.state in (cluster_state.RUNNING, cluster_state.FINISHED)]
        past = [n for n in fed if self._past.get(n.index, (0,))[0] > plan[1]]
        behind = [n for n in fed if n not in past and n.state == cluster_state.RUNNING]
        if not past or not behind:
            return False
        first = min(past, key=lambda n: self._past[n.index][2])
        epoch, rows, heard = self._past[first.index]
        if now - heard < AHEAD_S or not all(n.phase in STEPPING and n.moved_at is not None
                                            and now - n.moved_at >= AHEAD_S for n in behind):
            return False
        names = ", ".join(n.label for n in behind)
        one = len(behind) == 1
        peers = (f"{names} took {'its' if one else 'their'} rows of epoch {plan[1]} but {'is' if one else 'are'} "
                 f"still in a step, waiting for {first.label} to step with {'it' if one else 'them'}")
        states.transition(first, cluster_state.FAILED, why="its input ran out before its peers'")
        first.failed_at = now
        first.error = "FeedOutOfStep: " + out_of_step_message(first.label, epoch, *plan, rows=rows, peers=peers)
        first.tail = list(first.logs)[-20:]
        self._fail(f"{first.label} failed")
        return True

    # -- feeding ------------------------------------------------------------------
    def _sample_for(self, node: cluster_state.NodeRecord, msg: messages.Heartbeat) -> dict[str, Any]:
        """The running train()'s data shape for a node that has not confirmed it (a node given no row builds its
        dataset from it); lock held."""
        st = self.state
        node.sample_seen = max(node.sample_seen, msg.feed.sample)
        if st.feed_plan is None or not st.feed_sample or node.sample_seen >= st.feed_sample_id:
            return {}
        return {**st.feed_sample, "id": st.feed_sample_id}

    def _batch_epoch(self, gen: int) -> bool:
        """Whether ``gen`` is an open epoch of the running ``train()`` call (lock held).  A stream's micro-batches
        are not: Spark's ``foreachBatch`` is at-least-once by its own contract (a failed batch is replayed)."""
        plan = self.state.feed_plan
        return gen > self.state.epoch_done and plan is not None and plan[0] <= gen <= plan[1]

    def _feeds_dropped(self, node: cluster_state.NodeRecord, dropped: list[list[int]]) -> None:
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
                self._fail(refed_partition(partition, self._node(index), rows))
                return

    def _feed_assign(self, msg: messages.FeedAssign) -> messages.Reply:
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
                earlier = self._shares.fed_to(msg.gen, msg.partition)
                if earlier is not None:  # Spark retried a feeding task that died after it began to feed
                    self._cut.setdefault((msg.gen, msg.partition), (earlier, None, self.clock()))
                    self._fail_cut()
                    if st.state == cluster_state.C_FAILED:
                        return messages.Reply(ok=False, error=st.error)
                    return messages.Reply(ok=False, body=messages.Retry(0.2).to_dict())
            self._gens_feeding.add(msg.gen)
            if self.ordered_feed and msg.mode == "train":
                return self._ordered_assign(msg)
            feedable = self._fed_nodes()
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
        self._shares.handed_out(msg.gen, msg.partition, None)
        return messages.Reply(ok=True, body=messages.FeedAssignment(skip=True).to_dict())

    def _hand_to(self, msg: messages.FeedAssign, node: cluster_state.NodeRecord, after: int = -1) -> messages.Reply:
        """``msg``'s partition goes to ``node`` (``after``: deterministic mode's partition before it); lock held."""
        st = self.state
        self._active[node.index] = self._active.get(node.index, 0) + 1
        self._assigned[node.index] = self._assigned.get(node.index, 0) + 1
        rows = -1
        if msg.mode == "train" and msg.gen > st.epoch_done:
            self._shares.handed_out(msg.gen, msg.partition, node.index)
            rows = self._shares.expected(msg.gen, msg.partition)
        st.feeding[(msg.feed, msg.gen, msg.partition)] = (node.index, msg.executor_id, self.clock())
        log.debug("%s partition %d of epoch %d (executor %s) goes to %s%s", msg.mode, msg.partition, msg.gen,
                  msg.executor_id or "?", node.label, f", after partition {after}" if after >= 0 else "")
        return self._assigned_to(node, after, rows)

    def _fed_nodes(self) -> list[cluster_state.NodeRecord]:
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
            fed = self._fed_nodes()
            live = [n for n in fed if n.state == cluster_state.RUNNING]
            if not live:
                if fed and all(n.state in cluster_state.TERMINAL for n in fed):
                    return messages.Reply(ok=False, error=f"no node runs to take the feed {msg.feed!r} (all ended)")
                return messages.Reply(ok=False, body=messages.Retry(0.1).to_dict())
            node = self._sets.assign(msg.feed, msg.gen, msg.partition, msg.sample, live, msg.executor_id)
            if isinstance(node, str):
                return messages.Reply(ok=False, error=node)
            st.feeding[(msg.feed, msg.gen, msg.partition)] = (node.index, msg.executor_id, self.clock())
            return self._assigned_to(node)

    def _feed_check(self, msg: messages.FeedCheck) -> messages.Reply:
        """What became of a node a feeding task lost its connection to (see :class:`messages.FeedCheck`)."""
        st = self.state
        with st.lock:
            node = self._node(msg.node)
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

    def _feed_release(self, msg: messages.FeedRelease) -> messages.Reply:
        st = self.state
        with st.lock:
            node = self._node(msg.node)
            st.feeding.pop((msg.feed, msg.gen, msg.partition), None)
            log.debug("partition %d of %s %d done at %s: %d rows%s", msg.partition,
                      "epoch" if msg.feed == "input" else f"set {msg.feed!r} version", msg.gen,
                      node.label if node is not None else f"node {msg.node}", msg.rows,
                      f", error: {msg.error}" if msg.error else "")
            if msg.feed != "input":  # a named set's partition: held by its node once every row is in
                if node is not None and not msg.error and msg.rows > 0:
                    self._sets.held(msg.feed, msg.gen, msg.partition, node.index, msg.rows)
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
