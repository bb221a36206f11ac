"""The TensorFlow process of a node: runs the user's ``main_fun(args, ctx)``.

Started by the node's supervisor, which owns it.  Inputs arrive on stdin (the
pickled function — it came from the driver inside Spark's task closure and
then over our own pipes, never from a socket — then JSON control lines);
events go back as JSON lines on the report pipe; stdout/stderr are captured by
the supervisor and streamed to the driver.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any, BinaryIO

LEN = struct.Struct(">Q")


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            raise EOFError("truncated payload on stdin")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_blob(stream: BinaryIO) -> bytes:
    (n,) = LEN.unpack(_read_exact(stream, LEN.size))
    return _read_exact(stream, n)


def read_events(fd: int) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """The events a :class:`Reporter` wrote to pipe ``fd``, as ``(kind, fields)``; unparsable lines are skipped."""
    with os.fdopen(fd, "rb") as stream:
        for raw in stream:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if isinstance(ev, dict):
                yield ev.pop("t", None), ev


def write_blob(stream: BinaryIO, data: bytes) -> None:
    stream.write(LEN.pack(len(data)))
    stream.write(data)


def _lines(fd: int) -> Any:
    """JSON lines from a raw fd (no buffered reader: its lock would stall interpreter exit)."""
    buf = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        buf += chunk
        *lines, buf = buf.split(b"\n")
        yield from lines


def _control_loop(fd: int, hub: Any) -> None:
    """Commands from the supervisor; EOF means the supervisor is gone: so are we."""
    for raw in _lines(fd):
        try:
            cmd = json.loads(raw)
        except ValueError:
            continue
        op = cmd.get("op")
        if hub is not None and op == "gen_done":
            hub.end_gen(int(cmd.get("gen", 0)))
        elif hub is not None and op == "stop":
            hub.stop()
    # The supervisor died (or closed our stdin to stop us): nobody owns us any more.
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    import cloudpickle

    from .context import NodeContext, Reporter
    from .feed import DataServer, FeedHub

    stdin = os.fdopen(os.dup(0), "rb", buffering=0)
    blob = read_blob(stdin)
    info = json.loads(read_blob(stdin))
    stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - user code must not read our control pipe
    report_stream = os.fdopen(int(os.environ["TFOS_REPORT_FD"]), "w", buffering=1)
    reporter = Reporter(report_stream)

    hub = server = None
    if info.get("feed"):
        hub = FeedHub(on_close=lambda: reporter.event({"t": "feed_closed"}))
        server = DataServer(hub, bytes.fromhex(info["secret"]), info["host"]).start()
    threading.Thread(target=_control_loop, args=(0, hub), name="tfos-node-control", daemon=True).start()

    try:
        fn, tf_args = cloudpickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - reported to the driver as the node's error
        traceback.print_exc()
        reporter.event({"t": "error", "error": f"cannot load the node function: {type(exc).__name__}: {exc}"})
        return 1
    port_fd = info.get("port_fd")
    ctx = NodeContext(info, hub, reporter, tmp_socket=None if port_fd is None else socket.socket(fileno=port_fd))
    if info.get("release_port", True):
        ctx.release_port()  # TFCluster.run(release_port=False): the function calls ctx.release_port() itself
    reporter.event({"t": "ready", "data_port": server.port if server else None})
    if isinstance(tf_args, list):
        sys.argv = list(tf_args)  # TensorFlowOnSpark: an argv list is also the node's sys.argv
    value = None
    try:
        value = fn(tf_args, ctx)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from user code is an error too
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            pass
        else:
            traceback.print_exc()
            sys.stderr.flush()
            first = str(exc).strip().splitlines()
            error = f"{type(exc).__name__}: {first[0] if first else ''}".rstrip(": ")
            reporter.event({"t": "error", "error": error})
            if hub is not None:  # feeders connected now learn of the failure, not of data skipped
                hub.close(error=f"{info['job_name']}:{info['task_index']} failed: {error}")
            return 1
    finally:
        reporter.flush()
        if hub is not None:
            # Data still arriving is skipped (the server keeps accepting until the
            # process exits), so feeders return instead of waiting.
            hub.close()
    sys.stdout.flush()
    sys.stderr.flush()
    reporter.event({"t": "finished", "value": plain_value(value, ctx)})
    return 0


VALUE_MAX_BYTES = 256 * 1024


def _plain(x: Any) -> Any:
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        if not all(isinstance(k, str) for k in x):
            raise TypeError("a dict with keys other than strings")
        return {k: _plain(v) for k, v in x.items()}
    if type(x).__module__ == "numpy" and hasattr(x, "tolist"):  # numpy scalars and arrays
        return x.tolist()
    if hasattr(x, "numpy") and callable(x.numpy):  # an eager tf.Tensor
        return _plain(x.numpy())
    raise TypeError(f"a {type(x).__module__}.{type(x).__name__}")


def plain_value(value: Any, ctx: Any) -> Any:
    """What the node function returned, as JSON-able data for the driver (``handle.value``); None if it is not.

    Only plain data goes back (numbers, strings, lists, dicts, numpy values, up to 256 KiB): nothing is
    ever unpickled on the driver.  Anything else is dropped with a line on the node's stderr.
    """
    if value is None:
        return None
    label = f"{getattr(ctx, 'job_name', 'node')}:{getattr(ctx, 'task_index', 0)}"
    try:
        out = _plain(value)
        size = len(json.dumps(out))
    except (TypeError, ValueError) as exc:
        reason = f"it is {exc}" if isinstance(exc, TypeError) else f"it cannot be written as JSON ({exc})"
    else:
        if size <= VALUE_MAX_BYTES:
            return out
        reason = f"it is {size} bytes as JSON (at most {VALUE_MAX_BYTES})"
    print(f"tfos_nb: the value {label} returned is not sent to the driver: {reason}; return plain data "
          "(numbers, strings, lists, dicts, numpy values) and save models to files "
          "(e.g. model.save(ctx.absolute_path(...)))", file=sys.stderr, flush=True)
    return None
