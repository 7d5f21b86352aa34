"""What the container runtimes (Docker, Kubernetes) share: a sandbox reached through one attached
byte stream (read by a thread unless the event loop can read it), the thread pool their blocking
client calls run on, the cancellable launch hand-over, and this host process's identity.

``ThreadedStreamSandbox`` keeps the worker's stdout in a bounded buffer that ``read()`` drains (a
full buffer stops the reader, which back-pressures the worker) and its stderr in a bounded
tail kept for host logs only; it serialises writes, half-closes input once and destroys exactly once
(``destroy()`` never raises and later calls return the same ``ExitInfo``). A runtime implements the
transport: ``_send`` (blocking), ``_half_close``, ``_pump`` (the reader thread's loop) and
``_destroy_blocking`` (close, inspect, remove). A runtime whose stream the event loop can read
itself replaces the reader thread (``_start_reading``, ``_room_made``); output pushed from the
loop's own thread wakes ``read()`` without a hop.

``BlockingRuntime`` runs blocking calls on a pool it owns (inline once the pool is shut down, rather
than leak), tracks live sandboxes and launches in flight, and hands a launch that finished after its
spawning coroutine was cancelled to ``_discard_blocking``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic, Literal, TypeVar

from .base import ExitInfo, SandboxClosed, SpawnFailed
from .handshake import probe

__all__ = [
    "STDERR_TAIL",
    "STDOUT_BUFFER",
    "BlockingRuntime",
    "CleanupMode",
    "HostIdentity",
    "LaunchHandoff",
    "ThreadedStreamSandbox",
    "boot_id",
    "pid_namespace",
    "process_start",
    "read_text",
]

#: How much of a worker's stderr (and of any other diagnostic channel) is kept: the last bytes.
STDERR_TAIL = 8 * 1024
#: Default bound of the stdout buffer (``stdout_buffer_bytes``).
STDOUT_BUFFER = 1024 * 1024

CleanupMode = Literal["dead", "all", "none"]
_T = TypeVar("_T")
_S = TypeVar("_S", bound="ThreadedStreamSandbox[Any]")
_R = TypeVar("_R", bound="BlockingRuntime[Any]")


# ----------------------------------------------------------------------------------- owner identity


def read_text(path: str) -> str:
    """A small text file's stripped content ("" when it cannot be read).

    Args:
        path: the file (``/proc/...``).

    Returns:
        Its text, non-ASCII bytes replaced.
    """
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def boot_id() -> str:
    """This machine's boot id ("" when unknown): a worker label that tells boots apart.

    Returns:
        The kernel's random boot id.
    """
    return read_text("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str:
    """This process's PID namespace (``pid:[4026531836]``; "" when unknown).

    Returns:
        The namespace link's target.
    """
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """When a process started.

    Args:
        pid: the process.

    Returns:
        Its start time in clock ticks since boot ("" if there is no such process).
    """
    # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
    rest = read_text(f"/proc/{pid}/stat").rpartition(")")[2].split()
    return rest[19] if len(rest) > 19 else ""


class HostIdentity:
    """Identity of this host process, recorded in every worker's labels (renew it after fork)."""

    def __init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Take this process's identity anew (a new id; the pid, start time, host name and boot)."""
        self.id = uuid.uuid4().hex
        self.pid = os.getpid()
        self.start = process_start(self.pid)
        self.host = socket.gethostname()
        self.boot = boot_id()
        self.pidns = pid_namespace()


# ----------------------------------------------------------------------------------- launches


class LaunchHandoff:
    """Hand-over between a blocking worker launch and the (cancellable) coroutine awaiting it.

    If the awaiting coroutine is cancelled while the launch is still running in its thread, the
    thread removes the worker itself (when it finishes, or earlier if it polls ``abandoned``); if
    the launch already finished, the canceller removes it. Exactly one of the two does, under the
    lock.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.delivered = False


# ----------------------------------------------------------------------------------- sandbox


class ThreadedStreamSandbox(ABC, Generic[_R]):
    """One worker reached through an attached stdin/stdout stream that a reader thread consumes."""

    #: The runtime's logger and the prefix of its messages.
    _log: ClassVar[logging.Logger]
    _kind: ClassVar[str]
    #: What ``_send`` raising means the worker's input is gone (``write`` raises SandboxClosed).
    _send_errors: ClassVar[tuple[type[Exception], ...]] = (Exception,)
    #: What ``_pump`` raising means the stream has ended.
    _read_errors: ClassVar[tuple[type[Exception], ...]] = (Exception,)

    def __init__(
        self, runtime: _R, worker_id: str, loop: asyncio.AbstractEventLoop, reader_name: str
    ) -> None:
        """Set up the buffers and start reading (``_start_reading``; by default a reader thread that
        runs ``_pump``): set the transport up before calling.

        Args:
            runtime: the runtime that owns the sandbox.
            worker_id: its id for host logs.
            loop: the event loop the sandbox answers on.
            reader_name: the reader thread's name.
        """
        self._runtime = runtime
        self._id = worker_id
        self._loop = loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        #: The loop's thread, when this sandbox is set up on it (else None: always hop to the loop).
        self._loop_thread = threading.get_ident() if running is loop else None
        self._cond = threading.Condition()
        self._out = bytearray()
        self._out_limit = runtime.stdout_buffer_bytes
        self._stderr = bytearray()
        self._eof = False
        self._closing = False
        self._input_closed = False
        self._data = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._destroy_lock = threading.Lock()
        self._destroy_future: concurrent.futures.Future[ExitInfo] | None = None
        self.exit_info: ExitInfo | None = None
        self._start_reading(reader_name)

    def _start_reading(self, reader_name: str) -> None:
        """Start consuming the worker's output (default: a reader thread running ``_pump``)."""
        self._reader = threading.Thread(target=self._read_loop, name=reader_name, daemon=True)
        self._reader.start()

    def _room_made(self) -> None:
        """The stdout buffer has room again, or the sandbox is closing (called holding ``_cond``):
        wake whatever waits to read more (default: the reader thread)."""
        self._cond.notify_all()

    # -- transport hooks -------------------------------------------------------------------------

    @abstractmethod
    def _send(self, data: bytes) -> None:
        """Send bytes to the worker's stdin (blocking; runs on the runtime's pool)."""

    def _send_now(self, data: bytes) -> int:
        """Send what of ``data`` can go right away on the loop's thread without blocking; return how
        many bytes went (``write`` hands the rest to ``_send`` on the runtime's pool). Default: none."""
        return 0

    @abstractmethod
    async def _half_close(self) -> None:
        """Close the worker's stdin and keep its output streaming (called at most once)."""

    @abstractmethod
    def _pump(self) -> None:
        """The reader thread: feed ``_push_stdout``/``_push_tail`` until the stream ends."""

    @abstractmethod
    def _destroy_blocking(self) -> ExitInfo:
        """Close the streams, read how the worker ended, remove it. Runs once, on the pool."""

    # -- Sandbox protocol ------------------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        return self._id

    def alive(self) -> bool:
        with self._cond:
            return not (self._eof or self._closing)

    async def write(self, data: bytes) -> None:
        if self._input_closed or self._closing:
            raise SandboxClosed(self._id)
        async with self._write_lock:
            if self._input_closed or self._closing:
                raise SandboxClosed(self._id)
            try:
                sent = self._send_now(data)
                if sent < len(data):
                    await self._runtime._run_blocking(self._send, bytes(memoryview(data)[sent:]))
            except self._send_errors as exc:
                raise SandboxClosed(self._id) from exc

    async def read(self, max_bytes: int) -> bytes:
        if max_bytes <= 0:
            return b""
        while True:
            with self._cond:
                if self._out:
                    chunk = bytes(self._out[:max_bytes])
                    del self._out[:max_bytes]
                    self._room_made()  # wake the reader waiting for buffer space
                    return chunk
                if self._eof or self._closing:
                    return b""
                self._data.clear()
            await self._data.wait()

    async def close_input(self) -> None:
        if self._input_closed:
            return
        self._input_closed = True
        await self._half_close()

    async def destroy(self) -> ExitInfo:
        with self._destroy_lock:
            if self._destroy_future is None:
                self._destroy_future = self._runtime._submit(self._destroy_blocking)
            future = self._destroy_future
        return await asyncio.shield(asyncio.wrap_future(future))

    # -- extras ----------------------------------------------------------------------------------

    @property
    def stderr_tail(self) -> bytes:
        """The bounded tail of the worker's stderr read so far (for host logs)."""
        with self._cond:
            return bytes(self._stderr)

    # -- the reader thread -----------------------------------------------------------------------

    def _notify(self) -> None:
        if threading.get_ident() == self._loop_thread:
            self._data.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            self._loop.call_soon_threadsafe(self._data.set)

    def _read_loop(self) -> None:
        try:
            self._pump()
        except self._read_errors:
            return
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()
            self._notify()

    def _wait_for_room(self) -> None:
        """Block (holding ``_cond``) while the stdout buffer is full and the sandbox not closing.

        Bounded: a worker flooding stdout waits (its pipe fills up) until the host reads.
        """
        while len(self._out) >= self._out_limit and not self._closing:
            self._cond.wait()

    def _push_stdout(self, chunk: bytes, *, wait_for_room: bool = False) -> None:
        with self._cond:
            if wait_for_room:
                self._wait_for_room()
            if self._closing:
                # Being destroyed: keep draining (and discarding) so a runtime that won't finish
                # killing/removing a worker while its attached output is blocked isn't stuck.
                self._out.clear()
                return
            self._out += chunk
        self._notify()

    def _push_tail(self, buffer: bytearray, chunk: bytes) -> None:
        with self._cond:
            buffer += chunk
            if len(buffer) > STDERR_TAIL:
                del buffer[: len(buffer) - STDERR_TAIL]

    # -- destroy ---------------------------------------------------------------------------------

    def _begin_destroy(self) -> bool:
        """Readers get EOF from now on; the reader thread drains instead of blocking. Returns
        whether the output stream had already ended (the worker has exited or is exiting)."""
        with self._cond:
            exited = self._eof
            self._closing = True
            self._out.clear()
            self._room_made()
        self._notify()
        return exited

    def _finish_destroy(
        self, exit_code: int | None, sig: int | None, oom: bool, lost: bool = False
    ) -> ExitInfo:
        self._runtime._forget(self)
        if sig is None and exit_code is not None and exit_code > 128:
            sig = exit_code - 128
        info = ExitInfo(
            exit_code=exit_code, signal=sig, oom_killed=oom, stderr_tail=self.stderr_tail, lost=lost
        )
        self.exit_info = info
        if oom:
            self._log.info("%s: worker %s was OOM-killed", self._kind, self._id)
        return info


# ----------------------------------------------------------------------------------- runtime


class BlockingRuntime(ABC, Generic[_S]):
    """Blocking-call plumbing and sandbox bookkeeping of a runtime whose client calls block."""

    stdout_buffer_bytes: int
    cleanup_orphans: CleanupMode
    #: Number of orphan workers removed by the last ``start()``.
    orphans_removed: int

    def _init_blocking(self, executor_threads: int, thread_name_prefix: str) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(4, executor_threads), thread_name_prefix=thread_name_prefix
        )
        self._live: set[_S] = set()
        self._live_lock = threading.Lock()
        self._launches: set[concurrent.futures.Future[tuple[str, Any]]] = set()
        self._closed = False
        self.orphans_removed = 0

    # -- hooks -----------------------------------------------------------------------------------

    @abstractmethod
    def _launch_blocking(self, handoff: LaunchHandoff, supervised: bool = False) -> tuple[str, Any]:
        """Start one worker (``supervised``: a reusable sandbox whose PID 1 is the supervisor) and
        attach to it: (its name, its attached stream)."""

    @abstractmethod
    def _discard_blocking(self, name: str, stream: Any, /) -> None:
        """Close the stream of a launched worker nobody will use, and remove the worker."""

    @abstractmethod
    def _remove_orphans_blocking(self, proven_only: bool) -> int:
        """Remove the workers the orphan rule allows (``proven_only``: only those whose owner is
        provably dead, no start-time guess); return how many."""

    @abstractmethod
    def _log_spawn_failure(self, sandbox: _S, exc: SpawnFailed, info: ExitInfo) -> None:
        """Log a worker that started but failed the probe (after it was destroyed)."""

    # -- blocking plumbing -----------------------------------------------------------------------

    def _submit(self, fn: Callable[..., _T], *args: Any) -> concurrent.futures.Future[_T]:
        try:
            return self._executor.submit(fn, *args)
        except RuntimeError:  # pool shut down (after aclose): run inline rather than leak
            future: concurrent.futures.Future[_T] = concurrent.futures.Future()
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)
            return future

    async def _run_blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.wrap_future(self._submit(fn, *args))

    def _forget(self, sandbox: _S) -> None:
        with self._live_lock:
            self._live.discard(sandbox)

    def live_sandboxes(self) -> list[_S]:
        """The sandboxes of this runtime not destroyed yet.

        Returns:
            A new list of them.
        """
        with self._live_lock:
            return list(self._live)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Remove the orphans of a crashed host (``cleanup_orphans``), once, in the SDK's thread."""
        await self.remove_orphans()

    async def remove_orphans(self, *, proven_only: bool = False) -> int:
        """Apply the orphan rule now (``start()`` does once; the service repeats it every
        ``orphan_sweep_interval``, so a replica removes the workers of another that died).

        Args:
            proven_only: apply only the parts of the rule that prove the owner dead, never the
                host-name rule (the same host name in another pid namespace means "this host was
                restarted" only at this host's own start: later it may be a live peer with the
                same name). The periodic sweep passes True.

        Returns:
            How many workers were removed (also in ``orphans_removed``).

        Raises:
            RuntimeUnavailable: the engine or API server cannot list the workers.
        """
        if self.cleanup_orphans == "none":
            return 0
        self.orphans_removed = await self._run_blocking(self._remove_orphans_blocking, proven_only)
        return self.orphans_removed

    async def _launch(self, timeout: float | None, supervised: bool = False) -> tuple[str, Any]:
        """Run ``_launch_blocking`` (bounded by ``timeout`` if given); a launch that completes
        after this coroutine was cancelled or timed out is discarded, by its thread or here."""
        handoff = LaunchHandoff()
        future = self._submit(self._launch_blocking, handoff, supervised)
        with self._live_lock:
            self._launches.add(future)
        future.add_done_callback(self._launch_done)
        try:
            if timeout is None:
                return await asyncio.wrap_future(future)
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except BaseException:
            with handoff.lock:
                handoff.abandoned = True
                delivered = handoff.delivered
            if delivered and future.done() and not future.cancelled() and future.exception() is None:
                self._submit(self._discard_blocking, *future.result())
            raise

    def _launch_done(self, future: concurrent.futures.Future[tuple[str, Any]]) -> None:
        with self._live_lock:
            self._launches.discard(future)

    async def _adopt(self, sandbox: _S, probe_timeout: float) -> _S:
        """Track a new sandbox and probe it; destroy it if the probe fails."""
        await self._adopt_with(sandbox, lambda: probe(sandbox, probe_timeout))
        return sandbox

    async def _adopt_with(self, sandbox: _S, ready: Callable[[], Awaitable[None]]) -> None:
        """Track a new sandbox and wait for ``ready()`` (the probe, or a supervisor's hello);
        destroy it if that fails."""
        with self._live_lock:
            self._live.add(sandbox)
        try:
            await ready()
        except BaseException as exc:
            info = await sandbox.destroy()
            if isinstance(exc, SpawnFailed):
                self._log_spawn_failure(sandbox, exc, info)
            raise

    async def _destroy_all(self, launch_wait: float) -> None:
        """Wait (up to ``launch_wait``) for launches in flight, then destroy every live sandbox."""
        with self._live_lock:
            launches = list(self._launches)
        if launches:
            await asyncio.to_thread(concurrent.futures.wait, launches, launch_wait)
        await asyncio.gather(*(s.destroy() for s in self.live_sandboxes()), return_exceptions=True)
