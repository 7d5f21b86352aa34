"""Per-subject sessions and their bounds, with our test MCP server (``upstream_mcp_server.py``) over
stdio and streamable HTTP, through the execute path: a process and a directory of its own per
subject, headers per subject for HTTP, ``max_sessions``, idle and lifetime eviction, the per-minute
call and byte bounds (``resource limit exceeded: quota``), and refused configurations.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode_capabilities.mcp.tenancy import subject_key
from codemode_capabilities.mcp.upstream import UpstreamMCPConfig, UpstreamMCPPack, upstream_mcp_pack
from tests.support.upstreams import SERVER_SCRIPT, free_port, start_http_upstream

pytestmark = pytest.mark.slow

ALICE, BOB, CAROL = authz.Subject("alice"), authz.Subject("bob"), authz.Subject("carol")


def run(source: str) -> str:
    return "def main():\n" + "".join(f"    {line}\n" for line in source.splitlines())


def stdio(**extra: Any) -> dict[str, Any]:
    return {"name": "test", "command": sys.executable, "args": [str(SERVER_SCRIPT), "stdio"], **extra}


async def serve(pack: UpstreamMCPPack) -> codemode.Server:
    limits = codemode.Limits(max_execution_time=20.0)
    return (
        codemode.Builder(authorizer=authz.allow_all(), limits=limits)
        .register(*await pack.acapabilities())
        .build()
    )


async def outcome(server: codemode.Server, source: str, subject: authz.Subject) -> Any:
    try:
        return await server.execute(run(source), subject=subject)
    except codemode.CodeModeError as exc:
        return client_text(exc)


async def test_each_subject_gets_its_own_process_and_directory(tmp_path: Path) -> None:
    """``{subject_dir}`` in env: the server's markers land in the subject's own directory (0700),
    named by its key; the host's discovery process got ``host``; ``{subject_key}`` in args."""
    pack = upstream_mcp_pack(
        [
            stdio(
                env={"UPSTREAM_MARKERS": "{subject_dir}"}, args=[str(SERVER_SCRIPT), "stdio", "{subject_key}"]
            )
        ],
        data_dir=tmp_path,
    )
    server = await serve(pack)
    try:
        pids = {s.id: await server.execute(run("return test.pid()"), subject=s) for s in (ALICE, BOB)}
        assert pids["alice"] != pids["bob"]
        assert await server.execute(run("return test.pid()"), subject=ALICE) == pids["alice"]  # reused
        await server.execute(run('return test.slow(seconds=0, tag="mine")'), subject=ALICE)
        base = tmp_path / "upstreams" / "test"
        assert (base / subject_key("alice") / "started-mine").exists()
        assert not (base / subject_key("bob") / "started-mine").exists()
        assert sorted(p.name for p in base.iterdir()) == sorted(
            ["host", subject_key("alice"), subject_key("bob")]
        )
        assert all(p.stat().st_mode & 0o777 == 0o700 for p in base.iterdir())
        assert pack.pools["test"].starts == 3  # the host's (closed after discovery) and one each
        assert pack.pools["test"].host is None
    finally:
        await pack.aclose()
        await server.aclose()


async def test_a_planted_symbolic_link_is_never_followed(tmp_path: Path) -> None:
    """A subject directory that exists as a symbolic link (to another subject's) is refused: the
    call fails plainly and the server is not started on the other directory."""
    base = tmp_path / "upstreams" / "test"
    (base / subject_key("alice")).mkdir(parents=True)
    os.symlink(base / subject_key("alice"), base / subject_key("bob"))
    pack = upstream_mcp_pack([stdio(env={"UPSTREAM_MARKERS": "{subject_dir}"})], data_dir=tmp_path)
    server = await serve(pack)
    try:
        assert await outcome(server, "return test.pid()", BOB) == "capability failed"
        assert isinstance(await outcome(server, "return test.pid()", ALICE), dict)
    finally:
        await pack.aclose()
        await server.aclose()


async def test_max_sessions_evicts_the_idle_and_refuses_when_all_are_busy(tmp_path: Path) -> None:
    pack = upstream_mcp_pack([stdio(max_sessions=2, env={"UPSTREAM_MARKERS": str(tmp_path)})])
    server = await serve(pack)
    busy: list[asyncio.Task[Any]] = []

    async def in_a_call(subject: authz.Subject) -> None:
        source = f'return test.slow(seconds=60, tag="{subject.id}")'
        busy.append(asyncio.create_task(outcome(server, source, subject)))
        while not (tmp_path / f"started-{subject.id}").exists():
            await asyncio.sleep(0.05)

    try:
        alice = await server.execute(run("return test.pid()"), subject=ALICE)
        await in_a_call(BOB)
        # carol takes the place of alice's session (idle); bob's is in a call
        assert isinstance(await outcome(server, "return test.pid()", CAROL), dict)
        assert sorted(pack.pools["test"].subjects) == ["bob", "carol"]
        await in_a_call(CAROL)
        refused = await outcome(server, "return test.pid()", authz.Subject("dave"))
        assert refused == "resource limit exceeded: concurrency"
        for task in busy:  # the calls end (cancelled upstream); their sessions become idle
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)
        while any(s.busy for s in pack.pools["test"].subjects.values()):  # settled on the pack's loop
            await asyncio.sleep(0.05)
        again = await server.execute(run("return test.pid()"), subject=ALICE)
        assert again != alice  # a new process: alice's first one was closed, never reused
    finally:
        await pack.aclose()
        await server.aclose()


async def test_idle_and_old_sessions_are_closed(tmp_path: Path) -> None:
    pack = upstream_mcp_pack([stdio(idle_timeout=0.3, max_session_seconds=60)])
    server = await serve(pack)
    try:
        first = await server.execute(run("return test.pid()"), subject=ALICE)
        for _ in range(400):
            if not pack.pools["test"].subjects:
                break
            await asyncio.sleep(0.05)
        assert not pack.pools["test"].subjects  # closed by the sweep
        assert await server.execute(run("return test.pid()"), subject=ALICE) != first
    finally:
        await pack.aclose()
        await server.aclose()
    old = upstream_mcp_pack([stdio(max_session_seconds=0.2)])
    server = await serve(old)
    try:
        first = await server.execute(run("return test.pid()"), subject=ALICE)
        await asyncio.sleep(0.3)
        assert await server.execute(run("return test.pid()"), subject=ALICE) != first
    finally:
        await old.aclose()
        await server.aclose()


async def test_calls_and_bytes_per_minute_are_bounded_per_subject() -> None:
    pack = upstream_mcp_pack([stdio(max_calls_per_minute=3, max_sent_bytes_per_minute=10_000)])
    server = await serve(pack)
    try:
        for _ in range(3):
            assert await outcome(server, "return test.add_numbers(a=1, b=2)", ALICE) == {
                "total": 3,
                "terms": [1, 2],
            }
        assert (
            await outcome(server, "return test.add_numbers(a=1, b=2)", ALICE)
            == "resource limit exceeded: quota"
        )
        assert await outcome(server, "return test.add_numbers(a=1, b=2)", BOB) == {
            "total": 3,
            "terms": [1, 2],
        }
        big = 'return test.shout(text="a" * 20000)'
        assert await outcome(server, big, BOB) == "resource limit exceeded: quota"  # nothing sent
    finally:
        await pack.aclose()
        await server.aclose()
    returned = upstream_mcp_pack([stdio(max_returned_bytes_per_minute=50_000)])
    server = await serve(returned)
    try:
        assert await outcome(server, 'return len(test.shout(text="a" * 60000)["text"])', ALICE) == 60000
        assert await outcome(server, 'return test.shout(text="b")', ALICE) == "resource limit exceeded: quota"
        assert await outcome(server, 'return test.shout(text="b")', BOB) == {"text": "B"}
    finally:
        await returned.aclose()
        await server.aclose()


@pytest.fixture
def http_upstream(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    markers = tmp_path / "markers"
    markers.mkdir()
    tokens = tmp_path / "tokens"
    tokens.write_text("host-token\ntok-a\ntok-b\n")
    port = free_port()
    with start_http_upstream(port, tokens, markers):
        yield f"http://127.0.0.1:{port}/mcp", markers, tmp_path


async def test_http_upstreams_hear_who_is_calling_from_the_host_only(
    http_upstream: tuple[str, Path, Path],
) -> None:
    """Per-subject headers: a template with the percent-encoded id and a token per subject from a
    file. Discovery uses the host's own token; a subject without a token gets a plain failure; a
    program cannot choose either (headers are not arguments)."""
    url, markers, where = http_upstream
    (where / "host").write_text("Bearer host-token\n")
    (where / "subjects.json").write_text(json.dumps({"alice": "Bearer tok-a", "bob/../x": "Bearer tok-b"}))
    cfg = {
        "name": "web",
        "url": url,
        "headers_from_file": {"Authorization": str(where / "host")},
        "subject_headers": {"X-Tenant": "{subject}"},
        "subject_headers_from_file": {"authorization": str(where / "subjects.json")},
        "exclude": ["die"],
    }
    pack = upstream_mcp_pack([cfg])
    server = await serve(pack)
    try:
        odd = authz.Subject("bob/../x")
        assert await outcome(server, "return web.add_numbers(a=1, b=1)", ALICE) == {
            "total": 2,
            "terms": [1, 1],
        }
        assert await outcome(server, "return web.add_numbers(a=1, b=1)", odd) == {"total": 2, "terms": [1, 1]}
        assert await outcome(server, "return web.add_numbers(a=1, b=1)", CAROL) == "capability failed"
        seen = sorted(p.name for p in markers.iterdir() if p.name.startswith("tenant-"))
        assert seen == ["tenant-alice-tok-a", "tenant-bob%2F..%2Fx-tok-b"]
    finally:
        await pack.aclose()
        await server.aclose()


async def test_a_frozen_http_upstream_is_dropped_as_stuck_and_the_next_call_reconnects(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The HTTP server stops answering (``SIGSTOP``: no answer to the call, none to the ping): at
    ``timeout + stuck_grace`` the host drops the session (it cannot stop a remote server); once the
    server answers again the next call opens a new session to the same process."""
    markers = tmp_path / "markers"
    markers.mkdir()
    (tmp_path / "tokens").write_text("host-token\n")
    port = free_port()
    with start_http_upstream(port, tmp_path / "tokens", markers) as proc:
        cfg = {
            "name": "web",
            "url": f"http://127.0.0.1:{port}/mcp",
            "headers": {"Authorization": "Bearer host-token"},
            "tenancy": "shared",
            "timeout": 1.0,
            "stuck_grace": 1.0,
            "exclude": ["die"],
        }
        pack = upstream_mcp_pack([cfg])
        server = await serve(pack)
        try:
            first = await outcome(server, "return web.pid()", ALICE)
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                assert await outcome(server, "return web.add_numbers(a=1, b=1)", ALICE) == "capability failed"
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            assert "stuck: a call got no answer within timeout (1 s)" in caplog.text
            assert await outcome(server, "return web.pid()", BOB) == first
            assert pack.pools["web"].starts == 2
        finally:
            await pack.aclose()
            await server.aclose()


def test_configurations_that_cannot_be_per_subject_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\['\{subject_dir\}'\] need tenancy = \"per_subject\""):
        UpstreamMCPConfig(name="x", command="y", tenancy="shared", env={"A": "{subject_dir}/f"})
    with pytest.raises(ValueError, match="subject_headers need tenancy"):
        UpstreamMCPConfig(name="x", url="http://h/mcp", tenancy="shared", subject_headers={"X": "{subject}"})
    with pytest.raises(ValueError, match="headers are for HTTP"):
        UpstreamMCPConfig(name="x", command="y", subject_headers={"X": "{subject}"})
    with pytest.raises(ValueError, match="in both subject_headers and subject_headers_from_file"):
        UpstreamMCPConfig(
            name="x",
            url="http://h/mcp",
            subject_headers={"X-A": "1"},
            subject_headers_from_file={"x-a": "/f"},
        )
    # Only the exact spellings are placeholders; other braces are passed as written.
    cfg = UpstreamMCPConfig(name="x", command="y", args=["{subject}", "{subject_dir", '{"a": 1}'])
    assert cfg.placeholders == set() and not cfg.subject_specific
