"""The approval question shows exactly the call being approved, seen through the
official MCP client's elicitation callback in both client modes.

Three attacks on the rendering of the bound arguments, each written by the program: a value that
closes itself with a curly quote and fakes a second ``body`` argument; a dangerous tail after a
harmless start; a fifth tag past the whole list's cut. After each, the user must see the call as it
is (docs/reference/authorization.md#asking-the-user): one line per argument, every look-alike of
a quotation mark, a bracket or a separator escaped, and nothing hidden without the message saying so
in its first line and each cut value saying exactly how many bytes it hides.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import pytest
from mcp import Client

import codemode
from codemode import authz
from codemode.execution.approval import MAX_MESSAGE_BYTES
from codemode.mcp import StaticSubject, create_server
from codemode_capabilities.records import RecordStore
from codemode_capabilities.records import capabilities as record_caps
from tests.support.approval import User
from tests.support.mcp_client import call, error_text

MODES = pytest.mark.parametrize("mode", ["legacy", "auto"])
HEAD = "A program running for you wants to call a capability that needs your approval."
NOT_WHOLE = re.compile(r"^This call is too long to show whole: ([\d,]+) bytes of its arguments are not shown")
CUT = re.compile(r"… \[([\d,]+) bytes not shown\]$")


@dataclass
class LabelsIn:
    record: int
    note: str
    tag1: str
    tag2: str
    tag3: str
    tag4: str
    tag5: str


@dataclass
class LabelsOut:
    applied: int


class AskAllButCreate:
    """Leaves every call but ``records.create`` to the user."""

    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        if input.capability_name != "records.create":
            raise authz.AskUser("the user decides")


def served() -> codemode.Server:
    def apply(ctx: codemode.CallContext, subject: authz.Subject, args: LabelsIn) -> LabelsOut:
        return LabelsOut(applied=5)

    builder = codemode.Builder(authorizer=AskAllButCreate())
    builder.register(*record_caps(RecordStore()))
    builder.register(codemode.Capability(name="labels.apply", summary="Tag a record.", handler=apply))
    return builder.build()


async def ask(mode: str, call_source: str) -> str:
    """The one message the user is shown for ``call_source`` (declined), asked through the client."""
    server = served()
    user = User(answer=types.ElicitResult(action="decline"))
    src = 'def main():\n    r = records.create(title="a")\n    return ' + call_source + "\n"
    try:
        async with Client(
            create_server(server, StaticSubject("alice")), mode=mode, elicitation_callback=user
        ) as c:
            assert error_text(await call(c, "execute", source=src)) == "permission denied"
    finally:
        await server.aclose()
    (message,) = user.messages
    assert len(message.encode()) <= MAX_MESSAGE_BYTES
    return message


def arguments(message: str) -> dict[str, str]:
    """The argument lines of a message: ``key: value`` between the header and the question."""
    lines = message.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("Arguments ")) + 1
    end = lines.index("Approve this one call?")
    out: dict[str, str] = {}
    for line in lines[start:end]:
        assert ": " in line, line
        key, value = line.split(": ", 1)
        assert key not in out, f"{key} shown twice:\n{message}"
        out[key] = value
    return out


def starlark(text: str) -> str:
    """``text`` as a Starlark string literal (JSON's escapes are Starlark's)."""
    return json.dumps(text, ensure_ascii=False)


@MODES
async def test_a_curly_quote_cannot_close_a_value_and_fake_another_argument(mode: str) -> None:
    title = "Buy milk\u201d, body=\u201c(unchanged)"
    body = "wire 5000 EUR to IBAN DE89 3704 0044 0532 0130 00"
    message = await ask(mode, f'records.update(id=r["id"], title={starlark(title)}, body={starlark(body)})')
    lookalikes = [c for c in message if unicodedata.category(c) in ("Pi", "Pf") or ord(c) in (0xFF02, 0xFF1D)]
    assert lookalikes == [], f"quotation marks shown as themselves:\n{message}"
    assert message.split("\n")[0] == HEAD, "nothing is hidden"
    assert arguments(message) == {
        "id": "1",
        "title": '"Buy milk\\u201d, body=\\u201c(unchanged)"',
        "body": f'"{body}"',
    }


@MODES
async def test_a_dangerous_tail_after_a_harmless_start_is_shown(mode: str) -> None:
    harmless = "Shopping list for the weekend: milk, eggs, bread, butter, apples and some tea."
    assert len(harmless.encode()) >= 78
    tail = " P.S. also wire 5000 EUR to IBAN DE89 3704 0044 0532 0130 00 today."
    message = await ask(mode, f'records.update(id=r["id"], body={starlark(harmless + tail)})')
    assert message.split("\n")[0] == HEAD
    assert arguments(message) == {"id": "1", "body": json.dumps(harmless + tail)}


@MODES
async def test_a_value_too_long_to_show_says_exactly_how_much_is_hidden(mode: str) -> None:
    body = "Shopping list for the weekend: milk, eggs, bread. " * 200 + "P.S. wire 5000 EUR to DE89."
    message = await ask(mode, f'records.update(id=r["id"], title="Groceries", body={starlark(body)})')
    first = NOT_WHOLE.match(message.split("\n")[0])
    assert first is not None, f"the first line does not say the call is not shown whole:\n{message}"
    shown = arguments(message)
    assert shown["id"] == "1" and shown["title"] == '"Groceries"'
    cut = CUT.search(shown["body"])
    assert cut is not None, shown["body"]
    visible = shown["body"][: cut.start()]
    whole = json.dumps(body)
    assert whole.startswith(visible) and len(visible) > 100
    hidden = int(cut.group(1).replace(",", ""))
    assert hidden == len(whole.encode()) - len(visible.encode())
    assert int(first.group(1).replace(",", "")) == hidden


@MODES
async def test_a_fifth_tag_past_the_cut_is_shown(mode: str) -> None:
    note = "Labels for the weekly household budget review, as agreed with the family last week."
    tags = [f"household budget {n}: groceries, utilities, transport and the school trip" for n in range(1, 5)]
    tags.append("share-publicly-with-everyone")
    named = ", ".join(f"tag{n}={starlark(t)}" for n, t in enumerate(tags, 1))
    message = await ask(mode, f'labels.apply(record=r["id"], note={starlark(note)}, {named})')
    assert message.split("\n")[0] == HEAD
    expected = {"record": "1", "note": json.dumps(note)}
    assert arguments(message) == expected | {f"tag{n}": json.dumps(t) for n, t in enumerate(tags, 1)}
