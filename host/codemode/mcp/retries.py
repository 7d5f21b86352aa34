"""Executes that ask the user on 2026-07-28 connections (docs/reference/authorization.md#asking-the-user).

That protocol has no server requests: a server that needs the user's input answers the
``tools/call`` with an ``InputRequiredResult`` (the elicitation, and an opaque ``request_state``),
and the client asks the user and retries the same call with the answer in ``input_responses`` and
the state echoed.

Nothing waits in between. The execute is suspended (codemode.execution.suspension): its worker and
slot go, a record stays in the store, and the ``request_state`` names that record, signed with the
store's key and bound to the subject and the program. The retry, on this host or any other sharing
the store, claims the record (one winner) and resumes the execute by replaying the program against
its call log; its result (or its next question) answers the retry.

A state that is forged, used, expired, another subject's or sent with another program is a JSON-RPC
``invalid params`` error ("unknown or expired request state"), whichever it is. A retry that never
comes leaves a record that expires at ``max_approval_time`` (declined; nothing of it stays).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from .. import authz
from ..common.errors import Internal
from ..common.outcomes import ExecuteResult
from ..execution.server import Server
from ..execution.suspension import Suspended, UnknownSuspension
from .approval import INPUT_KEY, RetryApprover, elicitation, read_answer

__all__ = ["UNKNOWN_STATE", "RetryingExecutes"]

#: The JSON-RPC -32602 message of a retry whose request state is not one this subject may resume.
UNKNOWN_STATE = "unknown or expired request state"


class RetryingExecutes:
    """Starts and resumes the executes of one MCP server on the 2026-07-28 protocol (it keeps
    nothing: a suspended execute is a record in the server's store)."""

    async def start(
        self, server: Server, subject: authz.Subject, source: str, meta: Any, can_elicit: bool
    ) -> ExecuteResult | types.InputRequiredResult:
        """Run an execute; its result, or the question it asks first.

        Args:
            server: the built server.
            subject: the trusted subject.
            source: the program.
            meta: the request's ``_meta`` (trace context).
            can_elicit: whether the client declared form-mode elicitation (if not, an ask declines).

        Returns:
            The execute's result, or an ``InputRequiredResult`` with its first question (the
            execute's ``CodeModeError`` is raised).
        """
        approver = RetryApprover(can_elicit) if can_elicit else None
        try:
            return await server.run(source, subject=subject, trace_context=meta, approver=approver)
        except Suspended as suspended:
            return await _question(server, suspended)

    async def resume(
        self,
        server: Server,
        subject: authz.Subject,
        source: str,
        state: Any,
        responses: Any,
        meta: Mapping[str, Any] | None = None,
    ) -> ExecuteResult | types.InputRequiredResult:
        """A retry: resume the suspended execute with its answer; its result or its next question.

        Args:
            server: the built server.
            subject: the trusted subject.
            source: the program (must be the one that asked).
            state: the retry's ``request_state``.
            responses: the retry's ``input_responses``.
            meta: the request's ``_meta`` (trace context).

        Returns:
            The execute's result, or an ``InputRequiredResult`` with its next question.

        Raises:
            MCPError: ``-32602`` :data:`UNKNOWN_STATE`: the state is forged, used, expired, or
                another subject's or program's.
        """
        response = responses.get(INPUT_KEY) if isinstance(responses, dict) else None
        try:
            return await server.resume(
                state,
                subject=subject,
                source=source,
                answer=read_answer(response),
                trace_context=meta,
                approver=RetryApprover(True),
            )
        except UnknownSuspension:
            raise MCPError(code=types.INVALID_PARAMS, message=UNKNOWN_STATE) from None
        except Suspended as suspended:
            return await _question(server, suspended)

    async def open(self) -> None:
        """Nothing to open (the server's lifecycle step, ``codemode.packs.Lifecycle``)."""

    async def aclose(self) -> None:
        """Nothing to close: suspended executes are records in the store, not tasks."""


async def _question(server: Server, suspended: Suspended) -> types.InputRequiredResult:
    """The ``InputRequiredResult`` that asks a suspension's question (``internal failure`` when the
    store cannot sign its state: the record then just expires)."""
    try:
        state = await server.request_state(suspended)
    except Exception:
        raise Internal() from None
    return types.InputRequiredResult(
        input_requests={INPUT_KEY: elicitation(suspended.request)}, request_state=state
    )
