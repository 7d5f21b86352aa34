"""``python -I stdio_relay.py LIMIT -- COMMAND [ARGS...]``: a bounded stdout for a stdio MCP server.

The MCP client reads a stdio server's output line by line with no bound on a line, so a server
(or a tenant steering a tool's output through its arguments) could make the host buffer any amount.
The upstream pack therefore starts every stdio server through this relay: it runs ``COMMAND`` with
the relay's own stdin, stderr, environment and working directory, and copies the server's stdout
to its own, counting the bytes of each newline-delimited message. A message longer than ``LIMIT``
bytes ends the server (SIGKILL) and the relay (exit status 3) after what was already copied: the
client sees the connection end, the call in flight fails, the next call starts a fresh server.

It stays small on purpose: one process, blocking reads, no parsing, nothing but the standard
library (the pack runs this file with ``python -I``, so it works without ``PYTHONPATH``; ``python -m
codemode.capabilities.stdio_relay`` works too). The server dies with it (``PR_SET_PDEATHSIG``) and,
like it, belongs to the process group the client terminates.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

__all__ = ["EXIT_TOO_LARGE", "EXIT_USAGE", "main", "relay"]

EXIT_USAGE = 2
EXIT_TOO_LARGE = 3
_CHUNK = 64 * 1024
_PR_SET_PDEATHSIG = 1
_USAGE = "usage: python -I stdio_relay.py LIMIT -- COMMAND [ARGS...]"


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the relay goes away (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def relay(source: int, sink: int, limit: int) -> bool:
    """Copy ``source`` to ``sink`` until end of file (True) or a message over ``limit`` bytes
    (False; the bytes of that message past the limit are not copied)."""
    pending = 0  # bytes of the message under way (since the last newline)
    while True:
        data = os.read(source, _CHUNK)
        if not data:
            return True
        *complete, tail = data.split(b"\n")
        if complete:
            if pending + len(complete[0]) > limit or any(len(m) > limit for m in complete[1:]):
                return False
            pending = len(tail)
        else:
            pending += len(tail)
        if pending > limit:
            return False
        _write_all(sink, data)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit() or int(argv[0]) <= 0:
        print(_USAGE, file=sys.stderr)
        return EXIT_USAGE
    limit, command = int(argv[0]), argv[2:]
    try:
        server = subprocess.Popen(command, stdout=subprocess.PIPE, preexec_fn=_die_with_parent)
    except OSError as exc:
        print(f"codemode stdio relay: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    assert server.stdout is not None
    try:
        whole = relay(server.stdout.fileno(), sys.stdout.fileno(), limit)
    except BrokenPipeError:  # the client went away
        whole = True
    if not whole:
        print(f"codemode stdio relay: a message from {command[0]!r} is over {limit} bytes", file=sys.stderr)
        server.kill()
        server.wait()
        return EXIT_TOO_LARGE
    return server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
