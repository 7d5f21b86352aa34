"""One tenant against the others through the real third-party servers
(``@modelcontextprotocol/server-memory``, ``server-filesystem``) under the tables docs/packs.md
documents (``served``: per subject, ``{subject_dir}``; ``shared_files``: one shared filesystem
server under examples/upstream_tenant_dirs.rego), through the real execute path (process runtime).

Found by a hostile review of the capability packs, each failing before its fix:

* a long entity name in server-memory's error text stalled the serving loop for every tenant
  (quadratic URL/path patterns over the whole text: 150 KB stood still for 17 s);
* one tenant's glob (``*a*a...*b``) wedged a shared filesystem server for every tenant, for
  good, and left a per-subject one spinning a core after its call had failed;
* one ``create_directory`` call turned 4 KB of arguments into ~2,000 directories (the byte
  bounds did not bound the disk), and the tree it left could not be removed by ``aclose``;
* ``list_allowed_directories`` handed a tenant the host's data dir (the server sees ``/mnt`` now).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.packs import PackSettings
from codemode_capabilities.mcp.tenancy import subject_key
from codemode_capabilities.mcp.upstream import UpstreamMCPPack
from codemode_capabilities.upstreams import upstream_packs
from tests.integration.capabilities.test_upstream_tenancy import (
    EXAMPLE_POLICY,
    documented_tables,
    shared_files_server,
)
from tests.support.upstreams import filesystem_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ALICE, BOB = authz.Subject("alice"), authz.Subject("bob")


def run(source: str) -> str:
    return "def main():\n" + "".join(f"    {line}\n" for line in source.splitlines())


async def attempt(server: codemode.Server, source: str, subject: authz.Subject) -> str:
    try:
        return json.dumps(await server.execute(run(source), subject=subject))
    except codemode.CodeModeError as exc:
        return client_text(exc)


def serve_tables(tables: list[dict[str, Any]], data: Path) -> tuple[UpstreamMCPPack, codemode.Server]:
    pack, _ = upstream_packs(tables)
    caps = pack.capabilities(PackSettings(environ={}, data_dir=data, multi_tenant=True))
    limits = codemode.Limits(max_execution_time=120.0)
    return pack, codemode.Builder(authorizer=authz.allow_all(), limits=limits).register(*caps).build()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[UpstreamMCPPack, codemode.Server, Path]]:
    """The documented multi-tenant table (memory + files, per_subject, {subject_dir})."""
    data = tmp_path / "data"
    pack, server = serve_tables(documented_tables(), data)
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


async def test_a_long_entity_name_in_an_upstream_error_does_not_stall_the_serving_loop(
    served: tuple[UpstreamMCPPack, codemode.Server, Path],
) -> None:
    """server-memory answers ``add_observations`` on a missing entity with ``Entity with name <name>
    not found`` (isError): the name is the tenant's. The rule for that text used to run its
    URL/path patterns over the whole of it on the serving loop, quadratic on a run of letters:
    bob's one call froze every tenant's requests (and /healthz) for 17 s. It reads 1 KiB now."""
    _, server, _ = served
    n = 150_000
    source = f'memory.add_observations(observations=[{{"entityName": "a" * {n}, "contents": ["x"]}}])'
    with Heartbeat() as beat:
        await asyncio.sleep(0.1)  # the heartbeat is ticking
        outcome = await attempt(server, source, BOB)
    assert outcome.startswith("capability failed: memory: Entity with name aaaa")
    assert beat.longest < 2.0, f"the serving loop stood still for {beat.longest:.1f} s"


def disk_bytes(root: Path) -> tuple[int, int]:
    """(allocated bytes, entries) under ``root``, iteratively (the trees here are deeper than the
    recursion limit)."""
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


def deep_path(own: Path, first: str = "a") -> str:
    """One-letter segments, the whole path within PATH_MAX (4096) under ``own``."""
    segments = (4000 - len(str(own))) // 2
    return "/".join([first] + ["a"] * (segments - 1))


async def test_the_subject_dir_bounds_cap_what_a_tenant_leaves_on_disk(tmp_path: Path) -> None:
    """The byte bounds do not bound the disk: one ``create_directory`` with a 4 KB path of
    one-letter segments makes ~1,950 directories (a 4 KiB block each on ext4), so three such
    calls (12 KB of arguments) took 24 MB. With ``max_subject_dir_entries`` the call that passes it
    is the last one (its whole tree lands: the check is between calls): the next is refused with
    ``resource limit exceeded: quota``, and the other tenants are not."""
    tables = documented_tables()
    files = next(t for t in tables if t["name"] == "files")
    files["max_subject_dir_entries"] = 1000
    data = tmp_path / "data"
    pack, server = serve_tables(tables, data)
    own = data / "upstreams" / "files" / subject_key("bob")
    try:
        outcomes = []
        for first in "xyz":
            path = deep_path(own, first)
            outcomes.append(await attempt(server, f'return files.create_directory(path="{path}")', BOB))
        used, entries = disk_bytes(own)
        assert "Successfully created directory" in outcomes[0], outcomes[0][:200]
        assert outcomes[1:] == ["resource limit exceeded: quota"] * 2
        assert entries < 2000 and used < 2000 * 8192, (entries, used)  # one call's tree
        mine = await attempt(server, 'files.write_file(path="notes.txt", content="alice")', ALICE)
        assert mine == "null"
    finally:
        await pack.aclose()
        await server.aclose()
        remove_tree(own)  # pytest's own clean-up (shutil.rmtree) would hit the recursion limit


async def test_the_pack_removes_its_private_data_dir_whatever_a_tenant_left_there() -> None:
    """Without ``--data-dir`` (``serve --stdio``) the pack keeps subject directories in a private
    temporary directory that ``aclose`` removes. A tenant's deep directory chain (one
    ``create_directory`` call) is deeper than Python 3.11's recursion limit: ``shutil.rmtree``
    raised ``RecursionError`` (``ignore_errors`` does not cover it), so ``aclose`` failed and the
    directory stayed, with every tenant's files. The removal is iterative now."""
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
        await pack.aclose()
        assert not private.exists()
    finally:
        await server.aclose()
        if private.exists():
            remove_tree(private)


async def test_the_host_data_dir_does_not_reach_a_tenant(
    served: tuple[UpstreamMCPPack, codemode.Server, Path],
) -> None:
    """Error text is stripped of absolute paths, but the documented per-subject filesystem table
    handed the tenant the host's data dir (and its own subject key) in plain results
    (``list_allowed_directories``, ``search_files``). The server sees its directory at ``/mnt`` now
    (a mount view of its own), so its answers name nothing of the host's layout; the other forms
    the path came back in are tests/integration/capabilities/test_upstream_view.py."""
    _, server, data = served
    listed = await attempt(server, "return files.list_allowed_directories()", BOB)
    assert listed == '{"content": "Allowed directories:\\n/mnt"}', listed
    wrote = await attempt(server, 'files.write_file(path="/mnt/a.txt", content="bob")', BOB)
    assert wrote == "null"
    found = await attempt(server, 'return files.search_files(path="/mnt", pattern="a.txt")', BOB)
    assert str(data) not in found and "/mnt/a.txt" in found, found
    assert (data / "upstreams" / "files" / subject_key("bob") / "a.txt").read_text() == "bob"


def shared_files(root: Path, **extra: Any) -> tuple[UpstreamMCPPack, codemode.Server]:
    """One shared server-filesystem rooted at ``root`` under examples/upstream_tenant_dirs.rego, as
    docs/packs.md offers for ``tenancy = "shared"``."""
    policy = EXAMPLE_POLICY.read_text().replace('root := "/srv/tenants"', f"root := {json.dumps(str(root))}")
    limits = codemode.Limits(max_execution_time=60.0)
    return shared_files_server(root, "data.codemode.tenant_dirs.allow", policy, limits, **extra)


def tenant_dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = (tmp_path / "tenants").resolve()
    alice_dir, bob_dir = root / subject_key("alice"), root / subject_key("bob")
    for where in (alice_dir, bob_dir):
        where.mkdir(parents=True)
    (alice_dir / "diary.txt").write_text("alice-diary")
    return root, alice_dir, bob_dir


async def test_a_trailing_space_dotdot_does_not_escape_the_example_policy(tmp_path: Path) -> None:
    """The example policy allows a segment ``.. `` (dots and a space are allowed characters, and it
    is not exactly ``..``); server-filesystem ``trim()``s a path before its containment check. The
    check then sees ``<root>/<bob>/..`` (= the root, allowed), but the operation uses the untrimmed
    path, i.e. a literal entry named ``.. `` inside bob's own directory: no escape."""
    root, alice_dir, bob_dir = tenant_dirs(tmp_path)
    pack, server = shared_files(root)
    try:
        for source in [
            f'return files.list_directory(path="{bob_dir}/.. ")',
            f'return files.directory_tree(path="{bob_dir}/.. ")',
            f'return files.search_files(path="{bob_dir}/.. ", pattern="diary")',
            f'return files.list_directory(path="{bob_dir}/x/.. ")',
        ]:
            outcome = await attempt(server, source, BOB)
            assert alice_dir.name not in outcome and "diary" not in outcome, (source, outcome)
    finally:
        await pack.aclose()
        await server.aclose()


WEDGE_NAME = "a" * 60
WEDGE_PATTERN = "*a" * 14 + "*b"  # minimatch 10.2.6: "*a"*10+"*b" on 40 letters already > 20 s


async def test_one_tenants_glob_does_not_wedge_a_shared_filesystem_server_for_the_others(
    tmp_path: Path,
) -> None:
    """Under the example policy bob may search his own directory. A file of his named with 60
    letters and the pattern ``*a*a...*b`` make minimatch backtrack for hours inside the server's
    only thread. The call times out (``timeout``); a timeout used not to mark the session dead, so
    every later call of every tenant timed out too (3 of 3 of alice's), for as long as the server
    spun. Now the server answers no ping either, so it is stopped and alice gets a fresh one."""
    root, alice_dir, bob_dir = tenant_dirs(tmp_path)
    pack, server = shared_files(root, timeout=5.0)
    try:
        wrote = await attempt(server, f'files.write_file(path="{bob_dir}/{WEDGE_NAME}", content="")', BOB)
        assert wrote == "null", wrote
        wedge = await attempt(
            server, f'return files.search_files(path="{bob_dir}", pattern="{WEDGE_PATTERN}")', BOB
        )
        assert wedge == "capability failed"
        outcomes = [
            await attempt(server, f'return files.read_text_file(path="{alice_dir}/diary.txt")', ALICE)
            for _ in range(3)
        ]
        assert outcomes == ['{"content": "alice-diary"}'] * 3, outcomes
        assert pack.pools["files"].starts == 2
        assert list(pack.pools["files"].charges) == ["bob"]  # the restart is bob's
    finally:
        await pack.aclose()
        await server.aclose()


def server_cpu_seconds(marker: str) -> float | None:
    """CPU seconds (user + system) of the server process started by the relay whose command line
    holds ``marker`` (its ``--view=`` directory: the server itself is given ``/mnt``; None: there is
    none)."""
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if marker.encode() not in cmdline or b"stdio_relay" not in cmdline:
                continue
            children = [
                child
                for task in os.listdir(f"/proc/{pid}/task")
                for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            ]
        except OSError:
            continue
        for child in children:
            try:
                fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                return (int(fields[11]) + int(fields[12])) / ticks
    return None


async def test_a_timed_out_call_does_not_leave_the_tenants_server_spinning(
    served: tuple[UpstreamMCPPack, codemode.Server, Path],
) -> None:
    """Per subject (the default), the same glob hangs only bob's own server, but the call's
    ``timeout`` did not stop it: the process kept a CPU core busy after the call had failed
    (2.7 CPU s in the next 3 s), and bob's next call timed out behind it. Now the stuck server is
    stopped before bob's call returns, and his next call gets a new one."""
    pack, server, data = served
    pack.pools["files"].timeout = 5.0
    own = data / "upstreams" / "files" / subject_key("bob")
    wrote = await attempt(server, f'files.write_file(path="{WEDGE_NAME}", content="")', BOB)
    assert wrote == "null", wrote
    before = server_cpu_seconds(str(own))
    assert before is not None
    outcome = await attempt(server, f'return files.search_files(path=".", pattern="{WEDGE_PATTERN}")', BOB)
    assert outcome == "capability failed", outcome
    assert server_cpu_seconds(str(own)) is None  # no server of bob's is running
    listed = await attempt(server, 'return files.list_directory(path=".")', BOB)
    assert WEDGE_NAME in listed, listed
