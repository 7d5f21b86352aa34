"""One pack lifecycle, served (docs/packs.md, "A pack's lifecycle"): a pack given to ``serve --stdio``
or ``serve --http`` is opened once before serving and closed once at shutdown (the test pack,
tests/support/lifecycle_pack.py, logs each step to a file); a pack whose open fails stops ``serve --stdio``
with exit 2 and one line, the others closed. Upstream packs, from ``--config`` tables and from the
bundled ``codemode_capabilities.upstreams:pack``, are opened and closed once each, and no upstream
process or pack thread is left after the server closed (real MCP servers over stdio)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp import Client, StdioServerParameters

import codemode
from codemode.service import create_app
from codemode.startup.bootstrap import build_server, check_runtime
from codemode.startup.config import Settings
from codemode_capabilities.mcp.upstream import UpstreamMCPPack
from tests.support.lifecycle_pack import steps
from tests.support.mcp_client import child_env, cli_command, execute_value
from tests.support.service import http_get, mcp_client, running, settings, tool_value, write_token_file
from tests.support.upstreams import SERVER_SCRIPT

ROOT = Path(__file__).resolve().parents[3]
FILE_PACK = "./tests/support/lifecycle_pack.py"  # from the repository root, as docs/packs.md runs it


#: The log when ``second`` (after ``first``) fails to open: both closed, last first.
SECOND_FAILED_TO_OPEN = [
    "first capabilities",
    "second capabilities",
    "first open",
    "second open",
    "second close",
    "first close",
]


def lifecycle(names: list[str]) -> list[str]:
    return (
        [f"{n} capabilities" for n in names]
        + [f"{n} open" for n in names]
        + [f"{n} close" for n in reversed(names)]
    )


def stdio_argv(log: Path, *flags: str) -> list[str]:
    return cli_command(
        "serve", "--stdio", "--allow-all", "--pack", f"{FILE_PACK}:first", "--pack",
        "tests.support.lifecycle_pack:second", "--pack-option", f"LIFECYCLE_LOG={log}", *flags,
    )  # fmt: skip


async def test_serve_stdio_opens_each_pack_before_serving_and_closes_it_at_exit(tmp_path: Path) -> None:
    log = tmp_path / "log"
    argv = stdio_argv(log)
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=child_env(), cwd=str(ROOT))
    async with Client(params) as client:
        assert steps(log) == [
            "first capabilities",
            "second capabilities",
            "first open",
            "second open",
        ]
        result = await client.call_tool(
            "execute", {"source": 'def main():\n    return second.ping(text="x")\n'}
        )
        assert execute_value(result) == {"text": "second: x"}
    assert steps(log) == lifecycle(["first", "second"])


def test_serve_stdio_stops_in_one_line_when_a_pack_cannot_open(tmp_path: Path) -> None:
    log = tmp_path / "log"
    proc = subprocess.run(
        stdio_argv(log, "--pack-option", "LIFECYCLE_FAIL_OPEN=second"),
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "codemode: --pack / CODEMODE_PACKS: pack 'tests.support.lifecycle_pack:second': open failed: "
        "ConnectionError: second database is unreachable"
    ]
    assert steps(log) == SECOND_FAILED_TO_OPEN


async def test_serve_http_opens_each_pack_before_serving_and_closes_it_at_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    log = tmp_path / "log"
    tokens = write_token_file(tmp_path, ["alice"])
    app_settings = settings(
        packs=[f"{FILE_PACK}:first", "tests.support.lifecycle_pack:second"],
        pack_options=[f"LIFECYCLE_LOG={log}"],
        token_file=tokens.path,
        data_dir=tmp_path / "data",
    )
    async with running(create_app(app_settings)) as served:
        assert steps(log) == ["first capabilities", "second capabilities", "first open", "second open"]
        async with mcp_client(served.mcp_url, tokens["alice"]) as client:
            result = await client.call_tool(
                "execute", {"source": 'def main():\n    return first.ping(text="y")\n'}
            )
            assert tool_value(result) == {"result": {"text": "first: y"}}
    assert steps(log) == lifecycle(["first", "second"])


# ------------------------------------------------------------------------------------ upstreams


def upstream_table(name: str, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    return (
        f"[[upstream_mcp]]\nname = {json.dumps(name)}\ncommand = {json.dumps(sys.executable)}\n"
        f'args = [{json.dumps(str(SERVER_SCRIPT))}, "stdio"]\ncwd = {json.dumps(str(folder))}\n'
        'tenancy = "shared"\ninclude = ["addNumbers"]\n'
    )


def upstream_processes(folder: Path) -> list[int]:
    """The upstream servers running in ``folder`` (their working directory)."""
    found = []
    for proc in psutil.process_iter(["cwd", "cmdline"]):
        info: dict[str, Any] = proc.info
        if info["cwd"] == str(folder) and str(SERVER_SCRIPT) in (info["cmdline"] or []):
            found.append(proc.pid)
    return found


def upstream_threads() -> set[threading.Thread]:
    """The upstream packs' loop threads alive now (earlier tests of this process may have left some:
    a test compares against those it found at its start)."""
    return {t for t in threading.enumerate() if t.name == "codemode-upstreams" and t.is_alive()}


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Every UpstreamMCPPack open/aclose, as (step, upstream names); the real methods still run."""
    seen: list[tuple[str, str]] = []
    real_open, real_close = UpstreamMCPPack.open, UpstreamMCPPack.aclose

    async def open_(self: UpstreamMCPPack) -> None:
        seen.append(("open", ",".join(c.name for c in self.configs)))
        await real_open(self)

    async def aclose(self: UpstreamMCPPack) -> None:
        seen.append(("close", ",".join(c.name for c in self.configs)))
        await real_close(self)

    monkeypatch.setattr(UpstreamMCPPack, "open", open_)
    monkeypatch.setattr(UpstreamMCPPack, "aclose", aclose)
    yield seen


@pytest.mark.timeout(120)
async def test_config_tables_and_the_bundled_upstreams_pack_are_opened_and_closed_once(
    tmp_path: Path, counted: list[tuple[str, str]]
) -> None:
    earlier = upstream_threads()
    bundled = tmp_path / "upstreams.toml"
    bundled.write_text(upstream_table("bundled", tmp_path / "bundled"), encoding="utf-8")
    tables = upstream_table("alpha", tmp_path / "alpha") + upstream_table("beta", tmp_path / "beta")
    config = Settings.model_validate(
        {
            "allow_all": True,
            "pool": 0,
            "packs": ["codemode_capabilities.upstreams:pack"],
            "pack_options": [f"CODEMODE_UPSTREAMS_FILE={bundled}"],
            **tomllib.loads(tables),
        }
    )
    server = build_server(config)
    assert counted == []
    for name in ("bundled", "alpha", "beta"):
        assert upstream_processes(tmp_path / name) != [], name  # discovery's session, kept
    assert await check_runtime(server, config) is None
    assert counted == [("open", "bundled"), ("open", "alpha"), ("open", "beta")]
    program = (
        "def main():\n"
        "    return [bundled.add_numbers(a=1, b=2)['total'], beta.add_numbers(a=3, b=4)['total']]\n"
    )
    assert await server.execute(program, subject=codemode.Subject("a")) == [3, 7]
    await server.aclose()
    assert counted[3:] == [("close", "beta"), ("close", "alpha"), ("close", "bundled")]
    assert upstream_threads() - earlier == set()
    for name in ("bundled", "alpha", "beta"):
        assert upstream_processes(tmp_path / name) == [], name


async def test_serve_http_start_degraded_with_a_pack_that_cannot_open_is_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/packs.md: with --start-degraded the service runs, /readyz fails and every execute fails
    with the coarse internal failure; every pack is closed once."""
    monkeypatch.chdir(ROOT)
    log = tmp_path / "log"
    tokens = write_token_file(tmp_path, ["alice"])
    app_settings = settings(
        packs=[f"{FILE_PACK}:first", "tests.support.lifecycle_pack:second"],
        pack_options=[f"LIFECYCLE_LOG={log}", "LIFECYCLE_FAIL_OPEN=second"],
        token_file=tokens.path,
        data_dir=tmp_path / "data",
        start_degraded=True,
    )
    async with running(create_app(app_settings)) as served:
        ready = await http_get(served.url + "/readyz")
        assert ready.status_code == 503
        async with mcp_client(served.mcp_url, tokens["alice"]) as client:
            result = await client.call_tool("execute", {"source": "def main():\n    return 1\n"})
            assert tool_value(result) == ("error", "internal failure")
    assert steps(log) == SECOND_FAILED_TO_OPEN
