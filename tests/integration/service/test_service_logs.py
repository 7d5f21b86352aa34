"""Log lines through a real server: the MCP SDK's lines with client-chosen ids are
rate-limited per tenant, and uvicorn's own lines go through the same limiter."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from codemode.service.logfilter import RepeatFilter
from tests.support.service import PACK_SPEC, passed_records, service, settings, write_token_file
from tests.support.service_process import service_process

ACCEPT = "application/json, text/event-stream"
SDK_LOGGER = "mcp.server.streamable_http_manager"


@pytest.fixture
def sdk_lines() -> Iterator[list[logging.LogRecord]]:
    """Records of the SDK's session manager that pass a rate limiter of 5 lines per 60 s."""
    logger = logging.getLogger(SDK_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with passed_records(logger, RepeatFilter(window=60, burst=5)) as records:
            yield records
    finally:
        logger.setLevel(level)


async def _bogus_sessions(url: str, token: str, n: int) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        for _ in range(n):
            headers = {
                "Authorization": f"Bearer {token}",
                "Accept": ACCEPT,
                "mcp-session-id": secrets.token_hex(16),
                "MCP-Protocol-Version": "2025-06-18",
            }
            resp = await http.post(
                url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers
            )
            assert resp.status_code == 404


async def test_bogus_session_ids_do_not_make_a_key_each_nor_hide_other_tenants(
    tmp_path: Path, sdk_lines: list[logging.LogRecord]
) -> None:
    """Before: every bogus Mcp-Session-Id made a new key (6,180 of 6,180 lines logged), and the
    keys were global (one tenant's lines of a template hid every other tenant's)."""
    tokens = write_token_file(tmp_path, ["mallory", "alice"])
    async with service(settings(token_file=tokens.path, packs=[PACK_SPEC], mcp_stateless=False)) as srv:
        await _bogus_sessions(srv.mcp_url, tokens["mallory"], 300)
        mallory = len(_rejected(sdk_lines))
        await _bogus_sessions(srv.mcp_url, tokens["alice"], 2)
    assert mallory == 5
    assert len(_rejected(sdk_lines)) == 7  # alice's two lines are not hidden by mallory's flood


def _rejected(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if "unknown or expired session ID" in r.getMessage()]


_NOTE = re.compile(r"\[(\d+) similar message\(s\) suppressed\]")
_SUMMARY = re.compile(
    r"(\d+) similar message\(s\) suppressed: uvicorn.error WARNING 'Invalid HTTP request received.'"
)


async def test_uvicorn_lines_go_through_the_limiter_and_the_servers_log_once_configured(
    tmp_path: Path,
) -> None:
    """Before: starting the metrics server re-ran uvicorn's logging configuration, replacing the
    filtered handlers (200 malformed requests -> 200 lines) and dropping the main server's start
    line and access log."""
    tokens = write_token_file(tmp_path, ["alice"])
    toml = f'token_file = "{tokens.path}"\nallow_all = true\npacks = ["{PACK_SPEC}"]\naudit_log = "none"\n'
    async with service_process(tmp_path, toml, env={"CODEMODE_LOG_LEVEL": "info"}) as srv:
        for _ in range(200):
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            await reader.read()
            writer.close()
            await writer.wait_closed()
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(srv.url + "/healthz")).status_code == 200
            assert (await http.get(srv.health_url + "/healthz")).status_code == 200
    text = srv.stderr()  # after SIGTERM: the shutdown wrote the last window's counts
    assert "Uvicorn running on http://127.0.0.1:" in text, text
    access = [line for line in text.splitlines() if '"GET /healthz HTTP/1.1" 200' in line]
    assert len(access) == 1, text  # the main port's request; the health port writes no access lines
    invalid = [line for line in text.splitlines() if line.endswith("Invalid HTTP request received.")]
    assert 5 <= len(invalid) <= 15, text  # 5 per 10 s window
    # Every suppressed line is counted somewhere: on a later line of its kind, or a summary.
    shown = (
        len(invalid) + sum(int(m) for m in _NOTE.findall(text)) + sum(int(m) for m in _SUMMARY.findall(text))
    )
    assert shown == 200, text
