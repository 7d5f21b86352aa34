"""``codemode quotas tune``'s hold line (``codemode.ops.quota_probes``) under the worker's real
confinement: the worker's Landlock domain refuses every file of ``/proc`` and ``/sys``,
so the hold opens what it reads before the worker confines itself. The worker here is the host's
Python running the image's worker code, as the process runtime runs it (the uid drop when the host
is root); the host closes its stdin at once, so the worker serves nothing and the hold writes its
line."""

from __future__ import annotations

import os
import subprocess
import sys

from codemode.ops.quota_probes import hold_command, parse_report

NOBODY = 65534


def held_report() -> dict[str, object]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CODEMODE_WORKER": "1"}
    if os.geteuid() == 0:
        env["CODEMODE_WORKER_UID"] = str(NOBODY)
    command = hold_command(sys.executable)
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return parse_report(done.stderr)


def test_the_hold_line_reads_the_workers_own_counters_once_it_is_confined() -> None:
    report = held_report()
    # /proc/self/status and stat, read after the worker confined itself
    for key in ("VmPeak", "VmHWM", "Threads", "process_cpu_s"):
        value = report.get(key)
        assert isinstance(value, int | float) and value > 0, report
    # the hold's own descriptors are not the worker's
    held, fds = report["held"], report["fds"]
    assert isinstance(held, int) and held >= 2 and isinstance(fds, int) and fds >= 3, report
