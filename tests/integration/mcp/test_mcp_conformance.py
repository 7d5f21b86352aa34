"""The protocol's own server test suite, ``@modelcontextprotocol/conformance``, against this server.

Run over streamable HTTP (``codemode serve --http`` behind :class:`BearerProxy`, which adds the token
the suite cannot send) in the default stateless mode, in stateful mode (the event-stream scenarios
need a session) and with the host and origin allow-lists set (DNS rebinding); and over stdio
(``codemode serve --stdio`` behind :class:`StdioBridge`). Only the scenarios that apply to a server
publishing three tools and nothing else run; every other scenario of the pinned suite is listed in
:data:`NOT_APPLICABLE` with the reason, and a test fails when the suite has a scenario in neither list.

The suite needs Node >= 22: the pinned ``node`` package from npm carries one. Both are installed once
into ``CODEMODE_CONFORMANCE_DIR`` (default ``~/.cache/codemode/conformance``). Without npm the tests
are skipped with a visible reason, except when ``CI=true``: then they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from codemode.service.auth import hash_token
from tests.support.conformance import BearerProxy, StdioBridge
from tests.support.environment import unavailable
from tests.support.mcp_client import RECORDS_PACK, child_env, cli_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SUITE = ("@modelcontextprotocol/conformance", os.environ.get("CODEMODE_CONFORMANCE_VERSION", "0.1.16"))
NODE = ("node", os.environ.get("CODEMODE_CONFORMANCE_NODE_VERSION", "22.23.3"))

#: Scenarios that apply to a tools-only server, by transport and mode.
CORE = ("server-initialize", "ping", "tools-list")
STREAMS = ("server-sse-multiple-streams",)
REBINDING = ("dns-rebinding-protection",)

#: The suite's other server scenarios, and why they do not apply.
NOT_APPLICABLE = {
    "logging-set-level": "the server declares no logging capability",
    "completion-complete": "the server declares no completions capability",
    "server-sse-polling": "calls the suite's fixture tool test_reconnection and checks stream resumption "
    "(event ids, retry), which needs an event store: this server keeps none (docs/service.md)",
    **{
        name: "calls a fixture tool of the suite's reference server; this server publishes only "
        "search_api, describe_api and execute (their results are tested with the official client)"
        for name in (
            "tools-call-simple-text",
            "tools-call-image",
            "tools-call-audio",
            "tools-call-embedded-resource",
            "tools-call-mixed-content",
            "tools-call-with-logging",
            "tools-call-error",
            "tools-call-with-progress",
            "tools-call-sampling",
            "tools-call-elicitation",
            "json-schema-2020-12",
            "elicitation-sep1034-defaults",
            "elicitation-sep1330-enums",
        )
    },
    **{
        name: "the server declares no resources capability"
        for name in (
            "resources-list",
            "resources-read-text",
            "resources-read-binary",
            "resources-templates-read",
            "resources-subscribe",
            "resources-unsubscribe",
        )
    },
    **{
        name: "the server declares no prompts capability"
        for name in (
            "prompts-list",
            "prompts-get-simple",
            "prompts-get-with-args",
            "prompts-get-embedded-resource",
            "prompts-get-with-image",
        )
    },
}
#: Transport-specific scenarios do not apply to stdio.
STDIO_NOT_APPLICABLE = {name: "a streamable HTTP scenario" for name in (*STREAMS, *REBINDING)}


def _unavailable(reason: str) -> None:
    unavailable("MCP conformance suite", reason)


@pytest.fixture(scope="module")
def suite() -> dict[str, str]:
    """The environment in which ``conformance`` runs the pinned suite under the pinned Node."""
    npm = shutil.which("npm")
    if npm is None:
        _unavailable("npm not found on PATH (install Node.js and npm to run the MCP conformance suite)")
    assert npm is not None
    default = Path.home() / ".cache" / "codemode" / "conformance"
    where = Path(os.environ.get("CODEMODE_CONFORMANCE_DIR", str(default)))
    wanted = {SUITE[0]: SUITE[1], NODE[0]: NODE[1]}
    manifests = {name: where / "node_modules" / name / "package.json" for name in wanted}
    if not all(
        p.exists() and json.loads(p.read_text())["version"] == wanted[n] for n, p in manifests.items()
    ):
        where.mkdir(parents=True, exist_ok=True)
        specs = [f"{name}@{version}" for name, version in wanted.items()]
        proc = subprocess.run(
            [npm, "install", "--prefix", str(where), "--no-audit", "--no-fund", *specs],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            _unavailable(f"npm install {' '.join(specs)} failed: {proc.stderr.strip()[-500:]}")
    bin_dir = where / "node_modules" / ".bin"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    version = subprocess.run(["node", "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert version.stdout.strip() == f"v{NODE[1]}", version
    return env


async def run_scenario(env: dict[str, str], url: str, scenario: str) -> list[dict[str, Any]]:
    """The checks of one scenario, as the suite reports them (``--verbose`` prints them as JSON)."""
    proc = await asyncio.create_subprocess_exec(
        "conformance",
        "server",
        "--url",
        url,
        "--scenario",
        scenario,
        "--verbose",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    async with asyncio.timeout(180):
        out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    start = text.find("[")
    assert start >= 0, text[-2000:]
    checks, _ = json.JSONDecoder().raw_decode(text[start:])
    assert isinstance(checks, list) and checks, text[-2000:]
    return checks


def failures(checks: list[dict[str, Any]]) -> list[str]:
    return [
        f"{c['id']}: {c.get('errorMessage') or c.get('details')}" for c in checks if c["status"] == "FAILURE"
    ]


async def assert_passes(env: dict[str, str], url: str, scenarios: tuple[str, ...]) -> None:
    for scenario in scenarios:
        checks = await run_scenario(env, url, scenario)
        assert failures(checks) == [], (scenario, checks)
        assert any(c["status"] == "SUCCESS" for c in checks), (scenario, checks)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def http_server(tmp: Path, *flags: str, proxy_port: int = 0) -> AsyncIterator[BearerProxy]:
    """``codemode serve --http`` on free loopback ports, behind the bearer proxy."""
    token = secrets.token_urlsafe(24)
    tokens = tmp / "tokens.json"
    tokens.write_text(json.dumps({hash_token(token): "conformance"}))
    port = _free_port()
    argv = cli_command(
        "serve",
        "--http",
        "--port",
        str(port),
        "--metrics-port",
        "0",
        "--health-port",
        "0",
        "--allow-all",
        "--token-file",
        str(tokens),
        "--pack",
        RECORDS_PACK,
        "--audit-log",
        "none",
        *flags,
    )
    env = child_env(HOME=str(tmp), CODEMODE_RECORDS_DB=":memory:")
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stderr=asyncio.subprocess.PIPE)
    try:
        await _wait_healthy(port, proc)
        async with BearerProxy(token, port).serving(proxy_port) as proxy:
            yield proxy
    finally:
        proc.terminate()
        async with asyncio.timeout(30):
            await proc.wait()


async def _wait_healthy(port: int, proc: asyncio.subprocess.Process) -> None:
    async with asyncio.timeout(60):
        while True:
            if proc.returncode is not None:
                assert proc.stderr is not None
                raise AssertionError((await proc.stderr.read()).decode(errors="replace")[-2000:])
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                try:
                    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    status = await reader.readline()
                finally:
                    writer.close()
                if b" 200 " in status:
                    return
            await asyncio.sleep(0.1)


def test_every_scenario_of_the_suite_is_run_or_explained(suite: dict[str, str]) -> None:
    proc = subprocess.run(["conformance", "list"], capture_output=True, text=True, env=suite, timeout=120)
    assert proc.returncode == 0, proc.stderr
    server_part = proc.stdout.split("Client scenarios")[0]
    listed = {
        line.strip()[2:].split(" ")[0] for line in server_part.splitlines() if line.strip().startswith("- ")
    }
    assert listed, proc.stdout
    run = {*CORE, *STREAMS, *REBINDING}
    assert listed == run | set(NOT_APPLICABLE), sorted(listed ^ (run | set(NOT_APPLICABLE)))
    assert not run & set(NOT_APPLICABLE)


async def test_streamable_http_stateless(suite: dict[str, str], tmp_path: Path) -> None:
    async with http_server(tmp_path) as proxy:
        await assert_passes(suite, f"http://127.0.0.1:{proxy.port}/mcp", CORE)


async def test_streamable_http_stateful_with_event_streams(suite: dict[str, str], tmp_path: Path) -> None:
    async with http_server(tmp_path, "--no-mcp-stateless") as proxy:
        await assert_passes(suite, f"http://127.0.0.1:{proxy.port}/mcp", (*CORE, *STREAMS))


async def test_streamable_http_refuses_dns_rebinding(suite: dict[str, str], tmp_path: Path) -> None:
    # The proxy keeps the suite's Host and Origin headers: the allow-lists name the proxy's address.
    port = _free_port()
    flags: list[str] = []
    for name in ("localhost", "127.0.0.1"):
        flags += ["--allowed-host", f"{name}:{port}", "--allowed-origin", f"http://{name}:{port}"]
    async with http_server(tmp_path, *flags, proxy_port=port):
        await assert_passes(suite, f"http://127.0.0.1:{port}/mcp", REBINDING)


async def test_stdio(suite: dict[str, str], tmp_path: Path) -> None:
    argv = cli_command("serve", "--stdio", "--allow-all", "--pack", RECORDS_PACK)
    env = child_env(HOME=str(tmp_path), CODEMODE_RECORDS_DB=":memory:")
    async with StdioBridge(argv, env).serving() as bridge:
        await assert_passes(suite, f"http://127.0.0.1:{bridge.port}/mcp", CORE)
        assert bridge.children == len(CORE)  # each scenario's initialize got a fresh stdio server
    assert set(STDIO_NOT_APPLICABLE) <= {*STREAMS, *REBINDING}
