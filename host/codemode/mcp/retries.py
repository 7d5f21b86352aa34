"""Executes that ask the user on 2026-07-28 connections (docs/reference/authorization.md#asking-the-user).

That protocol has no server requests: a server that needs the user's input answers the
``tools/call`` with an ``InputRequiredResult`` (the elicitation, and an opaque ``request_state``),
and the client asks the user and retries the same call with the answer in ``input_responses`` and
the state echoed. The program cannot start again (its earlier calls had effects), so the execute is
not restarted: it runs in a task of its own, which this registry keeps while it waits inside the
call, under a fresh unguessable state token bound to the subject and the program. The retry
resumes it; its result (or the next question) answers the retry.

Bounds: the executor's (``max_approval_time`` per question, ``max_approval_wait`` per execute,
``max_pending_approvals`` per subject, the subject quota). A retry that never comes is a question
nobody answered: declined at ``max_approval_time``, and the program goes on; a client that walked
away cannot say so on this protocol, so ``max_approval_wait`` is what ends an execute that keeps
asking. Its result is kept for :data:`RESULT_GRACE` seconds for a late retry, then dropped. A
state token is used once, works only for the subject and the program it was issued for, and only
on this process: an unknown one is a JSON-RPC ``invalid params`` error ("unknown or expired
request state").
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from .. import authz
from ..common.outcomes import ExecuteResult
from ..execution.approval import ApprovalRequest
from ..execution.observe import ApprovalAnswer
from ..execution.server import Server
from .approval import INPUT_KEY, RetryApprover, elicitation, read_answer

__all__ = ["RESULT_GRACE", "UNKNOWN_STATE", "RetryingExecutes"]

#: Seconds a finished execute's result waits for a retry that comes after its question was closed.
RESULT_GRACE = 30.0
#: The JSON-RPC -32602 message of a retry whose request state is not one this subject may resume.
UNKNOWN_STATE = "unknown or expired request state"


@dataclass
class _Parked:
    subject_id: str
    source: str
    task: asyncio.Task[ExecuteResult]
    approver: RetryApprover
    answer: asyncio.Future[ApprovalAnswer]


class RetryingExecutes:
    """The executes of one MCP server that wait for a retry (closed with the server)."""

    def __init__(self) -> None:
        self.parked: dict[str, _Parked] = {}
        self.tasks: set[asyncio.Task[ExecuteResult]] = set()

    async def start(
        self, server: Server, subject: authz.Subject, source: str, meta: Any, can_elicit: bool
    ) -> ExecuteResult | types.InputRequiredResult:
        """Run an execute; its result, or the question it asks first.

        Args:
            server: the built server.
            subject: the trusted subject.
            source: the program.
            meta: the request's ``_meta`` (trace context).
            can_elicit: whether the client declared form-mode elicitation.

        Returns:
            The execute's result, or an ``InputRequiredResult`` with its first question (the
            execute's ``CodeModeError`` is raised).
        """
        approver = RetryApprover(can_elicit)
        task = asyncio.get_running_loop().create_task(
            server.run(source, subject=subject, trace_context=meta, approver=approver)
        )
        self.tasks.add(task)
        task.add_done_callback(self._finished)
        return await self._follow(task, approver, subject.id, source)

    async def resume(
        self, subject: authz.Subject, source: str, state: Any, responses: Any
    ) -> ExecuteResult | types.InputRequiredResult:
        """A retry: answer the parked question, then the execute's result or its next question.

        Args:
            subject: the trusted subject.
            source: the program (must be the one that asked).
            state: the retry's ``request_state``.
            responses: the retry's ``input_responses``.

        Returns:
            The execute's result, or an ``InputRequiredResult`` with its next question.

        Raises:
            MCPError: ``-32602`` :data:`UNKNOWN_STATE`: the state is unknown, used, expired, or
                another subject's or program's.
        """
        parked = self.parked.get(state) if isinstance(state, str) else None
        if parked is None or parked.subject_id != subject.id or parked.source != source:
            raise MCPError(code=types.INVALID_PARAMS, message=UNKNOWN_STATE)
        del self.parked[state]
        if not parked.answer.done():
            response = responses.get(INPUT_KEY) if isinstance(responses, dict) else None
            parked.answer.set_result(read_answer(response))
        return await self._follow(parked.task, parked.approver, parked.subject_id, source)

    async def _follow(
        self, task: asyncio.Task[ExecuteResult], approver: RetryApprover, subject_id: str, source: str
    ) -> ExecuteResult | types.InputRequiredResult:
        while True:
            getter = asyncio.ensure_future(approver.questions.get())
            try:
                await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                getter.cancel()
                task.cancel()  # the client gave up on this call: the execute ends with it
                raise
            if not getter.done():
                getter.cancel()
                return task.result()  # raises the execute's CodeModeError
            request, answer = getter.result()
            if not answer.done():  # a question closed already (its time ran out) is skipped
                return self._park(task, approver, subject_id, source, request, answer)

    def _park(
        self,
        task: asyncio.Task[ExecuteResult],
        approver: RetryApprover,
        subject_id: str,
        source: str,
        request: ApprovalRequest,
        answer: asyncio.Future[ApprovalAnswer],
    ) -> types.InputRequiredResult:
        token = secrets.token_urlsafe(32)
        self.parked[token] = _Parked(subject_id, source, task, approver, answer)

        def expire(_: asyncio.Task[ExecuteResult]) -> None:
            asyncio.get_running_loop().call_later(RESULT_GRACE, self.parked.pop, token, None)

        task.add_done_callback(expire)
        return types.InputRequiredResult(
            input_requests={INPUT_KEY: elicitation(request)}, request_state=token
        )

    def _finished(self, task: asyncio.Task[ExecuteResult]) -> None:
        self.tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here; a retry (or nobody) reads the result

    async def open(self) -> None:
        """Nothing to open (the server's lifecycle step, ``codemode.packs.Lifecycle``)."""

    async def aclose(self) -> None:
        """Cancel the executes still waiting (the server is closing)."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.parked.clear()
