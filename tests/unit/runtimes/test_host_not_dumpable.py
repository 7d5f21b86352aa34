"""The host of a process runtime is non-dumpable before any worker exists (finding RS-3 of a
security review: a same-uid worker read the host's memory through ``/proc/<host>/mem``; the
attack itself is ``tests/adversarial/test_process_containment.py``,
``test_a_same_uid_worker_cannot_read_the_hosts_memory``). Each entry runs in a fresh interpreter: the
flag is the process's and lasts."""

from __future__ import annotations

import subprocess
import sys

import pytest

_REPORT = "\nfrom codemode.runtimes.process import host_memory\nprint(host_memory.dumpable())\n"

ENTRIES = {
    # codemode.Builder(...).build() without a runtime: the library's default ProcessRuntime
    "library": (
        "import codemode\nfrom codemode import authz\ncodemode.Builder(authorizer=authz.allow_all()).build()"
    ),
    # codemode serve and the HTTP service build their runtime from the settings
    "serve and service": (
        "from codemode.startup.bootstrap import build_runtime\n"
        "from codemode.startup.config import load_settings\n"
        "build_runtime(load_settings(runtime='process', allow_all=True))"
    ),
}


def _dumpable_after(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code + _REPORT],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE is Linux's")
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_process_runtimes_host_is_not_dumpable(entry: str) -> None:
    assert _dumpable_after(ENTRIES[entry]) == "False"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE is Linux's")
def test_importing_codemode_changes_nothing() -> None:
    """Only a process runtime changes the flag: an application that imports codemode, or runs its
    workers in containers, stays dumpable."""
    assert (
        _dumpable_after(
            "import codemode\nfrom codemode.runtimes.docker import DockerRuntime\nDockerRuntime()"
        )
        == "True"
    )
