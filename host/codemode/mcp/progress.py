"""``notifications/progress`` for an ``execute`` whose ``tools/call`` carries a ``progressToken``
(docs/reference/tools.md#progress).

What is sent, and how often, is the core's (:mod:`codemode.execution.progress`); this module only
chooses where: the request's own channel (the SDK's request-scoped ``report_progress``), which on
streamable HTTP is the response stream of that very POST and on stdio the connection of the client
that asked. Never the connection's standalone stream, never another request's, never another
session's. A request without a token gets no notifications and costs nothing.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractAsyncContextManager
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params

from ..execution.progress import Progress, reporting

__all__ = ["execute_progress"]


def execute_progress(request: Any) -> AbstractAsyncContextManager[Progress | None]:
    """The progress reporting of one ``execute`` call.

    Args:
        request: the SDK's request context (anything else: no progress).

    Returns:
        A context manager to run the execute in: it reports the execute's progress to the
        requesting client while it runs and sends the final state on leaving; a no-op when the
        request carries no ``progressToken``.
    """
    if not isinstance(request, ServerRequestContext) or progress_token_from_params(request.params) is None:
        return contextlib.nullcontext()
    session = request.session

    async def send(progress: float, message: str) -> None:
        await session.report_progress(progress, None, message)

    return reporting(send)
