"""One event loop, in a thread of its own, where a pack keeps its upstream connections.

An MCP client session belongs to the event loop it was opened on. Discovery runs while the host
loads its packs (synchronous code, before the serving loop exists), calls run on the serving loop,
and tests or embedders may use several loops: with every session on the pack's own loop, the
connection opened for discovery is the one that serves the calls (an upstream is started once), and
idle sessions can be closed on a timer whatever loop serves. :meth:`BackgroundLoop.run` awaits a
coroutine there from any other loop; cancelling the waiter cancels the coroutine (so an abandoned
call still sends ``notifications/cancelled`` upstream).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["BackgroundLoop"]

T = TypeVar("T")


class BackgroundLoop:
    """A daemon thread running an event loop, started on first use, stopped by :meth:`aclose`.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop, started now (with its thread) when it is not running.

        Returns:
            The event loop.
        """
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def main() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=main, name=self.name, daemon=True)
                self._thread.start()
                started.wait()
                self._loop = loop
            return self._loop

    def on_loop(self) -> bool:
        """Whether the caller runs on this loop's thread.

        Returns:
            True on the loop's thread.
        """
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on this loop.

        Args:
            coro: the coroutine.

        Returns:
            A future of its result.
        """
        return asyncio.run_coroutine_threadsafe(coro, self.loop())

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on this loop from the running one (directly when they are the same);
        cancelling the waiter cancels the coroutine.

        Args:
            coro: the coroutine.

        Returns:
            Its result.
        """
        if self.on_loop():
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop and wait for it (from a thread that is not this loop's).

        Args:
            coro: the coroutine.

        Returns:
            Its result.

        Raises:
            RuntimeError: called from the loop's own thread (the coroutine is closed unrun).
        """
        if self.on_loop():
            coro.close()
            raise RuntimeError(f"{self.name}: run_sync called from its own loop")
        return self.submit(coro).result()

    async def aclose(self, last: Coroutine[Any, Any, Any] | None = None) -> None:
        """Run ``last`` there (clean-up), then stop the loop and its thread.

        Args:
            last: a clean-up coroutine (closed unrun when the loop never started).
        """
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        if loop is None or thread is None:
            if last is not None:
                last.close()
            return
        try:
            if last is not None:
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(last, loop))
        finally:
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join)
            loop.close()
