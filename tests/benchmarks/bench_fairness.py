"""Fair slots under greedy tenants (prints numbers; not a test).

    python -m tests.benchmarks.bench_fairness [--duration 8] [--program 1.0] [--greedy 2,3,4]

An in-process server on the process runtime with the default slots (8) and per-subject quota (4).
``k`` greedy tenants each keep their whole quota busy with programs that run ``--program`` seconds;
one light tenant submits a short program now and then. The light tenant's *start delay* is the time
from submitting its execute to its program's first capability call. Measured in one run for each k:

- baseline: the light tenant alone (spawn + worker start-up, no queueing);
- fifo: first-come-first-served slots without a reserve (the admission before fair slots,
  equivalent to the ``asyncio.Semaphore`` it replaced);
- fair: ``codemode.execution.admission.FairAdmission`` with the derived reserve (the default).

Everything is loopback-free (in process) and bounded by ``--duration`` per configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass

import codemode
from codemode import authz
from codemode.execution.admission import FairAdmission
from codemode.ops.percentile import percentile

QUOTA = 4
SLOTS = 8


@dataclass
class SleepIn:
    seconds: float


@dataclass
class Mark:
    t: float


async def _sleep(ctx: codemode.CallContext, subject: authz.Subject, args: SleepIn) -> Mark:
    await asyncio.sleep(args.seconds)
    return Mark(time.monotonic())


def _now(ctx: codemode.CallContext, subject: authz.Subject) -> Mark:
    return Mark(time.monotonic())


def build(fair: bool) -> codemode.Server:
    builder = codemode.Builder(
        authorizer=authz.allow_all(),
        limits=codemode.Limits(max_concurrent_executions=SLOTS, max_execution_time=30.0),
        runtime=codemode.ProcessRuntime(),
        subject_quota=QUOTA,
    )
    builder.register(
        codemode.Capability(id="bench.sleep.v1", name="bench.sleep", summary="Sleep.", handler=_sleep),
        codemode.Capability(id="bench.now.v1", name="bench.now", summary="Now.", handler=_now),
    )
    server = builder.build()
    if not fair:
        server._executor.slots = FairAdmission(SLOTS, fair=False)  # the admission before fair slots
    return server


LIGHT = "def main():\n    return bench.now()['t']\n"


async def light_delays(server: codemode.Server, duration: float, gap: float) -> list[float]:
    subject = authz.Subject("light")
    out: list[float] = []
    end = time.monotonic() + duration
    while time.monotonic() < end:
        t0 = time.monotonic()
        started = await server.execute(LIGHT, subject=subject)
        out.append(float(started) - t0)
        await asyncio.sleep(gap)
    return out


async def greedy_tenant(server: codemode.Server, name: str, program: float, stop: asyncio.Event) -> int:
    subject = authz.Subject(name)
    source = f"def main():\n    return bench.sleep(seconds={program})['t']\n"
    done = 0

    async def loop() -> None:
        nonlocal done
        while not stop.is_set():
            try:
                await server.execute(source, subject=subject)
                done += 1
            except codemode.CodeModeError:
                await asyncio.sleep(0.01)

    await asyncio.gather(*(loop() for _ in range(QUOTA)))
    return done


async def run(fair: bool, k: int, duration: float, program: float) -> tuple[list[float], int]:
    server = build(fair)
    await server.start()
    stop = asyncio.Event()
    greedy = [asyncio.ensure_future(greedy_tenant(server, f"greedy{i}", program, stop)) for i in range(k)]
    await asyncio.sleep(program)  # let the greedy tenants fill the slots first
    try:
        delays = await light_delays(server, duration, gap=program / 3) if k >= 0 else []
    finally:
        stop.set()
        done = sum(await asyncio.gather(*greedy))
        await server.aclose()
    return delays, done


def show(label: str, delays: list[float], base: float, program: float, done: int | None = None) -> None:
    p50, p99 = statistics.median(delays), percentile(delays, 99)
    extra = f"  greedy executes done={done}" if done is not None else ""
    print(
        f"{label:22} n={len(delays):3}  p50={p50 * 1000:7.1f} ms ({p50 / base:5.1f}x base)  "
        f"p99={p99 * 1000:7.1f} ms ({p99 / base:5.1f}x base, {p99 / program:4.2f} programs){extra}"
    )


async def main(args: argparse.Namespace) -> None:
    print(f"slots={SLOTS} quota={QUOTA} program={args.program}s duration={args.duration}s per run")
    base_delays, _ = await run(True, 0, args.duration / 2, args.program)
    base = statistics.median(base_delays)
    show("baseline (alone)", base_delays, base, args.program)
    for k in args.greedy:
        for fair in (False, True):
            delays, done = await run(fair, k, args.duration, args.program)
            show(f"k={k} {'fair' if fair else 'fifo (before)'}", delays, base, args.program, done)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--program", type=float, default=1.0)
    parser.add_argument("--greedy", type=lambda s: [int(x) for x in s.split(",")], default=[2, 3, 4])
    asyncio.run(main(parser.parse_args()))
