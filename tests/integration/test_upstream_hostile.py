"""A hostile stdio upstream (``hostile_mcp_server.py``) must not wedge the gateway or speak for it.

Through the real execute path (process runtime) with two tenants on one *shared* upstream (the
worst case: one server for everyone):

* one line of invalid UTF-8 used to stop every later call of every tenant until the server exited
  (the MCP client's reader stops at the first invalid byte and the session was never marked dead);
* the server's error text reached the client verbatim (host paths, a spoofed login link, lines);
* a server that dies is started again on the next call, the host says why, and a tenant cannot
  turn that into a restart loop for everyone (``max_restarts_per_minute``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.capabilities.mcp_upstream import UpstreamMCPPack, upstream_mcp_pack
from codemode.common.errors import client_text

pytestmark = pytest.mark.slow

HOSTILE = Path(__file__).with_name("hostile_mcp_server.py")
ALICE, BOB = authz.Subject("alice"), authz.Subject("bob")


def run(source: str) -> str:
    return "def main():\n" + "".join(f"    {line}\n" for line in source.splitlines())


def hostile(**extra: Any) -> dict[str, Any]:
    return {"name": "hostile", "command": sys.executable, "args": [str(HOSTILE)], "timeout": 5.0, **extra}


@pytest.fixture
async def shared() -> AsyncIterator[tuple[UpstreamMCPPack, codemode.Server]]:
    pack = upstream_mcp_pack([hostile(tenancy="shared")])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        yield pack, server
    finally:
        await pack.aclose()
        await server.aclose()


async def test_invalid_utf8_from_the_upstream_wedges_no_one(
    shared: tuple[UpstreamMCPPack, codemode.Server], caplog: pytest.LogCaptureFixture
) -> None:
    pack, server = shared
    garbled = await server.execute(run('return hostile.garble(text="x")'), subject=ALICE)
    assert garbled == {"text": "x\ufffd"}  # the invalid byte replaced, the answer delivered
    echoes = [await server.execute(run(f'return hostile.echo(text="{i}")'), subject=BOB) for i in range(5)]
    assert echoes == [{"text": str(i)} for i in range(5)]
    assert pack.pools["hostile"].starts == 1  # nothing had to be restarted
    assert "timed out" not in caplog.text


async def test_upstream_error_text_is_marked_one_line_without_urls_or_paths(
    shared: tuple[UpstreamMCPPack, codemode.Server],
) -> None:
    _, server = shared
    with pytest.raises(codemode.CapabilityFailure) as info:
        await server.execute(run("return hostile.leak()"), subject=ALICE)
    text = client_text(info.value)
    assert text == (
        'capability failed: hostile: Traceback (most recent call last): File "[path]", line 12 Access '
        "denied - path outside allowed directories: [path] not in [path], [path]. Session expired: re..."
    )
    for leak in ("/etc", "site-packages", "tzdata", "alice", "http", "evil", "Users", "\n"):
        assert leak not in text


async def test_a_dead_upstream_is_started_again_and_the_host_says_why(
    shared: tuple[UpstreamMCPPack, codemode.Server], caplog: pytest.LogCaptureFixture
) -> None:
    pack, server = shared
    first = await server.execute(run("return hostile.pid()"), subject=BOB)
    with caplog.at_level(logging.WARNING, logger="codemode.capabilities.mcp_upstream"):
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(run("return hostile.crash()"), subject=ALICE)
        assert client_text(info.value) == "capability failed"
        again = await server.execute(run("return hostile.pid()"), subject=BOB)
    assert again != first and pack.pools["hostile"].starts == 2
    assert "the server ended the connection" in caplog.text


async def test_restarts_are_bounded_so_no_tenant_holds_a_restart_button(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``max_restarts_per_minute = 2``, a tenant that crashes the shared server over and over
    gets it started twice more; then calls fail plainly (for everyone, at once, without another
    start) until the minute has passed, and the host log says so."""
    pack = upstream_mcp_pack([hostile(tenancy="shared", max_restarts_per_minute=2)])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        for _ in range(3):
            with pytest.raises(codemode.CapabilityFailure):
                await server.execute(run("return hostile.crash()"), subject=ALICE)
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(run('return hostile.echo(text="hi")'), subject=BOB)
        assert client_text(info.value) == "capability failed"
        assert pack.pools["hostile"].starts == 3  # the first start and two restarts
        assert "not started again: 3 starts in the last minute" in caplog.text
    finally:
        await pack.aclose()
        await server.aclose()


async def test_per_subject_sessions_keep_one_tenants_crash_to_itself() -> None:
    """Under the default tenancy each tenant has its own server: alice crashing hers leaves bob's
    process (and its pid) as it was."""
    pack = upstream_mcp_pack([hostile()])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        bob_pid = await server.execute(run("return hostile.pid()"), subject=BOB)
        alice_pid = await server.execute(run("return hostile.pid()"), subject=ALICE)
        assert alice_pid != bob_pid
        with pytest.raises(codemode.CapabilityFailure):
            await server.execute(run("return hostile.crash()"), subject=ALICE)
        assert await server.execute(run("return hostile.pid()"), subject=BOB) == bob_pid
    finally:
        await pack.aclose()
        await server.aclose()
