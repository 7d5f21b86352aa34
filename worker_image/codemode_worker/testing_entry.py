"""``python -m codemode_worker.testing_entry``: a worker for sandbox escape tests only.

It confines itself like the real worker (Landlock, the uid drop, then the seccomp filter of
``confinement``: the escape tests probe exactly the boundary a compromised interpreter would meet),
answers probes like the real worker, then runs the ``source`` of the exec frame as arbitrary
**Python** (not Starlark), with the protocol helpers in scope: ``frame`` (the exec frame),
``stdin``/``stdout`` (binary frame streams), ``send(frame)``, ``recv(kinds)``,
``final(value)``, ``final_error(error, message)``, ``protocol``. It refuses to run (exit 3)
unless ``CODEMODE_WORKER_TESTING=1`` is set in its environment, which a runtime sets only when a test
asks for it (``testing_entry=True`` on the Docker and Kubernetes runtimes, ``extra_env`` on the
process runtime); no setting or flag reaches it.

A compromised interpreter runs native code: ``ctypes``, ``mmap`` and ``socket`` (what the escape tests use to
make raw system calls) are loaded at start-up, like everything the real worker loads, because a
process-runtime worker cannot read the interpreter's files any more once it has dropped its uid.

The worker's Landlock domain refuses every file of ``/proc`` (``readable``), also the ones the escape
tests read to see their own state (``Seccomp`` and the capabilities in ``status``, the mounts, PID
1's limits, System V IPC objects). So each testing worker opens ``PROC_WINDOW`` before it enters
the domain (``open_window``), and its programs read them again with ``proc_text(path)`` (the
kernel's current text, through the descriptor opened then; any other path is opened as usual). The
production image has no testing entry and its workers hold no such descriptor.
"""

from __future__ import annotations

import ctypes  # noqa: F401  (for the test programs: loaded before the uid drop)
import mmap  # noqa: F401  (likewise)
import os
import socket  # noqa: F401  (likewise)
import sys
import traceback
from collections.abc import Collection
from typing import Any, BinaryIO

from . import PROTOCOL_VERSION, protocol
from .confinement import confine, prepare, restrict_files
from .entry import EXIT_ABORTED, EXIT_OK, EXIT_PROTOCOL, streams
from .privileges import drop_privileges

__all__ = ["ENABLE_VARIABLE", "EXIT_DISABLED", "PROC_WINDOW", "main", "open_window", "serve_confined"]

ENABLE_VARIABLE = "CODEMODE_WORKER_TESTING"
EXIT_DISABLED = 3
#: The ``/proc`` files a testing worker opens before its Landlock domain (those that exist).
PROC_WINDOW = (
    "/proc/self/status",
    "/proc/self/mountinfo",
    "/proc/self/cgroup",
    "/proc/self/sched",
    "/proc/1/stat",
    "/proc/1/limits",
    "/proc/sysvipc/shm",
    "/proc/sysvipc/sem",
    "/proc/sysvipc/msg",
)


def main() -> int:
    if os.environ.get(ENABLE_VARIABLE) != "1":
        return EXIT_DISABLED
    inp, out = streams()
    window = open_window()
    # Like the real worker: the test program never runs with the starting uid, nor unconfined.
    restrict_files()
    seccomp_filter = prepare()
    drop_privileges()
    confine(seccomp_filter)
    return serve_confined(inp, out, window)


def open_window() -> dict[str, int]:
    """Descriptors of the ``PROC_WINDOW`` files this process can open now (call it before the
    Landlock domain), by path."""
    window = {}
    for path in PROC_WINDOW:
        try:
            window[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
    return window


def serve_confined(inp: BinaryIO, out: BinaryIO, window: dict[str, int] | None = None) -> int:
    """The probe/exec loop, in a process that has confined itself already (``main`` above, or a
    worker forked by ``codemode_worker.template --testing`` or ``codemode_worker.supervisor --testing``);
    ``window``: what ``open_window`` opened before the confinement."""
    opened = dict(window or {})

    def proc_text(path: str) -> str:
        fd = opened.get(path)
        if fd is None:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read()
        text = b""
        while chunk := os.pread(fd, 1 << 16, len(text)):
            text += chunk
        return text.decode("utf-8", "replace")

    def send(frame: dict[str, Any]) -> None:
        out.write(protocol.encode_frame(frame))
        out.flush()

    def recv(kinds: Collection[str] = protocol.HOST_KINDS) -> dict[str, Any] | None:
        return protocol.read_frame(inp, protocol.MAX_HOST_FRAME_BYTES, kinds)

    def final(value: Any) -> None:
        send({"k": "final", "value": value})

    def final_error(error: str = "internal", message: str = "") -> None:
        send({"k": "final_error", "error": error, "message": message})

    while True:
        try:
            frame = recv({"probe", "exec"})
        except protocol.ProtocolError:
            return EXIT_PROTOCOL
        if frame is None:
            return EXIT_OK
        if frame["k"] == "probe":
            send({"k": "probe_ack", "v": PROTOCOL_VERSION})
            continue
        namespace: dict[str, Any] = {
            "__name__": "__codemode_testing__",
            "frame": frame,
            "stdin": inp,
            "stdout": out,
            "send": send,
            "recv": recv,
            "final": final,
            "final_error": final_error,
            "protocol": protocol,
            "proc_text": proc_text,
        }
        try:
            exec(compile(frame["source"], "<testing>", "exec"), namespace)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else EXIT_ABORTED
        except BaseException:
            traceback.print_exc(file=sys.stderr)
            return EXIT_ABORTED
        return EXIT_OK


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)
