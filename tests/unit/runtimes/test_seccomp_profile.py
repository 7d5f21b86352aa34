"""The worker container's seccomp profile (codemode.runtimes.seccomp_profile) follows the worker's
own policy (codemode_worker.syscalls) and adds only the start-up calls."""

from __future__ import annotations

import json
import subprocess
import sys

from codemode.runtimes.seccomp_profile import STARTUP, docker_profile
from codemode_worker import syscalls


def _actions() -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    for rule in docker_profile()["syscalls"]:
        action = rule["action"] + ("" if "errnoRet" not in rule else f":{rule['errnoRet']}")
        action += "?" if "args" in rule else ""
        for name in rule["names"]:
            seen.setdefault(name, set()).add(action)
    return seen


def test_the_profile_denies_what_the_worker_denies_but_its_start_up() -> None:
    seen = _actions()
    assert {n for n, a in seen.items() if a == {"SCMP_ACT_ERRNO:1"}} == syscalls.DENIED - STARTUP
    assert {n for n, a in seen.items() if a == {"SCMP_ACT_ERRNO:38"}} == syscalls.ABSENT
    assert {n for n, a in seen.items() if a == {"SCMP_ACT_ALLOW"}} >= syscalls.ALLOWED | STARTUP
    for name in ("socket", "socketpair", "io_uring_setup", "ptrace", "bpf", "unshare", "mount", "fork"):
        assert seen[name] == {"SCMP_ACT_ERRNO:1"}
    assert seen["clone"] == {"SCMP_ACT_ALLOW?", "SCMP_ACT_ERRNO:1?"}  # threads only
    profile = docker_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and profile["defaultErrnoRet"] == 38


def test_the_profile_is_printed_for_operators() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "codemode.runtimes.seccomp_profile"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == docker_profile()


def test_the_profile_allows_private_futexes_only() -> None:
    # A shared futex is keyed by a file's inode, which every container of the image on
    # a node shares. Only the private flag's form is allowed; a shared wait gets EAGAIN, every other
    # shared command EPERM, each rule a masked comparison of the operation.
    assert _actions()["futex"] == {"SCMP_ACT_ALLOW?", "SCMP_ACT_ERRNO:1?", "SCMP_ACT_ERRNO:11?"}
    rules = [r for r in docker_profile()["syscalls"] if r["names"] == ["futex"]]
    allowed = [r["args"] for r in rules if r["action"] == "SCMP_ACT_ALLOW"]
    assert allowed == [[{"index": 1, "value": 128, "valueTwo": 128, "op": "SCMP_CMP_MASKED_EQ"}]]
    waits = sorted(r["args"][0]["valueTwo"] for r in rules if r.get("errnoRet") == 11)
    assert waits == [0, 9]  # FUTEX_WAIT, FUTEX_WAIT_BITSET
    # sysinfo: the interpreter's start-up only (the worker's own filter refuses it)
    assert "sysinfo" in STARTUP and "sysinfo" in syscalls.DENIED
