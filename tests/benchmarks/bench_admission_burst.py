"""Bursts against a short deadline: how many executes end in ``internal failure`` (prints numbers;
not a test). An execute whose deadline passed while it waited for a slot was granted the
slot freed in the same loop iteration; the grant raised ``InvalidStateError`` into the execute that
released it (its client got ``internal failure``) and the slot was lost for good.

    python -m tests.benchmarks.bench_admission_burst [--runtime process|docker] [--runs 3]
        [--pool 4] [--time 0.1] [--burst 8] [--bursts 10] [--subjects 2]

An in-process server with the HTTP service's admission defaults (8 slots, a per-subject quota of 4,
the derived reserve of 2) behind a warm pool of ``--pool`` workers and ``--time`` seconds per
execute. Each run sends ``--bursts`` bursts of ``--burst`` trivial executes (the next burst once the
last one has returned), spread round-robin over ``--subjects`` subjects, and counts the outcomes as
the client sees them: ``ok``, ``timeout``, ``quota`` (refused at the subject's quota), ``internal``
(``internal failure``, or any exception that is no CodeModeError: the service answers those with
``internal failure`` too) and anything else. After the run it waits for every reap and prints the
slots still counted as held (``lost``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
from collections.abc import Callable
from typing import Any

import codemode
from codemode import authz
from codemode.common.errors import ExecutionTimeout, Internal, ResourceLimit
from codemode.runtimes.process import ProcessOptions

TRIVIAL = "def main():\n    return 1\n"
SLOTS = 8
QUOTA = 4


def _outcome(result: object) -> str:
    if not isinstance(result, BaseException):
        return "ok"
    if isinstance(result, ExecutionTimeout):
        return "timeout"
    if isinstance(result, ResourceLimit) and result.kind == "quota":
        return "quota"
    if isinstance(result, Internal) or not isinstance(result, codemode.CodeModeError):
        return "internal"
    return type(result).__name__


async def one_run(make: Callable[[], Any], args: argparse.Namespace) -> tuple[collections.Counter[str], int]:
    """One server, ``--bursts`` bursts: the outcomes and the slots lost afterwards."""
    pool = codemode.WarmPool(make(), args.pool)
    server = codemode.Builder(
        authorizer=authz.allow_all(),
        limits=codemode.Limits(max_concurrent_executions=SLOTS, max_execution_time=args.time),
        runtime=pool,
        subject_quota=QUOTA,
    ).build()
    subjects = [authz.Subject(f"s{i}") for i in range(args.subjects)]
    outcomes: collections.Counter[str] = collections.Counter()
    async with server:
        await server.start()
        await pool.wait_warm(120)
        for _ in range(args.bursts):
            burst = [server.execute(TRIVIAL, subject=subjects[i % len(subjects)]) for i in range(args.burst)]
            for result in await asyncio.gather(*burst, return_exceptions=True):
                outcomes[_outcome(result)] += 1
        executor = server._executor
        await executor.drain()
        lost = executor.slots.slots - executor.slots.free
    return outcomes, lost


async def run_all(make: Callable[[], Any], args: argparse.Namespace) -> None:
    total = args.bursts * args.burst
    print(
        f"{args.runtime}: pool {args.pool}, {SLOTS} slots, quota {QUOTA}, --time {args.time} s, "
        f"{args.bursts} bursts of {args.burst} over {args.subjects} subject(s) = {total} executes a run"
    )
    internal: list[int] = []
    for run in range(args.runs):
        outcomes, lost = await one_run(make, args)
        internal.append(outcomes["internal"])
        shown = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        print(f"run {run + 1}: internal failures {outcomes['internal']} of {total} ({shown}); lost {lost}")
    hit = sum(1 for n in internal if n)
    print(f"internal failures per {total}: {internal}; runs with any: {hit} of {args.runs}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime", choices=["process", "docker"], default="process")
    p.add_argument("--image", default=None, help="worker image for --runtime docker")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--pool", type=int, default=4)
    p.add_argument("--time", type=float, default=0.1, help="max_execution_time in seconds (default 0.1)")
    p.add_argument("--burst", type=int, default=8)
    p.add_argument("--bursts", type=int, default=10)
    p.add_argument("--subjects", type=int, default=2)
    args = p.parse_args()
    if args.runtime == "docker":
        from codemode.runtimes.docker import DEFAULT_IMAGE, DockerOptions, DockerRuntime

        image = args.image or DEFAULT_IMAGE
        asyncio.run(run_all(lambda: DockerRuntime(DockerOptions(image=image)), args))
    else:
        asyncio.run(run_all(lambda: codemode.ProcessRuntime(ProcessOptions(spawn="classic")), args))


if __name__ == "__main__":
    main()
