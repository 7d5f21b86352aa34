"""The floors ``bench_service_load`` prints beside its results, measured in the same run.

- **CPU per execute** (``CpuMeter``): the CPU seconds the server process tree spent during the load
  (the service process itself; and its workers and the worker template, counted when they are
  reaped), per execute, and so executes/s per core. psutil reads ``/proc``.
- **The service path alone**: ``search_api`` calls through the same server, the same clients and
  sessions, no worker (``--mode search`` of the same run; bench_service_load runs it).
- **A fork of a pre-imported worker + trivial Starlark + reap** (``fork_floor``): one ``python -I``
  process imports and warms the worker's interpreter once, then forks, runs ``def main(): return 1``
  in the child and reaps it, serially: forks per second of wall time and per CPU second (one core).

Nothing here asserts: it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import psutil

__all__ = ["CpuMeter", "add_arguments", "fork_floor", "print_cpu", "server_env"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--process-spawn", choices=["template", "classic"], help="process runtime: how workers are made"
    )
    parser.add_argument(
        "--no-floors", dest="floors", action="store_false", help="skip the floors measured after the load"
    )
    parser.add_argument("--fork-n", type=int, default=300, help="forks of the fork floor (default 300)")


def server_env(args: argparse.Namespace) -> dict[str, str]:
    return {"CODEMODE_PROCESS_SPAWN": args.process_spawn} if args.process_spawn else {}


def _tree_cpu(pid: int) -> tuple[float, float]:
    """(CPU seconds of ``pid`` itself, CPU seconds of its descendants, reaped or alive)."""
    try:
        root = psutil.Process(pid)
        own = root.cpu_times()
    except psutil.Error:
        return 0.0, 0.0
    below = own.children_user + own.children_system
    for child in root.children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue  # gone meanwhile: counted once its parent reaped it
        below += t.user + t.system + t.children_user + t.children_system  # its reaped children too
    return own.user + own.system, below


@dataclass
class CpuMeter:
    """CPU of a server process tree between ``start()`` and ``stop()``; and of the machine."""

    pid: int
    own: float = 0.0
    below: float = 0.0
    machine: float = 0.0

    def start(self) -> CpuMeter:
        self.own, self.below = _tree_cpu(self.pid)
        self.machine = machine_busy()
        return self

    def stop(self) -> CpuMeter:
        own, below = _tree_cpu(self.pid)
        return CpuMeter(self.pid, own - self.own, below - self.below, machine_busy() - self.machine)


def machine_busy() -> float:
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def print_cpu(cpu: CpuMeter, executes: int, wall: float) -> None:
    if executes <= 0 or wall <= 0:
        return
    total = cpu.own + cpu.below
    cores = psutil.cpu_count() or 1
    print(
        f"host CPU per execute      service {cpu.own / executes * 1e3:.2f} ms + workers/template "
        f"{cpu.below / executes * 1e3:.2f} ms = {total / executes * 1e3:.2f} ms"
    )
    print(
        f"density                   {executes / total if total else 0:.1f} executes/s per core "
        f"(machine busy {cpu.machine / wall / cores * 100:.0f}% of {cores} cores, other load included)"
    )


FORK_FLOOR = r"""
import json, os, sys, time
from codemode_worker import interpreter
interpreter.warm_up()
limits = interpreter.ExecLimits(
    max_steps=1_000_000, max_value_depth=32, max_value_bytes=1 << 20,
    max_native_calls=10, max_callstack=200, max_print_bytes=1024,
)
n = int(sys.argv[1])
t0, c0 = time.perf_counter(), os.times()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        outcome = interpreter.run_program("def main():\n    return 1\n", [], limits, interpreter._WarmHost())
        os._exit(0 if outcome.value == 1 else 1)
    _, status = os.waitpid(pid, 0)
    if status:
        raise SystemExit("a forked program failed")
wall, c1 = time.perf_counter() - t0, os.times()
cpu = sum(c1[:4]) - sum(c0[:4])
print(json.dumps({"n": n, "wall": wall, "cpu": cpu}))
"""


def fork_floor(n: int) -> dict[str, float]:
    """Forks of a pre-imported, warmed worker interpreter running a trivial program, serially."""
    env = {"CODEMODE_WORKER": "1"}
    out = subprocess.run(
        [sys.executable, "-I", "-c", FORK_FLOOR, str(n)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        timeout=600,
    )
    result: dict[str, float] = json.loads(out.stdout)
    cores = psutil.cpu_count() or 1
    per_cpu = result["n"] / result["cpu"] if result["cpu"] else 0.0
    print(
        f"floor: fork+starlark+reap {result['n'] / result['wall']:.1f}/s serial, {per_cpu:.1f}/s per CPU "
        f"second (x {cores} cores = {per_cpu * cores:.0f}/s)"
    )
    return result


if __name__ == "__main__":
    fork_floor(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
    os._exit(0)
