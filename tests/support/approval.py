"""Shared pieces for the approval tests (no tests here): a policy that asks about deletes, a scripted
elicitation callback for the official MCP client, and the Rego policy the served tests use."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

from codemode import authz

#: A Rego policy: deletes are the user's to decide, everything else is allowed.
ASK_REGO = """package codemode

default decision := true

decision := "ask" if input.capability.name == "records.delete"
"""

ACCEPT = types.ElicitResult(action="accept", content={"approve": True})


class AskDeletes:
    """Asks the user about every ``records.delete`` and ``records.update``; allows the rest."""

    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        if input.capability_name in ("records.delete", "records.update"):
            raise authz.AskUser("changes are the user's to decide")


@dataclass
class User:
    """An elicitation callback: answers with ``answer`` (after ``delay`` seconds, or never while
    ``hold`` is set), and remembers every question."""

    answer: types.ElicitResult | types.ErrorData = field(default_factory=lambda: ACCEPT)
    delay: float = 0.0
    hold: asyncio.Event | None = None
    asked: list[types.ElicitRequestParams] = field(default_factory=list)
    waiting: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> Any:
        self.asked.append(params)
        self.waiting.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.answer

    @property
    def messages(self) -> list[str]:
        return [p.message for p in self.asked]


def create_then_delete(title: str = "Buy milk") -> str:
    return (
        "# PROGRAM_TEXT_MARKER: the user never sees this\n"
        "def main():\n"
        f'    r = records.create(title="{title}")\n'
        '    return records.delete(id=r["id"])\n'
    )
