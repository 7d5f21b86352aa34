"""Stateful MCP sessions bounded per subject and in total (docs/service.md, "MCP transport").

The SDK's session manager keeps every stateful session in one process-wide table (10,000 by
default, for 30 minutes of idleness): one tenant opening sessions in a loop filled it, and every
other tenant got 503 for half an hour. :class:`BoundedSessionManager` admits a new session only
while its subject holds fewer than ``per_subject`` sessions and the process fewer than ``total``
(``per_subject`` is the smaller, so one subject can never fill the table); a session is closed by
the SDK after ``session_idle_timeout`` seconds without a request in flight.

A subject at its bound that opens one more session (a client that forgets ``DELETE`` does, at every
start) gets it: the subject's own session idle the longest is closed to make room (it answers
``404`` from then on, as after an idle timeout). A session with a request in flight (a POST being
served, an open event stream) is not idle and is never closed so; another subject's session never
is. Only when none of the subject's sessions is idle is the opening refused with ``429``; at the
total, with ``503``. Both bodies are ``{"error": "too many open sessions"}``, and a refused opening
never reaches the MCP server.

It hooks the SDK manager's admission (``_admit_session``, under its creation lock, so concurrent
openings cannot overshoot) and discard (``_discard_session``, called however a session ends:
DELETE, idle timeout, crash, a failed opening request), and counts each session's requests in
flight itself (``handle_request``; an opening request counts from its admission).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable
from typing import Any

from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from .. import authz
from .responses import plain_json

__all__ = ["BoundedSessionManager"]

log = logging.getLogger("codemode.service")

#: The sessions admitted while serving the current request (its opening request holds them).
_OPENED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "codemode_sessions_opened", default=None
)

for _hook in ("_admit_session", "_discard_session"):
    if not callable(getattr(StreamableHTTPSessionManager, _hook, None)):  # pragma: no cover
        raise ImportError(f"the MCP SDK's session manager has no {_hook}(): sessions cannot be bounded")


class _SessionRefused(Exception):
    def __init__(self, bound: str) -> None:
        super().__init__(bound)
        self.bound = bound


class BoundedSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager with the bounds described in the module docstring.

    Args:
        app: the MCP server.
        per_subject: stateful sessions one subject may hold.
        total: stateful sessions in the process.
        on_refused: called with ``session_subject`` or ``session_total`` for each refused opening.
        kwargs: the SDK manager's other arguments (its own ``max_sessions`` is replaced).
    """

    def __init__(
        self,
        app: Any,
        *,
        per_subject: int,
        total: int,
        on_refused: Callable[[str], None] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs["max_sessions"] = None  # the total is this class's bound
        super().__init__(app, **kwargs)
        self.per_subject = per_subject
        self.total = total
        self.on_refused = on_refused
        self.owners: dict[str, str] = {}  # session id -> subject id
        self.by_subject: dict[str, int] = {}
        self.transports: dict[str, StreamableHTTPServerTransport] = {}
        self.in_flight: dict[str, int] = {}  # session id -> its requests being served
        self.idle_since: dict[str, float] = {}  # session id -> when its last request ended
        self._closing: set[asyncio.Task[None]] = set()

    def _admit_session(self, requestor: Any) -> StreamableHTTPServerTransport | None:
        subject = authz.current_subject()
        key = subject.id if subject is not None else ""
        if self.by_subject.get(key, 0) >= self.per_subject:
            self._evict_idle(key)  # the subject's own session idle the longest, if it has one
        if len(self.owners) >= self.total:
            raise _SessionRefused("session_total")
        if self.by_subject.get(key, 0) >= self.per_subject:
            raise _SessionRefused("session_subject")
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id is not None:
            sid = transport.mcp_session_id
            self.owners[sid] = key
            self.by_subject[key] = self.by_subject.get(key, 0) + 1
            self.transports[sid] = transport
            opened = _OPENED.get()
            if opened is not None:  # busy until its opening request is answered
                opened.append(sid)
                self.in_flight[sid] = 1
        return transport

    def _evict_idle(self, key: str) -> None:
        """Close subject ``key``'s session idle the longest (none with a request in flight): it
        leaves the bounds now, and its transport is terminated (the SDK then discards it)."""
        idle = [sid for sid, owner in self.owners.items() if owner == key and not self.in_flight.get(sid)]
        if not idle:
            return
        victim = min(idle, key=lambda sid: self.idle_since.get(sid, 0.0))
        transport = self.transports.get(victim)
        self._forget(victim)
        log.info("a subject at its session bound opened one more: its session idle the longest is closed")
        if transport is not None:
            task = asyncio.ensure_future(super()._discard_session(victim, transport))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _forget(self, session_id: str) -> None:
        key = self.owners.pop(session_id, None)
        self.transports.pop(session_id, None)
        self.in_flight.pop(session_id, None)
        self.idle_since.pop(session_id, None)
        if key is not None:
            left = self.by_subject.get(key, 0) - 1
            if left > 0:
                self.by_subject[key] = left
            else:
                self.by_subject.pop(key, None)

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        self._forget(session_id)
        await super()._discard_session(session_id, transport)

    def _enter(self, scope: Scope) -> str | None:
        """Count a request to one of the current subject's sessions as in flight; its session id."""
        sid: str | None = None
        for name, value in scope.get("headers", ()):
            if name == b"mcp-session-id":
                sid = bytes(value).decode("latin-1")
        subject = authz.current_subject()
        if sid is None or self.owners.get(sid) != (subject.id if subject is not None else ""):
            return None
        self.in_flight[sid] = self.in_flight.get(sid, 0) + 1
        return sid

    def _leave(self, sid: str) -> None:
        if sid not in self.owners:
            return
        left = self.in_flight.get(sid, 0) - 1
        if left > 0:
            self.in_flight[sid] = left
        else:
            self.in_flight.pop(sid, None)
            self.idle_since[sid] = time.monotonic()

    async def handle_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.stateless:
            await self._serve(scope, receive, send)
            return
        entered = self._enter(scope)
        opened: list[str] = []
        token = _OPENED.set(opened)
        try:
            await self._serve(scope, receive, send)
        finally:
            _OPENED.reset(token)
            for sid in ([entered] if entered is not None else []) + opened:
                self._leave(sid)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().handle_request(scope, receive, send)
        except _SessionRefused as refused:
            if self.on_refused is not None:
                self.on_refused(refused.bound)
            status = 429 if refused.bound == "session_subject" else 503
            await plain_json(send, status, {"error": "too many open sessions"}, [])
