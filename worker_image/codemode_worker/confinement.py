"""The worker confines itself: Landlock and its own seccomp filter, before it reads the first frame.

``restrict_files()`` runs first thing, while the worker has one thread: the Landlock domain of
``readable`` (every file it can read stays readable; device nodes under ``/dev`` but a few are not:
no pseudo-terminal from ``/dev/ptmx``; no ptrace access to processes outside the domain).
``prepare()`` runs after the warm-up, while the worker may still read the interpreter's files (it
loads libseccomp's binding and builds the filter); ``confine(filter)`` runs after the uid drop
(``privileges``: the filter refuses changing ids), on whatever runtime the worker is in (process,
Docker with runc or gVisor, Kubernetes), so the same boundary holds on any engine or node with no
operator setup. ``confine`` does, in order:

1. ``RLIMIT_FSIZE`` goes to 0 (soft and hard, so for good): no regular file can grow through a
   descriptor the worker holds or gets (Kubernetes bind-mounts a writable ``/dev/termination-log``
   into every pod; the filter already refuses opening any file for writing);
2. ``RLIMIT_NOFILE`` goes to ``OPEN_FILES_HEADROOM`` above the highest descriptor it holds (soft
   and hard): what bounds the pseudo-terminals a worker can hold where the kernel has no Landlock;
3. ``PR_SET_DUMPABLE`` 0: no other process of its uid (another worker of a host that is not root)
   can read its memory through ``/proc/<pid>/mem``;
4. with ``CODEMODE_WORKER_STDERR=bounded`` in its environment (the Kubernetes runtime sets it: a
   pod's stderr is its container log on the node's disk, which the kubelet bounds only every few
   seconds), stderr and the stray-output descriptor 1 go through ``stderr_relay``, which passes on
   the first 8 KiB and drops the rest: what the program makes it print stays bounded (where the
   pod's own seccomp profile refuses ``fork``, as the project's ``Localhost`` profile does, there is
   no relay and stderr stays as it was);
5. ``PR_SET_NO_NEW_PRIVS`` (libseccomp's ``CTL_NNP``, set before the filter is loaded);
6. the filter of ``syscalls`` (allow-list; ``EPERM`` for the denied calls, ``ENOSYS`` for the
   unlisted ones, ``EAGAIN`` for a shared futex wait), loaded with ``CTL_TSYNC`` so it holds on
   every thread of the process;
7. a check that it holds: ``memfd_create`` must now be refused with ``EPERM``.

**Fail closed**: any failure on the way (no libseccomp binding, a limit or the filter that cannot be
set, Landlock present but not holding, a check that does not hold) ends the process with
``EXIT_CONFINEMENT`` before any frame is read.

The binding is libseccomp's own Python module ``seccomp`` (Debian's ``python3-seccomp``; libseccomp
is linked into it statically). The worker image carries it in its site directory; a process-runtime
worker runs the host's Python, which finds it on its own path or, for a Python that is not Debian's
(a virtualenv, pyenv), in Debian's ``/usr/lib/python3/dist-packages`` (only that one file is loaded).

``python -m codemode_worker.confinement`` confines a child of that process and checks that each
denied kind of call is refused (the worker image's build runs it, see worker_image/Dockerfile); the
child's report comes back through a pipe, so it reaches a redirected stdout or stderr too.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib.machinery
import importlib.util
import os
import resource
import struct
import sys
from types import ModuleType
from typing import Any, Final

from . import STDERR_BOUNDED, STDERR_VARIABLE, landlock, readable, stderr_relay, syscalls

__all__ = [
    "BINDING_DIRECTORIES",
    "EXIT_CONFINEMENT",
    "OPEN_FILES_HEADROOM",
    "CompiledFilter",
    "binding",
    "build_filter",
    "compile_filter",
    "confine",
    "export",
    "main",
    "prepare",
    "prepare_files",
    "restrict_files",
]

EXIT_CONFINEMENT: Final = 5
#: Descriptors a confined worker may open beyond those it holds (a lazy import, a probe's file).
OPEN_FILES_HEADROOM: Final = 16
_PR_SET_DUMPABLE: Final = 4
#: Where a Python that does not see it on its own path looks for libseccomp's binding.
BINDING_DIRECTORIES: Final = ("/usr/lib/python3/dist-packages",)
_MODULE: Final = "seccomp"
_PR_SET_NO_NEW_PRIVS: Final = 38
_SECCOMP_SET_MODE_FILTER: Final = 1
_SECCOMP_FILTER_FLAG_TSYNC: Final = 1
_MISSING: Final = (
    "libseccomp's Python binding (module 'seccomp') is missing: install Debian's python3-seccomp"
)


def binding() -> ModuleType:
    """libseccomp's Python module; ``ImportError`` (naming the package) when there is none."""
    try:
        return importlib.import_module(_MODULE)  # also the one loaded from a directory below
    except ImportError:
        if _MODULE in sys.modules:  # None: imports of it are blocked
            raise ImportError(_MISSING) from None
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # .cpython-311-x86_64-linux-gnu.so
    for directory in BINDING_DIRECTORIES:
        path = os.path.join(directory, _MODULE + suffix)
        if os.path.isfile(path):
            loader = importlib.machinery.ExtensionFileLoader(_MODULE, path)
            spec = importlib.util.spec_from_file_location(_MODULE, path, loader=loader)
            if spec is None:
                continue
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            sys.modules[_MODULE] = module
            return module
    raise ImportError(_MISSING)


def _arg(sc: Any, arg: syscalls.Arg) -> Any:
    if arg.negate:
        return sc.Arg(arg.index, sc.NE, arg.value)
    if arg.mask == 0xFFFFFFFFFFFFFFFF:
        return sc.Arg(arg.index, sc.EQ, arg.value)
    return sc.Arg(arg.index, sc.MASKED_EQ, arg.mask, arg.value)


def build_filter(sc: Any, pid: int | None = None) -> Any:
    """The worker's filter (not loaded): ``syscalls`` for this machine's architecture and the
    process ``pid`` (default: this one; ``OWN_PROCESS`` calls name it)."""
    own = os.getpid() if pid is None else pid
    flt = sc.SyscallFilter(sc.ERRNO(syscalls.UNLISTED_ERRNO))
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(syscalls.UNLISTED_ERRNO))  # not libseccomp's kill
    flt.set_attr(sc.Attr.CTL_NNP, 1)
    flt.set_attr(sc.Attr.CTL_TSYNC, 1)
    deny = sc.ERRNO(syscalls.DENY_ERRNO)
    retry = sc.ERRNO(syscalls.RETRY_ERRNO)
    for name in sorted(syscalls.ALLOWED):
        flt.add_rule(sc.ALLOW, name)
    for name in sorted(syscalls.DENIED):
        flt.add_rule(deny, name)
    for name, cond in sorted(syscalls.CONDITIONAL.items()):
        for rule in cond.allow:
            flt.add_rule(sc.ALLOW, name, *(_arg(sc, a) for a in rule))
        for rule in cond.refuse:
            flt.add_rule(deny, name, *(_arg(sc, a) for a in rule))
        for rule in cond.retry:
            flt.add_rule(retry, name, *(_arg(sc, a) for a in rule))
    for name in sorted(syscalls.OWN_PROCESS):
        flt.add_rule(sc.ALLOW, name, sc.Arg(0, sc.EQ, own))
        flt.add_rule(deny, name, sc.Arg(0, sc.NE, own))
    return flt


def export(flt: Any) -> bytes:
    """The BPF program libseccomp loads for ``flt`` (its ``export_bpf``, read back through a pipe)."""
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(write_end, "wb", closefd=True) as out:
            flt.export_bpf(out)
        chunks = []
        while chunk := os.read(read_end, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(read_end)
    return b"".join(chunks)


#: libc and the seccomp program's structure, made once at import (a warm template's workers inherit
#: them): each cost a forked worker 0.15-0.2 ms of CPU per use on a loaded machine.
_LIBC: Final = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class CompiledFilter:
    """The worker's filter compiled once, for a worker forked later (``codemode_worker.template``).

    The filter names the worker's own pid (``OWN_PROCESS``), which a template learns only after the
    fork, and building it with libseccomp costs the worker about a millisecond of CPU. So the
    template has libseccomp build the filter for two sentinel pids and compares the two programs:
    they must be the same instruction for instruction except for the 32-bit constants that held the
    sentinels, whose places are recorded. ``program(pid)`` is then libseccomp's program for ``pid``,
    byte for byte (``tests/unit/test_worker_confinement.py`` compares it with a fresh build for many
    pids); when the two programs differ in any other way it refuses (``ValueError``), and the worker
    builds its filter itself.
    """

    SENTINELS: Final = (0x7FFF_FFF1, 0x7FFF_FFF3)
    _INSN: Final = struct.Struct("=HBBI")

    def __init__(self, sc: Any) -> None:
        first, second = (export(build_filter(sc, pid)) for pid in self.SENTINELS)
        size = self._INSN.size
        if not first or len(first) != len(second) or len(first) % size:
            raise ValueError("the filter's programs for two pids differ in length")
        places = []
        for at in range(0, len(first), size):
            a, b = first[at : at + size], second[at : at + size]
            if a == b:
                continue
            code_a, jt_a, jf_a, k_a = self._INSN.unpack(a)
            code_b, jt_b, jf_b, k_b = self._INSN.unpack(b)
            if (code_a, jt_a, jf_a) != (code_b, jt_b, jf_b) or (k_a, k_b) != self.SENTINELS:
                raise ValueError("the filter's programs for two pids differ beyond the pid")
            places.append(at + 4)  # the k field
        if not places:
            raise ValueError("the filter names no pid")
        self._program = first
        self._places = tuple(places)
        self._seccomp = int(sc.resolve_syscall(sc.Arch.NATIVE, "seccomp"))

    def program(self, pid: int) -> bytes:
        """libseccomp's program of the worker's filter for ``pid``."""
        if not 0 < pid < self.SENTINELS[0]:
            raise ValueError("pid out of range")
        program = bytearray(self._program)
        for at in self._places:
            struct.pack_into("=I", program, at, pid)
        return bytes(program)

    def load(self, pid: int) -> None:
        """Load ``program(pid)`` into this process: ``PR_SET_NO_NEW_PRIVS``, then
        ``seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC)`` (what libseccomp's ``load``
        does with the attributes ``build_filter`` sets). ``OSError`` when the kernel refuses."""
        if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        program = self.program(pid)
        code = ctypes.create_string_buffer(program, len(program))
        fprog = _SockFprog(len(program) // self._INSN.size, ctypes.addressof(code))
        if (
            _LIBC.syscall(
                self._seccomp, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(fprog)
            )
            != 0
        ):
            raise OSError(ctypes.get_errno(), "seccomp")


def compile_filter() -> CompiledFilter | None:
    """The worker's filter compiled for any pid, or None when that cannot be (then each worker builds
    its own with ``prepare``)."""
    try:
        return CompiledFilter(binding())
    except (ImportError, OSError, RuntimeError, ValueError):
        return None


def _fail(reason: str) -> SystemExit:
    print(f"codemode worker: cannot confine itself: {reason}", file=sys.stderr)
    return SystemExit(EXIT_CONFINEMENT)


def restrict_files(prepared: landlock.Ruleset | None = None) -> int | None:
    """The Landlock domain of ``readable`` (call it while the process has one thread): its ABI
    version, None without Landlock; ``SystemExit(EXIT_CONFINEMENT)`` when it does not hold.
    ``prepared``: the ruleset of :func:`prepare_files`, inherited from the template (enforced and
    its descriptor closed), else the rules are gathered here."""
    try:
        return readable.restrict(prepared)
    except readable.Failed as exc:
        raise _fail(str(exc)) from None


def prepare_files() -> landlock.Ruleset | None:
    """The Landlock ruleset of ``readable``, filled for forked workers to enforce (the template
    calls it once; ``readable.prepare``): None without Landlock; ``SystemExit(EXIT_CONFINEMENT)``
    when Landlock is there but a rule cannot be added."""
    try:
        return readable.prepare()
    except readable.Failed as exc:
        raise _fail(str(exc)) from None


def prepare() -> Any:
    """The worker's filter, built (``SystemExit(EXIT_CONFINEMENT)`` when it cannot be)."""
    try:
        return build_filter(binding())
    except (ImportError, OSError, RuntimeError, ValueError) as exc:
        raise _fail(str(exc)) from None


def _holds() -> bool:
    """Whether the filter is in force: ``memfd_create`` (allowed by every engine's default profile)
    is refused with the filter's errno."""
    try:
        os.close(os.memfd_create("codemode-check"))
    except OSError as exc:
        return exc.errno == syscalls.DENY_ERRNO
    return False


def _open_files_limit() -> int:
    held = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = held + 1 + OPEN_FILES_HEADROOM
    return wanted if soft == resource.RLIM_INFINITY else min(soft, wanted)


def _not_dumpable() -> None:
    if _LIBC.prctl(ctypes.c_int(_PR_SET_DUMPABLE), ctypes.c_ulong(0), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_DUMPABLE")


def confine(flt: Any) -> None:
    """Limits, no dumping, a bounded stderr, NO_NEW_PRIVS and the prepared filter on every thread,
    checked; or ``SystemExit(EXIT_CONFINEMENT)``. ``flt`` is a filter of ``prepare`` (or
    ``build_filter``), or a ``CompiledFilter`` (loaded for this process's pid)."""
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        files = _open_files_limit()
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
        _not_dumpable()  # before the relay's fork: the relay is not dumpable either
        if os.environ.get(STDERR_VARIABLE) == STDERR_BOUNDED:
            sys.stderr.flush()
            with contextlib.suppress(PermissionError):  # a profile refusing fork (the project's)
                stderr_relay.start()
        if isinstance(flt, CompiledFilter):
            flt.load(os.getpid())
        else:
            flt.load()
    except (OSError, RuntimeError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if not _holds():
        raise _fail("the seccomp filter does not hold")


def _refused(fn: Any) -> bool:
    try:
        fn()
    except OSError as exc:
        return exc.errno in (errno.EPERM, errno.ENOSYS, errno.EACCES)
    return False


def main() -> int:
    """Check the confinement in a child process (``_check``) and pass its report on: a confined
    process can grow no file (``RLIMIT_FSIZE`` 0), so the child writes into a pipe and this process,
    not confined, writes the report where its stdout (success) or stderr (failure) goes."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            code = _check()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        report += f"codemode worker: the confined check died of signal {-code}\n".encode()
        code = 1
    elif code == 0 and not report:  # it ended without its report (e.g. an execve that went through)
        report = b"codemode worker: the confined check ended without its report\n"
        code = 1
    stream = sys.stdout if code == 0 else sys.stderr
    stream.buffer.write(report)
    stream.flush()
    return code


def _check() -> int:
    """Confine this process, then check that one call of each denied kind is refused."""
    import ctypes
    import socket
    import threading

    landlock_abi = restrict_files()
    confine(prepare())
    libc = ctypes.CDLL(None, use_errno=True)

    def unshare() -> None:
        if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
            raise OSError(ctypes.get_errno(), "unshare")

    checks = {
        "execve": lambda: os.execv(sys.executable, [sys.executable, "-c", "pass"]),
        "fork": os.fork,
        "socket": lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM),
        "memfd_create": lambda: os.memfd_create("check"),
        "open for writing": lambda: os.open("/dev/null", os.O_WRONLY),
        "unshare": unshare,
    }
    if landlock_abi is not None:
        checks["opening /dev/ptmx"] = lambda: os.close(os.open("/dev/ptmx", os.O_RDONLY | os.O_NOCTTY))
    failed = [name for name, fn in checks.items() if not _refused(fn)]
    thread = threading.Thread(target=lambda: None)
    thread.start()  # threads still work
    thread.join()
    if failed:
        print("codemode worker: not refused under the filter: " + ", ".join(failed), file=sys.stderr)
        return 1
    landlock = f"Landlock ABI {landlock_abi}" if landlock_abi is not None else "no Landlock on this kernel"
    print(f"seccomp filter holds ({len(checks)} kinds of call refused, threads work; {landlock})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
