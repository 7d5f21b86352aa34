"""Bounds on what one tenant can hold open at ``/mcp`` (docs/service.md, "Connections").

:class:`RequestGuard` sits behind bearer authentication (it needs the subject) and in front of the
MCP transport:

- in stateless mode a ``GET`` (the server-to-client event stream, which has nothing to carry without
  a session) is answered ``405`` at once instead of being held open forever;
- open ``/mcp`` requests are counted per subject and in total; one over either bound gets ``429``
  with ``Retry-After: 1`` and never reaches the MCP server;
- an event stream (a ``GET`` in stateful mode) that sends nothing for ``idle_timeout`` seconds is
  ended by the host, and every event stream ends after ``max_stream_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import authz
from .responses import plain_json

__all__ = ["RequestGuard"]


class RequestGuard:
    """Pure ASGI; run inside ``authz.with_subject`` (after bearer authentication).

    Args:
        app: the MCP transport app.
        stateless: whether the transport is stateless (a ``GET`` is answered 405).
        per_subject: open ``/mcp`` requests one subject may hold.
        total: open ``/mcp`` requests in all.
        idle_timeout: seconds an event stream may send nothing before the host ends it.
        max_stream_seconds: seconds after which every event stream ends.
        on_refused: called with ``subject`` or ``total`` for each request refused with 429.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        stateless: bool,
        per_subject: int,
        total: int,
        idle_timeout: float,
        max_stream_seconds: float,
        on_refused: Any = None,
    ) -> None:
        self.app = app
        self.stateless = stateless
        self.per_subject = per_subject
        self.total = total
        self.idle_timeout = idle_timeout
        self.max_stream_seconds = max_stream_seconds
        self.on_refused = on_refused
        self.open: dict[str, int] = {}
        self.open_total = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        subject = authz.current_subject()
        key = subject.id if subject is not None else ""
        method = scope.get("method", "")
        if self.stateless and method == "GET":
            await plain_json(send, 405, {"error": "method not allowed"}, [(b"allow", b"POST")])
            return
        if self.open_total >= self.total or self.open.get(key, 0) >= self.per_subject:
            if self.on_refused is not None:
                self.on_refused("subject" if self.open_total < self.total else "total")
            await plain_json(send, 429, {"error": "too many open requests"}, [(b"retry-after", b"1")])
            return
        self.open[key] = self.open.get(key, 0) + 1
        self.open_total += 1
        try:
            if method == "GET":
                await self._stream(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        finally:
            self.open_total -= 1
            left = self.open[key] - 1
            if left:
                self.open[key] = left
            else:
                del self.open[key]

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run a long-lived response, ending it when idle or too old."""
        started = time.monotonic()
        last = started
        state = {"started": False, "finished": False}

        async def watched_send(message: Message) -> None:
            nonlocal last
            last = time.monotonic()
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["finished"] = True
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, watched_send))
        try:
            while not task.done():
                now = time.monotonic()
                wait = min(last + self.idle_timeout, started + self.max_stream_seconds) - now
                if wait <= 0:
                    break
                await asyncio.wait({task}, timeout=wait)
        except BaseException:
            task.cancel()
            raise
        if task.done():
            task.result()  # the app's own outcome (its exception, if any, propagates)
            return
        # Idle or too old: end it. The client may reconnect (and is counted again).
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        if state["started"] and not state["finished"]:
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
