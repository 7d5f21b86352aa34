"""The attach stream of a worker container (``AttachedContainer``, the base of ``DockerSandbox``).

The worker's stdin/stdout/stderr are attached (one hijacked HTTP connection) *before* the container
starts, so no output can be lost. Docker multiplexes stdout and stderr on that connection in frames
with an 8-byte header (``>BxxxL``: stream 1 = stdout, 2 = stderr) that do not respect protocol
frame boundaries; the sandbox demultiplexes them: stdout into a bounded buffer that ``read()``
drains (a full buffer stops reading, which back-pressures the worker), stderr into a bounded tail
kept for host logs only. On a plain (unix or TCP) socket the event loop reads the connection itself
and sends small writes straight from the loop (no thread hop per native call); a TLS connection
keeps a reader thread per sandbox and sends through the pool.

What ending the container takes (``destroy()``) is the runtime's: ``DockerSandbox`` in
``codemode.runtimes.docker.runtime``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from typing import Any, ClassVar, TypeVar

from ..streams import BlockingRuntime, ThreadedStreamSandbox

__all__ = ["AttachedContainer", "close_attach"]

_R = TypeVar("_R", bound="BlockingRuntime[Any]")

log = logging.getLogger("codemode.runtimes.docker")

_HEADER = struct.Struct(">BxxxL")
_RECV = 64 * 1024


class _Demux:
    """Docker's stdout/stderr multiplexing on an attach stream: frames with an 8-byte header
    (``>BxxxL``: stream 1 = stdout, 2 = stderr) that do not respect protocol frame boundaries."""

    __slots__ = ("header", "remaining", "stream")

    def __init__(self) -> None:
        self.header = bytearray()
        self.stream = 0
        self.remaining = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The (stream, payload) pieces in ``data``; partial headers and payloads carry over."""
        out: list[tuple[int, bytes]] = []
        i, n = 0, len(data)
        while i < n:
            if self.remaining == 0:
                take = min(_HEADER.size - len(self.header), n - i)
                self.header += data[i : i + take]
                i += take
                if len(self.header) < _HEADER.size:
                    break
                self.stream, self.remaining = _HEADER.unpack(self.header)
                self.header.clear()
                continue
            take = min(self.remaining, n - i)
            out.append((self.stream, data[i : i + take]))
            i += take
            self.remaining -= take
        return out


def _loop_readable(sock: Any) -> bool:
    """Whether the event loop can read (and write) this attach socket itself: a plain socket.
    TLS connections (``DOCKER_TLS_VERIFY``) keep the reader thread."""
    return type(sock) is socket.socket


def close_attach(attach: Any) -> None:
    """Close an attach stream from ``attach_socket``: the SDK's wrapper and the socket under it
    (closing only the wrapper leaves the connection open).

    Args:
        attach: the stream ``APIClient.attach_socket`` returned.
    """
    sock = getattr(attach, "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()
    with contextlib.suppress(Exception):
        attach.close()


class AttachedContainer(ThreadedStreamSandbox[_R]):
    """One worker container reached through its attached stdin/stdout (the runtime ends it)."""

    _log = log
    _kind = "docker"
    _send_errors: ClassVar[tuple[type[Exception], ...]] = (OSError,)
    _read_errors: ClassVar[tuple[type[Exception], ...]] = (OSError, ValueError)

    def __init__(
        self,
        runtime: _R,
        container_id: str,
        attach: Any,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """One started worker container (made by :meth:`DockerRuntime.spawn`).

        Args:
            runtime: the runtime that owns it.
            container_id: the container.
            attach: the SDK's attach stream to its stdin/stdout.
            loop: the event loop that reads it.
        """
        self.container_id = container_id
        self._attach = attach  # keep the SDK object (and the response it pins) alive
        self._sock: socket.socket = getattr(attach, "_sock", attach)
        with contextlib.suppress(OSError):
            self._sock.settimeout(None)
        self.removed = False
        super().__init__(
            runtime, f"docker-{container_id[:12]}", loop, f"codemode-docker-reader-{container_id[:12]}"
        )

    # -- extras ----------------------------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Worker stdout received but not yet read (bounded by ``stdout_buffer_bytes`` + 64 KiB)."""
        with self._cond:
            return len(self._out)

    # -- transport -------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        self._sock.sendall(data)

    async def _half_close(self) -> None:
        self._shutdown_write()

    def _shutdown_input(self) -> None:
        if self._input_closed:
            return
        self._input_closed = True
        self._shutdown_write()

    def _shutdown_write(self) -> None:
        # Half-close: the daemon closes the container's stdin (StdinOnce) and keeps streaming output.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def _pump(self) -> None:
        # The reader thread (TLS attach streams only): demultiplex stdout from stderr.
        demux = _Demux()
        while True:
            data = self._sock.recv(_RECV)
            if not data:
                return
            for stream, chunk in demux.feed(data):
                if stream == 1:
                    # Waits while the buffer is full; while being destroyed it keeps draining (and
                    # discarding): the daemon won't finish removing a container whose output blocks.
                    self._push_stdout(chunk, wait_for_room=True)
                else:  # 2 = stderr; anything else is not expected: keep it with stderr
                    self._push_tail(self._stderr, chunk)

    # -- reading on the event loop (plain sockets: no thread hop per chunk) --------------------

    def _start_reading(self, reader_name: str) -> None:
        # The loop reads the socket itself only when this is set up on the loop's own thread.
        self._on_loop = _loop_readable(self._sock) and self._loop_thread is not None
        if not self._on_loop:
            super()._start_reading(reader_name)
            return
        self._demux = _Demux()
        self._fd = self._sock.fileno()
        self._reading = False  # registered with the loop (loop thread only)
        self._ended = False  # the stream has ended; never read again (loop thread only)
        #: Set once the loop will never read the socket again (it may be closed from then on).
        self._unregistered = threading.Event()
        self._resume()

    def _resume(self) -> None:
        """Read again (loop thread): at start, after ``read()`` made room, when destroying."""
        if self._reading or self._ended:
            return
        try:
            self._loop.add_reader(self._fd, self._on_readable)
        except (OSError, ValueError, RuntimeError):  # the socket or the loop is gone
            self._end_reading()
            return
        self._reading = True

    def _room_made(self) -> None:
        if not self._on_loop:
            super()._room_made()
        elif threading.get_ident() == self._loop_thread:
            self._resume()
        else:  # _begin_destroy on the runtime's pool: resume so the rest is drained and discarded
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._resume)

    def _on_readable(self) -> None:
        try:
            data = self._sock.recv(_RECV, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._end_reading()
            return
        for stream, chunk in self._demux.feed(data):
            if stream == 1:
                self._push_stdout(chunk)  # discarded while being destroyed
            else:  # 2 = stderr; anything else is not expected: keep it with stderr
                self._push_tail(self._stderr, chunk)
        with self._cond:
            full = len(self._out) >= self._out_limit and not self._closing
        if full and self._reading:
            # Bounded: stop reading until read() makes room (TCP back-pressure to the worker).
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _end_reading(self) -> None:
        if self._reading:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
            self._reading = False
        self._ended = True
        with self._cond:
            self._eof = True
            self._cond.notify_all()
        self._notify()
        self._unregistered.set()

    def _send_now(self, data: bytes) -> int:
        # Most frames fit the socket buffer: sent from the loop; the rest (a full socket buffer)
        # goes through the pool, blocking there. TLS connections send everything from the pool.
        if not self._on_loop:
            return 0
        try:
            return self._sock.send(data, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0

    def _stop_reader(self) -> None:
        # The container is gone, so its stream has ended or is about to: give the reader a moment
        # to collect the rest of stderr, then cut the connection.
        if self._on_loop and threading.get_ident() == self._loop_thread:
            # Run inline on the loop (the runtime's pool is shut down): nothing else will read.
            self._input_closed = True
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._end_reading()
            self._close_socket()
            return
        if self._on_loop and self._loop.is_closed():
            # The loop that read the socket is gone (nothing is registered any more).
            self._unregistered.set()
        if self._on_loop:
            self._unregistered.wait(0.5)
        else:
            self._reader.join(timeout=0.5)
        self._input_closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self._on_loop:
            # The loop sees the end of the stream and stops reading; only then may the socket close
            # (a closed descriptor left registered with the loop could be reused under it).
            if not self._unregistered.wait(2.0):
                with contextlib.suppress(RuntimeError):  # a closed loop reads nothing any more
                    self._loop.call_soon_threadsafe(self._end_reading)
                self._unregistered.wait(1.0)
        else:
            self._reader.join(timeout=2.0)
        self._close_socket()

    def _close_socket(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(Exception):
            self._attach.close()
