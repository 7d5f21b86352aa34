"""Project metadata: one version source, and the license and changelog that ship with it."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import codemode

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_version_has_one_source() -> None:
    data = _pyproject()
    project = data["project"]
    assert isinstance(project, dict)
    assert "version" not in project, "pyproject must not pin its own version"
    assert "version" in project["dynamic"]
    tool = data["tool"]
    assert isinstance(tool, dict)
    assert tool["setuptools"]["dynamic"]["version"] == {"attr": "codemode.__version__"}


def test_installed_metadata_and_cli_agree_with_the_package() -> None:
    # A stale install (version bumped without reinstalling) fails here: `make venv` reinstalls.
    installed = importlib.metadata.version("codemode")
    assert installed == codemode.__version__
    proc = subprocess.run(
        [sys.executable, "-m", "codemode.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"codemode {installed}"
    script = Path(sys.executable).with_name("codemode")
    if script.exists():  # the console script of the installed distribution
        out = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == f"codemode {installed}", out.stderr


def test_license_metadata_and_file() -> None:
    meta = importlib.metadata.metadata("codemode")
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Author"] == "codemode developers"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text


def test_changelog_has_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert headings and headings[0] == "Unreleased", headings
    assert codemode.__version__ in headings, f"CHANGELOG.md has no section for {codemode.__version__}"


def test_a_checkout_named_codemode_beside_a_script_is_not_imported(tmp_path: Path) -> None:
    # A checkout folder named like the package, next to a user's script, once shadowed the installed
    # package as a namespace package; with the three roots the checkout's top level holds no package.
    checkout = tmp_path / "codemode"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (checkout / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    for root in ("host", "worker_image", "capabilities"):
        (checkout / root).symlink_to(ROOT / root)
    script = tmp_path / "script.py"
    script.write_text("import codemode\nprint(codemode.Builder.__name__)\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "Builder"
