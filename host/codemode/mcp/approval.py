"""Asking the user through the MCP client (docs/reference/authorization.md#asking-the-user).

On the initialize-handshake protocols (up to 2025-11-25) the question is a form-mode elicitation
request on the ``tools/call``'s own channel (:class:`ElicitingApprover`). The pinned SDK can send one
only on a connection with a back-channel: stdio and stateful streamable HTTP; a stateless HTTP
request has none, and the answer is then ``unavailable``, without sending anything. On the
2026-07-28 per-request protocol there are no server requests: the same elicitation goes back as an
``InputRequiredResult`` and the answer comes with the client's retry (:class:`RetryApprover`,
driven by codemode.mcp.retries). Either way a client that did not declare the elicitation
capability (form mode) is not asked.

Only an explicit accept approves: ``action == "accept"`` with exactly ``{"approve": true}`` as the
content. A decline, a cancel, an accept with anything else, an error response or a malformed result
refuse the call. The SDK matches a direct answer to its request by JSON-RPC id on this connection,
so an answer to another request, or a second answer, reaches nothing here.
"""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import ValidationError

from ..execution.approval import ApprovalRequest
from ..execution.observe import ApprovalAnswer

__all__ = [
    "APPROVAL_SCHEMA",
    "INPUT_KEY",
    "ElicitingApprover",
    "RetryApprover",
    "can_elicit",
    "elicitation",
    "read_answer",
]

log = logging.getLogger("codemode.mcp")

#: The form the user fills in: one boolean, required.
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Approve this call",
            "description": "true runs this one call; false or no answer refuses it",
        }
    },
    "required": ["approve"],
}


def can_elicit(session: Any) -> bool:
    """The client declared form-mode elicitation (an empty ``elicitation`` object means form).

    Args:
        session: the MCP server session.

    Returns:
        Whether the user can be asked through it.
    """
    capabilities = session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    if elicitation is None:
        return False
    return elicitation.form is not None or elicitation.url is None


class ElicitingApprover:
    """The :class:`~codemode.execution.approval.Approver` of one ``tools/call`` request.

    Args:
        context: the SDK's request context (its session and request id).
    """

    def __init__(self, context: Any) -> None:
        self.context = context

    @property
    def available(self) -> bool:
        """Whether the client can be asked at all (a back-channel and form elicitation): if not,
        the pipeline declines at once, without suspending the execute."""
        session = getattr(self.context, "session", None)
        return session is not None and bool(session.can_send_request) and can_elicit(session)

    async def approve(self, request: ApprovalRequest) -> ApprovalAnswer:
        """Ask and read the answer (the execute pipeline bounds the wait).

        Args:
            request: the question.

        Returns:
            ``accept``, ``decline`` or ``cancel``; ``unavailable`` when the client cannot be asked,
            refuses, or answers malformed.
        """
        session = getattr(self.context, "session", None)
        if session is None or not session.can_send_request or not can_elicit(session):
            return "unavailable"
        try:
            result = await session.send_request(
                elicitation(request),
                types.ElicitResult,
                metadata=ServerMessageMetadata(related_request_id=self.context.request_id),
            )
        except MCPError as exc:
            log.info("the client refused the approval request: %s", exc.error.code)
            return "unavailable"
        except ValidationError:
            log.info("the client's answer to an approval request is malformed")
            return "unavailable"
        return read_answer(result)


# --------------------------------------------------------------------------------------------------
# 2026-07-28: the question as an InputRequiredResult, the answer on the client's retry
# --------------------------------------------------------------------------------------------------

#: The key of the one input request an approval question is (``input_requests`` / ``input_responses``).
INPUT_KEY = "approve"


def read_answer(response: Any) -> ApprovalAnswer:
    """The answer word of an elicitation result (a retry's ``input_responses`` entry), read as
    :meth:`ElicitingApprover.approve` reads a direct one.

    Args:
        response: the elicitation result.

    Returns:
        ``accept`` only for an accepted form that is exactly ``{approve: true}``; ``decline``,
        ``cancel``, or ``unavailable`` for anything that is not an elicitation result.
    """
    if not isinstance(response, types.ElicitResult):
        return "unavailable"
    if response.action == "accept":
        content = response.content or {}
        return "accept" if content.get("approve") is True and set(content) == {"approve"} else "decline"
    return "decline" if response.action == "decline" else "cancel"


def elicitation(request: ApprovalRequest) -> types.ElicitRequest:
    """The form-mode elicitation that asks ``request``.

    Args:
        request: the question.

    Returns:
        The elicitation: the question's message and :data:`APPROVAL_SCHEMA`.
    """
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=request.message, requested_schema=APPROVAL_SCHEMA)
    )


class RetryApprover:
    """The approver of one execute on a 2026-07-28 connection: it ``defers``, so a question
    suspends the execute and reaches the request handler as a
    :class:`~codemode.execution.suspension.Suspended` (codemode.mcp.retries answers the
    ``tools/call`` with an ``InputRequiredResult``); the answer comes with a retry, which resumes
    the execute by replay.

    Args:
        can_elicit: whether the client declared form-mode elicitation.
    """

    #: Answers come later, in another request (codemode.execution.suspension.defers).
    defers = True

    def __init__(self, can_elicit: bool) -> None:
        self.can_elicit = can_elicit

    async def approve(self, request: ApprovalRequest) -> ApprovalAnswer:
        """Never asked in place (the execute suspends instead); a declining answer if it is.

        Args:
            request: the question.

        Returns:
            ``unavailable``.
        """
        return "unavailable"
