"""A worker forked by the worker template (``codemode.runtimes.process.template``), reached through its pipes.

The host made the worker's three pipes and holds their other ends (non-blocking, read and written
straight from the event loop), and a pidfd of the worker (sent by the template). The worker is the
template's child, and the template reaps it only when asked: until then its pid and process group
cannot be reused. So ``destroy()``:

1. closes the worker's stdin at once (unread input is dropped; nothing is awaited before the kill);
2. kills the worker through its pidfd (exact, whatever happened to the pid);
3. asks the template to end it: the template kills its process group and, with a uid of its own,
   every process of that uid at once (``codemode_worker.template.UidKiller``: a descendant that left
   the session included), waits for its death, reaps it and reports the wait status (exit code or
   signal);
4. with a uid of its own, removes the System V IPC objects, POSIX message queues and ``/dev/shm``
   entries the uid left (``ipc_cleanup.remove_all_ipc_of``, in a thread: it walks ``/dev/shm``):
   only then is the uid free for the next worker (``contained``);
5. reads what is left of its stderr (the bounded tail decides an allocator abort, see
   ``exhaustion``) until its end, or a short grace when a descendant holds it open.

Exactly once: later calls return the same ``ExitInfo``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable

from ..base import ExitInfo, SandboxClosed
from ..once import DestroyOnce
from .ipc_cleanup import remove_all_ipc_of
from .template import TemplateGone, WorkerTemplate, keep_tail

__all__ = ["ORPHAN_PIPE_GRACE", "REAP_GRACE", "ForkedSandbox"]

log = logging.getLogger("codemode.runtimes.process")

#: Seconds destroy() waits for the template's report of a killed worker's exit.
REAP_GRACE = 5.0
#: Seconds destroy() waits for the end of a killed worker's stderr.
ORPHAN_PIPE_GRACE = 2.0


class ForkedSandbox:
    """One forked worker; all methods are safe after it has died."""

    def __init__(
        self,
        template: WorkerTemplate,
        number: int,
        pid: int,
        pidfd: int,
        stdio: tuple[int, int, int],
        worker_id: str,
        on_reaped: Callable[[ForkedSandbox], None] | None = None,
        uid: int | None = None,
    ) -> None:
        """One worker the template forked (made by ``ProcessRuntime.spawn``).

        Args:
            template: the template that forked it (and reaps it).
            number: its number on the template's control channel.
            pid: its process id.
            pidfd: a pidfd of it (the sandbox owns it).
            stdio: the host's ends of its stdin, stdout and stderr.
            worker_id: its id for host logs.
            on_reaped: called once it has been reaped.
            uid: the uid it runs as, when it has one of its own.
        """
        self._loop = asyncio.get_running_loop()
        self._template = template
        self._number = number
        self._pid = pid
        self._pidfd = pidfd
        self._stdin, self._stdout, self._stderr_fd = stdio
        for fd in stdio:
            os.set_blocking(fd, False)
        self._id = worker_id
        self._on_reaped = on_reaped
        self.uid = uid
        self.contained = uid is None
        self._stderr = bytearray()
        self._stderr_done = self._loop.create_future()
        self._exited = False
        self._exit: ExitInfo | None = None
        self._destroy = DestroyOnce()
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._loop.add_reader(self._stderr_fd, self._on_stderr)
        self._loop.add_reader(pidfd, self._on_exit)

    @property
    def worker_id(self) -> str:
        return self._id

    @property
    def pid(self) -> int:
        """The worker process's id."""
        return self._pid

    # -- the descriptors ----------------------------------------------------------------------

    def _on_exit(self) -> None:
        self._exited = True
        self._loop.remove_reader(self._pidfd)

    def _on_stderr(self) -> None:
        try:
            chunk = os.read(self._stderr_fd, 64 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._loop.remove_reader(self._stderr_fd)
            if not self._stderr_done.done():
                self._stderr_done.set_result(None)
            return
        keep_tail(self._stderr, chunk)

    async def _ready(self, fd: int, writing: bool) -> None:
        """Wait until ``fd`` can be read (or written), or is closed by destroy()/close_input()."""
        waiter = self._loop.create_future()
        self._waiters[fd] = waiter
        add, remove = (
            (self._loop.add_writer, self._loop.remove_writer)
            if writing
            else (self._loop.add_reader, self._loop.remove_reader)
        )
        add(fd, _wake, waiter)
        try:
            await waiter
        finally:
            self._waiters.pop(fd, None)
            if fd in (self._stdin, self._stdout):  # still open
                remove(fd)

    def _close(self, fd: int) -> None:
        waiter = self._waiters.pop(fd, None)
        if waiter is not None:
            self._loop.remove_writer(fd)
            self._loop.remove_reader(fd)
            _wake(waiter)
        os.close(fd)

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            fd = self._stdin
            if fd < 0 or self._exit is not None:
                raise SandboxClosed(self._id)
            try:
                written = os.write(fd, view)
            except (BlockingIOError, InterruptedError):
                await self._ready(fd, writing=True)
                continue
            except OSError as exc:  # EPIPE: the worker is gone
                raise SandboxClosed(self._id) from exc
            view = view[written:]

    async def read(self, max_bytes: int) -> bytes:
        while True:
            fd = self._stdout
            if fd < 0:
                return b""
            try:
                return os.read(fd, max_bytes)
            except (BlockingIOError, InterruptedError):
                await self._ready(fd, writing=False)
            except OSError:
                return b""

    async def close_input(self) -> None:
        if self._stdin >= 0:
            fd, self._stdin = self._stdin, -1
            self._close(fd)

    def alive(self) -> bool:
        return self._exit is None and not self._exited

    # -- the end ------------------------------------------------------------------------------

    async def destroy(self) -> ExitInfo:
        return await self._destroy(self._destroy_once, on_failure=self._finish)

    async def _destroy_once(self) -> ExitInfo:
        await self.close_input()  # nothing awaited before the kill: closing stdin does not wait
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        status: int | None = None
        try:
            # The template kills the worker's group and every process of its uid, then reaps it.
            status = await asyncio.wait_for(self._template.reap(self._number), REAP_GRACE)
        except TemplateGone as exc:
            log.warning("worker %s: no exit status: %s", self._id, exc)
        except TimeoutError:
            log.warning("worker %s: the template did not report its exit in %.0f s", self._id, REAP_GRACE)
        if self.uid is not None and status is not None:
            # Every process of the uid got SIGKILL at once, so none can make new IPC objects.
            await asyncio.to_thread(remove_all_ipc_of, self.uid)
            self.contained = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._stderr_done), ORPHAN_PIPE_GRACE)
        info = _exit_info(status, bytes(self._stderr))
        self._finish(info)
        return info

    def _finish(self, info: ExitInfo) -> None:
        if self._exit is not None:
            return
        self._exit = info
        self._exited = True
        for fd in (self._stdout, self._stderr_fd):
            if fd >= 0:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(fd)
        if self._stdout >= 0:
            fd, self._stdout = self._stdout, -1
            self._close(fd)
        if self._stderr_fd >= 0:
            fd, self._stderr_fd = self._stderr_fd, -1
            os.close(fd)
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        if self._on_reaped is not None:
            self._on_reaped(self)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _exit_info(status: int | None, stderr_tail: bytes) -> ExitInfo:
    if status is None:
        return ExitInfo(exit_code=None, stderr_tail=stderr_tail)
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else None
    return ExitInfo(
        exit_code=code if code >= 0 else None,
        signal=sig,
        cpu_limited=sig == signal.SIGXCPU,
        stderr_tail=stderr_tail,
    )
