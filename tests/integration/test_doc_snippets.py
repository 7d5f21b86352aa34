"""Snippets of the docs that are whole programs run as written, as script files, the way a reader
would run them (the README's are in test_readme_snippet.py and test_readme_client.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mcp_client import child_env, cli_command

from .test_readme_snippet import run_script

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(page: str) -> list[str]:
    return re.findall(r"^```python[ \t]*\n(.*?)^```", (ROOT / page).read_text(encoding="utf-8"), re.M | re.S)


def sh_blocks(page: str) -> list[str]:
    return re.findall(r"^```sh[ \t]*\n(.*?)^```", (ROOT / page).read_text(encoding="utf-8"), re.M | re.S)


def block_with(page: str, marker: str) -> str:
    (block,) = [b for b in python_blocks(page) if marker in b]
    return block


@pytest.mark.timeout(120)
def test_packs_page_from_python(tmp_path: Path) -> None:
    # The page says: run it from the repository root.
    source = block_with("docs/packs.md", 'add_pack("./examples/notes_pack.py:pack")')
    assert run_script(source, tmp_path, "notes_demo.py", cwd=ROOT) == ["{'notes': ['hi']}"]


@pytest.mark.timeout(120)
def test_packs_page_short_form_runs_as_a_script(tmp_path: Path) -> None:
    source = block_with("docs/packs.md", "def add(text: str, owner: Subject)")
    assert run_script(source, tmp_path, "notes_short.py") == ["notes.add(*, text: str)", "['buy milk']"]


@pytest.mark.timeout(120)
def test_packs_page_lifecycle_pack_runs_as_a_script(tmp_path: Path) -> None:
    source = block_with("docs/packs.md", "class VisitsPack")
    assert run_script(source, tmp_path, "visits.py") == ["{'count': 2, 'page': '/'}", "None"]


@pytest.mark.timeout(120)
def test_packs_page_lifecycle_pack_serves_from_a_file_and_names_itself_when_it_cannot_open(
    tmp_path: Path,
) -> None:
    """The page's command line, as written, in the folder of visits.py: the database file is made by
    open() and kept after the server closed; a database that cannot be opened is one line, exit 2."""
    (tmp_path / "visits.py").write_text(block_with("docs/packs.md", "class VisitsPack"), encoding="utf-8")
    argv = cli_command(
        "serve", "--stdio", "--allow-all", "--pack", "./visits.py:pack",
        "--pack-option", "VISITS_DB=visits.db",
    )  # fmt: skip
    proc = subprocess.run(
        argv, cwd=tmp_path, env=child_env(), input="", capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "visits.db").is_file()
    argv[-1] = "VISITS_DB=no/such/folder/visits.db"
    proc = subprocess.run(
        argv, cwd=tmp_path, env=child_env(), input="", capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "codemode: --pack / CODEMODE_PACKS: pack './visits.py:pack': open failed: "
        "OperationalError: unable to open database file"
    ]


@pytest.mark.timeout(120)
def test_mcp_page_builds_the_mcp_server(tmp_path: Path) -> None:
    source = block_with("docs/mcp.md", "create_server(server, StaticSubject")
    run_script(source + "\nprint(type(app).__module__)\n", tmp_path)


@pytest.mark.timeout(120)
def test_service_page_builds_the_app_and_its_server_configuration(tmp_path: Path) -> None:
    """The page's first two blocks, as written, in one folder: the token file the command makes is
    what the script names; nothing else is set (it once needed settings it did not show)."""
    env = child_env(XDG_DATA_HOME=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    (command,) = [b for b in sh_blocks("docs/service.md") if "--token-file tokens.txt" in b]
    argv = cli_command(*command.split("#")[0].split()[1:])
    made = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and (tmp_path / "tokens.txt").is_file(), made.stderr
    source = block_with("docs/service.md", "server_config(app)")
    proc = subprocess.run(
        [sys.executable, "-c", source], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["127.0.0.1 8000"]


@pytest.mark.timeout(120)
def test_python_api_page_builds_and_uses_a_server_as_a_script() -> None:
    """python-api.md's first listing is a script (no top-level await), run from the repository root."""
    source = python_blocks("docs/reference/python-api.md")[0]
    compile(source, "python-api.md", "exec", dont_inherit=True)
    proc = subprocess.run(
        [sys.executable, "-c", source], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[2] == "{'count': 1, 'key': 'a'}"
    assert lines[3].startswith("ExecuteResult(value={'count': 1, 'key': 'a'}, calls=(LedgerEntry(")


@pytest.mark.timeout(120)
def test_tracing_page_traces_an_execute(tmp_path: Path) -> None:
    source = block_with("docs/tracing.md", "codemode.Tracing(provider")
    source += (
        "\nimport asyncio\n"
        "async def main():\n"
        "    async with server:\n"
        "        await server.run('def main():\\n    return 1\\n', subject=codemode.Subject('a'))\n"
        "asyncio.run(main())\n"
        "print(sorted(s.name for s in exporter.get_finished_spans()))\n"
    )
    assert run_script(source, tmp_path) == [
        "['codemode.admission', 'codemode.execute', 'codemode.sandbox.acquire', 'codemode.teardown']"
    ]
