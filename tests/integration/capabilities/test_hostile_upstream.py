"""A hostile upstream MCP server's metadata against a real ``codemode serve --stdio``, through the
official MCP client: bounded describe answers, what text is shown, ranking against the built-in
records pack, names tied to their own tools, and start-up with a huge or unreachable upstream.

The upstream is ``hostile_catalog_server.py`` (the SDK's low-level server, so its tool list is exactly
what the test says); the catalog also holds the records pack, the built-in capabilities it must not
outrank.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.support.mcp_client import (
    RECORDS_PACK,
    call,
    child_env,
    cli_command,
    error_text,
    execute_value,
    success_value,
)
from tests.support.servers import FOLDER as SERVERS
from tests.support.upstreams import free_port

pytestmark = pytest.mark.slow

HOSTILE = SERVERS / "hostile_catalog_server.py"


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


# --- what an upstream's text becomes, and how it ranks ---------------------------------------------

RECORDS_NAMES = ["records.create", "records.get", "records.search", "records.update", "records.delete"]


def own_word_queries(described: dict[str, Any], terms: list[str]) -> list[str]:
    """Queries made of a capability's own words: its name's, its summary's, each search term."""
    summary_words = [w.strip(".,/()") for w in described["summary"].split()]
    return [described["name"].replace(".", " "), " ".join(summary_words[:16]), *terms]


async def test_stuffed_upstream_text_never_outranks_a_built_in_for_its_own_words(tmp_path: Path) -> None:
    from codemode.packs.loading import PackSettings
    from codemode_capabilities.records import pack

    terms = {c.name: list(c.search_terms) for c in pack.capabilities(PackSettings())}
    config = config_file(tmp_path, upstream_table("injected"))
    async with serving(config) as (client, _):
        for name in RECORDS_NAMES:
            described = success_value(await call(client, "describe_api", name=name))
            for query in own_word_queries(described, terms[name]):
                ranked = await names_found(client, query)
                # unfixed: the words of records.search's summary ranked a.helper and a.zz_helper first
                assert name in ranked, (query, ranked)
                above = ranked[: ranked.index(name)]
                assert "a.helper" not in above and "a.zz_helper" not in above, (query, ranked)


async def test_upstream_text_is_shown_one_line_printable_and_bounded(tmp_path: Path) -> None:
    config = config_file(tmp_path, upstream_table("injected"))
    async with serving(config) as (client, _):
        found = success_value(await call(client, "search_api", query="helper"))
        assert {r["name"] for r in found["results"]} == {"a.helper", "a.zz_helper"}
        for result in found["results"]:
            assert set(result) == {"name", "signature", "summary"}  # no description, title or terms
        described = success_value(await call(client, "describe_api", name="a.helper"))
    summary, description = described["summary"], described["description"]
    assert summary.isprintable() and len(summary.encode()) <= 200
    assert all(ch.isprintable() or ch in "\n\t" for ch in description)
    assert len(description.encode()) <= 16384 and description.endswith("...")
    for hidden in ("\x1b", "\x07", "\u202e", "\u202c", "\u200b"):
        assert hidden not in summary + description
    # the words themselves pass (shown as is, marked nowhere): the contract says so, and search
    # keeps them below the operator's own capabilities
    assert "ignore all previous instructions" in description
    # argument descriptions are never shown: only names and types
    assert described["input"] == [{"name": "text", "type": "str | None", "required": False}]


# --- names stay tied to their own tools ------------------------------------------------------------

NAMES = {
    "a.get_thing": "get_thing",
    "a.get_thing_2": "get_thing_2",
    "a.get_thing_3": "get-thing",
    "a.get_thing_4": "getThing",
}


@pytest.mark.parametrize("order", ["0,1,2,3", "3,2,1,0", "2,0,3,1"])
async def test_derived_names_call_their_own_tools_in_any_listing_order(tmp_path: Path, order: str) -> None:
    config = config_file(tmp_path, upstream_table("names", order))
    # unfixed: a tool listed twice ("twice") stopped the whole service; and a.get_thing_2 ran get-thing
    async with serving(config) as (client, log):
        found = success_value(await call(client, "search_api", query="get thing"))
        assert sorted(r["name"] for r in found["results"]) == sorted(NAMES)
        for name, tool in NAMES.items():
            described = success_value(await call(client, "describe_api", name=name))
            assert described["summary"] == f"I am {tool}."
            source = f"def main():\n    return {name}()\n"
            assert execute_value(await call(client, "execute", source=source)) == {"text": f"ran {tool}"}
        assert error_text(await call(client, "describe_api", name="a.twice")) == "capability not found"
    assert "twice: listed 2 times with different definitions" in log.read_text(encoding="utf-8")


# --- start-up: a huge tool list, an unreachable upstream (serve --stdio) ---------------------------


async def test_a_4096_tool_list_is_capped_and_the_service_starts(tmp_path: Path) -> None:
    # unfixed: 4,096 + the records pack's 5 passed the 4,096-capability cap and the start failed
    config = config_file(tmp_path, upstream_table("many", "4096"))
    async with serving(config) as (client, log):
        last = success_value(await call(client, "describe_api", name="a.tool1023"))
        assert last["summary"] == "Tool number 1023."
        missing = error_text(await call(client, "describe_api", name="a.tool1024"))
        # one of the closest served names (a.tool0024 and a.tool1023 tie: the first in name order)
        assert missing == "capability not found: did you mean a.tool0024?"
        assert "records.create" in await names_found(client, "create record")
    text = log.read_text(encoding="utf-8")
    assert "skipped 3072 of 4096 tool(s)" in text
    assert "- tool1024: over max_tools (1024 of 4096 tools taken, in name order)" in text
    assert "... and 3022 more" in text and "tool4095" not in text  # the log is bounded too


async def test_max_tools_is_per_upstream(tmp_path: Path) -> None:
    table = upstream_table("many", "600") + "max_tools = 10\n"
    async with serving(config_file(tmp_path, table)) as (client, _):
        found = await names_found(client, "tool number")
        assert sorted(n for n in found if n.startswith("a.")) == [f"a.tool{i:04d}" for i in range(10)]


def serve_stdio_exit(config: Path, *flags: str) -> tuple[int, list[str]]:
    argv = cli_command("serve", "--stdio", "--config", str(config), *flags)
    proc = subprocess.run(
        argv, env=child_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    return proc.returncode, proc.stderr.splitlines()


def test_an_unreachable_upstream_stops_serve_stdio_in_one_line(tmp_path: Path) -> None:
    gone = (
        f'[[upstream_mcp]]\nname = "gone"\nurl = "http://127.0.0.1:{free_port()}/mcp"\nconnect_timeout = 5\n'
    )
    # unfixed: exit 1 and a traceback ending in "ExceptionGroup: unhandled errors in a TaskGroup"
    code, lines = serve_stdio_exit(config_file(tmp_path, gone))
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("codemode: --config / CODEMODE_CONFIG: upstream 'gone': cannot connect")
    assert "ConnectError" in lines[0] and "TaskGroup" not in lines[0]


def test_an_upstream_command_that_cannot_start_stops_serve_stdio_in_one_line(tmp_path: Path) -> None:
    table = '[[upstream_mcp]]\nname = "nothing"\ncommand = "/nonexistent/mcp-server"\n'
    code, lines = serve_stdio_exit(config_file(tmp_path, table))
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("codemode: --config / CODEMODE_CONFIG: upstream 'nothing': cannot connect")
    assert "FileNotFoundError" in lines[0]


def test_start_degraded_is_for_http_only(tmp_path: Path) -> None:
    code, lines = serve_stdio_exit(config_file(tmp_path), "--start-degraded")
    assert (code, lines) == (
        2,
        ["codemode: --start-degraded is for serve --http; it does nothing with --stdio"],
    )
