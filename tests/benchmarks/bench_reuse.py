"""The reuse mode and cheap sandboxes under load, with their floors, in one run (prints numbers; not
a test). Needs the Docker engine and/or the cluster of scripts/provision-kubernetes.sh.

    python -m tests.benchmarks.bench_reuse [--runtime docker|kubernetes|both] [--n 400]
        [--repeat 2] [--image codemode-worker:1] [--pool 4] [--reuse-pool 20] [--reuse 100]

For each runtime, measured in the same run so the ratios mean something on a noisy machine:

- the floors: Docker's raw engine rate (``bench_docker.engine_raw_once``: create, attach, start, one
  line, remove; serially and 4 at a time); for Kubernetes a bare pod's create -> Running as the API
  reports it (read every 10 ms), and the bare churn rate (create -> Running -> delete, 4 at a time);
- Kubernetes only: the cold execute (a pod per execute, no pool) with its phases (created,
  scheduled, running, attached), against the bare pod's create -> Running;
- the 20-client load through the real service (``bench_service_load``: MCP over HTTP, one subject
  per client), ``--repeat`` times alternately in the default mode (one fresh sandbox per execute,
  ``--pool``) and in the reuse mode (``--reuse`` executes per sandbox, ``--reuse-pool`` idle);
- host CPU per execute: the server process and the engine's side (the containers' cgroup and the
  engine's daemons; exited shims are not counted), and the whole machine's busy CPU (other load on a
  shared machine included), as executes/s per core;
- the process runtime's CPU per execute under the same load (the server's process tree: the service,
  its template and workers), once at the start of the run, and each runtime's reuse-mode CPU per
  execute beside it (goal ≤ 1.5×; ``--no-process`` skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from typing import Any

from . import bench_service_load

TRIVIAL = "def main():\n    return 1\n"
#: The engines' own processes whose CPU counts as the sandboxes' cost (by /proc/<pid>/comm).
DAEMONS = {
    "docker": ("dockerd", "containerd"),
    "kubernetes": ("containerd", "kubelet", "kube-apiserver", "etcd", "kube-scheduler", "kube-controller"),
}
#: Their cgroup v1 cpuacct parents (the containers' CPU, kept after a container is gone).
CGROUPS = {"docker": "/sys/fs/cgroup/cpuacct/docker", "kubernetes": "/sys/fs/cgroup/cpuacct/kubepods"}
TICK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------ CPU


def _daemon_seconds(names: tuple[str, ...]) -> float:
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as fh:
                comm = fh.read().strip()
            if not comm.startswith(names):
                continue
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
        except (OSError, ValueError, IndexError):
            continue
    return total


def _cgroup_seconds(path: str) -> float:
    try:
        with open(os.path.join(path, "cpuacct.usage")) as fh:
            return int(fh.read()) / 1e9
    except (OSError, ValueError):
        return 0.0


def _machine_busy() -> float:
    with open("/proc/stat") as fh:
        cpu = [int(x) for x in fh.readline().split()[1:]]
    idle = cpu[3] + cpu[4]
    return (sum(cpu[:8]) - idle) / TICK


def _process_seconds(pid: int) -> float:
    """CPU seconds of a running process (its threads and its reaped children)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / TICK  # utime, stime, cutime, cstime


class CpuMeter:
    """CPU seconds spent during the load (between the two ``mark`` calls): the server process, the
    engine's daemons, the sandboxes (their cgroups: supervisors, workers, scrubs), the machine."""

    def __init__(self, runtime: str) -> None:
        self.runtime = runtime
        self.marks: list[tuple[float, float, float, float]] = []

    def mark(self, server_pid: int) -> None:
        daemons = _daemon_seconds(DAEMONS[self.runtime])
        sandboxes = _cgroup_seconds(CGROUPS[self.runtime])
        self.marks.append((_process_seconds(server_pid), daemons, sandboxes, _machine_busy()))

    def spent(self) -> tuple[float, float, float, float]:
        """(server, daemons, sandboxes, machine) seconds between the first two marks."""
        if len(self.marks) < 2:
            return (0.0, 0.0, 0.0, 0.0)
        start, end = self.marks[0], self.marks[1]
        server, daemons, sandboxes, machine = (b - a for a, b in zip(start, end, strict=True))
        return server, daemons, sandboxes, machine


# ------------------------------------------------------------------------------------------ floors


def docker_floor(image: str, n: int) -> dict[str, float]:
    import concurrent.futures

    import docker

    from .bench_docker import engine_raw_once

    api = docker.APIClient(version="auto", timeout=60)
    serial = [engine_raw_once(api, image, None) for _ in range(n)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: engine_raw_once(api, image, None), range(n)))
    rate4 = n / (time.perf_counter() - t0)
    return {
        "rate_serial": 1 / statistics.median(serial),
        "rate_4": rate4,
        "p50_ms": statistics.median(serial) * 1e3,
    }


def _bare_pod(api: Any, namespace: str, image: str, node: str | None = None) -> Any:
    from kubernetes import client as k8s

    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name=f"codemode-bare-{uuid.uuid4().hex[:12]}", labels={"io.codemode.role": "bench-bare"}
        ),
        spec=k8s.V1PodSpec(
            restart_policy="Never",
            termination_grace_period_seconds=0,
            automount_service_account_token=False,
            containers=[
                k8s.V1Container(name="bare", image=image, image_pull_policy="IfNotPresent", stdin=True)
            ],
        ),
    )
    if node is not None:
        pod.spec.node_selector = {"kubernetes.io/hostname": node}  # type: ignore[union-attr]
    return pod


def bare_pod_once(
    api: Any, namespace: str, image: str, delete: bool = True, node: str | None = None
) -> float:
    """Seconds from create to the API reporting phase Running (read every 10 ms), on ``node`` if
    given."""
    pod = _bare_pod(api, namespace, image, node)
    t0 = time.perf_counter()
    api.create_namespaced_pod(namespace, pod)
    try:
        while True:
            got = api.read_namespaced_pod(pod.metadata.name, namespace)
            if got.status.phase == "Running":
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > 120:
                raise TimeoutError("bare pod not Running after 120 s")
            time.sleep(0.01)
    finally:
        if delete:
            api.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)


def kubernetes_floor(kubeconfig: str, namespace: str, image: str, n: int) -> dict[str, float]:
    import concurrent.futures

    from kubernetes import client as k8s
    from kubernetes import config

    configuration = k8s.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    api = k8s.CoreV1Api(k8s.ApiClient(configuration))
    serial = [bare_pod_once(api, namespace, image) for _ in range(n)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: bare_pod_once(api, namespace, image), range(n)))
    return {
        "running_p50_ms": statistics.median(serial) * 1e3,
        "running_min_ms": min(serial) * 1e3,
        "churn_4": n / (time.perf_counter() - t0),
    }


async def kubernetes_cold(args: argparse.Namespace, n: int) -> dict[str, Any]:
    import codemode
    from codemode import authz
    from codemode.runtimes.kubernetes import KubernetesOptions, KubernetesRuntime

    rt = KubernetesRuntime(
        KubernetesOptions(kubeconfig=args.kubeconfig, namespace=args.namespace, image=args.image)
    )
    server = codemode.Builder(authorizer=authz.allow_all(), runtime=rt).build()
    times: list[float] = []
    phases: list[dict[str, float]] = []
    try:
        await server.execute(TRIVIAL, subject=authz.Subject("bench"))
        for _ in range(n):
            t0 = time.perf_counter()
            await server.execute(TRIVIAL, subject=authz.Subject("bench"))
            times.append(time.perf_counter() - t0)
            phases.append(dict(rt.last_phases))
    finally:
        await server.aclose()
    keys = phases[-1].keys() if phases else ()
    return {
        "p50_ms": statistics.median(times) * 1e3,
        "min_ms": min(times) * 1e3,
        "phases_p50_ms": {k: round(statistics.median(p[k] for p in phases if k in p) * 1e3) for k in keys},
    }


# ------------------------------------------------------------------------------------------ load


async def load(args: argparse.Namespace, runtime: str, pool: int, reuse: int) -> dict[str, Any]:
    # The load benchmark's own defaults, so an option it gains needs nothing here.
    ns = bench_service_load.parser().parse_args([])
    ns.runtime, ns.pool, ns.reuse = runtime, pool, reuse
    ns.n, ns.clients, ns.slots, ns.timeout = args.n, args.clients, args.slots, 900.0
    ns.image, ns.kubeconfig, ns.namespace, ns.cpu_request = (
        args.image,
        args.kubeconfig,
        args.namespace,
        args.cpu_request,
    )
    ns.floors = True  # the service path alone (search_api through the same server) after each load
    ns.fork_n = 0
    meter = CpuMeter(runtime)
    ns.on_load = meter.mark
    await bench_service_load.run(ns)
    server, daemons, sandboxes, machine = meter.spent()
    engine = daemons + sandboxes
    out = dict(ns.summary)
    done = max(out["ok"], 1)
    out["cpu_ms"] = {
        "server": server / done * 1e3,
        "engine": engine / done * 1e3,
        "daemons": daemons / done * 1e3,
        "sandboxes": sandboxes / done * 1e3,
        "machine": machine / done * 1e3,
    }
    out["per_core"] = done / max(server + engine, 1e-9)
    out["per_core_machine"] = done / max(machine, 1e-9)
    return out


def _row(label: str, r: dict[str, Any]) -> str:
    cpu = r["cpu_ms"]
    return (
        f"{label:<30} {r['throughput']:7.1f}/s  p50 {r['p50'] * 1e3:7.1f} ms  p99 {r['p99'] * 1e3:7.1f} ms  "
        f"cpu/execute {cpu['server'] + cpu['engine']:6.1f} ms (server {cpu['server']:5.1f}, engine "
        f"{cpu['daemons']:5.1f} + sandboxes {cpu['sandboxes']:5.1f}; machine {cpu['machine']:6.1f})  "
        f"{r['per_core']:6.1f} executes/s per core  ok {r['ok']}/{r['ok'] + sum(r['errors'].values())}"
    )


def _throughput(r: dict[str, Any]) -> float:
    return float(r["throughput"])


async def process_load(args: argparse.Namespace) -> float | None:
    """The process runtime's CPU per execute (ms) under the same load, its process tree counted."""
    ns = bench_service_load.parser().parse_args([])
    ns.runtime, ns.pool = "process", args.pool
    ns.n, ns.clients, ns.slots, ns.timeout = args.n, args.clients, args.slots, 900.0
    ns.floors, ns.open_fraction = False, 0.0
    await bench_service_load.run(ns)
    cpu = ns.summary.get("tree_cpu_ms")
    print(
        f"process runtime (pool {args.pool})       {ns.summary['throughput']:7.1f}/s  "
        f"cpu/execute {cpu if cpu is None else round(cpu, 1)} ms (server + template + workers)"
    )
    return float(cpu) if cpu else None


async def bench(args: argparse.Namespace) -> None:
    runtimes = ["docker", "kubernetes"] if args.runtime == "both" else [args.runtime]
    process_cpu = await process_load(args) if args.process else None
    for runtime in runtimes:
        print(f"=== {runtime}: {args.clients} clients, {args.n} executes, slots {args.slots}")
        print(f"image {args.image}")
        if runtime == "docker":
            floor = await asyncio.to_thread(docker_floor, args.image, args.floor_n)
            print(
                f"floor: raw engine {floor['rate_serial']:.1f} containers/s serially "
                f"(p50 {floor['p50_ms']:.0f} ms), {floor['rate_4']:.1f}/s 4 at a time"
            )
        else:
            floor = await asyncio.to_thread(
                kubernetes_floor, args.kubeconfig, args.bare_namespace, args.image, args.floor_n
            )
            print(
                f"floor: bare pod create->Running (API) p50 {floor['running_p50_ms']:.0f} ms "
                f"(min {floor['running_min_ms']:.0f}), churn {floor['churn_4']:.2f} pods/s 4 at a time"
            )
            cold = await kubernetes_cold(args, args.floor_n)
            print(
                f"cold execute p50 {cold['p50_ms']:.0f} ms (min {cold['min_ms']:.0f}) = "
                f"{cold['p50_ms'] / floor['running_p50_ms']:.2f}x the bare pod's create->Running; "
                f"phases p50 (ms from create): {cold['phases_p50_ms']}"
            )
        results: dict[str, list[dict[str, Any]]] = {"default": [], "reuse": []}
        for i in range(args.repeat):
            for mode, pool, reuse in (("default", args.pool, 0), ("reuse", args.reuse_pool, args.reuse)):
                r = await load(args, runtime, pool, reuse)
                results[mode].append(r)
                print(_row(f"{mode} run {i + 1} (pool {pool})", r))
        d, u = (max(results[m], key=_throughput) for m in ("default", "reuse"))
        print(
            f"{runtime}: reuse / default throughput {u['throughput'] / d['throughput']:.1f}x, "
            f"p99 {u['p99'] * 1e3:.0f} ms vs {d['p99'] * 1e3:.0f} ms, "
            f"CPU per execute {sum(u['cpu_ms'][k] for k in ('server', 'engine')):.1f} ms vs "
            f"{sum(d['cpu_ms'][k] for k in ('server', 'engine')):.1f} ms (best of {args.repeat} each)"
        )
        if runtime == "docker":
            ratio = d["throughput"] / floor["rate_4"]
            print(f"docker default vs the raw engine's 4-at-a-time rate: {ratio:.2f}x")
        if process_cpu:
            reused = min(sum(r["cpu_ms"][k] for k in ("server", "engine")) for r in results["reuse"])
            print(
                f"{runtime}: reuse CPU per execute {reused:.1f} ms vs the process runtime's "
                f"{process_cpu:.1f} ms = {reused / process_cpu:.2f}x (goal <= 1.5; best of {args.repeat})"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime", choices=["docker", "kubernetes", "both"], default="both")
    p.add_argument("--n", type=int, default=400, help="executes per load run")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2, help="load runs per mode (alternating)")
    p.add_argument("--pool", type=int, default=4, help="warm pool of the default mode")
    p.add_argument("--reuse-pool", type=int, default=20, help="idle sandboxes of the reuse mode")
    p.add_argument("--reuse", type=int, default=100, help="executes per sandbox in the reuse mode")
    p.add_argument("--floor-n", type=int, default=10, help="samples of each floor")
    p.add_argument(
        "--no-process",
        dest="process",
        action="store_false",
        help="skip the process runtime's load (the reference for the reuse mode's CPU per execute)",
    )
    p.add_argument("--image", default="codemode-worker:1")
    p.add_argument("--kubeconfig", default=bench_service_load.load_runtimes.KUBECONFIG)
    p.add_argument("--namespace", default="codemode-workers")
    p.add_argument("--bare-namespace", default="default")
    p.add_argument("--cpu-request", default="50m", help="worker pods' CPU request (a one-node cluster)")
    asyncio.run(bench(p.parse_args()))


if __name__ == "__main__":
    main()
