"""The executor side of parallel runs: the Spark task that owns one run, and the run's process.

One Spark task per run, on either backend: the runs are one ``mapInArrow``
stage over ``range(n)`` with ``n`` partitions (a barrier stage or not), whose
body is :func:`make_run_task`.  The task (in Spark's Python worker) registers
the run with its control server (the driver's, or on Spark Connect the runs'
coordinator on an executor), starts the run's own process
(``python -m tfos_nb.runtime run``), relays its output and ``ctx.report``
progress in heartbeats, kills it when the control server says so, and yields
the run's outcome as one Arrow row (:data:`RESULT_SCHEMA`) that comes back
through Spark's own ``collect()``.  The run's process hands its pickled value
to the task in a file of the task's scratch directory.

Why a process per run and not the Python worker itself: TensorFlow's
configuration is fixed at its first import (thread pools from
``TF_NUM_INTRAOP_THREADS``, ``TF_USE_LEGACY_KERAS``, visible GPUs), its global
state (Keras' graph and name counters, seeds, allocated GPU memory) cannot be
undone, and Spark reuses Python workers between tasks: a run in the worker
would leave all of that to the next run on the executor.  A child process
starts clean every time, gives its memory back when it ends, and a crash in
TensorFlow (segfault, out-of-memory kill) fails only that run, reported with
its last output lines.  It costs a process start and a TensorFlow import per
run — seconds, which is small next to a training run.

Nothing of a run outlives its owners: the child is in a session of its own
and kills its whole process group when its stdin (held by the task) closes,
i.e. when the task's Python worker dies (Spark cancelled the job, the executor
was lost); the task kills it when the driver stops answering.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ... import gpus, net
from ...protocol import messages, pipes
from ...protocol.channel import ControlClient
from ..context import NodeContext, Reporter
from ..identity import executor_id
from . import child_main
from .launch import child_env
from .owner import ChildOwner, tf_env
from .threads import task_cpus

# ---------------------------------------------------------------------------
# The Spark task
# ---------------------------------------------------------------------------


RESULT_SCHEMA = "i int, s string, v binary"  # a run's row: its index, status (JSON), cloudpickled value (or null)


def make_run_task(meta: Mapping[str, Any] | messages.LaunchMeta, blob: bytes, barrier: bool) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The runs' ``mapInArrow`` body (classic and Spark Connect alike): partition ``i`` runs run ``i`` and yields
    one row of :data:`RESULT_SCHEMA`, ``(i, status, value)``."""
    launch_meta = messages.LaunchMeta.parse(meta)  # a bad meta fails here, on the driver, not in every task

    def task(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import BarrierTaskContext, TaskContext

        for _ in batches:
            pass
        tctx = BarrierTaskContext.get() if barrier else TaskContext.get()
        assert tctx is not None  # this runs inside a Spark task
        index = tctx.partitionId()
        res = tctx.resources().get("gpu")
        spark_gpus = list(res.addresses) if res is not None else []
        peers: list[str] = []
        if barrier:
            peers = [t.address.rsplit(":", 1)[0] for t in BarrierTaskContext.get().getTaskInfos()]
        run = RunOwner(dataclasses.replace(launch_meta, task_cpus=task_cpus(tctx)), index, tctx.attemptNumber(),
                       spark_gpus, peers)
        try:
            status, value = run.run(blob)
        except Exception as exc:  # noqa: BLE001 - the driver reports it; Spark must not retry
            status = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "tail": list(run.tail)}
            value = None
        status.update(index=index, host=run.host, executor_id=run.executor_id)
        schema = pa.schema([("i", pa.int32()), ("s", pa.string()), ("v", pa.binary())])
        yield pa.RecordBatch.from_pydict({"i": [index], "s": [json.dumps(status)], "v": [value]}, schema=schema)

    return task


class RunOwner(ChildOwner):
    """Owns one run's process for the length of the Spark task."""

    process_name = "the run's process"

    def __init__(self, launch_meta: Mapping[str, Any] | messages.LaunchMeta, index: int, attempt: int, spark_gpus: list[str],
                 peers: list[str]) -> None:
        meta = messages.LaunchMeta.parse(launch_meta)
        control = meta.address
        codec = messages.Codec(bytes.fromhex(meta.secret), meta.cluster_id, f"run{index}")
        super().__init__(ControlClient(codec, control, timeout=10), index, f"run:{index}",
                         hb_interval=meta.hb_interval, driver_timeout=meta.driver_timeout, executor_id=executor_id())
        self.meta = meta
        self.attempt = attempt
        self.spark_gpus = spark_gpus
        self.peers = peers
        self.host = net.local_ip_towards(*control)
        self.gpus: list[dict[str, Any]] = []

    # -- devices ----------------------------------------------------------------
    def _pick_gpus(self) -> list[dict[str, Any]]:
        """Spark's task GPUs; else, in a barrier stage, a share of the host's GPUs; else none pinned."""
        available = gpus.query()
        if self.spark_gpus:
            known = {g["index"]: g for g in available}
            return [known.get(a, {"index": a, "name": "GPU"}) for a in self.spark_gpus]
        if available and self.peers:
            mine = self.peers[self.index] if self.index < len(self.peers) else ""
            local = [i for i, host in enumerate(self.peers) if host == mine]
            rank = local.index(self.index) if self.index in local else 0
            return gpus.assign(available, rank, len(local), self.meta.num_gpus)
        return []

    # -- the run ------------------------------------------------------------------
    def run(self, blob: bytes) -> tuple[dict[str, Any], bytes | None]:
        self.gpus = self._pick_gpus()
        reply = self.client.request(
            messages.Register(node=self.index, host=self.host, port=0, executor_id=self.executor_id, pid=os.getpid(),
                       gpus=self.gpus, spark_gpus=self.spark_gpus, working_dir=os.getcwd(), attempt=self.attempt)
        )
        if not reply.ok:
            self.client.close()
            return {"ok": False, "refused": True, "error": reply.error or "refused"}, None
        workdir = tempfile.mkdtemp(prefix=f"tfos_nb-{self.meta.cluster_id}-run{self.index}-")
        result_path = os.path.join(workdir, "result.pkl")
        started = time.monotonic()
        try:
            self._start_child(blob, result_path)
            outcome, code = self.supervise()
            self.join_readers()
            value = None
            if outcome == "finished":
                try:
                    with open(result_path, "rb") as f:
                        value = f.read()
                except OSError:
                    outcome = "failed"
                    with self.lock:
                        self.error = "the run finished but left no result (its process was killed?)"
            if outcome == "lost":
                outcome = "failed"  # the driver is gone: nobody to tell but the Spark task's result
            else:
                self.final_heartbeat(outcome, code)
            with self.lock:
                status = {
                    "ok": outcome == "finished",
                    "state": outcome,
                    "error": self.error if outcome == "failed" else None,
                    "exit_code": code,
                    "tail": list(self.tail) if outcome == "failed" else [],
                    "report": dict(self.report),
                    "elapsed": time.monotonic() - started,
                }
            return status, value
        finally:
            self.kill(grace=1)
            self.client.close()
            shutil.rmtree(workdir, ignore_errors=True)

    def _start_child(self, blob: bytes, result_path: str) -> None:
        meta = self.meta
        env = tf_env(child_env(meta), meta, self.gpus, bool(self.gpus or self.spark_gpus))
        env.pop("TF_CONFIG", None)  # a single-node run: no cluster for TensorFlow to join
        info = {
            "index": self.index,
            "num_runs": meta.num_runs,
            "executor_id": self.executor_id,
            "host": self.host,
            "default_fs": meta.default_fs,
            "working_dir": os.getcwd(),
            "gpus": self.gpus,
            "cluster_id": meta.cluster_id,
            "result_path": result_path,
        }
        self.start("run", meta.cluster_id, env, blob, info)


# ---------------------------------------------------------------------------
# The run's process: python -m tfos_nb.runtime run
# ---------------------------------------------------------------------------


class RunContext(NodeContext):
    """What a parallel run's function sees as ``ctx`` (TensorFlowOnSpark's ``TFParallel`` context).

    ``worker_num`` and ``executor_id`` are the run's index (0 … ``num_workers``-1),
    as in TensorFlowOnSpark, so a run can take its shard of a data set;
    ``num_workers`` is the number of runs; ``job_name`` is ``"worker"``,
    ``task_index`` the index, ``cluster_spec`` is empty (no cluster) and
    ``is_chief`` is true for run 0 only.  Also ``run_index``, ``num_runs``,
    ``spark_executor_id`` (the Spark executor it runs on), ``host``, ``gpus``,
    ``report(step=…, **metrics)`` and ``progress_callback()``.
    """

    def __init__(self, info: dict[str, Any], reporter: Reporter | None) -> None:
        index = int(info["index"])
        super().__init__(
            {
                "job_name": "worker",
                "task_index": index,
                "node": index,
                "cluster_spec": {},
                "executor_id": index,
                "default_fs": info.get("default_fs", "file:///"),
                "working_dir": info.get("working_dir"),
                "gpus": info.get("gpus", []),
                "cluster_id": info.get("cluster_id", ""),
            },
            None,
            reporter,
        )
        self.run_index = index
        self.num_runs = self.num_workers = int(info["num_runs"])
        self.spark_executor_id: str = str(info.get("executor_id", ""))
        self.host: str = str(info.get("host", ""))

    def get_data_feed(self, *args: Any, **kwargs: Any) -> Any:
        msg = (
            "parallel runs have no data feed: read the data in the function, e.g. the shard "
            "ctx.worker_num of ctx.num_workers"
        )
        raise RuntimeError(msg)


class RunRole(child_main.ChildRole):
    """A parallel run: its share of the arguments; its value goes back pickled, in a file the task reads."""

    what = "the run's function"

    def context(self) -> RunContext:
        ctx = RunContext(self.info, self.reporter)
        self.reporter.send(pipes.Ready())
        return ctx

    def call(self, fn: Any, args: Any, ctx: Any) -> Any:
        return fn(args[self.info["index"]], ctx)

    def on_owner_gone(self) -> None:
        # The task's Python worker was killed (Spark cancelled the job): its cleanup of the run's
        # scratch directory did not run, and nobody will read the result.
        shutil.rmtree(os.path.dirname(self.info["result_path"]), ignore_errors=True)

    def finish(self, value: Any) -> int:
        import cloudpickle

        try:
            data = cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001
            msg = (f"the value run:{self.info['index']} returned cannot be pickled ({type(exc).__name__}: {exc}); "
                   "return plain data")
            print(msg, file=sys.stderr, flush=True)
            self.reporter.send(pipes.Failed(error=msg))
            return 1
        with open(self.info["result_path"], "wb") as f:
            f.write(data)
        self.reporter.send(pipes.Finished())
        return 0


def main() -> int:
    return child_main.main(RunRole)
