"""Suspended executes: what a question costs while it waits, and what a resume costs
(prints numbers; not a test).

    python -m tests.benchmarks.bench_suspension [--pending 100] [--n 7] [--k 10,100]

On the process runtime, through the library (the same pipeline the MCP front end drives; the
approver defers, as the 2026-07-28 retry does):

- **held while asked**: ``--pending`` executes each suspended at a question: live workers and busy
  slots (goal 0; before suspension it was one worker and one slot per question), records pending,
  and the bytes (``Suspension.size``: source and call log) and Python heap (tracemalloc) per record;
- **resume latency**: a program that makes ``k`` calls and then one the policy asks about. The
  resume (claim, replay of the ``k`` calls from the log in a fresh worker, then the pending call
  live) against a fresh execute of the same program on the same runtime whose ``k + 1`` calls all
  run live (goal: ratio ≤ 1.2). p50 (and best) over ``--n``, the two measured alternately so that
  the machine's noise hits both alike; the floor is an execute that makes no call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import tracemalloc
from typing import Any

import codemode
from codemode import authz
from codemode.execution.suspension import Suspended

from .shared_parts import echo

SUBJECT = authz.Subject("bench")
GOAL_RATIO = 1.2


class AskAboutGuarded:
    """Allows everything but ``bench.guarded``, which it leaves to the user."""

    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        if input.capability_name == "bench.guarded":
            raise authz.AskUser("guarded")


class Later:
    """An approver whose answer comes later, in another request (the 2026-07-28 retry)."""

    defers = True

    async def approve(self, request: codemode.ApprovalRequest) -> codemode.ApprovalAnswer:
        return "unavailable"


def server(asking: bool, pending: int) -> codemode.Server:
    builder = codemode.Builder(
        authorizer=AskAboutGuarded() if asking else authz.allow_all(),
        limits=codemode.Limits(max_pending_approvals=max(1, pending), max_native_calls=1000),
    )
    builder.register(
        codemode.Capability(name="bench.echo", summary="Echo.", handler=echo),
        codemode.Capability(name="bench.guarded", summary="Guarded echo.", handler=echo),
    )
    return builder.build()


def program(k: int) -> str:
    return (
        "def main():\n"
        "    total = 0\n"
        f"    for i in range({k}):\n"
        '        total += bench.echo(n=i)["n"]\n'
        '    return total + bench.guarded(n=1)["n"]\n'
    )


async def suspend(srv: codemode.Server, source: str) -> Suspended:
    try:
        await srv.run(source, subject=SUBJECT, approver=Later())
    except Suspended as suspended:
        return suspended
    raise AssertionError("the execute did not suspend")


async def held_while_asked(pending: int) -> None:
    srv = server(True, pending)
    async with srv:
        store = srv.plan.store
        assert store is not None
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        suspended = [await suspend(srv, program(5)) for _ in range(pending)]  # one after another
        heap = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        executor = srv._executor
        while executor.reaping:
            await asyncio.gather(*list(executor.reaping), return_exceptions=True)
        busy = srv.slots.slots - srv.slots.free
        records = await store.pending()
        sizes = [held.record.size for held in getattr(store, "_suspensions", {}).values()]
        print(f"held while {pending} questions are pending (process runtime, k=5 calls before each):")
        print(f"  busy slots              {busy}  (goal 0; before suspension: one per open question)")
        print(f"  workers being reaped    {len(executor.reaping)}")
        print(f"  records pending         {records}")
        if sizes:
            print(f"  bytes per record        {statistics.mean(sizes):,.0f} (source + call log)")
        print(f"  heap per suspension     {heap / pending:,.0f} B (whole execute path, tracemalloc)")
        for s in suspended:  # answer them all: nothing stays
            state = await srv.request_state(s)
            with contextlib.suppress(codemode.CodeModeError):  # declined: permission denied
                await srv.resume(state, subject=SUBJECT, source=s.source, answer="decline", approver=Later())
        print(f"  records after answers   {await store.pending()}")


async def resume_latency(k: int, n: int) -> None:
    asking, fresh = server(True, n + 2), server(False, 1)
    source = program(k)
    resumed_ms: list[float] = []
    fresh_ms: list[float] = []
    floor_ms: list[float] = []
    async with asking, fresh:
        await fresh.run(source, subject=SUBJECT)  # warm both runtimes
        await fresh.run("def main():\n    return 0\n", subject=SUBJECT)
        for _ in range(n):
            t0 = time.perf_counter()
            await fresh.run("def main():\n    return 0\n", subject=SUBJECT)
            floor_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            await fresh.run(source, subject=SUBJECT)
            fresh_ms.append((time.perf_counter() - t0) * 1000)
            suspended = await suspend(asking, source)
            state = await asking.request_state(suspended)
            t0 = time.perf_counter()
            run = await asking.resume(
                state, subject=SUBJECT, source=source, answer="accept", approver=Later()
            )
            resumed_ms.append((time.perf_counter() - t0) * 1000)
            assert run.value == sum(range(k)) + 1
    p50r, p50f = statistics.median(resumed_ms), statistics.median(fresh_ms)
    print(f"resume latency, k={k} earlier calls (p50 / best of {n}):")
    print(f"  fresh execute, {k + 1} live calls   {p50f:8.1f} / {min(fresh_ms):8.1f} ms")
    print(f"  resume, {k} replayed + 1 live      {p50r:8.1f} / {min(resumed_ms):8.1f} ms")
    print(f"  floor: an execute with no call  {statistics.median(floor_ms):8.1f} ms")
    print(f"  ratio resume / fresh            {p50r / p50f:8.2f}  (goal <= {GOAL_RATIO})")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=100)
    parser.add_argument("--n", type=int, default=7)
    parser.add_argument("--k", default="10,100")
    args = parser.parse_args()
    await held_while_asked(args.pending)
    for k in (int(x) for x in args.k.split(",")):
        await resume_latency(k, args.n)


if __name__ == "__main__":
    asyncio.run(main())
