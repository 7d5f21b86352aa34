"""Progress while an execute runs (docs/reference/tools.md#progress): the official MCP
client's progress callback over stdio, stateful and stateless HTTP (real uvicorn) and in memory.

Every notification is checked against the execute's own result: print text joins up to the result's
``prints``, each call message names a capability of the ledger with a count and a ledger word, the
last one is the ledger's last entry; ``progress`` rises; nothing else is said."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

import codemode
from codemode import authz
from codemode.common.outcomes import LEDGER_OUTCOMES
from codemode.execution.progress import PRINT_PREFIX, PROGRESS_INTERVAL
from tests.support.mcp_client import (
    RECORDS_PACK,
    EchoIn,
    EchoOut,
    build,
    child_env,
    cli_command,
    echo_capability,
    execute_report,
    mcp_for,
)
from tests.support.service import PACK_SPEC, mcp_client, service, settings, write_token_file

pytestmark = pytest.mark.slow

PRINTS = 4096
PROGRAM = """
def main():
    for i in range(3):
        print("step %d" % i)
        records.create(title="t%d" % i)
    return records.get(id=1)["title"]
"""
_CALL = re.compile(
    r"(?P<name>[a-z_][a-z0-9_.]*) (?P<kind>started|finished) \((?P<n>\d+)\)(?:: (?P<word>[a-z ]+))?"
)


@dataclass
class Notes:
    """What one call's progress callback received."""

    seen: list[tuple[float, float | None, str | None]] = field(default_factory=list)

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.seen.append((progress, total, message))

    @property
    def messages(self) -> list[str]:
        return [m or "" for _, _, m in self.seen]


def check(notes: Notes, result: types.CallToolResult) -> None:
    """The notifications say nothing the result does not: see the module docstring."""
    report = execute_report(result)
    ledger = report["calls"]
    assert notes.seen, "no progress notification"
    values = [p for p, _, _ in notes.seen]
    assert values == sorted(set(values)), f"progress must rise: {values}"
    assert all(total is None for _, total, _ in notes.seen)
    printed = "".join(m.removeprefix(PRINT_PREFIX) for m in notes.messages if m.startswith(PRINT_PREFIX))
    assert printed == report.get("prints", ""), (printed, report)
    calls = [m for m in notes.messages if not m.startswith(PRINT_PREFIX)]
    names = {c["capability"] for c in ledger}
    for message in calls:
        match = _CALL.fullmatch(message)
        assert match is not None, message
        assert match["name"] in names and 1 <= int(match["n"]) <= len(ledger), message
        assert (match["word"] is None) == (match["kind"] == "started"), message
        if match["word"] is not None:
            assert match["word"] in LEDGER_OUTCOMES and match["word"] in {c["outcome"] for c in ledger}
    if ledger:  # the final state always arrives, before the result
        last = ledger[-1]
        assert calls[-1] == f"{last['capability']} finished ({len(ledger)}): {last['outcome']}", calls


# --------------------------------------------------------------------------------------------------
# stdio
# --------------------------------------------------------------------------------------------------


def stdio(*flags: str) -> StdioServerParameters:
    argv = cli_command(
        "serve", "--stdio", "--allow-all", "--pack", RECORDS_PACK, "--max-print-bytes", str(PRINTS), *flags
    )
    return StdioServerParameters(command=argv[0], args=argv[1:], env=child_env())


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_progress_over_stdio(mode: str) -> None:
    everything: list[Any] = []

    async def tap(message: Any) -> None:
        if isinstance(message, types.ProgressNotification):
            everything.append(message)

    async with Client(stdio(), mode=mode, message_handler=tap) as client:
        # No progressToken: not one notification (the tap sees every progress notification).
        quiet = await client.call_tool("execute", {"source": PROGRAM})
        assert execute_report(quiet)["result"] == "t0"
        notes = Notes()
        result = await client.call_tool("execute", {"source": PROGRAM}, progress_callback=notes)
    assert execute_report(result)["prints"] == "step 0\nstep 1\nstep 2\n"
    check(notes, result)
    if mode == "legacy":  # the modern in-process tap is not fed; the legacy one sees them all
        assert len(everything) == len(notes.seen)


# --------------------------------------------------------------------------------------------------
# HTTP: stateful and stateless (event-stream responses) carry them; JSON responses cannot
# --------------------------------------------------------------------------------------------------

HTTP_MODES = [
    pytest.param(False, False, "legacy", id="stateful"),
    pytest.param(True, False, "legacy", id="stateless-sse"),
    pytest.param(True, False, "auto", id="stateless-2026-07-28"),
    pytest.param(False, True, "legacy", id="stateful-json-response"),
    pytest.param(True, True, "auto", id="stateless-2026-07-28-json-response"),
]


@pytest.mark.parametrize(("stateless", "json_response", "mode"), HTTP_MODES)
async def test_progress_over_http(tmp_path: Path, stateless: bool, json_response: bool, mode: str) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    cfg = settings(
        token_file=tokens.path,
        packs=["codemode_capabilities.records:pack"],
        mcp_stateless=stateless,
        mcp_json_response=json_response,
        max_print_bytes=PRINTS,
    )
    async with service(cfg) as srv, mcp_client(srv.mcp_url, tokens["alice"], mode) as client:
        notes = Notes()
        result = await client.call_tool("execute", {"source": PROGRAM}, progress_callback=notes)
    assert execute_report(result)["result"] == "t0"
    if json_response:
        assert notes.seen == []  # one JSON body answers the POST: nothing can go before it
    else:
        check(notes, result)


async def test_progress_goes_to_the_requesting_stream_only(tmp_path: Path) -> None:
    """Two tenants on one stateful server, each with two executes at once: every notification
    reaches the call that asked for it, nobody else's (nor a sibling call of the same session)."""
    tokens = write_token_file(tmp_path, ["alice", "mallory"])
    cfg = settings(token_file=tokens.path, packs=[PACK_SPEC], mcp_stateless=False, max_print_bytes=PRINTS)
    program = (
        'def main():\n    print("{who}")\n    svc.slow(seconds=0.4)\n    print("{who}")\n    return "{who}"\n'
    )
    async with (
        service(cfg) as srv,
        mcp_client(srv.mcp_url, tokens["alice"], "legacy") as alice,
        mcp_client(srv.mcp_url, tokens["mallory"], "legacy") as mallory,
    ):
        runs = [(alice, "alice-1"), (alice, "alice-2"), (mallory, "mallory-1"), (mallory, "mallory-2")]
        notes = [Notes() for _ in runs]
        results = await asyncio.gather(
            *(
                client.call_tool("execute", {"source": program.format(who=who)}, progress_callback=n)
                for (client, who), n in zip(runs, notes, strict=True)
            )
        )
    for (_, who), n, result in zip(runs, notes, results, strict=True):
        assert execute_report(result)["prints"] == f"{who}\n{who}\n"
        check(n, result)
        others = [w for _, w in runs if w != who]
        assert not any(other in m for m in n.messages for other in others), (who, n.messages)


# --------------------------------------------------------------------------------------------------
# The rate bound and what a refused or failed call's notification says (in memory, JSON-RPC)
# --------------------------------------------------------------------------------------------------


async def test_a_many_call_program_sends_a_bounded_number_of_notifications() -> None:
    calls = 1000
    limits = codemode.Limits(max_native_calls=calls, max_print_bytes=PRINTS, max_execution_time=300)
    server = build([echo_capability()], limits=limits)
    loop = f'    for i in range({calls}):\n        demo.echo(text="x")\n'
    program = "def main():\n" + loop + '    print("end")\n    return 1\n'
    try:
        async with Client(mcp_for(server), mode="legacy") as client:
            notes = Notes()
            began = time.monotonic()
            result = await client.call_tool("execute", {"source": program}, progress_callback=notes)
            elapsed = time.monotonic() - began
    finally:
        await server.aclose()
    check(notes, result)
    assert execute_report(result).get("result") == 1, execute_report(result).get("error")
    assert len(execute_report(result)["calls"]) == calls
    # One notification per interval at most, plus the first and the final two (prints, last call):
    # however slow the machine, never one per call.
    bound = elapsed / PROGRESS_INTERVAL + 3
    print(f"\n{calls} calls in {elapsed:.2f} s: {len(notes.seen)} notifications (bound {bound:.0f})")
    assert len(notes.seen) <= bound and len(notes.seen) < calls / 10


SECRET = "SECRET-7f3a"


class Refuses:
    """Denies records.delete with a reason the client must never see; allows the rest."""

    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        if input.capability_name == "records.delete":
            raise authz.Denied(f"policy text {SECRET}")


def _explode(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    raise RuntimeError(f"handler detail {SECRET} /srv/app/handler.py")


async def test_a_refused_or_failed_calls_notification_says_what_its_error_says() -> None:
    server = build([echo_capability("demo.boom", handler=_explode)], authorizer=Refuses())
    program = f"""
def main():
    a = attempt(records.delete, id=1)
    b = attempt(demo.boom, text="{SECRET[:3]}")
    records.create(title="ok")
    return [a["error"], b["error"]]
"""
    try:
        async with Client(mcp_for(server), mode="legacy") as client:
            notes = Notes()
            result = await client.call_tool("execute", {"source": program}, progress_callback=notes)
            denied = Notes()
            ended = await client.call_tool(
                "execute",
                {"source": "def main():\n    return records.delete(id=1)\n"},
                progress_callback=denied,
            )
    finally:
        await server.aclose()
    assert execute_report(result)["result"] == ["permission denied", "capability failed"]
    check(notes, result)
    check(denied, ended)
    assert denied.messages[-1] == "records.delete finished (1): denied"
    for message in notes.messages + denied.messages:
        assert SECRET not in message and "/srv" not in message and "policy" not in message, message


async def test_a_call_is_reported_started_while_its_handler_runs() -> None:
    """The handler waits for the client to have seen its call start (an event, not a sleep)."""
    seen = asyncio.Event()

    async def wait(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
        try:
            await asyncio.wait_for(seen.wait(), 60)
        except TimeoutError:
            return EchoOut("never saw it start")
        return EchoOut("seen")

    class Watch(Notes):
        async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
            await super().__call__(progress, total, message)
            if message == "demo.wait started (2)":
                seen.set()

    server = build([echo_capability("demo.wait", handler=wait)])
    program = 'def main():\n    records.create(title="a")\n    return demo.wait(text="x")["text"]\n'
    try:
        async with Client(mcp_for(server), mode="legacy") as client:
            notes = Watch()
            result = await client.call_tool("execute", {"source": program}, progress_callback=notes)
    finally:
        await server.aclose()
    assert execute_report(result)["result"] == "seen"
    check(notes, result)
