"""``parallel(...)`` through the official MCP Python client over stdio against a real
``codemode serve --stdio``: the records, the ledger in list order, the flag
``--max-parallel-calls`` and a program error, as a client sees them."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.support.mcp_client import (
    RECORDS_PACK,
    call,
    child_env,
    cli_command,
    error_text,
    execute_report,
    execute_value,
)

pytestmark = pytest.mark.slow


def params(*flags: str, **env: str) -> StdioServerParameters:
    argv = cli_command("serve", "--stdio", "--allow-all", "--pack", RECORDS_PACK, *flags)
    return StdioServerParameters(command=argv[0], args=argv[1:], env=child_env(**env))


PROGRAM = """
def main():
    made = parallel([(records.create, {"title": "t%d" % i}) for i in range(3)])
    ids = [r["value"]["id"] for r in made]
    got = parallel([(records.get, {"id": ids[0]}), (records.get, {"id": 999}), (records.get, {"id": "x"})])
    return {"ids": ids, "got": got}
"""


async def test_parallel_over_stdio(tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    flags = ("--max-parallel-calls", "2", "--max-execution-time", "30")  # a busy machine is not the point
    async with Client(params(*flags, CODEMODE_RECORDS_DB=str(db))) as client:
        result = await call(client, "execute", source=PROGRAM)
        value = execute_value(result)
        assert value["ids"] == [1, 2, 3]
        assert value["got"][0]["ok"] and value["got"][0]["value"]["title"] == "t0"
        assert value["got"][1:] == [
            {"ok": False, "error": "capability failed: record 999 not found"},
            {"ok": False, "error": 'invalid capability arguments: argument "id" must be int, got str'},
        ]
        assert execute_report(result)["calls"] == [
            {"capability": "records.create", "outcome": "ok"},
            {"capability": "records.create", "outcome": "ok"},
            {"capability": "records.create", "outcome": "ok"},
            {"capability": "records.get", "outcome": "ok"},
            {"capability": "records.get", "outcome": "failed"},
            {"capability": "records.get", "outcome": "invalid arguments"},
        ]
        text = error_text(await call(client, "execute", source="def main():\n    return parallel([])\n"))
        assert text == (
            "invalid program: <codemode>:2:12: parallel() got an empty list: give it at least one "
            "(capability, arguments) pair"
        )
        over = "def main():\n    return parallel([(records.get, {'id': 1})] * 101)\n"
        assert (
            error_text(await call(client, "execute", source=over)) == "resource limit exceeded: native calls"
        )
