"""A worker forked from the process runtime's template enforces the Landlock ruleset the template
filled once (1.34 → 0.75 ms of CPU per worker): the same domain as a ruleset it fills
itself, and the one descriptor of the template it kept through the fork is closed before its first
frame (docs/reference/runtimes.md, "The worker's own confinement").

Real template code on a real kernel: a ``python -I`` process plays the template (the worker's
interpreter warm, the ruleset filled with ``confinement.prepare_files``), forks, and the child runs
``template._become_worker`` with the worker's own set-up (``template._confine``: Landlock, uid,
parent check, seccomp), then reports what it can open and which descriptors it holds. Skips where
the kernel has no Landlock.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = r"""
import json, os, sys
from codemode_worker import confinement, landlock, template

try:
    landlock.abi()
except landlock.Unavailable:
    print(json.dumps({"skip": "no Landlock"}))
    sys.exit(0)
files = confinement.prepare_files() if sys.argv[1] == "prepared" else None
keep = files.fd if files is not None else None
compiled = confinement.compile_filter()
parent = os.getpid()
stdin_r, stdin_w = os.pipe()
out_r, out_w = os.pipe()
err_r, err_w = os.pipe()
limits = template.Limits(cpu_seconds=30, address_space=0, open_files=64, max_processes=64)

def child():
    template._confine(parent, compiled, files)
    found = {}
    for path in ("/dev/ptmx", "/proc/self/status", "/etc/hostname"):
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NOCTTY))
            found[path] = "ok"
        except OSError as exc:
            found[path] = exc.errno
    held = []
    for fd in range(1024):  # fstat opens nothing: only the descriptors held show
        try:
            os.fstat(fd)
            held.append(fd)
        except OSError:
            pass
    found["fds"] = held
    os.write(1, json.dumps(found).encode())
    return 0

pid = os.fork()
if pid == 0:
    template._become_worker([stdin_r, out_w, err_w], 0, limits, child, keep)
for fd in (stdin_r, out_w, err_w, stdin_w):
    os.close(fd)
report = b""
while chunk := os.read(out_r, 65536):
    report += chunk
_, status = os.waitpid(pid, 0)
stderr = os.read(err_r, 65536).decode(errors="replace")
result = {"status": status, "stderr": stderr, "report": json.loads(report or b"null"), "keep": keep}
if files is not None:  # the template's own copy: untouched by the worker's enforcing and closing
    result["template_still_holds"] = os.path.exists(f"/proc/self/fd/{files.fd}")
print(json.dumps(result))
"""


def _run(mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, mode],
        env={"CODEMODE_WORKER": "1"},
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    if "skip" in result:
        pytest.skip(str(result["skip"]))
    return result


def test_a_forked_worker_enforces_the_templates_ruleset_and_keeps_no_descriptor_of_it() -> None:
    prepared, own = _run("prepared"), _run("own")
    for result in (prepared, own):
        assert result["status"] == 0, result
    # the same domain: devices and the kernel's files refused (EACCES = 13), the rest readable
    assert prepared["report"] == own["report"]
    report = prepared["report"]
    assert isinstance(report, dict)
    assert report["/dev/ptmx"] == 13 and report["/proc/self/status"] == 13, report
    assert report["/etc/hostname"] == "ok", report
    # nothing of the template but its three pipes: the kept ruleset descriptor is closed
    assert report["fds"] == [0, 1, 2], report
    assert isinstance(prepared["keep"], int) and prepared["keep"] > 2
    assert prepared["template_still_holds"] is True
