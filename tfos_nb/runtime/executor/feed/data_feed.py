"""The node side of InputMode.SPARK: the ``DataFeed`` users read (the data server is ``executor/feed/hub.py``).

Feeding tasks connect to the node's ``data_server.DataServer``; each connection's
reader thread puts Arrow record batches into the ``feed_hub.FeedHub``, one bounded
queue per generation (epoch), so back-pressure reaches Spark through TCP and the
next epoch's rows wait in their own queue.  :class:`DataFeed` reads the hub up to
its epoch and hands the rows out in batches of the size asked for: as Python rows (TensorFlowOnSpark's ``next_batch``), as numpy
columns (``next_batch_arrays``), or as a ``tf.data.Dataset`` (``as_dataset``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ...batches import columns as arrow_columns
from ...recovery import ledger
from .. import compat
from ..collector import settle_gc
from ..keras_node import known_length
from ..tracking import datasets as mlflow_datasets
from .conn import Conn
from .hub import FeedHub
from .named_sets import NamedFeeds, NamedReader

log = logging.getLogger(__name__)

#: ``as_dataset``: batches a Python call hands tf.data at most, when that many are already here (tf.data makes a
#: tensor of each call's rows and slices the batches in C++: the per-call cost, paid once for them all)
CHUNK = 8

JAX_REFUSED = ("as_dataset(): Keras' JAX backend across processes (keras.distribution) needs the same number of "
               "batches on every process in every epoch, and a fed node's share of an epoch varies, so its peers "
               "would wait in a collective with no error: feed this job with the TensorFlow backend "
               "(MultiWorkerMirroredStrategy), or give every node an equal shard of its own (InputMode.TENSORFLOW)")


def refuse_jax_processes() -> None:
    """ValueError when this process runs JAX across processes (``keras.distribution.initialize()`` done, more
    than one process): a stream's varying share would hang its collectives (see :data:`JAX_REFUSED`).
    Asks nothing of JAX before it is initialized (that would fix its backends too early)."""
    jax = sys.modules.get("jax")
    if jax is not None and jax.distributed.is_initialized() and jax.process_count() > 1:
        raise ValueError(JAX_REFUSED)


def _named_feeds(hub: FeedHub, name: str) -> NamedFeeds:
    named = getattr(hub, "named", None)
    if named is None:
        raise ValueError(f"DataFeed(qname_in={name!r}): this feed has no named sets (a node of a cluster fed by "
                         "train() has them)")
    return named  # type: ignore[no-any-return]


_LOGS: dict[str, ledger.ElementLog] = {}


def element_log(hub: Any) -> ledger.ElementLog | None:
    """This process's element log (recovery's ledger), when the job has retries and ``hub`` is the training
    stream's; one per process."""
    folder = os.environ.get(ledger.ENV_DIR)
    if not folder or not isinstance(hub, FeedHub):
        return None
    label = hub.label
    if label not in _LOGS:
        _LOGS[label] = ledger.ElementLog(folder, int(os.environ.get("TFOS_ATTEMPT", "1") or 1), label)
    return _LOGS[label]


def _concat_columns(pieces: Sequence[tuple[Any, pa.RecordBatch]]) -> list[np.ndarray]:
    cols = [arrow_columns.batch_to_columns(b) for _, b in pieces]
    if len(cols) == 1:
        return cols[0]
    return [np.concatenate([c[i] for c in cols]) for i in range(len(cols[0]))]


class DataFeed:
    """What a node's function reads its data from (TensorFlowOnSpark's ``TFNode.DataFeed``).

    ``next_batch(n)`` returns a list of rows — or, with ``input_mapping``
    (column → tensor name), a dict of tensor name → array.  ``next_batch_arrays(n)``
    returns numpy columns without building Python rows (the fast path).

    In rows, a numeric array column's value is a numpy array (``numpy_rows=True``,
    the default): a read-only view into the received Arrow batch, so that
    ``np.array([r[0] for r in batch])`` costs one copy and no Python float.  Rows
    keep their type (tuples, lists, dicts, ``pyspark.sql.Row`` for DataFrames);
    scalars, strings and arrays with nulls or of different lengths stay Python
    values.  ``numpy_rows=False`` gives TensorFlowOnSpark's Python lists, for code
    that relies on list behaviour (``row[0] + [1.0]`` concatenation, ``json.dumps(row)``,
    ``row[0] == [...]``, writing into ``row[0]``).
    """

    def __init__(
        self,
        hub: FeedHub,
        train_mode: bool = True,
        qname_in: str = "input",
        qname_out: str = "output",
        input_mapping: dict[str, str] | list[str] | None = None,
        reporter: Any = None,
        *,
        numpy_rows: bool = True,
    ) -> None:
        if qname_out != "output":  # TensorFlowOnSpark's named output queues: results go back on one
            msg = (f"DataFeed(qname_out={qname_out!r}): inference results go back on one queue, 'output'; leave "
                   "qname_out at its default")
            raise ValueError(msg)
        # the training stream, or a set fed once under a name (train(..., validation=df), qname=...)
        self._hub: FeedHub | NamedReader = hub if qname_in == "input" else NamedReader(_named_feeds(hub, qname_in),
                                                                                      qname_in)
        self.train_mode = train_mode
        self.qname_in = qname_in
        self.qname_out = qname_out
        if isinstance(input_mapping, (list, tuple)):
            input_mapping = {c: c for c in input_mapping}
        self.input_mapping = dict(input_mapping) if input_mapping else None
        self._reporter = reporter
        self.numpy_rows = numpy_rows
        self.done_feeding = False
        self._names: list[str] | None = None
        # recovery's element log, until a row-by-row read (next_batch) says once that the ledger cannot follow it
        self._ledger = element_log(self._hub)

    # -- TensorFlowOnSpark's API ----------------------------------------------
    def next_batch(self, batch_size: int) -> Any:
        self._unfollowed("next_batch")
        pieces = self._take(batch_size)
        if self.input_mapping:
            return self._mapped(pieces)
        rows: list[Any] = []
        for _, b in pieces:
            rows.extend(arrow_columns.batch_to_rows(b, numpy_arrays=self.numpy_rows))
        return rows

    def should_stop(self) -> bool:
        if self._hub.drained():
            self.done_feeding = True
        return self.done_feeding

    def batch_results(self, results: Any) -> None:
        """Return one result per row of the last ``next_batch`` (inference)."""
        self._hub.answer(results)

    def terminate(self) -> None:
        """Stop reading: data still coming for this node is skipped, feeders return."""
        self._hub.close()
        self.done_feeding = True

    # -- columnar API -----------------------------------------------------------
    def next_batch_arrays(self, batch_size: int) -> Any:
        """Up to ``batch_size`` rows as a tuple of numpy arrays, one per column."""
        self._unfollowed("next_batch_arrays")
        pieces = self._take(batch_size)
        if self.input_mapping:
            return self._mapped(pieces)
        if not pieces:
            return ()
        return tuple(_concat_columns(pieces))

    def as_dataset(
        self,
        batch_size: int = 128,
        columns: Any = None,
        epochs_bounded: bool = True,
        *,
        cache: bool = False,
        shuffle: int = 0,
    ) -> Any:
        """A ``tf.data.Dataset`` over this feed, for ``model.fit``.

        Each element is a batch: a tuple of tensors, one per fed column (a dict
        with ``input_mapping``).  ``columns`` picks columns by position, e.g.
        ``columns=(0, 1)`` or ``columns=((0,), 1)`` for ``(x, y)`` with x a tuple.
        One iteration of the dataset is this node's share of one epoch of
        ``cluster.train(..., num_epochs)``, so ``model.fit(ds, epochs=E)`` lines up with
        ``num_epochs=E``; under ``MultiWorkerMirroredStrategy`` every node's epoch has as
        many batches as the largest share's (the driver counted the rows: a smaller share
        ends with empty batches, and TensorFlow's per-step check that every worker still
        has data is off; see the feeding guide's "Epochs of known length").  Auto-sharding
        is off: every node already gets its own partitions.  Under
        ``MultiWorkerMirroredStrategy`` Keras takes ``batch_size`` as the global batch:
        it splits each batch across all replicas (each trains on ``batch_size /
        num_replicas_in_sync`` rows a step), as for any dataset under a strategy.

        ``cache=True`` keeps this node's share of the first epoch in memory
        (``tf.data``'s ``Dataset.cache()``) and replays it for every later epoch,
        so later epochs do not cross Spark again: feed one epoch
        (``cluster.train(df, num_epochs=1)``) and ``model.fit(ds, epochs=E)``.  Once
        the first epoch is read the node stops reading (as ``terminate()``), so rows
        of further epochs fed by mistake are skipped, not queued.  It costs the
        share's size in memory (rows × row bytes).  ``shuffle=N`` reshuffles rows
        through an ``N``-row buffer every epoch (after the cache, so each replayed
        epoch comes in a new order), then batches them again.

        tf.data's autotuning is off on the dataset: there is nothing in it to tune,
        and an autotuned iterator's deletion, at every epoch's end, waits for its
        tuning thread (seconds, late in a run).  On a node without GPUs it is also off
        on the strategy's per-device prefetch (:func:`.compat.untuned_device_prefetch`).
        Stages you add keep working (``num_parallel_calls=tf.data.AUTOTUNE`` then
        gets a fixed parallelism, not a tuned one); ``ds.with_options(o)`` with
        ``o.autotune.enabled = True`` turns it back on.

        The rows reach tf.data through ``from_generator``, whose call costs Python and a tensor made from numpy:
        a call hands over up to :data:`CHUNK` batches when they are all here already (never waiting for a later
        one), and tf.data cuts them into the same batches in C++.
        """
        if cache and not epochs_bounded:  # refused before waiting for the first batch
            msg = "as_dataset(cache=True) keeps one epoch; it needs epochs_bounded=True"
            raise ValueError(msg)
        if shuffle < 0:
            msg = f"shuffle is a buffer size in rows (0 for none), got {shuffle}"
            raise ValueError(msg)
        refuse_jax_processes()  # keras.distribution.initialize() came first, as Keras asks
        import tensorflow as tf

        settle_gc()
        first = self._hub.peek()
        if first is None:
            msg = "as_dataset(): the feed ended before any data arrived"
            raise RuntimeError(msg)
        sample = self._select([(None, first.slice(0, 1))], columns)
        signature = tf.nest.map_structure(
            lambda a: tf.TensorSpec(shape=(None,) + tuple(a.shape[1:]), dtype=tf.as_dtype(a.dtype)), sample
        )
        empty = tf.nest.map_structure(lambda a: a[:0], sample)  # a padding batch: no row, the signature's shape
        feed = self
        elements = self._ledger
        if elements is not None and (cache or shuffle or not epochs_bounded):
            elements.cannot_follow("as_dataset(cache=True)" if cache else
                                   "as_dataset(shuffle=...)" if shuffle else "as_dataset(epochs_bounded=False)")
            elements = None

        per_call = CHUNK if feed.train_mode else 1  # batches a call of the generator hands over, when they are here
        # Every epoch's length known before it ends (the train() call counted its rows: driver/feeding/counts.py) and
        # batches as fed (no shuffle): under MultiWorkerMirroredStrategy every node's dataset ends each epoch after
        # the same number of batches (a node with a smaller share adds empty ones), so TensorFlow's per-step check
        # that every worker still has data is not needed (keras_node/known_length.py turns it off for this dataset)
        known = known_length.Known() if epochs_bounded and not shuffle and isinstance(self._hub, FeedHub) and \
            self._hub.counted() else None

        def gen() -> Iterator[Any]:
            refuse_jax_processes()  # initialize() after as_dataset(): refused at fit's first read
            epoch = [0]
            bound = epoch if epochs_bounded else None
            index = 0  # the epoch's batches taken so far: the ledger's element index

            def take_batch() -> Sequence[tuple[Any, pa.RecordBatch]]:
                nonlocal index
                spans: list[tuple[Conn, int, int]] | None = [] if elements is not None else None
                pieces = feed._take(batch_size, bound, spans)
                if pieces and elements is not None and spans is not None:  # logged before TensorFlow has the batch
                    elements.element(epoch[0], index, [(c.partition, a, b) for c, start, end in spans
                                                       for a, b in ledger.original(c.skip, start, end)])
                index += bool(pieces)
                return pieces

            rows = 0  # the epoch's rows read here (a counted epoch's: checked against the driver's count)
            while True:
                chunk: list[tuple[Any, pa.RecordBatch]] = []
                pieces: Sequence[tuple[Any, pa.RecordBatch]] = ()
                for taken in range(1, per_call + 1):
                    pieces = take_batch()
                    chunk.extend(pieces)
                    # the chunk ends at the share's end or its short last batch, and never waits for a later batch
                    if sum(p.num_rows for _, p in pieces) < batch_size or taken == per_call or \
                            not feed._hub.ready(batch_size, bound):
                        break
                if chunk:
                    rows += sum(p.num_rows for _, p in chunk)  # checked at the epoch's end (Known.pad); a feeder
                    # never sends more rows than counted (executor/feeding/feeder.py)
                    yield feed._select(chunk, columns)
                if not pieces:
                    if known is not None and known.padding:  # as many batches as the largest share's
                        for _ in range(known.pad(feed._hub, epoch[0], rows, index, batch_size)):
                            yield empty
                    if elements is not None:
                        elements.end(epoch[0], index)
                    if cache:  # later epochs replay the cache: nothing more to read
                        feed.terminate()
                    return

        def split(*chunk: Any) -> Any:  # a chunk of whole batches (the share's last may be short) into batches
            rows = chunk if isinstance(signature, tuple) else chunk[0]
            batches = tf.data.Dataset.from_tensor_slices(rows).batch(batch_size)
            if known is None:
                return batches
            # an empty chunk (a padding batch) is one empty batch
            n = tf.shape(tf.nest.flatten(rows)[0])[0]
            return batches.concatenate(tf.data.Dataset.from_tensors(rows).filter(lambda *_: tf.equal(n, 0)))

        ds = tf.data.Dataset.from_generator(gen, output_signature=signature).flat_map(split)
        setattr(ds, mlflow_datasets.MARK, True)  # a one-pass stream: MLflow must not iterate it for a digest
        if cache:
            ds = ds.cache()
        if shuffle:
            ds = ds.unbatch().shuffle(shuffle, reshuffle_each_iteration=True).batch(batch_size)
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        opts.autotune.enabled = False  # nothing to tune; why it matters: compat.untuned_device_prefetch
        compat.untuned_device_prefetch()
        ds = ds.with_options(opts)
        if known is not None:
            known_length.mark(ds, known)
        return ds

    # -- internals ----------------------------------------------------------------
    def _select(self, pieces: Sequence[tuple[Any, pa.RecordBatch]], columns: Any) -> Any:
        """``pieces`` as ``as_dataset`` yields them: their columns (a dict with ``input_mapping``), picked."""
        cols = self._mapped(pieces) if self.input_mapping else tuple(_concat_columns(pieces))
        if columns is None:
            return cols

        def pick(spec: Any) -> Any:
            if isinstance(spec, (tuple, list)):
                return tuple(pick(s) for s in spec)
            return cols[spec]

        return pick(columns)

    def _unfollowed(self, how: str) -> None:
        """The training stream read row by row: recovery's ledger cannot tell which rows a step trained on (said
        once; later reads cost one attribute test)."""
        if self._ledger is not None:
            self._ledger.cannot_follow(how)
            self._ledger = None

    def _take(self, n: int, epoch: list[int] | None = None,
              spans: list[tuple[Conn, int, int]] | None = None) -> Sequence[tuple[Conn | None, pa.RecordBatch]]:
        if n <= 0:
            msg = f"batch size must be positive, got {n}"
            raise ValueError(msg)
        if spans is not None and isinstance(self._hub, FeedHub):
            pieces: Sequence[tuple[Conn | None, pa.RecordBatch]] = self._hub.take(n, self.train_mode, epoch,
                                                                                  spans=spans)
        else:
            pieces = self._hub.take(n, self.train_mode, epoch)
        if not pieces and self._hub.drained():
            self.done_feeding = True
        return pieces

    def _mapped(self, pieces: Sequence[tuple[Conn | None, pa.RecordBatch]]) -> dict[str, Any]:
        assert self.input_mapping is not None
        if not pieces:
            return {tensor: [] for tensor in self.input_mapping.values()}
        names = pieces[0][1].schema.names
        missing = [c for c in self.input_mapping if c not in names]
        if missing:
            msg = f"input_mapping names column(s) {missing} that the fed data does not have; columns are {names}"
            raise KeyError(msg)
        cols = _concat_columns(pieces)
        by_name = dict(zip(names, cols))
        return {tensor: by_name[col] for col, tensor in self.input_mapping.items()}

