"""Fixed warm pool against a demand-sized one, same run, same pattern (prints numbers; not a test).

    python -m tests.benchmarks.pool_burst [--runtime process|docker] [--min 2] [--max 8]
        [--bursts 3] [--burst 32] [--gap 3] [--idle 20] [--subjects 4] [--slots 8]

The pattern: ``--bursts`` bursts of ``--burst`` trivial executes each (spread over ``--subjects``
subjects, all started at once, ``--slots`` in flight), ``--gap`` seconds apart, then ``--idle``
seconds with no execute. Three pools see the same pattern, one after the other: fixed at ``--min``
(today's ``--pool``), fixed at ``--max``, and demand-sized between them (``--pool --min --pool-max
--max``). For each it prints the client latency p50/p99 of the bursts' executes, the share that got
a warm worker, the idle workers right after the last burst and at the end of the idle time, and the
idle worker-seconds over the whole run (what the pool costs the host while nobody uses it).

``bench_docker`` runs it for Docker (``--burst-pattern``); the process runtime uses the classic spawn
(``python -I`` per worker: a cold start costs what a container's does, relatively).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import codemode
from codemode import authz
from codemode.ops.percentile import percentile
from codemode.runtimes.process import ProcessOptions

TRIVIAL = "def main():\n    return 1\n"


@dataclass
class Result:
    name: str
    p50_ms: float
    p99_ms: float
    warm_share: float
    idle_after_burst: int
    idle_at_end: int
    idle_worker_seconds: float
    started: int
    target_peak: int
    later_p50_ms: float

    def line(self) -> str:
        return (
            f"{self.name:<24} burst p50 {self.p50_ms:7.1f} ms  p99 {self.p99_ms:7.1f} ms  "
            f"(bursts after the first: p50 {self.later_p50_ms:7.1f} ms)  "
            f"warm {self.warm_share * 100:5.1f} %  idle after burst {self.idle_after_burst:2d}  "
            f"idle at end {self.idle_at_end:2d}  idle worker-s {self.idle_worker_seconds:7.1f}  "
            f"started {self.started:3d}  peak target {self.target_peak:2d}"
        )


async def run_pattern(name: str, pool: codemode.WarmPool, args: argparse.Namespace) -> Result:
    builder = codemode.Builder(
        authorizer=authz.allow_all(),
        runtime=pool,
        limits=codemode.Limits(max_concurrent_executions=args.slots, max_execution_time=120),
    )
    server = builder.build()
    subjects = [authz.Subject(f"tenant-{i}") for i in range(args.subjects)]
    latencies: list[float] = []
    idle_seconds = 0.0
    peak = 0
    sampling = True

    async def sample() -> None:
        nonlocal idle_seconds, peak
        last = time.monotonic()
        while sampling:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            idle_seconds += pool.idle * (now - last)
            peak = max(peak, pool.size)
            last = now

    later: list[float] = []

    async def one(subject: authz.Subject, burst: int) -> None:
        t0 = time.perf_counter()
        await server.run(TRIVIAL, subject=subject)
        latencies.append(time.perf_counter() - t0)
        if burst:
            later.append(latencies[-1])

    async with server:
        await pool.wait_warm(300)
        sampler = asyncio.create_task(sample())
        for b in range(args.bursts):
            if b:
                await asyncio.sleep(args.gap)
            await asyncio.gather(*(one(subjects[i % len(subjects)], b) for i in range(args.burst)))
        idle_after = pool.idle
        await asyncio.sleep(args.idle)
        idle_end = pool.idle
        sampling = False
        await sampler
        started = len(pool.refill_seconds) + pool.cold_taken
        warm = pool.warm_taken / max(1, pool.warm_taken + pool.cold_taken)
    return Result(
        name,
        statistics.median(latencies) * 1e3,
        percentile(latencies, 99) * 1e3,
        warm,
        idle_after,
        idle_end,
        idle_seconds,
        started,
        peak,
        statistics.median(later) * 1e3 if later else float("nan"),
    )


async def compare(make: Callable[[], Any], args: argparse.Namespace) -> list[Result]:
    """The three pools on the runtime ``make()`` builds (a new one for each), printed."""
    print(
        f"burst pattern: {args.bursts} bursts of {args.burst} executes over {args.subjects} subjects, "
        f"{args.gap} s apart, then {args.idle} s idle; slots {args.slots}; subject share {args.share}"
    )
    share = args.share
    configs = [
        (f"fixed pool {args.min}", codemode.WarmPool(make(), args.min, subject_share=share)),
        (f"fixed pool {args.max}", codemode.WarmPool(make(), args.max, subject_share=share)),
    ]
    for window in args.window:
        configs.append(
            (
                f"demand {args.min}..{args.max} w={window:g}s",
                codemode.WarmPool(
                    make(),
                    args.min,
                    maximum=args.max,
                    window=window,
                    hold=args.hold,
                    headroom=args.headroom,
                    subject_share=share,
                ),
            )
        )
    results = []
    for name, pool in configs:
        result = await run_pattern(name, pool, args)
        print(result.line(), flush=True)
        results.append(result)
    return results


async def fill_times(make: Callable[[], Any], size: int, concurrencies: list[int]) -> dict[int, float]:
    """Seconds an empty pool of ``size`` takes to fill at each refill concurrency, printed."""
    out: dict[int, float] = {}
    for concurrency in concurrencies:
        pool = codemode.WarmPool(make(), size, refill_concurrency=concurrency)
        t0 = time.perf_counter()
        await pool.start()
        try:
            await pool.wait_warm(300)
            out[concurrency] = time.perf_counter() - t0
        finally:
            await pool.aclose()
        print(
            f"fill an empty pool of {size}, refill concurrency {concurrency}: {out[concurrency]:6.2f} s "
            f"({size / out[concurrency]:5.1f} workers/s; x{out[concurrencies[0]] / out[concurrency]:.2f} "
            f"against concurrency {concurrencies[0]})",
            flush=True,
        )
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min", type=int, default=2, help="the fixed pool, and the demand pool's minimum")
    p.add_argument("--max", type=int, default=8, help="the large fixed pool, and the demand pool's maximum")
    p.add_argument("--bursts", type=int, default=3)
    p.add_argument("--burst", type=int, default=32, help="executes per burst")
    p.add_argument("--gap", type=float, default=3.0, help="seconds between bursts")
    p.add_argument("--idle", type=float, default=20.0, help="seconds idle after the last burst")
    p.add_argument("--subjects", type=int, default=4)
    p.add_argument("--slots", type=int, default=8, help="max_concurrent_executions")
    p.add_argument(
        "--window",
        type=float,
        action="append",
        help="the demand pool's rate window, s (repeat to compare several; default: the pool's, 2)",
    )
    p.add_argument("--share", type=float, default=0.5, help="every pool's subject share (default 0.5)")
    p.add_argument("--hold", type=float, default=10.0, help="the demand pool's hold, s (default 10)")
    p.add_argument(
        "--fill",
        type=int,
        action="append",
        help="also time filling an empty pool of --max at this refill concurrency (repeat)",
    )
    p.add_argument("--headroom", type=float, default=2.0, help="the demand pool's headroom (default 2)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime", choices=["process", "docker"], default="process")
    p.add_argument("--image", default=None, help="worker image for --runtime docker")
    add_arguments(p)
    args = p.parse_args()
    args.window = args.window or [2.0]
    if args.runtime == "docker":
        from codemode.runtimes.docker import DEFAULT_IMAGE, DockerOptions, DockerRuntime

        image = args.image or DEFAULT_IMAGE
        asyncio.run(run_all(lambda: DockerRuntime(DockerOptions(image=image)), args))
    else:
        asyncio.run(run_all(lambda: codemode.ProcessRuntime(ProcessOptions(spawn="classic")), args))


async def run_all(make: Callable[[], Any], args: argparse.Namespace) -> list[Result]:
    """``--fill`` (if asked), then :func:`compare`."""
    if args.fill:
        await fill_times(make, args.max, args.fill)
    return await compare(make, args) if args.bursts else []


if __name__ == "__main__":
    main()
