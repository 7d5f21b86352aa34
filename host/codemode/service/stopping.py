"""The stop of the HTTP service on SIGTERM (docs/service.md, "Shutdown").

A replica behind a load balancer (a Kubernetes Service) must not close its port while the balancer
still sends it new connections: the endpoint list is updated some time after the pod is told to
stop. So the first SIGTERM (or SIGINT) only *announces* the stop: ``/readyz`` answers 503 and every
response on the MCP port carries ``Connection: close`` (a client's next request opens a new
connection, which the balancer sends to another replica), while new connections and requests are
still served, for ``drain_delay`` seconds. Then uvicorn's own graceful stop runs: the listener
closes, requests in flight finish (``shutdown_timeout``), the lifespan drains the executes and
removes the workers. A second signal skips what is left of the delay.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["AnnouncedStopServer", "CloseWhenStopping"]

log = logging.getLogger("codemode.service")


class AnnouncedStopServer(uvicorn.Server):
    """uvicorn's server with the announced stop: the first SIGTERM/SIGINT calls ``announce`` and
    closes the listener ``drain_delay`` seconds later; a second signal closes it at once.

    Args:
        config: the uvicorn configuration.
        drain_delay: seconds between the first signal and the listener's close (0: at once).
        announce: called once, at the first signal (the service stops saying ready).
    """

    def __init__(self, config: uvicorn.Config, *, drain_delay: float, announce: Callable[[], None]) -> None:
        super().__init__(config)
        self.drain_delay = drain_delay
        self._announce = announce
        self._close_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler: the first signal announces the stop (and, without a delay, closes at
        once); a later one is uvicorn's (close now; a second SIGINT forces the exit).

        Args:
            sig: the signal number.
            frame: the interrupted frame.
        """
        if self._close_at is None and not self.should_exit:
            self._announce()
            self._close_at = time.monotonic() + self.drain_delay
            if self.drain_delay > 0:
                log.info(
                    "shutdown: %s: not ready; still serving for drain_delay=%gs, then closing the listener",
                    signal.Signals(sig).name,
                    self.drain_delay,
                )
                self._captured_signals.append(sig)  # re-raised after the graceful stop, as uvicorn does
                return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick (every 0.1 s), which also closes the listener once the delay is over.

        Args:
            counter: uvicorn's tick counter.

        Returns:
            Whether to stop serving.
        """
        if self._close_at is not None and not self.should_exit and time.monotonic() >= self._close_at:
            log.info("shutdown: drain delay over: closing the listener")
            self.should_exit = True
        return await super().on_tick(counter)


class CloseWhenStopping:
    """ASGI middleware: while ``stopping()`` says so, every HTTP response carries
    ``Connection: close``, so a keep-alive client moves to another replica for its next request.

    Args:
        app: the wrapped app.
        stopping: whether the stop was announced.
    """

    def __init__(self, app: ASGIApp, stopping: Callable[[], bool]) -> None:
        self.app = app
        self.stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.stopping():
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)
