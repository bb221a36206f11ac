"""Where a node's training time goes: waiting for input, computing, waiting on its peers, and the rest.

The node keeps running totals (:class:`StepClock`; two clock reads a step and one per feed wait), sent with its
progress reports once training began:

- ``wall``: seconds since the first step began;
- ``step``: seconds inside steps (Keras' ``on_train_batch_begin`` to ``on_train_batch_end``);
- ``input``: seconds the data feed's reader waited on an empty queue (the feed's own wait: Spark had not sent
  the rows the step asks for yet);
- ``cpu``: CPU seconds of the node's process, every thread (TensorFlow's, the feed's decoding).

The driver turns two reports into shares of the wall time between them (:func:`shares`): **input** = the feed's
wait (at most the time in steps); **compute** = the process's CPU time (at most the rest of the time in steps);
**peers** = the rest of the time in steps, time the node neither computed nor waited for input: waiting in a
collective for a slower node (or on a device); **other** = time outside steps (callbacks, checkpoints,
evaluation, logging).  Measured by clocks, not sampled; approximate where TensorFlow computes on more threads than
it waits (CPU time past the step's time counts as compute, so a node computing on 4 threads while it waits on a
peer shows less waiting than it had).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

CATEGORIES = ("input", "compute", "peers", "other")
WINDOW_S = 5.0  # the shares the panel shows: over the last few seconds of the node's reports (as steps/s)
TOTALS = ("wall", "step", "input", "cpu")
LATE_S = 5.0  # totals this much older than the newest are a new process's (its clock began again), not late ones
#: what a share is called in one sentence ("worker:1 waits for input 62%")
PHRASES = {"input": "waits for input", "compute": "computes", "peers": "waits on peers", "other": "outside steps"}


class StepClock:
    """Running totals of one node process (see the module's doc); thread-safe, all times from ``perf_counter``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t0: float | None = None  # the first step's begin
        self._cpu0 = 0.0
        self._in_step: float | None = None
        self._step = 0.0
        self._input = 0.0
        self._paused: tuple[float, float] | None = None  # (perf_counter, process_time) when training ended

    @property
    def started(self) -> bool:
        return self._t0 is not None

    def begin(self) -> None:
        """A step begins (Keras' ``on_train_batch_begin``)."""
        now = time.perf_counter()
        with self._lock:
            if self._t0 is None:
                self._t0, self._cpu0 = now, time.process_time()
            elif self._paused is not None:  # another fit: the time between the two is not training time
                self._t0 += now - self._paused[0]
                self._cpu0 += time.process_time() - self._paused[1]
            self._paused = None
            self._in_step = now

    def end(self) -> None:
        """The step ended (Keras' ``on_train_batch_end``)."""
        now = time.perf_counter()
        with self._lock:
            if self._in_step is not None:
                self._step += now - self._in_step
                self._in_step = None

    def pause(self) -> None:
        """Training ended (Keras' ``on_train_end``): the totals stop until the next step begins, so an export or
        the function's return is not counted as time outside steps."""
        with self._lock:
            if self._t0 is not None and self._paused is None:
                self._paused = (time.perf_counter(), time.process_time())
                self._in_step = None

    def waited(self, since: float) -> None:
        """The feed's reader waited for rows from ``since`` (a ``perf_counter``) until now: the part of that wait
        inside the current step counts (a prefetching reader waiting between steps holds no step up)."""
        now = time.perf_counter()
        with self._lock:
            if self._in_step is not None:
                self._input += max(0.0, now - max(since, self._in_step))

    def totals(self) -> dict[str, float] | None:
        """``wall``, ``step``, ``input``, ``cpu`` so far (a step under way counts up to now); None before the first
        step."""
        now, cpu = time.perf_counter(), time.process_time()
        with self._lock:
            if self._t0 is None:
                return None
            if self._paused is not None:
                now, cpu = self._paused
            step = self._step + (now - self._in_step if self._in_step is not None else 0.0)
            return {"wall": now - self._t0, "step": step, "input": self._input, "cpu": cpu - self._cpu0}


#: this process's clock: the feed adds its waits, the progress callback its steps, ``ctx.report`` sends the totals
CLOCK = StepClock()


def valid(totals: object) -> dict[str, float] | None:
    """``totals`` as a report carried them, if they are four finite non-negative numbers (else None)."""
    if not isinstance(totals, Mapping):
        return None
    out = {}
    for key in TOTALS:
        value = totals.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
            return None
        out[key] = float(value)
    return out


def shares(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float] | None:
    """The four shares (fractions summing to 1) of the wall time between two totals; None without time between."""
    wall = after["wall"] - before["wall"]
    if wall <= 0:
        return None
    step = min(max(after["step"] - before["step"], 0.0), wall)
    waited = min(max(after["input"] - before["input"], 0.0), step)
    compute = min(max(after["cpu"] - before["cpu"], 0.0), step - waited)
    return {"input": waited / wall, "compute": compute / wall, "peers": (step - waited - compute) / wall,
            "other": (wall - step) / wall}


def dominant(fractions: Mapping[str, float]) -> tuple[str, float]:
    """The largest share: ``(category, fraction)`` (the first of :data:`CATEGORIES` on a tie)."""
    best = max(CATEGORIES, key=lambda c: (fractions.get(c, 0.0), -CATEGORIES.index(c)))
    return best, fractions.get(best, 0.0)


def sentence(fractions: Mapping[str, float]) -> str:
    """``waits for input 62%`` (the dominant share, as the panel and the status line say it)."""
    category, fraction = dominant(fractions)
    return f"{PHRASES[category]} {round(fraction * 100)}%"


class Window:
    """The shares over the last :data:`WINDOW_S` of one node's totals: the panel's, and each history row's."""

    def __init__(self, seconds: float = WINDOW_S) -> None:
        self.seconds = seconds
        self._points: deque[Mapping[str, float]] = deque()

    def add(self, totals: Mapping[str, float]) -> dict[str, float] | None:
        """Add a report's totals; the shares from the oldest report at least ``seconds`` back (or the first) to
        this one (None for the first report, or one with no time since)."""
        if self._points and totals["wall"] < self._points[-1]["wall"]:
            if totals["wall"] > self._points[-1]["wall"] - LATE_S:
                return None  # arrived after a newer one (a report held back behind a clock tick): nothing new
            self._points.clear()  # the node's clock started again: a relaunched process
        self._points.append(totals)
        while len(self._points) > 2 and self._points[1]["wall"] <= totals["wall"] - self.seconds:
            self._points.popleft()
        return shares(self._points[0], totals) if len(self._points) > 1 else None


def per_node(rows: Iterable[tuple[Any, ...]]) -> dict[tuple[str, int], dict[str, float]]:
    """Each node's shares from its first report to its last, by ``(role, task_index)``; ``rows`` as
    ``ClusterState.history_with_times`` gives them (the totals last)."""
    spans: dict[tuple[str, int], tuple[Mapping[str, float], Mapping[str, float]]] = {}
    for row in rows:
        key, totals = (row[0], row[1]), row[-1]
        if totals is not None:
            spans[key] = (spans[key][0] if key in spans else totals, totals)
    return {key: got for key, (first, last) in spans.items() if (got := shares(first, last)) is not None}
