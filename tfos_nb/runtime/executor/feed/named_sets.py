"""Named sets on a node: sets fed once under a name (a validation or test set) and read as often as asked.

The training rows stream through the :class:`.hub.FeedHub` epoch by epoch and are read once.  A named
feed (``train(df, validation=val_df)``, ``feeds={"test": test_df}``, TensorFlowOnSpark's ``qname``) is a set:
Keras validates on the same rows at every epoch's end.  So the driver feeds its partitions once, before the
training epochs, and each lands in a file of this node's private folder (Arrow IPC, written as it arrives; the
folder is under the node's ``TMPDIR``, removed by its owner however the node ends: :class:`~..private.PrivateTmp`):
its feeding job never waits for the node's function, so it holds no Spark task slot a training epoch needs,
and a node that validates only every other epoch (``validation_freq``) leaves nothing waiting.  Every
iteration of ``as_dataset()`` reads the node's share from its first row; ``next_batch`` reads it ``passes``
times (``train(rdd, num_epochs, qname=...)``), then the feed ends.

Exactly once: a partition is written to a temporary file and renamed into place at its end, so a connection
cut short leaves nothing and Spark's retry of the partition (the driver sends it to the same node) replaces it
whole; the node reads only the partitions the driver says it holds, once the driver saw the feeding job end.

A read of a name waits until the driver says its set is in.  While a ``train()`` call feeds this node and did
not announce the name, the read fails after :data:`.plan.AHEAD_S` naming the node, the name and the names
fed (it would otherwise wait for a set nobody sends).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Generator
from typing import Any

import pyarrow as pa

from ...private import make_dirs
from . import plan as feed_plan
from .conn import Conn

#: what names a feed, the driver's check and the node's alike: it names the set's folder on each node, so never
#: a path (``/``, NUL) nor ``.`` or ``..`` (the node's folder itself, or the one above it)
NAME = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9_.-]{1,64}")


def check_name(name: Any) -> str:
    """``name`` when it can name a feed (:data:`NAME`); ValueError otherwise."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"a feed's name is letters, digits, '_', '.' or '-' (up to 64), other than '.' and '..', "
                         f"got {name!r}")
    return name


class Share:
    """What this node holds of one named set: its files (in partition order), passes, and a row's shape."""

    def __init__(self, name: str, version: int, paths: list[str], passes: int, sample: dict[str, Any]) -> None:
        self.name, self.version, self.paths, self.passes, self.sample = name, version, paths, passes, sample

    def batches(self, passes: int) -> Generator[pa.RecordBatch, None, None]:
        """The share's batches, ``passes`` times, read into memory of this process: never a memory map, whose
        read-only pages TensorFlow would write into when it reuses an input tensor's buffer (SIGSEGV)."""
        for _ in range(passes):
            for path in self.paths:
                with pa.OSFile(path, "rb") as source:
                    reader = pa.ipc.open_file(source)
                    for i in range(reader.num_record_batches):
                        yield reader.get_batch(i)


class NamedFeeds:
    """This node's named sets: the writing side (the data server's connections) and the driver's news."""

    def __init__(self, label: str, training_fed: Callable[[], bool], root: str | None = None,
                 on_open: Callable[[str], None] | None = None) -> None:
        self.label = label
        self._on_open = on_open  # to the driver: "the function reads this set"
        self._training_fed = training_fed  # whether a train() call feeds this node now
        self._root = root or tempfile.mkdtemp(prefix="tfos-feeds-")  # 0700: only this user reads the sets
        self._cond = threading.Condition()
        self._known: dict[str, dict[str, Any]] = {}  # name -> the driver's news: version, parts (None: feeding)…
        self._writing: dict[int, tuple[Any, Any, str, str]] = {}  # id(conn) -> (sink, writer, temporary, final)
        self.stopped = False
        self.opened: set[str] = set()  # names a read asked for

    # -- the driver's news ---------------------------------------------------------
    def update(self, feeds: dict[str, Any]) -> None:
        """The driver's view of this node's named sets: ``{name: {"version", "parts", "passes", "sample"}}``,
        ``parts`` None while the set is being fed."""
        with self._cond:
            for name, info in feeds.items():
                self._known[name] = dict(info)
                if info.get("parts") is not None:  # a version is in: the ones before the last go (a pass of the
                    self._drop_before(name, int(info["version"]))  # last may still be read: the next train() call's
            self._cond.notify_all()  # set arrives while the nodes validate the previous call's last epoch)

    def _drop_before(self, name: str, version: int) -> None:
        """Remove the versions of ``name`` older than ``version``, but for the newest of them."""
        folder = os.path.join(self._root, check_name(name))
        try:
            versions = sorted(int(v) for v in os.listdir(folder) if v.isdigit())
        except FileNotFoundError:  # no partition of the set came here
            return
        for old in [v for v in versions if v < version][:-1]:
            shutil.rmtree(os.path.join(folder, str(old)), ignore_errors=True)

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._root, ignore_errors=True)

    # -- writing (the data server's connection threads) ----------------------------------
    def _folder(self, name: str, version: int) -> str:
        return os.path.join(self._root, check_name(name), str(version))

    def put(self, conn: Conn, gen: int, batch: pa.RecordBatch) -> None:
        """A batch of ``conn``'s partition of version ``gen`` of its set (as :meth:`FeedHub.put`)."""
        entry = self._writing.get(id(conn))
        if entry is None:
            folder = self._folder(conn.feed, gen)
            make_dirs(folder)  # 0700, as the node's folder above it
            final = os.path.join(folder, f"p{conn.partition}.arrow")
            temporary = f"{final}.{id(conn)}.part"  # new, 0600, never through a link
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            sink = pa.PythonFile(os.fdopen(fd, "wb"), mode="w")
            entry = (sink, pa.ipc.new_file(sink, batch.schema), temporary, final)
            self._writing[id(conn)] = entry
        entry[1].write_batch(batch)
        conn.received += batch.num_rows

    def end_conn(self, conn: Conn) -> None:
        """The partition's last row arrived: its file goes in place (replacing an earlier attempt's), then the
        feeder hears that every row was taken."""
        entry = self._writing.pop(id(conn), None)
        if entry is not None:
            sink, writer, temporary, final = entry
            writer.close()
            sink.close()
            os.replace(temporary, final)
        conn.ended = True
        conn.consumed = conn.received
        conn.finish()

    def drop(self, conn: Conn, error: str) -> None:
        """The connection broke mid-partition: what it wrote goes (Spark's retry sends the partition again)."""
        entry = self._writing.pop(id(conn), None)
        if entry is not None:
            sink, writer, temporary, _ = entry
            for close in (writer.close, sink.close):
                try:
                    close()
                except (OSError, pa.ArrowException):
                    pass
            try:
                os.unlink(temporary)
            except OSError:
                pass
        conn.finish(error)

    # -- reading --------------------------------------------------------------------
    def share(self, name: str) -> Share | None:
        """This node's share of ``name`` once the driver says the set is in (blocks until then); None when the
        cluster stops first.  ValueError when a ``train()`` call feeds this node without ``name``."""
        ahead = feed_plan.Ahead()
        if name not in self.opened:
            self.opened.add(name)
            if self._on_open is not None:
                self._on_open(name)
        with self._cond:
            while True:
                info = self._known.get(name)
                if info is not None and info.get("parts") is not None:
                    return self._share(name, info)
                if self.stopped:
                    return None
                if ahead.still(info is None and self._training_fed()):
                    names = ", ".join(repr(n) for n in ["input", *sorted(self._known)])
                    raise ValueError(
                        f"{self.label} reads the feed {name!r}, which the running train() does not feed (it feeds "
                        f"{names}): pass that data to train(..., validation=df) or train(..., feeds={{{name!r}: df}}) "
                        f"(%%tfos_cluster --validation-data VAR), or read ctx.get_data_feed()")
                self._cond.wait(0.5)

    def _share(self, name: str, info: dict[str, Any]) -> Share:
        version = int(info["version"])
        folder = self._folder(name, version)
        paths = [os.path.join(folder, f"p{int(p)}.arrow") for p in sorted(int(p) for p in info["parts"])]
        missing = [p for p in paths if not os.path.exists(p)]
        if missing:  # the driver counts a partition here only once this node acknowledged it
            raise RuntimeError(f"{self.label}: the feed {name!r} lacks {len(missing)} partition file(s) the driver "
                               f"says it holds, e.g. {missing[0]}")
        return Share(name, version, paths, max(1, int(info.get("passes", 1))), dict(info.get("sample") or {}))


class _Cursor:
    """A read through a share: ``passes`` times over its batches, in slices of the size asked for."""

    def __init__(self, share: Share, passes: int) -> None:
        self.version = share.version
        self._batches = share.batches(passes)
        self._left: pa.RecordBatch | None = None
        self.done = False

    def close(self) -> None:
        """The read ends here: its file is closed, the part of a batch it kept is dropped."""
        self._batches.close()  # the generator leaves its ``with``: the file closes
        self._left = None
        self.done = True

    def take(self, n: int) -> list[tuple[None, pa.RecordBatch]]:
        pieces: list[tuple[None, pa.RecordBatch]] = []
        got = 0
        while got < n:
            batch = self._left if self._left is not None else next(self._batches, None)
            self._left = None
            if batch is None:
                self.done = True
                break
            if not batch.num_rows:
                continue
            k = min(n - got, batch.num_rows)
            if k < batch.num_rows:
                self._left = batch.slice(k)
            pieces.append((None, batch.slice(0, k)))
            got += k
        return pieces


class NamedReader:
    """A ``DataFeed``'s source for a named set, shaped as the reading side of :class:`.hub.FeedHub`
    (``peek``, ``take``, ``ready``, ``drained``, ``close``, ``answer``): a bounded read (each ``as_dataset()``
    iteration) is one pass from the first row; an unbounded one (``next_batch``) reads the share ``passes`` times.

    A pass cut short (Keras' ``validation_steps``) is freed when the next pass begins (its file closed, its batch
    dropped): a read of it after that ends it.  So a reader keeps one pass open, however many epochs validate."""

    out_of_step = None

    def __init__(self, feeds: NamedFeeds, name: str) -> None:
        self._feeds, self.name = feeds, check_name(name)
        self._passes: dict[int, _Cursor] = {}
        self._last_pass = 0
        self._read: _Cursor | None = None
        self._closed = False
        self._lock = threading.Lock()  # tf.data's threads: a pass is never freed while another thread reads it

    def peek(self) -> pa.RecordBatch | None:
        share = self._feeds.share(self.name)
        if share is None:
            return None
        pieces = _Cursor(share, 1).take(1)
        if pieces:
            return pieces[0][1]
        return feed_plan.sample_row(share.sample) if share.sample else None  # no row here: the set's shape

    def ready(self, n: int, epoch: list[int] | None = None) -> bool:
        """Always False: ``as_dataset`` reads a named set a batch at a time."""
        return False

    def take(self, n: int, train_mode: bool, epoch: list[int] | None = None) -> list[tuple[None, pa.RecordBatch]]:
        if self._closed and epoch is None:
            return []
        share = self._feeds.share(self.name)
        if share is None:
            return []
        with self._lock:
            if epoch is None:
                if self._read is None or (self._read.done and self._read.version != share.version):
                    if self._read is not None:
                        self._read.close()
                    self._read = _Cursor(share, share.passes)
                return self._read.take(n)
            if not epoch[0]:
                self._last_pass += 1
                epoch[0] = self._last_pass
                self._free_passes()
                self._passes[epoch[0]] = _Cursor(share, 1)
            cursor = self._passes.get(epoch[0])
            pieces = cursor.take(n) if cursor is not None else []
            if not pieces and cursor is not None:
                self._passes.pop(epoch[0]).close()
            return pieces

    def _free_passes(self) -> None:
        """Every pass begun so far ends (lock held)."""
        for cursor in self._passes.values():
            cursor.close()
        self._passes.clear()

    def drained(self) -> bool:
        return self._closed or (self._read is not None and self._read.done)

    def close(self, error: str | None = None) -> None:
        """``terminate()``: sequential reads end, their file closed (nothing is fed to answer; the set stays for
        ``as_dataset()``, whose passes read on)."""
        with self._lock:
            self._closed = True
            if self._read is not None:
                self._read.close()

    def answer(self, results: Any) -> None:
        raise ValueError(f"batch_results(): the feed {self.name!r} is a set to read; results answer inference "
                         "rows (cluster.inference(), the 'input' feed)")
