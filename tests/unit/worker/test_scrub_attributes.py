"""The reuse mode's scrub compares the supervisor's whole scheduling attributes.

A worker of the same uid as the supervisor may change what the kernel lets it change about PID 1
(its filter refuses the calls; without the filter, on Kubernetes' ``RuntimeDefault``, they pass).
A custom slice of the fair class (``sched_setattr`` with ``sched_runtime``, Linux 6.12) left the
policy, the priority and the nice value as they were: the scrub's comparison passed, and every
later worker inherited the slice. ``scrub.process_attributes`` must now differ. Each case runs in a
child interpreter (the test process keeps its own attributes), on the real kernel.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from codemode_worker import scrub

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"),
    reason="sched_setattr by number (x86_64, aarch64)",
)

#: Sets a 5 ms custom slice of the fair class on itself, between two readings of the attributes
#: the scrub compares; prints whether they differ, and whether the kernel took the slice (its own
#: /proc/self/sched shows ``se.slice``).
CHILD = """
import ctypes, json, os, platform, struct
from codemode_worker import scrub

def slice_ns():
    for line in open("/proc/self/sched"):
        if line.startswith("se.slice"):
            return int(line.split(":")[1])
    return None

libc = ctypes.CDLL(None, use_errno=True)
SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}[platform.machine()]
before = scrub.process_attributes()
slice_before = slice_ns()
# struct sched_attr (56 bytes): size, policy (SCHED_OTHER), flags, nice, priority, runtime,
# deadline, period, util_min, util_max
attr = struct.pack("=IIqiIQQQII", 56, 0, 0, os.getpriority(os.PRIO_PROCESS, 0), 0, 5_000_000, 0, 0, 0, 0)
status = libc.syscall(SCHED_SETATTR, 0, ctypes.c_char_p(attr), 0)
print(json.dumps({
    "set": status == 0 or os.strerror(ctypes.get_errno()),
    "took": slice_before is not None and slice_ns() != slice_before,
    "differs": scrub.process_attributes() != before,
}))
"""


def test_a_custom_slice_changes_the_attributes_the_scrub_compares() -> None:
    out = subprocess.run([sys.executable, "-I", "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout)
    if found["set"] is not True or not found["took"]:
        pytest.skip(f"this kernel has no custom slices of the fair class: {found}")
    assert found["differs"] is True, found


def test_the_scheduling_attributes_are_the_whole_struct() -> None:
    attributes = scrub.sched_attributes()
    if isinstance(attributes, int):
        pytest.skip(f"sched_getattr refused here (errno {-attributes})")
    size = int.from_bytes(attributes[:4], sys.byteorder)
    assert size >= 56 and len(attributes) == size  # every field this kernel knows, VER1 at least
    assert scrub.sched_attributes() == attributes  # stable while nothing changes it
