"""What a node's feed hub knows of the epochs it is fed: which the running ``train()`` feeds, how much of each
came here, and which a bounded read takes next.

:class:`.hub.FeedHub` keeps the queues; :class:`Epochs` keeps the epochs' bookkeeping beside them, under the hub's
lock (it has none of its own: every method is called with the hub's lock held).  What it decides:

- the epoch a new bounded read takes (:meth:`Epochs.next`): in a ``train()`` call the one after the last begun
  here, or one cut short with rows left (``ds.take(k)``); in a stream the oldest not ended and not read here;
- whether this node's share of an epoch is all in (:meth:`Epochs.share_in`): the driver ended the epoch, or said
  how many partitions it sent here (``epoch_assigned``) and as many ended — what lets nodes with unequal shares
  step together under a synchronous strategy;
- whether a read is past the running call's epochs (:meth:`Epochs.ahead`, out of step) and when the driver hears
  of a read waiting past them (:meth:`Epochs.past`);
- a counted epoch's rows here and the most any node got (:meth:`Epochs.assigned`), for a length known in advance;
- the fed data's shape, for a node given no row (:attr:`Epochs.sample`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from .plan import FeedOutOfStep, out_of_step_message, sample_row


class Epochs:
    """The epochs' bookkeeping of one node's feed hub; every method runs under the hub's lock."""

    def __init__(self, label: str) -> None:
        self.label = label  # role:index, for the out-of-step error
        self.done = 0  # the last epoch the driver ended (every feeder of it acknowledged)
        self.plan: tuple[int, int] | None = None  # (first, last) epoch the running train() feeds
        self.out_of_step: str | None = None  # the FeedOutOfStep error, once raised
        self._past_told = 0  # the last epoch past the plan the driver was told of
        self._sample: dict[str, Any] | None = None  # the fed data's shape, as the driver relayed it (see sample)
        self._sample_row: tuple[dict[str, Any], pa.RecordBatch | None] | None = None  # (that shape, its row)
        self._expected: dict[int, int] = {}  # generation -> partitions the driver sent here, once it sent them all
        # counted epochs (driver/feeding/counts.py): generation -> (rows sent here, the most rows any node got)
        self._planned: dict[int, tuple[int, int]] = {}
        self.counted: set[int] = set()  # generations whose feeding tasks carried their partitions' counts
        self._ended: dict[int, int] = {}  # generation -> connections that ended (E) or dropped
        self._read: set[int] = set()  # generations a bounded read ended at its share's end (the next read skips)
        self._begun = 0  # the last generation a bounded read began here (see next)
        self._taken: dict[int, int] = {}  # rows read here, by generation (the last fed epoch's: the out-of-step error)

    def next(self, has_rows: Callable[[int], bool]) -> int:
        """The epoch a new bounded read takes: in a ``train()`` call, the one after the last begun here, ended or
        not (an empty share read late is read, not skipped), or the call's first; a read cut short with rows left
        (``ds.take(k)``: ``has_rows``, whether rows of a generation are queued) is continued.  In a stream: the
        oldest not ended and not read here."""
        if self.plan is not None:
            last = self._begun
            if last and last not in self._read and last > self.done and (not self.share_in(last) or has_rows(last)):
                return last
            return max(last + 1, self.plan[0])
        gen = self.done + 1
        while gen in self._read:
            gen += 1
        return gen

    def begin(self, gen: int) -> None:
        """A bounded read begins epoch ``gen``."""
        self._begun = max(self._begun, gen)

    def read(self, gen: int) -> None:
        """A bounded read ended at the end of this node's share of ``gen``."""
        self._read.add(gen)

    def took(self, gen: int, rows: int) -> None:
        self._taken[gen] = self._taken.get(gen, 0) + rows

    def conn_ended(self, gen: int) -> None:
        """A connection of ``gen`` ended (E) or dropped before it."""
        self._ended[gen] = self._ended.get(gen, 0) + 1

    def end(self, epoch: int) -> bool:
        """The driver ended every generation up to ``epoch``: forget what they no longer need; False when it had
        already."""
        if epoch <= self.done:
            return False
        self.done = epoch
        for table in (self._expected, self._ended):  # ended epochs need no share any more
            for g in [g for g in table if g <= epoch]:
                del table[g]
        for g in [g for g in self._taken if g < epoch]:  # the last ended epoch's count is kept
            del self._taken[g]
        self._read = {g for g in self._read if g > epoch}
        return True

    def assigned(self, epoch: int, partitions: int, rows: int = -1, most: int = -1) -> None:
        """Every partition of ``epoch`` went to a node, ``partitions`` of them to this one; in a counted epoch,
        ``rows`` of its rows and ``most``, the largest share of any node."""
        if epoch > self.done:
            self._expected[epoch] = partitions
        if rows >= 0:
            self._planned[epoch] = (rows, most)
            self.counted.add(epoch)
            for g in [g for g in self._planned if g < epoch - 8]:
                del self._planned[g]

    def planned(self, gen: int) -> tuple[int, int] | None:
        """(rows sent here, the most any node got) of counted epoch ``gen``, once the driver said it."""
        return self._planned.get(gen)

    def set_plan(self, first: int, last: int, sample: dict[str, Any] | None = None) -> None:
        """The running ``train()`` feeds epochs ``first``..``last`` (0, 0: no train() call announced); ``sample``:
        its data's shape (``{"schema", "shapes"}``), once a feeding task told the driver."""
        if last and (self.plan is None or self.plan[0] != first):  # a new call: the last one's shape is not its
            self._sample = None
        self.plan = (first, last) if last else None
        if sample:
            self._sample = dict(sample)

    @property
    def sample(self) -> pa.RecordBatch | None:
        """A row of zeros shaped as the running call's data (:func:`.plan.sample_row`), None when not known or not
        buildable.  Built when a read first needs it, not in :meth:`set_plan`: the plan comes on the supervisor's
        heartbeat thread while the user's function may be importing pandas on the main thread, and pyarrow's
        first ``pa.array`` imports pandas too (two threads importing one module: "partially initialized")."""
        spec = self._sample
        if spec is None:
            return None
        if self._sample_row is None or self._sample_row[0] != spec:  # built once per shape, failed or not
            self._sample_row = (spec, sample_row(spec))
        return self._sample_row[1]

    def in_call(self, gen: int) -> bool:
        """Whether ``gen`` is one of the running ``train()`` call's epochs."""
        return self.plan is not None and self.plan[0] <= gen <= self.plan[1]

    def ahead(self, gen: int) -> bool:
        """Whether a bounded read of ``gen`` is past the running train()'s epochs, the last not all read."""
        return self.plan is not None and self.done < self.plan[1] < gen

    def out_of_step_error(self, gen: int) -> FeedOutOfStep:
        assert self.plan is not None
        self.out_of_step = out_of_step_message(self.label, gen, *self.plan, rows=self._taken.get(self.plan[1], 0))
        return FeedOutOfStep(self.out_of_step)

    def past(self, gen: int) -> int | None:
        """A bounded read of ``gen`` finds nothing queued: past the running train()'s epochs, the rows of the last
        epoch read here, once per epoch (the driver hears of it, whether the read waits or the stop ends it); else
        None.  :meth:`ahead` sees peers that still read the last epoch; the driver sees the peers that took all of
        it but still step it, waiting for this node (``controller.Controller._ran_out``)."""
        if self.plan is None or gen <= self.plan[1] or gen <= self._past_told:
            return None
        self._past_told = gen
        return self._taken.get(self.plan[1], 0)

    def share_in(self, gen: int) -> bool:
        """Whether every partition of this node's share of ``gen`` ended (or the driver ended ``gen``)."""
        if self.done >= gen:
            return True
        expected = self._expected.get(gen)
        return expected is not None and self._ended.get(gen, 0) >= expected
