"""The stderr relay of a Kubernetes worker (``codemode_worker.stderr_relay``, finding RS-4): what the
worker writes to descriptors 2 and 1 after ``start`` reaches the original stderr up to the budget,
then one line counts the rest; the frame descriptors are not held open by the relay. The pod-level
attack is ``tests/e2e_kubernetes/test_containment.py``,
``test_a_workers_container_log_stays_within_its_ephemeral_storage``."""

from __future__ import annotations

import subprocess
import sys

WRITER = """
import os
from codemode_worker import stderr_relay
stderr_relay.start(budget=100)
for _ in range(100):
    os.write(2, b"x" * 99 + b"\\n")
    os.write(1, b"y" * 99 + b"\\n")
"""


def test_the_relay_passes_on_the_budget_and_counts_the_rest() -> None:
    out = subprocess.run([sys.executable, "-I", "-c", WRITER], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout == b""  # descriptor 1 goes through the relay too
    assert out.stderr == b"x" * 99 + b"\n" + b"\ncodemode worker: 19900 more bytes of stderr dropped\n"
