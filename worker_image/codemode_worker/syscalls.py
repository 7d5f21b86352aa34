"""The worker's system-call policy, as data: what a confined worker may call (x86_64 names).

``confinement`` turns it into the seccomp filter the worker installs on itself before it reads the
first frame; the Docker runtime turns it into the container's profile (``codemode.runtimes.seccomp``).
Pure Python: nothing here loads libseccomp.

From the filter on, the worker only computes, reads files it can already read, answers on stdin and
stdout, and runs threads (the interpreter thread; Rust's and glibc's helpers). So:

``ALLOWED``
    the calls CPython 3.11, starlark-pyo3 and the worker loop make after start-up (memory, threads,
    signals of its own, reading files, the time), measured on the whole test suite (docs/security
    notes in docs/reference/runtimes.md).
``CONDITIONAL``
    allowed only with the arguments given: ``clone`` for threads (``CLONE_THREAD`` and no namespace
    flag), ``openat`` for reading (no write access, no ``O_CREAT``/``O_TRUNC``), ``prlimit64`` and
    ``fcntl`` read-mostly uses, ``tgkill`` of its own threads, ``ioctl`` requests that only read,
    ``futex`` on private futexes only (``FUTEX_PRIVATE_FLAG``, see below), ``madvise`` with any
    advice but KSM's (``MADV_MERGEABLE``/``MADV_UNMERGEABLE``: merging a page with another tenant's
    page of the same content, which the time of a write to it would tell).
``DENIED``
    refused with ``EPERM`` (a denial a probe can see): process creation and ``execve``, sockets,
    io_uring, ptrace and other processes' memory, bpf, perf, keys, namespaces, mounts, module and
    kernel control, files opened for writing, SysV and POSIX IPC, ``memfd_create``, ``personality``,
    changing ids or limits, ``seccomp`` itself. Writes through the conditional calls' refused
    argument forms get ``EPERM`` too.

Private futexes only: a futex of a shared mapping of a file is keyed by the file's inode, which every
container of one image on a node (every process-runtime worker of one host) shares, so a shared
``FUTEX_WAKE`` reaches a waiter of another tenant and its count acknowledges each bit (a covert
channel). A private futex is keyed by the process's own memory. Every ``futex`` command
without ``FUTEX_PRIVATE_FLAG`` is refused: the waits (``FUTEX_WAIT``, ``FUTEX_WAIT_BITSET``) with
``EAGAIN``, the others with ``EPERM``. The wait is the end that matters: a thread's end wakes its
``clear_child_tid`` word with a shared wake no filter sees. ``EAGAIN`` is what a waiter gets when the
word changed before it slept, which every waiter takes as a reason to look at its word again:
glibc's ``pthread_join``, which waits on the joined thread's tid word with a shared futex (the kernel
clears that word and wakes it with a shared wake), loops until the kernel has cleared it, where
``ENOSYS`` or ``EPERM`` would make glibc abort. ``futex_waitv`` and futex2's ``futex_requeue`` carry
their flags in memory, where no filter looks, and nothing the worker runs calls futex2's
``futex_wake`` or ``futex_wait``: all four are unlisted.

``sysinfo`` is denied: its process count and free memory are the whole machine's, a channel between
tenants (one's threads are the other's count); glibc asks it only for ``sysconf(_SC_PHYS_PAGES)``,
once per process at the interpreter's start (its ``qsort``), before the filter.

Everything else gets ``ENOSYS`` ("this kernel has no such call"), and so does a call of another
ABI (a 32-bit ``int 0x80`` call: libseccomp's bad-architecture action): libc then takes the fallback it
has for older kernels (``clone3`` -> ``clone``, ``faccessat2`` -> ``faccessat``, ``statx`` ->
``newfstatat``), where ``EPERM`` would make a thread or a file check fail. No action kills: a refused
call is an ``OSError`` the program (or a probe) sees. Two calls pass every seccomp filter, this one
included, on a kernel that has them: ``uretprobe`` and ``uprobe``, which user probes' trampolines
make; outside a trampoline ``uretprobe`` ends the caller with ``SIGILL`` and ``uprobe`` fails with
``ENXIO``.
"""

from __future__ import annotations

import errno
import os

# NamedTuple, not dataclasses: importing dataclasses (and inspect, ast, dis with it) costs about
# 13 ms of CPU at every start of a single-use worker (a container or pod per execute).
from typing import Final, NamedTuple

__all__ = [
    "ABSENT",
    "ALLOWED",
    "CLONE_NAMESPACES",
    "CONDITIONAL",
    "DENIED",
    "DENY_ERRNO",
    "FUTEX_PRIVATE_FLAG",
    "RETRY_ERRNO",
    "UNLISTED_ERRNO",
    "WRITE_FLAGS",
    "Arg",
    "Conditional",
    "Rule",
]

DENY_ERRNO: Final = errno.EPERM
"""What a call in ``DENIED`` (or a refused argument form of a ``CONDITIONAL`` call) gets."""
UNLISTED_ERRNO: Final = errno.ENOSYS
"""What every call on no list gets."""
RETRY_ERRNO: Final = errno.EAGAIN
"""What a ``CONDITIONAL`` call's ``retry`` forms get: a shared futex wait (see above)."""


class Arg(NamedTuple):
    """``(argument[index] & mask) == value`` (``!=`` when ``negate``)."""

    index: int  # type: ignore[assignment]  # the argument's position (the field, not tuple.index)
    value: int
    mask: int = 0xFFFFFFFFFFFFFFFF
    negate: bool = False


Rule = tuple[Arg, ...]
"""Argument comparisons that must all hold."""


class Conditional(NamedTuple):
    """A call allowed when one of the ``allow`` rules holds; ``refuse`` rules get ``DENY_ERRNO`` and
    ``retry`` rules ``RETRY_ERRNO`` (libseccomp cannot say "otherwise", so the refused forms are
    spelled out, and no two rules of one call may match the same arguments; any form on no list gets
    ``UNLISTED_ERRNO``)."""

    allow: tuple[Rule, ...]
    refuse: tuple[Rule, ...] = ()
    retry: tuple[Rule, ...] = ()


def _bits(mask: int) -> list[int]:
    return [1 << i for i in range(64) if mask >> i & 1]


CLONE_THREAD: Final = 0x00010000
#: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID and NEWNET (NEWTIME needs clone3, which
#: is "absent").
CLONE_NAMESPACES: Final = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
)
#: Open flags that write or create: a confined worker opens files for reading only.
WRITE_FLAGS: Final = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC
#: ``futex``'s flag for a futex of the process's own memory (also futex2's ``FUTEX2_PRIVATE``).
FUTEX_PRIVATE_FLAG: Final = 128
#: ``futex``'s command: the operation without ``FUTEX_PRIVATE_FLAG`` and ``FUTEX_CLOCK_REALTIME``.
_FUTEX_COMMAND: Final = 0x7F
_FUTEX_WAIT, _FUTEX_WAIT_BITSET, _FUTEX_LOCK_PI2 = 0, 9, 13
#: ``madvise``'s MADV_MERGEABLE (12) and MADV_UNMERGEABLE (13): KSM.
_MADV_MERGEABLE: Final = 12
_TCGETS: Final = 0x5401
_FIONREAD: Final = 0x541B
_F_GETFD, _F_SETFD, _F_GETFL, _F_DUPFD_CLOEXEC = 1, 2, 3, 1030


def _read_only(index: int) -> Conditional:
    return Conditional(
        allow=((Arg(index, 0, WRITE_FLAGS),),), refuse=tuple((Arg(index, b, b),) for b in _bits(WRITE_FLAGS))
    )


def _one_of(index: int, values: tuple[int, ...]) -> Conditional:
    return Conditional(allow=tuple((Arg(index, v, 0xFFFFFFFF),) for v in values))


def _private_futex() -> Conditional:
    # An operation with FUTEX_PRIVATE_FLAG: allowed. Without it (the flag's bit and the command, so
    # that the rules match disjoint operations): a wait gets RETRY_ERRNO, every other command
    # DENY_ERRNO, an unknown command UNLISTED_ERRNO (what the kernel would answer).
    shared = _FUTEX_COMMAND | FUTEX_PRIVATE_FLAG
    waits = (_FUTEX_WAIT, _FUTEX_WAIT_BITSET)
    return Conditional(
        allow=((Arg(1, FUTEX_PRIVATE_FLAG, FUTEX_PRIVATE_FLAG),),),
        refuse=tuple((Arg(1, c, shared),) for c in range(_FUTEX_LOCK_PI2 + 1) if c not in waits),
        retry=tuple((Arg(1, c, shared),) for c in waits),
    )


ALLOWED: Final = frozenset(
    {
        # memory
        "brk",
        "mmap",
        "mprotect",
        "mremap",
        "munmap",
        "membarrier",
        # threads, their synchronization (futex: CONDITIONAL) and their end
        "get_robust_list",
        "set_robust_list",
        "rseq",
        "set_tid_address",
        "sched_yield",
        "sched_getaffinity",
        "exit",
        "exit_group",
        "restart_syscall",
        # signals of its own
        "rt_sigaction",
        "rt_sigprocmask",
        "rt_sigreturn",
        "sigaltstack",
        # time
        "clock_gettime",
        "clock_getres",
        "clock_nanosleep",
        "gettimeofday",
        "nanosleep",
        "time",
        # identity (read only)
        "getpid",
        "getppid",
        "gettid",
        "getuid",
        "geteuid",
        "getgid",
        "getegid",
        "getgroups",
        "getresuid",
        "getresgid",
        "getrandom",
        "uname",
        # descriptors it has (stdin/stdout/stderr) and files it reads
        "read",
        "readv",
        "pread64",
        "write",
        "writev",
        "lseek",
        "close",
        "dup",
        "poll",
        "ppoll",
        "select",
        "pselect6",
        "fstat",
        "newfstatat",
        "stat",
        "lstat",
        "statx",
        "access",
        "faccessat",
        "faccessat2",
        "getcwd",
        "getdents64",
        "readlink",
        "readlinkat",
    }
)

CONDITIONAL: Final[dict[str, Conditional]] = {
    # threads only: a new process (no CLONE_THREAD) or namespace is refused
    "clone": Conditional(
        allow=((Arg(0, CLONE_THREAD, CLONE_THREAD | CLONE_NAMESPACES),),),
        refuse=((Arg(0, 0, CLONE_THREAD),), *((Arg(0, b, b),) for b in _bits(CLONE_NAMESPACES))),
    ),
    # files for reading only
    "openat": _read_only(2),
    "open": _read_only(1),
    # reading its own limits (what getrlimit does): setting one is refused
    "prlimit64": Conditional(
        allow=((Arg(0, 0), Arg(2, 0)),), refuse=((Arg(2, 0, negate=True),), (Arg(0, 0, negate=True),))
    ),
    # commands that read or set close-on-exec; requests that only read (isatty is TCGETS)
    "fcntl": _one_of(1, (_F_GETFD, _F_SETFD, _F_GETFL, _F_DUPFD_CLOEXEC)),
    "ioctl": _one_of(1, (_TCGETS, _FIONREAD)),
    # private futexes only: a shared one is keyed by a file's inode, which other tenants share
    "futex": _private_futex(),
    # any advice but KSM's (MADV_MERGEABLE, MADV_UNMERGEABLE: pages merged with another tenant's
    # pages of the same content, whose copy-on-write time tells they were); above 31, none exists
    # that an unprivileged process may give
    "madvise": Conditional(
        allow=tuple(
            (Arg(2, v, m),) for v, m in ((0, 0xFFFFFFF8), (8, 0xFFFFFFFC), (14, 0xFFFFFFFE), (16, 0xFFFFFFF0))
        ),
        refuse=((Arg(2, _MADV_MERGEABLE, 0xFFFFFFFE),),),
    ),
}

OWN_PROCESS: Final = frozenset({"tgkill"})
"""Allowed only when argument 0 is the worker's own pid (known when the filter is built): a signal
to one of its own threads (``abort()``, after a failed allocation, raises SIGABRT this way; the host
reads that death as the memory limit)."""

ABSENT: Final = frozenset({"clone3", "openat2", "close_range", "epoll_pwait2"})
"""Unlisted calls libc tries before an older one and gives up on only with ``UNLISTED_ERRNO``
(``clone3`` -> ``clone``): named so that a profile whose engine ignores its default errno (Docker
20.10 answers EPERM) still answers them with ENOSYS."""

DENIED: Final = frozenset(
    {
        # new programs and processes
        "execve",
        "execveat",
        "fork",
        "vfork",
        # sockets of any family (AF_VSOCK, AF_INET, AF_UNIX, AF_NETLINK ...) and their use
        "socket",
        "socketpair",
        "connect",
        "bind",
        "listen",
        "accept",
        "accept4",
        "sendto",
        "sendmsg",
        "sendmmsg",
        "recvfrom",
        "recvmsg",
        "recvmmsg",
        "setsockopt",
        "getsockopt",
        "getsockname",
        "getpeername",
        "shutdown",
        # io_uring
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        # other processes, debugging and the kernel's introspection
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "process_madvise",
        "pidfd_open",
        "pidfd_getfd",
        "pidfd_send_signal",
        "kcmp",
        "kill",
        "tkill",
        "rt_sigqueueinfo",
        "rt_tgsigqueueinfo",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "personality",
        "seccomp",
        "prctl",
        "arch_prctl",
        "modify_ldt",
        "iopl",
        "ioperm",
        "syslog",
        "lookup_dcookie",
        # keys
        "keyctl",
        "add_key",
        "request_key",
        # namespaces, mounts and the root
        "unshare",
        "setns",
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "open_tree",
        "move_mount",
        "mount_setattr",
        "name_to_handle_at",
        "open_by_handle_at",
        "quotactl",
        "quotactl_fd",
        # files: creating, writing, changing
        "creat",
        "memfd_create",
        "memfd_secret",
        "truncate",
        "ftruncate",
        "fallocate",
        "mknod",
        "mknodat",
        "mkdir",
        "mkdirat",
        "rmdir",
        "unlink",
        "unlinkat",
        "rename",
        "renameat",
        "renameat2",
        "link",
        "linkat",
        "symlink",
        "symlinkat",
        "chmod",
        "fchmod",
        "fchmodat",
        "chown",
        "fchown",
        "lchown",
        "fchownat",
        "utime",
        "utimes",
        "utimensat",
        "futimesat",
        "setxattr",
        "lsetxattr",
        "fsetxattr",
        "removexattr",
        "lremovexattr",
        "fremovexattr",
        "pwrite64",
        "pwritev",
        "pwritev2",
        "copy_file_range",
        "sendfile",
        "splice",
        "tee",
        "vmsplice",
        "fanotify_init",
        "inotify_init",
        "inotify_init1",
        "pipe",
        "pipe2",
        "eventfd",
        "eventfd2",
        "signalfd",
        "signalfd4",
        "timerfd_create",
        "epoll_create",
        "epoll_create1",
        "dup2",
        "dup3",
        # System V and POSIX IPC
        "shmget",
        "shmat",
        "shmctl",
        "semget",
        "semop",
        "semtimedop",
        "semctl",
        "msgget",
        "msgsnd",
        "msgrcv",
        "msgctl",
        "mq_open",
        "mq_unlink",
        "mq_timedsend",
        "mq_timedreceive",
        "mq_notify",
        "mq_getsetattr",
        # the whole machine's counters (process count, free memory, load)
        "sysinfo",
        # ids, limits, priorities, the clock and the machine
        "setuid",
        "setgid",
        "setreuid",
        "setregid",
        "setresuid",
        "setresgid",
        "setfsuid",
        "setfsgid",
        "setgroups",
        "capset",
        "setrlimit",
        "setpriority",
        "sched_setaffinity",
        "sched_setscheduler",
        "sched_setparam",
        "sched_setattr",
        "ioprio_set",
        "setsid",
        "setpgid",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "sethostname",
        "setdomainname",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "vhangup",
        "mbind",
        "set_mempolicy",
        "migrate_pages",
        "move_pages",
        "mlock",
        "mlock2",
        "mlockall",
    }
)
