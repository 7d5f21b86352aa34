"""Kubernetes runtime benchmarks (prints numbers; not a test). Needs the cluster of
scripts/provision-kubernetes.sh (admin kubeconfig, worker image imported) and, for the figures
beside them, the Docker engine with codemode-worker:1.

    python -m tests.benchmarks.bench_kubernetes [--n 10] [--skip-docker]

Measured in one run, so the ratios are meaningful on a noisy machine:
- ``kubectl run --rm -i``: the naive baseline, one ``kubectl run`` of the worker image whose stdin
  is closed at once (the worker starts, sees EOF, exits; kubectl deletes the pod);
- ``execute cold``: a trivial execute through codemode.Server on KubernetesRuntime (a pod per
  execute), with the phases of the last start (created, scheduled, running, attached);
- ``execute warm``: the same with WarmPool(KubernetesRuntime, --pool) (concurrent refill);
- ``one native call`` (warm);
- ``sustained``: executes/s with a fresh pod each, at concurrency 1 and 4, no pool;
- the Docker runtime's cold / warm / native call / sustained figures measured the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

from codemode.runtimes.kubernetes import KubernetesRuntime

from .bench_docker import ONE_CALL, TRIVIAL, build_server


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def show(name: str, xs: list[float]) -> dict[str, float]:
    p50, p99, mean = pct(xs, 50) * 1000, pct(xs, 99) * 1000, statistics.mean(xs) * 1000
    print(f"{name:<40} n={len(xs):<4} p50 {p50:8.1f} ms   p99 {p99:8.1f} ms   mean {mean:8.1f} ms")
    return {"p50_ms": p50, "p99_ms": p99}


async def timed(fn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


def kubectl_run_once(kubectl: str, kubeconfig: str, namespace: str, image: str, i: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            kubectl,
            "--kubeconfig",
            kubeconfig,
            "run",
            f"codemode-bench-{i}-{int(t0 * 1000) % 100000}",
            "-n",
            namespace,
            "--image",
            image,
            "--image-pull-policy=Never",
            "--restart=Never",
            "--rm",
            "-i",
            "--quiet",
            "--pod-running-timeout=120s",
        ],
        input=b"",
        capture_output=True,
        timeout=180,
        check=False,
    )
    return time.perf_counter() - t0


async def sustained(server: Any, subject: Any, concurrency: int, total: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            await server.execute(TRIVIAL, subject=subject)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    return total / (time.perf_counter() - t0)


async def runtime_figures(label: str, make: Callable[[], Any], args: argparse.Namespace) -> dict[str, Any]:
    import codemode
    from codemode import authz

    subject = authz.Subject("bench")
    out: dict[str, Any] = {}
    rt = make()
    cold_server = build_server(rt)
    await cold_server.execute(TRIVIAL, subject=subject)
    out["execute_cold"] = show(
        f"{label}: execute trivial, cold",
        await timed(lambda: cold_server.execute(TRIVIAL, subject=subject), args.n),
    )
    if isinstance(rt, KubernetesRuntime):
        out["phases_ms"] = {k: round(v * 1000) for k, v in rt.last_phases.items()}
        print(f"{'':<40} last cold start phases (ms from create): {out['phases_ms']}")
    for conc in (1, 4):
        rate = await sustained(cold_server, subject, conc, max(args.n, 3 * conc))
        out[f"sustained_{conc}"] = rate
        print(f"{label + f': sustained fresh, concurrency {conc}':<40} {rate:6.2f} executes/s")
    await cold_server.aclose()

    pool = codemode.WarmPool(make(), args.pool)
    warm_server = build_server(pool)
    await warm_server.start()
    times: list[float] = []

    async def warm(source: str) -> None:
        await pool.wait_warm(180)
        t0 = time.perf_counter()
        await warm_server.execute(source, subject=subject)
        times.append(time.perf_counter() - t0)

    for _ in range(args.n):
        await warm(TRIVIAL)
    out["execute_warm"] = show(f"{label}: execute trivial, warm (pool)", times)
    times = []
    for _ in range(args.n):
        await warm(ONE_CALL)
    out["execute_warm_one_call"] = show(f"{label}: one native call, warm", times)
    await warm_server.aclose()
    return out


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    print(
        f"kubernetes kubeconfig {args.kubeconfig}, namespace {args.namespace}, image {args.image}, n={args.n}"
    )
    bare = [
        await asyncio.to_thread(
            kubectl_run_once, args.kubectl, args.kubeconfig, args.bare_namespace, args.image, i
        )
        for i in range(args.n)
    ]
    results["kubectl_run"] = show("bare kubectl run --rm -i (worker image)", bare)
    results["kubernetes"] = await runtime_figures(
        "k8s",
        lambda: KubernetesRuntime(kubeconfig=args.kubeconfig, namespace=args.namespace, image=args.image),
        args,
    )
    k = results["kubernetes"]
    cold, warm = k["execute_cold"]["p50_ms"], k["execute_warm"]["p50_ms"]
    print(f"{'k8s warm vs cold p50':<40} {cold / warm:.1f}x faster")
    print(f"{'k8s cold vs bare kubectl run p50':<40} {results['kubectl_run']['p50_ms'] / cold:.1f}x faster")
    if not args.skip_docker:
        from codemode.runtimes.docker import DockerRuntime

        results["docker"] = await runtime_figures("docker", DockerRuntime, args)
        d = results["docker"]
        for key in ("execute_cold", "execute_warm", "execute_warm_one_call"):
            print(f"{'k8s / docker ' + key + ' p50':<40} {k[key]['p50_ms'] / d[key]['p50_ms']:.2f}x")
        for conc in (1, 4):
            ratio = k[f"sustained_{conc}"] / d[f"sustained_{conc}"]
            print(f"{f'k8s / docker sustained at {conc}':<40} {ratio:.2f}x")
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10, help="samples per measurement")
    p.add_argument("--pool", type=int, default=2)
    p.add_argument("--kubeconfig", default="/var/lib/codemode-k8s/admin.kubeconfig")
    p.add_argument("--kubectl", default="/var/cache/codemode/kubernetes/v1.34.4/bin/kubectl")
    p.add_argument("--namespace", default="codemode-workers")
    p.add_argument("--bare-namespace", default="default", help="namespace of the kubectl run baseline")
    p.add_argument("--image", default="codemode-worker:1")
    p.add_argument("--skip-docker", action="store_true")
    p.add_argument("--json", action="store_true", help="print the results as JSON at the end")
    args = p.parse_args()
    results = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
