"""``python -I -m codemode_worker.supervisor``: PID 1 of a reusable sandbox (the reuse mode).

In the reuse mode (an operator's choice, docs/reference/runtimes.md) a container or pod is leased
to **one subject** and serves several of its executes, one at a time, each in a **fresh worker
process**. This module is that sandbox's PID 1. It speaks ``codemode_worker.supervisor_channel`` on its
stdin/stdout and, for each execute ("epoch"):

1. forks a worker from its own warm, data-free state (it imported and warmed the interpreter before
   the first execute and has relayed nothing into its memory since), with pipes of its own as
   stdin/stdout/stderr and no other descriptor; the child raises its OOM score to the maximum,
   sets ``RLIMIT_MSGQUEUE`` and ``RLIMIT_CORE`` to 0, installs the worker's own seccomp filter
   (``confinement``: after the fork, with the worker's own pid put into the program the supervisor
   compiled once, ``confinement.CompiledFilter``, as the process runtime's template does) and only
   then reads a frame; the supervisor **probes** it (the probe frame; the answer must be exactly the
   acknowledgement, within ``PROBE_SECONDS``: the only bytes of a worker the supervisor ever reads,
   from a worker that has run no program yet), so the host sends it the execute at once;
2. relays the host's bytes to that worker and the worker's stdout and stderr back, tagged with the
   epoch, with ``splice``: no byte of a program, a result or an output passes through the
   supervisor's memory, so no later worker (a copy of that memory) can find one;
3. when the worker ends by itself (it does after its execute's last frame), or on ``K`` (the host
   ends the execute: the supervisor kills the worker), reaps it, scrubs the sandbox (``scrub``:
   kill every other process, remove every file and IPC object a worker added, verify everything
   against the baseline taken before the first worker), forks and probes the next epoch's worker,
   and then reports how the worker ended (``X``) and the verdict (``C``, with ``ready``) in one
   write; on any anomaly (or a next worker that fails its probe) it reports ``C`` not ok and exits,
   and the host recycles the sandbox. A ``K`` for an epoch already ended is ignored.

Out of the worker's reach, with every capability dropped, no-new-privileges and the same uid as the
worker (a process without ``CAP_SETUID`` cannot start one under another uid):

* **signals**: it is PID 1 of the sandbox's pid namespace and installs no handler; the kernel
  delivers to a namespace's init only the signals it handles, so ``kill(1, ...)`` from the worker
  does nothing (``SIGKILL`` and ``SIGSTOP`` included); the worker's filter refuses ``kill`` anyway;
* **ptrace, /proc/1/mem, its fds, its environment**: it makes itself non-dumpable
  (``PR_SET_DUMPABLE`` 0) before the first fork; a process without ``CAP_SYS_PTRACE`` then cannot
  attach to it, read or write its memory, open ``/proc/1/fd/*``, ``/proc/1/environ`` or
  ``/proc/1/mem``; its ``/proc`` files belong to root;
* **its control channel**: the worker never holds the channel's descriptors (its 0/1/2 are its own
  pipes; everything else is closed before the filter goes in) and cannot reach them through /proc;
* **its reads and writes of the worker's pipes**: the worker's uid owns them, so the worker can
  reopen them through ``/proc/self/fd`` (read ends included), resize them and fill them with
  one-byte packets; the supervisor's ends are non-blocking, every splice from them is
  ``SPLICE_F_NONBLOCK`` and takes whatever is there into a pipe only the supervisor holds (the
  hold pipe, half the stage pipe's buffers), so a byte another reader took, or packets that
  outnumber a pipe's buffers, never leave it waiting (it used to block in ``splice`` for a byte
  it had counted with ``FIONREAD``: no ``K`` read, no pidfd watched);
* **what the kernel lets a same-uid process change** (resource limits with ``prlimit``, nice
  value, scheduling policy, CPU affinity, I/O priority): the worker's filter refuses each of those
  calls, and the scrub compares them with the baseline after every execute (a change is an anomaly).

Exit codes: 0 when the host closes the channel; 6 (``EXIT_NOT_INIT``) when it is not PID 1, is not
alone in its pid namespace or cannot make itself non-dumpable (it refuses to serve: the guarantees
above need all three); 7 (``EXIT_ANOMALY``) after reporting an anomaly; 2 on a channel violation.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import gc
import json
import os
import resource
import select
import signal
import sys
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from . import PROTOCOL_VERSION, STDERR_VARIABLE, scrub
from . import supervisor_channel as channel
from .protocol import encode_frame

__all__ = [
    "EXIT_ANOMALY",
    "EXIT_CHANNEL",
    "EXIT_NOT_INIT",
    "MAX_IDLE_ENDS",
    "PROBE_SECONDS",
    "Supervisor",
    "main",
]

EXIT_CHANNEL: Final = 2
EXIT_NOT_INIT: Final = 6
EXIT_ANOMALY: Final = 7
#: A worker child that could not set itself up (before any frame).
EXIT_WORKER_SETUP: Final = 5
_PR_GET_DUMPABLE: Final = 3
_PR_SET_DUMPABLE: Final = 4
_F_SETPIPE_SZ: Final = 1031
_F_GETPIPE_SZ: Final = 1032
_SPLICE_CHUNK: Final = 1024 * 1024
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
_IN, _OUT, _HUP = select.POLLIN, select.POLLOUT, select.POLLHUP | select.POLLERR
#: Signals Python itself ignores at start-up (a worker gets the interpreter's usual dispositions).
_PYTHON_IGNORES: Final = (signal.SIGPIPE, signal.SIGXFSZ)
#: The probe a new worker gets before the host hears that it is ready, and the exact answer
#: (``codemode_worker.entry``): the only bytes of a worker this process ever reads, from a worker
#: that has run no program yet.
_PROBE: Final = encode_frame({"k": "probe", "v": PROTOCOL_VERSION})
_PROBE_ACK: Final = encode_frame({"k": "probe_ack", "v": PROTOCOL_VERSION})
#: How long a new worker has to answer its probe (below the host's 5 s bound on an epoch's end).
PROBE_SECONDS: Final = 4.0
#: Workers of one epoch that may end before the host sends it anything (each is replaced) before
#: the supervisor calls it an anomaly and exits.
MAX_IDLE_ENDS: Final = 3

Child = Callable[[], int]


def _dumpable(value: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(
        libc.prctl(_PR_SET_DUMPABLE, value, 0, 0, 0) == 0
        and libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == value
    )


def _raise_oom_score() -> None:
    """The OOM killer takes the worker, never the supervisor. A non-dumpable process's /proc files
    belong to root, so the child is dumpable just long enough to write its own score."""
    if not _dumpable(1):
        raise OSError("cannot make the worker dumpable")
    try:
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
            fh.write("1000")
    finally:
        if not _dumpable(0):
            raise OSError("cannot make the worker non-dumpable again")


def _say(text: str) -> None:
    """A line for the sandbox's stderr (host logs only)."""
    os.write(2, f"codemode supervisor: {text}\n".encode(errors="replace"))


def _fionread(fd: int) -> int:
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _splice_all(src: int, dst: int, count: int, flags: int = 0) -> None:
    """Move exactly ``count`` bytes already waiting in ``src``, a pipe of the supervisor's own that
    no other process holds, to ``dst``. ``SPLICE_F_NONBLOCK`` in ``flags``: ``dst`` is one of those
    pipes too, with room for them (so a bug raises ``BlockingIOError`` instead of hanging)."""
    while count:
        moved = os.splice(src, dst, count, flags=flags)
        if moved <= 0:
            raise OSError("splice moved nothing")
        count -= moved


def _control(kind: bytes, epoch: int, value: dict[str, Any]) -> bytes:
    """One control message (``X``, ``C``, ``H``) with its JSON payload."""
    return channel.encode(kind, epoch, json.dumps(value, separators=(",", ":")).encode())


@dataclass
class _Epoch:
    """One execute's worker."""

    number: int
    pid: int
    pidfd: int
    stdin: int
    stdout: int
    stderr: int
    oom_before: int
    status: int | None = None
    reported: bool = False
    #: The host has sent this epoch something (a ``D`` or ``E``): its worker may have run a program.
    fed: bool = False
    #: Workers of this epoch that ended before the host sent it anything, each replaced.
    replaced: int = 0

    def close(self, fd: int) -> int:
        if fd >= 0:
            os.close(fd)
        return -1


class Supervisor:
    """The channel loop of one sandbox (see the module docstring)."""

    def __init__(self, child: Child, baseline: scrub.Baseline) -> None:
        self.child = child
        self.baseline = baseline
        self.devnull = os.open("/dev/null", os.O_WRONLY | os.O_CLOEXEC)
        #: A pipe where each relayed message is put together (header, then the worker's bytes
        #: spliced in) so that it reaches the channel in one splice: one chunk for the engine's
        #: attach stream to carry instead of two.
        self.stage_r, self.stage_w = os.pipe2(os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.stage_w, _F_SETPIPE_SZ, 2 * channel.MAX_RELAY)
        stage = fcntl.fcntl(self.stage_w, _F_GETPIPE_SZ)
        #: Where the worker's bytes land first, in one non-blocking splice that takes whatever is
        #: there (the worker can reopen its own pipes through /proc/self/fd and read from them, or
        #: fill them with one-byte packets: nothing the supervisor reads from them may wait for a
        #: count it saw before). Half the stage's buffers: the header and all it holds always fit
        #: in the stage, whatever the sizes of the worker's packets. Its capacity bounds one
        #: relayed payload.
        self.hold_r, self.hold_w = os.pipe2(os.O_CLOEXEC)
        hold = fcntl.fcntl(self.hold_w, _F_SETPIPE_SZ, max(_PAGE, stage // 2))
        if hold // _PAGE >= stage // _PAGE:
            raise OSError(f"a stage pipe of {stage} bytes leaves no room for the relay")
        self.relay_limit = min(channel.MAX_RELAY, hold)
        self.header = bytearray()
        #: Bytes of the ``D`` message being read that are still on the channel, and its epoch.
        self.payload = 0
        self.payload_epoch = 0
        #: The last splice of that payload stopped because the worker's stdin pipe was full.
        self.worker_full = False
        self.epoch: _Epoch | None = None

    # -- channel ----------------------------------------------------------------------------

    def send_json(self, kind: bytes, epoch: int, value: dict[str, Any]) -> None:
        _write_all(1, _control(kind, epoch, value))

    # -- workers ----------------------------------------------------------------------------

    def start(self, number: int) -> None:
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        oom_before = scrub.oom_kills()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            self._become_worker(in_r, out_w, err_w)
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        for fd in (in_w, out_r, err_r):  # the worker holds the other ends: nothing here may wait
            os.set_blocking(fd, False)
        self.epoch = _Epoch(number, pid, os.pidfd_open(pid), in_w, out_r, err_r, oom_before)

    def _become_worker(self, stdin: int, stdout: int, stderr: int) -> NoReturn:
        code = EXIT_WORKER_SETUP
        try:
            os.dup2(stdin, 0)
            os.dup2(stdout, 1)
            os.dup2(stderr, 2)
            os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
            signal.signal(signal.SIGINT, signal.default_int_handler)
            resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            _raise_oom_score()
            code = self.child()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else EXIT_WORKER_SETUP
        except BaseException as exc:  # the worker's stderr: host logs only
            _say(f"worker set-up failed: {type(exc).__name__}: {exc}")
            code = EXIT_WORKER_SETUP
        finally:
            from .entry import exit_now  # loaded by the template already

            exit_now(code)

    def relay(self, fd: int, kind: bytes) -> int | None:
        """Relay what waits in the worker's pipe ``fd``: the bytes relayed, 0 at its end, None when
        nothing waits (another reader took it). The bytes move in one non-blocking splice into the
        hold pipe, which only this process holds; then the header and those bytes meet in the
        stage pipe (kernel buffers: the bytes never enter this process's memory) and leave it in
        one piece. Nothing here waits for the worker."""
        assert self.epoch is not None
        try:
            moved = os.splice(fd, self.hold_w, self.relay_limit, flags=os.SPLICE_F_NONBLOCK)
        except BlockingIOError:
            return None
        if moved > 0:
            _write_all(self.stage_w, channel.HEADER.pack(kind, self.epoch.number, moved))
            _splice_all(self.hold_r, self.stage_w, moved, os.SPLICE_F_NONBLOCK)
            _splice_all(self.stage_r, 1, channel.HEADER.size + moved)
        return moved

    def drain(self) -> None:
        """Relay what the (dead) worker left in its pipes: at most what waited when the drain
        began, without waiting for their end (a descendant may still hold them, and write on)."""
        ep = self.epoch
        assert ep is not None
        for attr, kind in (("stdout", channel.STDOUT), ("stderr", channel.STDERR)):
            fd = getattr(ep, attr)
            left = _fionread(fd) if fd >= 0 else 0
            while left > 0:
                moved = self.relay(fd, kind)
                if not moved:
                    break
                left -= moved

    def reap(self, wait: bool) -> bytes:
        """Collect the worker's exit (``wait``: kill it first, else relay what it left first); its
        ``X`` report the first time (``finish`` sends it with the scrub's verdict, in one write),
        else nothing."""
        ep = self.epoch
        assert ep is not None
        if ep.status is None:
            if wait:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(ep.pidfd, signal.SIGKILL)
            _, ep.status = os.waitpid(ep.pid, 0)
        report = b""
        if not ep.reported:
            if not wait:
                self.drain()
            ep.reported = True
            code = os.waitstatus_to_exitcode(ep.status)
            oom_after = scrub.oom_kills()
            report = _control(
                channel.EXIT,
                ep.number,
                {
                    "code": code if code >= 0 else None,
                    "signal": -code if code < 0 else None,
                    "oom": oom_after > ep.oom_before >= 0,
                },
            )
        ep.stdin = ep.close(ep.stdin)
        ep.pidfd = ep.close(ep.pidfd)
        return report

    def end(self, number: int) -> int | None:
        """``K``: kill the worker, then ``finish``. An exit code when the supervisor must stop."""
        return self.finish(self.reap(wait=True))

    def finish(self, report: bytes) -> int | None:
        """The epoch is over (its worker reaped; ``report``: its ``X`` when not sent yet): scrub,
        verify, start and probe the next worker, then send ``report`` and the verdict in one write
        (``C`` with ``ready``: the next worker answered its probe). An exit code when the
        supervisor must stop."""
        ep = self.epoch
        assert ep is not None
        number = ep.number
        ep.stdout = ep.close(ep.stdout)
        ep.stderr = ep.close(ep.stderr)
        problem = scrub.scrub(self.baseline)
        if problem is None:
            self.start(number + 1)
            problem = self.probe()
        if problem is not None:
            _write_all(1, report + _control(channel.CLEAN, number, {"ok": False, "anomaly": problem[:512]}))
            _say(f"anomaly after epoch {number}: {problem}")
            return EXIT_ANOMALY
        _write_all(1, report + _control(channel.CLEAN, number, {"ok": True, "ready": True}))
        return None

    def replace_idle(self) -> int | None:
        """The epoch's worker ended before the host sent it anything (killed from outside while its
        sandbox was idle: an OOM kill, an operator): it ran no program, so the host, which holds
        this epoch as ready, gets a new worker of the same epoch instead (scrub, fork, probe) and
        hears nothing of it; what the dead one left in its pipes is dropped. An exit code when the
        supervisor must stop."""
        ep = self.epoch
        assert ep is not None
        _, status = os.waitpid(ep.pid, 0)
        for name in ("stdin", "stdout", "stderr", "pidfd"):
            setattr(ep, name, ep.close(getattr(ep, name)))
        replaced = ep.replaced + 1
        code = os.waitstatus_to_exitcode(status)
        _say(f"the worker of epoch {ep.number} ended while idle (exit status {code}); replaced")
        problem = (
            f"{replaced} workers of epoch {ep.number} ended while idle"
            if replaced > MAX_IDLE_ENDS
            else scrub.scrub(self.baseline)
        )
        if problem is None:
            self.start(ep.number)
            assert self.epoch is not None
            self.epoch.replaced = replaced
            problem = self.probe()
        if problem is not None:
            _say(f"anomaly in epoch {ep.number}: {problem}")  # the host sees the stream end
            return EXIT_ANOMALY
        return None

    def probe(self) -> str | None:
        """Probe the new worker (``_PROBE``; its answer must be exactly ``_PROBE_ACK`` within
        ``PROBE_SECONDS``): None when it answered, else what went wrong."""
        ep = self.epoch
        assert ep is not None
        try:
            _write_all(ep.stdin, _PROBE)  # a few bytes into an empty pipe: never blocks
        except OSError as exc:
            return f"the new worker's input failed: {exc.strerror or exc}"
        answer = bytearray()
        deadline = time.monotonic() + PROBE_SECONDS
        poller = select.poll()
        poller.register(ep.stdout, _IN)
        while len(answer) < len(_PROBE_ACK):
            left = deadline - time.monotonic()
            if left <= 0:
                return f"the new worker did not answer its probe in {PROBE_SECONDS:.0f} s"
            if not poller.poll(left * 1000):
                continue
            try:
                data = os.read(ep.stdout, len(_PROBE_ACK) - len(answer))
            except BlockingIOError:
                continue
            if not data:
                return "the new worker ended before it answered its probe"
            answer += data
        if bytes(answer) != _PROBE_ACK:
            return "the new worker answered its probe with something else"
        return None

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        os.set_blocking(0, False)
        os.set_blocking(1, True)
        self.start(1)
        problem = self.probe()
        if problem is not None:
            _say(f"cannot start: {problem}")
            return EXIT_ANOMALY
        poller = select.poll()
        while True:
            ep = self.epoch
            assert ep is not None
            watched: dict[int, int] = {}
            if self.payload and self._payload_target() >= 0 and self.worker_full:
                watched[self._payload_target()] = _OUT
            else:
                watched[0] = _IN
            for fd in (ep.stdout, ep.stderr):
                if fd >= 0:
                    watched[fd] = watched.get(fd, 0) | _IN
            if ep.pidfd >= 0:
                watched[ep.pidfd] = watched.get(ep.pidfd, 0) | _IN
            for fd, mask in watched.items():
                poller.register(fd, mask)
            try:
                ready = dict(poller.poll())
            finally:
                for fd in watched:
                    poller.unregister(fd)
            if ep.stdout in ready and self.relay(ep.stdout, channel.STDOUT) == 0:
                ep.stdout = ep.close(ep.stdout)
            if ep.stderr in ready and self.relay(ep.stderr, channel.STDERR) == 0:
                ep.stderr = ep.close(ep.stderr)
            if ep.pidfd >= 0 and ep.pidfd in ready and not ep.fed:
                code = self.replace_idle()  # it had run nothing: the host never hears of it
                if code is not None:
                    return code
                continue
            if ep.pidfd >= 0 and ep.pidfd in ready:
                # The worker ended by itself (it does after its execute's last frame): relay what
                # it left, then end the epoch without waiting for the host's K (which then names
                # a past epoch and is ignored).
                code = self.finish(self.reap(wait=False))
                if code is not None:
                    return code
                continue
            if 0 in ready or (self.payload and self._payload_target() in ready):
                code = self.read_channel()
                if code is not None:
                    return code

    def _payload_target(self) -> int:
        """Where the pending ``D`` payload goes: the worker's stdin, or -1 (discarded)."""
        ep = self.epoch
        if ep is None or self.payload_epoch != ep.number or ep.stdin < 0:
            return -1
        return ep.stdin

    def read_channel(self) -> int | None:
        """Take what the channel has: payload bytes (spliced on) or a header (acted on)."""
        if self.payload:
            self._move_payload()
            return None
        try:
            data = os.read(0, channel.HEADER.size - len(self.header))
        except BlockingIOError:
            return None
        if not data:
            scrub.kill_others(1.0)  # the host is gone: so is the sandbox
            return 0
        self.header += data
        if len(self.header) < channel.HEADER.size:
            return None
        kind, number, length = channel.HEADER.unpack(self.header)
        self.header.clear()
        ep = self.epoch
        assert ep is not None
        if number == ep.number and kind in (channel.DATA, channel.CLOSE_INPUT):
            ep.fed = True
        if kind == channel.DATA:
            self.payload, self.payload_epoch, self.worker_full = length, number, False
            if length:
                self._move_payload()
            return None
        if kind == channel.CLOSE_INPUT:
            if number == ep.number:
                ep.stdin = ep.close(ep.stdin)
            return None
        if kind == channel.END:
            return self.end(number) if number == ep.number else None
        if kind == channel.PING:
            hello = {"v": PROTOCOL_VERSION, "epoch": ep.number, "ready": True, "ends": True}
            self.send_json(channel.HELLO, ep.number, hello)
            return None
        _say(f"unknown channel message {kind!r}")
        return EXIT_CHANNEL

    def _move_payload(self) -> None:
        target = self._payload_target()
        try:
            if target < 0:
                moved = os.splice(0, self.devnull, min(self.payload, _SPLICE_CHUNK))
            else:
                moved = os.splice(0, target, min(self.payload, _SPLICE_CHUNK), flags=os.SPLICE_F_NONBLOCK)
        except BlockingIOError:
            # Either side: nothing more on the channel yet, or the worker's stdin is full.
            self.worker_full = target >= 0 and _fionread(0) > 0
            return
        except BrokenPipeError:  # the worker closed its stdin: the rest is discarded
            ep = self.epoch
            assert ep is not None
            ep.stdin = ep.close(ep.stdin)
            return
        self.worker_full = False
        self.payload -= moved


# ----------------------------------------------------------------------------------- setting up


def _harden() -> str | None:
    """Make this process out of a worker's reach; the reason when it cannot be."""
    if os.getpid() != 1:
        return "not PID 1 of its pid namespace"
    others = scrub.other_processes()
    if others:
        return f"not alone in its pid namespace ({len(others)} other processes)"
    if not _dumpable(0):
        return "cannot make itself non-dumpable"
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP) or sig in _PYTHON_IGNORES:
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)  # no handler: the kernel drops it for init
        except (OSError, ValueError):
            continue
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return None


def _worker_child(testing: bool, unconfined: bool) -> Child:
    """What a forked worker runs after its set-up, warmed up here, in the template. Each takes its
    frame streams first (``entry.streams``: that needs ``dup2``), then installs the worker's filter
    (after the fork: it names this pid), then serves."""
    from . import confinement, entry

    # The filter compiled here once for any pid (libseccomp's own program with the worker's pid put
    # in after the fork: ``confinement.CompiledFilter``), or built by each worker when it cannot be.
    compiled = confinement.compile_filter()
    confinement.binding()  # loaded now: a worker that builds its own filter reads no file
    if testing:
        from . import testing_entry

        def testing_child() -> int:
            if os.environ.get(testing_entry.ENABLE_VARIABLE) != "1":
                return testing_entry.EXIT_DISABLED
            inp, out = entry.streams()
            window = testing_entry.open_window()
            if not unconfined:
                confinement.restrict_files()
                confinement.confine(compiled if compiled is not None else confinement.prepare())
            return testing_entry.serve_confined(inp, out, window)

        return testing_child
    from . import interpreter

    interpreter.warm_up()

    def worker_child() -> int:
        inp, out = entry.streams()
        confinement.restrict_files()  # the Landlock domain, while this forked child has one thread
        confinement.confine(compiled if compiled is not None else confinement.prepare())
        return interpreter.on_interpreter_thread(lambda: entry.serve_confined(inp, out))

    return worker_child


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="codemode_worker.supervisor")
    parser.add_argument("--testing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--testing-unconfined", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.stdout = sys.stderr  # fd 1 is the channel: nothing else may ever write to it
    # A worker forked here writes its stderr into a pipe the supervisor relays over the channel
    # (tagged, to the host's bounded tail), never into the pod's log: it needs no stderr relay
    # process of its own (confinement's bounded mode, which the pod's environment asks for).
    os.environ.pop(STDERR_VARIABLE, None)
    problem = _harden()
    if problem is not None:
        _say(f"refusing to serve: {problem}")
        return EXIT_NOT_INIT
    try:
        child = _worker_child(args.testing, args.testing and args.testing_unconfined)
        gc.collect()
        gc.freeze()  # the template's warm state: shared by every forked worker, never collected
        baseline = scrub.take()
    except Exception as exc:
        _say(f"cannot start: {type(exc).__name__}: {exc}")
        return EXIT_NOT_INIT
    try:
        return Supervisor(child, baseline).run()
    except OSError as exc:
        _say(f"channel failed: {exc}")
        return EXIT_CHANNEL


if __name__ == "__main__":
    code = main()
    os._exit(code)
