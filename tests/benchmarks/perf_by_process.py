"""Which processes a series' machine CPU went to, sampled by ``perf`` (benchmarks only; not a test).

``with CpuByProcess() as shares: ...`` runs ``perf record -a`` (every core, every process, 499
samples a second, no call graphs) over the block, then reads each sample's command and process
(not thread) with ``perf script``: the share of the busy samples (the idle task left out) each
process took. They are grouped into the parts of a container's start and end on Docker
(``PARTS``): the OCI runtime (runc with its ``runc:[N:...]`` stages, or crun), the per-container
``containerd-shim``, ``dockerd``, ``containerd``, the worker (the image's interpreter runs as
``python3``), the host (this benchmark's own process, by its pid: the raw cycle's client and, in
the default series, the server), and the rest (the kernel's threads and anything else running).

Short-lived processes are what a container start is made of (the OCI runtime, the shim, the worker), and
their CPU cannot be read from ``/proc`` once they are gone; sampling every core sees them.
``perf`` needs root (or ``kernel.perf_event_paranoid`` ≤ 0) and Debian's ``linux-perf``; without it
the shares say so in one line and the series runs as before.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

__all__ = ["PARTS", "CpuByProcess", "part_of"]

#: The parts, in the order printed; ``part_of`` maps a command name to one of them.
PARTS = ("worker", "oci-runtime", "containerd-shim", "dockerd", "containerd", "host", "other")


def part_of(comm: str, pid: int = 0) -> str:
    """The part a process belongs to (``PARTS``), by its command name and pid."""
    if pid == os.getpid():
        return "host"
    if comm.startswith("runc") or comm == "crun":
        return "oci-runtime"
    if comm.startswith("containerd-shim"):
        return "containerd-shim"
    if comm in ("dockerd", "containerd"):
        return comm
    if comm == "python3":
        return "worker"
    return "other"


class CpuByProcess:
    """``perf record -a`` over a block; ``shares`` (part -> fraction of the busy samples),
    ``samples`` (busy samples) and ``error`` (why there are none) once it ends."""

    def __init__(self) -> None:
        self.shares: dict[str, float] = {}
        self.samples = 0
        self.error = ""
        #: The largest command names in ``other``, with their fractions.
        self.others: list[tuple[str, float]] = []
        self._dir = ""
        self._binary = ""
        self._perf: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> CpuByProcess:
        perf = shutil.which("perf")
        if perf is None:
            self.error = "perf not found (Debian: apt-get install linux-perf)"
            return self
        self._binary = perf
        self._dir = tempfile.mkdtemp(prefix="codemode-perf-")
        self._perf = subprocess.Popen(
            [perf, "record", "-a", "-F", "499", "-q", "-o", os.path.join(self._dir, "perf.data")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._perf is None:
            return
        self._perf.send_signal(signal.SIGINT)
        _, err = self._perf.communicate(timeout=60)
        data = Path(self._dir, "perf.data")
        stopped = (0, 128 + signal.SIGINT, -signal.SIGINT)  # perf exits 130 when SIGINT stops it
        if self._perf.returncode not in stopped or not data.exists():
            last = (err.decode(errors="replace").strip().splitlines() or ["?"])[-1]
            self.error = f"perf record failed: {last}"
            shutil.rmtree(self._dir, ignore_errors=True)
            return
        report = subprocess.run(
            [self._binary, "script", "-i", str(data), "-F", "comm,pid"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        shutil.rmtree(self._dir, ignore_errors=True)
        if report.returncode != 0:
            self.error = f"perf script failed: {(report.stderr.strip().splitlines() or ['?'])[-1]}"
            return
        self._read(report.stdout)

    def _read(self, text: str) -> None:
        counts: Counter[str] = Counter()
        others: Counter[str] = Counter()
        for line in text.splitlines():
            # one sample a line: "   python3 1234" (the command, then the process id, not the thread's)
            comm, _, pid = line.strip().rpartition(" ")
            comm = comm.strip()
            if not pid.isdigit() or not comm or comm == "swapper":  # swapper: the idle task
                continue
            part = part_of(comm, int(pid))
            counts[part] += 1
            if part == "other":
                others[comm] += 1
        self.samples = sum(counts.values())
        if not self.samples:
            self.error = "perf recorded no busy samples"
            return
        self.shares = {part: counts[part] / self.samples for part in PARTS}
        self.others = [(comm, n / self.samples) for comm, n in others.most_common(3)]

    def per(self, busy_ms: float) -> str:
        """Each part's CPU in ms, given the series' machine CPU per container (``busy_ms``)."""
        if not self.shares:
            return f"by process: {self.error}"
        parts = ", ".join(f"{part} {busy_ms * self.shares[part]:.1f}" for part in PARTS)
        largest = ", ".join(f"{comm} {busy_ms * share:.1f}" for comm, share in self.others)
        return f"by process (perf, {self.samples} busy samples), ms: {parts} (largest other: {largest})"
