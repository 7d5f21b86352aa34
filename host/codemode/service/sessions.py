"""Stateful MCP sessions bounded per subject and in total (docs/service.md, "MCP transport").

The SDK's session manager keeps every stateful session in one process-wide table (10,000 by
default, for 30 minutes of idleness): one tenant opening sessions in a loop filled it, and every
other tenant got 503 for half an hour. :class:`BoundedSessionManager` admits a new session only
while its subject holds fewer than ``per_subject`` sessions and the process fewer than ``total``
(``per_subject`` is the smaller, so one subject can never fill the table); a session is closed by
the SDK after ``session_idle_timeout`` seconds without a request in flight. A refused opening
request gets ``429`` (the subject's bound) or ``503`` (the total) with ``{"error": "too many open
sessions"}`` and never reaches the MCP server.

It hooks the SDK manager's admission (``_admit_session``, under its creation lock, so concurrent
openings cannot overshoot) and discard (``_discard_session``, called however a session ends:
DELETE, idle timeout, crash, a failed opening request).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from .. import authz
from .responses import plain_json

__all__ = ["BoundedSessionManager"]

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

    def _admit_session(self, requestor: Any) -> StreamableHTTPServerTransport | None:
        subject = authz.current_subject()
        key = subject.id if subject is not None else ""
        if len(self.owners) >= self.total:
            raise _SessionRefused("session_total")
        if self.by_subject.get(key, 0) >= self.per_subject:
            raise _SessionRefused("session_subject")
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id is not None:
            self.owners[transport.mcp_session_id] = key
            self.by_subject[key] = self.by_subject.get(key, 0) + 1
        return transport

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        key = self.owners.pop(session_id, None)
        if key is not None:
            left = self.by_subject.get(key, 0) - 1
            if left > 0:
                self.by_subject[key] = left
            else:
                self.by_subject.pop(key, None)
        await super()._discard_session(session_id, transport)

    async def handle_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().handle_request(scope, receive, send)
        except _SessionRefused as refused:
            if self.on_refused is not None:
                self.on_refused(refused.bound)
            status = 429 if refused.bound == "session_subject" else 503
            await plain_json(send, status, {"error": "too many open sessions"}, [])
