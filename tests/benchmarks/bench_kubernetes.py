"""Kubernetes runtime benchmarks (prints numbers; not a test). Needs the cluster of
scripts/provision-kubernetes.sh (admin kubeconfig, worker image imported) and, for the figures
beside them, the Docker engine with codemode-worker:1.

    python -m tests.benchmarks.bench_kubernetes [--n 10] [--skip-docker] [--node localhost]
        [--cold-only] [--no-shadow-variant]

Measured in one run, so the ratios are meaningful on a noisy machine:
- ``cold vs bare pod`` (first): on one node (``--node``; the cluster may have several), interleaved
  sample by sample, each at a random phase of the kubelet's 1 s relist: a bare pod's create ->
  Running as the API reports it (``bench_reuse``: the worker image, read every 10 ms), the cold
  execute as the runtime does it (``attach_early``: attach as soon as the kubelet runs the
  container) and the cold execute the previous way (``attach_early=False``: attach once the API
  reports Running), each with its phases (p50, ms from create) and its ratio to the bare pod;
  with ``--no-shadow-variant`` also the cold execute of a worker pod without its read-only
  ``emptyDir`` over /tmp and /dev/shm (an experiment, not the runtime's pod: the kubelet waits
  for a pod's volumes in 300 ms polls);
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
import random
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes import client as k8s

from codemode.ops.percentile import percentile
from codemode.runtimes.kubernetes import KubernetesOptions, KubernetesRuntime

from .bench_docker import ONE_CALL, TRIVIAL, build_server
from .bench_reuse import bare_pod_once


def show(name: str, xs: list[float]) -> dict[str, float]:
    p50, p99, mean = percentile(xs, 50) * 1000, percentile(xs, 99) * 1000, statistics.mean(xs) * 1000
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


class PinnedRuntime(KubernetesRuntime):
    """The runtime's own pods, on one node (``node``), optionally without the read-only emptyDir."""

    def __init__(self, *, node: str, shadow: bool = True, **options: Any) -> None:
        super().__init__(KubernetesOptions(**options))
        self.node = node
        self.shadow = shadow

    def pod_manifest(
        self, pod_name: str, supervised: bool = False, avoided_nodes: list[str] | None = None
    ) -> k8s.V1Pod:
        pod = super().pod_manifest(pod_name, supervised, avoided_nodes)
        assert pod.spec is not None
        pod.spec.node_selector = {"kubernetes.io/hostname": self.node}
        if not self.shadow:
            pod.spec.volumes = None
            pod.spec.containers[0].volume_mounts = None
        return pod


def p50(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


async def cold_vs_bare(args: argparse.Namespace) -> dict[str, Any]:
    """A bare pod's create -> Running and the cold execute, same node, interleaved, in one run."""
    from kubernetes import config

    from codemode import authz

    configuration = k8s.Configuration()
    config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    api = k8s.CoreV1Api(k8s.ApiClient(configuration))
    subject = authz.Subject("bench")
    kinds = {"early": {"attach_early": True}, "old": {"attach_early": False}}
    if args.no_shadow_variant:
        kinds["early, no emptyDir"] = {"attach_early": True, "shadow": False}
    runtimes = {
        kind: PinnedRuntime(
            node=args.node, kubeconfig=args.kubeconfig, namespace=args.namespace, image=args.image, **kw
        )
        for kind, kw in kinds.items()
    }
    servers = {kind: build_server(rt) for kind, rt in runtimes.items()}
    bare: list[float] = []
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    phases: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    attempts: dict[str, list[int]] = {kind: [] for kind in kinds}
    try:
        for srv in servers.values():  # warm the host side (imports, clients) once
            await srv.execute(TRIVIAL, subject=subject)
        for _ in range(args.n):
            # Each sample starts at a random phase of the kubelet's 1 s relist: back to back, a
            # sample would start right after the previous one's Running report (a relist), and
            # every bare pod would wait for almost a whole period (~1 s), or none would.
            await asyncio.sleep(random.uniform(0, 1.0))
            bare.append(
                await asyncio.to_thread(bare_pod_once, api, args.bare_namespace, args.image, True, args.node)
            )
            for kind, srv in servers.items():
                await asyncio.sleep(random.uniform(0, 1.0))
                t0 = time.perf_counter()
                await srv.execute(TRIVIAL, subject=subject)
                times[kind].append(time.perf_counter() - t0)
                phases[kind].append(dict(runtimes[kind].last_phases))
                attempts[kind].append(runtimes[kind].last_attach_attempts)
    finally:
        for srv in servers.values():
            await srv.aclose()
        api.api_client.close()
    out: dict[str, Any] = {"node": args.node, "bare_running_p50_ms": p50(bare)}
    print(
        f"cold vs bare pod on node {args.node}, n={args.n}, interleaved; bare pod create->Running "
        f"(API, read every 10 ms): p50 {p50(bare):.0f} ms (min {min(bare) * 1000:.0f})"
    )
    for kind in kinds:
        keys = ("created", "scheduled", "running", "attached")
        ph = {
            k: round(p50([p[k] for p in phases[kind] if k in p]))
            for k in keys
            if any(k in p for p in phases[kind])
        }
        ratio = p50(times[kind]) / p50(bare)
        out[kind] = {
            "p50_ms": p50(times[kind]),
            "ratio_to_bare": ratio,
            "phases_p50_ms": ph,
            "attach_attempts_p50": statistics.median(attempts[kind]),
            "saw_running": sum("running" in p for p in phases[kind]),
        }
        print(
            f"  cold execute, {kind:<20} p50 {p50(times[kind]):6.0f} ms = {ratio:.2f}x the bare pod;"
            f" phases p50 {ph}; attach attempts p50 {statistics.median(attempts[kind]):.0f};"
            f" API said Running before the attach in {out[kind]['saw_running']}/{args.n}"
        )
    old, early = out["old"]["p50_ms"], out["early"]["p50_ms"]
    print(f"  early attach vs the previous path: {old:.0f} -> {early:.0f} ms ({early / old:.2f}x)")
    return out


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
    results["cold_vs_bare"] = await cold_vs_bare(args)
    if args.cold_only:
        return results
    bare = [
        await asyncio.to_thread(
            kubectl_run_once, args.kubectl, args.kubeconfig, args.bare_namespace, args.image, i
        )
        for i in range(args.n)
    ]
    results["kubectl_run"] = show("bare kubectl run --rm -i (worker image)", bare)
    results["kubernetes"] = await runtime_figures(
        "k8s",
        lambda: KubernetesRuntime(
            KubernetesOptions(kubeconfig=args.kubeconfig, namespace=args.namespace, image=args.image)
        ),
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
    p.add_argument("--node", default="localhost", help="the node of the cold vs bare pod comparison")
    p.add_argument("--cold-only", action="store_true", help="only the cold vs bare pod comparison")
    p.add_argument(
        "--no-shadow-variant",
        action="store_true",
        help="also measure a worker pod without its read-only emptyDir (an experiment)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON at the end")
    args = p.parse_args()
    results = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
