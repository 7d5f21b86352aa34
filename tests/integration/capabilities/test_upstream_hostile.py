"""A hostile stdio upstream (``hostile_mcp_server.py``) must not wedge the gateway or speak for it.

Through the real execute path (process runtime) with two tenants, mostly on one *shared* upstream
(the worst case: one server for everyone):

* one line of invalid UTF-8 used to stop every later call of every tenant until the server exited
  (the MCP client's reader stops at the first invalid byte and the session was never marked dead);
* the server's error text reached the client verbatim (host paths, a spoofed login link, lines),
  and later still with the configured credential it quoted;
* a server that dies is started again on the next call, the host says why, and the restarts are
  charged to the tenant whose call preceded them: that tenant is refused once past
  ``max_restarts_per_minute``, the others are not (before: one tenant's crashes refused everyone);
* a server wedged by one call (it answers nothing, not even a ping) is stopped and started again
  (before: a timeout never marked a session dead, so every later call of every tenant timed out);
* a subject whose server never starts gets no more starts than the bound (before: one per call);
* ``process_cpu_seconds`` and ``process_tree_memory_bytes`` bound what one server can take.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.packs.health import upstream_restarts
from codemode_capabilities.mcp.tenancy import subject_key
from codemode_capabilities.mcp.upstream import UpstreamMCPPack, upstream_mcp_pack
from tests.support.servers import FOLDER as SERVERS

pytestmark = pytest.mark.slow

HOSTILE = SERVERS / "hostile_mcp_server.py"
ALICE, BOB, CAROL = authz.Subject("alice"), authz.Subject("bob"), authz.Subject("carol")


def run(source: str) -> str:
    return "def main():\n" + "".join(f"    {line}\n" for line in source.splitlines())


def hostile(**extra: Any) -> dict[str, Any]:
    return {"name": "hostile", "command": sys.executable, "args": [str(HOSTILE)], "timeout": 5.0, **extra}


@pytest.fixture
async def shared() -> AsyncIterator[tuple[UpstreamMCPPack, codemode.Server]]:
    pack = upstream_mcp_pack([hostile(tenancy="shared")])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        yield pack, server
    finally:
        await pack.aclose()
        await server.aclose()


async def test_invalid_utf8_from_the_upstream_wedges_no_one(
    shared: tuple[UpstreamMCPPack, codemode.Server], caplog: pytest.LogCaptureFixture
) -> None:
    pack, server = shared
    garbled = await server.execute(run('return hostile.garble(text="x")'), subject=ALICE)
    assert garbled == {"text": "x\ufffd"}  # the invalid byte replaced, the answer delivered
    echoes = [await server.execute(run(f'return hostile.echo(text="{i}")'), subject=BOB) for i in range(5)]
    assert echoes == [{"text": str(i)} for i in range(5)]
    assert pack.pools["hostile"].starts == 1  # nothing had to be restarted
    assert "timed out" not in caplog.text


async def test_upstream_error_text_is_marked_one_line_without_urls_or_paths(
    shared: tuple[UpstreamMCPPack, codemode.Server],
) -> None:
    _, server = shared
    with pytest.raises(codemode.CapabilityFailure) as info:
        await server.execute(run("return hostile.leak()"), subject=ALICE)
    text = client_text(info.value)
    assert text == (
        'capability failed: hostile: Traceback (most recent call last): File "[path]", line 12 Access '
        "denied - path outside allowed directories: [path] not in [path], [path]. Session expired: re..."
    )
    for leak in ("/etc", "site-packages", "tzdata", "alice", "http", "evil", "Users", "\n"):
        assert leak not in text


async def test_a_dead_upstream_is_started_again_and_the_host_says_why(
    shared: tuple[UpstreamMCPPack, codemode.Server], caplog: pytest.LogCaptureFixture
) -> None:
    pack, server = shared
    first = await server.execute(run("return hostile.pid()"), subject=BOB)
    restarts = upstream_restarts().get("hostile", 0)
    with caplog.at_level(logging.WARNING, logger="codemode.capabilities.mcp_upstream"):
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(run("return hostile.crash()"), subject=ALICE)
        assert client_text(info.value) == "capability failed"
        again = await server.execute(run("return hostile.pid()"), subject=BOB)
    assert again != first and pack.pools["hostile"].starts == 2
    assert "the server ended the connection" in caplog.text
    # One session ended: codemode_upstream_restarts_total{upstream="hostile"} counts one.
    assert upstream_restarts().get("hostile", 0) == restarts + 1


async def test_restarts_are_charged_to_the_tenant_who_crashes_the_server_not_to_everyone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``max_restarts_per_minute = 2``, alice crashing the shared server over and over gets it
    started twice more; then her calls fail plainly, without another start, until the minute has
    passed, and the host log says so. Bob is not refused: his next call starts the server again
    (before, the bound applied to the session: after alice's three crashes every tenant's calls
    failed for a minute, so any tenant who could crash the server could deny all the others)."""
    pack = upstream_mcp_pack([hostile(tenancy="shared", max_restarts_per_minute=2)])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        for _ in range(3):
            with pytest.raises(codemode.CapabilityFailure):
                await server.execute(run("return hostile.crash()"), subject=ALICE)
        assert pack.pools["hostile"].starts == 3  # the first start and two restarts
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(run('return hostile.echo(text="hi")'), subject=ALICE)
        assert client_text(info.value) == "capability failed"
        assert pack.pools["hostile"].starts == 3  # refused without a start
        assert f"3 restarts in the last minute charged to subject {subject_key('alice')}" in caplog.text
        assert await server.execute(run('return hostile.echo(text="hi")'), subject=BOB) == {"text": "hi"}
        assert pack.pools["hostile"].starts == 4
    finally:
        await pack.aclose()
        await server.aclose()


async def test_a_wedged_shared_server_is_stopped_and_the_others_are_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """alice's call spins in the server's only thread: it answers nothing, not even a ping. At her
    call's ``timeout`` plus ``stuck_grace`` the host stops the server (charged to alice) and bob's
    next call gets a fresh one (before: the session was kept, so every later call timed out)."""
    pack = upstream_mcp_pack([hostile(tenancy="shared", timeout=2.0, stuck_grace=2.0)])
    limits = codemode.Limits(max_execution_time=30.0)
    caps = await pack.acapabilities()
    server = codemode.Builder(authorizer=authz.allow_all(), limits=limits).register(*caps).build()
    try:
        first = await server.execute(run("return hostile.pid()"), subject=BOB)
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(run("return hostile.spin()"), subject=ALICE)
        assert client_text(info.value) == "capability failed"
        assert gone(int(first["text"]))  # stopped before alice's call returned
        again = await server.execute(run("return hostile.pid()"), subject=BOB)
        assert again != first and pack.pools["hostile"].starts == 2
        assert "stuck: a call got no answer within timeout (2 s)" in caplog.text
        assert list(pack.pools["hostile"].charges) == ["alice"]
    finally:
        await pack.aclose()
        await server.aclose()


async def test_a_wedge_is_found_even_when_the_caller_left_before_its_timeout() -> None:
    """alice's execute ends (its deadline) before her call's ``timeout``: the call is abandoned,
    but the session stays under watch until that timeout plus ``stuck_grace``, so a short deadline
    does not hand the wedge to whoever calls next."""
    pack = upstream_mcp_pack([hostile(tenancy="shared", timeout=3.0, stuck_grace=1.0)])
    caps = await pack.acapabilities()
    hurried = codemode.Builder(
        authorizer=authz.allow_all(), limits=codemode.Limits(max_execution_time=1.0)
    ).register(*caps)
    server, short = codemode.Builder(authorizer=authz.allow_all()).register(*caps).build(), hurried.build()
    try:
        first = await server.execute(run("return hostile.pid()"), subject=BOB)
        with pytest.raises(codemode.ResourceLimit):
            await short.execute(run("return hostile.spin()"), subject=ALICE)
        deadline = time.monotonic() + 30
        while not gone(int(first["text"])):
            assert time.monotonic() < deadline, "the wedged server was never stopped"
            await asyncio.sleep(0.2)
        assert await server.execute(run("return hostile.pid()"), subject=BOB) != first
        assert list(pack.pools["hostile"].charges) == ["alice"]
    finally:
        await pack.aclose()
        await server.aclose()
        await short.aclose()


async def test_a_slow_call_on_a_server_that_still_answers_restarts_nothing() -> None:
    """A call that passes its ``timeout`` on a server that answers the ping (it serves others
    meanwhile) fails, and the session is kept: one slow call is not a stuck server."""
    pack = upstream_mcp_pack([hostile(tenancy="shared", timeout=1.0)])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        first = await server.execute(run("return hostile.pid()"), subject=BOB)
        with pytest.raises(codemode.CapabilityFailure):
            await server.execute(run('return hostile.slow(text="3")'), subject=ALICE)
        assert await server.execute(run("return hostile.pid()"), subject=BOB) == first
        assert pack.pools["hostile"].starts == 1 and not pack.pools["hostile"].charges
    finally:
        await pack.aclose()
        await server.aclose()


def gone(pid: int) -> bool:
    """No such process, or a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_process_cpu_seconds_ends_a_server_that_runs_away_with_cpu() -> None:
    """A tool that leaves a thread spinning while the server goes on answering (so it is never
    stuck): ``process_cpu_seconds = 1`` ends the process after one CPU second (``RLIMIT_CPU``);
    the next call starts a new one."""
    pack = upstream_mcp_pack([hostile(process_cpu_seconds=1)])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        first = await server.execute(run("return hostile.pid()"), subject=BOB)
        assert await server.execute(run("return hostile.burn()"), subject=BOB) == {"text": "burning"}
        deadline = time.monotonic() + 30
        while not gone(int(first["text"])):
            assert time.monotonic() < deadline, "still running after 30 s"
            await asyncio.sleep(0.2)
        assert await server.execute(run("return hostile.pid()"), subject=BOB) != first
    finally:
        await pack.aclose()
        await server.aclose()


async def test_a_configured_credential_echoed_in_an_upstream_error_is_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/reference/errors.md: ``each configured credential value [redacted]``. The MCP pack called
    ``upstream_error_text`` without ``secrets=``, so a credential from ``env_from_host`` that the
    upstream quoted in an error reached the tenant."""
    secret = "sk-live-4f9a1c2e7b"
    monkeypatch.setenv("HOSTILE_UPSTREAM_KEY", secret)
    pack = upstream_mcp_pack([hostile(env_from_host={"API_KEY": "HOSTILE_UPSTREAM_KEY"})])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(run('return hostile.env_error(text="API_KEY")'), subject=BOB)
        text = client_text(info.value)
        assert (
            text
            == "capability failed: hostile: 401 Unauthorized: key [redacted] is not valid for this account"
        )
    finally:
        await pack.aclose()
        await server.aclose()


# Serves for the host's discovery session ({subject_key} is "host"), exits at once for a subject.
FAILS_FOR_SUBJECTS = (
    "import runpy, sys; sys.exit(3) if sys.argv[1] != 'host' else None; "
    "sys.argv = [sys.argv[2]]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


async def test_a_subject_whose_server_never_starts_gets_no_more_starts_than_the_bound() -> None:
    """``max_restarts_per_minute = 2``: a subject's server that exits before ``initialize`` was
    started again on every call (10 calls, 10 processes): the bound applied only once a session
    had connected. Failed starts count now: 3 processes, then plain refusals."""
    pack = upstream_mcp_pack(
        [hostile(args=["-c", FAILS_FOR_SUBJECTS, "{subject_key}", str(HOSTILE)], max_restarts_per_minute=2)]
    )
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        outcomes = set()
        for _ in range(10):
            try:
                outcomes.add(json.dumps(await server.execute(run("return hostile.pid()"), subject=BOB)))
            except codemode.CodeModeError as exc:
                outcomes.add(client_text(exc))
        assert outcomes == {"capability failed"}
        assert pack.pools["hostile"].subjects["bob"].attempts == 3
    finally:
        await pack.aclose()
        await server.aclose()


# Starts slowly (4 s) once the file argv[1] exists: the server's restarts take time.
SLOW_START = (
    "import os, runpy, sys, time; time.sleep(4) if os.path.exists(sys.argv[1]) else None; "
    "sys.argv = [sys.argv[2]]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


async def test_a_tenant_who_leaves_during_restarts_does_not_use_up_everyones_starts(tmp_path: Path) -> None:
    """A shared server's own failed starts are charged to nobody in particular (past the bound
    everyone is refused), but a start cut short because its caller left (bob cancels his
    execute while the server restarts) is bob's alone: carol is still served."""
    flag = tmp_path / "slow"
    pack = upstream_mcp_pack(
        [
            hostile(
                tenancy="shared",
                args=["-c", SLOW_START, str(flag), str(HOSTILE)],
                max_restarts_per_minute=2,
                connect_timeout=10.0,
            )
        ]
    )
    limits = codemode.Limits(max_execution_time=30.0)
    caps = await pack.acapabilities()
    server = codemode.Builder(authorizer=authz.allow_all(), limits=limits).register(*caps).build()
    try:
        flag.touch()
        with pytest.raises(codemode.CapabilityFailure):
            await server.execute(run("return hostile.crash()"), subject=ALICE)
        for _ in range(3):
            left = asyncio.get_running_loop().create_task(
                server.execute(run("return hostile.pid()"), subject=BOB)
            )
            await asyncio.sleep(2.0)  # the restart (4 s) is under way
            left.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await left
        charges = pack.pools["hostile"].charges
        deadline = time.monotonic() + 10  # the pack's loop learns of each cancellation a little later
        while len(charges.get("bob", ())) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len(charges.get("bob", ())) == 3 and None not in charges, charges
        assert "text" in await server.execute(run("return hostile.pid()"), subject=CAROL)
    finally:
        await pack.aclose()
        await server.aclose()


async def test_process_tree_memory_bytes_bounds_what_a_subjects_server_holds_with_its_children() -> None:
    """``process_memory_bytes`` (``RLIMIT_DATA``) is per process: each child of a forking server
    gets the whole amount again (with 64 MiB, four children held 48 MiB each at once).
    ``process_tree_memory_bytes`` bounds the sum: one child passes, four are killed with the
    server (the call fails; the next call starts it again)."""
    pack = upstream_mcp_pack([hostile(process_memory_bytes=64 << 20, process_tree_memory_bytes=160 << 20)])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        one = await server.execute(run('return hostile.hog(text="1")'), subject=BOB)
        assert one == {"text": "1 of 1 children hold 48 MiB each"}
        with pytest.raises(codemode.CapabilityFailure) as info:
            await server.execute(run('return hostile.hog(text="4")'), subject=BOB)
        assert client_text(info.value) == "capability failed"
        assert await server.execute(run('return hostile.hog(text="1")'), subject=BOB) == one
    finally:
        await pack.aclose()
        await server.aclose()


async def test_without_the_tree_bound_each_process_gets_the_memory_bound_again() -> None:
    """What docs/packs.md says of ``process_memory_bytes`` alone: a per-process bound."""
    pack = upstream_mcp_pack([hostile(process_memory_bytes=64 << 20)])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        four = await server.execute(run('return hostile.hog(text="4")'), subject=BOB)
        assert four == {"text": "4 of 4 children hold 48 MiB each"}
    finally:
        await pack.aclose()
        await server.aclose()


async def test_racing_first_calls_of_two_tenants_get_two_processes() -> None:
    pack = upstream_mcp_pack([hostile()])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        got = await asyncio.gather(
            *[server.execute(run("return hostile.pid()"), subject=s) for s in (ALICE, BOB) * 3]
        )
        assert got[0] == got[2] == got[4] and got[1] == got[3] == got[5] and got[0] != got[1], got
    finally:
        await pack.aclose()
        await server.aclose()


async def test_an_evicted_subject_never_lands_on_anothers_session() -> None:
    """max_sessions = 1: bob's first call evicts alice's idle session; alice's next call gets a new
    process, never bob's (and bob's survives until alice evicts it in turn)."""
    pack = upstream_mcp_pack([hostile(max_sessions=1)])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        pids = [
            (await server.execute(run("return hostile.pid()"), subject=subject))["text"]
            for subject in (ALICE, BOB, ALICE, BOB)
        ]
        assert len(set(pids)) == 4, pids  # every take-over started a process of its own
    finally:
        await pack.aclose()
        await server.aclose()


async def test_per_subject_sessions_keep_one_tenants_crash_to_itself() -> None:
    """Under the default tenancy each tenant has its own server: alice crashing hers leaves bob's
    process (and its pid) as it was."""
    pack = upstream_mcp_pack([hostile()])
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        bob_pid = await server.execute(run("return hostile.pid()"), subject=BOB)
        alice_pid = await server.execute(run("return hostile.pid()"), subject=ALICE)
        assert alice_pid != bob_pid
        with pytest.raises(codemode.CapabilityFailure):
            await server.execute(run("return hostile.crash()"), subject=ALICE)
        assert await server.execute(run("return hostile.pid()"), subject=BOB) == bob_pid
    finally:
        await pack.aclose()
        await server.aclose()
