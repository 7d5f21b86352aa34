"""Approval asked of the user: what the host shows them and how an answer is read
(docs/reference/authorization.md#asking-the-user).

When the policy answers "ask" for a call (``authz.AskUser``), the execute pipeline builds an
:class:`ApprovalRequest` and hands it to the execute's :class:`Approver` (the MCP front end asks
through the client). The request holds only what the host itself wrote: the capability's dotted
name and summary from the catalog, and the bound arguments as the host renders them
(codemode.execution.approval_text: one per line, look-alikes of its syntax escaped, bounded, every
cut stated). Never the program's text. The values still come from the program, so the message says
so; and when part of the call is not shown, its first line says how much.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from .approval_text import MAX_ARGUMENTS_TEXT, render_arguments
from .observe import ApprovalAnswer

__all__ = [
    "MAX_ARGUMENTS_TEXT",
    "MAX_MESSAGE_BYTES",
    "MAX_SUMMARY_TEXT",
    "ApprovalRequest",
    "Approver",
    "render_arguments",
]

#: UTF-8 bytes of the capability's summary in the message (``…`` marks a cut; the catalog's text).
MAX_SUMMARY_TEXT = 300
#: UTF-8 bytes of the capability's name in the message.
_MAX_NAME_TEXT = 200
#: UTF-8 bytes of the whole message shown to the user (the arguments, the summary and the name each
#: have their own bound; these add up to less).
MAX_MESSAGE_BYTES = 5000
_CUT = "…"


def _cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes, cut on a character boundary with ``…``."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    room = limit - len(_CUT.encode("utf-8"))
    return data[:room].decode("utf-8", errors="ignore") + _CUT


def _printable(text: str) -> str:
    """Control characters and line breaks become spaces: the host's own text stays on its line."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


@dataclass(frozen=True)
class ApprovalRequest:
    """One question for the user: ``capability`` (the dotted name), ``summary`` (the catalog's),
    ``arguments`` (the host's rendering of the bound arguments, one ``key: value`` line each:
    :func:`render_arguments`) and ``hidden`` (UTF-8 bytes of that rendering not shown; 0 when the
    call is shown whole)."""

    capability: str
    summary: str
    arguments: str
    hidden: int = 0

    @property
    def message(self) -> str:
        """The text the user reads (at most :data:`MAX_MESSAGE_BYTES` UTF-8 bytes). Its first line
        says so when part of the call is not shown."""
        warning = (
            f"This call is too long to show whole: {self.hidden:,} bytes of its arguments are not shown "
            f"(each cut is marked {_CUT} below).\n"
            if self.hidden
            else ""
        )
        head = "A program running for you wants to call a capability that needs your approval.\n"
        call = f"Capability: {_cut(_printable(self.capability), _MAX_NAME_TEXT)}\n"
        what = f"What it does: {_cut(_printable(self.summary), MAX_SUMMARY_TEXT)}\n"
        if self.arguments:
            args = f"Arguments (values written by the program, one per line, as JSON):\n{self.arguments}\n"
        else:
            args = "Arguments: none\n"
        return warning + head + call + what + args + "Approve this one call?"


class Approver(Protocol):
    """Asks the user one :class:`ApprovalRequest`; the answer word. Only ``"accept"`` runs the call.

    The pipeline bounds the wait (``max_approval_time``) and treats an exception as
    ``"unavailable"``; an approver should answer ``"unavailable"`` itself when its client cannot be
    asked.
    """

    def approve(self, request: ApprovalRequest) -> Awaitable[ApprovalAnswer]:
        """Ask the user about one call (async).

        Args:
            request: the capability, its catalog summary, the bound arguments and the message to show.

        Returns:
            The answer word: ``"accept"`` runs the call; anything else declines it.
        """
        ...
