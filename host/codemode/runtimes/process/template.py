"""The host's side of a worker template (``codemode_worker.template``): start it, ask it for workers.

The template is one long-lived local process, started like a worker (the worker's Python with
``-I``, the worker's environment, ``/``, its own session, ``no_new_privs``), that forks a fresh
worker per request. The host talks to it over one ``SOCK_SEQPACKET`` socket pair
(``codemode_worker.template_wire``): it sends the worker's three pipe ends and its uid, gets back the
worker's pid and a pidfd, and later asks for the worker to be reaped, which returns its wait status.
A template that dies (its channel ends) fails whatever was waiting on it; the process runtime starts
a new one for the next worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Sequence
from typing import Any

from codemode_worker.template_wire import EXITED, FAILED, FORK, FORKED, MESSAGE, READY, REAP, receive

from ..base import SpawnFailed

__all__ = ["EXIT_GRACE", "STDERR_TAIL", "TemplateGone", "WorkerTemplate", "drain_tail", "keep_tail"]

log = logging.getLogger("codemode.runtimes.template")

#: Bytes of a worker's (or the template's) stderr kept for host logs: the last ones.
STDERR_TAIL = 8 * 1024
#: Seconds aclose() waits for the template to kill its workers and exit before killing it.
EXIT_GRACE = 5.0


def keep_tail(tail: bytearray, chunk: bytes) -> None:
    """Append a chunk to a bounded tail.

    Args:
        tail: the tail (changed in place), at most ``STDERR_TAIL`` bytes.
        chunk: what was read.
    """
    tail += chunk
    del tail[:-STDERR_TAIL]


async def drain_tail(stream: asyncio.StreamReader, tail: bytearray) -> None:
    """Read a stream to its end (so its pipe never fills), keeping a bounded tail.

    Args:
        stream: the stream (a worker's stderr).
        tail: receives its last ``STDERR_TAIL`` bytes.
    """
    while chunk := await stream.read(64 * 1024):
        keep_tail(tail, chunk)


class TemplateGone(SpawnFailed):
    """The template ended (or never answered): nothing more can be asked of it."""


class WorkerTemplate:
    """One running template and its control channel; use from one event loop."""

    def __init__(self, proc: asyncio.subprocess.Process, control: socket.socket) -> None:
        """A template just started (use :meth:`start`).

        Args:
            proc: the template's process.
            control: the host's end of its control channel.
        """
        self._proc = proc
        self._control = control
        self._loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[int] = self._loop.create_future()
        self._forks: dict[int, asyncio.Future[tuple[int, int]]] = {}
        self._reaps: dict[int, asyncio.Future[int]] = {}
        self._stderr = bytearray()
        self.gone = False
        self.pid = proc.pid
        self.forked = 0
        assert proc.stderr is not None
        self._stderr_task = self._loop.create_task(drain_tail(proc.stderr, self._stderr))
        self._loop.add_reader(control.fileno(), self._on_readable)

    @classmethod
    async def start(
        cls, command: Sequence[str], env: dict[str, str], preexec: object, timeout: float
    ) -> WorkerTemplate:
        """Start the template and wait for its ``READY``.

        Args:
            command: its command line (``--control FD`` is added).
            env: its environment.
            preexec: run in the child before it executes (limits, uid).
            timeout: seconds to wait for ``READY``.

        Returns:
            The running template.

        Raises:
            TemplateGone: it did not start or answer in time.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ours.setblocking(False)
            proc = await asyncio.create_subprocess_exec(
                *command,
                "--control",
                str(theirs.fileno()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                preexec_fn=preexec,  # type: ignore[arg-type]
                cwd="/",
            )
        except OSError as exc:
            ours.close()
            raise TemplateGone(f"cannot start the worker template: {exc}") from exc
        finally:
            theirs.close()
        template = cls(proc, ours)
        try:
            await asyncio.wait_for(asyncio.shield(template._ready), timeout)
        except (TimeoutError, TemplateGone):
            reason = template.stderr_tail() or "no output"
            await template.aclose()
            raise TemplateGone(f"the worker template did not start: {reason}") from None
        except BaseException:  # cancelled while it starts: it must not outlive the start
            await asyncio.shield(template.aclose())
            raise
        return template

    def stderr_tail(self) -> str:
        """The last line the template wrote to its stderr (for host logs).

        Returns:
            That line, or "".
        """
        lines = bytes(self._stderr).decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else ""

    # -- the channel --------------------------------------------------------------------------

    def _on_readable(self) -> None:
        while not self.gone:
            try:
                message = receive(self._control, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._lost("its channel failed")
                return
            if message is None:
                self._lost("it sent an unreadable message")
                return
            data, fds = message
            if not data:
                self._lost("it exited")
                return
            op, number, value = MESSAGE.unpack(data)
            self._dispatch(op, number, value, fds)

    def _dispatch(self, op: int, number: int, value: int, fds: list[int]) -> None:
        if op == FORKED and len(fds) == 1 and value > 0 and number in self._forks:
            future = self._forks.pop(number)
            if future.done():  # the spawn gave up meanwhile: the worker is ours to end
                self._abandon(number, value, fds[0])
            else:
                future.set_result((value, fds[0]))
            return
        for fd in fds:
            os.close(fd)
        if op == FAILED and number in self._forks:
            forking = self._forks.pop(number)
            if not forking.done():
                forking.set_exception(SpawnFailed(f"the worker template cannot fork: {os.strerror(value)}"))
        elif op == EXITED and number in self._reaps:
            reaping = self._reaps.pop(number)
            if not reaping.done():
                reaping.set_result(value)
        elif op == READY and number == 0 and not self._ready.done():
            self._ready.set_result(value)
        else:
            self._lost(f"it sent an unexpected message (op {op})")

    def _abandon(self, number: int, pid: int, pidfd: int) -> None:
        """A worker nobody waits for any more: kill it and have it reaped."""
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        os.close(pidfd)
        self._loop.create_task(self._reap_quietly(number))

    async def _reap_quietly(self, number: int) -> None:
        with contextlib.suppress(SpawnFailed):
            await self.reap(number)

    def _lost(self, why: str) -> None:
        if self.gone:
            return
        self.gone = True
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._control.fileno())
        self._control.close()
        error = TemplateGone(f"the worker template (pid {self.pid}) is gone: {why}")
        waiting: list[asyncio.Future[Any]] = [self._ready, *self._forks.values(), *self._reaps.values()]
        for future in waiting:
            if not future.done():
                future.set_exception(error)
        self._forks.clear()
        self._reaps.clear()
        if why != "closed by the host":
            log.warning("worker template %d: %s", self.pid, why)

    def _send(self, op: int, number: int, value: int, fds: Sequence[int] = ()) -> None:
        if self.gone:
            raise TemplateGone(f"the worker template (pid {self.pid}) is gone")
        data = MESSAGE.pack(op, number, value)
        try:
            if fds:
                socket.send_fds(self._control, [data], list(fds))
            else:
                self._control.send(data)
        except BlockingIOError:
            # Packets are tiny and the template reads them at once: a full channel means it is stuck.
            self._lost("its channel is full")
            raise TemplateGone(f"the worker template (pid {self.pid}) does not read its channel") from None
        except OSError as exc:
            self._lost(f"its channel failed: {exc}")
            raise TemplateGone(f"the worker template (pid {self.pid}) is gone") from None

    # -- requests -----------------------------------------------------------------------------

    async def fork(self, number: int, uid: int, stdio: Sequence[int]) -> tuple[int, int]:
        """Fork a new worker. The caller owns the pidfd and must ``reap(number)`` it.

        Args:
            number: its number on the control channel.
            uid: the uid it runs as (0: the template's).
            stdio: its stdin, stdout and stderr ends.

        Returns:
            Its pid and a pidfd of it.
        """
        future: asyncio.Future[tuple[int, int]] = self._loop.create_future()
        self._forks[number] = future
        try:
            self._send(FORK, number, uid, stdio)
        except TemplateGone:
            self._forks.pop(number, None)
            raise
        self.forked += 1
        return await future

    async def reap(self, number: int) -> int:
        """Wait for a forked worker to be reaped, once the caller has killed it (or it ended).

        Args:
            number: its number on the control channel.

        Returns:
            Its wait status.
        """
        future: asyncio.Future[int] = self._loop.create_future()
        self._reaps[number] = future
        try:
            self._send(REAP, number, 0)
        except TemplateGone:
            self._reaps.pop(number, None)
            raise
        return await future

    @property
    def returncode(self) -> int | None:
        """The template's exit status, or None while it runs."""
        return self._proc.returncode

    async def aclose(self) -> None:
        """Close the channel (the template then kills and reaps its workers and exits); wait for it."""
        self._lost("closed by the host")
        try:
            await asyncio.wait_for(self._proc.wait(), EXIT_GRACE)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._stderr_task, 1.0)
        self._stderr_task.cancel()
