"""``python -I -m codemode_worker.template --control FD``: the process runtime's worker template.

A fork server. It starts like a worker (``python -I``, an environment holding only the worker
marker, in ``/``), imports and warms the interpreter once, and then, for each ``FORK`` on its
control channel (``template_wire``), forks a **fresh, single-use worker** from that warm, data-free
state. It holds no secret and no host state: it never sees a program, a frame or a result (each
worker's stdio pipes come from the host and go straight to the worker); all it ever reads are the
host's fixed-size control packets.

A forked worker, before it runs anything of a program (the order is the security argument):

1. leads a session of its own (the host kills its process group);
2. makes the three descriptors it was sent its stdin, stdout and stderr and closes **every other
   descriptor** (the control channel, the pidfds of its siblings, anything the imports opened) but
   the template's filled Landlock ruleset, which step 4 enforces and closes: nothing of the
   template is reachable from it;
3. takes its resource limits (CPU seconds, no core files, no file writes, no POSIX message queue,
   open files, address space; ``RLIMIT_NPROC`` when it gets a uid of its own), on top of the
   template's ``no_new_privs``;
4. enters the worker's Landlock domain (``confinement.restrict_files``, while it has one thread:
   the ruleset the template filled once, ``confinement.prepare_files``, enforced, its descriptor
   closed; enforcing takes a snapshot of rules the template never changes after),
   takes the worker's seccomp filter for its own pid (libseccomp's program, compiled once in the
   template for any pid: ``confinement.CompiledFilter``; or built after the fork with
   ``confinement.prepare`` when that cannot be), drops to the uid the host named (``privileges``),
   asks to be killed with the template (``PR_SET_PDEATHSIG``, which a uid change clears, so only
   now) and loads the filter (``confinement.confine``, checked);
5. only then reads frames, exactly like a spawned worker (``entry.serve_confined``).

What forked workers share with the template and with each other: the address-space layout (ASLR is
chosen once, at the template's ``exec``), glibc's stack-protector and pointer-guard values, and
CPython's string hash seed (``PYTHONHASHSEED`` is fixed at start). What differs: the ``random``
module's state (CPython re-seeds it from the kernel in every forked child); ``secrets``, ``uuid`` and
``os.urandom`` read the kernel and keep no state. docs/reference/runtimes.md says what that means.

The template itself is out of a worker's reach: it is non-dumpable (``PR_SET_DUMPABLE`` 0: no
``ptrace``, ``/proc/<template>/mem``, ``/proc/<template>/fd`` or ``environ`` for a process without
``CAP_SYS_PTRACE``), a worker holds none of its descriptors, and under a root host it runs as root
while every worker runs as a uid of its own (no signal, no trace). Its own filter is not loaded: it
must fork and change ids, and it runs nothing but this loop.

It reaps a worker only on the host's ``REAP``; it ends, killing and reaping every worker it still
has, when the host closes the channel. Exit codes: 0 then; 2 on a control message it does not
accept; 5 when the worker's filter cannot be built here (``confinement.EXIT_CONFINEMENT``). A forked
worker that fails before its first frame exits 6 (``EXIT_SETUP``) unless its own step has a code
(4 for the uid drop, 5 for the filter).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import gc
import os
import resource
import select
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, NoReturn

from . import confinement, entry, interpreter, landlock, privileges
from .template_wire import EXITED, FAILED, FORK, FORKED, MESSAGE, READY, REAP, WORKER_FDS, receive

__all__ = ["EXIT_CONTROL", "EXIT_SETUP", "main"]

EXIT_CONTROL: Final = 2
EXIT_SETUP: Final = 6
_PR_SET_PDEATHSIG: Final = 1
_PR_SET_DUMPABLE: Final = 4
_PR_GET_DUMPABLE: Final = 3
_MAX_FD: Final = 1 << 20
_LIBC: Final = ctypes.CDLL(None, use_errno=True)

Child = Callable[[], int]


@dataclass(frozen=True)
class Limits:
    """The resource limits every forked worker takes (the runtime's settings)."""

    cpu_seconds: int
    address_space: int
    open_files: int
    max_processes: int

    def apply(self, own_uid: bool) -> None:
        if own_uid:
            resource.setrlimit(resource.RLIMIT_NPROC, (self.max_processes, self.max_processes))
        resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_seconds, self.cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))
        if self.address_space > 0:
            resource.setrlimit(resource.RLIMIT_AS, (self.address_space, self.address_space))


class UidKiller:
    """SIGKILL to every process of one uid, at once: ``kill(-1, SIGKILL)`` made with that uid's own
    right to signal. A process may signal exactly the processes whose real or saved uid is its real
    or effective uid; so for the call the template takes effective uid ``uid`` and real uid
    ``killer`` (a uid of its own that nothing ever runs as, claimed by the host for this template's
    life), keeping saved uid 0 to take root back after it (the raw system call: one thread, the only
    one). That reaches every process of ``uid`` (a worker's processes cannot change their uid: no
    capability, ``no_new_privs``) and no other; and during the call no process of ``uid`` can
    signal or trace the template (its real and saved uids are not ``uid``: a process of the uid
    spinning on ``kill(template, SIGKILL)`` found the instant when both were). ``kill(-1)`` is
    atomic against ``fork``: a process forking meanwhile either has its child counted or gets the
    signal before the child exists. Only for a template running as root; any failure ends the
    template (fail closed)."""

    def __init__(self, killer: int) -> None:
        if killer <= 0:
            raise ValueError("the killer uid must be a uid of its own (> 0)")
        sc = confinement.binding()
        self._setresuid = int(sc.resolve_syscall(sc.Arch.NATIVE, "setresuid"))
        self._killer = killer

    def _setresuid_or_die(self, real: int, effective: int) -> None:
        args = (ctypes.c_long(real), ctypes.c_long(effective), ctypes.c_long(0))
        if _LIBC.syscall(self._setresuid, *args) != 0:
            os._exit(EXIT_SETUP)

    def kill(self, uid: int) -> None:
        if uid <= 0 or uid == self._killer:
            os._exit(EXIT_SETUP)
        self._setresuid_or_die(self._killer, uid)
        try:
            _LIBC.kill(-1, signal.SIGKILL)  # ESRCH when no process: nothing to do
        finally:
            self._setresuid_or_die(0, 0)
        # A change of effective uid resets the dumpable flag to fs.suid_dumpable: set it again.
        if os.getresuid() != (0, 0, 0) or _LIBC.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            os._exit(EXIT_SETUP)


def _die_with(template: int) -> None:
    """Be killed when the template dies (set after the uid drop, which clears it); and if it died
    already, stop here."""
    if _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != template:
        raise SystemExit(EXIT_SETUP)


def _confine(
    template: int, compiled: confinement.CompiledFilter | None, files: landlock.Ruleset | None = None
) -> None:
    """Step 4 of the module docstring: the template's Landlock ruleset enforced (``files``; None:
    gathered here), and the filter compiled in the template (libseccomp's program with this
    worker's pid put in, ``confinement.CompiledFilter``), or built here when it could not be.
    The confinement functions are looked up when called (the unconfined escape tests replace them
    in their own template only)."""
    # The Landlock domain, while this forked child has one thread.
    if files is None:
        confinement.restrict_files()
    else:
        confinement.restrict_files(files)
    seccomp_filter = compiled if compiled is not None else confinement.prepare()
    privileges.drop_privileges()
    _die_with(template)
    confinement.confine(seccomp_filter)


def _worker_child(testing: bool, files: landlock.Ruleset | None = None) -> Child:
    """What a forked worker runs after its set-up; warms up here, in the template. ``files``: the
    Landlock ruleset the template filled (``confinement.prepare_files``), enforced by each worker
    (the testing child gathers its own, after opening its window)."""
    template = os.getpid()
    compiled = confinement.compile_filter()
    if testing:
        from . import testing_entry

        def testing_child() -> int:
            if os.environ.get(testing_entry.ENABLE_VARIABLE) != "1":
                return testing_entry.EXIT_DISABLED
            inp, out = entry.streams()
            window = testing_entry.open_window()
            _confine(template, compiled)
            return testing_entry.serve_confined(inp, out, window)

        return testing_child
    interpreter.warm_up()

    def worker_child() -> int:
        inp, out = entry.streams()
        _confine(template, compiled, files)
        return interpreter.on_interpreter_thread(lambda: entry.serve_confined(inp, out))

    return worker_child


def _become_worker(
    fds: list[int], uid: int, limits: Limits, child: Child, keep: int | None = None
) -> NoReturn:
    code = EXIT_SETUP
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        if keep is None:
            os.closerange(3, _MAX_FD)
        else:  # the template's Landlock ruleset: the child enforces and closes it before any frame
            os.closerange(3, keep)
            os.closerange(keep + 1, _MAX_FD)
        limits.apply(own_uid=uid > 0)
        if uid > 0:
            os.environ[privileges.UID_VARIABLE] = str(uid)
        code = child()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_SETUP
    except BaseException:
        code = EXIT_SETUP
    finally:
        entry.exit_now(code)


@dataclass
class _Worker:
    pid: int
    pidfd: int
    uid: int


class Template:
    """The fork loop on the control socket."""

    def __init__(
        self,
        control: socket.socket,
        limits: Limits,
        child: Child,
        killer_uid: int = 0,
        keep: int | None = None,
    ) -> None:
        self.control = control
        self.limits = limits
        self.child = child
        self.keep = keep  # the one descriptor of the template a worker keeps (its Landlock ruleset)
        self.workers: dict[int, _Worker] = {}
        # Without a killer uid no worker gets a uid of its own (FORK with one is refused).
        self.uids = UidKiller(killer_uid) if os.geteuid() == 0 and killer_uid > 0 else None
        self.reaping: dict[int, int] = {}  # pidfd -> worker number, for workers the host asked to reap
        self.poll = select.poll()
        self.poll.register(control, select.POLLIN)

    def send(self, op: int, number: int, value: int, fds: list[int] | None = None) -> None:
        data = MESSAGE.pack(op, number, value)
        if fds:
            socket.send_fds(self.control, [data], fds)
        else:
            self.control.send(data)

    def run(self) -> int:
        self.send(READY, 0, os.getpid())
        while True:
            for fd, _ in self.poll.poll():
                if fd == self.control.fileno():
                    code = self.read_control()
                    if code is not None:
                        return code
                else:
                    self.reap(self.reaping[fd])

    def read_control(self) -> int | None:
        """Serve every waiting control message; an exit code when the template must end."""
        while True:
            try:
                message = receive(self.control, WORKER_FDS, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            except OSError:
                return self.shutdown(0)
            if message is None:
                return self.shutdown(EXIT_CONTROL)
            data, fds = message
            if not data:
                for fd in fds:
                    os.close(fd)
                return self.shutdown(0)  # the host closed its end
            code = self.handle(data, fds)
            if code is not None:
                return code

    def handle(self, data: bytes, fds: list[int]) -> int | None:
        op, number, value = MESSAGE.unpack(data)
        uid_ok = value == 0 or (value > 0 and self.uids is not None)
        if op == FORK and number > 0 and number not in self.workers and len(fds) == WORKER_FDS and uid_ok:
            self.fork(number, value, fds)
            return None
        if op == REAP and number in self.workers and not fds and value == 0:
            self.reap(number)
            return None
        return self.refuse(fds)

    def refuse(self, fds: list[int]) -> int:
        for fd in fds:
            os.close(fd)
        return self.shutdown(EXIT_CONTROL)

    def fork(self, number: int, uid: int, fds: list[int]) -> None:
        if uid and self.uids is not None:
            self.uids.kill(uid)  # an earlier holder's processes (a host that died) must not share it
        sys.stderr.flush()  # nothing buffered here may be written again by the worker
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            self.send(FAILED, number, exc.errno or errno.EAGAIN)
            return
        if pid == 0:  # pragma: no cover - runs in the worker and never returns
            _become_worker(fds, uid, self.limits, self.child, self.keep)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.workers[number] = _Worker(pid, pidfd, uid)
        self.send(FORKED, number, pid, [pidfd])

    def end(self, worker: _Worker) -> None:
        """SIGKILL to the worker, its process group (exact: it is not reaped yet) and its uid."""
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(worker.pidfd, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(worker.pid, signal.SIGKILL)
        if worker.uid and self.uids is not None:
            self.uids.kill(worker.uid)

    def reap(self, number: int) -> None:
        worker = self.workers[number]
        if worker.pidfd not in self.reaping:
            self.end(worker)
        pid, status = os.waitpid(worker.pid, os.WNOHANG)
        if pid == 0:  # not dead yet: its pidfd turns readable when it is
            if worker.pidfd not in self.reaping:
                self.reaping[worker.pidfd] = number
                self.poll.register(worker.pidfd, select.POLLIN)
            return
        if self.reaping.pop(worker.pidfd, None) is not None:
            self.poll.unregister(worker.pidfd)
        os.close(worker.pidfd)
        del self.workers[number]
        self.send(EXITED, number, status)

    def shutdown(self, code: int) -> int:
        """Kill and reap every worker still here; ``code``."""
        for worker in self.workers.values():
            self.end(worker)
        for worker in self.workers.values():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(worker.pid, 0)
        self.workers.clear()
        return code


def _harden() -> None:
    """Out of a worker's reach: non-dumpable (checked), no core file."""
    if _LIBC.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or _LIBC.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        print("codemode worker template: cannot make itself non-dumpable", file=sys.stderr)
        raise SystemExit(EXIT_SETUP)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="codemode_worker.template")
    parser.add_argument("--control", type=int, required=True, help="descriptor of the control socket")
    parser.add_argument("--cpu-seconds", type=int, default=30)
    parser.add_argument("--address-space", type=int, default=0)
    parser.add_argument("--open-files", type=int, default=32)
    parser.add_argument("--max-processes", type=int, default=16)
    parser.add_argument("--killer-uid", type=int, default=0, help="see UidKiller (0: workers keep its uid)")
    parser.add_argument("--testing", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.stdout = sys.stderr  # nothing of the template's goes to a worker's stdout
    _harden()
    control = socket.socket(fileno=args.control)
    limits = Limits(args.cpu_seconds, args.address_space, args.open_files, args.max_processes)
    confinement.binding()  # loaded now: a worker builds its filter without reading a file
    confinement.prepare()  # the filter builds here, or no worker would (exits EXIT_CONFINEMENT)
    # The worker's Landlock rules, gathered once (fails closed here as a worker would); the testing
    # child opens its window first and gathers its own.
    files = None if args.testing else confinement.prepare_files()
    child = _worker_child(args.testing, files)
    gc.collect()
    gc.freeze()  # the warm state: shared by every forked worker, never collected
    keep = files.fd if files is not None else None
    return Template(control, limits, child, args.killer_uid, keep).run()


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)
