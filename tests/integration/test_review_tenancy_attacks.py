"""Review attacks on the upstream-MCP tenancy work (issue 20 §1, §2 first two bullets).

Each test states the property a multi-tenant operator would expect and asserts it; a test that
FAILS here is an attack that WORKED (see the review report for the evidence). Real parts: the
npm servers ``@modelcontextprotocol/server-memory`` and ``server-filesystem`` under the table
docs/packs.md documents for a multi-tenant service, and a hostile stdio server of our own
(``review_hostile_server.py``), all through the real execute path (process runtime).

Attacks that worked are marked ``xfail(strict=True)`` with the finding's number from the review
report (run with ``--runxfail`` to see them fail); a fix makes them pass (then drop the mark).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.authz.rego import RegoAuthorizer
from codemode.capabilities.mcp_upstream import UpstreamMCPPack, upstream_mcp_pack
from codemode.capabilities.upstream_tenancy import subject_key
from codemode.capabilities.upstreams import upstream_packs
from codemode.common.errors import client_text
from codemode.packs import PackSettings

from .test_upstream_tenancy import EXAMPLE_POLICY, documented_tables
from .upstream_support import filesystem_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ALICE, BOB = authz.Subject("alice"), authz.Subject("bob")
HOSTILE = Path(__file__).with_name("review_hostile_server.py")


def run(source: str) -> str:
    return "def main():\n" + "".join(f"    {line}\n" for line in source.splitlines())


async def attempt(server: codemode.Server, source: str, subject: authz.Subject) -> str:
    try:
        return json.dumps(await server.execute(run(source), subject=subject))
    except codemode.CodeModeError as exc:
        return client_text(exc)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[UpstreamMCPPack, codemode.Server, Path]]:
    """The documented multi-tenant table (memory + files, per_subject, {subject_dir})."""
    pack, _ = upstream_packs(documented_tables())
    data = tmp_path / "data"
    caps = pack.capabilities(PackSettings(environ={}, data_dir=data, multi_tenant=True))
    limits = codemode.Limits(max_execution_time=120.0)
    server = codemode.Builder(authorizer=authz.allow_all(), limits=limits).register(*caps).build()
    try:
        yield pack, server, data
    finally:
        await pack.aclose()
        await server.aclose()


class Heartbeat:
    """Ticks on the running (serving) loop every 20 ms and records the longest gap between ticks."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.last = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            self.longest = max(self.longest, now - self.last)
            self.last = now

    def __enter__(self) -> Heartbeat:
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.longest = max(self.longest, time.monotonic() - self.last)


# --- A1: tenant-controlled upstream error text stalls the serving loop (quadratic regexes) ---------


async def test_a_long_entity_name_in_an_upstream_error_does_not_stall_the_serving_loop(
    served: tuple[UpstreamMCPPack, codemode.Server, Path],
) -> None:
    """server-memory answers ``add_observations`` on a missing entity with ``Entity with name <name>
    not found`` (isError): the name is the tenant's. ``upstream_error_text`` runs its URL/path
    regexes over the whole text on the serving loop, and they are quadratic on a run of letters:
    bob's one call freezes every tenant's requests (and /healthz) for as long as that takes."""
    _, server, _ = served
    n = 150_000
    source = f'memory.add_observations(observations=[{{"entityName": "a" * {n}, "contents": ["x"]}}])'
    with Heartbeat() as beat:
        await asyncio.sleep(0.1)  # the heartbeat is ticking
        started = time.monotonic()
        outcome = await attempt(server, source, BOB)
        took = time.monotonic() - started
    print(f"\nA1: bob's call took {took:.1f} s; longest stall of the serving loop {beat.longest:.1f} s")
    assert outcome.startswith("capability failed: memory: Entity with name aaaa")
    assert beat.longest < 2.0, f"the serving loop stood still for {beat.longest:.1f} s"


# --- A2: configured credentials are not redacted from an MCP upstream's error text ---------------


@pytest.mark.xfail(strict=True, reason="review F3: the MCP pack passes no secrets to upstream_error_text")
async def test_a_configured_credential_echoed_in_an_upstream_error_is_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/reference/errors.md: ``each configured credential value [redacted]``. The MCP pack calls
    ``upstream_error_text(cfg.name, text)`` without ``secrets=``, so a credential from
    ``env_from_host`` (or ``headers_from_env`` / ``headers_from_file`` for HTTP) that the upstream
    quotes in an error reaches the tenant."""
    secret = "sk-live-4f9a1c2e7b"
    monkeypatch.setenv("REVIEW_UPSTREAM_KEY", secret)
    pack = upstream_mcp_pack(
        [
            {
                "name": "api",
                "command": sys.executable,
                "args": [str(HOSTILE)],
                "env_from_host": {"API_KEY": "REVIEW_UPSTREAM_KEY"},
            }
        ]
    )
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        outcome = await attempt(server, 'return api.env_error(name="API_KEY")', BOB)
        print(f"\nA2: client text: {outcome!r}")
        assert outcome.startswith("capability failed: api: 401 Unauthorized")
        assert secret not in outcome, outcome
    finally:
        await pack.aclose()
        await server.aclose()


# --- A3: disk is not bounded by the byte bounds (directory amplification) -------------------------


def disk_bytes(root: Path) -> tuple[int, int]:
    """(allocated bytes, entries) under ``root`` (iterative: the trees here are deeper than Python's
    recursion limit, which ``os.walk`` and ``shutil.rmtree`` of Python 3.11 hit)."""
    total, entries, todo = 0, 0, [str(root)]
    while todo:
        where = todo.pop()
        with os.scandir(where) as it:
            for entry in it:
                total += entry.stat(follow_symlinks=False).st_blocks * 512
                entries += 1
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
    return total, entries


def remove_tree(root: Path) -> None:
    subprocess.run(["rm", "-rf", str(root)], check=True)


@pytest.mark.xfail(
    strict=True, reason="review F4: create_directory turns 4 KB of arguments into ~2,000 directories"
)
async def test_the_byte_bounds_cap_how_fast_a_tenant_fills_the_disk(
    served: tuple[UpstreamMCPPack, codemode.Server, Path],
) -> None:
    """docs/packs.md: the subject directory's size is not bounded, but "the byte bounds above cap how
    fast a subject can fill it". One ``create_directory`` with a 4 KB path of one-letter segments
    makes ~2,000 directories (a 4 KiB block each on ext4): 600 such calls a minute (the call bound;
    2.4 MB of arguments, inside the 4 MiB sent bound) allocate ~4.9 GB a minute and 1.2 M inodes."""
    _, server, data = served
    own = data / "upstreams" / "files" / subject_key("bob")
    segments = (4000 - len(str(own))) // 2  # the whole path within PATH_MAX (4096)
    sent, started = 0, time.monotonic()
    try:
        for first in "xyz":
            path = "/".join([first] + ["a"] * (segments - 1))
            sent += len(json.dumps({"path": path}, separators=(",", ":")))
            outcome = await attempt(server, f'return files.create_directory(path="{path}")', BOB)
            assert "Successfully created directory" in outcome, outcome[:200]
        took = time.monotonic() - started
        used, entries = disk_bytes(own)
    finally:
        remove_tree(own)  # pytest's own clean-up (shutil.rmtree) would hit the recursion limit
    print(f"\nA3: 3 calls in {took:.1f} s")
    print(f"A3: the calls sent {sent} bytes of arguments; the disk grew by {used} bytes, {entries} entries")
    assert used <= 16 * sent, f"{used / sent:.0f}x the bytes sent"


@pytest.mark.xfail(
    strict=True, reason="review F6: shutil.rmtree raises RecursionError on a tenant-made deep tree"
)
async def test_the_pack_removes_its_private_data_dir_whatever_a_tenant_left_there() -> None:
    """Without ``--data-dir`` (``serve --stdio``) the pack keeps subject directories in a private
    temporary directory and ``aclose`` removes it with ``shutil.rmtree(..., ignore_errors=True)``.
    A tenant's deep directory chain (one ``create_directory`` call) is deeper than Python 3.11's
    recursion limit: ``rmtree`` raises ``RecursionError`` (not an ``OSError``: ``ignore_errors``
    does not cover it), so ``aclose`` fails and the directory, with every tenant's files, stays."""
    filesystem = filesystem_command()
    pack, _ = upstream_packs(
        [{"name": "files", "command": filesystem[0], "args": [filesystem[1], "{subject_dir}"]}]
    )
    caps = pack.capabilities(PackSettings(environ={}, multi_tenant=False))
    server = codemode.Builder(authorizer=authz.allow_all()).register(*caps).build()
    private = pack._temp_dir
    assert private is not None
    try:
        own = private / "upstreams" / "files" / subject_key("bob")
        path = "/".join(["a"] * ((4000 - len(str(own))) // 2))
        outcome = await attempt(server, f'return files.create_directory(path="{path}")', BOB)
        assert "Successfully created directory" in outcome, outcome[:200]
        failure: BaseException | None = None
        try:
            await pack.aclose()
        except BaseException as exc:
            failure = exc
        left = private.exists()
        print(f"\nA3b: aclose raised {type(failure).__name__ if failure else None}; directory left: {left}")
        assert failure is None and not left
    finally:
        await server.aclose()
        if private.exists():
            remove_tree(private)


# --- A4: host paths in ordinary results -----------------------------------------------------------


@pytest.mark.xfail(strict=True, reason="review F8: list_allowed_directories returns the host data dir path")
async def test_the_host_data_dir_does_not_reach_a_tenant(
    served: tuple[UpstreamMCPPack, codemode.Server, Path],
) -> None:
    """Error text is stripped of absolute paths, but the documented per-subject filesystem table
    hands the tenant the host's data dir (and its own subject key) in plain results:
    ``list_allowed_directories``, ``search_files``, ``get_file_info``-style answers."""
    _, server, data = served
    outcome = await attempt(server, "return files.list_allowed_directories()", BOB)
    print(f"\nA4: {outcome}")
    assert str(data) not in outcome, outcome


# --- Attacks that FAILED (kept as regression tests) ------------------------------------------------


async def test_a_trailing_space_dotdot_does_not_escape_the_example_policy(tmp_path: Path) -> None:
    """The example policy allows a segment ``.. `` (dots and a space are allowed characters, and it
    is not exactly ``..``); server-filesystem ``trim()``s a path before its containment check. The
    check then sees ``<root>/<bob>/..`` (= the root, allowed), but the operation uses the untrimmed
    path, i.e. a literal entry named ``.. `` inside bob's own directory: no escape."""
    root = (tmp_path / "tenants").resolve()
    alice_dir, bob_dir = root / subject_key("alice"), root / subject_key("bob")
    for where in (alice_dir, bob_dir):
        where.mkdir(parents=True)
    (alice_dir / "diary.txt").write_text("alice-diary")
    pack, server = shared_files(root)
    try:
        outcomes: dict[str, Any] = {}
        for source in [
            f'return files.list_directory(path="{bob_dir}/.. ")',
            f'return files.directory_tree(path="{bob_dir}/.. ")',
            f'return files.search_files(path="{bob_dir}/.. ", pattern="diary")',
            f'return files.list_directory(path="{bob_dir}/x/.. ")',
        ]:
            outcomes[source] = await attempt(server, source, BOB)
        print("\n" + "\n".join(f"{k} -> {v[:160]}" for k, v in outcomes.items()))
        for outcome in outcomes.values():
            assert alice_dir.name not in outcome and "diary" not in outcome
    finally:
        await pack.aclose()
        await server.aclose()


# --- A5: a tenant wedges the filesystem server with a glob (minimatch backtracking) ---------------

WEDGE_NAME = "a" * 60
WEDGE_PATTERN = "*a" * 14 + "*b"  # minimatch 10.2.6: "*a"*10+"*b" on 40 letters already > 20 s


def shared_files(root: Path, **extra: Any) -> tuple[UpstreamMCPPack, codemode.Server]:
    """One shared server-filesystem rooted at ``root`` under examples/upstream_tenant_dirs.rego, as
    docs/packs.md offers for ``tenancy = "shared"``."""
    filesystem = filesystem_command()
    table = {
        "name": "files",
        "tenancy": "shared",
        "command": filesystem[0],
        "args": [filesystem[1], str(root)],
        **extra,
    }
    pack, _ = upstream_packs([table])
    caps = pack.capabilities(PackSettings(environ={}, multi_tenant=True))
    policy = EXAMPLE_POLICY.read_text().replace('root := "/srv/tenants"', f"root := {json.dumps(str(root))}")
    authorizer = RegoAuthorizer("data.codemode.tenant_dirs.allow", {"policy.rego": policy})
    limits = codemode.Limits(max_execution_time=60.0)
    return pack, codemode.Builder(authorizer=authorizer, limits=limits).register(*caps).build()


@pytest.mark.xfail(strict=True, reason="review F2: a timeout never marks a wedged session dead")
async def test_one_tenants_glob_does_not_wedge_a_shared_filesystem_server_for_the_others(
    tmp_path: Path,
) -> None:
    """Under the example policy bob may search his own directory. A file of his named with 60
    letters and the pattern ``*a*a...*b`` make minimatch backtrack for hours inside the server's
    only thread. The call times out (``timeout``), but a timeout is not a transport failure: the
    session is never marked dead nor restarted, so every later call of every tenant times out too,
    for as long as the server spins."""
    root = (tmp_path / "tenants").resolve()
    alice_dir, bob_dir = root / subject_key("alice"), root / subject_key("bob")
    for where in (alice_dir, bob_dir):
        where.mkdir(parents=True)
    (alice_dir / "diary.txt").write_text("alice-diary")
    pack, server = shared_files(root, timeout=5.0)
    try:
        wrote = await attempt(server, f'files.write_file(path="{bob_dir}/{WEDGE_NAME}", content="")', BOB)
        assert wrote == "null", wrote
        wedge = await attempt(
            server, f'return files.search_files(path="{bob_dir}", pattern="{WEDGE_PATTERN}")', BOB
        )
        outcomes = []
        for _ in range(3):
            outcomes.append(
                await attempt(server, f'return files.read_text_file(path="{alice_dir}/diary.txt")', ALICE)
            )
        print(f"\nA5: bob's search -> {wedge!r}; alice afterwards -> {outcomes}")
        print(f"A5: server starts: {pack.pools['files'].starts}")
        assert outcomes[-1] == '{"content": "alice-diary"}', outcomes
    finally:
        await pack.aclose()
        await server.aclose()


def server_cpu_seconds(marker: str) -> float:
    """CPU seconds (user + system) of the node process whose command line holds ``marker``."""
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if marker.encode() not in cmdline or b"stdio_relay" in cmdline:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        return (int(fields[11]) + int(fields[12])) / ticks
    raise LookupError(marker)


@pytest.mark.xfail(strict=True, reason="review F2: a timed-out call leaves the server spinning")
async def test_a_timed_out_call_does_not_leave_the_tenants_server_spinning(
    served: tuple[UpstreamMCPPack, codemode.Server, Path],
) -> None:
    """Per subject (the default), the same glob hangs only bob's own server, but the call's
    ``timeout`` does not stop it: the process keeps a CPU core busy after the call has failed (and
    the session is reused by bob's next call, which times out behind it). docs/packs.md says a
    server busy for a subject counts against that subject's timeout."""
    pack, server, data = served
    pack.pools["files"].timeout = 5.0
    own = data / "upstreams" / "files" / subject_key("bob")
    wrote = await attempt(server, f'files.write_file(path="{WEDGE_NAME}", content="")', BOB)
    assert wrote == "null", wrote
    outcome = await attempt(server, f'return files.search_files(path=".", pattern="{WEDGE_PATTERN}")', BOB)
    assert outcome == "capability failed", outcome
    before = server_cpu_seconds(str(own))
    await asyncio.sleep(3.0)
    spent = server_cpu_seconds(str(own)) - before
    print(f"\nA5b: after the timeout bob's server used {spent:.1f} CPU s in 3 s of wall time")
    assert spent < 0.5, f"still spinning: {spent:.1f} CPU s in 3 s"


# --- A6: process_memory_bytes is per process, not per subject -----------------------------------


@pytest.mark.xfail(strict=True, reason="review F7: RLIMIT_DATA is per process, children get it again")
async def test_process_memory_bytes_bounds_what_a_subjects_server_holds() -> None:
    """``process_memory_bytes`` (RLIMIT_DATA) is inherited by the server's children, but each child
    gets the whole amount again: with 64 MiB, a server that forks holds 4 x 48 MiB at once."""
    pack = upstream_mcp_pack(
        [
            {
                "name": "api",
                "command": sys.executable,
                "args": [str(HOSTILE)],
                "process_memory_bytes": 64 * 1024 * 1024,
            }
        ]
    )
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        one = await attempt(server, 'return api.hog(children="1")', BOB)
        four = await attempt(server, 'return api.hog(children="4")', BOB)
        print(f"\nA6: one child: {one}; four children: {four}")
        assert one == '{"text": "1 of 1 children hold 48 MiB each"}'  # the bound lets one through
        assert four != '{"text": "4 of 4 children hold 48 MiB each"}', four
    finally:
        await pack.aclose()
        await server.aclose()


# --- Attacks on the pool that FAILED (kept as regression tests) -----------------------------------


def _pids_pack(**extra: Any) -> UpstreamMCPPack:
    return upstream_mcp_pack([{"name": "api", "command": sys.executable, "args": [str(HOSTILE)], **extra}])


async def test_racing_first_calls_of_two_tenants_get_two_processes() -> None:
    pack = _pids_pack()
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        got = await asyncio.gather(
            *[attempt(server, "return api.pid()", s) for s in (ALICE, BOB, ALICE, BOB, ALICE, BOB)]
        )
        assert got[0] == got[2] == got[4] and got[1] == got[3] == got[5] and got[0] != got[1], got
    finally:
        await pack.aclose()
        await server.aclose()


async def test_an_evicted_subject_never_lands_on_anothers_session() -> None:
    """max_sessions = 1: bob's first call evicts alice's idle session; alice's next call gets a new
    process, never bob's (and bob's survives until alice evicts it in turn)."""
    pack = _pids_pack(max_sessions=1)
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        seen = []
        for subject in (ALICE, BOB, ALICE, BOB):
            seen.append((subject.id, await attempt(server, "return api.pid()", subject)))
        pids = [p for _, p in seen]
        assert len(set(pids)) == 4, seen  # every take-over started a process of its own
    finally:
        await pack.aclose()
        await server.aclose()


# --- A9: the restart bound does not apply before a session's first successful start ---------------

# Serves for the host's discovery session ({subject_key} is "host"), exits at once for a subject.
FAILS_FOR_SUBJECTS = (
    "import runpy, sys; sys.exit(3) if sys.argv[1] != 'host' else None; "
    "sys.argv = [sys.argv[2]]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.mark.xfail(strict=True, reason="review F9: _check_restarts only counts once connects > 0")
async def test_a_subject_whose_server_never_starts_gets_no_more_starts_than_the_bound() -> None:
    """``max_restarts_per_minute = 2``: a subject's server that exits before ``initialize`` is
    started again on every call (10 calls, 10 processes): ``_check_restarts`` applies the bound only
    once the session has connected at least once."""
    pack = _pids_pack(
        args=["-c", FAILS_FOR_SUBJECTS, "{subject_key}", str(HOSTILE)], max_restarts_per_minute=2
    )
    server = codemode.Builder(authorizer=authz.allow_all()).register(*await pack.acapabilities()).build()
    try:
        outcomes = {await attempt(server, "return api.pid()", BOB) for _ in range(10)}
        starts = len(pack.pools["api"].subjects["bob"]._starts)
        print(f"\nA9: outcomes {outcomes}; processes started for bob within the minute: {starts}")
        assert outcomes == {"capability failed"}
        assert starts <= 3, f"{starts} starts with max_restarts_per_minute = 2"
    finally:
        await pack.aclose()
        await server.aclose()
