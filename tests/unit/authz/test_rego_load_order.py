"""regopy and numpy in one process: codemode loads regopy before anything of it imports numpy,
because with numpy's libraries loaded first, building a Rego bundle aborts the process. Each case
runs in a fresh interpreter (an abort would take the test run with it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

POLICY = 'package x\n\ndefault allow := false\n\nallow if input.subject.id == "alice"\n'
BUILD = (
    "from codemode.authz.rego import from_files\n"
    "a = from_files('data.x.allow', [{policy!r}])\n"
    "print(type(a).__name__)\n"
)


def _run(prelude: str, policy: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", prelude + BUILD.format(policy=str(policy))],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "prelude",
    [
        "",  # codemode imports numpy itself (the redaction matcher)
        "import codemode\nimport numpy\n",  # the documented order for a program that uses numpy
        "import codemode.packs.redaction\n",  # the module that brings numpy in, first
    ],
)
def test_a_rego_policy_builds_in_a_process_that_has_numpy(prelude: str, tmp_path: Path) -> None:
    policy = tmp_path / "p.rego"
    policy.write_text(POLICY)
    proc = _run(prelude, policy)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "RegoAuthorizer"


def test_numpy_before_regopy_is_still_the_hazard_the_docs_name(tmp_path: Path) -> None:
    """The tripwire: the day a regopy or numpy release fixes the load order, this fails and the
    sentence in docs/authz.md ("Load order with numpy") and codemode's early import can go."""
    policy = tmp_path / "p.rego"
    policy.write_text(POLICY)
    proc = subprocess.run(
        [sys.executable, "-c", "import numpy\nimport regopy\n" + BUILD.format(policy=str(policy))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
