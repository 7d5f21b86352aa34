"""End-to-end over stdio: the official MCP Python client against a real ``codemode serve --stdio``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from tests.support.mcp_client import (
    RECORDS_PACK,
    assert_coarse,
    call,
    call_raw,
    child_env,
    cli_command,
    error_text,
    execute_value,
    success_value,
)

pytestmark = pytest.mark.slow


def params(*flags: str, **env: str) -> StdioServerParameters:
    argv = cli_command("serve", "--stdio", *flags)
    return StdioServerParameters(command=argv[0], args=argv[1:], env=child_env(**env))


ALLOW_ALL_RECORDS = ("--allow-all", "--pack", RECORDS_PACK)


async def test_tools_list_over_stdio() -> None:
    async with Client(params(*ALLOW_ALL_RECORDS)) as client:
        listed = await client.list_tools()
        assert client.server_info is not None and client.server_info.name == "codemode"
        assert client.instructions and "search_api" in client.instructions
    assert [t.name for t in listed.tools] == ["search_api", "describe_api", "execute"]
    for tool in listed.tools:
        assert tool.input_schema["additionalProperties"] is False
        assert len(tool.input_schema["required"]) == 1
        assert tool.output_schema is not None


async def test_flow_and_errors_over_stdio(tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    async with Client(
        params(*ALLOW_ALL_RECORDS, "--max-native-calls", "5", CODEMODE_RECORDS_DB=str(db))
    ) as client:
        found = success_value(await call(client, "search_api", query="store a new note"))
        assert "records.create" in [r["name"] for r in found["results"]]
        desc = success_value(await call(client, "describe_api", name="records.search"))
        assert desc["signature"] == "records.search(*, text: str | None, tag: str | None, limit: int | None)"

        src = """
def main():
    ids = [records.create(title="t%d" % i, tags=["batch"])["id"] for i in range(3)]
    hits = records.search(tag="batch", limit=2)
    return {"ids": ids, "hits": len(hits["records"]), "more": hits["truncated"]}
"""
        assert execute_value(await call(client, "execute", source=src)) == {
            "ids": [1, 2, 3],
            "hits": 2,
            "more": True,
        }
        src = 'def main():\n    return records.update(id=2, title="renamed")["title"]\n'
        assert execute_value(await call(client, "execute", source=src)) == "renamed"
        src = "def main():\n    return records.delete(id=3)\n"
        assert execute_value(await call(client, "execute", source=src)) == {"id": 3, "deleted": True}

        # error texts (docs/reference/errors.md) reachable with allow-all and the records pack
        assert error_text(await call(client, "describe_api", name="records.nope")) == "capability not found"
        text = error_text(await call(client, "execute", source="def main(:\n"))
        assert re.fullmatch(r"invalid program: <codemode>:\d+:\d+: .+", text), text
        text = error_text(
            await call(client, "execute", source='def main():\n    return records.get(id="1")\n')
        )
        assert text == 'invalid capability arguments: argument "id" must be int, got str'
        text = error_text(await call(client, "execute", source="def main():\n    return records.get(id=3)\n"))
        assert text == "capability failed: record 3 not found"
        src = "def main():\n    for i in range(6):\n        records.get(id=1)\n    return 0\n"
        assert (
            error_text(await call(client, "execute", source=src)) == "resource limit exceeded: native calls"
        )
        assert (
            error_text(await call(client, "search_api", query="q" * 300)) == "resource limit exceeded: query"
        )

        # schema violations
        for tool, args in (
            ("execute", {}),
            ("search_api", {"query": 1}),
            ("describe_api", {"name": "x", "y": "z"}),
        ):
            assert error_text(await call_raw(client, tool, args)).startswith("invalid tool arguments: ")
    assert db.exists()


async def test_env_configuration_over_stdio() -> None:
    env = {
        "CODEMODE_ALLOW_ALL": "1",
        "CODEMODE_PACKS": RECORDS_PACK,
        "CODEMODE_DISABLE": "records.entry.delete",
    }
    async with Client(params(**env)) as client:
        found = success_value(await call(client, "search_api", query="records"))
        names = {r["name"] for r in found["results"]}
        assert "records.get" in names and "records.delete" not in names


REGO = """package codemode

default allow := false

allow if input.capability.id != "records.entry.delete"

allow if {
    input.capability.id == "records.entry.delete"
    input.subject.id == "admin"
}
"""

BROKEN_REGO = """package codemode

allow if input.arguments.title.missing.field == "x"
"""


async def test_rego_denial_over_stdio(tmp_path: Path) -> None:
    policy = tmp_path / "policy.rego"
    policy.write_text(REGO)
    flags = ("--rego-policy", str(policy), "--rego-decision", "data.codemode.allow", "--pack", RECORDS_PACK)
    async with Client(params(*flags, "--subject", "alice")) as client:
        src = 'def main():\n    r = records.create(title="x")\n    return records.delete(id=r["id"])\n'
        text = error_text(await call(client, "execute", source=src))
        assert text == "permission denied"
        assert "admin" not in text
    async with Client(params(*flags, "--subject", "admin")) as client:
        src = 'def main():\n    r = records.create(title="x")\n    return records.delete(id=r["id"])\n'
        assert execute_value(await call(client, "execute", source=src)) == {"id": 1, "deleted": True}


async def test_rego_policy_failure_over_stdio(tmp_path: Path) -> None:
    policy = tmp_path / "broken.rego"
    policy.write_text(BROKEN_REGO)
    flags = ("--rego-policy", str(policy), "--rego-decision", "data.codemode.allow", "--pack", RECORDS_PACK)
    async with Client(params(*flags)) as client:
        src = 'def main():\n    return records.create(title="x")\n'
        text = error_text(await call(client, "execute", source=src))
        assert text == "authorization policy failure"


async def test_error_texts_are_coarse_over_stdio() -> None:
    async with Client(params(*ALLOW_ALL_RECORDS)) as client:
        results: list[Any] = []
        for source in (
            "",
            "def main():\n    return fail('x')\n",
            "def main():\n    return records.get(id=-1)\n",
        ):
            results.append(await call(client, "execute", source=source))
    for result in results:
        assert_coarse(error_text(result))
