"""Asking the user through the MCP client: a form-mode elicitation request on the ``tools/call``'s own
channel (docs/reference/authorization.md#asking-the-user).

The pinned SDK can send a server request only on a connection with a back-channel: stdio and
stateful streamable HTTP, on the initialize-handshake protocol versions (up to 2025-11-25). A
stateless HTTP request, and any request of the 2026-07-28 per-request protocol (whose elicitation
would be an ``InputRequiredResult`` the client retries), has none: the answer is then
``unavailable``, without sending anything. So is a client that did not declare the elicitation
capability (form mode).

Only an explicit accept approves: ``action == "accept"`` with exactly ``{"approve": true}`` as the
content. A decline, a cancel, an accept with anything else, an error response or a malformed result
refuse the call. The SDK matches the answer to the request by its JSON-RPC id on this connection, so
an answer to another request, or a second answer, reaches nothing here.
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

__all__ = ["APPROVAL_SCHEMA", "ElicitingApprover"]

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


def _can_elicit(session: Any) -> bool:
    """The client declared form-mode elicitation (an empty ``elicitation`` object means form)."""
    capabilities = session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    if elicitation is None:
        return False
    return elicitation.form is not None or elicitation.url is None


class ElicitingApprover:
    """The :class:`~codemode.execution.approval.Approver` of one ``tools/call`` request."""

    def __init__(self, context: Any) -> None:
        self.context = context

    async def approve(self, request: ApprovalRequest) -> ApprovalAnswer:
        """Ask and read the answer (the execute pipeline bounds the wait)."""
        session = getattr(self.context, "session", None)
        if session is None or not session.can_send_request or not _can_elicit(session):
            return "unavailable"
        ask = types.ElicitRequest(
            params=types.ElicitRequestFormParams(message=request.message, requested_schema=APPROVAL_SCHEMA)
        )
        try:
            result = await session.send_request(
                ask,
                types.ElicitResult,
                metadata=ServerMessageMetadata(related_request_id=self.context.request_id),
            )
        except MCPError as exc:
            log.info("the client refused the approval request: %s", exc.error.code)
            return "unavailable"
        except ValidationError:
            log.info("the client's answer to an approval request is malformed")
            return "unavailable"
        if result.action == "accept":
            content = result.content or {}
            approve = content.get("approve")
            return "accept" if approve is True and set(content) == {"approve"} else "decline"
        return "decline" if result.action == "decline" else "cancel"
