"""Log lines through a real server (issue 19 §2): the MCP SDK's lines with client-chosen ids are
rate-limited per tenant, and uvicorn's own lines go through the same limiter."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from codemode.service.logfilter import RepeatFilter

from .support_service import PACK_SPEC, service, settings, write_token_file

ACCEPT = "application/json, text/event-stream"
SDK_LOGGER = "mcp.server.streamable_http_manager"


@pytest.fixture
def sdk_lines() -> Iterator[list[logging.LogRecord]]:
    """Records of the SDK's session manager that pass a rate limiter of 5 lines per 60 s."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect()
    handler.addFilter(RepeatFilter(window=60, burst=5))
    logger = logging.getLogger(SDK_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
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
