"""``python -I stdio_relay.py LIMIT [FLAG...] -- COMMAND [ARGS...]``: bounded, valid stdio messages.

The MCP client reads a stdio server's output line by line with no bound on a line, so a server
(or a tenant steering a tool's output through its arguments) could make the host buffer any amount.
The upstream pack therefore starts every stdio server through this relay: it runs ``COMMAND`` with
the relay's own stdin, stderr, environment and working directory, and passes the server's
newline-delimited messages on **whole**, one at a time, holding at most ``LIMIT`` bytes of one:

* a message of at most ``LIMIT`` bytes (newline excluded) is copied as it was written;
* a longer one is dropped, never copied in part. When it starts as a JSON-RPC response whose ``id``
  comes first (``{"jsonrpc":"2.0","id":...``, how servers write them), the relay answers that
  request in its place with a JSON-RPC error as soon as the limit is passed, so that one call fails
  at once; otherwise that call waits for its timeout. Every other message, and every other caller
  of the same server, goes on.
* a message that is not valid UTF-8 has each invalid sequence replaced by U+FFFD (the MCP client's
  reader stops for good at the first invalid byte, and every later call would wait for its timeout
  until the server exited). The first such message is reported on stderr, the count at the end.

Flags: ``--rlimit-data=BYTES``, ``--rlimit-fsize=BYTES`` and ``--rlimit-cpu=SECONDS`` set
``RLIMIT_DATA`` (the server's heap and private mappings: its memory), ``RLIMIT_FSIZE`` (the largest
file it may write; ``SIGXFSZ`` is ignored, so a write past it fails with ``EFBIG`` instead of
killing the server) and ``RLIMIT_CPU`` (CPU seconds over its life; past them ``SIGXCPU`` ends it) on
the server process only (each child it starts inherits them: per process, not per tree).
``RLIMIT_CORE`` is always 0: a crashing server writes no core file (its memory, credentials
included) into its working directory, which may be a tenant's. ``--tree-memory=BYTES`` bounds what
the server and every process it started (its descendants, from ``/proc``) hold together: their
resident memory is summed every 100 ms, and past the bound all of them are killed (``SIGKILL``) and
the relay says so on stderr; the sum counts pages they share once per process (it can only
overstate), and a process that leaves the tree (a double fork) is no longer counted.

It stays small on purpose: one process, blocking reads, nothing but the standard library (the pack
runs this file with ``python -I``, so it needs no ``PYTHONPATH``). The server dies with it
(``PR_SET_PDEATHSIG``) and, like it, belongs to the process group the client terminates.
Python's locale coercion may add or change ``LC_CTYPE`` in the relay's own environment (``python -I``
ignores ``PYTHONCOERCECLOCALE``): the flag ``--unset-lc-ctype`` or ``--lc-ctype=VALUE`` says what the
server's is, so the server gets exactly the environment the relay was given.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time

__all__ = ["EXIT_USAGE", "Relay", "descendants", "main", "relay", "resident_bytes", "watch_tree"]

#: The exit status for a usage error.
EXIT_USAGE = 2
_CHUNK = 64 * 1024
_PR_SET_PDEATHSIG = 1
_USAGE = (
    "usage: python -I stdio_relay.py LIMIT [--unset-lc-ctype | --lc-ctype=VALUE] [--rlimit-data=BYTES] "
    "[--rlimit-fsize=BYTES] [--rlimit-cpu=SECONDS] [--tree-memory=BYTES] -- COMMAND [ARGS...]"
)
#: A JSON-RPC *response* that names its id first and then its result or error (a request from the
#: server has a method there, and its ids are the server's own numbering: never answered). The id is
#: a JSON integer or a string of printable ASCII and JSON escapes, so the error line built from it is
#: valid JSON and valid UTF-8 whatever the server wrote.
_RESPONSE_ID = re.compile(
    rb'\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*'
    rb'(-?(?:0|[1-9][0-9]{0,17})|"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}){0,100}")'
    rb'\s*,\s*"(?:result|error)"'
)
_TOO_LARGE = -32603  # JSON-RPC "internal error"
_TREE_PERIOD = 0.1  # seconds between two sums of the server tree's memory


def _prepare_child(relay_pid: int, limits: dict[int, int]) -> None:
    """In the child before exec: its resource limits (``SIGXFSZ`` ignored: an oversized write fails
    instead), SIGKILL when the relay goes away (Linux; elsewhere a no-op), and at once if it is
    already gone (it may have died between the fork and this call)."""
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    if resource.RLIMIT_FSIZE in limits:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != relay_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Relay:
    """Splits a byte stream into newline-delimited messages and decides what to pass on.

    Args:
        limit: bytes of one message (newline excluded).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.dropped = 0
        self.replaced = 0  # messages whose invalid UTF-8 was replaced
        self._message = bytearray()  # the message under way (at most ``limit`` bytes)
        self._skipping = False  # inside a dropped message, until its newline

    def feed(self, data: bytes) -> bytes:
        """The bytes to pass on for ``data`` (whole messages only).

        Args:
            data: the next bytes the server wrote.

        Returns:
            Every message completed in them that is passed on (over the limit: dropped, or a
            JSON-RPC error in place of a response), invalid UTF-8 replaced.
        """
        out = bytearray()
        *complete, tail = data.split(b"\n")
        for segment in complete:
            if self._skipping:  # the end of a dropped message
                self._skipping = False
            elif len(self._message) + len(segment) > self.limit:
                out += self._drop((bytes(self._message[:256]) + segment[:256])[:256])
            else:
                out += self._valid(bytes(self._message + segment), b"\n")
            self._message.clear()
        if not self._skipping:
            self._message += tail
            if len(self._message) > self.limit:  # answered now, skipped until its newline
                out += self._drop(bytes(self._message[:256]))
                self._skipping = True
                self._message.clear()
        return bytes(out)

    def end(self) -> bytes:
        """At end of input: a last message without a newline, as it was (when not over the limit).

        Returns:
            The bytes to pass on (none when inside a dropped message).
        """
        rest, self._message = bytes(self._message), bytearray()
        return b"" if self._skipping else self._valid(rest, b"")

    def _valid(self, message: bytes, end: bytes) -> bytes:
        """``message`` + ``end`` with valid UTF-8 (each invalid sequence U+FFFD); one that is then
        over the limit is dropped."""
        if message.isascii():
            return message + end
        try:
            message.decode("utf-8")
            return message + end
        except UnicodeDecodeError:
            pass
        self.replaced += 1
        if self.replaced == 1:
            print("codemode stdio relay: replaced invalid UTF-8 in a server message", file=sys.stderr)
        fixed = message.decode("utf-8", "replace").encode("utf-8")
        return fixed + end if len(fixed) <= self.limit else self._drop(fixed[:256])

    def _drop(self, head: bytes) -> bytes:
        self.dropped += 1
        found = _RESPONSE_ID.match(head)
        if found is None:
            return b""
        message = f"upstream message over {self.limit} bytes (dropped by the codemode relay)"
        error = {"code": _TOO_LARGE, "message": message}
        return b'{"jsonrpc":"2.0","id":' + found.group(1) + b',"error":' + json.dumps(error).encode() + b"}\n"


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (``/proc/<pid>/task/<tid>/children``; a process that is
    gone meanwhile is skipped).

    Args:
        pid: the root process.

    Returns:
        The pids, ``pid`` first.
    """
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as f:
                    todo.extend(int(child) for child in f.read().split())
            except (OSError, ValueError):
                continue
    return found


def resident_bytes(pids: list[int]) -> int:
    """The summed resident memory of ``pids`` (``/proc/<pid>/statm``).

    Args:
        pids: the processes (one that is gone is skipped).

    Returns:
        Their resident bytes together (shared pages counted once per process).
    """
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", encoding="ascii") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def watch_tree(server: subprocess.Popen[bytes], limit: int) -> None:
    """Until the server exits: kill its whole tree when its resident memory passes ``limit``
    (checked every 100 ms; said on stderr).

    Args:
        server: the server process.
        limit: resident bytes its tree may hold together.
    """
    while server.poll() is None:
        pids = descendants(server.pid)
        held = resident_bytes(pids)
        if held > limit:
            print(
                f"codemode stdio relay: the server's {len(pids)} process(es) held {held} bytes, over "
                f"--tree-memory={limit}: killed",
                file=sys.stderr,
                flush=True,
            )
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            return
        time.sleep(_TREE_PERIOD)


def relay(source: int, sink: int, limit: int) -> Relay:
    """Pass ``source`` on to ``sink`` until end of file.

    Args:
        source: the server's output.
        sink: the client's input.
        limit: bytes of one message.

    Returns:
        The relay's state (what was dropped, replaced).
    """
    state = Relay(limit)
    while data := os.read(source, _CHUNK):
        passed = state.feed(data)
        if passed:
            _write_all(sink, passed)
    _write_all(sink, state.end())
    return state


def _count(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else None


_RLIMITS = {
    "--rlimit-data=": resource.RLIMIT_DATA,
    "--rlimit-fsize=": resource.RLIMIT_FSIZE,
    "--rlimit-cpu=": resource.RLIMIT_CPU,
}


def main(argv: list[str]) -> int:
    """Run the server behind the relay (the module text says how).

    Args:
        argv: ``LIMIT [FLAG...] -- COMMAND [ARGS...]``.

    Returns:
        The server's exit status (128 + the signal when killed by one), 127 when it cannot start,
        :data:`EXIT_USAGE` for bad arguments.
    """
    env = dict(os.environ)
    limits: dict[int, int] = {resource.RLIMIT_CORE: 0}
    tree_memory = 0
    rest = argv[1:]
    usage = False
    while rest and rest[0] != "--":
        flag = rest.pop(0)
        prefix = next((p for p in _RLIMITS if flag.startswith(p)), None)
        if flag == "--unset-lc-ctype":
            env.pop("LC_CTYPE", None)
        elif flag.startswith("--lc-ctype="):
            env["LC_CTYPE"] = flag.removeprefix("--lc-ctype=")
        elif prefix is not None and (value := _count(flag.removeprefix(prefix))) is not None:
            limits[_RLIMITS[prefix]] = value
        elif flag.startswith("--tree-memory=") and (value := _count(flag.removeprefix("--tree-memory="))):
            tree_memory = value
        else:
            usage = True
    limit = _count(argv[0]) if argv else None
    if usage or limit is None or len(rest) < 2:
        print(_USAGE, file=sys.stderr)
        return EXIT_USAGE
    command = rest[1:]
    try:
        server = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            env=env,
            preexec_fn=functools.partial(_prepare_child, os.getpid(), limits),
        )
    except OSError as exc:
        print(f"codemode stdio relay: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    assert server.stdout is not None
    if tree_memory:
        threading.Thread(target=watch_tree, args=(server, tree_memory), daemon=True).start()
    with contextlib.suppress(BrokenPipeError):  # the client went away: nothing more to pass on
        state = relay(server.stdout.fileno(), sys.stdout.fileno(), limit)
        if state.dropped:
            print(
                f"codemode stdio relay: dropped {state.dropped} message(s) over {limit} bytes",
                file=sys.stderr,
            )
        if state.replaced:
            print(
                f"codemode stdio relay: replaced invalid UTF-8 in {state.replaced} message(s)",
                file=sys.stderr,
            )
    server.stdout.close()  # a server still writing gets EPIPE instead of blocking forever
    # The client sees the end now, not when the server exits (fd 1 stays valid for the interpreter).
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    status = server.wait()
    return 128 - status if status < 0 else status  # killed by a signal: 128 + its number, like a shell


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
