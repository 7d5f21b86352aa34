"""A bounded stderr for a worker whose stderr is stored (Kubernetes: the pod's container log).

A pod's stderr is its container log on the node's disk, and the kubelet compares it with the pod's
``ephemeral-storage`` only every few seconds: 16 MiB of two-byte lines reached 230-320 MB of log for
a 64Mi limit before the eviction (finding RS-4). Closing the worker's stderr is not possible there:
the container runtime ends the attach session (and with ``stdinOnce`` the worker's stdin) when the
stderr stream closes. So ``start()``, which ``confinement.confine`` calls before it loads the filter
(``fork`` is refused afterwards), forks a **relay**: the relay keeps the original stderr, the worker's
descriptors 2 and 1 become the write end of a pipe, and the relay forwards the first ``BUDGET`` bytes
it reads from that pipe and drops the rest (then, once, a line saying how many it dropped at the
end). Nothing the program makes the worker print can put more than about ``BUDGET`` bytes into the
log; what the worker writes before (a start-up failure) is not affected.

The relay runs only this module's loop; it holds the original stderr and the pipe's read end and
closes every other descriptor (the frame streams among them, so the host sees the worker's end as
before). The worker cannot reach it: it is non-dumpable (``/proc/<relay>/fd`` and ptrace access
are refused), and the worker's filter refuses ``kill``, ``pidfd_*`` and ``ptrace``. It ends when
the worker's last write end closes, or with the container (the worker is its first process).
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

__all__ = ["BUDGET", "start"]

#: How much of the worker's later stderr reaches the original stderr (the host keeps 8 KiB).
BUDGET: Final = 8192
_CHUNK: Final = 65536


def _relay(source: int, budget: int) -> None:
    forwarded = dropped = 0
    while True:
        try:
            data = os.read(source, _CHUNK)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        room = budget - forwarded
        if room > 0:
            try:
                os.write(2, data[:room])
            except OSError:
                break
            forwarded += min(room, len(data))
        dropped += max(0, len(data) - max(room, 0))
    if dropped:
        with contextlib.suppress(OSError):
            os.write(2, f"\ncodemode worker: {dropped} more bytes of stderr dropped\n".encode())


def start(budget: int = BUDGET) -> int:
    """Fork the relay and point descriptors 2 and 1 at it; the relay's pid. ``OSError`` when the
    pipe or the fork fails."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the relay: only raw reads and writes from here on, then _exit
        code = 0
        try:
            os.closerange(0, 2)
            os.closerange(3, read_end)
            os.closerange(read_end + 1, os.sysconf("SC_OPEN_MAX"))
            _relay(read_end, budget)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(read_end)
    os.dup2(write_end, 2)
    os.dup2(write_end, 1)
    os.close(write_end)
    return pid
