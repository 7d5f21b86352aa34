"""``codemode quotas tune``'s deadline, served as recommended (prints numbers, not a test).

    python -m tests.benchmarks.bench_tune_deadline [--runtime docker|process] [--runs 5] [--pool 2]
        [--bursts 5] [--burst 8]

Measures a trivial program with the real command (``codemode quotas tune --json``), then serves it
with each deadline the tool has offered: the old "with --pool" figure (p99 of execute − spawn × 2,
rounded up to 0.1 s, from the same runs) and today's recommendation. Each server (the settings'
runtime behind ``--pool`` warm workers, 8 slots) takes one execute the moment it has started (the pool
not warm yet), then ``--bursts`` bursts of ``--burst`` executes once the pool is warm, and prints how
many failed and with which text.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import json
import math
import tempfile
from pathlib import Path

from codemode import authz, cli
from codemode.common.errors import CodeModeError, client_text
from codemode.ops.quotas import TIME_FACTOR, TIME_STEP
from codemode.startup.bootstrap import build_server
from codemode.startup.config import load_settings

TRIVIAL = "def main():\n    return 1\n"


def _tune(runtime: str, runs: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "tiny.star"
        program.write_text(TRIVIAL)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["quotas", "tune", "--program", str(program), "--runtime", runtime, "--json"])
        if code != 0:
            raise SystemExit(f"quotas tune failed ({code})")
        report: dict[str, object] = json.loads(out.getvalue())
        return report


async def _serve(
    runtime: str, deadline: float, pool: int, bursts: int, burst: int
) -> collections.Counter[str]:
    settings = load_settings(
        runtime=runtime, allow_all=True, pool=pool, max_execution_time=deadline, max_concurrent_executions=8
    )
    server = build_server(settings)
    outcomes: collections.Counter[str] = collections.Counter()

    async def one(i: int) -> None:
        try:
            await server.execute(TRIVIAL, subject=authz.Subject(f"s{i % 4}"))
            outcomes["ok"] += 1
        except CodeModeError as exc:
            outcomes[client_text(exc)] += 1

    async with server:
        await server.start()
        await one(0)  # at once: the pool has only begun to start its workers
        print(f"  single execute right after start: {dict(outcomes)}", flush=True)
        for _ in range(bursts):
            wait_warm = getattr(server.runtime, "wait_warm", None)
            if wait_warm is not None:
                await wait_warm(120)
            await asyncio.gather(*(one(i) for i in range(burst)))
    return outcomes


async def main_async(args: argparse.Namespace, report: dict[str, object]) -> None:
    rec = report["recommendation"]
    assert isinstance(rec, dict)
    basis = rec["basis"]
    old = max(
        TIME_STEP,
        math.ceil(round(basis["execute_minus_spawn_p99_s"] * TIME_FACTOR / TIME_STEP, 9)) * TIME_STEP,
    )
    new = rec["max_execution_time"]
    print(
        f"{args.runtime}: quotas tune, {args.runs} runs: execute p99 {basis['execute_p99_s']:.3f} s, "
        f"execute - spawn p99 {basis['execute_minus_spawn_p99_s']:.3f} s, burst slowest "
        f"{basis.get('burst_slowest_s', float('nan')):.3f} s",
        flush=True,
    )
    total = 1 + args.bursts * args.burst
    for name, deadline in (("old 'with --pool' figure", round(old, 1)), ("recommended", new)):
        print(f"{name}: --max-execution-time {deadline:g} --pool {args.pool}", flush=True)
        outcomes = await _serve(args.runtime, deadline, args.pool, args.bursts, args.burst)
        failed = total - outcomes["ok"]
        print(f"  failed {failed} of {total}: {dict(outcomes)}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime", choices=["process", "docker"], default="docker")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--pool", type=int, default=2)
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--burst", type=int, default=8)
    args = p.parse_args()
    asyncio.run(main_async(args, _tune(args.runtime, args.runs)))


if __name__ == "__main__":
    main()
