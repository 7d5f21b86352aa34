"""Hostile review of the credential redaction: paths to the client that did not pass
through it, and attacks on the OpenAPI and upstream MCP paths end to end.

Real parts: a stdio MCP server of the official SDK behind the upstream MCP pack, a FastAPI service
under uvicorn behind the OpenAPI pack, programs through ``Server.execute`` (process runtime).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode_capabilities.mcp.upstream import upstream_mcp_pack
from codemode_capabilities.openapi import openapi_pack
from tests.support.servers import credential_in_tool_list
from tests.support.upstreams import uvicorn_in_thread

pytestmark = pytest.mark.slow

SUBJECT = authz.Subject(id="mallory")
KEY_ENV = "ORACLE_REVIEW_CREDENTIAL"
KEY = "rk_live_Q7vXw2LpZ9sTn4Hb"


@contextlib.asynccontextmanager
async def mcp_server(script: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[codemode.Server]:
    """A server (allow-all) over the upstream MCP pack of ``script``, started with ``API_KEY`` =
    :data:`KEY` (``env_from_host``)."""
    monkeypatch.setenv(KEY_ENV, KEY)
    pack = upstream_mcp_pack(
        [
            {
                "name": "up",
                "command": sys.executable,
                "args": [script],
                "env_from_host": {"API_KEY": KEY_ENV},
                "tenancy": "shared",
                "max_calls_per_minute": 0,
                "timeout": 10.0,
            }
        ]
    )
    capabilities = await pack.acapabilities()
    server = codemode.Builder(authorizer=authz.allow_all()).register(*capabilities).build()
    try:
        yield server
    finally:
        await pack.aclose()
        await server.aclose()


async def test_an_upstream_tool_list_carrying_its_credential_shows_none_of_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server whose tool description and title (``lookup``), and an input enum (``pick``), quote
    the ``env_from_host`` key it was started with: ``search_api`` and ``describe_api`` (what every
    client reads) show none of it; ``lookup`` is described with ``[redacted]`` and still works,
    ``pick`` is skipped (a signature with a redacted enum value would lie), and the host warns once
    naming the upstream. Failed before: the tool list was compiled as the
    server sent it, so the search answer's signature (``mode: "fast" | "rk_live_..."``), the
    description showed the whole key to every client, and its title's words answered searches."""
    with caplog.at_level(logging.WARNING):
        async with mcp_server(credential_in_tool_list.__file__, monkeypatch) as server:
            found = json.dumps(server.search("record").to_dict())
            described = json.dumps(server.describe("up.lookup").to_dict())
            by_key = [server.search(q).to_dict()["results"] for q in (KEY, KEY[8:], "rk live")]
            names = [c.name for c in server.capabilities]
            called = await server.execute('def main():\n    return up.lookup(mode="fast")\n', subject=SUBJECT)
    assert names == ["up.lookup"] and called == {"text": "fast"}, (names, called)
    for shown in (found, described):
        assert KEY not in shown and KEY[8:] not in shown, shown
    assert described.count("[redacted]") == 1, described
    assert by_key == [[], [], []], by_key  # the title's words are search terms: none of the key's
    warned = [r.getMessage() for r in caplog.records if "tool list carried" in r.getMessage()]
    assert len(warned) == 1 and "'up'" in warned[0], warned
    assert not any(KEY in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------- the OpenAPI path, end to end


def key_echo_app() -> Any:
    """A backend that refuses a value quoting it with the API key it got right after it (the key
    as sent in ``X-Api-Key``: a vendor key without a scheme, nothing before it known)."""
    from fastapi import FastAPI, Header, Query
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel

    api = FastAPI(title="KeyEcho", version="1.0")

    class Echo(BaseModel):
        echo: str

    @api.get("/check", operation_id="check", response_model=Echo)
    def check(value: str = Query(), x_api_key: str = Header(default="")) -> JSONResponse:
        return JSONResponse({"detail": f"invalid value '{value}{x_api_key}'"}, status_code=400)

    return api


@pytest.fixture(scope="module")
def key_echo() -> Iterator[tuple[str, dict[str, Any]]]:
    app = key_echo_app()
    with uvicorn_in_thread(app) as base:
        yield base, app.openapi()


async def reason_for(
    key_echo: tuple[str, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    key: str,
    value: str,
) -> str:
    """The error text a program gets from ``api.check(value=value)`` when ``key`` is the API key."""
    base, document = key_echo
    (tmp_path / "check.json").write_text(json.dumps(document))
    monkeypatch.setenv(KEY_ENV, key)
    pack = openapi_pack(
        [
            {
                "name": "api",
                "document": str(tmp_path / "check.json"),
                "base_url": base,
                "auth_header": "X-Api-Key",
                "auth_value_from_env": KEY_ENV,
            }
        ]
    )
    server = codemode.Builder(authorizer=authz.allow_all()).register(*pack.capabilities()).build()
    program = f'def main():\n    return attempt(api.check, value={json.dumps(value)})["error"]\n'
    try:
        return str(await server.execute(program, subject=SUBJECT))
    finally:
        await pack.aclose()
        await server.aclose()


async def test_an_escape_the_key_would_complete_tells_nothing_about_it(
    key_echo: tuple[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program's value ``%252525252`` echoed right before the key: the reason is the same for a
    key starting with a hex digit as for one that does not. Failed before:
    ``capability failed: HTTP 400`` for the first (the text, credential included, did not settle
    after four rounds of decoding), ``capability failed: HTTP 400: invalid value '%252525252[redacted]'``
    for the second: one question answered about the key's first character."""
    shown = {
        key: await reason_for(key_echo, tmp_path, monkeypatch, key, "%252525252")
        for key in ("5" + KEY[1:], "Z" + KEY[1:])
    }
    assert len(set(shown.values())) == 1, shown
    assert all("[redacted]" in text and KEY[1:] not in text for text in shown.values()), shown
