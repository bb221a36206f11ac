"""What the line magics show of a job: a cluster's TensorBoard (``%tfos_tensorboard``), its nodes' stacks (``%tfos_stack``).

Functions of the parsed options and the handle (or the TensorBoards the kernel started); a
UsageError, one line, when there is nothing to show.
"""

from __future__ import annotations

import os
from typing import Any

from IPython.core.error import UsageError

from ._run_handle import RunHandle

__all__ = ["print_stacks", "show_tensorboard"]


def show_tensorboard(opts: Any, shell: Any, handle: RunHandle | None, local_tensorboards: dict[str, Any]) -> None:
    """``%tfos_tensorboard``: a cluster's TensorBoard (``handle``, the cell named NAME) or one started on the
    driver (--logdir; kept in ``local_tensorboards`` by cluster id, stopped with the kernel), embedded."""
    from IPython.display import HTML, display

    from .. import tensorboard

    if bool(opts.name) == bool(opts.logdir):
        raise UsageError("give a cluster name (its cell ran with --tensorboard) or --logdir DIR, not both")
    if opts.height <= 0:
        raise UsageError(f"--height must be positive, got {opts.height}")
    if opts.logdir:
        outcome = tensorboard.start_local(opts.logdir) if os.path.isdir(opts.logdir) else None
        if outcome is None:
            raise UsageError(f"--logdir {opts.logdir}: no such directory")
        if not isinstance(outcome, tensorboard.LocalTensorBoard):
            raise UsageError(f"TensorBoard did not start for {opts.logdir}: {outcome}")
        local_tensorboards[outcome.cluster_id] = outcome
        path, node_url = outcome.path, outcome.url
    else:
        h = handle
        assert h is not None  # the magic looked NAME up
        if h.done:
            raise UsageError(f"{opts.name} has ended and its TensorBoard with it: use --logdir DIR")
        view, url = h.status(), getattr(h, "tensorboard_url", None)  # a set of parallel runs has none
        if view is None or not url:
            raise UsageError(f"{opts.name} has no TensorBoard: run its cell with --tensorboard, or use --logdir DIR")
        cid = view.cluster_id
        path, node_url = tensorboard.register(cid, url), url

        def withdraw_at_the_end(_view: Any, final: bool) -> None:
            if final:
                tensorboard.withdraw(cid)

        h.add_observer(withdraw_at_the_end)
    frame, text = tensorboard.frontend_output(tensorboard.frontend(shell), path, node_url, height=opts.height)
    if frame:
        display(HTML(frame))
    print(text)


def print_stacks(handle: RunHandle, node: str | None) -> None:
    """``%tfos_stack``: the stacks of a running cluster's node processes, one block per node; a UsageError
    (one line) when there is nothing to show: not a cluster, not running, no such node, Spark Connect."""
    import re

    if node is not None and not re.fullmatch(r"[a-z]+:\d+", node):
        raise UsageError(f"--node takes ROLE:INDEX, e.g. worker:1; got {node!r}")
    if not hasattr(handle, "stacks"):
        raise UsageError(f"{handle.name} is a set of parallel runs; %tfos_stack shows the nodes of a %%tfos_cluster")
    try:
        stacks = handle.stacks(node)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    for label, text in stacks.items():
        print(f"--- {label}\n{text.rstrip()}\n")
