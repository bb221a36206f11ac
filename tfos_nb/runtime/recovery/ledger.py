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

Every use of the folder, the driver's and each node's, goes through :mod:`.files` (the folder checked, its files
never opened through a link); a file that is not what tfos_nb wrote is one ValueError naming it.

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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import IO, Any

from . import files

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


def _weights(seq: int) -> str:
    return f"weights-{seq}.npz"


def _state(seq: int) -> str:
    return f"state-{seq}.json"


def save_weights(folder: str, seq: int, write: Callable[[IO[bytes]], Any]) -> None:
    """Backup ``seq``'s weights, which ``write`` writes to the file it is given, in place (whole or not at all);
    the backup exists once :func:`commit` says so."""
    with files.opened(folder) as dir_fd:
        files.write_atomic(folder, dir_fd, _weights(seq), write)


@contextmanager
def open_weights(folder: str, seq: int) -> Iterator[IO[bytes]]:
    """Backup ``seq``'s weights, to read."""
    with files.opened(folder) as dir_fd:
        try:
            fd = files.open_file(folder, dir_fd, _weights(seq), os.O_RDONLY)
        except FileNotFoundError:
            raise files.refused(folder, f"lacks {_weights(seq)}, the weights of backup {seq}") from None
    with os.fdopen(fd, "rb") as f:
        yield f


def commit(folder: str, backup: Backup) -> None:
    """Make ``backup`` (its weights already in place) the newest; remove backups older than the last :data:`KEEP`."""
    body = json.dumps(dataclasses.asdict(backup)).encode()
    with files.opened(folder) as dir_fd:
        files.write_atomic(folder, dir_fd, _state(backup.seq), lambda f: f.write(body))
        for old in _backups(folder, dir_fd)[KEEP:]:
            for name in (_state(old.seq), _weights(old.seq)):
                with suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dir_fd)


def backups(folder: str) -> list[Backup]:
    """The backups in ``folder``, newest first."""
    with files.opened(folder) as dir_fd:
        return _backups(folder, dir_fd)


def _backups(folder: str, dir_fd: int) -> list[Backup]:
    found = [_load_backup(folder, dir_fd, int(m.group(1)))
             for m in (re.fullmatch(r"state-(\d+)\.json", name) for name in os.listdir(dir_fd)) if m]
    return sorted(found, key=lambda b: b.seq, reverse=True)


def backup(folder: str, seq: int) -> Backup:
    with files.opened(folder) as dir_fd:
        return _load_backup(folder, dir_fd, seq)


_COUNTS = ("seq", "attempt", "epoch", "steps", "global_step", "steps_per_element")


def _load_backup(folder: str, dir_fd: int, seq: int) -> Backup:
    """Backup ``seq``'s state file, decoded strictly (unknown keys aside): one :func:`.files.refused` error otherwise."""
    try:
        text = files.read(folder, dir_fd, _state(seq))
    except FileNotFoundError:
        raise files.refused(folder, f"lacks {_state(seq)}, the state of backup {seq}") from None
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        why = "it is not a JSON object"
    elif bad := [k for k in _COUNTS if type(body.get(k)) is not int or body[k] < 0]:
        why = f"its {bad[0]} is {body.get(bad[0])!r}, not a count"
    elif type(body.get("epoch_end")) is not bool or type(body.get("saved_s")) not in (int, float):
        why = "its epoch_end or saved_s is missing or of another type"
    elif body["seq"] != seq:
        why = f"it says backup {body['seq']}"
    else:
        return Backup(**{k: body[k] for k in _COUNTS}, epoch_end=body["epoch_end"], saved_s=float(body["saved_s"]))
    raise files.refused(folder, f"holds {_state(seq)}, which is not a backup's state ({why})")


class ElementLog:
    """A fed node's element log for one attempt (the node's side of the ledger)."""

    def __init__(self, folder: str, attempt: int, label: str) -> None:
        files.check_folder(folder)  # a folder replaced since the driver made it is said when the feed is made
        self.folder, self.name = folder, f"elements-a{attempt}-{re.sub(r'[^A-Za-z0-9]', '', label)}.jsonl"
        self.path = os.path.join(folder, self.name)
        self._file: Any = None
        self.inexact: str | None = None

    def _write(self, body: Mapping[str, Any]) -> None:
        if self._file is None:  # open for the process's life, flushed per line
            with files.opened(self.folder) as dir_fd:
                fd = files.open_file(self.folder, dir_fd, self.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            self._file = os.fdopen(fd, "a", encoding="utf-8")
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


def _log_line(line: str) -> dict[str, Any] | None:
    """A line of an element log as :class:`ElementLog` writes it; None for anything else (a line cut by the kill:
    it was never handed to TensorFlow)."""
    try:
        body = json.loads(line)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if "inexact" in body:
        return body
    if type(body.get("g")) is not int:
        return None
    if "end" in body:
        return body if type(body["end"]) is int else None
    spans = body.get("s")
    whole = type(body.get("i")) is int and isinstance(spans, list) and all(
        isinstance(s, list) and len(s) == 3 and all(type(v) is int for v in s) for s in spans)
    return body if whole else None


def _read_logs(folder: str, attempt: int) -> dict[str, _NodeLog]:
    logs: dict[str, _NodeLog] = {}
    with files.opened(folder) as dir_fd:
        for name in os.listdir(dir_fd):
            match = re.fullmatch(rf"elements-a{attempt}-(\w+)\.jsonl", name)
            if not match:
                continue
            log = logs.setdefault(match.group(1), _NodeLog())
            fd = files.open_file(folder, dir_fd, name, os.O_RDONLY)
            with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
                for line in f:
                    body = _log_line(line)
                    if body is None:  # trust nothing after it
                        break
                    if "inexact" in body:
                        log.inexact = str(body["inexact"])
                    elif "end" in body:
                        log.ends[body["g"]] = body["end"]
                    else:
                        elements = log.elements.setdefault(body["g"], [])
                        if body["i"] != len(elements):
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
        body = json.dumps({"attempt": self.attempt, "epoch": self.epoch, "seq": self.seq,
                           "skip": {str(p): [list(r) for r in rs] for p, rs in self.skip.items()}}).encode()
        with files.opened(folder) as dir_fd:
            files.write_atomic(folder, dir_fd, f"attempt-{self.attempt}.json", lambda f: f.write(body))

    @classmethod
    def load(cls, folder: str, attempt: int) -> Start:
        name = f"attempt-{attempt}.json"
        with files.opened(folder) as dir_fd:
            try:
                text = files.read(folder, dir_fd, name)
            except FileNotFoundError:
                return cls(attempt, 0, {})
        try:
            body = json.loads(text)
            skip = {int(p): [(int(a), int(b)) for a, b in rs] for p, rs in body["skip"].items()}
            return cls(attempt, int(body["epoch"]), skip, int(body.get("seq", 0)))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            raise files.refused(folder, f"holds {name}, which is not an attempt's start ({why})") from None


def resume_epoch(folder: str, attempt: int, b: Backup) -> int:
    """The Keras epoch a node of attempt ``attempt`` restoring backup ``b`` starts at: the one the driver planned
    and feeds (:func:`plan`, in the attempt's :class:`Start`), else the one after ``b`` if ``b`` is an epoch's end."""
    start = Start.load(folder, attempt)
    if start.seq == b.seq:
        return start.epoch
    return b.epoch + 1 if b.epoch_end else b.epoch


def trained(folder: str, b: Backup) -> tuple[dict[int, list[Range]], bool] | None:
    """The rows of epoch ``b.epoch`` the model of backup ``b`` had trained on (partition -> ranges), and whether
    they are the whole epoch (every node's log ended its share, each share all trained: the backup came after the
    epoch's last step); None when the ledger cannot say (a node read in a way it cannot follow, a log short of the
    backup's step)."""
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
    whole = True
    for log in logs.values():
        elements = log.elements.get(gen, [])
        if len(elements) < k and log.ends.get(gen) != len(elements):
            return None  # the node trained elements its log does not have
        # under a synchronous strategy every node steps every step: each fed node has a log once one was taken
        whole = whole and log.ends.get(gen) == len(elements) <= k
        for spans in elements[:k]:
            for p, a, e in spans:
                rows.setdefault(int(p), []).append((int(a), int(e)))
    return {p: merge(rs) for p, rs in rows.items()}, whole


@dataclasses.dataclass(frozen=True)
class Resume:
    """What an attempt restores and feeds: ``backup`` (None: start afresh), the Keras epoch training resumes at,
    and the rows of that epoch not fed again."""

    backup: Backup | None
    epoch: int
    skip: Mapping[int, Sequence[Range]]

    @property
    def whole_epoch(self) -> bool:
        """Whether the backup came inside an epoch but after its last step (a node lost before the epoch's end):
        training resumes at the next epoch, as from that epoch's end."""
        return self.backup is not None and not self.backup.epoch_end and self.epoch > self.backup.epoch

    def epochs_to_feed(self, num_epochs: int) -> int:
        """Of a job that feeds ``num_epochs`` epochs, how many this attempt feeds: those from :attr:`epoch` on —
        at least one (a dataset cached from one fed epoch must be filled again)."""
        return max(1, num_epochs - self.epoch)

    @property
    def rows_skipped(self) -> int:
        return sum(b - a for rs in self.skip.values() for a, b in rs)


def plan(folder: str) -> Resume:
    """The newest backup in ``folder`` that training can resume from exactly: one taken at an epoch's end, or inside
    an epoch where the ledger says which rows it had trained on — all of them (taken after the epoch's last step,
    its end lost with a node): the next epoch, as from its end, not that epoch fed with no row."""
    for b in backups(folder):
        if b.epoch_end:
            return Resume(b, b.epoch + 1, {})
        known = trained(folder, b)
        if known is not None:
            rows, whole = known
            return Resume(b, b.epoch + 1, {}) if whole else Resume(b, b.epoch, rows)
    return Resume(None, 0, {})
