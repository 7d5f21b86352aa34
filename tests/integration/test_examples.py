"""Every ``examples/*.py`` runs as a reader would run it and prints what it is meant to show.

Each script runs in a fresh interpreter from the repository root (``.venv/bin/python examples/X.py``)
with warnings turned into errors; it must exit 0 and print its key output. A new example needs an
entry in ``KEY_OUTPUT`` (an empty tuple for a file that is imported, e.g. a pack, rather than run).
``examples/policy.rego`` is exercised by tests/unit/authz/test_example_policy.py,
``examples/upstream_tenant_dirs.rego`` by tests/unit/authz/test_example_upstream_policy.py (and
tests/integration/capabilities/test_upstream_tenancy.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# Lines (or fragments of lines) each example must print.
KEY_OUTPUT: dict[str, tuple[str, ...]] = {
    "demo.py": (
        # search finds the capability by a search term, describe gives the keyword-only signature,
        '"name": "records.lookup"',
        '"signature": "records.lookup(*, key: str, limit: int | None)"',
        '"truncated": false',
        # and execute returns main()'s value: len("alpha") * 2 + len("beta") * 2.
        "{'total': 18, 'keys': ['alpha', 'beta']}",
    ),
    # A pack, imported rather than run (`--pack ./examples/notes_pack.py:pack`): running it only shows
    # that it imports cleanly; tests/unit/packs/test_registry.py loads and exercises it.
    "notes_pack.py": (),
}


def test_there_are_examples() -> None:
    assert [p.name for p in EXAMPLES if p.name in KEY_OUTPUT], "examples/ has no runnable example"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path) -> None:
    assert path.name in KEY_OUTPUT, f"add the key output of examples/{path.name} to KEY_OUTPUT"
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(path.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for expected in KEY_OUTPUT[path.name]:
        assert expected in proc.stdout, f"{expected!r} not in the output of {path.name}:\n{proc.stdout}"
