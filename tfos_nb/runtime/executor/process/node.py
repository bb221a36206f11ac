"""The TensorFlow process of a node: runs the user's ``main_fun(args, ctx)``.

Started by the node's supervisor, which owns it (:mod:`.child_main` is the
skeleton shared with a parallel run's process).  Inputs arrive on stdin (the
pickled function — it came from the driver inside Spark's task closure and
then over our own pipes, never from a socket — then the owner's commands);
events go back on the report pipe; stdout/stderr are captured by the
supervisor and streamed to the driver.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from typing import Any

from ...protocol import pipes
from ..context import NodeContext, Reporter
from . import child_main


class NodeRole(child_main.ChildRole):
    """A cluster node: its data feed (fed nodes), the supervisor's epoch and stop commands, its value."""

    what = "the node function"

    def __init__(self, info: dict[str, Any], reporter: Reporter) -> None:
        from ...batches import columns
        from ..feed.hub import FeedHub
        from ..feed.named_sets import NamedFeeds
        from ..feed.server import DataServer

        super().__init__(info, reporter)
        self.hub = self.server = self.named = None
        if info.get("feed"):
            label = f"{info['job_name']}:{info['task_index']}"
            self.hub = FeedHub(on_close=lambda: reporter.send(pipes.FeedClosed()), label=label,
                               on_drop=lambda c: reporter.send(pipes.FeedDropped(gen=c.gen, partition=c.partition,
                                                                                 rows=c.received)),
                               on_past=lambda epoch, rows: reporter.send(pipes.FeedPast(epoch=epoch, rows=rows)))
            self.hub.named = self.named = NamedFeeds(label, self._training_fed,
                                                     on_open=lambda name: reporter.send(pipes.FeedOpened(name=name)))
            self.server = DataServer(self.hub, bytes.fromhex(info["secret"]), info["host"], named=self.named).start()
            # ends by itself once its imports are done (a second or so); nothing to stop
            threading.Thread(target=columns.warm_up, name="tfos-warm-up", daemon=True).start()
        self.ctx: NodeContext | None = None

    def on_command(self, cmd: pipes.Frame) -> None:
        if self.hub is not None and isinstance(cmd, pipes.EpochDone):
            self.hub.end_epoch(int(cmd.epoch))
        elif self.hub is not None and isinstance(cmd, pipes.EpochAssigned):
            self.hub.epoch_assigned(int(cmd.epoch), int(cmd.partitions), int(cmd.rows), int(cmd.most))
        elif self.hub is not None and isinstance(cmd, pipes.FeedPlan):
            self.hub.set_plan(int(cmd.first), int(cmd.last), cmd.sample)
        elif self.named is not None and isinstance(cmd, pipes.FeedSets):
            self.named.update(dict(cmd.feeds))
        elif self.hub is not None and isinstance(cmd, pipes.Stop):
            self.hub.stop()
            if self.named is not None:
                self.named.stop()

    def _training_fed(self) -> bool:
        """Whether a train() call is feeding this node now (its epochs announced, not all ended)."""
        hub = self.hub
        return hub is not None and hub.plan is not None and hub.epoch_done < hub.plan[1]

    def context(self) -> NodeContext:
        port_fd = self.info.get("port_fd")
        tmp_socket = None if port_fd is None else socket.socket(fileno=port_fd)
        self.ctx = NodeContext(self.info, self.hub, self.reporter, tmp_socket=tmp_socket)
        if self.info.get("release_port", True):
            self.ctx.release_port()  # TFCluster.run(release_port=False): the function calls ctx.release_port() itself
        self.reporter.send(pipes.Ready(data_port=self.server.port if self.server else None))
        return self.ctx

    def call(self, fn: Any, args: Any, ctx: Any) -> Any:
        if isinstance(args, list):
            sys.argv = list(args)  # TensorFlowOnSpark: an argv list is also the node's sys.argv
        return fn(args, ctx)

    def error_of(self, exc: BaseException) -> str:
        if self.hub is not None and self.hub.out_of_step is not None:  # raised in tf.data's generator: wrapped by TF
            return f"FeedOutOfStep: {self.hub.out_of_step}"
        return super().error_of(exc)

    def on_error(self, error: str) -> None:
        if self.hub is not None:  # feeders connected now learn of the failure, not of data skipped
            self.hub.close(error=f"{self.info['job_name']}:{self.info['task_index']} failed: {error}")

    def cleanup(self) -> None:
        if self.hub is not None:
            # Data still arriving is skipped (the server keeps accepting until the
            # process exits), so feeders return instead of waiting.
            self.hub.close()
        if self.named is not None:
            self.named.close()  # the sets' files go with the node

    def finish(self, value: Any) -> int:
        self.reporter.send(pipes.Finished(value=plain_value(value, self.ctx)))
        return 0


def main() -> int:
    return child_main.main(NodeRole)


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
