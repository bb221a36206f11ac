"""The control plane's server side: the writer of a job's :class:`ClusterState` where its control server runs.

Its message handlers run on the control server's thread: they keep the state
current, form the cluster once every node registered, hand feeding tasks to
nodes through its feeding desk (:class:`~.feed_desk.FeedDesk`), and notice dead
nodes by their missing heartbeats (:meth:`Controller.tick`).  The job's owner (start, feeding,
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

from ...executor.feed.plan import AHEAD_S, out_of_step_message
from ...executor.process import phases
from ...gpus import assign as assign_gpus
from ...net import hostport
from ...protocol import messages
from ...tensorboard.news import tensorboard_news
from ..errors import peer_caused
from . import stalls, states
from . import state as cluster_state
from .feed_desk import FeedDesk
from .roles import FEEDABLE

if TYPE_CHECKING:
    from ..options import JobOptions

log = logging.getLogger(__name__)
# A node whose function raised because a peer stopped answering its collective (errors.peer_caused) fails the job
# this long after it said so, unless its cause is named first: a node stopped (SIGSTOP) is named by its supervisor
# STOPPED_S after it stopped, and its peer's collective may give up before that.
PEER_GRACE_S = 7.0
STEPPING = (phases.FIRST_STEP, phases.TRAINING)  # a node in a step: under a synchronous strategy, in its collectives


def new_cluster(roles: list[tuple[str, int]], tf_args: Any, options: JobOptions, *, input_mode_spark: bool,
                tensorboard: bool, log_dir: str | None) -> Controller:
    """A new cluster's state (id, name, job group) and its controller; ``options.num_gpus`` defaults to
    ``tf_args.num_gpus`` or 1; ``options.deterministic``: the fixed feed (:meth:`.feed_desk.FeedDesk._ordered_assign`)."""
    cluster_id = uuid.uuid4().hex[:12]
    state = cluster_state.ClusterState(cluster_id, options.name or f"tfos-{cluster_id}", roles)
    state.job_group, state.stall_after = f"tfos-{cluster_id}", options.stall_after
    if options.num_gpus is None:
        num_gpus = int(getattr(tf_args, "num_gpus", 1) if not isinstance(tf_args, dict) else tf_args.get("num_gpus", 1))
        options = options.replace(num_gpus=num_gpus)
    return Controller(state, options, input_mode_spark=input_mode_spark, tensorboard=tensorboard, log_dir=log_dir)


class Controller:
    def __init__(self, state: cluster_state.ClusterState, options: JobOptions, *, input_mode_spark: bool,
                 tensorboard: bool, log_dir: str | None) -> None:
        """``options``: the job's, its ``num_gpus`` resolved (GPUs per node), its ``heartbeat_timeout`` and its
        ``deterministic`` (the fixed feed); on Spark Connect the coordinator's, from its launch settings."""
        self.state = state
        self.clock = state.clock
        self.input_mode_spark = input_mode_spark
        self.tensorboard = tensorboard
        self.log_dir = log_dir
        self.num_gpus = 1 if options.num_gpus is None else options.num_gpus
        self.heartbeat_timeout = options.heartbeat_timeout
        self.address: tuple[str, int] | None = None  # where the nodes reach its control server (DriverJob.open_control)
        self._specs: dict[int, messages.NodeSpec] | None = None
        self.feed = FeedDesk(state, ordered=options.deterministic, fail=self._fail)  # which node reads what
        # node -> (epoch, rows, when heard): a read of the node waits past the running train()'s epochs (_ran_out)
        self._past: dict[int, tuple[int, int, float]] = {}
        self._peer_failed: dict[int, float] = {}  # node -> when it failed on a peer's account (PEER_GRACE_S)
        self._handlers: dict[type, Callable[[Any], messages.Reply]] = {
            messages.Heartbeat: self._heartbeat, messages.FeedAssign: self.feed.assign, messages.FeedRelease: self.feed.release,
            messages.FeedCheck: self.feed.check, messages.Register: self._register, messages.AwaitSpec: self._await_spec}

    # -- dispatch -------------------------------------------------------------
    def handle(self, msg: messages.Message) -> messages.Reply:
        handler = self._handlers.get(type(msg))
        return handler(msg) if handler else messages.Reply(ok=False, error=f"unexpected message {msg.TYPE}")

    @property
    def feed_errors(self) -> list[str]:
        return self.feed.feed_errors

    @property
    def data_errors(self) -> list[str]:
        return self.feed.data_errors

    @property
    def lost_feeds(self) -> int:
        return self.feed.lost_feeds

    # -- reservation ------------------------------------------------------------
    def _register(self, msg: messages.Register) -> messages.Reply:
        st = self.state
        with st.lock:
            node = self.state.node(msg.node)
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
            node = self.state.node(msg.node)
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
            node = self.state.node(msg.node)
            if node is None:
                return messages.Reply(ok=False, error=f"no node {msg.node}")
            node.last_heartbeat = self.clock()
            node.child_pid = msg.child_pid
            if msg.data_port is not None:
                node.data_port = msg.data_port
            if msg.feed.closed:
                node.feed_closed = True
            self.feed.heard(node, msg.feed)
            past = msg.feed.past
            if len(past) == 2 and self._past.get(node.index, (0,))[0] != past[0]:
                self._past[node.index] = (past[0], past[1], self.clock())
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
                                stacks=node.stacks_asked, feed_plan=list(st.feed_plan or ()),
                                **self.feed.told(node, msg.feed))
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
        return self.feed.open_set(name, passes)

    def end_set(self, name: str, version: int) -> None:
        """Every partition of the named set's ``version`` is on its node: nodes may read it."""
        self.feed.end_set(name, version)

    def set_rows(self, name: str) -> dict[int, int]:
        """Rows of the named set each node holds (by node index)."""
        return self.feed.set_rows(name)

    def unread_sets(self) -> dict[str, int]:
        """Named sets fed with rows that no node's function read (name -> rows)."""
        return self.feed.unread_sets()

    def end_epoch(self, epoch: int) -> None:
        """Every row of ``epoch`` was taken: nodes reading with as_dataset() see its end."""
        with self.state.lock:
            self.state.epoch_done = max(self.state.epoch_done, epoch)
            self.feed.shares.forget_through(self.state.epoch_done)
        self.state.notify()

    def count_epoch(self, epoch: int, rows: dict[int, int]) -> None:
        """Epoch ``epoch``'s partitions hold ``rows`` (partition -> rows; ``driver/feeding/counts.py``): feeding tasks
        carry their partition's count, and each node hears of its share's rows and the largest share's."""
        self.feed.count_epoch(epoch, rows)

    def set_feed_tasks(self, epoch: int, tasks: int) -> None:
        """The number of tasks of ``epoch``'s feeding stage (Spark's status tracker, once the stage runs)."""
        self.feed.set_feed_tasks(epoch, tasks)

    def feeding_started(self, epoch: int) -> bool:
        """Whether a feeding task of ``epoch`` has asked for a node: its job's feeding stage runs (not a stage before it)."""
        return self.feed.feeding_started(epoch)

    def reset_feed_errors(self) -> None:
        self.feed.reset_feed_errors()

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
        fed = [n for n in self.feed.fed_nodes() if n.state in (cluster_state.RUNNING, cluster_state.FINISHED)]
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
