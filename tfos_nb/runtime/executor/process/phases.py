"""Where a node is in its lifecycle, seen from inside its process, and its threads' stacks on demand.

The phases a node goes through, in order (the driver knows the first three itself: its
supervisor has not registered, is waiting for the cluster spec, or its process is starting):

* ``importing TensorFlow``: the main thread is inside an ``import`` of ``tensorflow``/``keras``/
  ``tf_keras`` (the function's own ``import``, or unpickling a function that refers to them);
* ``building the strategy``: inside a ``tf.distribute`` strategy's constructor
  (``MultiWorkerMirroredStrategy()`` waits there, in a first collective, for every worker to create its own);
* ``running``: in the node function, none of the others;
* ``first step``: in Keras' ``fit`` or a strategy's ``run``/``reduce`` before the function reported a step
  (``ctx.progress_callback()`` or ``ctx.report(step=...)``): under MultiWorkerMirroredStrategy the first
  step is the first collective every worker must reach;
* ``training``: a step was reported;
* ``waiting for data``: a thread has waited for the data feed (``InputMode.SPARK``) for more than a second;
* ``exporting``: inside a Keras/TensorFlow ``save``/``export``/``saved_model`` call;
* ``finishing``: the node function returned (the process ends, or lingers in TensorFlow's exit).

Nothing is instrumented: :class:`PhaseWatcher` samples the threads' frames four times a second
(``sys._current_frames``, a few microseconds) and classifies them by the code they are in.  It also
notes when the main thread last *moved* (its stack, line numbers included, changed; a step was
reported; the phase changed), so that the driver can tell a node blocked in one place (a collective
nobody else joined) from one that works without reporting steps.  It sends its phase at least every
:data:`TICK_S`: TensorFlow's C++ calls hold the GIL (``MultiWorkerMirroredStrategy()`` for as long as its first
collective waits), so that no thread of the process runs, the watcher neither; its owner tells that by the
silence and reads the phase from a stack dump instead (:func:`dump_phase`, :meth:`.owner.ChildOwner.read_frozen_phase`).

Stacks on demand: :func:`install_stack_dump` registers :mod:`faulthandler` on :data:`STACK_SIGNAL`
with an anonymous file the owner created and passed down (see :class:`~.owner.ChildOwner`): the
owner signals the process and reads what was appended.  faulthandler writes from the signal
handler itself, without the GIL, so even a process stuck in C code holding it answers.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

STACK_SIGNAL = signal.SIGUSR2
STACKS_FD_ENV = "TFOS_STACKS_FD"

# Phases, in the order a healthy node reaches them (``rank``); the last three can come at any time.
REGISTERING = "registering"
WAITING_FOR_SPEC = "waiting for the cluster spec"
STARTING = "starting the node process"
IMPORTING = "importing TensorFlow"
RUNNING = "running the node function"
STRATEGY = "building the strategy"
FIRST_STEP = "first step"
TRAINING = "training"
WAITING_FOR_DATA = "waiting for data"
EXPORTING = "exporting"
FINISHING = "finishing"
ORDER = (REGISTERING, WAITING_FOR_SPEC, STARTING, IMPORTING, RUNNING, STRATEGY, FIRST_STEP, TRAINING)
PHASES = (*ORDER, WAITING_FOR_DATA, EXPORTING, FINISHING)

SAMPLE_S = 0.25
TICK_S = 1.0  # the watcher sends its phase at least this often: silence longer than FROZEN_S means a frozen process
FROZEN_S = 2.5  # no Phase frame for this long: the process's Python is frozen (C code holding the GIL)
DATA_WAIT_S = 1.0  # a wait for data shorter than this is a healthy pipeline's, not a phase

_TF_DIRS = (f"{os.sep}tensorflow{os.sep}", f"{os.sep}keras{os.sep}", f"{os.sep}tf_keras{os.sep}")
_IMPORT = ("_find_and_load", "_handle_fromlist")
_EXPORT = ("save", "export", "save_model", "save_weights", "_save")
_STEPPING = ("fit", "train_on_batch")
_STRATEGY_STEPS = ("run", "reduce", "gather", "experimental_run_v2")
_FEED = f"feed{os.sep}hub.py"


def rank(phase: str | None) -> int | None:
    """Where ``phase`` is in :data:`ORDER` (None for the phases that can come at any time, or none)."""
    return ORDER.index(phase) if phase in ORDER else None


def _is_tf(filename: str) -> bool:
    return any(d in filename for d in _TF_DIRS)


Frame = tuple[str, str]  # (file name, function name)


def classify(main: Sequence[Frame], stepped: bool, default: str = RUNNING) -> str:
    """The phase of a main thread whose frames are ``main`` (outermost first); ``stepped``: a step was reported;
    ``default``: the phase when no frame says otherwise."""
    for i, (filename, name) in enumerate(main):
        if name in _IMPORT and filename.startswith("<frozen importlib"):
            if any(_is_tf(f) for f, _ in main[i + 1:]):
                return IMPORTING
            continue
        if not _is_tf(filename):
            continue
        inner = main[i:]
        if any(n == "__init__" and f"distribute{os.sep}" in f and "strategy" in f for f, n in inner):
            return STRATEGY
        if any(n in _EXPORT and ("saving" in f or "saved_model" in f or n == "export") for f, n in inner):
            return EXPORTING
        if any(n in _STEPPING for _, n in inner) or (
                name in _STRATEGY_STEPS and f"distribute{os.sep}" in filename):
            return TRAINING if stepped else FIRST_STEP
        break  # the outermost TensorFlow call is none of the above
    return TRAINING if stepped else default


_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+")
_FILE = re.compile(r'^\s+File "(.*)", line (?:\d+|\?+) in (.*)$')


def dump_threads(text: str) -> list[list[Frame]]:
    """The threads of a :mod:`faulthandler` dump, each as its frames outermost first."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif threads and (hit := _FILE.match(line)):
            threads[-1].insert(0, (hit.group(1), hit.group(2)))
    return threads


def dump_phase(text: str, last: str | None) -> str | None:
    """The phase of the main thread in a faulthandler dump of a process whose watcher cannot run (its main
    thread holds the GIL in C code, e.g. in ``MultiWorkerMirroredStrategy()``'s first collective); ``last``: the
    phase it sent last.  The main thread is the one not started by :mod:`threading`; None: no such thread."""
    main = [t for t in dump_threads(text) if t and not t[0][0].endswith(f"{os.sep}threading.py")]
    if not main:
        return None
    return classify(main[0], stepped=last == TRAINING, default=RUNNING)


def waits_for_data(frames: Sequence[Frame]) -> bool:
    """Whether a thread with these frames (outermost first) waits in the data feed for a batch."""
    return any(f.endswith(_FEED) and n in ("take", "peek") for f, n in frames) and bool(frames) and \
        frames[-1][1] == "wait"


def _frames(frame: Any) -> list[Frame]:
    out: list[Frame] = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    out.reverse()
    return out


_LIBRARY = (*_TF_DIRS, f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}",
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,  # tfos_nb's own
            os.path.dirname(os.__file__) + os.sep)  # the standard library


def where(frame: Any) -> str:
    """The main thread's innermost frame in the user's own code, ``function (file:line)``, when that frame is
    the innermost of all but library calls under it (e.g. a Keras callback sleeping or waiting on something);
    "" when the thread is inside TensorFlow or Keras (a step, a save), which the phase already says."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<frozen") and not any(d in filename for d in _LIBRARY):
            return f"{frame.f_code.co_name} ({os.path.basename(filename)}:{frame.f_lineno})"
        if _is_tf(filename):
            return ""
        frame = frame.f_back
    return ""


def _fingerprint(frame: Any) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    while frame is not None:
        out.append((id(frame.f_code), frame.f_lineno))
        frame = frame.f_back
    return tuple(out)


class PhaseWatcher:
    """Samples this process's threads and sends ``send(phase, moved_at, where)`` when the phase changes, and at
    least every :data:`TICK_S` (its owner tells a frozen process by the silence); ``moved_at`` is a ``time.time()``,
    ``where`` the main thread's place in the user's code (:func:`where`)."""

    def __init__(self, send: Callable[[str, float, str], None], sample_s: float = SAMPLE_S,
                 thread: int | None = None) -> None:
        self._send = send
        self._sample_s = sample_s
        self._main = threading.main_thread().ident if thread is None else thread  # the thread running the function
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sampling = threading.Lock()  # the sampling thread and the process's own set() calls
        self._fixed: str | None = None  # set by the process itself (finishing): no sampling needed
        self._default = STARTING  # what no frame explains: starting, until the function runs
        self._stepped = False
        self.phase: str | None = None
        self.moved_at = time.time()
        self._sent_at = 0.0
        self._print: tuple[tuple[int, int], ...] = ()
        self._data_wait_since: float | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> PhaseWatcher:
        self._thread = threading.Thread(target=self._loop, name="tfos-phases", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def set(self, phase: str | None) -> None:
        """Fix the phase (``None``: back to sampling), and report it now."""
        with self._lock:
            self._fixed = phase
        self.sample()

    def function_runs(self) -> None:
        """The node function was called: what no frame explains is "running" now."""
        with self._lock:
            self._default = RUNNING
        self.sample()

    def stepped(self, step: Any) -> None:
        """The function reported progress: it moves; past step 0 (Keras reports 0 as training begins), it trains.

        The move to training is reported at once, not at the next sample: a training shorter than a
        sampling interval is seen too."""
        with self._lock:
            began = isinstance(step, int) and step > 0 and not self._stepped
            if began:
                self._stepped = True
            self.moved_at = time.time()
        if began:
            self.sample()

    def sample(self) -> None:
        with self._sampling:
            self._sample()

    def _sample(self) -> None:
        now = time.time()
        frames = sys._current_frames()  # the documented way to see other threads' stacks
        try:
            main = frames.get(self._main) if self._main is not None else None
            waiting = any(waits_for_data(_frames(f)) for ident, f in frames.items() if ident != threading.get_ident())
        finally:
            # the dict holds this frame too: a cycle that kept every thread's frame, and the data in its locals
            # (a finished connection's last batch), alive until the cyclic collector ran
            del frames
        with self._lock:
            fixed, stepped, default = self._fixed, self._stepped, self._default
        if waiting:
            self._data_wait_since = self._data_wait_since or now
        else:
            self._data_wait_since = None
        if fixed is not None:
            phase = fixed
        elif self._data_wait_since is not None and now - self._data_wait_since >= DATA_WAIT_S:
            phase = WAITING_FOR_DATA
        else:
            phase = classify(_frames(main), stepped, default) if main is not None else default
        fingerprint = _fingerprint(main) if main is not None else ()
        place = where(main) if main is not None and fixed is None else ""
        del main
        with self._lock:
            if fingerprint != self._print:
                self._print = fingerprint
                self.moved_at = now
            changed = phase != self.phase
            if changed:
                self.phase = phase
                self.moved_at = now
            moved = self.moved_at
        if changed or now - self._sent_at >= TICK_S:
            self._sent_at = now
            self._send(phase, moved, place)

    def _loop(self) -> None:
        while not self._stop.wait(self._sample_s):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a view of the process must never end it
                continue


def install_stack_dump() -> bool:
    """Dump every thread's stack into the owner's file on :data:`STACK_SIGNAL` (False: no file was passed)."""
    import faulthandler

    raw = os.environ.pop(STACKS_FD_ENV, None)
    if not raw:
        return False
    fd = int(raw)
    os.set_inheritable(fd, False)  # the node's own children (TensorBoard, user processes) do not get it
    faulthandler.register(STACK_SIGNAL, file=fd, all_threads=True, chain=False)
    return True
