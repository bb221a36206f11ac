"""A node's supervisor: registers with the driver, owns the TensorFlow process.

One supervisor per node, started by the Spark launch task (which then returns,
freeing the executor's slot for feeding tasks).  It

* registers the node (host, port, executor, pid, GPUs) and waits for the
  cluster spec;
* starts the node process (``node.py``) with ``TF_CONFIG`` and its GPUs, and
  TensorBoard on the chief when asked (``tensorboard.py``: its URL is reported
  once it is verified to be TensorBoard's own);
* heartbeats to the driver twice a second, carrying progress reports and new
  output lines, and relays the driver's commands (end of epoch, stop, kill);
* is bound to the lives of the driver (no answer for ``driver_timeout`` s) and of
  its executor JVM: when either dies, it kills its process group and exits;
* removes the node's private temporary folder (its ``TMPDIR``: named sets,
  deterministic mode's early partitions) once the node process ended, however it
  ended.
  Nothing of a node survives its owners.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from ... import gpus, net, procs
from ...protocol import messages, pipes
from ...protocol.channel import ControlClient
from ...tensorboard.chief import ChiefTensorBoard
from ..tracking import node as mlflow_node
from .owner import REPORT_BYTES_PER_BEAT, ChildOwner, tf_env


def keras_distribution_env(cluster_spec: Mapping[str, list[str]], job_name: str, task_index: int) -> dict[str, str]:
    """What ``keras.distribution.initialize()`` reads on a training node (Keras 3's JAX backend): every
    trainer's address, the chief's first (the coordinator), their number, and this node's process id.  Empty
    on a ps or evaluator node, which take no part in Keras' multi-process training."""
    leaders = [*cluster_spec.get("chief", []), *cluster_spec.get("master", [])]
    trainers = [*leaders, *cluster_spec.get("worker", [])]
    if job_name not in ("chief", "master", "worker"):
        return {}
    process_id = task_index + (len(leaders) if job_name == "worker" else 0)
    return {"KERAS_DISTRIBUTION_JOB_ADDRESSES": ",".join(trainers),
            "KERAS_DISTRIBUTION_NUM_PROCESSES": str(len(trainers)),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(process_id)}


class Supervisor(ChildOwner):
    """Owns a node's TensorFlow process: registers it, starts it with the cluster spec, relays commands."""

    process_name = "the node process"
    keep_history = True
    echo_output = True  # the supervisor's stderr is the node's log file

    def __init__(self, launch_meta: Mapping[str, Any] | messages.LaunchMeta, blob: bytes) -> None:
        meta = messages.LaunchMeta.parse(launch_meta)
        if meta.node is None:
            raise messages.ProtocolError("LaunchMeta: a supervisor's meta names its node")
        index = meta.node
        # run(env=...) applies to the whole node, GPU discovery (PATH to nvidia-smi) included; the tracking
        # URI (it may carry credentials) only on the chief, the one node that logs to MLflow
        meta = dataclasses.replace(meta, env=mlflow_node.node_env(meta.env, meta.roles, index))
        os.environ.update({k: str(v) for k, v in meta.env.items()})
        control = meta.address
        client = ControlClient(messages.Codec(bytes.fromhex(meta.secret), meta.cluster_id, f"node{index}"), control, timeout=10)
        job_name, task_index = str(meta.roles[index][0]), int(meta.roles[index][1])
        super().__init__(
            client, index, f"{job_name}:{task_index}",
            hb_interval=meta.hb_interval,
            driver_timeout=meta.driver_timeout,
            executor_id=meta.executor_id,
            jvm_pid=procs.executor_jvm_pid() if meta.watch_jvm else None,
        )
        self.meta = meta
        self.blob = blob
        self.job_name, self.task_index = job_name, task_index
        self.host = net.local_ip_towards(*control)
        self.port = net.free_port(self.host)
        # Held until the node's function runs (TensorFlowOnSpark's ctx.tmp_socket / release_port).
        self.port_socket = net.reserve_port(self.port)
        self.tensorboard: ChiefTensorBoard | None = None
        self.gpus: list[dict[str, Any]] = []
        self._sent_epoch = 0
        self._sent_assigned: set[int] = set()  # the epochs whose share was relayed (see on_reply)
        self._sent_plan = (0, 0)
        self.sample_seen = 0  # the feed sample relayed to the node (confirmed to the driver with each heartbeat)
        self._sent_stop = False
        self._sent_sets: dict[str, Any] = {}  # the named sets last relayed to the node
        self._stacks_done = 0  # the last stack dump the driver asked for (BeatCommand.stacks) and got
        self._stacks_out = messages.BeatStacks()  # sent with the heartbeats until one is answered
        self._stacks_in_beat = 0  # the dump the last heartbeat carried

    # -- registration ---------------------------------------------------------
    def register(self) -> None:
        available = gpus.query()
        reply = self.client.request(
            messages.Register(
                node=self.index,
                host=self.host,
                port=self.port,
                executor_id=self.meta.executor_id,
                pid=os.getpid(),
                gpus=available,
                spark_gpus=list(self.meta.spark_gpus),
                working_dir=self.meta.working_dir or os.getcwd(),
                attempt=self.meta.attempt,
                resources=dict(self.meta.spark_resources),
                task_cpus=self.meta.task_cpus,
                profile_id=self.meta.profile_id,
            )
        )
        if not reply.ok:
            raise RuntimeError(reply.error or "registration refused")

    def await_spec(self) -> messages.NodeSpec:
        deadline = time.monotonic() + self.meta.reservation_timeout
        while time.monotonic() < deadline:
            reply = self.client.request(messages.AwaitSpec(node=self.index))
            if reply.ok:
                return messages.NodeSpec.from_dict(reply.body)
            if reply.error:
                raise RuntimeError(reply.error)
            self.wake.wait(messages.Retry.from_dict(reply.body).retry)
        raise TimeoutError("timed out waiting for the cluster spec")

    # -- the node process -------------------------------------------------------
    def start_child(self, spec: messages.NodeSpec) -> None:
        self.gpus = spec.gpus
        # a node of a resource profile sees only what Spark gave its task (no GPU: none at all)
        pin = bool(self.meta.spark_gpus or self.gpus or spec.host_has_gpus or self.meta.profile_id is not None)
        env = tf_env(dict(os.environ), self.meta, self.gpus, pin)
        env["TF_CONFIG"] = json.dumps(spec.tf_config)
        for key, value in keras_distribution_env(spec.cluster_spec, self.job_name, self.task_index).items():
            env.setdefault(key, value)  # the cell's env may set its own
        info: dict[str, Any] = {
            "node": self.index,
            "job_name": self.job_name,
            "task_index": self.task_index,
            "cluster_spec": spec.cluster_spec,
            "executor_id": self.meta.executor_id,
            "default_fs": self.meta.default_fs,
            "working_dir": self.meta.working_dir or os.getcwd(),
            "log_dir": spec.log_dir,
            "gpus": self.gpus,
            "resources": dict(self.meta.spark_resources),
            "feed": spec.feed,
            "secret": self.meta.secret,
            "host": self.host,
            "cluster_id": self.meta.cluster_id,
            "release_port": self.meta.release_port,
        }
        fds: tuple[int, ...] = ()
        if self.port_socket is not None:
            port_fd = self.port_socket.fileno()
            info["port_fd"] = port_fd
            fds = (port_fd,)
        self.start("node", self.meta.cluster_id, env, self.blob, info, pass_fds=fds,
                   cwd=self.meta.working_dir or None)
        if self.port_socket is not None:  # the node process holds the reservation now
            self.port_socket.close()
            self.port_socket = None

    def start_tensorboard(self, logdir: str) -> None:
        self.tensorboard = ChiefTensorBoard(self.host, logdir)
        self.tensorboard.start()

    # -- heartbeats -----------------------------------------------------------
    def beat_fields(self, final: bool) -> messages.BeatFields:
        if not final:
            self.read_frozen_phase()
        with self.lock:
            report = messages.BeatReport.from_dict(self.report)
            reports, size = [], 0
            while self.reports and size < REPORT_BYTES_PER_BEAT:
                reports.append(self.reports.popleft())
                size += len(json.dumps(reports[-1]))
            # A node whose function failed is not "done reading": feeders that lost it wait for its failure.
            feed = messages.BeatFeed(closed=self.feed_closed and self.error is None, sample=self.sample_seen,
                                     dropped=list(self.feed_dropped), past=list(self.feed_past),
                                     sets_read=list(self.sets_read))
            value = self.value
            last, seen, self.phases_seen = dict(self.phase), self.phases_seen, []
        phase = messages.BeatPhase()
        if last:  # an age, not the node's clock: the driver's clock may differ
            phase = messages.BeatPhase(phase=last["phase"], still_s=max(0.0, time.time() - last["moved_at"]), seen=seen,
                                       where=last.get("where", ""), times=last.get("times") or {})
        if self.gpus and self.gpus[0].get("index") is not None and not final:
            report = dataclasses.replace(report, gpus=self._gpu_usage())
        tb = self.tensorboard
        return {"data_port": self.data_port, "tensorboard": tb.url if tb else None,
                "tensorboard_error": tb.error if tb else None, "report": report,
                "reports": [messages.BeatReport.from_dict(r) for r in reports],
                "returned": {"value": value} if final and value is not None else {}, "feed": feed,
                "phase": phase, "stacks": self._stacks_beat()}

    def _stacks_beat(self) -> messages.BeatStacks:
        out = self._stacks_out
        self._stacks_in_beat = out.id
        return out

    _gpu_checked = 0.0

    def _gpu_usage(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        if now - self._gpu_checked > 5:
            self._gpu_checked = now
            fresh = gpus.query([str(g["index"]) for g in self.gpus])
            if fresh:
                self.gpus = fresh
        return self.gpus

    def on_reply(self, cmd: messages.BeatCommand) -> None:
        """Relay the driver's commands to the node process: the end of an epoch, stop; take a stack dump asked for."""
        if self._stacks_in_beat and self._stacks_out.id == self._stacks_in_beat:
            self._stacks_out = messages.BeatStacks()  # the driver has it
        if cmd.feed_sets != self._sent_sets:  # before the plan: a read of a set the call feeds is not refused
            self._sent_sets = dict(cmd.feed_sets)
            self.send(pipes.FeedSets(feeds=self._sent_sets))
        # the call's plan first: a node learns the shape of its data before its share of the call's first epoch
        first, last = (int(e) for e in cmd.feed_plan[:2]) if len(cmd.feed_plan) >= 2 else (0, 0)
        sample_id = int(cmd.feed_sample.get("id", 0)) if cmd.feed_sample else 0
        if (first, last) != self._sent_plan or sample_id > self.sample_seen:
            self._sent_plan = (first, last)
            self.sample_seen = max(self.sample_seen, sample_id)
            self.send(pipes.FeedPlan(first=first, last=last, sample=dict(cmd.feed_sample)))
        # Each epoch's share once, in whatever order the epochs' partitions all went out: with two epochs in flight
        # the next one's can be complete first (this one's last feeding task waited for a slot), and a node that
        # never hears of this epoch's share waits for it while its peers wait for it in a collective.  The answer
        # lists the epochs the driver keeps (those in flight, the last ended): what it no longer lists is forgotten.
        listed = {int(share[0]) for share in cmd.epochs_assigned}
        for share in cmd.epochs_assigned:
            epoch, partitions = int(share[0]), int(share[1])
            if epoch not in self._sent_assigned:
                rows, most = (int(share[2]), int(share[3])) if len(share) >= 4 else (-1, -1)
                self.send(pipes.EpochAssigned(epoch=epoch, partitions=partitions, rows=rows, most=most))
        self._sent_assigned = listed
        if cmd.epoch_done > self._sent_epoch:
            self._sent_epoch = cmd.epoch_done
            self.send(pipes.EpochDone(epoch=cmd.epoch_done))
        if cmd.stop and not self._sent_stop:
            self._sent_stop = True
            self.send(pipes.Stop())
        if cmd.stacks > self._stacks_done:  # %tfos_stack / cluster.stacks(): answered with the next heartbeat
            self._stacks_done = cmd.stacks
            self._stacks_out = messages.BeatStacks(id=cmd.stacks, text=self.dump_stacks())

    def run(self) -> int:
        spec = self.await_spec()
        if spec.tensorboard:
            self.start_tensorboard(spec.log_dir)
        try:
            self.start_child(spec)
            outcome, code = self.supervise()
        finally:
            self.kill(grace=1)
            if self.tensorboard is not None:
                self.tensorboard.stop()
        if outcome == "lost":
            return 2  # the driver is gone; nobody to report to
        self.join_readers()
        self.final_heartbeat(outcome, code)
        return 0


def main() -> int:
    stdin = sys.stdin.buffer
    launch = pipes.read(stdin, pipes.Launch)
    assert isinstance(launch, pipes.Launch)
    blob = pipes.read_blob(stdin)
    out = sys.stdout.buffer
    try:
        sup = Supervisor(launch.meta, blob)
        sup.register()
    except Exception as exc:  # noqa: BLE001 - reported to the launch task
        pipes.write(out, pipes.Launched(ok=False, error=f"{type(exc).__name__}: {exc}"))
        out.flush()
        return 1
    pipes.write(out, pipes.Launched(ok=True, pid=os.getpid(), host=sup.host, port=sup.port))
    out.flush()
    # The launch task stops listening now; keep nothing pointing at its pipe.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    try:
        return sup.run()
    except Exception as exc:  # noqa: BLE001 - tell the driver, then end
        sys.stderr.write(f"tfos_nb supervisor of {sup.label} failed: {type(exc).__name__}: {exc}\n")
        with sup.lock:
            sup.error = sup.error or f"supervisor: {type(exc).__name__}: {exc}"
        try:
            sup.heartbeat("failed", final=True)
        except (OSError, messages.ProtocolError):
            pass
        sup.kill(grace=1)
        return 1
