"""A hostile upstream MCP server's metadata against a real ``codemode serve --stdio``, through the
official MCP client: bounded describe answers, what text is shown, ranking against the built-in
records pack, names tied to their own tools, and start-up with a huge or unreachable upstream.

The upstream is ``hostile_mcp_server.py`` (the SDK's low-level server, so its tool list is exactly
what the test says); the catalog also holds the records pack, the built-in capabilities it must not
outrank.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from .support_mcp import RECORDS_PACK, call, child_env, cli_command, error_text, success_value

pytestmark = pytest.mark.slow

HOSTILE = Path(__file__).with_name("hostile_mcp_server.py")


def upstream_table(scenario: str, arg: str = "", *, name: str = "hostile", namespace: str = "a") -> str:
    return (
        f'[[upstream_mcp]]\nname = "{name}"\nnamespace = "{namespace}"\n'
        f"command = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps([str(HOSTILE), scenario, arg])}\n"
    )


def config_file(directory: Path, *tables: str, extra: str = "") -> Path:
    path = directory / "codemode.toml"
    path.write_text(
        f"allow_all = true\npacks = [{json.dumps(RECORDS_PACK)}]\n{extra}\n" + "\n".join(tables),
        encoding="utf-8",
    )
    return path


@contextlib.asynccontextmanager
async def serving(config: Path, *flags: str) -> AsyncIterator[tuple[Client, Path]]:
    """``codemode serve --stdio --config FILE`` under the MCP client; yields it and its log file."""
    argv = cli_command("serve", "--stdio", "--config", str(config), "--log-level", "info", *flags)
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=child_env())
    log = config.with_suffix(".log")
    with log.open("w", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            yield client, log


def answer_bytes(result: Any) -> int:
    """Bytes of a tool answer's text content (the compact JSON the server sends)."""
    return len(result.content[0].text.encode("utf-8"))


async def names_found(client: Client, query: str) -> list[str]:
    return [r["name"] for r in success_value(await call(client, "search_api", query=query))["results"]]


# --- describe_api is bounded like search_api -------------------------------------------------------


async def test_a_3000_parameter_tool_does_not_make_describe_answer_200_kb(tmp_path: Path) -> None:
    config = config_file(tmp_path, upstream_table("wide", "3000"))
    async with serving(config) as (client, log):
        result = await call(client, "describe_api", name="a.wide")
        # unbounded, the answer was 219,215 bytes (and once more as structured content)
        assert error_text(result) == "capability not found", answer_bytes(result)
        narrow = await call(client, "describe_api", name="a.narrow")
        assert success_value(narrow)["signature"] == "a.narrow(*, x: str | None)"
        for name in ["a.narrow", "records.search", "records.create"]:
            assert answer_bytes(await call(client, "describe_api", name=name)) <= 65536
        assert "a.wide" not in await names_found(client, "very many parameters")
    text = log.read_text(encoding="utf-8")
    assert "wide: its describe_api answer would be" in text and "max_describe_response_bytes" in text


async def test_the_describe_bound_is_the_configured_one(tmp_path: Path) -> None:
    config = config_file(tmp_path, upstream_table("wide", "40"))
    async with serving(config, "--max-describe-response-bytes", "2048") as (client, _):
        assert error_text(await call(client, "describe_api", name="a.wide")) == "capability not found"
    async with serving(config) as (client, _):
        assert answer_bytes(await call(client, "describe_api", name="a.wide")) > 2048
