"""A lone subject on a small warm pool (prints numbers; not a test). The subject share
kept a lone subject from the idle warm worker until the refill had replaced the one it took, so
every second execute started cold beside an idle warm worker.

    python -m tests.benchmarks.bench_lone_subject [--runtime docker|kubernetes|process] [--pool 2]
        [--n 40] [--gap 0.5] [--busy 0.2] [--share 0.5 --share 1.0]

One subject, one trivial execute every ``--gap`` seconds; after each execute the event loop is
blocked for ``--busy`` seconds (as a host busy with other work is now and then: the refill makes no
progress meanwhile; 0 for nothing blocking). For each ``--share`` a fresh ``WarmPool`` of ``--pool``
workers (fixed size) serves ``--n`` executes (after one not measured). Printed per share: the
executes' latency (p50, p90, from the call to its result) and how many got a warm worker.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import codemode
from codemode import authz
from codemode.ops.percentile import percentile
from codemode.runtimes.base import Runtime
from codemode.runtimes.pool import WarmPool
from codemode.runtimes.process import ProcessOptions

TRIVIAL = "def main():\n    return 1\n"
SUBJECT = authz.Subject("lone")


def make_runtime(args: argparse.Namespace) -> Runtime:
    """A fresh runtime of ``--runtime``."""
    if args.runtime == "docker":
        from codemode.runtimes.docker import DockerRuntime

        return DockerRuntime()
    if args.runtime == "kubernetes":
        from codemode.runtimes.kubernetes import KubernetesOptions, KubernetesRuntime

        return KubernetesRuntime(
            KubernetesOptions(kubeconfig=args.kubeconfig, namespace=args.namespace, image=args.image)
        )
    return codemode.ProcessRuntime(ProcessOptions(spawn="classic"))


async def one_share(share: float, args: argparse.Namespace) -> tuple[list[float], int]:
    """``--n`` executes of the lone subject on a pool with ``share``: latencies, warm hand-outs."""
    pool = WarmPool(make_runtime(args), args.pool, subject_share=share)
    server = codemode.Builder(
        authorizer=authz.allow_all(), limits=codemode.Limits(max_execution_time=60), runtime=pool
    ).build()
    out: list[float] = []
    async with server:
        await server.start()
        await pool.wait_warm(300)
        await server.execute(TRIVIAL, subject=SUBJECT)  # caches warmed; not measured
        await pool.wait_warm(300)
        warm_before = pool.warm_taken
        for _ in range(args.n):
            t0 = time.perf_counter()
            await server.execute(TRIVIAL, subject=SUBJECT)
            out.append(time.perf_counter() - t0)
            time.sleep(args.busy)  # the loop is busy: nothing else runs (on purpose)
            await asyncio.sleep(max(0.0, args.gap - args.busy - out[-1]))
        warm = pool.warm_taken - warm_before
    return out, warm


async def run_all(args: argparse.Namespace) -> None:
    print(
        f"{args.runtime}: pool {args.pool}, one subject, an execute every {args.gap} s, "
        f"loop blocked {args.busy} s after each, n={args.n}"
    )
    for share in args.share:
        latencies, warm = await one_share(share, args)
        p50, p90 = percentile(latencies, 50) * 1e3, percentile(latencies, 90) * 1e3
        print(f"share {share:<4}: p50 {p50:8.1f} ms  p90 {p90:8.1f} ms  warm {warm}/{len(latencies)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime", choices=["process", "docker", "kubernetes"], default="docker")
    p.add_argument("--pool", type=int, default=2)
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--gap", type=float, default=0.5, help="seconds from one execute's start to the next")
    p.add_argument("--busy", type=float, default=0.2, help="seconds the loop is blocked after each")
    p.add_argument("--kubeconfig", default="/var/lib/codemode-k8s/admin.kubeconfig")
    p.add_argument("--namespace", default="codemode-workers")
    p.add_argument("--image", default="codemode-worker:1", help="worker image (kubernetes)")
    p.add_argument("--share", type=float, action="append", help="subject shares to compare (0.5 and 1.0)")
    args = p.parse_args()
    args.share = args.share or [0.5, 1.0]
    asyncio.run(run_all(args))


if __name__ == "__main__":
    main()
