"""What runs inside Spark tasks: starting node supervisors, and feeding nodes.

These functions are shipped to executors in Spark's task closures.  They
import only the standard library, numpy/pyarrow and this package's light
modules — never TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import columns as C
from . import dataplane as dp
from . import messages as m
from .node import write_blob
from .reservation import ControlClient

LAUNCH_WAIT_S = 120


def executor_id() -> str:
    """This executor's id, from what Spark tells its Python workers (or "" if unknown)."""
    for var in ("SPARK_LOG_URL_STDERR", "SPARK_LOG_URL_STDOUT"):
        match = re.search(r"executorId=([^&]+)", os.environ.get(var, ""))
        if match:
            return match.group(1)
    base = os.path.basename(os.getcwd())
    if base.isdigit():
        return base
    if os.environ.get("CONTAINER_ID"):  # YARN
        return os.environ["CONTAINER_ID"].rsplit("_", 1)[-1]
    return "driver" if os.environ.get("SPARK_PYTHON_RUNTIME") is None else ""


def _child_env(meta: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env["TFOS_CLUSTER_ID"] = meta["cluster_id"]
    env["TFOS_DRIVER_PID"] = str(meta.get("driver_pid", ""))
    # The supervisor must import what this worker imports (pyspark.zip, --py-files, ...).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for var in ("PYTHON_WORKER_FACTORY_SECRET", "_PYSPARK_DRIVER_CONN_INFO_PATH"):
        env.pop(var, None)
    return env


def start_supervisor(meta: dict[str, Any], blob: bytes, log_path: str) -> tuple[dict[str, Any], subprocess.Popen]:
    """Start a node supervisor and wait until it registered with the driver."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfos_nb.runtime", "supervisor", meta["cluster_id"]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=_child_env(meta),
            start_new_session=True,
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        write_blob(proc.stdin, json.dumps(meta).encode())
        write_blob(proc.stdin, blob)
        proc.stdin.close()
    except OSError:
        pass
    ready, _, _ = select.select([proc.stdout], [], [], LAUNCH_WAIT_S)
    line = proc.stdout.readline() if ready else b""
    proc.stdout.close()
    try:
        status = json.loads(line) if line else None
    except ValueError:
        status = None
    if not status:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=5)
        tail = ""
        try:
            with open(log_path, "rb") as f:
                tail = f.read()[-4000:].decode("utf-8", "replace")
        except OSError:
            pass
        status = {"ok": False, "error": f"the node supervisor did not start ({proc.returncode}): {tail}"}
    return status, proc


def make_launcher(meta: dict[str, Any], blob: bytes) -> Callable[[Iterable[Any]], Iterator[str]]:
    """The barrier-stage task body: one node per task."""

    def launch(_: Iterable[Any]) -> Iterator[str]:
        from pyspark import BarrierTaskContext

        tctx = BarrierTaskContext.get()
        node = meta["first_node"] + tctx.partitionId()
        res = tctx.resources().get("gpu")
        node_meta = dict(meta)
        node_meta.update(
            node=node,
            attempt=tctx.attemptNumber(),
            executor_id=executor_id(),
            spark_gpus=list(res.addresses) if res is not None else [],
            working_dir=os.getcwd(),
        )
        log_path = os.path.join(os.getcwd(), f"tfos_nb-{meta['cluster_id']}-node{node}.log")
        try:
            status, proc = start_supervisor(node_meta, blob, log_path)
            # The supervisor outlives this task; reap it when it ends (no zombie in the worker).
            threading.Thread(target=proc.wait, name="tfos-reaper", daemon=True).start()
        except Exception as exc:  # noqa: BLE001 - the driver decides; Spark must not retry
            status = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        status["node"] = node
        yield json.dumps(status)

    return launch


# ---------------------------------------------------------------------------
# Feeding
# ---------------------------------------------------------------------------


class _Feeder:
    def __init__(self, meta: dict[str, Any], partition: int, gen: int, mode: str, timeout: float) -> None:
        self.meta = meta
        self.secret = bytes.fromhex(meta["secret"])
        self.codec = m.Codec(self.secret, meta["cluster_id"], f"feeder-p{partition}")
        self.client = ControlClient(self.codec, (meta["control"][0], int(meta["control"][1])), timeout=30)
        self.partition = partition
        self.gen = gen
        self.mode = mode
        self.timeout = timeout
        self.node: dict[str, Any] = {}

    def assign(self) -> dict[str, Any]:
        import socket

        deadline = time.monotonic() + self.timeout
        delay = 0.02
        while True:
            reply = self.client.request(
                m.FeedAssign(
                    partition=self.partition,
                    gen=self.gen,
                    host=socket.gethostname(),
                    executor_id=executor_id(),
                    mode=self.mode,
                )
            )
            if reply.ok:
                self.node = reply.body
                return reply.body
            if reply.error:
                raise RuntimeError(reply.error)
            if time.monotonic() > deadline:
                msg = f"Timeout while feeding partition {self.partition}: no node took it in {self.timeout:.0f} s"
                raise TimeoutError(msg)
            time.sleep(delay)  # a busy node is polled, with back-off
            delay = min(delay * 2, 0.5)

    def release(self, rows: int, skipped: int, error: str | None) -> str | None:
        try:
            reply = self.client.request(
                m.FeedRelease(
                    partition=self.partition,
                    gen=self.gen,
                    node=int(self.node.get("node", -1)),
                    rows=rows,
                    skipped=skipped,
                    error=error,
                )
            )
            return reply.body.get("cluster_error")
        except (OSError, m.ProtocolError):
            return None
        finally:
            self.client.close()

    def connect(self) -> Any:
        header = {"partition": self.partition, "gen": self.gen, "mode": self.mode}
        return dp.client_connect(self.node["host"], int(self.node["port"]), self.secret, header, self.timeout)

    def fail(self, exc: BaseException, rows: int) -> RuntimeError:
        where = f"{self.node.get('label', '?')} at {self.node.get('host', '?')}"
        cluster_error = self.release(rows, 0, f"{type(exc).__name__}: {exc}")
        if isinstance(exc, TimeoutError) or "timed out" in str(exc):
            msg = (
                f"Timeout while feeding partition {self.partition} to {where}: the node took no data "
                f"for {self.timeout:.0f} s"
            )
        else:
            msg = f"feeding partition {self.partition} to {where} failed: {exc}"
        if cluster_error:
            msg += f"\n{cluster_error}"
        return RuntimeError(msg)


def _batches_from_rows(rows: Iterable[Any], batch_rows: int) -> Iterator[Any]:
    buf: list[Any] = []
    for row in rows:
        buf.append(row)
        if len(buf) >= batch_rows:
            yield C.rows_to_batch(buf)
            buf = []
    if buf:
        yield C.rows_to_batch(buf)


def _rechunk(batches: Iterable[Any], batch_rows: int) -> Iterator[Any]:
    for b in batches:
        for off in range(0, b.num_rows, batch_rows):
            yield b.slice(off, batch_rows)


def feed_train(meta: dict[str, Any], partition: int, gen: int, batches: Iterable[Any], timeout: float) -> dict:
    """Send one partition's batches to the node the driver picks; wait until it took them."""
    feeder = _Feeder(meta, partition, gen, "train", timeout)
    node = feeder.assign()
    sent = 0
    if node.get("skip"):  # no node reads data any more
        skipped = sum(b.num_rows for b in batches)
        feeder.release(0, skipped, None)
        return {"partition": partition, "rows": 0, "skipped": skipped}
    try:
        sock = feeder.connect()
        try:
            for batch in batches:
                if batch.num_rows:
                    dp.send_frame(sock, b"D", C.encode_ipc(batch))
                    sent += batch.num_rows
            dp.send_frame(sock, b"E")
            kind, payload = dp.recv_frame(sock)
        finally:
            sock.close()
        if kind == b"X":
            raise dp.DataPlaneError(dp.parse_json(payload).get("error", "node error"))
        done = dp.parse_json(payload)
    except (OSError, dp.DataPlaneError, C.FeedDataError) as exc:
        if isinstance(exc, C.FeedDataError):
            feeder.release(sent, 0, str(exc))
            raise
        raise feeder.fail(exc, sent) from None
    feeder.release(int(done.get("rows", sent)), int(done.get("skipped", 0)), None)
    return {"partition": partition, "rows": int(done.get("rows", sent)), "skipped": int(done.get("skipped", 0))}


def feed_infer(meta: dict[str, Any], partition: int, batches: Iterable[Any], timeout: float) -> Iterator[Any]:
    """Send one partition to a node and yield its results (Arrow batches), in order."""
    feeder = _Feeder(meta, partition, 0, "infer", timeout)
    feeder.assign()
    sock = feeder.connect()
    errors: list[BaseException] = []
    sent = [0]

    def write() -> None:
        try:
            for batch in batches:
                if batch.num_rows:
                    dp.send_frame(sock, b"D", C.encode_ipc(batch))
                    sent[0] += batch.num_rows
            dp.send_frame(sock, b"E")
        except BaseException as exc:  # noqa: BLE001 - re-raised by the reading side
            errors.append(exc)

    writer = threading.Thread(target=write, name="tfos-feed-writer", daemon=True)
    writer.start()
    received = 0
    try:
        while True:
            kind, payload = dp.recv_frame(sock)
            if kind == b"R":
                batch = C.decode_ipc(payload)
                received += batch.num_rows
                yield batch
            elif kind == b"A":
                break
            elif kind == b"X":
                raise dp.DataPlaneError(dp.parse_json(payload).get("error", "node error"))
            else:
                raise dp.DataPlaneError(f"unexpected frame {kind!r}")
        writer.join()
        if errors:
            raise errors[0]
    except (OSError, dp.DataPlaneError) as exc:
        raise feeder.fail(errors[0] if errors and not isinstance(exc, dp.DataPlaneError) else exc, sent[0]) from None
    finally:
        sock.close()
        writer.join(timeout=5)
    if received != sent[0]:
        feeder.release(sent[0], 0, "result count mismatch")
        msg = f"partition {partition}: fed {sent[0]} rows but got {received} results back"
        raise RuntimeError(msg)
    feeder.release(sent[0], 0, None)


def make_rdd_feeder(meta: dict[str, Any], gen: int, timeout: float, batch_rows: int) -> Callable:
    def feed(partition: int, rows: Iterable[Any]) -> Iterator[str]:
        yield json.dumps(feed_train(meta, partition, gen, _batches_from_rows(rows, batch_rows), timeout))

    return feed


def make_arrow_feeder(meta: dict[str, Any], gen: int, timeout: float, batch_rows: int) -> Callable:
    def feed(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        stats = feed_train(meta, partition, gen, _rechunk(batches, batch_rows), timeout)
        yield pa.RecordBatch.from_pydict(
            {"partition": [partition], "rows": [stats["rows"]], "skipped": [stats["skipped"]]},
            schema=pa.schema([("partition", pa.int32()), ("rows", pa.int64()), ("skipped", pa.int64())]),
        )

    return feed


def make_rdd_inferer(meta: dict[str, Any], timeout: float, batch_rows: int) -> Callable:
    def infer(partition: int, rows: Iterable[Any]) -> Iterator[Any]:
        for batch in feed_infer(meta, partition, _batches_from_rows(rows, batch_rows), timeout):
            yield from C.result_rows(batch)

    return infer


def make_arrow_inferer(meta: dict[str, Any], timeout: float, batch_rows: int, schema_names: list[str]) -> Callable:
    def infer(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        for batch in feed_infer(meta, partition, _rechunk(batches, batch_rows), timeout):
            cols = [batch.column(i) for i in range(batch.num_columns)]
            yield pa.RecordBatch.from_arrays(cols, names=schema_names[: len(cols)])

    return infer
