"""The kernel-surface probe of a compromised worker, shared by the process, Docker and
Kubernetes escape tests (no tests here).

``PROBE`` is Python for the TEST-ONLY worker entry (it stands in for an interpreter an attacker
controls). It tries each system call the worker's own seccomp filter (``codemode_worker.confinement``)
refuses, with arguments that succeed, or fail with another errno, where nothing filters them, and
reports ``"allowed"`` or the errno's name for each. ``not_refused(report)`` lists the calls that were
not refused the way the filter refuses (EPERM, or ENOSYS for what it treats as absent). x86_64 numbers.

Calls that could replace or take over the worker (``execve``, ``ptrace(TRACEME)``) run in a forked
child while ``fork`` works (the unconfined worker): there they report through a pipe. Under the filter
``fork`` itself is refused and they are tried in the worker itself, where they fail at once.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

__all__ = ["DENIED_BY_FILTER", "PROBE", "not_refused"]

#: The errnos a refused call gets from the worker's filter.
DENIED_BY_FILTER = frozenset({"EPERM", "ENOSYS"})

PROBE = textwrap.dedent(
    r"""
    import ctypes, errno, mmap, os, socket, sys

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    NR = {"io_uring_setup": 425, "ptrace": 101, "bpf": 321, "keyctl": 250, "add_key": 248,
          "request_key": 249, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
          "pivot_root": 155, "fsopen": 430, "open_tree": 428, "move_mount": 429, "fsmount": 432,
          "perf_event_open": 298, "userfaultfd": 323, "process_vm_readv": 310, "personality": 135,
          "clone3": 435, "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240}

    def name(code):
        return errno.errorcode.get(code, str(code))

    def syscall(call, *args):
        ctypes.set_errno(0)
        args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
        r = libc.syscall(ctypes.c_long(NR[call]), *args)
        if r >= 0:
            return "allowed"
        return name(ctypes.get_errno())

    def attempt(fn):
        try:
            fn()
        except OSError as exc:
            return name(exc.errno)
        return "allowed"

    def in_child(fn):
        # fn() runs in a forked child that reports through a pipe; without fork (the filter),
        # in this process (where a refused call fails at once).
        try:
            r, w = os.pipe()
        except OSError:
            return fn(None)
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return fn(None)
        if pid == 0:
            os.close(r)
            try:
                result = fn(w)
            except BaseException:
                result = "child-error"
            os.write(w, result.encode())
            os._exit(0)
        os.close(w)
        out = b""
        while chunk := os.read(r, 100):
            out += chunk
        os.close(r)
        os.waitpid(pid, 0)
        return out.decode() or "no-report"

    # An interpreter this (possibly unprivileged) process can read and run.
    ELF = next(
        p for p in (os.path.realpath(sys.executable), "/usr/bin/python3") if os.access(p, os.R_OK | os.X_OK)
    )

    def execute(path, w):
        # execve(path): the new image reports "allowed" through the pipe.
        code = "import os; os.write(%d, b'allowed')" % (w if w is not None else 2)
        if w is not None:
            os.set_inheritable(w, True)
        try:
            os.execv(path, [path, "-I", "-c", code])
        except OSError as exc:
            return name(exc.errno)
        return "unreachable"

    def memfd_exec(w):
        try:
            fd = os.memfd_create("probe")
        except OSError as exc:
            return "memfd_create:" + name(exc.errno)
        try:
            with open(ELF, "rb") as src:
                while block := src.read(1 << 20):
                    os.write(fd, block)
        except OSError as exc:
            return "write:" + name(exc.errno)
        return execute("/proc/self/fd/%d" % fd, w)

    def traceme(w):
        ctypes.set_errno(0)
        return "allowed" if libc.ptrace(0, 0, None, None) == 0 else name(ctypes.get_errno())

    def int80_getpid():
        # The 32-bit ABI from a 64-bit process (another audit arch: the filter's bad-arch action).
        buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        buf.write(bytes([0xB8, 0x14, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20 (getpid); int 0x80; ret
        r = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()
        return "allowed" if r >= 0 else name(-r)

    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    def socket_of(family, kind):
        return lambda: socket.socket(family, kind).close()

    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    # struct bpf_attr for BPF_MAP_CREATE: an array map of one 4-byte value
    map_attr = ctypes.create_string_buffer(bytes([2, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 1]) + bytes(60))
    # struct perf_event_attr: a software CPU clock counter (type 1, size 128)
    perf_attr = ctypes.create_string_buffer(bytes([1, 0, 0, 0, 128]) + bytes(123))
    own = ctypes.create_string_buffer(8)
    iov_local = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.create_string_buffer(8), ctypes.c_void_p), 8)
    iov_remote = (ctypes.c_void_p * 2)(ctypes.cast(own, ctypes.c_void_p), 8)
    user_ns = os.open("/proc/self/ns/user", os.O_RDONLY)
    report = {
        "io_uring_setup": syscall("io_uring_setup", 1, params),
        "socket_vsock": attempt(socket_of(socket.AF_VSOCK, socket.SOCK_STREAM)),
        "socket_inet": attempt(socket_of(socket.AF_INET, socket.SOCK_STREAM)),
        "socket_inet6": attempt(socket_of(socket.AF_INET6, socket.SOCK_DGRAM)),
        "socket_unix": attempt(socket_of(socket.AF_UNIX, socket.SOCK_STREAM)),
        "socket_netlink": attempt(socket_of(socket.AF_NETLINK, socket.SOCK_RAW)),
        "socketpair": attempt(lambda: [s.close() for s in socket.socketpair()]),
        "ptrace_traceme": in_child(traceme),
        "bpf_map_create": syscall("bpf", 0, map_attr, 72),
        "keyctl": syscall("keyctl", 0, -3, 1),  # KEYCTL_GET_KEYRING_ID of the session keyring
        "add_key": syscall("add_key", b"user", b"probe", b"x", 1, -3),
        "request_key": syscall("request_key", b"user", b"probe", None, 0),
        "unshare_user": syscall("unshare", 0x10000000),
        "unshare_net": syscall("unshare", 0x40000000),
        "setns": syscall("setns", user_ns, 0),
        "clone3": syscall("clone3", None, 0),
        "mount": syscall("mount", b"none", b"/tmp", b"tmpfs", 0, None),
        "umount2": syscall("umount2", b"/proc", 2),
        "pivot_root": syscall("pivot_root", b"/", b"/"),
        "fsopen": syscall("fsopen", b"tmpfs", 0),
        "open_tree": syscall("open_tree", -100, b"/", 1),  # OPEN_TREE_CLONE
        "move_mount": syscall("move_mount", -100, b"/", -100, b"/tmp", 0),
        "fsmount": syscall("fsmount", -1, 0, 0),
        "perf_event_open": syscall("perf_event_open", perf_attr, 0, -1, -1, 0),
        "userfaultfd": syscall("userfaultfd", 1),  # UFFD_USER_MODE_ONLY: no privilege needed
        "process_vm_readv": syscall("process_vm_readv", os.getpid(), iov_local, 1, iov_remote, 1, 0),
        "personality": syscall("personality", 0xFFFFFFFF),  # query only
        "shmget": syscall("shmget", 0, 4096, 0o1600),  # IPC_PRIVATE, IPC_CREAT | 0600
        "semget": syscall("semget", 0, 1, 0o1600),
        "msgget": syscall("msgget", 0, 0o1600),
        "mq_open": syscall("mq_open", b"probe", 0o100 | 2, 0o600, None),  # O_CREAT | O_RDWR
        "int80_getpid": int80_getpid(),
        "fork": attempt(fork),
        "memfd_exec": in_child(memfd_exec),
        "execve": in_child(lambda w: execute(ELF, w)),
    }
    os.close(user_ns)
    status = dict(l.split(":", 1) for l in proc_text("/proc/self/status").splitlines() if ":" in l)
    report["_seccomp"] = status.get("Seccomp", "?").strip()
    report["_no_new_privs"] = status.get("NoNewPrivs", "?").strip()
    final(report)
    """
)


def not_refused(report: Mapping[str, Any]) -> dict[str, Any]:
    """The probed calls (and their outcomes) that the filter did not refuse."""
    return {
        call: outcome
        for call, outcome in report.items()
        if not call.startswith("_") and outcome.removeprefix("memfd_create:") not in DENIED_BY_FILTER
    }
