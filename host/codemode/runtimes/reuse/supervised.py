"""The host's side of one reusable sandbox (the reuse mode): a container or pod whose PID 1 is
``codemode_worker.supervisor``, reached through its attached stream, which carries
``codemode_worker.supervisor_channel``.

``Supervised`` wraps the runtime's own sandbox (the attached container or pod: its ``write`` and
``read`` carry the channel; its ``destroy`` removes the container) and hands out one ``Lease`` at a
time: the worker of the next epoch, a ``Sandbox`` like any other. A lease's ``write`` sends ``D``
messages of its epoch; its ``read`` decodes what the supervisor sent (hostile input: known kinds,
bounded payloads, ``ChannelDecoder``) and returns that epoch's stdout; its ``destroy`` sends ``K``
(not after the worker's own last frame, when the supervisor ends the epoch by itself: then only if
that worker's end has not come within ``SELF_END_GRACE``) and waits for the supervisor's ``X`` (how
the worker ended) and ``C`` (the scrub's verdict, and whether the next worker answered the
supervisor's probe), bounded by ``end_timeout``. Anything unexpected (a channel violation, another
epoch's exit, a timeout, the stream ending) marks the sandbox broken: it is then never leased again,
only destroyed.

What the host trusts: nothing the supervisor says widens what a client gets. ``C`` ok only lets
the *same subject's* next execute use the sandbox (``codemode.runtimes.reuse`` never moves one to
another subject), and the host still recycles it after ``max_executes``, ``idle_seconds`` and any
limit hit, whatever the supervisor reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from codemode_worker import PROTOCOL_VERSION
from codemode_worker import supervisor_channel as channel

from ..base import ExitInfo, Sandbox, SandboxClosed, SpawnFailed
from ..once import DestroyOnce
from ..streams import STDERR_TAIL

__all__ = ["PING", "SELF_END_GRACE", "SUPERVISOR_ENTRY", "Lease", "Supervised", "supervisor_command"]

log = logging.getLogger("codemode.runtimes.reuse")

#: The command of a reusable sandbox's PID 1 (the worker image's interpreter).
SUPERVISOR_ENTRY: Final = ("python3", "-I", "-m", "codemode_worker.supervisor")
_READ: Final = 256 * 1024
#: The greeting a reusable sandbox's supervisor answers with its hello.
PING: Final = channel.encode(channel.PING, 0)
#: Seconds a lease whose worker ends by itself waits for its ``X`` before it sends ``K`` anyway.
SELF_END_GRACE: Final = 0.5


def supervisor_command(testing_entry: bool) -> list[str]:
    """The supervisor's command line.

    Args:
        testing_entry: its workers run the TEST-ONLY entry (``--testing``).

    Returns:
        The command line.
    """
    return [*SUPERVISOR_ENTRY, *(["--testing"] if testing_entry else [])]


class Supervised:
    """One reusable container or pod, leased to at most one subject for its whole life."""

    def __init__(self, raw: Sandbox, *, end_timeout: float = 5.0) -> None:
        """Wrap a started container or pod whose PID 1 is the supervisor.

        Args:
            raw: its byte stream (the runtime's sandbox).
            end_timeout: seconds a lease's end (the worker's exit report) may take.
        """
        self.raw = raw
        self.end_timeout = end_timeout
        self.decoder = channel.ChannelDecoder()
        #: The epoch the next lease gets (the supervisor's current worker).
        self.epoch = 0
        #: Executes served (leases ended).
        self.executes = 0
        self.created = time.monotonic()
        self.idle_since = self.created
        #: The subject this sandbox belongs to, from its first lease on.
        self.subject: str | None = None
        #: Why this sandbox must not be leased again (None: it may be).
        self.broken: str | None = None
        self.lease: Lease | None = None
        #: The epoch whose worker the supervisor has probed already (its ``H`` or last ``C`` said
        #: ``ready``): that lease needs no probe from the host.
        self.ready_epoch: int | None = None
        #: The supervisor ends an epoch by itself when its worker ends (its ``H`` said ``ends``):
        #: a lease whose worker sent its own last frame sends no ``K`` (``Lease._ask_end``).
        self.self_ends = False
        self._pending: list[tuple[bytes, int, bytes]] = []

    @property
    def worker_id(self) -> str:
        """The container's or pod's id, for host logs."""
        return self.raw.worker_id

    def usable(self) -> bool:
        """Whether it may serve another lease.

        Returns:
            False once retired, broken or dead.
        """
        return self.broken is None and self.raw.alive()

    def retire(self, reason: str, *, anomaly: bool = True) -> None:
        """Never lease this sandbox again.

        Args:
            reason: why, for host logs.
            anomaly: logged as a warning; else it is routine (the sandbox served its executes, was
                idle too long, or its execute hit a limit).
        """
        if self.broken is None:
            self.broken = reason
            log.log(
                logging.WARNING if anomaly else logging.DEBUG,
                "reusable sandbox %s recycled: %s",
                self.raw.worker_id,
                reason,
            )

    async def next_message(self) -> tuple[bytes, int, bytes] | None:
        """Read one message of the channel; a violation breaks the sandbox.

        Returns:
            ``(kind, epoch, payload)``, or None when the stream has ended.
        """
        while True:
            if self._pending:
                return self._pending.pop(0)
            data = await self.raw.read(_READ)
            if not data:
                self.retire("the sandbox's stream ended")
                return None
            try:
                self._pending = self.decoder.feed(data)
            except channel.ChannelError as exc:
                self.retire(f"supervisor channel: {exc}")
                return None

    async def started(self, timeout: float, *, sent: bool = False) -> None:
        """Ping the supervisor and wait for its hello.

        Args:
            timeout: seconds to wait.
            sent: the launch has sent ``PING`` already (the Kubernetes runtime's early attach):
                only wait for the hello.

        Raises:
            SpawnFailed: the hello did not come in time.
        """
        try:
            async with asyncio.timeout(timeout):
                if not sent:
                    await self.raw.write(PING)
                message = await self.next_message()
        except TimeoutError:
            raise SpawnFailed(f"supervisor of {self.worker_id} did not start in {timeout}s") from None
        except SandboxClosed:
            raise SpawnFailed(f"supervisor of {self.worker_id} closed its input") from None
        if message is None or message[0] != channel.HELLO:
            raise SpawnFailed(f"supervisor of {self.worker_id} did not say hello: {self.broken or message!r}")
        try:
            hello = channel.parse_control(message[2])
        except channel.ChannelError as exc:
            raise SpawnFailed(f"supervisor of {self.worker_id}: {exc}") from None
        if hello.get("v") != PROTOCOL_VERSION or not isinstance(hello.get("epoch"), int):
            raise SpawnFailed(f"supervisor of {self.worker_id} speaks {hello!r}")
        self.epoch = hello["epoch"]
        self.ready_epoch = self.epoch if hello.get("ready") is True else None
        self.self_ends = hello.get("ends") is True

    def new_lease(self, on_end: Callable[[Supervised], Any] | None = None) -> Lease:
        """Lease the sandbox's next worker to one execute.

        Args:
            on_end: called with this sandbox when the lease ends.

        Returns:
            The lease (a ``Sandbox``).

        Raises:
            SandboxClosed: the sandbox is not usable or already leased.
        """
        if not self.usable() or self.lease is not None:
            raise SandboxClosed(self.worker_id)
        self.lease = Lease(self, self.epoch, on_end)
        return self.lease

    async def destroy(self) -> ExitInfo:
        """Remove the container or pod (whatever state its lease is in).

        Returns:
            How the container or pod ended.
        """
        self.retire("destroyed", anomaly=False)
        return await self.raw.destroy()


class Lease:
    """One execute's worker in a reusable sandbox: a ``Sandbox`` (see the module docstring)."""

    def __init__(self, box: Supervised, epoch: int, on_end: Callable[[Supervised], Any] | None) -> None:
        """One lease (made by :meth:`Supervised.new_lease`).

        Args:
            box: the sandbox.
            epoch: the worker's number in it (the channel's epoch).
            on_end: called with the sandbox when the lease ends.
        """
        self.box = box
        self.epoch = epoch
        self._on_end = on_end
        self._out = bytearray()
        self._stderr = bytearray()
        self._exit: dict[str, Any] | None = None
        self._clean: dict[str, Any] | None = None
        self._input_closed = False
        self._ended = False
        self._reusable = False
        self._destroy = DestroyOnce()
        self.exit_info: ExitInfo | None = None
        #: Its worker answered the supervisor's probe already (no probe from the host needed).
        self.ready = box.ready_epoch == epoch
        self._late_end: asyncio.Future[None] | None = None
        self._worker_done = False
        #: Set once the lease has ended (the sandbox is back with its pool, or recycled).
        self.ended = asyncio.Event()

    @property
    def worker_id(self) -> str:
        return f"{self.box.worker_id}.{self.epoch}"

    @property
    def stderr_tail(self) -> bytes:
        """The bounded tail of this worker's stderr (for host logs)."""
        return bytes(self._stderr)

    def reusable(self, worker_done: bool = False) -> None:
        """The execute ended in a way that lets this subject's next execute use the sandbox.

        Args:
            worker_done: it ended with the worker's own last frame, after which the worker ends by
                itself (else the host ended it, such as on a denied call, and the worker waits for
                an answer: ``K`` goes at once).
        """
        self._reusable = True
        self._worker_done = worker_done

    def alive(self) -> bool:
        return self._exit is None and not self._ended and self.box.usable()

    async def write(self, data: bytes) -> None:
        if self._input_closed or self._ended or self._exit is not None or not self.box.usable():
            raise SandboxClosed(self.worker_id)
        await self.box.raw.write(channel.encode(channel.DATA, self.epoch, data))

    async def close_input(self) -> None:
        if self._input_closed:
            return
        self._input_closed = True
        if self.box.usable() and self._exit is None:
            with contextlib.suppress(SandboxClosed):
                await self.box.raw.write(channel.encode(channel.CLOSE_INPUT, self.epoch))

    async def read(self, max_bytes: int) -> bytes:
        if max_bytes <= 0:
            return b""
        while not self._out:
            if self._exit is not None or self._ended or not await self._pull():
                return b""
        chunk = bytes(self._out[:max_bytes])
        del self._out[:max_bytes]
        return chunk

    async def _pull(self) -> bool:
        """Take one message for this epoch; False when its output has ended."""
        message = await self.box.next_message()
        if message is None:
            return False
        kind, epoch, payload = message
        if epoch != self.epoch:
            self.box.retire(f"message {kind!r} of epoch {epoch} during epoch {self.epoch}")
            return False
        if kind == channel.STDOUT:
            if not self._ended:
                self._out += payload
        elif kind == channel.STDERR:
            self._stderr += payload
            del self._stderr[: max(0, len(self._stderr) - STDERR_TAIL)]
        elif kind == channel.EXIT and self._exit is None:
            self._exit = self._control(payload)
        elif kind == channel.CLEAN and self._exit is not None and self._clean is None:
            self._clean = self._control(payload)
        else:
            self.box.retire(f"unexpected message {kind!r} in epoch {self.epoch}")
            return False
        return True

    def _control(self, payload: bytes) -> dict[str, Any]:
        try:
            return channel.parse_control(payload)
        except channel.ChannelError as exc:
            self.box.retire(f"supervisor channel: {exc}")
            return {}

    @property
    def ending(self) -> bool:
        """Its execute is over (marked ``reusable()``) or ``destroy()`` began: the sandbox comes
        back (or is recycled) within ``end_timeout``; ``ended`` is set then."""
        return self._reusable or self._destroy.begun

    async def destroy(self) -> ExitInfo:
        return await self._destroy(self._end, background=True)

    async def _end(self) -> ExitInfo:
        box = self.box
        self._ended = True
        self._out.clear()
        try:
            if box.usable():
                async with asyncio.timeout(box.end_timeout):
                    await self._ask_end()
                    while self._clean is None and box.usable():
                        await self._pull()
        except TimeoutError:
            box.retire(f"the supervisor did not finish epoch {self.epoch} in {box.end_timeout}s")
        except SandboxClosed:
            box.retire("the sandbox's input closed")
        except Exception as exc:  # never raises: destroy() contract
            box.retire(f"ending epoch {self.epoch} failed: {type(exc).__name__}: {exc}")
        if self._late_end is not None and not self._late_end.done():
            self._late_end.cancel()  # still asleep (a write under way is shielded)
        info = self._exit_info()
        if self._clean is not None and self._clean.get("ok") is not True:
            box.retire(f"scrub anomaly: {str(self._clean.get('anomaly'))[:200]}")
        elif self._clean is not None:
            box.epoch = self.epoch + 1
            box.ready_epoch = box.epoch if self._clean.get("ready") is True else None
        if info.resource_killed:
            box.retire("a limit ended its worker", anomaly=False)
        if not self._reusable:
            box.retire("its execute did not end cleanly", anomaly=False)
        box.executes += 1
        box.lease = None
        box.idle_since = time.monotonic()
        if box.broken is not None:
            info = self._merge(info, await box.raw.destroy())
        self.exit_info = info
        if self._on_end is not None:
            self._on_end(box)
        self.ended.set()
        return info

    async def _ask_end(self) -> None:
        """Send ``K``, unless the worker ends by itself: a supervisor that ``self_ends`` ends the
        epoch of a worker that ended unasked, which a worker does after its execute's last frame
        (``reusable(worker_done=True)``). Then ``K`` goes only if that worker's ``X`` has not come
        within ``SELF_END_GRACE`` (a K for an epoch that has ended is ignored). A write once begun
        is never cancelled: a message cut short would break the channel."""
        box = self.box
        if not (box.self_ends and self._reusable and self._worker_done):
            await box.raw.write(channel.encode(channel.END, self.epoch))
            return
        if self._exit is not None:
            return

        async def late() -> None:
            await asyncio.sleep(SELF_END_GRACE)
            if self._exit is None and box.usable():
                try:
                    await asyncio.shield(box.raw.write(channel.encode(channel.END, self.epoch)))
                except SandboxClosed:  # the lease's end sees the stream's state itself
                    return

        self._late_end = asyncio.ensure_future(late())

    def _exit_info(self) -> ExitInfo:
        ex = self._exit or {}
        code, sig = ex.get("code"), ex.get("signal")
        return ExitInfo(
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            signal=sig if isinstance(sig, int) and not isinstance(sig, bool) else None,
            oom_killed=ex.get("oom") is True,
            stderr_tail=bytes(self._stderr),
        )

    def _merge(self, mine: ExitInfo, container: ExitInfo) -> ExitInfo:
        """The worker's exit as the supervisor reported it; the container's when it reported none
        (the container ended with it: e.g. the whole sandbox was OOM-killed)."""
        if self._exit is not None:
            return mine
        return ExitInfo(
            exit_code=container.exit_code,
            signal=container.signal,
            oom_killed=container.oom_killed,
            cpu_limited=container.cpu_limited,
            stderr_tail=bytes(self._stderr) + container.stderr_tail[-STDERR_TAIL:],
        )
