"""A host with one static subject (the library, ``serve --stdio``) may use every worker slot; a host
whose subjects come from requests (``serve --http``) keeps the per-subject quota and the reserve."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

import codemode
from codemode import authz
from codemode.startup.bootstrap import build_server
from codemode.startup.config import load_settings

SLOTS = 8
ALICE = authz.Subject("alice")
PROGRAM = "def main():\n    return gate.wait()\n"


@dataclass
class Out:
    ok: bool


class Gate:
    """Holds every call until ``n`` calls are waiting at once, then lets them all go."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.waiting = 0
        self.open = asyncio.Event()

    async def wait(self, ctx: codemode.CallContext, subject: authz.Subject) -> Out:
        self.waiting += 1
        if self.waiting >= self.n:
            self.open.set()
        await self.open.wait()
        return Out(True)


def gate_capability(gate: Gate) -> codemode.Capability:
    return codemode.Capability(
        id="gate.wait", name="gate.wait", summary="Wait at the gate.", handler=gate.wait
    )


async def run_all(server: codemode.Server, n: int) -> list[object]:
    async with server:
        return await asyncio.wait_for(
            asyncio.gather(
                *(server.execute(PROGRAM, subject=ALICE) for _ in range(n)), return_exceptions=True
            ),
            60,
        )


@pytest.mark.timeout(120)
async def test_the_library_default_lets_one_subject_use_every_slot() -> None:
    gate = Gate(SLOTS)
    builder = codemode.Builder(authorizer=authz.allow_all(), limits=codemode.Limits(max_execution_time=30))
    results = await run_all(builder.register(gate_capability(gate)).build(), SLOTS)
    assert results == [{"ok": True}] * SLOTS  # all eight held a slot at the same moment


@pytest.mark.timeout(120)
async def test_serve_stdio_lets_its_static_subject_use_every_slot() -> None:
    gate = Gate(SLOTS)
    settings = load_settings(transport="stdio", allow_all=True, max_execution_time=30)
    results = await run_all(build_server(settings, capabilities=[gate_capability(gate)]), SLOTS)
    assert results == [{"ok": True}] * SLOTS


@pytest.mark.timeout(120)
async def test_serve_http_keeps_the_quota_per_subject() -> None:
    gate = Gate(4)
    settings = load_settings(transport="http", allow_all=True, max_execution_time=30)
    results = await run_all(build_server(settings, capabilities=[gate_capability(gate)]), 5)
    refused = [r for r in results if isinstance(r, codemode.ResourceLimit)]
    assert (
        len(refused) == 1
        and codemode.common.errors.client_text(refused[0]) == "resource limit exceeded: quota"
    )
    assert results.count({"ok": True}) == 4
