"""Code and tests say what is true now, not which issue brought it: a note such as "(issue 31 §1)"
or "found by issue 35's new-user run" is history, and CHANGELOG.md keeps the history."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The trees whose source may not carry an issue note (docs/ may say "issue" in other senses).
TREES = ("host", "worker_image", "capabilities", "tests", "examples", "scripts")
#: "issue 31", "Issue 19 §3", "issues 31", "issue #20", a number on the next line of a wrapped text.
NOTE = re.compile(r"\b[Ii]ssues?\s+#?\d+")


def _sources() -> list[Path]:
    me = Path(__file__).resolve()
    return sorted(
        path
        for tree in TREES
        for pattern in ("*.py", "*.sh")
        for path in (ROOT / tree).rglob(pattern)
        if path.resolve() != me and "__pycache__" not in path.parts
    )


def test_no_source_names_the_issue_that_brought_it() -> None:
    notes = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, found.start()) + 1}: {found.group(0)!r}"
        for path in _sources()
        for text in [path.read_text(encoding="utf-8")]
        for found in NOTE.finditer(text)
    ]
    assert not notes, (
        "issue notes in code or tests (say the fact without the number; CHANGELOG.md keeps the "
        f"history): {notes}"
    )
