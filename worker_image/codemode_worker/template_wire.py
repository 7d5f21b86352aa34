"""The control channel between a process runtime's host and its worker template (pure Python).

The channel is one ``AF_UNIX`` ``SOCK_SEQPACKET`` socket pair: the host holds one end, the template
(``codemode_worker.template``) the other; no worker ever holds either (every worker closes all of
its descriptors but its own stdio before it runs anything). Each message is one packet of
``MESSAGE.size`` bytes: ``(op, id, value)``; descriptors travel beside it as ``SCM_RIGHTS``.

| op | direction | id | value | descriptors |
|---|---|---|---|---|
| ``READY`` | template → host | 0 | the template's pid | — |
| ``FORK`` | host → template | the worker's number (> 0) | its uid (0: the template's) | its stdio ends |
| ``FORKED`` | template → host | that number | the worker's pid | a pidfd of the worker |
| ``FAILED`` | template → host | that number | the ``errno`` of the failed fork | — |
| ``REAP`` | host → template | a forked worker's number | 0 | — |
| ``EXITED`` | template → host | that number | its wait status (``os.waitpid``) | — |

The stdio ends are the worker's stdin (read end), stdout and stderr (write ends). Before it forks a
worker with a uid of its own, the template kills every process of that uid (what an earlier holder
that died may have left). It ends a worker only when the host asks (``REAP``): it kills the worker's
process group and, for a worker with a uid of its own, every process of that uid, waits for the
worker's death, reaps it and reports. Until then the worker's pid, and so its process group, cannot
be reused, so ``killpg(pid)`` reaches exactly that worker's group. The host closing its end ends the template,
which kills and reaps every worker it still has first.
"""

from __future__ import annotations

import array
import os
import socket
import struct
from typing import Final

__all__ = ["EXITED", "FAILED", "FORK", "FORKED", "MESSAGE", "READY", "REAP", "WORKER_FDS", "receive"]

MESSAGE: Final = struct.Struct("<BQq")
READY: Final = ord("Y")
FORK: Final = ord("F")
FORKED: Final = ord("S")
FAILED: Final = ord("X")
REAP: Final = ord("R")
EXITED: Final = ord("E")
#: Descriptors a ``FORK`` carries: the worker's stdin (read end), stdout and stderr (write ends).
WORKER_FDS: Final = 3


def receive(sock: socket.socket, max_fds: int, flags: int = 0) -> tuple[bytes, list[int]] | None:
    """One packet and the descriptors beside it (at most ``max_fds``); None for a packet that is not
    one message (wrong size, cut short, too many descriptors: any descriptors it carried are closed).
    ``b""`` when the peer closed its end. (``socket.recv_fds`` drops its ``flags``.)"""
    fds = array.array("i")
    data, ancillary, msg_flags, _ = sock.recvmsg(
        MESSAGE.size + 1, socket.CMSG_SPACE(max_fds * fds.itemsize), flags
    )
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    received = list(fds)
    if data and (len(data) != MESSAGE.size or msg_flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC)):
        for fd in received:
            os.close(fd)
        return None
    return data, received
