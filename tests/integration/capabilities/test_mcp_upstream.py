"""Upstream MCP servers as capabilities, against real servers over real transports.

* our own MCPServer (``upstream_mcp_server.py``) over stdio and over streamable HTTP (uvicorn on
  127.0.0.1, bearer token read from a secret file);
* ``mcp-server-time`` from PyPI (a dev dependency) over stdio;
* ``@modelcontextprotocol/server-everything`` from npm over stdio (see ``upstream_support.py``).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.authz.rego import RegoAuthorizer
from codemode.packs.upstream import UpstreamBuildError
from codemode_capabilities.mcp.upstream import (
    UpstreamMCPConfig,
    UpstreamMCPPack,
    _check_command,
    upstream_mcp_pack,
)
from tests.support.upstreams import SERVER_SCRIPT, everything_command, free_port, start_http_upstream

pytestmark = pytest.mark.slow

SUBJECT = authz.Subject(id="alice")


def stdio_config(markers: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": "test",
        "command": sys.executable,
        "args": [str(SERVER_SCRIPT), "stdio"],
        "env": {"UPSTREAM_MARKERS": str(markers)},
        **extra,
    }


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    where = tmp_path / "markers"
    where.mkdir()
    return where


async def build(
    pack: UpstreamMCPPack, *, authorizer: Any = None, limits: codemode.Limits | None = None
) -> codemode.Server:
    caps = await pack.acapabilities()
    builder = codemode.Builder(authorizer=authorizer or authz.allow_all(), limits=limits)
    return builder.register(*caps).build()


@pytest.fixture
async def served(markers: Path) -> AsyncIterator[tuple[UpstreamMCPPack, codemode.Server]]:
    pack = upstream_mcp_pack([stdio_config(markers)])
    server = await build(pack, limits=codemode.Limits(max_execution_time=4.0))
    try:
        yield pack, server
    finally:
        await pack.aclose()
        await server.aclose()


def run(source: str) -> str:
    return "def main():\n" + "".join(f"    {line}\n" for line in source.splitlines())


async def wait_for(path: Path, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if path.exists():
            return True
        await asyncio.sleep(0.05)
    return path.exists()


# --- schema compilation -----------------------------------------------------------------------------


async def test_tools_become_typed_capabilities(served: tuple[UpstreamMCPPack, codemode.Server]) -> None:
    pack, server = served
    by_name = {c.name: c for c in server.capabilities}
    assert sorted(by_name) == [
        "test.add_numbers", "test.die", "test.fail", "test.pid", "test.shout", "test.slow",
    ]  # fmt: skip
    add = by_name["test.add_numbers"]
    assert add.id == "mcp:test:addNumbers"
    assert add.signature == "test.add_numbers(*, a: int, b: int)"
    assert server.describe("test.add_numbers").output == [
        {"name": "total", "type": "int", "required": True},
        {"name": "terms", "type": "list[int]", "required": True},
    ]
    assert by_name["test.shout"].signature == 'test.shout(*, text: str, mode: "upper" | "lower" | None)'
    assert by_name["test.shout"].summary == "Change the case of a text."
    assert server.describe("test.fail").output == [{"name": "text", "type": "str", "required": True}]
    report = pack.reports["test"]
    assert report.skipped == [("untyped", "/properties/value: untyped value (any JSON)")]


async def test_on_unsupported_fail_names_every_reason(markers: Path) -> None:
    pack = upstream_mcp_pack([stdio_config(markers, on_unsupported="fail")])
    with pytest.raises(UpstreamBuildError) as info:
        await pack.acapabilities()
    assert "- untyped: /properties/value: untyped value (any JSON)" in str(info.value)


async def test_include_exclude_and_namespace(markers: Path) -> None:
    pack = upstream_mcp_pack(
        [stdio_config(markers, include=["s*", "pid"], exclude=["slow"], namespace="t.up")]
    )
    caps = await pack.acapabilities()
    await pack.aclose()
    assert sorted(c.name for c in caps) == ["t.up.pid", "t.up.shout"]


async def test_tools_list_is_followed_across_pages(markers: Path) -> None:
    pack = upstream_mcp_pack(
        [stdio_config(markers, env={"UPSTREAM_MARKERS": str(markers), "UPSTREAM_PAGE_SIZE": "2"})]
    )
    caps = await pack.acapabilities()
    try:
        assert len(caps) == 6 and len(pack.reports["test"].skipped) == 1  # 7 tools over 4 pages
    finally:
        await pack.aclose()


async def test_the_session_that_listed_the_tools_serves_the_calls(markers: Path) -> None:
    """Discovery from synchronous code (another thread, as the CLI does before its loop) and calls
    on this loop use one session on the pack's own loop: the upstream is started once."""
    pack = upstream_mcp_pack([stdio_config(markers)])
    caps = await asyncio.to_thread(pack.capabilities, codemode.packs.PackSettings())
    server = codemode.Builder(authorizer=authz.allow_all()).register(*caps).build()
    try:
        await pack.open()
        assert pack.pools["test"].starts == 1
        t0 = time.monotonic()
        assert await server.execute(run("return test.pid()"), subject=SUBJECT)
        assert pack.pools["test"].starts == 1  # the first subject took the discovery session over
        assert time.monotonic() - t0 < 5
    finally:
        await pack.aclose()
        await server.aclose()


def test_sync_capabilities_work_from_plain_code(markers: Path) -> None:
    pack = upstream_mcp_pack([stdio_config(markers)])
    caps = pack.capabilities(codemode.packs.PackSettings())
    assert len(caps) == 6
    asyncio.run(pack.aclose())


def test_config_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="exactly one of command"):
        UpstreamMCPConfig(name="x")
    with pytest.raises(ValueError, match="must be 1-64"):
        UpstreamMCPConfig(name="bad name", command="x")
    with pytest.raises(ValueError, match="headers are for HTTP"):
        UpstreamMCPConfig(name="x", command="y", headers={"a": "b"})
    with pytest.raises(UpstreamBuildError, match="configured twice"):
        upstream_mcp_pack([{"name": "a", "command": "x"}, {"name": "a", "command": "y"}])


# --- calls ------------------------------------------------------------------------------------------


async def test_calls_results_and_enum_rebinding(served: tuple[UpstreamMCPPack, codemode.Server]) -> None:
    _, server = served
    value = await server.execute(
        run('return [test.add_numbers(a=2, b=40), test.shout(text="Hi", mode="lower")]'), subject=SUBJECT
    )
    assert value == [{"total": 42, "terms": [2, 40]}, {"text": "hi"}]
    with pytest.raises(codemode.InvalidArguments) as info:
        await server.execute(run('return test.shout(text="x", mode="loud")'), subject=SUBJECT)
    assert codemode.common.errors.client_text(info.value) == (
        'invalid capability arguments: argument "mode" must be one of "upper", "lower"'
    )


async def test_is_error_text_is_disclosed_bounded(served: tuple[UpstreamMCPPack, codemode.Server]) -> None:
    _, server = served
    with pytest.raises(codemode.CapabilityFailure) as info:
        await server.execute(
            run('return test.fail(message="no such repo\\x01" + "z" * 400)'), subject=SUBJECT
        )
    text = codemode.common.errors.client_text(info.value)
    # marked as the upstream's, its own text (MCPServer prefixes it), one line, short
    assert text.startswith("capability failed: test: Error executing tool fail: no such repo z")
    assert len(info.value.detail.encode()) <= len("test: ") + 160  # type: ignore[union-attr]


async def test_upstream_dying_mid_call_fails_plainly_and_reconnects(
    served: tuple[UpstreamMCPPack, codemode.Server], caplog: pytest.LogCaptureFixture
) -> None:
    pack, server = served
    first = await server.execute(run("return test.pid()"), subject=SUBJECT)
    with (
        caplog.at_level(logging.WARNING, logger="codemode.capabilities.mcp_upstream"),
        pytest.raises(codemode.CapabilityFailure) as info,
    ):
        await server.execute(run("return test.die()"), subject=SUBJECT)
    assert codemode.common.errors.client_text(info.value) == "capability failed"
    assert any("mcp:test:die failed (will reconnect)" in r.getMessage() for r in caplog.records)
    second = await server.execute(run("return test.pid()"), subject=SUBJECT)
    assert second["result"] != first["result"]
    assert pack.pools["test"].starts == 2


async def test_slow_upstream_past_the_deadline_is_cancelled_upstream(
    served: tuple[UpstreamMCPPack, codemode.Server], markers: Path
) -> None:
    _, server = served
    t0 = time.monotonic()
    with pytest.raises(codemode.ResourceLimit):
        await server.execute(run('return test.slow(seconds=60, tag="deadline")'), subject=SUBJECT)
    assert time.monotonic() - t0 < 10
    assert (markers / "started-deadline").exists()
    assert await wait_for(markers / "cancelled-deadline"), "upstream never saw notifications/cancelled"


async def test_per_call_timeout_is_a_plain_failure_and_cancels(markers: Path) -> None:
    pack = upstream_mcp_pack([stdio_config(markers, timeout=0.5)])
    server = await build(pack)
    try:
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(run('return test.slow(seconds=60, tag="timeout")'), subject=SUBJECT)
        assert codemode.common.errors.client_text(info.value) == "capability failed"
        assert await wait_for(markers / "cancelled-timeout")
        # a timeout is not a transport failure: the same connection serves the next call
        assert await server.execute(run("return test.add_numbers(a=1, b=1)"), subject=SUBJECT) == {
            "total": 2,
            "terms": [1, 1],
        }
        assert pack.pools["test"].starts == 1
    finally:
        await pack.aclose()
        await server.aclose()


async def test_client_cancelling_execute_cancels_upstream(
    served: tuple[UpstreamMCPPack, codemode.Server], markers: Path
) -> None:
    _, server = served
    task = asyncio.create_task(
        server.execute(run('return test.slow(seconds=60, tag="client")'), subject=SUBJECT)
    )
    assert await wait_for(markers / "started-client")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_for(markers / "cancelled-client")


REGO = """package gateway
import rego.v1

default allow := false

# Read-only tools of the "test" upstream are allowed for everyone...
allow if input.capability.id in {"mcp:test:addNumbers", "mcp:test:pid"}

# ...shout only in lower case, and only for alice.
allow if {
    input.capability.name == "test.shout"
    input.arguments.mode == "lower"
    input.subject.id == "alice"
}
"""


async def test_rego_policy_allows_one_tool_and_denies_another(markers: Path) -> None:
    pack = upstream_mcp_pack([stdio_config(markers)])
    server = await build(pack, authorizer=RegoAuthorizer("data.gateway.allow", {"gateway.rego": REGO}))
    try:
        assert await server.execute(run("return test.add_numbers(a=1, b=2)"), subject=SUBJECT) == {
            "total": 3,
            "terms": [1, 2],
        }
        ok = await server.execute(run('return test.shout(text="A", mode="lower")'), subject=SUBJECT)
        assert ok == {"text": "a"}
        for source, subject in [
            ('return test.shout(text="a", mode="upper")', SUBJECT),
            ('return test.shout(text="a", mode="lower")', authz.Subject(id="bob")),
            ('return test.fail(message="x")', SUBJECT),
        ]:
            with pytest.raises(codemode.PermissionDenied):
                await server.execute(run(source), subject=subject)
    finally:
        await pack.aclose()
        await server.aclose()


# --- streamable HTTP ----------------------------------------------------------------------------------


@pytest.fixture
def http_upstream(tmp_path: Path, markers: Path) -> Iterator[tuple[str, Path]]:
    token = tmp_path / "token"
    token.write_text("s3cret-upstream-token\n")
    port = free_port()
    with start_http_upstream(port, token, markers):
        yield f"http://127.0.0.1:{port}/mcp", token


async def test_streamable_http_upstream_with_secret_header(http_upstream: tuple[str, Path]) -> None:
    url, token = http_upstream
    bearer = token.parent / "bearer"
    bearer.write_text("Bearer " + token.read_text())
    cfg = {"name": "web", "url": url, "headers_from_file": {"Authorization": str(bearer)}, "exclude": ["die"]}
    pack = upstream_mcp_pack([cfg])
    server = await build(pack)
    try:
        value = await server.execute(run("return web.add_numbers(a=3, b=4)"), subject=SUBJECT)
        assert value == {"total": 7, "terms": [3, 4]}
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(run('return web.fail(message="nope")'), subject=SUBJECT)
        assert (
            codemode.common.errors.client_text(info.value)
            == "capability failed: web: Error executing tool fail: nope"
        )
        shown = repr([server.describe(c.name).to_dict() for c in server.capabilities])
        shown += repr(server.search("add numbers")) + repr(server.capabilities)
        assert "s3cret" not in shown
    finally:
        await pack.aclose()
        await server.aclose()


async def test_http_upstream_rejects_a_wrong_secret(http_upstream: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = http_upstream
    wrong = tmp_path / "wrong"
    wrong.write_text("Bearer nope\n")
    pack = upstream_mcp_pack(
        [{"name": "web", "url": url, "headers_from_file": {"Authorization": str(wrong)}}]
    )
    with pytest.raises(UpstreamBuildError, match="cannot connect and list tools") as info:
        await pack.acapabilities()
    assert "nope" not in str(info.value)


async def test_missing_secret_env_names_the_variable(http_upstream: tuple[str, Path]) -> None:
    url, _ = http_upstream
    pack = upstream_mcp_pack(
        [{"name": "web", "url": url, "headers_from_env": {"Authorization": "NO_SUCH_VAR_X"}}]
    )
    with pytest.raises(UpstreamBuildError, match="NO_SUCH_VAR_X"):
        await pack.acapabilities()


# --- real third-party servers -------------------------------------------------------------------------


async def shout_past_the_limit(server: codemode.Server, namespace: str) -> None:
    """With ``max_message_bytes`` = 64 KiB: a 20 KB answer passes, a 70 KB one is a plain
    ``capability failed``, and the next call works."""
    small = await server.execute(run(f'return {namespace}.shout(text="a" * 20000)'), subject=SUBJECT)
    assert small == {"text": "A" * 20000}
    with pytest.raises(codemode.CapabilityFailure) as info:
        await server.execute(run(f'return {namespace}.shout(text="a" * 70000)'), subject=SUBJECT)
    assert codemode.common.errors.client_text(info.value) == "capability failed"
    assert await server.execute(run(f'return {namespace}.shout(text="b")'), subject=SUBJECT) == {"text": "B"}


async def test_stdio_upstream_answer_over_the_message_limit_fails_that_call_only(
    markers: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Over stdio the server's output goes through the bounded relay: a message past
    ``max_message_bytes`` is dropped and its call answered with an error (a plain ``capability
    failed``); the same server goes on serving, a call of another tenant in flight included."""
    pack = upstream_mcp_pack([stdio_config(markers, max_message_bytes=64 * 1024)])
    server = await build(pack)
    try:
        first = await server.execute(run("return test.pid()"), subject=SUBJECT)
        bob = asyncio.create_task(
            server.execute(run('return test.slow(seconds=1.5, tag="bob")'), subject=authz.Subject(id="bob"))
        )
        assert await wait_for(markers / "started-bob")
        await shout_past_the_limit(server, "test")
        assert "dropped by the codemode relay" in caplog.text  # its answer, not the call's timeout
        assert await bob == {"result": "done"}
        assert await server.execute(run("return test.pid()"), subject=SUBJECT) == first  # the same server
    finally:
        await pack.aclose()
        await server.aclose()


def test_the_command_check_finds_programs_as_the_process_would(tmp_path: Path) -> None:
    """``_check_command`` against ``subprocess`` itself, case by case: relative PATH entries and the
    empty entry are taken from cwd, an empty PATH searches cwd only, a directory cannot run."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srv").write_text("#!/bin/sh\necho ok\n")
    (tmp_path / "bin" / "srv").chmod(0o755)
    (tmp_path / "dir").mkdir()
    cases = [("srv", "bin"), ("srv", ""), ("srv", "bin:/usr/bin"), ("dir", str(tmp_path)), ("sh", "")]
    for command, path in cases:
        try:
            subprocess.run([command], cwd=tmp_path, env={"PATH": path}, capture_output=True, check=False)
            expected: type[Exception] | None = None
        except OSError as exc:
            expected = type(exc)
        try:
            _check_command(command, path, str(tmp_path))
            found: type[Exception] | None = None
        except OSError as exc:
            found = type(exc)
        assert found is expected, (command, path, found, expected)


async def test_stdio_command_that_does_not_exist_is_named(tmp_path: Path) -> None:
    pack = upstream_mcp_pack([{"name": "gone", "command": "codemode-no-such-server", "connect_timeout": 5.0}])
    with pytest.raises(UpstreamBuildError, match="cannot connect and list tools: FileNotFoundError") as info:
        await pack.acapabilities()
    assert "codemode-no-such-server" in str(info.value)
    relative = upstream_mcp_pack([{"name": "gone", "command": "./server.py", "cwd": str(tmp_path)}])
    with pytest.raises(UpstreamBuildError, match="No such file or directory"):
        await relative.acapabilities()
    (tmp_path / "server.py").write_text("print('not executable')\n")
    with pytest.raises(UpstreamBuildError, match=r"PermissionError: .*Permission denied"):
        await relative.acapabilities()


@pytest.mark.parametrize("json_response", [True, False], ids=["json-body", "sse-event"])
async def test_http_upstream_answer_over_the_message_limit_fails_that_call_only(
    tmp_path: Path, markers: Path, json_response: bool
) -> None:
    """A tenant steering an upstream tool's answer past ``max_message_bytes`` gets a plain
    ``capability failed``; the host stops reading there, and the next call works."""
    token = tmp_path / "token"
    token.write_text("s3cret-upstream-token\n")
    bearer = tmp_path / "bearer"
    bearer.write_text("Bearer s3cret-upstream-token\n")
    port = free_port()
    with start_http_upstream(port, token, markers, json_response=json_response):
        cfg = {
            "name": "web",
            "url": f"http://127.0.0.1:{port}/mcp",
            "headers_from_file": {"Authorization": str(bearer)},
            "max_message_bytes": 64 * 1024,
        }
        pack = upstream_mcp_pack([cfg])
        server = await build(pack)
        try:
            await shout_past_the_limit(server, "web")
        finally:
            await pack.aclose()
            await server.aclose()


async def test_mcp_server_time_from_pypi() -> None:
    pack = upstream_mcp_pack(
        [
            {
                "name": "time",
                "command": sys.executable,
                "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
            }
        ]
    )
    server = await build(pack)
    try:
        assert sorted(c.name for c in server.capabilities) == ["time.convert_time", "time.get_current_time"]
        value = await server.execute(
            run(
                'now = time.get_current_time(timezone="Asia/Tokyo")\n'
                'c = time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Asia/Kolkata")\n'
                "return [now['timezone'], c['target']['datetime'][11:16], c['time_difference']]"
            ),
            subject=SUBJECT,
        )
        assert value == ["Asia/Tokyo", "17:30", "+5.5h"]
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(
                run('return time.get_current_time(timezone="Mars/Olympus")'), subject=SUBJECT
            )
        assert "Mars/Olympus" in codemode.common.errors.client_text(info.value)
    finally:
        await pack.aclose()
        await server.aclose()


# The first run installs an npm package (up to 300 s) before the test itself.
@pytest.mark.timeout(600)
async def test_server_everything_from_npm() -> None:
    command = everything_command()
    pack = upstream_mcp_pack([{"name": "everything", "command": command[0], "args": [*command[1:], "stdio"]}])
    server = await build(pack)
    try:
        names = {c.name for c in server.capabilities}
        assert {"everything.echo", "everything.get_sum", "everything.get_structured_content"} <= names
        report = pack.reports["everything"]
        print(f"server-everything: {len(report.converted)} converted, skipped: {report.skipped}")
        sig = {c.name: c.signature for c in server.capabilities}
        assert sig["everything.get_sum"] == "everything.get_sum(*, a: float, b: float)"
        assert '"New York"' in sig["everything.get_structured_content"]
        value = await server.execute(
            run(
                'e = everything.echo(message="hi")\n'
                "s = everything.get_sum(a=2, b=3.5)\n"
                'w = everything.get_structured_content(location="Chicago")\n'
                "return [e['text'], s['text'], sorted(w.keys())]"
            ),
            subject=SUBJECT,
        )
        assert value[0] == "Echo: hi"
        assert "5.5" in value[1]
        assert "temperature" in value[2]
        with pytest.raises(codemode.InvalidArguments):
            await server.execute(
                run('return everything.get_structured_content(location="Paris")'), subject=SUBJECT
            )
    finally:
        await pack.aclose()
        await server.aclose()


# --- served by the CLI ----------------------------------------------------------------------------------


async def test_cli_serves_an_upstream_pack_file_over_stdio(markers: Path) -> None:
    """``codemode serve --stdio --pack ./file.py:pack`` with the upstream pack: discovery runs while
    the CLI loads packs (before its event loop), calls connect again on the serving loop."""
    import json

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from tests.support.mcp_client import REPO, child_env, cli_command

    pack_file = REPO / "tests" / "benchmarks" / "upstream_bench_pack.py"
    argv = cli_command("serve", "--stdio", "--allow-all", "--pack", f"{pack_file}:pack")
    env = child_env(BENCH_UPSTREAM_MCP=json.dumps([stdio_config(markers)]))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with Client(params, mode="legacy") as client:
        found = await client.call_tool("search_api", {"query": "add two integers"})
        assert "test.add_numbers" in found.content[0].text  # type: ignore[union-attr]
        result = await client.call_tool("execute", {"source": run("return test.add_numbers(a=20, b=22)")})
        assert not result.is_error, result
        assert '"total":42' in result.content[0].text.replace(" ", "")  # type: ignore[union-attr]
