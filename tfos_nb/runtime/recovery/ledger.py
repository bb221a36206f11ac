"""A job's backup folder: the chief's backups, each fed node's element log, and what a resumed attempt feeds.

Files (one folder per job, made ``0700`` by the driver; a POSIX path every node can reach):

``weights-<seq>.npz``
    the chief's model and optimizer values at backup ``seq`` (numpy arrays; loaded without pickle);
``state-<seq>.json``
    what backup ``seq`` is (:class:`Backup`), renamed into place after its weights: a backup exists once its
    state file does;
``elements-a<A>-<node>.jsonl``
    a fed node's element log in attempt ``A``: a line for each element (batch) its ``as_dataset`` yielded — the
    epoch's generation, the element's index in it, its rows as ``[partition, start, end]`` spans of the
    partition's row offsets — written and flushed *before* TensorFlow gets the element, so whatever was trained
    is in it; a line at the end of the node's share of a generation; a line when the node read in a way the
    ledger cannot follow (``next_batch``, ``cache``, ``shuffle``);
``attempt-<A>.json``
    the driver's: the epoch attempt ``A`` started at, and which rows of it that attempt did not feed again.

The rule that makes the log a ledger: under a synchronous strategy, ``tf.distribute`` splits each element a
node's dataset yields into ``num_replicas_in_sync`` pieces and the node's replicas take their pieces in one
step, so a node takes one element every ``steps_per_element`` (= replicas in sync / local replicas) steps.
After ``s`` steps of an epoch (``s`` a multiple of it) every node had trained on exactly its first
``s // steps_per_element`` elements of that epoch, or on its whole share when it had fewer: the chief's
backup at that step and the nodes' logs say which rows, and the next attempt feeds that epoch without them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..private import write_atomic

#: set by the driver on every node of a job with retries: its backup folder
ENV_DIR = "TFOS_BACKUP_DIR"
#: set by the driver on the nodes of a resumed attempt: the backup they restore (absent: none)
ENV_SEQ = "TFOS_BACKUP_SEQ"
#: backups kept in the folder (the newest); older ones are removed as new ones land
KEEP = 3

Range = tuple[int, int]  # [start, end) row offsets of a partition, as Spark computes the partition


def merge(ranges: Iterable[Sequence[int]]) -> list[Range]:
    """``ranges`` sorted, with overlapping and adjacent ones joined."""
    out: list[list[int]] = []
    for a, b in sorted((int(r[0]), int(r[1])) for r in ranges if int(r[1]) > int(r[0])):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _kept(skip: Sequence[Range]) -> Iterator[Range]:
    """The offset ranges a partition fed without ``skip`` (merged) sends, in order; the last is open-ended."""
    at = 0
    for a, b in skip:
        if a > at:
            yield at, a
        at = max(at, b)
    yield at, 1 << 62


def original(skip: Sequence[Range], start: int, end: int) -> list[Range]:
    """Rows ``start``..``end`` of a partition as fed without ``skip`` (the i-th row sent is the i-th row kept),
    as ranges of the partition's own row offsets."""
    out: list[Range] = []
    pos = 0
    for a, b in _kept(skip):
        lo, hi = max(start, pos), min(end, pos + (b - a))
        if lo < hi:
            out.append((a + lo - pos, a + hi - pos))
        pos += b - a
        if pos >= end:
            break
    return out


def kept_slices(skip: Sequence[Range], offset: int, n: int) -> list[Range]:
    """Within ``n`` rows at the partition's offsets ``offset``..``offset + n``: the ``(start, length)`` slices
    (relative to ``offset``) that are not in ``skip`` — what a feeding task sends of one batch."""
    out: list[Range] = []
    for a, b in _kept(skip):
        lo, hi = max(a, offset), min(b, offset + n)
        if lo < hi:
            out.append((lo - offset, hi - lo))
        if b >= offset + n:
            break
    return out


@dataclasses.dataclass(frozen=True)
class Backup:
    """One backup the chief took: at ``steps`` steps into Keras epoch ``epoch`` (0-based) of attempt ``attempt``,
    or at that epoch's end (``epoch_end``)."""

    seq: int
    attempt: int
    epoch: int
    steps: int
    global_step: int
    epoch_end: bool
    steps_per_element: int  # 0: unknown (the ledger cannot say which rows; only an epoch's end counts)
    saved_s: float  # how long the save took

    @property
    def where(self) -> str:
        """Where training resumes from it, for messages: ``"epoch 2, step 14 (global step 74)"``."""
        if self.epoch_end:
            return f"the start of epoch {self.epoch + 2} (global step {self.global_step})"
        return f"epoch {self.epoch + 1}, step {self.steps} (global step {self.global_step})"


def weights_path(folder: str, seq: int) -> str:
    return os.path.join(folder, f"weights-{seq}.npz")


def _state_path(folder: str, seq: int) -> str:
    return os.path.join(folder, f"state-{seq}.json")


def write_json(path: str, body: Mapping[str, Any]) -> None:
    """``body`` as ``path``, whole or not at all (:func:`..private.write_atomic`)."""
    write_atomic(path, json.dumps(body))


def commit(folder: str, backup: Backup) -> None:
    """Make ``backup`` (its weights already in place) the newest; remove backups older than the last :data:`KEEP`."""
    write_json(_state_path(folder, backup.seq), dataclasses.asdict(backup))
    for old in backups(folder)[KEEP:]:
        for path in (_state_path(folder, old.seq), weights_path(folder, old.seq)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def backups(folder: str) -> list[Backup]:
    """The backups in ``folder``, newest first."""
    found = []
    for name in os.listdir(folder):
        match = re.fullmatch(r"state-(\d+)\.json", name)
        if match:
            with open(os.path.join(folder, name)) as f:
                found.append(Backup(**json.load(f)))
    return sorted(found, key=lambda b: b.seq, reverse=True)


def backup(folder: str, seq: int) -> Backup:
    with open(_state_path(folder, seq)) as f:
        return Backup(**json.load(f))


class ElementLog:
    """A fed node's element log for one attempt (the node's side of the ledger)."""

    def __init__(self, folder: str, attempt: int, label: str) -> None:
        name = re.sub(r"[^A-Za-z0-9]", "", label)
        self.path = os.path.join(folder, f"elements-a{attempt}-{name}.jsonl")
        self._file: Any = None
        self.inexact: str | None = None

    def _write(self, body: Mapping[str, Any]) -> None:
        if self._file is None:
            self._file = open(self.path, "a")  # noqa: SIM115 - open for the process's life, flushed per line
        self._file.write(json.dumps(body, separators=(",", ":")) + "\n")
        self._file.flush()  # in the OS's hands before TensorFlow has the element: a killed process loses nothing

    def element(self, gen: int, index: int, spans: Sequence[tuple[int, int, int]]) -> None:
        self._write({"g": gen, "i": index, "s": [list(s) for s in spans]})

    def end(self, gen: int, count: int) -> None:
        self._write({"g": gen, "end": count})

    def cannot_follow(self, why: str) -> None:
        """The node reads in a way the ledger cannot follow: no backup inside an epoch counts (once said)."""
        if self.inexact is None:
            self.inexact = why
            self._write({"inexact": why})


@dataclasses.dataclass
class _NodeLog:
    elements: dict[int, list[list[list[int]]]] = dataclasses.field(default_factory=dict)  # gen -> elements' spans
    ends: dict[int, int] = dataclasses.field(default_factory=dict)
    inexact: str | None = None


def _read_logs(folder: str, attempt: int) -> dict[str, _NodeLog]:
    logs: dict[str, _NodeLog] = {}
    for name in os.listdir(folder):
        match = re.fullmatch(rf"elements-a{attempt}-(\w+)\.jsonl", name)
        if not match:
            continue
        log = logs.setdefault(match.group(1), _NodeLog())
        with open(os.path.join(folder, name)) as f:
            for line in f:
                try:
                    body = json.loads(line)
                except ValueError:  # a line cut by the kill: it was never handed to TensorFlow
                    break
                if "inexact" in body:
                    log.inexact = str(body["inexact"])
                elif "end" in body:
                    log.ends[int(body["g"])] = int(body["end"])
                else:
                    elements = log.elements.setdefault(int(body["g"]), [])
                    if int(body["i"]) != len(elements):
                        break  # not in order: trust nothing after it
                    elements.append(body["s"])
    return logs


@dataclasses.dataclass(frozen=True)
class Start:
    """How an attempt began: at Keras epoch ``epoch``, that epoch fed without ``skip`` (partition -> ranges)."""

    attempt: int
    epoch: int
    skip: Mapping[int, Sequence[Range]]
    seq: int = 0  # the backup it restored (0: none)

    def save(self, folder: str) -> None:
        write_json(os.path.join(folder, f"attempt-{self.attempt}.json"),
                   {"attempt": self.attempt, "epoch": self.epoch, "seq": self.seq,
                    "skip": {str(p): [list(r) for r in rs] for p, rs in self.skip.items()}})

    @classmethod
    def load(cls, folder: str, attempt: int) -> Start:
        path = os.path.join(folder, f"attempt-{attempt}.json")
        if not os.path.exists(path):
            return cls(attempt, 0, {})
        with open(path) as f:
            body = json.load(f)
        return cls(attempt, int(body["epoch"]), {int(p): [(int(a), int(b)) for a, b in rs]
                                                 for p, rs in body["skip"].items()}, int(body.get("seq", 0)))


def trained(folder: str, b: Backup) -> dict[int, list[Range]] | None:
    """The rows of epoch ``b.epoch`` the model of backup ``b`` had trained on (partition -> ranges), or None when
    the ledger cannot say (a node read in a way it cannot follow, a log short of the backup's step)."""
    if not b.steps_per_element or b.steps % b.steps_per_element:
        return None
    start = Start.load(folder, b.attempt)
    gen = b.epoch - start.epoch + 1  # the attempt's first train() epoch is its generation 1
    if gen < 1:
        return None
    k = b.steps // b.steps_per_element
    rows: dict[int, list[Range]] = {p: list(rs) for p, rs in start.skip.items()} if gen == 1 else {}
    logs = _read_logs(folder, b.attempt)
    if not logs or any(log.inexact for log in logs.values()):
        return None
    for log in logs.values():
        elements = log.elements.get(gen, [])
        if len(elements) < k and log.ends.get(gen) != len(elements):
            return None  # the node trained elements its log does not have
        for spans in elements[:k]:
            for p, a, e in spans:
                rows.setdefault(int(p), []).append((int(a), int(e)))
    return {p: merge(rs) for p, rs in rows.items()}


@dataclasses.dataclass(frozen=True)
class Resume:
    """What an attempt restores and feeds: ``backup`` (None: start afresh), the Keras epoch training resumes at,
    and the rows of that epoch not fed again."""

    backup: Backup | None
    epoch: int
    skip: Mapping[int, Sequence[Range]]

    def epochs_to_feed(self, num_epochs: int) -> int:
        """Of a job that feeds ``num_epochs`` epochs, how many this attempt feeds: those from :attr:`epoch` on —
        at least one (a dataset cached from one fed epoch must be filled again)."""
        return max(1, num_epochs - self.epoch)

    @property
    def rows_skipped(self) -> int:
        return sum(b - a for rs in self.skip.values() for a, b in rs)


def plan(folder: str) -> Resume:
    """The newest backup in ``folder`` that training can resume from exactly: one taken at an epoch's end, or inside
    an epoch where the ledger says which rows it had trained on."""
    for b in backups(folder):
        if b.epoch_end:
            return Resume(b, b.epoch + 1, {})
        rows = trained(folder, b)
        if rows is not None:
            return Resume(b, b.epoch, rows)
    return Resume(None, 0, {})
