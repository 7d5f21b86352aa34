"""Which limit, if any, ended a worker that died without a final frame.

A worker that dies without a result is either exhausted (its sandbox's memory, CPU or file-size
limit ended it) or crashed. The distinction decides the client text: ``resource limit exceeded:
<kind>`` (the program should do less) or ``internal failure`` (the host is at fault).

Memory, the measured cases:

- A cgroup memory limit (Docker, Kubernetes) ends the worker with the kernel's OOM killer; the
  runtime reports it from the engine's state (``ExitInfo.oom_killed``): a host-side fact.
- An address-space rlimit (the process runtime) makes an allocation fail instead. The interpreter
  (starlark-rust) cannot recover from a failed allocation: it writes ``memory allocation of N bytes
  failed`` to stderr and aborts (SIGABRT; exit code 134 in a container). The same happens inside a
  container when one request is larger than the kernel will ever commit.

So a worker counts as out of memory when the runtime says OOM-killed, or when **all** of these hold:
the kernel reports death by SIGABRT (a signal, or the 128+6 exit status a container engine reports),
the runtime really runs workers under a memory limit, and the last stderr holds the allocator's
line. The stderr line is the worker's word, so a compromised worker can fake it, but it can only
turn its *own* result from ``internal failure`` into ``resource limit exceeded: memory``: nothing
about security or other executes depends on it. Any other death stays ``internal failure``.
"""

from __future__ import annotations

import re
import signal
from typing import Final

from .base import ExitInfo, MemoryLimited

__all__ = ["ALLOCATION_FAILED", "exhaustion_kind", "memory_limited"]

#: The line Rust's default allocation-error handler writes before it aborts.
ALLOCATION_FAILED: Final = re.compile(rb"(?m)^memory allocation of [0-9]{1,20} bytes failed\r?$")
_ABORT_EXIT: Final = 128 + int(signal.SIGABRT)


def memory_limited(runtime: object) -> bool:
    """Whether a runtime runs its workers under a memory limit of its own (``MemoryLimited``).

    Args:
        runtime: the runtime (or a pool of it).

    Returns:
        True with an address-space rlimit or a cgroup memory limit.
    """
    return isinstance(runtime, MemoryLimited) and bool(runtime.memory_limited)


def exhaustion_kind(info: ExitInfo, runtime: object) -> str | None:
    """The limit that ended a worker, read from how it ended.

    Args:
        info: how it ended.
        runtime: the runtime that ran it (whether it sets a memory limit of its own).

    Returns:
        ``memory`` or ``time``, or None for a crash.
    """
    if info.oom_killed:
        return "memory"
    if info.cpu_limited or info.signal == signal.SIGXCPU:
        return "time"
    if info.signal == signal.SIGXFSZ:
        return "memory"
    aborted = info.signal == signal.SIGABRT or (info.signal is None and info.exit_code == _ABORT_EXIT)
    if aborted and memory_limited(runtime) and ALLOCATION_FAILED.search(info.stderr_tail):
        return "memory"
    return None
