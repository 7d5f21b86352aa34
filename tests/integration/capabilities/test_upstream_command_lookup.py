"""A stdio upstream's command is looked up in codemode's own environment first: the
operator ran ``.venv/bin/codemode`` without the venv on PATH (an MCP client's minimal environment,
say), and ``python3 -m mcp_server_time`` / ``mcp-server-time``, installed into that venv, still start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.support.mcp_client import call, child_env, cli_command, execute_value, success_value

pytestmark = pytest.mark.slow

#: A PATH without the venv: the system's own folders only.
BARE_PATH = "/usr/local/sbin:/usr/sbin:/sbin:/usr/bin:/bin"

TABLES = """allow_all = true

[[upstream_mcp]]
name = "time"
command = "python3"
args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]

[[upstream_mcp]]
name = "clock"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
"""


def test_the_bare_path_lacks_the_venv() -> None:
    venv_bin = str(Path(sys.executable).parent)
    assert venv_bin not in BARE_PATH.split(os.pathsep)
    assert (Path(sys.executable).parent / "mcp-server-time").is_file()


async def test_stdio_upstreams_start_from_codemodes_environment_without_it_on_path(tmp_path: Path) -> None:
    (tmp_path / "codemode.toml").write_text(TABLES, encoding="utf-8")
    argv = cli_command("serve", "--stdio", "--config", str(tmp_path / "codemode.toml"))
    env = child_env(PATH=BARE_PATH)
    env.pop("VIRTUAL_ENV", None)
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(tmp_path))
    async with Client(params) as client:
        found = success_value(await call(client, "search_api", query="convert time zone"))
        assert {"time.convert_time", "clock.convert_time"} <= {r["name"] for r in found["results"]}
        src = (
            "def main():\n"
            '    a = time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Asia/Kolkata")\n'
            '    b = clock.get_current_time(timezone="Asia/Tokyo")\n'
            "    return [a['target']['datetime'][11:16], b['timezone']]\n"
        )
        assert execute_value(await call(client, "execute", source=src)) == ["17:30", "Asia/Tokyo"]
