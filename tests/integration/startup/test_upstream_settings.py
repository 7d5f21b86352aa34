"""Upstream tables in the one settings model: a ``[[upstream_mcp]]`` table in the TOML file of
``codemode serve --stdio --config`` becomes capabilities (a real PyPI MCP server, mcp-server-time),
reached through the official client; a bad table is a one-line configuration error naming the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from codemode.startup.bootstrap import build_server
from codemode.startup.config import ConfigError, load_settings
from tests.support.mcp_client import call, child_env, cli_command, execute_value, success_value

pytestmark = pytest.mark.slow


def _toml(tmp_path: Path) -> Path:
    path = tmp_path / "codemode.toml"
    path.write_text(
        "allow_all = true\n\n[[upstream_mcp]]\n"
        f'name = "time"\ncommand = {json.dumps(sys.executable)}\n'
        'args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]\n'
    )
    return path


async def test_upstream_table_served_over_stdio(tmp_path: Path) -> None:
    argv = cli_command("serve", "--stdio", "--config", str(_toml(tmp_path)))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=child_env())
    async with Client(params) as client:
        found = success_value(await call(client, "search_api", query="convert time zone"))
        assert "time.convert_time" in [r["name"] for r in found["results"]]
        src = (
            "def main():\n"
            '    c = time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Asia/Kolkata")\n'
            "    return c['target']['datetime'][11:16]\n"
        )
        assert execute_value(await call(client, "execute", source=src)) == "17:30"


async def test_server_closes_the_upstream_connection(tmp_path: Path) -> None:
    settings = load_settings(config_file=_toml(tmp_path), transport="stdio")
    server = build_server(settings)
    async with server:
        src = 'def main():\n    return time.get_current_time(timezone="UTC")["timezone"]\n'
        from codemode import Subject

        assert await server.execute(src, subject=Subject("alice")) == "UTC"
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    assert str(tmp_path) not in ps  # nothing of ours left
    leftovers = [
        line for line in ps.splitlines() if "mcp_server_time" in line and "--local-timezone UTC" in line
    ]
    assert leftovers == [] or all("pytest" in line for line in leftovers)


def test_a_bad_table_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "codemode.toml"
    path.write_text('allow_all = true\n\n[[openapi]]\nname = "x"\n')
    with pytest.raises(ConfigError) as info:
        build_server(load_settings(config_file=path, transport="stdio"))
    assert str(info.value).startswith(
        f"--config / CODEMODE_CONFIG: {str(path)!r}: upstreams: invalid configuration; openapi[0]"
    )


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_multi_tenant_service_refuses_a_per_subject_table_that_shares_a_path(
    tmp_path: Path, transport: str
) -> None:
    """``serve --http`` refuses a per-subject table whose servers would all be given
    the same fixed path (before: a warning, and each subject's process used the same file);
    ``serve --stdio`` (one subject) starts it."""
    path = _toml(tmp_path)
    path.write_text(path.read_text() + 'env = { TIME_STATE = "/var/lib/time/state" }\n')
    settings = load_settings(config_file=path, transport=transport, data_dir=tmp_path / "data")
    if transport == "stdio":
        async with build_server(settings):
            return
    with pytest.raises(ConfigError) as refused:
        build_server(settings)
    assert str(refused.value) == (
        "--config / CODEMODE_CONFIG: upstream 'time': every subject's server would be given the same "
        "path: env TIME_STATE names '/var/lib/time/state'; put per-subject state under {subject_dir}, "
        'list what may be shared in shared_paths, or set tenancy = "shared"'
    )


@pytest.mark.parametrize(
    ("transport", "table", "warned"),
    [
        ("http", 'tenancy = "shared"\n', "upstream 'time' is shared by every subject"),
        ("http", "", "upstream 'time': each subject gets its own server process, but env/args/cwd use no"),
        ("http", 'env = { TIME_STATE = "{subject_dir}/state" }\n', None),
        ("stdio", 'tenancy = "shared"\n', None),
    ],
)
async def test_a_multi_tenant_service_warns_about_shared_upstream_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, transport: str, table: str, warned: str | None
) -> None:
    """``serve --http`` serves many subjects: a shared upstream, and a per-subject stdio upstream
    whose processes would still share their files, are warned about at start (``serve --stdio``,
    one subject, is not)."""
    path = _toml(tmp_path)
    path.write_text(path.read_text() + table)
    settings = load_settings(config_file=path, transport=transport, data_dir=tmp_path / "data")
    server = build_server(settings)
    async with server:
        pass
    shown = [r.getMessage() for r in caplog.records if "upstream 'time'" in r.getMessage()]
    if warned is None:
        assert shown == []
    else:
        assert any(m.startswith(warned) for m in shown), shown
    if "subject_dir" in table:  # the host's discovery process got its own directory there
        assert (tmp_path / "data" / "upstreams" / "time" / "host").is_dir()
