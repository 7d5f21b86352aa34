"""Start-up cost of the worker's own confinement, Landlock and seccomp (budget: a few
ms per worker).

Run: ``python -m tests.benchmarks.bench_confinement [--rounds R]``. Prints numbers; asserts nothing.
In the same run, interleaved so that machine load hits both alike:

* **start to probe_ack**: ``python -I -m codemode_worker`` from spawn until its ``probe_ack``, with the
  confinement (the real entry) and without it (the same entry with ``restrict_files``, ``prepare``
  and ``confine`` replaced by no-ops in that process only);
* **in-process**: ``confinement.restrict_files()`` (the Landlock domain),
  ``confinement.prepare()`` (libseccomp builds the filter) and ``confine()`` (limits, not
  dumpable, NO_NEW_PRIVS, loading with TSYNC, the check), timed inside a fresh process each round.

The worker runs the host's Python here (the process runtime); in the worker image the interpreter is
Debian's with the same libseccomp binding.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import time

PROBE = json.dumps({"k": "probe", "v": 1}).encode()
PROBE_FRAME = struct.pack(">I", len(PROBE)) + PROBE
UNCONFINED = (
    "from codemode_worker import entry\n"
    "entry.restrict_files = lambda: None\n"
    "entry.prepare = lambda: None\n"
    "entry.confine = lambda _filter: None\n"
    "entry.run()\n"
)
IN_PROCESS = (
    "import time\n"
    "from codemode_worker import confinement\n"
    "tl = time.perf_counter()\n"
    "confinement.restrict_files()\n"
    "t0 = time.perf_counter()\n"
    "f = confinement.prepare()\n"
    "t1 = time.perf_counter()\n"
    "confinement.confine(f)\n"
    "t2 = time.perf_counter()\n"
    "print((t0 - tl) * 1000, (t1 - t0) * 1000, (t2 - t1) * 1000)\n"
)


def start_to_ack(command: list[str]) -> float:
    """Milliseconds from spawn to a complete probe_ack frame."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={"CODEMODE_WORKER": "1"},
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(PROBE_FRAME)
    proc.stdin.flush()
    header = proc.stdout.read(4)
    body = proc.stdout.read(struct.unpack(">I", header)[0])
    elapsed = (time.perf_counter() - t0) * 1000
    assert json.loads(body)["k"] == "probe_ack"
    proc.stdin.close()
    proc.wait()
    return elapsed


def in_process() -> tuple[float, float, float]:
    out = subprocess.run(
        [sys.executable, "-I", "-c", IN_PROCESS], capture_output=True, text=True, check=True, timeout=60
    )
    landlock, build, load = out.stdout.split()
    return float(landlock), float(build), float(load)


def _row(name: str, values: list[float]) -> str:
    p50, p90 = statistics.median(values), statistics.quantiles(values, n=10)[-1]
    return f"{name:<34} p50 {p50:7.2f} ms   p90 {p90:7.2f} ms   min {min(values):7.2f} ms"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args()
    confined_cmd = [sys.executable, "-I", "-m", "codemode_worker"]
    unconfined_cmd = [sys.executable, "-I", "-c", UNCONFINED]
    start_to_ack(confined_cmd)  # warm the page cache
    start_to_ack(unconfined_cmd)
    confined, unconfined, landlock, build, load = [], [], [], [], []
    for _ in range(args.rounds):
        confined.append(start_to_ack(confined_cmd))
        unconfined.append(start_to_ack(unconfined_cmd))
        ll, b, lo = in_process()
        landlock.append(ll)
        build.append(b)
        load.append(lo)
    print(f"worker start-up, {args.rounds} rounds each, interleaved (python {sys.version.split()[0]})")
    print(_row("start to probe_ack, confined", confined))
    print(_row("start to probe_ack, unconfined", unconfined))
    diff = statistics.median(confined) - statistics.median(unconfined)
    ratio = statistics.median(confined) / statistics.median(unconfined)
    print(f"{'difference of the medians':<34} {diff:+7.2f} ms   ratio {ratio:.3f}")
    print(_row("restrict_files() (Landlock)", landlock))
    print(_row("prepare() (build the filter)", build))
    print(_row("confine() (limits, load, check)", load))
    total = [ll + b + lo for ll, b, lo in zip(landlock, build, load, strict=True)]
    print(_row("all three", total))


if __name__ == "__main__":
    main()
