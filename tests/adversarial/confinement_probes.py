"""Probes of the security review of the worker's self-confinement, shared by the
process, Docker and Kubernetes escape tests (no tests here). Each ``*_PROBE`` is Python for the
TEST-ONLY worker entry, which runs it under the worker's own seccomp filter.

``FORMS_PROBE`` tries the argument forms and ABIs a compromised interpreter would use to get around
an allow-list that looks at names and arguments: the x32 ABI (numbers with bit 30), ``clone``
flag combinations (a process, a namespace beside ``CLONE_THREAD``), ``posix_spawn``, ``fcntl`` and
``ioctl`` commands outside the allowed few, ``open`` with a write flag in any form (a high bit set,
access mode 3, ``O_TMPFILE``), setting limits or reading another process's, signals to other
processes, pidfds, stacking a seccomp filter of its own, ``arch_prctl``/``modify_ldt``, priorities,
the splice family and the handle-based opens. Each outcome is ``"allowed"`` or the errno's name;
``kernel_probe.not_refused(report)`` lists what the filter did not refuse. The flags are chosen so
that the kernel itself would reject the call (EINVAL) or it would do nothing harmful had the filter
let it through, so the probe cannot break the worker it runs in.

``PTY_PROBE`` opens ``/dev/ptmx`` read-only (the filter allows reading any file) up to ``PTY_CAP``
times and reports how many pseudo-terminals it got: the kernel's pty count is one per machine
(``kernel.pty.max`` minus ``kernel.pty.reserve`` for every container together), so every one a
worker holds is one another container cannot have.

``HOST_MEMORY_PROBE`` reads its parent's (the host's) memory through ``/proc/<ppid>/mem`` (an open
for reading, then ``pread64``: both allowed by the filter) and looks for ``NEEDLE``.

``STDERR_FLOOD`` writes ``STDERR_FLOOD_BYTES`` to stderr in two-byte lines, the form that costs a
container log the most per byte written.
"""

from __future__ import annotations

import textwrap

__all__ = [
    "FORMS_PROBE",
    "HOST_MEMORY_PROBE",
    "NEEDLE",
    "PTY_CAP",
    "PTY_PROBE",
    "STDERR_FLOOD",
    "STDERR_FLOOD_BYTES",
]

FORMS_PROBE = textwrap.dedent(
    r"""
    import ctypes, errno, os, sys

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    X32 = 0x40000000

    def name(code):
        return errno.errorcode.get(code, str(code))

    def sc(nr, *args):
        ctypes.set_errno(0)
        args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
        r = libc.syscall(ctypes.c_long(nr), *args)
        return "allowed" if r >= 0 else name(ctypes.get_errno())

    def attempt(fn):
        try:
            fn()
        except OSError as exc:
            return name(exc.errno)
        return "allowed"

    CLONE_VM, CLONE_FS, CLONE_SIGHAND, CLONE_THREAD = 0x100, 0x200, 0x800, 0x10000
    CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
    THREAD = CLONE_THREAD | CLONE_SIGHAND | CLONE_VM
    SIGCHLD = 17
    status = os.open(protocol.__file__, os.O_RDONLY)  # a file it may read
    buf = ctypes.create_string_buffer(64)
    me = os.getpid()
    noop = [sys.executable, "-I", "-c", ""]
    other = (1 << 22) + 1  # above PID_MAX_LIMIT: no such process anywhere (ESRCH unfiltered)
    siginfo = ctypes.create_string_buffer(b"\0" * 8 + (-1).to_bytes(4, "little", signed=True) + b"\0" * 116)
    report = {
        # the x32 ABI: another syscall table behind bit 30 of the number
        "x32_getpid": sc(X32 | 39),
        "x32_memfd_create": sc(X32 | 319, b"x", 0),
        "x32_socket": sc(X32 | 41, 2, 1, 0),
        "x32_mkdir": sc(X32 | 83, b"/tmp/x32", 0o700),
        # clone: a process, or a namespace beside CLONE_THREAD (the kernel rejects each with EINVAL)
        "clone_process_sighand": sc(56, CLONE_SIGHAND | SIGCHLD, 0, 0, 0, 0),
        "clone_vm_newns": sc(56, CLONE_VM | CLONE_FS | CLONE_NEWNS, 0, 0, 0, 0),
        "clone_thread_newuser": sc(56, THREAD | CLONE_NEWUSER, 0, 0, 0, 0),
        "clone_thread_newpid": sc(56, THREAD | CLONE_NEWPID, 0, 0, 0, 0),
        "clone_thread_newnet_newns": sc(56, THREAD | CLONE_FS | CLONE_NEWNS | CLONE_NEWNET, 0, 0, 0, 0),
        "posix_spawn": attempt(lambda: os.waitpid(os.posix_spawn(sys.executable, noop, {}), 0)),
        # fcntl and ioctl beyond the allowed read-only commands
        "fcntl_setfl": sc(72, status, 4, os.O_NONBLOCK),
        "fcntl_setown": sc(72, status, 8, me),
        "fcntl_setsig": sc(72, status, 10, 10),
        "fcntl_setlease": sc(72, status, 1024, 0),
        "fcntl_setpipe_sz": sc(72, 0, 1031, 1 << 16),
        "fcntl_setlk_high_bits": sc(72, status, (1 << 32) | 6, buf),
        "ioctl_tiocsti": sc(16, 0, 0x5412, ctypes.create_string_buffer(b"x")),
        "ioctl_fionbio": sc(16, status, 0x5421, ctypes.byref(ctypes.c_int(0))),
        "ioctl_fioclex": sc(16, status, 0x5451, 0),
        # opening for writing, in every spelling
        "open_wronly": sc(257, -100, b"/dev/null", os.O_WRONLY, 0),
        "open_rdwr": sc(257, -100, b"/dev/null", os.O_RDWR, 0),
        "open_accmode_3": sc(257, -100, b"/dev/null", 3, 0),
        "open_wronly_high_bits": sc(257, -100, b"/dev/null", os.O_WRONLY | (1 << 33), 0),
        "open_creat_rdonly": sc(257, -100, b"/dev/null", os.O_CREAT, 0o600),
        "open_trunc_rdonly": sc(257, -100, b"/dev/null", os.O_TRUNC, 0),
        "open_tmpfile": sc(257, -100, b"/tmp", os.O_TMPFILE | os.O_RDWR, 0o600),
        "legacy_open_wronly": sc(2, b"/dev/null", os.O_WRONLY, 0),
        "proc_self_mem_rdwr": sc(257, -100, b"/proc/self/mem", os.O_RDWR, 0),
        "openat2": sc(437, -100, b"/", ctypes.create_string_buffer(24), 24),
        "name_to_handle_at": sc(303, -100, b"/", buf, buf, 0),
        "open_by_handle_at": sc(304, -100, buf, 0),
        # limits: setting one, or reading another process's
        "prlimit_set_own": sc(302, 0, 7, ctypes.create_string_buffer(16), 0),
        "prlimit_read_other": sc(302, other, 7, 0, buf),
        # signals to other processes, pidfds
        "kill_group": sc(62, 0, 0),
        "kill_parent": sc(62, max(os.getppid(), 1), 0),
        "tkill": sc(200, me, 0),
        "tgkill_other": sc(234, other, other, 0),
        "rt_sigqueueinfo": sc(129, other, 0, siginfo),  # si_code SI_QUEUE
        "pidfd_open_self": sc(434, me, 0),
        "pidfd_send_signal": sc(424, 0, 0, 0, 0),
        "process_madvise": sc(440, 0, 0, 0, 0, 0),
        "kcmp": sc(312, me, me, 0, 0, 0),
        # another filter on top (a deny-all to hang the host, an errno on write ...)
        "seccomp_set_mode_filter": sc(317, 1, 0, 0),
        "prctl_set_seccomp": sc(157, 22, 2, 0, 0, 0),
        "prctl_set_name": sc(157, 15, b"x", 0, 0, 0),
        "arch_prctl_get_fs": sc(158, 0x1003, buf),
        "modify_ldt_read": sc(154, 0, buf, 16),
        # priorities and CPUs
        "sched_setaffinity": sc(203, 0, 8, ctypes.byref(ctypes.c_ulong(1))),
        "setpriority": sc(141, 0, 0, 19),
        "ioprio_set": sc(251, 1, 0, 0),
        "sched_setscheduler": sc(144, 0, 5, ctypes.byref(ctypes.c_int(0))),
        # the splice family into the frame stream
        "sendfile": sc(40, 2, status, 0, 1),
        "splice": sc(275, status, 0, 2, 0, 1, 0),
        "tee": sc(276, 0, 2, 1, 2),  # SPLICE_F_NONBLOCK
        "vmsplice": sc(278, 2, 0, 0, 0),
        "copy_file_range": sc(326, status, 0, 2, 0, 1, 0),
    }
    os.close(status)
    final(report)
    """
)

#: How many pseudo-terminals ``PTY_PROBE`` tries to take (any one is one too many).
PTY_CAP = 256

PTY_PROBE = textwrap.dedent(
    r"""
    import errno, os

    fds, stopped = [], None
    while len(fds) < PTY_CAP:
        try:
            fds.append(os.open("/dev/ptmx", os.O_RDONLY | os.O_NOCTTY))
        except OSError as exc:
            stopped = errno.errorcode.get(exc.errno, str(exc.errno))
            break
    for fd in fds:
        os.close(fd)
    final({"ptys": len(fds), "stopped_by": stopped})
    """
).replace("PTY_CAP", str(PTY_CAP))

#: What ``HOST_MEMORY_PROBE`` looks for (the test's host holds it; the probe spells it in two parts
#: so that its own source, which passes through the host, is not what it finds).
NEEDLE = "codemode-review-" + "host-secret-7f3a"

HOST_MEMORY_PROBE = (
    textwrap.dedent(
        r"""
    import os

    host = os.getppid()
    needle = NEEDLE_HEAD.encode() + NEEDLE_TAIL.encode()
    found, scanned = None, 0
    try:
        maps = open("/proc/%d/maps" % host).read().splitlines()
        mem = os.open("/proc/%d/mem" % host, os.O_RDONLY)
    except OSError as exc:
        final({"found": None, "error": type(exc).__name__, "scanned": 0})
    else:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or line.endswith(("[vvar]", "[vsyscall]", "[vvar_vclock]")):
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if hi - lo > 256 << 20:
                continue
            try:
                data = os.pread(mem, hi - lo, lo)
            except OSError:
                continue
            scanned += len(data)
            if needle in data:
                found = "host memory"
                break
        final({"found": found, "error": None, "scanned": scanned})
    """
    )
    .replace("NEEDLE_HEAD", repr(NEEDLE[:8]))
    .replace("NEEDLE_TAIL", repr(NEEDLE[8:]))
)

#: Bytes ``STDERR_FLOOD`` writes to stderr.
STDERR_FLOOD_BYTES = 4 << 20

STDERR_FLOOD = textwrap.dedent(
    r"""
    import os

    block, written = b"x\n" * 32768, 0
    while written < FLOOD_BYTES:
        written += os.write(2, block)
    final({"written": written})
    """
).replace("FLOOD_BYTES", str(STDERR_FLOOD_BYTES))
