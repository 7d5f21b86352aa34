"""The worker container's seccomp profile (Docker/OCI format), derived from the worker's own policy.

The worker installs its own filter (``codemode_worker.confinement``) before it reads a frame; this
profile is the layer under it, in force from the container's first instruction: the engine loads it
before the entrypoint runs, so it must also allow what happens before the worker confines itself
(``STARTUP``: what runc does between loading the profile and its ``execve`` of the interpreter —
it loads it last when no-new-privileges is set, as the runtime always sets it —, the interpreter's
start-up, duplicating stdout, the Landlock calls, setting ``RLIMIT_FSIZE`` and ``RLIMIT_NOFILE``,
``prctl`` and ``seccomp`` to load the worker's filter), and
``open``/``openat``, ``prlimit64``, ``fcntl`` and ``ioctl`` in any form. Everything else follows
``codemode_worker.syscalls``: the same allow-list, ``clone`` for threads only, ``futex`` on private
futexes only (``EAGAIN`` for a shared wait, ``EPERM`` for the other shared commands: the
``SCMP_CMP_MASKED_EQ`` conditions of the worker's filter), ``EPERM`` for the denied calls (sockets
of every family, io_uring, ptrace, bpf, keys, namespaces, mounts, fork ...), ``ENOSYS`` for the
rest.

``DockerRuntime`` passes it to every worker container (``--security-opt seccomp=<json>``). gVisor
(runsc) does not apply OCI profiles unless started with ``--oci-seccomp``; the worker's own filter
holds there. Kubernetes operators can install it on the nodes as a ``Localhost`` profile
(docs/kubernetes.md): ``python -m codemode.runtimes.seccomp_profile > codemode-worker.json``.

``supervisor_profile()`` is the profile of a *reusable* sandbox (the reuse mode), whose PID 1 is
``codemode_worker.supervisor``: the same, plus what the supervisor does between executes
(``SUPERVISOR``: fork its workers (``clone`` without ``CLONE_THREAD``; namespace flags stay
refused), wait for them, kill them and every other process, relay with pipes and ``splice``, remove
what a worker left (files, their extended attributes, System V IPC objects) and read its own
priority and scheduling). Every worker it forks installs the worker's own filter on top, which
refuses all of that again (``python -m codemode.runtimes.seccomp_profile --supervisor`` prints it).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Final

from codemode_worker import syscalls

__all__ = ["STARTUP", "SUPERVISOR", "docker_profile", "supervisor_profile"]

#: Calls of the container's start-up (before the worker's own filter) that the worker's policy denies
#: or does not list (the three Landlock calls: the worker enters its Landlock domain first thing;
#: ``sysinfo``: glibc's ``qsort`` asks it for the memory size once, while the interpreter starts).
STARTUP: Final = frozenset(
    {
        "execve",
        "fstatfs",
        "epoll_ctl",
        "arch_prctl",
        "dup2",
        "dup3",
        "prctl",
        "seccomp",
        "setrlimit",
        "sysinfo",
        "landlock_create_ruleset",
        "landlock_add_rule",
        "landlock_restrict_self",
    }
)
#: Conditional calls the start-up makes in forms the worker's policy refuses: allowed in any form.
_ANY_FORM: Final = frozenset({"open", "openat", "prlimit64", "fcntl", "ioctl"})
#: What a reusable sandbox's supervisor calls besides the start-up (``supervisor_profile``).
SUPERVISOR: Final = frozenset(
    {
        "wait4",
        "waitid",
        "kill",
        "tgkill",
        "pidfd_open",
        "pidfd_send_signal",
        "pipe2",
        "splice",
        "close_range",
        "unlink",
        "unlinkat",
        "rmdir",
        "chmod",
        "fchmodat",
        "truncate",
        "ftruncate",
        "llistxattr",
        "lgetxattr",
        "lremovexattr",
        "shmctl",
        "semctl",
        "msgctl",
        "getpriority",
        "sched_getscheduler",
        "sched_getparam",
        "sched_getattr",
        "ioprio_get",
    }
)


def _arg(arg: syscalls.Arg) -> dict[str, Any]:
    if arg.negate:
        return {"index": arg.index, "value": arg.value, "op": "SCMP_CMP_NE"}
    if arg.mask == 0xFFFFFFFFFFFFFFFF:
        return {"index": arg.index, "value": arg.value, "op": "SCMP_CMP_EQ"}
    return {"index": arg.index, "value": arg.mask, "valueTwo": arg.value, "op": "SCMP_CMP_MASKED_EQ"}


def docker_profile() -> dict[str, Any]:
    """The worker's Docker seccomp profile (x86_64).

    Returns:
        The profile as a JSON-ready mapping.
    """
    return _profile(STARTUP, processes=False)


def supervisor_profile() -> dict[str, Any]:
    """The profile of a reusable sandbox: ``docker_profile()`` plus ``SUPERVISOR`` and ``clone`` of
    processes (still without a namespace flag).

    Returns:
        The profile as a JSON-ready mapping.
    """
    return _profile(STARTUP | SUPERVISOR, processes=True)


def _profile(extra: frozenset[str], *, processes: bool) -> dict[str, Any]:
    # OWN_PROCESS (tgkill): the worker's pid is not known before the container starts.
    allowed = sorted(syscalls.ALLOWED | syscalls.OWN_PROCESS | extra | _ANY_FORM)
    rules: list[dict[str, Any]] = [{"names": allowed, "action": "SCMP_ACT_ALLOW"}]
    deny = {"action": "SCMP_ACT_ERRNO", "errnoRet": syscalls.DENY_ERRNO}
    retry = {"action": "SCMP_ACT_ERRNO", "errnoRet": syscalls.RETRY_ERRNO}
    rules.append({"names": sorted(syscalls.DENIED - extra), **deny})
    # Also spelled out: an engine may ignore defaultErrnoRet (Docker 20.10 answers EPERM instead).
    rules.append(
        {
            "names": sorted(syscalls.ABSENT - extra),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": syscalls.UNLISTED_ERRNO,
        }
    )
    for name, cond in sorted(syscalls.CONDITIONAL.items()):
        if name in _ANY_FORM:
            continue
        if name == "clone" and processes:
            # Threads and processes; every namespace flag refused (each bit on its own).
            rules.append(
                {
                    "names": [name],
                    "action": "SCMP_ACT_ALLOW",
                    "args": [_arg(syscalls.Arg(0, 0, syscalls.CLONE_NAMESPACES))],
                }
            )
            for bit in (1 << i for i in range(64) if syscalls.CLONE_NAMESPACES >> i & 1):
                rules.append({"names": [name], **deny, "args": [_arg(syscalls.Arg(0, bit, bit))]})
            continue
        for rule in cond.allow:
            rules.append({"names": [name], "action": "SCMP_ACT_ALLOW", "args": [_arg(a) for a in rule]})
        for rule in cond.refuse:
            rules.append({"names": [name], **deny, "args": [_arg(a) for a in rule]})
        for rule in cond.retry:
            rules.append({"names": [name], **retry, "args": [_arg(a) for a in rule]})
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": syscalls.UNLISTED_ERRNO,
        # The 32-bit ABIs too (same rules by name): a call from an ABI the profile does not list would
        # kill the process (libseccomp's bad-architecture default under runc) instead of failing.
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": rules,
    }


if __name__ == "__main__":
    json.dump(
        supervisor_profile() if "--supervisor" in sys.argv[1:] else docker_profile(), sys.stdout, indent=2
    )
    sys.stdout.write("\n")
