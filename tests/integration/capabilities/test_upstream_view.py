"""What a per-subject stdio server is told about the host, and what it may share.

* **The server's view of ``{subject_dir}``.** The subject's directory used to be passed to the
  server as its host path (``<data dir>/upstreams/<name>/<subject key>``) and hidden from the tenant
  by exact string replacement in results (and put back into arguments). The path came back in any
  other form: ``read_media_file``'s base64 of a file the tenant had written ``{subject_dir}`` into,
  the diff of a one-character ``edit_file``, a memory search for a fragment of it. Now the server
  runs in a mount view of its own where its directory is ``/mnt``: nothing it is given, and nothing
  it can say, names the host's layout, so no spelling is rewritten at all.
* **Fixed paths in a per-subject table.** A table whose env, args or cwd name a fixed path gave each
  subject its own process over the same file (bob read alice's memory entity), with only a warning.
  Now the pack refuses to start and names the fix; ``shared_paths`` opts in to what is shared on
  purpose.

Through the real third-party servers ``@modelcontextprotocol/server-filesystem`` and
``server-memory`` and the real execute path (process runtime).
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.packs import PackSettings, UpstreamBuildError
from codemode_capabilities.mcp.tenancy import subject_key
from codemode_capabilities.mcp.upstream import UpstreamMCPPack
from codemode_capabilities.upstreams import upstream_packs
from tests.integration.capabilities.test_upstream_tenancy import documented_tables
from tests.support import environment
from tests.support.upstreams import filesystem_command, memory_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ALICE, BOB = authz.Subject("alice"), authz.Subject("bob")


def run(source: str) -> str:
    return "def main():\n" + "".join(f"    {line}\n" for line in source.splitlines())


async def attempt(server: codemode.Server, source: str, subject: authz.Subject = BOB) -> str:
    try:
        return json.dumps(await server.execute(run(source), subject=subject))
    except codemode.CodeModeError as exc:
        return client_text(exc)


def serve(tables: list[dict[str, Any]], data: Path) -> tuple[UpstreamMCPPack, codemode.Server]:
    pack, _ = upstream_packs(tables)
    caps = pack.capabilities(PackSettings(environ={}, data_dir=data, multi_tenant=True))
    limits = codemode.Limits(max_execution_time=120.0)
    return pack, codemode.Builder(authorizer=authz.allow_all(), limits=limits).register(*caps).build()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[codemode.Server, Path]]:
    """The documented multi-tenant tables (memory + files, per subject, ``{subject_dir}``)."""
    data = tmp_path / "data"
    pack, server = serve(documented_tables(), data)
    try:
        yield server, data
    finally:
        await pack.aclose()
        await server.aclose()


async def test_the_subject_dir_comes_back_in_no_form(served: tuple[codemode.Server, Path]) -> None:
    server, data = served
    key = subject_key("bob")
    host_forms = {str(data), str(data.resolve()), key}
    outputs: list[str] = []
    listed = await attempt(server, "return files.list_allowed_directories()")
    shown = json.loads(listed)["content"].splitlines()[-1]  # the server's name for its directory
    outputs.append(listed)
    for n, spelling in enumerate(sorted({shown, "{subject_dir}"})):
        leak = f"{shown}/leak{n}.txt"
        wrote = await attempt(
            server, f"files.write_file(path={json.dumps(leak)}, content={json.dumps(spelling)})"
        )
        assert wrote == "null", wrote
        media = await attempt(server, f"return files.read_media_file(path={json.dumps(leak)})")
        outputs.append(media)
        for block in json.loads(media)["content"]:  # what the tenant decodes
            outputs.append(base64.b64decode(block["resource"]["blob"]).decode())
        edits = '[{"oldText": "/", "newText": "|"}, {"oldText": "{", "newText": "|"}]'
        for one in json.loads(edits):  # a one-character edit: its diff shows the line as stored
            outputs.append(
                await attempt(
                    server, f"return files.edit_file(path={json.dumps(leak)}, edits=[{json.dumps(one)}])"
                )
            )
    for spelling in sorted({shown, "{subject_dir}"}):
        entity = {"name": f"n{len(spelling)}", "entityType": "t", "observations": [spelling]}
        outputs.append(
            await attempt(server, f"return memory.create_entities(entities=[{json.dumps(entity)}])")
        )
    # a search is an oracle: an entity comes back only if its text holds the fragment
    fragments = [key[:8], key[-8:], "upstreams", data.name, data.parent.name[:6]]
    found = {
        f: await attempt(server, f"return memory.search_nodes(query={json.dumps(f)})") for f in fragments
    }
    outputs.extend(found.values())
    leaked = [o for o in outputs if any(form in o for form in host_forms) or "upstreams" in o]
    assert leaked == [], leaked
    assert all(json.loads(o)["entities"] == [] for o in found.values()), found
    assert shown == "/mnt"
    # the server's directory is the subject's own one on the host
    assert (data / "upstreams" / "files" / key / "leak0.txt").exists()


async def test_relative_paths_and_the_fixed_name_both_work(served: tuple[codemode.Server, Path]) -> None:
    server, data = served
    assert await attempt(server, 'files.write_file(path="notes.txt", content="bob")') == "null"
    assert json.loads(await attempt(server, 'return files.read_text_file(path="/mnt/notes.txt")')) == {
        "content": "bob"
    }
    found = await attempt(server, 'return files.search_files(path="/mnt", pattern="notes.txt")')
    assert "/mnt/notes.txt" in found and str(data) not in found
    assert (data / "upstreams" / "files" / subject_key("bob") / "notes.txt").read_text() == "bob"
    # alice's /mnt is her own directory
    assert "bob" not in await attempt(server, 'return files.read_text_file(path="/mnt/notes.txt")', ALICE)


def memory_table(**extra: Any) -> dict[str, Any]:
    memory = memory_command()
    return {"name": "memory", "command": memory[0], "args": [memory[1]], **extra}


def refusal(table: dict[str, Any], data: Path) -> str:
    pack, _ = upstream_packs([table])
    with pytest.raises(UpstreamBuildError) as refused:
        pack.capabilities(PackSettings(environ={}, data_dir=data, multi_tenant=True))
    assert pack.pools["memory"].attempts == 0  # refused before any server started
    return str(refused.value)


def test_a_per_subject_table_naming_a_fixed_path_is_refused(tmp_path: Path) -> None:
    """Before, this table started (with a warning) and bob read alice's entity through his own
    process: both processes used ``<tmp>/memory.jsonl``."""
    shared_file = str(tmp_path / "memory.jsonl")
    package = str(Path(memory_command()[1]).parent)
    text = refusal(memory_table(env={"MEMORY_FILE_PATH": shared_file}, shared_paths=[package]), tmp_path)
    assert text == (
        f"upstream 'memory': every subject's server would be given the same path: env MEMORY_FILE_PATH "
        f"names {shared_file!r}; put per-subject state under {{subject_dir}}, list what may be shared "
        'in shared_paths, or set tenancy = "shared"'
    )
    # each kind of value, every offending one named; the script path too unless it is listed
    table = memory_table(
        args=[memory_command()[1], "--db=/srv/state/db.sqlite", "file:///srv/x,./rel", "{subject_dir}/../y"],
        cwd="/srv/app",
    )
    text = refusal(table, tmp_path)
    for named in (
        f"args[0] names {memory_command()[1]!r}",
        "args[1] names '/srv/state/db.sqlite'",
        "args[2] names '///srv/x'",
        "args[2] names './rel'",
        "args[3] names '{subject_dir}/../y'",
        "cwd names '/srv/app'",
    ):
        assert named in text, (named, text)


def test_values_that_are_not_paths_and_shared_paths_pass(tmp_path: Path) -> None:
    package = str(Path(memory_command()[1]).parent)
    table = memory_table(
        args=[memory_command()[1], "stdio", "--url=https://api.example/v1", "-v"],
        env={"MEMORY_FILE_PATH": "{subject_dir}/memory.jsonl", "MODE": "fast", "TZ": "Europe/Paris"},
        shared_paths=[str(Path(package).parent), "Europe/Paris"],
    )
    pack, _ = upstream_packs([table])
    try:
        pack.capabilities(PackSettings(environ={}, data_dir=tmp_path / "data", multi_tenant=True))
    finally:
        asyncio.run(pack.aclose())


async def test_a_shared_read_only_folder_is_an_explicit_opt_in(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.txt").write_text("how to")
    filesystem = filesystem_command()
    table = {
        "name": "files",
        "command": filesystem[0],
        "args": [filesystem[1], "{subject_dir}", str(docs)],
        "shared_paths": [str(Path(filesystem[1]).parents[1]), str(docs)],
    }
    pack, server = serve([table], tmp_path / "data")
    try:
        for who in (ALICE, BOB):
            guide = await attempt(server, f'return files.read_text_file(path="{docs}/guide.txt")', who)
            assert json.loads(guide) == {"content": "how to"}
        await attempt(server, 'files.write_file(path="/mnt/mine.txt", content="alice")', ALICE)
        assert "alice" not in await attempt(server, 'return files.read_text_file(path="/mnt/mine.txt")', BOB)
    finally:
        await pack.aclose()
        await server.aclose()


HOST = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from codemode.packs import PackSettings, UpstreamBuildError
    from codemode_capabilities.upstreams import upstream_packs

    table = json.loads(sys.argv[1])
    pack, _ = upstream_packs([table])
    try:
        pack.capabilities(PackSettings(environ={}, data_dir=Path(sys.argv[2]), multi_tenant=True))
        print("started")
    except UpstreamBuildError as exc:
        print(exc)
    finally:
        asyncio.run(pack.aclose())
    """
)


@pytest.mark.parametrize("view", ["private", "host"])
def test_where_the_kernel_refuses_a_mount_view_the_start_says_how_to_proceed(
    tmp_path: Path, view: str
) -> None:
    """The host runs where no user namespace can be made (a child user namespace whose
    ``user.max_user_namespaces`` is 0, as a container's seccomp profile or a sysctl makes it): a
    ``{subject_dir}`` table is refused in one line naming the fix; ``subject_dir_view = "host"``
    (the server is given the host path, said at start) starts."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-Ur", "true"], capture_output=True).returncode != 0:
        environment.unavailable("a user namespace for the host", "unshare -Ur is refused here")
    filesystem = filesystem_command()
    table = {
        "name": "files",
        "command": filesystem[0],
        "args": [filesystem[1], "{subject_dir}"],
        "shared_paths": [str(Path(filesystem[1]).parents[1])],
        "subject_dir_view": view,
    }
    script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    proc = subprocess.run(
        [
            unshare,
            "-Ur",
            "sh",
            "-c",
            script,
            "sh",
            sys.executable,
            "-c",
            HOST,
            json.dumps(table),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = proc.stdout.strip()
    if view == "host":
        assert said == "started"
        return
    assert said.startswith(
        "upstream 'files': {subject_dir} needs a mount view of its own for the server, which this "
        "system refuses (user namespaces: "
    ), said
    assert said.endswith(
        'allow unprivileged user namespaces (docs/packs.md), or set subject_dir_view = "host"'
    )
