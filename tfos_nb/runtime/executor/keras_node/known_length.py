"""A fed dataset whose epochs all nodes end after the same number of batches: no per-step check that all have data.

Given a dataset of unknown length, ``MultiWorkerMirroredStrategy`` asks every worker at every step whether all
still have data (``input_lib._enable_get_next_as_optional``: ``get_next_as_optional`` and a collective a step), so
that a worker whose data ended first steps on with empty batches.  That costs a tenth of a small model's step
(measured: B2's MLP 1.07x-1.10x the same program told its length).  When the driver counted the ``train()`` call's
rows (``driver/feeding/counts.py``), each node knows before an epoch ends how many rows it gets and how many the
largest share holds; ``as_dataset`` then ends every epoch after as many batches as the largest share's, adding
empty batches where its own share is smaller — what the strategy's check would have given it, decided without a
collective.  For such a dataset (:func:`mark`), and only under a multi-worker strategy, this module answers
TensorFlow's question with False and turns the padding on (:class:`Known`).  A dataset built from it
(``ds.map(...)``) is not marked: the strategy keeps its check, and its batches stay as fed.
"""

from __future__ import annotations

from typing import Any

from ..import_patches import replace_once

INPUT_LIB = "tensorflow.python.distribute.input_lib"
MARK = "_tfos_known_length"
#: how long a node waits at an epoch's end for the driver's word on the shares (it comes with a heartbeat's answer)
PLAN_WAIT_S = 60.0


class Known:
    """One ``as_dataset``'s epochs of known length; ``padding`` turns on when a multi-worker strategy takes it."""

    def __init__(self) -> None:
        self.padding = False

    def pad(self, hub: Any, gen: int, rows: int, batches: int, batch_size: int) -> int:
        """Empty batches that end epoch ``gen`` with as many as the largest share's, after ``batches`` of ``rows``."""
        plan = hub.planned(gen, PLAN_WAIT_S)
        if plan is None:
            if hub.closed or hub.stopped:
                return 0
            msg = (f"{hub.label}: the driver did not say how many rows each node got in epoch {gen} within "
                   f"{PLAN_WAIT_S:.0f} s of its end here; the nodes cannot end the epoch together")
            raise RuntimeError(msg)
        mine, most = plan
        if rows != mine:
            raise RuntimeError(_differs(hub, gen, rows, mine))
        want = -(-int(most) // batch_size)
        if batches > want:  # cannot happen with whole batches but the last; said rather than a hang
            msg = (f"{hub.label}: {batches} batches of epoch {gen} read here, more than the {want} of the largest "
                   f"share ({most} rows in batches of {batch_size})")
            raise RuntimeError(msg)
        return want - batches


def _differs(hub: Any, gen: int, rows: int, mine: int) -> str:
    return (f"{hub.label} read {rows} rows of epoch {gen}, but the driver dealt it {mine} as train() counted them: "
            "the data changes from one read to the next; cache() it so that every epoch feeds the same rows, or set "
            "TFOS_KNOWN_LENGTH=0 to feed epochs of unknown length")


def mark(dataset: Any, known: Known) -> None:
    setattr(dataset, MARK, known)


def patch_input_lib(module: Any) -> bool:
    """``_enable_get_next_as_optional``: False for a marked dataset under a multi-worker strategy (padding on)."""

    def repair(original: Any) -> Any:
        def _enable_get_next_as_optional(strategy: Any, dataset: Any, cardinality: Any) -> Any:
            known = getattr(dataset, MARK, None)
            extended = getattr(strategy, "extended", None)
            if isinstance(known, Known) and extended is not None and extended._in_multi_worker_mode():
                known.padding = True
                return False
            return original(strategy, dataset, cardinality)

        return _enable_get_next_as_optional

    return replace_once(module, "_enable_get_next_as_optional", repair)


def install() -> None:
    """Patch TensorFlow's distributed input in this process as it is imported (now, if it already is)."""
    from ..import_patches import patch_modules

    patch_modules(lambda name: name == INPUT_LIB, patch_input_lib)
