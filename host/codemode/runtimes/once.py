"""A sandbox's ``destroy()`` done once (the runtime interface's rule, ``codemode.runtimes.base``):
the first call does the work; a concurrent or later call awaits the same ``ExitInfo``, shielded, so
a cancelled waiter cancels nothing; a destroy that fails reports an unknown exit instead of raising.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .base import ExitInfo

__all__ = ["DestroyOnce"]


class DestroyOnce:
    """The once-only ``destroy()`` of one sandbox: ``await once(self._destroy_once)``."""

    def __init__(self) -> None:
        self._result: asyncio.Future[ExitInfo] | None = None

    @property
    def begun(self) -> bool:
        """Whether ``destroy()`` was called (its work may still be running)."""
        return self._result is not None

    async def __call__(
        self,
        work: Callable[[], Awaitable[ExitInfo]],
        *,
        on_failure: Callable[[ExitInfo], object] | None = None,
        background: bool = False,
    ) -> ExitInfo:
        """Run ``work`` the first time; every call returns its ``ExitInfo``.

        Args:
            work: the destroy itself (close, kill if needed, reap).
            on_failure: called with the unknown exit when ``work`` raised (to release what the
                sandbox holds all the same).
            background: run ``work`` as a task of its own, which a cancelled caller does not
                stop (else the first caller runs it: a cancellation interrupts it, the exit is
                then unknown and the cancellation goes on).

        Returns:
            How the worker ended (``exit_code=None`` when ``work`` failed).

        Raises:
            BaseException: the first caller's cancellation (or other non-``Exception``), raised
                again after the exit was recorded as unknown.
        """
        if self._result is None:
            if background:
                self._result = asyncio.ensure_future(self._settled(work, on_failure))
            else:
                self._result = asyncio.get_running_loop().create_future()
                return await self._first(self._result, work, on_failure)
        return await asyncio.shield(self._result)

    @staticmethod
    async def _first(
        result: asyncio.Future[ExitInfo],
        work: Callable[[], Awaitable[ExitInfo]],
        on_failure: Callable[[ExitInfo], object] | None,
    ) -> ExitInfo:
        try:
            info = await work()
        except BaseException as exc:
            info = ExitInfo(exit_code=None)
            result.set_result(info)
            if on_failure is not None:
                on_failure(info)
            if isinstance(exc, Exception):
                return info
            raise
        result.set_result(info)
        return info

    @staticmethod
    async def _settled(
        work: Callable[[], Awaitable[ExitInfo]], on_failure: Callable[[ExitInfo], object] | None
    ) -> ExitInfo:
        try:
            return await work()
        except Exception:
            info = ExitInfo(exit_code=None)
            if on_failure is not None:
                on_failure(info)
            return info
