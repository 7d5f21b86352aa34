"""``parallel(...)`` against the same calls made one by one (prints numbers; not a test).

    python -m tests.benchmarks.bench_parallel [--n 7]

Two series on the process runtime, each the p50 (and best) over ``--n`` executes, serial and
parallel measured alternately in the same run so that the machine's noise hits both alike:

- five calls to a capability whose async handler sleeps 200 ms: one by one (the floor is 5 × 200 =
  1,000 ms) against one ``parallel`` of the five (goal ≤ 260 ms: one sleep plus the execute's own cost);
- 100 calls of a trivial async capability: one by one against one ``parallel`` of 100
  (``max_parallel_calls`` 100 and ``max_native_calls`` 100 so that both make the same calls).

Printed with the ratio parallel / serial, beside the floor of the same run: an execute that makes no
call (what a parallel of five sleeps costs beyond one sleep).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import codemode
from codemode import authz

from .shared_parts import In, Out, echo

SUBJECT = authz.Subject("bench")
SLEEP = 0.2
GOAL_MS = 260.0


async def nap(ctx: codemode.CallContext, subject: authz.Subject, args: In) -> Out:
    await asyncio.sleep(SLEEP)
    return Out(args.n)


SERIES = {
    "5 x sleep 200 ms": (
        "def main():\n    return [bench.nap(n=i) for i in range(5)]\n",
        "def main():\n    return parallel([(bench.nap, {'n': i}) for i in range(5)])\n",
    ),
    "100 x trivial": (
        "def main():\n    return [bench.echo(n=i) for i in range(100)]\n",
        "def main():\n    return parallel([(bench.echo, {'n': i}) for i in range(100)])\n",
    ),
}


def build() -> codemode.Server:
    builder = codemode.Builder(
        authorizer=authz.allow_all(),
        limits=codemode.Limits(max_parallel_calls=100, max_native_calls=100, max_execution_time=30.0),
        runtime=codemode.ProcessRuntime(),
    )
    builder.register(
        codemode.Capability(name="bench.nap", summary="Sleeps 200 ms.", handler=nap),
        codemode.Capability(name="bench.echo", summary="Returns its argument.", handler=echo),
    )
    return builder.build()


async def timed(server: codemode.Server, source: str) -> float:
    t0 = time.perf_counter()
    await server.execute(source, subject=SUBJECT)
    return (time.perf_counter() - t0) * 1000


async def main(n: int) -> None:
    server = build()
    try:
        for serial, parallel in SERIES.values():  # warm: the worker template, both code paths
            await timed(server, serial)
            await timed(server, parallel)
        floor = [await timed(server, "def main():\n    return 1\n") for _ in range(n)]
        print(f"{'no call (floor)':18s} p50 {statistics.median(floor):8.1f} ms (best {min(floor):7.1f})")
        for name, (serial, parallel) in SERIES.items():
            one: list[float] = []
            many: list[float] = []
            for _ in range(n):
                one.append(await timed(server, serial))
                many.append(await timed(server, parallel))
            s, p = statistics.median(one), statistics.median(many)
            line = (
                f"{name:18s} serial p50 {s:8.1f} ms (best {min(one):7.1f})   "
                f"parallel p50 {p:7.1f} ms (best {min(many):7.1f})   ratio {p / s:.2f}"
            )
            if name.startswith("5 x"):
                line += f"   goal <= {GOAL_MS:.0f} ms: {'met' if p <= GOAL_MS else 'MISSED'}"
            print(line, flush=True)
    finally:
        await server.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=7)
    asyncio.run(main(parser.parse_args().n))
