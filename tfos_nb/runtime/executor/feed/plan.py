"""What a node knows of the running ``train()``: its epochs (a read past them is out of step) and its data's shape.

The driver tells each node which epochs the running ``train()`` feeds and, once a feeding task said it, the shape
of the fed rows (``pipes.FeedPlan``).  :class:`.hub.FeedHub` uses the first to tell a node that read its feed
out of step (:class:`FeedOutOfStep`, after :data:`AHEAD_S`) and the second to give a node with no row of its own
the signature of its dataset (:func:`sample_row`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pyarrow as pa

log = logging.getLogger(__name__)

AHEAD_S = 10.0  # a bounded read past the fed epochs while the last is still read elsewhere: out of step after this


class Ahead:
    """How long a waiting read has been past the fed epochs: :meth:`still` is True once it has been for
    :data:`AHEAD_S` without a break."""

    def __init__(self) -> None:
        self._since: float | None = None

    def still(self, ahead: bool) -> bool:
        if not ahead:
            self._since = None
            return False
        now = time.monotonic()
        self._since = self._since or now
        return now - self._since >= AHEAD_S


class FeedOutOfStep(RuntimeError):
    """A node read its feed past the epochs the job feeds while other nodes still read the last of them."""


def sample_row(sample: dict[str, Any]) -> pa.RecordBatch | None:
    """One row of zeros with the fed data's schema and value shapes (``sample`` from a feeding task, through the
    driver), for a dataset's signature; None when it cannot be built (the node then waits for a row of its own)."""
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(str(sample["schema"]))))
        shapes = list(sample["shapes"])
        values = []
        for fld, shape in zip(schema, shapes, strict=True):
            kind = fld.type
            while pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
                kind = kind.value_type
            zero: Any = ("" if pa.types.is_string(kind) or pa.types.is_large_string(kind)
                         else False if pa.types.is_boolean(kind) else 0)
            values.append(np.full(tuple(int(d) for d in shape), zero, dtype=object).tolist() if shape else zero)
        return pa.RecordBatch.from_arrays([pa.array([v], type=f.type) for v, f in zip(values, schema)], schema=schema)
    except Exception as exc:  # noqa: BLE001 - only a convenience for a node with no row: it waits for one instead
        log.warning("tfos_nb: no sample row from the fed data's shape (%s: %s); a node given no row waits for one",
                    type(exc).__name__, exc)
        return None


def out_of_step_message(label: str, gen: int, first: int, last: int, rows: int | None = None,
                        peers: str | None = None) -> str:
    """Why ``label``'s read of epoch ``gen`` is out of step with a ``train()`` that feeds ``first``..``last``:
    ``rows``, the rows of epoch ``last`` it was fed and read before asking for more; ``peers``, what the others do
    (by default what the node's own check sees: they still read the last epoch)."""
    fed = f"the job feeds {last} epochs" if first <= 1 else f"this train() feeds epochs {first}-{last}"
    peers = peers or f"the other nodes still read epoch {last} and wait for {label} to step with them"
    ran_out = "" if rows is None else (f"; its input ran out before theirs: it had read all {rows} rows fed to it "
                                       f"in epoch {last} and asked for more")
    return (f"{label} read its feed out of step: it asked for epoch {gen}, and {fed}; {peers}{ran_out}. Under a "
            "synchronous strategy every node asks for the same steps: its dataset was iterated once more than the "
            "job's epochs, repeats (.repeat()), or fit asks more steps (steps_per_epoch) than its rows hold. Iterate "
            "it once per epoch the job feeds (no .repeat() and no steps_per_epoch on a fed dataset, no pass over it "
            "before model.fit, no second as_dataset() on the same feed; model.fit(ds, epochs=N) with N the job's "
            "epochs)")
