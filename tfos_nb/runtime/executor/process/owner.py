"""The owner of one child process on an executor: a node's TensorFlow process or a parallel run's process.

A :class:`ChildOwner` starts the child (``python -m tfos_nb.runtime node|run``) in a
session of its own with the function blob and a :class:`~..protocol.pipes.Start` on
its stdin, captures its output (a tail for errors, batches of lines for heartbeats),
reads its report pipe, heartbeats the driver until the child ends, is killed, or the
driver is gone, waits out a process that lingers after its function returned, and
kills the child's whole process group, then removes the child's private temporary
folder (:class:`~..private.PrivateTmp`: nothing the child kept on disk outlives it).
:class:`~.supervisor.Supervisor` (a cluster node) and :class:`~.run_task.RunOwner` (a
parallel run) are thin specialisations: what goes into the child's environment and
into a heartbeat, and what a reply asks.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from ... import procs
from ...private import PrivateTmp, temp_base
from ...protocol import messages, pipes
from ...protocol.channel import ControlClient
from .child_output import OutputLines
from .phases import FINISHING, FROZEN_S, STACK_SIGNAL, STACKS_FD_ENV, dump_phase
from .threads import thread_env

LOG_BYTES_PER_BEAT = 64 * 1024
REPORT_BYTES_PER_BEAT = 256 * 1024  # the metric history; the rest goes with the next beats
REPORTS_KEPT = 20000
REPORTS_WAKE = REPORTS_KEPT // 4  # a backlog that beats at their own pace might not carry before the oldest drop
TAIL_LINES = 100
# A child whose function returned or raised but whose process lingers (TensorFlow's threads at exit,
# an import lock held by a thread frozen at interpreter shutdown) is ended after this long.  The longer
# of the two values the node and run paths had (10 s, 5 s): no process that used to end on its own is
# killed now, and no test waits on a lingering one.
LINGER_S = 10.0
STACKS_MAX_BYTES = 256 * 1024  # of a stack dump sent to the driver (the first threads: the signalled one first)
STACKS_WAIT_S = 3.0
DRAIN_S = 2.0  # the function raised: its traceback, printed before it said so, is read within this long
# A child stopped this long (SIGSTOP, or a debugger holds it) is ended as failed: it answers neither its peers'
# collectives (theirs fail after about 10 s, and would name the wrong node) nor its feeders (who would wait for
# the feed timeout).
STOPPED_S = 5.0


def tf_env(env: dict[str, str], meta: messages.LaunchMeta, gpus: list[dict[str, Any]], pin_gpus: bool) -> dict[str, str]:
    """``env`` plus what every TensorFlow child gets: the cell's env, its thread pools (``threads.py``),
    quiet C++ logs, unbuffered output, the Keras flavour, and its GPUs (``pin_gpus``:
    CUDA_VISIBLE_DEVICES, empty for none)."""
    env.update({k: str(v) for k, v in meta.env.items()})
    env.update(thread_env(env, meta.task_cpus))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if meta.keras == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    if pin_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g["index"]) for g in gpus)
    return env


class ChildOwner:
    """Owns one child process: its output, its report pipe, the heartbeats about it, its end."""

    process_name = "the child process"  # in errors: "<process_name> exited with code 1"
    linger_s = LINGER_S
    keep_history = False  # keep every report of a batch (a cluster's metric history) or only the latest
    echo_output = False  # copy the child's lines to this process's stderr, tagged with the label

    def __init__(self, client: ControlClient, index: int, label: str, hb_interval: float,
                 driver_timeout: float, executor_id: str = "", jvm_pid: int | None = None) -> None:
        self.client = client
        self.index = index
        self.label = label
        self.hb_interval = hb_interval
        self.driver_timeout = driver_timeout
        self.executor_id = executor_id
        self.jvm_pid = jvm_pid  # watched when set: the child dies with its executor
        self.child: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.pending_logs: collections.deque[str] = collections.deque()
        self.pending_bytes = 0
        self.dropped = 0
        self.report: dict[str, Any] = {}
        self.reports: collections.deque[dict[str, Any]] = collections.deque(maxlen=REPORTS_KEPT)  # not sent yet
        self.value: Any = None
        self.data_port: int | None = None
        self.error: str | None = None
        self.running = False
        self.finished = False  # the function returned
        self.ended = False  # the function returned or raised: the process has nothing left to do but exit
        self.feed_closed = False  # the function stopped reading data (terminate() or returned)
        self.feed_dropped: list[list[int]] = []  # [gen, partition, rows] of training partitions cut short
        self.feed_past: list[int] = []  # [epoch, rows]: a read waits past the running train()'s epochs (pipes.FeedPast)
        self._output: OutputLines | None = None  # the child's output pipe, read into the tail and the next beats
        self.sets_read: list[str] = []  # named sets the function read
        self.phase: dict[str, Any] = {}  # the child's last Phase: {"phase", "moved_at" (its time.time()), "where"}
        self.phases_seen: list[str] = []  # the phases the child went through since the last heartbeat
        self.stacks_ready = False  # the child dumps its stacks into self._stacks on STACK_SIGNAL
        self.phase_at = time.monotonic()  # when the last Phase frame came (the child sends one every TICK_S)
        self._frozen_read = False  # the phase of this silence was read from a stack dump already
        # An anonymous file (no name in any folder: nobody can plant, open or swap it) the child's faulthandler
        # appends to; only this process and the child hold it.
        self._stacks: Any = None
        self._tmp: PrivateTmp | None = None  # the child's TMPDIR, removed once the child is gone
        self._readers: list[threading.Thread] = []

    # -- the process ----------------------------------------------------------------------------
    def start(self, role: str, cluster_id: str, env: dict[str, str], blob: bytes, info: dict[str, Any],
              pass_fds: tuple[int, ...] = (), cwd: str | None = None) -> None:
        """Start ``python -m tfos_nb.runtime <role>`` with the blob and ``info`` on its stdin, and read it; its
        ``TMPDIR`` is a private folder of its own (:class:`~..private.PrivateTmp`)."""
        self._tmp = PrivateTmp(temp_base(env))
        env["TMPDIR"] = self._tmp.path
        read_fd, write_fd = os.pipe()
        env["TFOS_REPORT_FD"] = str(write_fd)
        self._stacks = tempfile.TemporaryFile(prefix="tfos-stacks-")  # noqa: SIM115 - held for the child's life
        env[STACKS_FD_ENV] = str(self._stacks.fileno())
        try:
            self.child = subprocess.Popen(
                [sys.executable, "-m", "tfos_nb.runtime", role, cluster_id],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd, self._stacks.fileno(), *pass_fds),
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        assert self.child.stdin is not None and self.child.stdout is not None
        self._output = OutputLines(self.child.stdout, self._take_line)
        pipes.write_blob(self.child.stdin, blob)
        pipes.write(self.child.stdin, pipes.Start(info=info))
        self.child.stdin.flush()  # kept open: its end is the child's signal that its owner is gone
        for name, target, args in (("output", self._read_output, ()), ("reports", self._read_reports, (read_fd,)),
                                   ("wait", self._wait_child, ())):
            t = threading.Thread(target=target, args=args, name=f"tfos-{self.label}-{name}", daemon=True)
            t.start()
            self._readers.append(t)

    def send(self, command: pipes.Frame) -> None:
        """A command to the child (its stdin); lost if the child is gone."""
        if self.child is None or self.child.stdin is None:
            return
        try:
            pipes.write(self.child.stdin, command)
            self.child.stdin.flush()
        except (OSError, ValueError):
            pass

    def kill(self, grace: float = 1) -> int | None:
        """End the child and its process group (stragglers too, when it exited already); its exit code.  Its
        private temporary folder goes with it."""
        code = None if self.child is None else procs.kill_tree(self.child, grace=grace)
        self.close_stacks()
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            tmp.remove()
        return code

    def dump_stacks(self, wait: float = STACKS_WAIT_S) -> str:
        """Every thread's Python stack in the child, as faulthandler writes them (or why there are none)."""
        child, stacks = self.child, self._stacks
        if child is None or stacks is None or child.poll() is not None:
            return f"({self.process_name} is not running)"
        if not self.stacks_ready:
            return f"({self.process_name} is starting: it cannot show its stacks yet)"
        fd = stacks.fileno()
        start = os.fstat(fd).st_size
        os.kill(child.pid, STACK_SIGNAL)
        deadline = time.monotonic() + wait
        size, still_since = start, time.monotonic()
        while time.monotonic() < deadline:  # faulthandler writes from the signal handler: done when it stops growing
            self.wake.wait(0.05)
            now_size = os.fstat(fd).st_size
            if now_size != size:
                size, still_since = now_size, time.monotonic()
            elif size > start and time.monotonic() - still_since > 0.2:
                break
        if size == start:
            return f"({self.process_name} did not write its stacks within {wait:.0f} s)"
        data = os.pread(fd, min(size - start, STACKS_MAX_BYTES), start)
        text = data.decode("utf-8", "replace")
        return text + ("\n[tfos_nb: cut at 256 KiB]" if size - start > STACKS_MAX_BYTES else "")

    def read_frozen_phase(self) -> None:
        """A child silent for :data:`~.phases.FROZEN_S` holds the GIL in C code (TensorFlow's C++ calls do, e.g.
        ``MultiWorkerMirroredStrategy()`` waiting for its first collective): no thread of it runs, its watcher
        neither.  Its phase is then read from a stack dump (faulthandler answers without the GIL), once per
        silence; its main thread has not moved since the last frame said, so ``moved_at`` stays."""
        with self.lock:
            last = self.phase.get("phase")
            silent = time.monotonic() - self.phase_at > FROZEN_S
            if not (silent and self.stacks_ready and last and last != FINISHING and not self._frozen_read):
                return
            self._frozen_read = True
        phase = dump_phase(self.dump_stacks(), last)
        with self.lock:
            if phase is not None and phase != self.phase.get("phase") and self._frozen_read:
                if len(self.phases_seen) < 100:
                    self.phases_seen.append(phase)
                self.phase = dict(self.phase, phase=phase)

    def close_stacks(self) -> None:
        stacks, self._stacks = self._stacks, None
        if stacks is not None:
            stacks.close()

    def join_readers(self, timeout: float = 2) -> None:
        """Let the readers reach EOF (the child is gone): the final heartbeat carries the last lines."""
        for t in self._readers:
            t.join(timeout=timeout)

    def _read_output(self) -> None:
        assert self._output is not None
        self._output.run()
        self.wake.set()

    def _take_line(self, line: str) -> None:
        if self.echo_output:
            sys.stderr.write(f"[{self.label}] {line}\n")
        with self.lock:
            self.tail.append(line)
            if self.pending_bytes + len(line) > 4 * LOG_BYTES_PER_BEAT:
                self.dropped += 1
            else:
                self.pending_logs.append(line)
                self.pending_bytes += len(line)

    def drain_output(self, timeout: float = DRAIN_S) -> bool:
        """Wait until what the child printed so far is in the tail (at most ``timeout`` s): a traceback printed
        before :class:`~..protocol.pipes.Failed` goes with it."""
        return self._output is None or self._output.drain(timeout)

    def _read_reports(self, fd: int) -> None:
        try:
            for msg in pipes.messages(fd, self._bad_frame):
                # what the driver should hear at once wakes the loop into a beat; progress and phases wait for the
                # next beat (a node reporting each step wrote ~10 frames a second: a beat each, for what 2 carry)
                wake = not isinstance(msg, (pipes.Report, pipes.Phase))
                with self.lock:
                    if isinstance(msg, pipes.Ready):
                        self.data_port = msg.data_port
                        self.running = True
                    elif isinstance(msg, pipes.Report):
                        self.report = dict(msg.report)
                        if self.keep_history:
                            self.reports.extend(msg.batch or [self.report])
                            wake = len(self.reports) > REPORTS_WAKE  # more than the next beats carry in time
                    elif isinstance(msg, pipes.Failed):
                        self.error = str(msg.error)[:2000]
                        self.ended = True
                    elif isinstance(msg, pipes.Finished):
                        self.finished = self.ended = True
                        self.value = msg.value
                    elif isinstance(msg, pipes.FeedClosed):
                        self.feed_closed = True
                    elif isinstance(msg, pipes.FeedDropped) and len(self.feed_dropped) < 100:
                        self.feed_dropped.append([int(msg.gen), int(msg.partition), int(msg.rows)])
                    elif isinstance(msg, pipes.FeedPast):
                        self.feed_past = [int(msg.epoch), int(msg.rows)]
                    elif isinstance(msg, pipes.FeedOpened) and len(self.sets_read) < 100:
                        self.sets_read.append(str(msg.name))
                    elif isinstance(msg, pipes.Phase):
                        if str(msg.phase) != self.phase.get("phase") and len(self.phases_seen) < 100:
                            self.phases_seen.append(str(msg.phase))  # a short phase between two beats is seen too
                        self.phase = {"phase": str(msg.phase), "moved_at": float(msg.moved_at),
                                      "where": str(msg.where)[:200], "times": msg.times}
                        self.phase_at, self._frozen_read = time.monotonic(), False
                        self.stacks_ready = self.stacks_ready or bool(msg.stacks)
                        wake = bool(msg.stacks)  # a stack dump someone waits for
                if wake:
                    self.wake.set()
        finally:
            os.close(fd)

    def _bad_frame(self, exc: pipes.PipeProtocolError) -> None:
        sys.stderr.write(f"tfos_nb: {self.label}: skipped a frame on the report pipe: {exc}\n")

    def _wait_child(self) -> None:
        assert self.child is not None
        self.child.wait()
        self.wake.set()

    # -- heartbeats -----------------------------------------------------------------------------
    def beat_fields(self, final: bool) -> messages.BeatFields:
        """What a specialisation adds to a heartbeat (fields of :class:`~..protocol.messages.Heartbeat`)."""
        with self.lock:
            return {"report": messages.BeatReport.from_dict(self.report)}

    def heartbeat(self, state: str, exit_code: int | None = None, final: bool = False) -> messages.Reply:
        with self.lock:
            logs, size = [], 0
            while self.pending_logs and size < LOG_BYTES_PER_BEAT:
                line = self.pending_logs.popleft()
                size += len(line)
                logs.append(line)
            self.pending_bytes -= size
            dropped, self.dropped = self.dropped, 0
            failed = final and state == "failed"  # the last lines go with a failure's first and final beats
            error = self.error if state == "failed" else None
            tail = list(self.tail) if failed else []
        return self.client.request(
            messages.Heartbeat(node=self.index, state=state, child_pid=self.child.pid if self.child else None,
                        logs=logs, logs_dropped=dropped, exit_code=exit_code, error=error, tail=tail,
                        **self.beat_fields(final))
        )

    def final_heartbeat(self, outcome: str, code: int | None) -> None:
        for _ in range(3):
            try:
                self.heartbeat(outcome, exit_code=code, final=True)
                return
            except (OSError, messages.ProtocolError):
                self.wake.wait(0.2)

    def on_reply(self, cmd: messages.BeatCommand) -> None:
        """What a specialisation does with a heartbeat's reply besides ``kill`` (e.g. relay commands)."""

    # -- the loop -------------------------------------------------------------------------------
    def supervise(self) -> tuple[str, int | None]:
        """Heartbeat until the child ends, the driver kills it, its executor dies or the driver is gone.

        The outcome: ``finished``, ``failed``, ``stopped`` (killed by the driver before it finished) or
        ``lost`` (the driver stopped answering; the child is killed, there is nobody to tell).

        A function that raised is reported ``failed`` at once, not once its process exits (TensorFlow's collectives
        or a thread of the user's can keep it alive: it is ended :attr:`linger_s` later, or by the driver).
        """
        assert self.child is not None
        last_ok = time.monotonic()
        ended_at: float | None = None
        stopped_at: float | None = None
        told = False  # the function's error was told to the driver
        while True:
            code = self.child.poll()
            with self.lock:
                running, finished, ended, error = self.running, self.finished, self.ended, self.error
            if ended and code is None:  # a process stuck in its exit (TensorFlow's threads, a frozen import lock)
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > self.linger_s:
                    code = self.kill(grace=1)
            if code is not None:
                if finished and error is None:
                    return "finished", code
                with self.lock:
                    self.error = self.error or f"{self.process_name} {procs.describe_exit(code)}"
                return "failed", code
            if self.jvm_pid and not procs.pid_alive(self.jvm_pid):
                with self.lock:
                    self.error = f"executor {self.executor_id} (JVM pid {self.jvm_pid}) died"
                return "failed", self.kill(grace=1)
            if procs.is_stopped(self.child.pid):  # code is None here: the child has not exited
                stopped_at = stopped_at or time.monotonic()
                if time.monotonic() - stopped_at >= STOPPED_S:
                    with self.lock:
                        self.error = (f"{self.process_name} was stopped (SIGSTOP, or a debugger held it) for "
                                      f"{STOPPED_S:.0f} s: its peers and feeders wait for it; ended")
                    return "failed", self.kill(grace=0)
            else:
                stopped_at = None
            if error is not None and not told:  # the function raised: its traceback is printed, the driver hears now
                self.drain_output()
            try:
                if error is not None:
                    reply = self.heartbeat("failed", final=not told)  # its tail goes once, then with the final beat
                    told = True
                else:
                    reply = self.heartbeat("running" if running else "starting")
                last_ok = time.monotonic()
            except (OSError, messages.ProtocolError):
                if time.monotonic() - last_ok > self.driver_timeout:
                    code = self.kill(grace=1)
                    with self.lock:
                        self.error = f"the driver stopped answering for {self.driver_timeout:.0f} s"
                    return "lost", code
                reply = None
            if reply is not None:
                cmd = messages.BeatCommand.from_dict(reply.body)
                self.on_reply(cmd)
                if cmd.kill:
                    code = self.kill(grace=cmd.grace)
                    with self.lock:  # a function that raised stays failed
                        done = "finished" if self.finished and self.error is None else "failed" if self.error else "stopped"
                    return done, code
            self.wake.wait(self.hb_interval)
            self.wake.clear()
