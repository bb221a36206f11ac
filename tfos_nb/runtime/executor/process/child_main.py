"""The one ``main`` of the processes a :class:`~.owner.ChildOwner` starts (a node's, a parallel run's).

It reads the function blob and :class:`~..protocol.pipes.Start` from stdin, watches
the owner (stdin closing: the owner is gone, so is this process group), opens the
report pipe, calls the user's function, prints the user's traceback (from the
user's frame down), reports how it ended, and gives the exit code.  What differs
between a node and a run is a :class:`ChildRole`: what it does before the function
(context, data feed), with the owner's commands, with an error, and with the value.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import traceback
from typing import Any

from ... import step_time
from ...determinism import seeding
from ...protocol import pipes
from ..context import Reporter
from ..keras_node import epochs as keras_epochs
from ..keras_node import flavour as keras_flavour
from ..keras_node import keras3_mwms, known_length
from . import phases
from .owner import LINGER_S

# A process alive this long after its function ended says which threads keep it (well within the owner's LINGER_S).
LINGER_NOTE_S = 2.0
# Frames of these modules above the user's function only hide the cause: not printed.
OWN_MODULES = (__name__, "tfos_nb.runtime.executor.process.node", "tfos_nb.runtime.executor.process.run_task",
               "tfos_nb.magics._cellfn")


class ChildRole:
    """A child process's part: subclassed by the node and the parallel run."""

    what = "the function"  # in "cannot load <what>"

    def __init__(self, info: dict[str, Any], reporter: Reporter) -> None:
        self.info = info
        self.reporter = reporter

    def on_command(self, cmd: pipes.Frame) -> None:
        """A command from the owner (its stdin)."""

    def context(self) -> Any:
        """The function's ``ctx``; sends :class:`~..protocol.pipes.Ready` when the function is about to run."""
        raise NotImplementedError

    def call(self, fn: Any, args: Any, ctx: Any) -> Any:
        return fn(args, ctx)

    def error_of(self, exc: BaseException) -> str:
        """The one line that reports ``exc``, which the function raised."""
        return error_line(exc)

    def on_error(self, error: str) -> None:
        """The function raised ``error`` (after it was reported)."""

    def cleanup(self) -> None:
        """After the function, however it ended."""

    def on_owner_gone(self) -> None:
        """The owner is gone (its process was killed): clean up what it would have, before the group is killed."""

    def finish(self, value: Any) -> int:
        """The function returned ``value``: send :class:`~..protocol.pipes.Finished`; the exit code."""
        self.reporter.send(pipes.Finished())
        return 0


def print_user_traceback(exc: BaseException) -> None:
    """The traceback from the user's function down: our own calling frames only hide the cause."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_globals.get("__name__") in OWN_MODULES:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def error_line(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}".rstrip(": ")


def lingering_threads() -> list[str]:
    """The names of this process's live non-daemon threads but the main one: Python waits for them at exit."""
    main_thread = threading.main_thread()
    return [t.name for t in threading.enumerate() if t is not main_thread and not t.daemon and t.is_alive()]


def name_what_lingers(after_s: float = LINGER_NOTE_S) -> None:
    """Once the function has ended: should this process still be alive ``after_s`` later, print which of its
    threads keep it from exiting (the owner ends it :data:`~.owner.LINGER_S` after the function's end; the user
    reads why).  A daemon timer: a process that exits in time says nothing."""

    def note() -> None:
        names = lingering_threads()
        if names:
            print(f"tfos_nb: the function has ended, but its thread{'s' if len(names) > 1 else ''} "
                  f"{', '.join(repr(n) for n in names)} (not daemon) keep{'' if len(names) > 1 else 's'} this "
                  f"process from exiting: it is ended {LINGER_S:.0f} s after the function's end (make such threads "
                  f"daemon threads, or join them before returning)", file=sys.stderr, flush=True)

    timer = threading.Timer(after_s, note)
    timer.daemon = True
    timer.start()


def _watch_owner(fd: int, role: ChildRole) -> None:
    """The owner's commands; EOF means the owner is gone (or closed our stdin to stop us): so is this group."""
    for cmd in pipes.messages(fd, lambda exc: print(f"tfos_nb: skipped a command: {exc}", file=sys.stderr)):
        role.on_command(cmd)
    try:
        role.on_owner_gone()
    finally:
        os.killpg(os.getpgid(0), signal.SIGKILL)


def main(role_cls: type[ChildRole]) -> int:
    stacks = phases.install_stack_dump()  # first: a stack is asked for once the first Phase says so
    # A crash in native code (SIGSEGV, SIGABRT, SIGBUS…) prints where each Python thread was to the output the
    # driver shows with the node's error, which otherwise ends at the last line printed before the crash.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    import cloudpickle

    stdin = os.fdopen(os.dup(0), "rb", buffering=0)  # unbuffered: the commands after Start stay in the pipe
    blob = pipes.read_blob(stdin)
    start = pipes.read(stdin, pipes.Start)
    assert isinstance(start, pipes.Start)
    stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - user code must not read the owner's pipe
    reporter = Reporter(os.fdopen(int(os.environ["TFOS_REPORT_FD"]), "w", buffering=1))

    def send_phase(phase: str, moved_at: float, where: str) -> None:  # with the step clock: a stuck step shows too
        reporter.send(pipes.Phase(phase=phase, moved_at=moved_at, where=where, stacks=stacks,
                                  times=step_time.CLOCK.totals() or {}))

    watcher = phases.PhaseWatcher(send_phase)
    reporter.on_step = watcher.stepped
    watcher.start()
    role = role_cls(start.info, reporter)
    threading.Thread(target=_watch_owner, args=(0, role), name="tfos-owner", daemon=True).start()
    flavour = keras_flavour.problem()  # before the function (or its unpickling) reaches tf.keras
    if flavour is not None:
        print(f"tfos_nb: {flavour}", file=sys.stderr, flush=True)
        reporter.send(pipes.Failed(error=flavour))
        return 1
    try:
        fn, args = cloudpickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - reported to the driver as the child's error
        traceback.print_exc()
        reporter.send(pipes.Failed(error=f"cannot load {role.what}: {type(exc).__name__}: {exc}"))
        return 1
    ctx = role.context()
    from ..tracking.node import setup as mlflow_setup

    mlflow_setup(ctx)  # ctx.mlflow_run_id; MLflow autologging off on all but the chief
    keras3_mwms.install()  # Keras 3's fit under MultiWorkerMirroredStrategy, repaired once it is imported
    keras_epochs.install()  # every fed epoch as long as its data, in either Keras
    known_length.install()  # a counted feed's epochs end together on every node: no per-step has-data check
    seeding.apply()  # the job's seed and deterministic mode, before the function
    value = None
    try:
        watcher.function_runs()
        value = role.call(fn, args, ctx)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from user code is an error too
        if not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            print_user_traceback(exc)
            sys.stderr.flush()
            error = role.error_of(exc)
            reporter.send(pipes.Failed(error=error))
            role.on_error(error)
            return 1
    finally:
        watcher.set(phases.FINISHING)
        watcher.stop()
        reporter.flush()
        role.cleanup()
        name_what_lingers()
    sys.stdout.flush()
    sys.stderr.flush()
    return role.finish(value)
