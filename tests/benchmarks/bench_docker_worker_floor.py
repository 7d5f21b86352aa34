"""What the default Docker mode's rate would be with a worker that costs nothing (prints numbers; not
a test). Needs a Docker engine, codemode-worker:1 and gcc.

    python -m tests.benchmarks.bench_docker_worker_floor [--rounds 3] [--n 40]

The goal puts the default mode (a fresh container per execute over a warm pool) at 1.5x the raw
engine's rate (``bench_docker``: hardened containers of the same image, created, started and
removed, 4 at a time). The worker's CPython start is the one part of a default-mode execute that the
raw cycle does not pay. This measures how far removing it could go: per round, interleaved, the raw
engine rate, the default mode with the real worker, and the default mode with ``nothing_worker``
(nothing_worker/nothing_worker.c: a static C program that answers the probe and the exec and exits;
built here into an image made of the worker image plus it, removed at the end). The same host, the
same runtime and hardening, the same pool and concurrency: only the worker's own cost differs. The
rounds run the series in turn, forwards and backwards; at the end, each default mode against the
raw rate of its own round too (median, range, how many rounds reach 1.5x): on a shared machine the
rates drift between rounds, and the spread says how far one run can be trusted.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import docker

from codemode.runtimes.docker import DEFAULT_IMAGE

from .bench_docker import MachineCPU, default_rate, raw_rate

HERE = Path(__file__).parent / "nothing_worker"
TAG = "codemode-bench-nothing-worker:1"
#: The series of a round, in the order of even rounds (odd rounds run them backwards).
ORDER = ("raw", "worker", "nothing")


def build(base: str) -> None:
    """The worker image plus the compiled nothing_worker, as ``TAG``."""
    with tempfile.TemporaryDirectory() as context:
        subprocess.run(
            ["gcc", "-O2", "-static", "-o", f"{context}/nothing_worker", str(HERE / "nothing_worker.c")],
            check=True,
        )
        shutil.copy(HERE / "Dockerfile", context)
        api = docker.APIClient(version="auto", timeout=120)
        for chunk in api.build(path=context, tag=TAG, buildargs={"BASE": base}, rm=True, decode=True):
            if "error" in chunk:
                raise SystemExit(f"building {TAG} failed: {chunk['error']}")
        api.close()


async def run(args: argparse.Namespace) -> None:
    build(args.image)
    api = docker.APIClient(version="auto", timeout=60)
    series: dict[str, list[tuple[float, float]]] = {"raw": [], "worker": [], "nothing": []}
    print(
        f"{args.rounds} rounds of {args.n} containers or executes per series, 4 at a time, pool 4, "
        f"image {args.image}"
    )
    try:
        for r in range(args.rounds):
            # The order turns round by round: a machine that speeds up or slows down over a round
            # favours no series.
            for name in ORDER if r % 2 == 0 else ORDER[::-1]:
                cpu = MachineCPU()
                if name == "raw":
                    with cpu:
                        rate = await asyncio.to_thread(raw_rate, api, args.image, None, 4, args.n)
                else:
                    image, entry = (args.image, None) if name == "worker" else (TAG, ("/nothing_worker",))
                    rate = await default_rate(image, None, 4, 4, args.n, cpu, entrypoint=entry)
                series[name].append((rate, 1000 * cpu.busy / args.n))
            print(
                f"round {r + 1}: "
                + ", ".join(f"{k} {v[-1][0]:.2f}/s ({v[-1][1]:.0f} ms CPU)" for k, v in series.items())
            )
    finally:
        api.remove_image(TAG, force=True)
        api.close()
    raw = statistics.median(x[0] for x in series["raw"])
    print(
        f"raw engine                       {raw:6.2f} containers/s (median), "
        f"machine CPU {statistics.median(x[1] for x in series['raw']):.1f} ms per container"
    )
    for name, label in (("worker", "default mode, the worker"), ("nothing", "default mode, nothing_worker")):
        rate = statistics.median(x[0] for x in series[name])
        cpu_ms = statistics.median(x[1] for x in series[name])
        print(
            f"{label:<32} {rate:6.2f} executes/s = {rate / raw:.2f}x the raw rate (goal >= 1.5), "
            f"machine CPU {cpu_ms:.1f} ms per execute"
        )
        ratios = sorted(x[0] / y[0] for x, y in zip(series[name], series["raw"], strict=True))
        print(
            f"{'':<32} against the raw rate of the same round: median {statistics.median(ratios):.2f}x, "
            f"rounds {ratios[0]:.2f}-{ratios[-1]:.2f}x, "
            f"{sum(q >= 1.5 for q in ratios)} of {len(ratios)} >= 1.5"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", default=DEFAULT_IMAGE)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=40, help="containers or executes per series")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
