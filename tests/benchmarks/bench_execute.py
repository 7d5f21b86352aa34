"""Execute benchmarks on the process runtime (prints numbers; not a test).

    python -m tests.benchmarks.bench_execute [--n 200]

Measured in one run, so ratios are meaningful on a noisy machine:
- baseline: a bare ``python -c pass`` spawn (subprocess create → exit);
- trivial execute cold (no pool: spawn + warm-up + run) and warm (WarmPool);
- one native call and 100 native calls (warm), and the per-call round trip derived from them;
- throughput with 8 concurrent executes (warm pool of 8).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import codemode
from codemode.ops.bench import (  # the measuring helpers are shared with `codemode bench`
    HUNDRED,
    ONE_CALL,
    SUBJECT,
    TRIVIAL,
    EchoIn,
    EchoOut,
    aecho,
    echo,
    line,
    timed,
)
from codemode.ops.bench import build_server as build
from codemode.ops.percentile import percentile

__all__ = [
    "HUNDRED",
    "ONE_CALL",
    "TRIVIAL",
    "EchoIn",
    "EchoOut",
    "aecho",
    "build",
    "echo",
    "line",
    "percentile",
]

ALICE = SUBJECT


async def bare_spawn() -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()


async def main(n: int) -> None:
    print(f"python {sys.version.split()[0]}, n={n}")
    base = line("baseline: python -c pass spawn", await timed(max(20, n // 4), bare_spawn))

    cold_srv = build(codemode.ProcessRuntime())
    cold = line(
        "trivial execute, cold (no pool)",
        await timed(max(20, n // 4), lambda: cold_srv.execute(TRIVIAL, subject=ALICE)),
    )
    await cold_srv.aclose()

    pool = codemode.WarmPool(codemode.ProcessRuntime(), 8)
    srv = build(pool)
    await srv.start()

    async def warm_run(src: str) -> Any:
        await pool.wait_warm(60)
        t0 = time.perf_counter()
        await srv.execute(src, subject=ALICE)
        return time.perf_counter() - t0

    async def series(src: str, count: int) -> list[float]:
        return [await warm_run(src) for _ in range(count)]

    warm = line("trivial execute, warm pool", await series(TRIVIAL, n))
    line("one native call, warm pool", await series(ONE_CALL, n))
    hundred = line("100 native calls, warm pool", await series(HUNDRED, max(20, n // 4)))
    per_call = (hundred["p50"] - warm["p50"]) / 100
    print(f"{'native call round trip (derived)':<38} p50≈{per_call * 1e3:8.1f} µs")

    # Throughput: 8 concurrent clients, each running executes back to back for a fixed count.
    await pool.wait_warm(60)
    total = max(80, n)
    t0 = time.perf_counter()

    async def client(k: int) -> None:
        for _ in range(k):
            await srv.execute(TRIVIAL, subject=ALICE)

    await asyncio.gather(*(client(total // 8) for _ in range(8)))
    elapsed = time.perf_counter() - t0
    rate = (total // 8 * 8) / elapsed
    print(f"{'throughput, 8 concurrent (pool 8)':<38} {rate:8.1f} executes/s")
    await srv.aclose()

    print()
    print(f"ratio cold/baseline      = {cold['p50'] / base['p50']:.2f}")
    print(f"ratio warm/baseline      = {warm['p50'] / base['p50']:.3f}")
    print(f"ratio baseline/warm      = {base['p50'] / warm['p50']:.1f}x faster than a bare spawn")
    print("goals: warm trivial p50 <= 2 ms; native round trip p50 <= 150 µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    asyncio.run(main(parser.parse_args().n))
