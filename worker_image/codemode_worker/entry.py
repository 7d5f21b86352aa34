"""Worker process entry: ``python -m codemode_worker`` serves exactly one program, then exits.

Stdin and stdout carry frames only (``protocol``). Before anything else stdout is duplicated to
a private descriptor for frames and fd 1 (and ``sys.stdout``) is pointed at stderr, so a stray
write from Python or native code can never corrupt the frame stream.

Sequence: enter the Landlock domain while the process has one thread
(``confinement.restrict_files``: no device node but a few, no ptrace access outside it); warm up the
interpreter; build the seccomp filter (``confinement.prepare``); drop to the uid the runtime asked
for (``privileges``); confine itself (``confinement.confine``: file-size limit 0, a small
descriptor limit, not dumpable, stderr bounded when the runtime asks, NO_NEW_PRIVS, the filter on
every thread); only then read frames: answer
every ``probe`` with ``probe_ack`` (only possible once warm and confined); on ``exec`` run the program,
sending each capability call and blocking for its reply (``channel``); end with ``final`` or
``final_error`` and exit 0.

Exit codes: 0 after the final frame (or when the host closes stdin before any exec);
1 (``EXIT_ABORTED``) on ``native_abort`` or when the host goes away mid-call, nothing more is
written; 2 (``EXIT_PROTOCOL``) on any protocol violation by the host, nothing more is written;
4 (``privileges.EXIT_PRIVILEGES``) when the uid drop fails and 5 (``confinement.EXIT_CONFINEMENT``)
when the filter cannot be installed, both before any frame is read.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any, BinaryIO, NoReturn

from . import PROTOCOL_VERSION
from .channel import HostChannel
from .confinement import confine, prepare, restrict_files
from .interpreter import (
    ExecLimits,
    HostProtocolError,
    NativeAborted,
    on_interpreter_thread,
    run_program,
    warm_up,
)
from .privileges import drop_privileges
from .protocol import MAX_HOST_FRAME_BYTES, ProtocolError, encode_frame, read_frame

__all__ = [
    "EXIT_ABORTED",
    "EXIT_OK",
    "EXIT_PROTOCOL",
    "exit_now",
    "main",
    "run",
    "serve",
    "serve_confined",
    "streams",
]

EXIT_OK = 0
EXIT_ABORTED = 1
EXIT_PROTOCOL = 2

_BEFORE_EXEC = frozenset({"probe", "exec"})


def streams() -> tuple[BinaryIO, BinaryIO]:
    """(binary stdin, private binary stdout for frames); afterwards fd 1 and ``sys.stdout``
    write to stderr."""
    sys.stdout.flush()
    frames_fd = os.dup(1)
    try:
        os.dup2(2, 1)
    except OSError:  # no usable stderr: discard stray output instead
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    sys.stdout = sys.stderr
    return sys.stdin.buffer, os.fdopen(frames_fd, "wb")


def _send(out: BinaryIO, frame: dict[str, Any]) -> None:
    out.write(encode_frame(frame))
    out.flush()


def _run_exec(frame: dict[str, Any], inp: BinaryIO, out: BinaryIO) -> int:
    host = HostChannel(inp, out)
    try:
        limits = ExecLimits.from_mapping(frame["limits"])
        outcome = run_program(frame["source"], frame["manifest"], limits, host)
    except NativeAborted:
        return EXIT_ABORTED
    except HostProtocolError:
        return EXIT_PROTOCOL
    if outcome.kind == "final":
        reply: dict[str, Any] = {"k": "final", "value": outcome.value}
    else:
        reply = {"k": "final_error", "error": outcome.error, "message": outcome.message}
    try:
        try:
            _send(out, reply)
        except ProtocolError:
            _send(out, {"k": "final_error", "error": "internal", "message": ""})
    except OSError:
        return EXIT_ABORTED
    return EXIT_OK


def serve(inp: BinaryIO, out: BinaryIO) -> int:
    """Warm up, then serve one exchange on the given streams; return the exit code."""
    warm_up()
    # A single-use process: keep the warm state out of later collections. No collection first: the
    # warm-up leaves 3 objects of cyclic garbage (measured in the image), and a collection of its
    # ~12,000 tracked objects cost 5-8 ms of CPU at every container or pod start.
    gc.freeze()
    seccomp_filter = prepare()
    drop_privileges()  # before the first frame: no program runs with the starting uid
    confine(seccomp_filter)  # nor outside the filter
    return serve_confined(inp, out)


def serve_confined(inp: BinaryIO, out: BinaryIO) -> int:
    """Serve one exchange in a process that is warm and confined already (``serve`` above, or a
    worker forked from a warm template, ``codemode_worker.template``, or by the reuse mode's
    ``codemode_worker.supervisor``); return the exit code."""
    while True:
        try:
            frame = read_frame(inp, MAX_HOST_FRAME_BYTES, _BEFORE_EXEC)
        except ProtocolError:
            return EXIT_PROTOCOL
        except OSError:
            return EXIT_ABORTED
        if frame is None:
            return EXIT_OK
        if frame["k"] == "probe":
            try:
                _send(out, {"k": "probe_ack", "v": PROTOCOL_VERSION})
            except OSError:
                return EXIT_ABORTED
            continue
        return _run_exec(frame, inp, out)


def main() -> int:
    """Serve one program on this process's stdin/stdout; return the exit code."""
    inp, out = streams()
    restrict_files()  # before the interpreter thread starts: every thread is in the domain
    return on_interpreter_thread(lambda: serve(inp, out))


def run() -> NoReturn:
    """``main()``, then exit at once (no interpreter teardown of a possibly huge heap)."""
    exit_now(main())


def exit_now(code: int) -> NoReturn:
    """Flush stderr and end the process with ``code`` at once (no interpreter teardown)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
