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

``--view=DIR`` gives the server a mount view of its own (``{subject_dir}``, docs/packs.md): before
starting it the relay enters a new user namespace (its own uid and gid mapped to themselves, nothing
else) and mount namespace, and bind-mounts ``DIR`` at :data:`VIEW_DIR`; the server starts there
(``--cwd=PATH`` names another working directory, a path of the view). So the server is given, and
can tell, nothing of where ``DIR`` is on the host. Where the kernel refuses either namespace (a
container's default seccomp profile, a sysctl) the relay says why and exits 126; ``--check-view=DIR``
does only that check (exit 0: a view can be made).

The server's stderr is not the host's: the relay reads it and passes each line on to its own stderr
(which the pack reads and logs, ``session``), cut to :data:`STDERR_LINE_BYTES` and at most
:data:`STDERR_BURST` lines at once and :data:`STDERR_RATE` a second after that (:class:`StderrGate`);
what it drops it counts and says in one line. So a server that writes megabytes there costs the host
a few lines, whoever steers it.

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
from collections.abc import Callable

__all__ = [
    "EXIT_NO_VIEW",
    "EXIT_USAGE",
    "STDERR_BURST",
    "STDERR_LINE_BYTES",
    "STDERR_RATE",
    "VIEW_DIR",
    "Relay",
    "StderrGate",
    "descendants",
    "main",
    "make_view",
    "pass_stderr",
    "relay",
    "resident_bytes",
    "say",
    "watch_tree",
]

#: The exit status for a usage error.
EXIT_USAGE = 2
_CHUNK = 64 * 1024
_PR_SET_PDEATHSIG = 1
_USAGE = (
    "usage: python -I stdio_relay.py LIMIT [--unset-lc-ctype | --lc-ctype=VALUE] [--rlimit-data=BYTES] "
    "[--rlimit-fsize=BYTES] [--rlimit-cpu=SECONDS] [--tree-memory=BYTES] [--view=DIR] [--cwd=PATH] "
    "-- COMMAND [ARGS...]\n       python -I stdio_relay.py --check-view=DIR"
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
#: Bytes of one line of the server's stderr passed on (the rest of the line is counted, not passed).
STDERR_LINE_BYTES = 1024
#: Lines of the server's stderr passed on at once ...
STDERR_BURST = 50
#: ... and per second after that (a token bucket).
STDERR_RATE = 5.0
#: Where a server run with ``--view`` sees its directory.
VIEW_DIR = "/mnt"
#: The exit status when the mount view cannot be made.
EXIT_NO_VIEW = 126
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_STDERR_GRACE = 1.0  # seconds the server's last stderr lines get once it has exited
_SAYING = threading.Lock()  # one line at a time on the relay's own stderr


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
            say(b"codemode stdio relay: replaced invalid UTF-8 in a server message\n")
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


def make_view(source: str) -> None:
    """Enter a user and mount namespace of this process's own and bind-mount ``source`` at
    :data:`VIEW_DIR` (the process must be single-threaded; every process it starts after this
    shares the view).

    Args:
        source: the directory to show there (it must exist).

    Raises:
        OSError: the kernel refused a step; its message names the step.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]

    def check(result: int, step: str) -> None:
        if result != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"{step}: {os.strerror(code)}")

    uid, gid = os.geteuid(), os.getegid()
    check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
                f.write(text)
        except OSError as exc:
            raise OSError(exc.errno, f"writing /proc/self/{name}: {exc.strerror}") from None
    check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "making mounts private")
    check(
        libc.mount(os.fsencode(source), VIEW_DIR.encode(), None, _MS_BIND, None), f"bind-mount at {VIEW_DIR}"
    )


def say(data: bytes) -> None:
    """Write whole lines to the relay's own stderr, one writer at a time (a host that went away is
    not an error).

    Args:
        data: the lines, each ending in a newline.
    """
    with _SAYING, contextlib.suppress(OSError):
        _write_all(sys.stderr.fileno(), data)


class StderrGate:
    """What of the server's stderr is passed on: each line cut to ``line_bytes``, at most ``burst``
    lines at once and ``rate`` a second after that; the lines it drops are counted and said in one
    line before the next line it passes, and at the end.

    Args:
        line_bytes: bytes of one line passed on (newline excluded).
        burst: lines passed on at once.
        rate: lines passed on per second after the burst.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        line_bytes: int = STDERR_LINE_BYTES,
        burst: int = STDERR_BURST,
        rate: float = STDERR_RATE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.line_bytes = line_bytes
        self.burst = burst
        self.rate = rate
        self.clock = clock
        self.dropped_lines = 0
        self.dropped_bytes = 0
        self._line = bytearray()  # the line under way, at most ``line_bytes``
        self._cut = 0  # bytes of it past ``line_bytes``
        self._tokens = float(burst)
        self._seen = clock()

    def feed(self, data: bytes) -> bytes:
        """The bytes to pass on for ``data``.

        Args:
            data: the next bytes the server wrote to its stderr.

        Returns:
            The lines completed in them that pass (cut ones marked), each after a count of what was
            dropped before it, if anything was.
        """
        out = bytearray()
        *complete, tail = data.split(b"\n")
        for segment in complete:
            self._add(segment)
            out += self._finish()
        self._add(tail)
        return bytes(out)

    def end(self) -> bytes:
        """At the end of the server's stderr: a last line without a newline, and the count of what
        was dropped.

        Returns:
            The bytes to pass on.
        """
        last = self._finish() if self._line or self._cut else b""
        return last + self._summary()

    def _add(self, segment: bytes) -> None:
        room = max(0, self.line_bytes - len(self._line))
        self._line += segment[:room]
        self._cut += max(0, len(segment) - room)

    def _finish(self) -> bytes:
        line, cut = bytes(self._line), self._cut
        self._line.clear()
        self._cut = 0
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._seen) * self.rate)
        self._seen = now
        if self._tokens < 1:
            self.dropped_lines += 1
            self.dropped_bytes += len(line) + cut + 1
            return b""
        self._tokens -= 1
        marker = f" [{cut} more bytes cut]".encode() if cut else b""
        return self._summary() + line + marker + b"\n"

    def _summary(self) -> bytes:
        if not self.dropped_lines:
            return b""
        text = (
            f"codemode stdio relay: dropped {self.dropped_lines} line(s) ({self.dropped_bytes} bytes) of "
            f"the server's stderr: over {self.burst} at once and {self.rate:g} a second\n"
        )
        self.dropped_lines = self.dropped_bytes = 0
        return text.encode()


def pass_stderr(source: int, gate: StderrGate) -> None:
    """Pass the server's stderr on through ``gate`` until end of file.

    Args:
        source: the read end of the server's stderr.
        gate: what decides what passes.
    """
    with contextlib.suppress(OSError):
        while data := os.read(source, _CHUNK):
            passed = gate.feed(data)
            if passed:
                say(passed)
    say(gate.end())


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
            say(
                f"codemode stdio relay: the server's {len(pids)} process(es) held {held} bytes, over "
                f"--tree-memory={limit}: killed\n".encode()
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
    if len(argv) == 1 and argv[0].startswith("--check-view="):
        return _view_or_say(argv[0].removeprefix("--check-view="))
    env = dict(os.environ)
    limits: dict[int, int] = {resource.RLIMIT_CORE: 0}
    tree_memory = 0
    view: str | None = None
    cwd: str | None = None
    rest = argv[1:]
    usage = False
    while rest and rest[0] != "--":
        flag = rest.pop(0)
        prefix = next((p for p in _RLIMITS if flag.startswith(p)), None)
        if flag.startswith("--view="):
            view = flag.removeprefix("--view=")
        elif flag.startswith("--cwd="):
            cwd = flag.removeprefix("--cwd=")
        elif flag == "--unset-lc-ctype":
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
    if view is not None:
        status = _view_or_say(view)
        if status:
            return status
        cwd = cwd or VIEW_DIR
    try:
        server = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            preexec_fn=functools.partial(_prepare_child, os.getpid(), limits),
        )
    except OSError as exc:
        print(f"codemode stdio relay: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    assert server.stdout is not None and server.stderr is not None
    errors = threading.Thread(target=pass_stderr, args=(server.stderr.fileno(), StderrGate()), daemon=True)
    errors.start()
    if tree_memory:
        threading.Thread(target=watch_tree, args=(server, tree_memory), daemon=True).start()
    with contextlib.suppress(BrokenPipeError):  # the client went away: nothing more to pass on
        state = relay(server.stdout.fileno(), sys.stdout.fileno(), limit)
        if state.dropped:
            say(f"codemode stdio relay: dropped {state.dropped} message(s) over {limit} bytes\n".encode())
        if state.replaced:
            say(f"codemode stdio relay: replaced invalid UTF-8 in {state.replaced} message(s)\n".encode())
    server.stdout.close()  # a server still writing gets EPIPE instead of blocking forever
    # The client sees the end now, not when the server exits (fd 1 stays valid for the interpreter).
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    status = server.wait()
    errors.join(_STDERR_GRACE)  # its last lines (a child of the server may still hold the pipe)
    return 128 - status if status < 0 else status  # killed by a signal: 128 + its number, like a shell


def _view_or_say(source: str) -> int:
    try:
        make_view(source)
    except OSError as exc:
        say(f"codemode stdio relay: cannot make the server's mount view ({exc.strerror})\n".encode())
        return EXIT_NO_VIEW
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
