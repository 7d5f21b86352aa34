"""The suite's own shape (CONTRIBUTING.md, "Set up, run, test"): ``tests/unit/`` and
``tests/integration/`` mirror the code, their shared pieces live in ``tests/support/``, and CI runs
the README's test command, which prints the slowest tests."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: What a folder of tests/unit/ or tests/integration/ may be named after: a package of the host
#: (host/codemode/<name>/), or the other two roots (the worker, the shipped packs).
ROOTS = {"worker": ROOT / "worker_image" / "codemode_worker", "capabilities": ROOT / "capabilities"}


def _folders(kind: str) -> list[Path]:
    return sorted(p for p in (TESTS / kind).iterdir() if p.is_dir() and p.name != "__pycache__")


def _mirrors(name: str) -> bool:
    if name in ROOTS:
        return ROOTS[name].is_dir()
    return (ROOT / "host" / "codemode" / name / "__init__.py").is_file()


def test_unit_and_integration_folders_name_a_package_that_exists() -> None:
    strays = [
        f"{folder.relative_to(ROOT)}/"
        for kind in ("unit", "integration")
        for folder in _folders(kind)
        if not _mirrors(folder.name)
    ]
    assert not strays, (
        f"test folders that mirror no package (host/codemode/<name>/, worker, capabilities): {strays}"
    )


def test_every_test_folder_is_a_package() -> None:
    """Two test modules of one name in two folders (unit/runtimes/test_x.py, integration/runtimes/test_x.py)
    import as different modules only when each folder is a package."""
    missing = [
        f"{folder.relative_to(ROOT)}/"
        for kind in ("unit", "integration")
        for folder in _folders(kind)
        if not (folder / "__init__.py").is_file()
    ]
    assert not missing, f"test folders without __init__.py: {missing}"


def test_shared_helpers_live_in_tests_support() -> None:
    """No helper module beside the unit and integration tests: what tests share is in tests/support/
    (the adversarial and Kubernetes kinds keep their probes and proxies with them)."""
    helpers = [
        str(p.relative_to(ROOT))
        for kind in ("unit", "integration")
        for p in (TESTS / kind).rglob("*.py")
        if not p.name.startswith("test_") and p.name not in ("__init__.py", "conftest.py")
    ]
    assert not helpers, f"helper modules outside tests/support/: {helpers}"


def test_test_modules_say_what_they_test_not_where_they_came_from() -> None:
    """A module is named after what it tests; which review found its cases is history (CHANGELOG.md)."""
    named = [
        str(p.relative_to(ROOT)) for p in TESTS.rglob("*.py") if re.search(r"(^|_)review(_|\.py$)", p.name)
    ]
    assert not named, f"test modules named after a review: {named}"


def test_ci_runs_the_readme_test_command_which_prints_the_slowest_tests() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^make test\b", readme, re.MULTILINE), "README.md names no `make test`"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^make test$", ci, re.MULTILINE), ".ci/run does not run the README's `make test`"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target, "the Makefile has no test target"
    pytest_line = next(line for line in target.group(1).splitlines() if "pytest" in line)
    assert "--durations=25" in pytest_line, pytest_line
    assert re.search(r"^test:.*\blint\b", makefile, re.MULTILINE), "make test runs no lint first"
    lint = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert lint and re.search(r"mypy host worker_image capabilities tests$", lint.group(1), re.MULTILINE)
