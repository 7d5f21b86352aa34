"""Approval asked of the user: what the host shows them and how an answer is read
(docs/reference/authorization.md#asking-the-user).

When the policy answers "ask" for a call (``authz.AskUser``), the execute pipeline builds an
:class:`ApprovalRequest` and hands it to the execute's :class:`Approver` (the MCP front end asks
through the client). The request holds only what the host itself wrote: the capability's dotted
name and summary from the catalog, and a short description of the bound arguments rendered by the
host (:func:`describe_arguments`: keys in the capability's order, each value as compact JSON cut to
a bound, the whole cut to :data:`MAX_ARGUMENTS_TEXT` bytes). Never the program's text. The values
still come from the program, so the message says so.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from .observe import ApprovalAnswer

__all__ = [
    "MAX_ARGUMENTS_TEXT",
    "MAX_MESSAGE_BYTES",
    "MAX_VALUE_TEXT",
    "ApprovalRequest",
    "Approver",
    "describe_arguments",
]

#: UTF-8 bytes of one argument value's text before it is cut (``…`` marks a cut).
MAX_VALUE_TEXT = 80
#: UTF-8 bytes of the whole argument description.
MAX_ARGUMENTS_TEXT = 400
#: UTF-8 bytes of the message shown to the user (the summary is cut to fit).
MAX_MESSAGE_BYTES = 1000
_CUT = "…"


def _cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes, cut on a character boundary with ``…``."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    room = limit - len(_CUT.encode("utf-8"))
    return data[:room].decode("utf-8", errors="ignore") + _CUT


def _printable(text: str) -> str:
    """Control characters and line breaks become spaces: one line per argument, nothing hidden."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def describe_arguments(arguments: dict[str, Any]) -> str:
    """``id=7, title="Buy milk"``: the bound arguments as the host renders them (bounded).

    Args:
        arguments: the bound canonical arguments.

    Returns:
        ``key=<compact JSON>`` pairs, each value cut to :data:`MAX_VALUE_TEXT` bytes and the
        whole to :data:`MAX_ARGUMENTS_TEXT` (``(none)`` without arguments).
    """
    parts = []
    for key, value in arguments.items():
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        parts.append(f"{key}={_cut(_printable(text), MAX_VALUE_TEXT)}")
    return _cut(", ".join(parts), MAX_ARGUMENTS_TEXT) if parts else "(none)"


@dataclass(frozen=True)
class ApprovalRequest:
    """One question for the user: ``capability`` (the dotted name), ``summary`` (the catalog's) and
    ``arguments`` (the host's bounded JSON rendering of the bound arguments)."""

    capability: str
    summary: str
    arguments: str

    @property
    def message(self) -> str:
        """The text the user reads (at most :data:`MAX_MESSAGE_BYTES` UTF-8 bytes)."""
        head = "A program running for you wants to call a capability that needs your approval.\n"
        call = f"Capability: {self.capability}\n"
        args = f"Arguments (values written by the program): {self.arguments}\n"
        tail = "Approve this one call?"
        room = MAX_MESSAGE_BYTES - len((head + call + args + tail).encode("utf-8")) - len("What it does: \n")
        what = f"What it does: {_cut(_printable(self.summary), max(room, 0))}\n" if room > 8 else ""
        return head + call + what + args + tail


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
