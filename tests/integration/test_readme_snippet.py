"""The README's "Library use" snippet runs as written, as a script, and prints what the prose says.

The first ```python block under the "## Library use" heading is written to a file as it stands and
run with this Python from a fresh directory, the way a reader would run it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def library_snippet(text: str) -> str:
    """The first ```python block after the "## Library use" heading (before the next ## heading)."""
    section = re.search(r"^## Library use[ \t]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, 'README.md has no "## Library use" section'
    block = re.search(r"^```python[ \t]*\n(.*?)^```", section.group(1), re.M | re.S)
    assert block, 'the "## Library use" section has no ```python block'
    return block.group(1)


def run_script(source: str, folder: Path, name: str = "snippet.py", cwd: Path | None = None) -> list[str]:
    """Run ``source`` as the file ``folder/name`` (from ``cwd``, default ``folder``); its stdout lines."""
    script = folder / name
    script.write_text(source, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=cwd or folder, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_snippet_is_a_script() -> None:
    snippet = library_snippet(README.read_text(encoding="utf-8"))
    assert "asyncio.run(main())" in snippet and "async with builder.build() as server" in snippet
    assert "@pack.capability(" in snippet
    compile(snippet, "README.md", "exec", dont_inherit=True)  # no top-level await: a plain script


@pytest.mark.timeout(120)
def test_library_snippet_runs_as_written(tmp_path: Path) -> None:
    search, describe, value = (
        json.loads(line) for line in run_script(library_snippet(README.read_text()), tmp_path)
    )
    assert [hit["name"] for hit in search["results"]] == ["records.lookup"], search
    assert search["truncated"] is False
    assert describe["name"] == "records.lookup"
    assert describe["signature"] == "records.lookup(*, key: str, limit: int | None)"
    assert describe["summary"] == "Look up one record by key."  # from the docstring
    assert [(f["name"], f["required"]) for f in describe["input"]] == [("key", True), ("limit", False)]
    # The handler answers count=len(key) for key='a'; the value crossed worker and host intact.
    assert value == {"key": "a", "count": 1}


def test_snippet_extraction_takes_only_that_section() -> None:
    text = (
        "# t\n\n## Other\n\n```python\nwrong = 1\n```\n\n## Library use\n\nIntro.\n\n"
        "```sh\nnot python\n```\n\n```python\nright = 1\n```\n\n```python\nsecond = 1\n```\n\n## Next\n"
    )
    assert library_snippet(text) == "right = 1\n"
    with pytest.raises(AssertionError, match="no ```python block"):
        library_snippet("## Library use\n\ntext only\n\n## Next\n```python\nx = 1\n```\n")
