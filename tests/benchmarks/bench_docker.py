"""Docker runtime benchmarks (prints numbers; not a test). Needs a Docker engine and codemode-worker:1.

    python -m tests.benchmarks.bench_docker [--n 30] [--runtime runsc] [--skip-execute] [--by-process]
    python -m tests.benchmarks.bench_docker --burst-pattern [--min 2 --max 8 --bursts 3 --idle 20]
    python -m tests.benchmarks.bench_docker --oci-compare runc crun [--rounds 3] [--n 40]

Measured in one run on the same image, so the ratios are meaningful on a noisy machine:

- ``engine raw``: the Docker Engine's own ceiling with the same hardening flags:
  create -> attach -> start -> one line through stdin/stdout -> remove(force), sequentially,
  with a trivial Python echo as the entrypoint (no worker, no codemode code);
- ``docker run --rm -i``: the naive baseline, one ``docker run`` CLI process per program that runs a
  trivial program through the real worker (probe, exec, final);
- ``spawn+destroy``: DockerRuntime.spawn() (create, attach, start, probe -> probe_ack) and destroy()
  (kill, wait, inspect, remove);
- ``execute cold``: a trivial execute through codemode.Server on DockerRuntime (no pool);
- ``execute warm``: the same with WarmPool(DockerRuntime, size) (the pool refills in the background);
- ``one native call`` (warm);
- ``sustained``: executes/s with fresh containers, ``--concurrency`` at a time, no pool, next to the
  raw Engine rate;
- ``default mode``: the same executes/s over a warm pool of ``--pool`` (the default mode: one fresh
  container per execute, started ahead), beside the raw engine rate at the same concurrency (goal
  ≥ 1.5×).

``--by-process`` adds a line under the raw and the default series: their machine CPU per container
split by the processes it went to (the worker, the OCI runtime, the shim, dockerd, containerd, this host
process, the rest), sampled by ``perf`` over every core (``perf_by_process``; root). It also runs
the raw cycle once more with the network disabled, as the runtime creates its workers: the raw
cycle above leaves it enabled (``network_mode=none`` only), and for such a container the engine
adds a ``libnetwork-setkey`` start hook (a re-exec of dockerd's binary, the ``exe`` command) that
the runtime's containers do not run.

``--oci-compare runc crun`` runs only the OCI runtimes' comparison instead: per runtime (registered
with dockerd), interleaved over ``--rounds`` rounds, the raw engine rate (as the goal defines it and
with the network disabled, as the runtime creates its workers) and the default mode's rate at
``--concurrency``, and the spawn (create .. probe_ack) and destroy p50; then each runtime's default
mode against the first runtime's raw rate (the goal's baseline when the first is the engine's
default, runc).

``--burst-pattern`` runs only ``pool_burst`` on Docker instead: bursts then idle time, against a
fixed pool at ``--min``, a fixed pool at ``--max`` and a demand-sized pool between them.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import shutil
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psutil

from codemode.ops.bench import aecho
from codemode.ops.percentile import percentile
from codemode.runtimes.docker import DEFAULT_IMAGE, WORKER_USER, DockerOptions, DockerRuntime

from . import pool_burst
from .load_floors import machine_busy
from .perf_by_process import CpuByProcess


def show(name: str, xs: list[float]) -> dict[str, float]:
    p50, p99, mean = percentile(xs, 50) * 1000, percentile(xs, 99) * 1000, statistics.mean(xs) * 1000
    print(f"{name:<34} n={len(xs):<4} p50 {p50:8.1f} ms   p99 {p99:8.1f} ms   mean {mean:8.1f} ms")
    return {"p50_ms": p50, "p99_ms": p99}


# ------------------------------------------------------------------------------------------ machine CPU


class MachineCPU:
    """The whole machine's busy CPU (every core, every process: the engine's daemons, runc, the
    containers and this process) over a series, so a rate can be told apart from the work behind it.
    ``with MachineCPU() as m: ...`` then ``m.busy`` (CPU seconds) and ``m.wall`` (seconds)."""

    def __init__(self, by_process: bool = False) -> None:
        #: With ``by_process`` (``--by-process``): which processes the CPU went to (``perf``).
        self.processes = CpuByProcess() if by_process else None

    def __enter__(self) -> MachineCPU:
        if self.processes is not None:
            self.processes.__enter__()
        self._t0, self._c0 = time.perf_counter(), machine_busy()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._t0
        self.busy = machine_busy() - self._c0
        if self.processes is not None:
            self.processes.__exit__(*exc)

    def per(self, count: int) -> str:
        """CPU ms per item and the cores' utilization, as one phrase."""
        cores = psutil.cpu_count() or 1
        return (
            f"machine CPU {1000 * self.busy / max(count, 1):.1f} ms per container, "
            f"{100 * self.busy / (self.wall * cores):.0f}% of {cores} cores busy"
        )

    def print_parts(self, count: int) -> None:
        """With ``by_process``: one more line, the CPU per container of each part (``perf_by_process``)."""
        if self.processes is not None:
            print(f"{'':<34} {self.processes.per(1000 * self.busy / max(count, 1))}")


# ------------------------------------------------------------------------------------------ raw engine


ECHO = "import sys; sys.stdout.write(sys.stdin.readline()); sys.stdout.flush()"


def engine_raw_once(api: Any, image: str, runtime: str | None, network_disabled: bool = False) -> float:
    """One raw cycle; ``network_disabled`` as the runtime creates its workers (the engine then
    adds no ``libnetwork-setkey`` start hook, a re-exec of dockerd's binary per container)."""
    t0 = time.perf_counter()
    hc = api.create_host_config(
        network_mode="none",
        read_only=True,
        mem_limit=256 * 1024 * 1024,
        memswap_limit=256 * 1024 * 1024,
        nano_cpus=1_000_000_000,
        pids_limit=64,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        ipc_mode="none",
        runtime=runtime,
    )
    cid = api.create_container(
        image,
        entrypoint=["python3", "-I", "-S", "-c", ECHO],
        stdin_open=True,
        user=WORKER_USER,
        labels={"io.codemode.role": "bench-raw"},
        host_config=hc,
        network_disabled=network_disabled,
    )["Id"]
    sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
    raw = sock._sock
    try:
        api.start(cid)
        raw.sendall(b"ping\n")
        buf = b""
        while len(buf) < 8 + 5:
            chunk = raw.recv(4096)
            if not chunk:
                break
            buf += chunk
        assert buf[8:] == b"ping\n", buf
    finally:  # a start the OCI runtime refused leaves no container behind either
        api.remove_container(cid, force=True)
        raw.close()
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------ naive docker run


def frame(obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


EXEC = {
    "k": "exec",
    "v": 1,
    "source": "def main():\n    return 1\n",
    "manifest": [],
    "limits": {
        "max_steps": 1_000_000,
        "max_value_depth": 32,
        "max_value_bytes": 1024 * 1024,
        "max_native_calls": 100,
        "max_callstack": 100,
    },
}


def naive_run_once(image: str, runtime: str | None) -> float:
    cmd = ["docker", "run", "--rm", "-i", "--network", "none", "--read-only", "--cap-drop", "ALL"]
    cmd += ["--security-opt", "no-new-privileges", "--user", WORKER_USER, "--memory", "256m"]
    cmd += ["--memory-swap", "256m", "--pids-limit", "64", "--ipc", "none"]
    cmd += ["--label", "io.codemode.role=bench-naive"]
    if runtime:
        cmd += ["--runtime", runtime]
    cmd.append(image)
    t0 = time.perf_counter()
    out = subprocess.run(
        cmd, input=frame({"k": "probe", "v": 1}) + frame(EXEC), capture_output=True, timeout=60, check=False
    ).stdout
    elapsed = time.perf_counter() - t0
    kinds = []
    while len(out) >= 4:
        (n,) = struct.unpack(">I", out[:4])
        kinds.append(json.loads(out[4 : 4 + n])["k"])
        out = out[4 + n :]
    assert kinds[:2] == ["probe_ack", "final"], kinds
    return elapsed


# ------------------------------------------------------------------------------------------ runtime + server


async def timed(fn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        xs.append(time.perf_counter() - t0)
    return xs


def build_server(runtime: Any) -> Any:
    import codemode
    from codemode import authz

    b = codemode.Builder(authorizer=authz.allow_all(), runtime=runtime)
    b.register(codemode.Capability(name="util.echo", summary="Echo.", handler=aecho))
    return b.build()


TRIVIAL = "def main():\n    return 1\n"
ONE_CALL = "def main():\n    return util.echo(value='x')['value']\n"


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    import docker

    results: dict[str, Any] = {}
    api = docker.APIClient(version="auto", timeout=60)
    engine = api.version()
    print(
        f"docker {engine.get('Version')} (API {engine.get('ApiVersion')}), image {args.image}, "
        f"OCI runtime {args.runtime or 'default'}, n={args.n}"
    )

    # warm the image cache / page cache once
    engine_raw_once(api, args.image, args.runtime)

    rt = DockerRuntime(DockerOptions(image=args.image, oci_runtime=args.runtime))
    await rt.check()
    naive_ok = shutil.which("docker") is not None
    # Interleaved, one of each per round, so that load spikes from anything else on the machine
    # hit every series alike.
    raw: list[float] = []
    naive: list[float] = []
    cycles: list[float] = []
    spawns: list[float] = []
    destroys: list[float] = []
    for _ in range(args.n):
        raw.append(await asyncio.to_thread(engine_raw_once, api, args.image, args.runtime))
        if naive_ok:
            naive.append(await asyncio.to_thread(naive_run_once, args.image, args.runtime))
        t0 = time.perf_counter()
        s = await rt.spawn()
        t1 = time.perf_counter()
        await s.destroy()
        t2 = time.perf_counter()
        cycles.append(t2 - t0)
        spawns.append(t1 - t0)
        destroys.append(t2 - t1)
    await rt.aclose()

    results["engine_raw"] = show("engine raw create..remove", raw)
    raw_serial = len(raw) / sum(raw)
    results["engine_raw"]["per_s"] = raw_serial
    print(f"{'':<34} raw engine rate {raw_serial:.2f} containers/s (sequential)")
    if naive:
        results["naive_docker_run"] = show("naive docker run --rm -i", naive)
    results["spawn_destroy"] = show("DockerRuntime spawn+destroy", cycles)
    results["spawn"] = show("  spawn (to probe_ack)", spawns)
    results["destroy"] = show("  destroy", destroys)

    # The raw cycle with `concurrency` in flight: the daemon's ceiling on this machine.
    total = max(args.n, 2 * args.concurrency)
    with MachineCPU(args.by_process) as raw_cpu:
        raw_conc = raw_rate(api, args.image, args.runtime, args.concurrency, total)
    results["engine_raw"]["per_s_concurrent"] = raw_conc
    results["engine_raw"]["cpu_ms"] = 1000 * raw_cpu.busy / total
    print(f"{'':<34} raw engine rate {raw_conc:.2f} containers/s at concurrency {args.concurrency}")
    print(f"{'':<34} {raw_cpu.per(total)}")
    raw_cpu.print_parts(total)
    if args.by_process:  # the same cycle without the engine's network hook, as the runtime's
        with MachineCPU(True) as bare_cpu:
            bare = raw_rate(api, args.image, args.runtime, args.concurrency, total, network_disabled=True)
        results["engine_raw"]["per_s_network_disabled"] = bare
        print(f"{'':<34} network disabled: {bare:.2f} containers/s at concurrency {args.concurrency}")
        print(f"{'':<34} {bare_cpu.per(total)}")
        bare_cpu.print_parts(total)

    if not args.skip_execute:
        import codemode
        from codemode import authz

        subject = authz.Subject("bench")
        cold_server = build_server(DockerRuntime(DockerOptions(image=args.image, oci_runtime=args.runtime)))
        await cold_server.execute(TRIVIAL, subject=subject)
        cold = await timed(lambda: cold_server.execute(TRIVIAL, subject=subject), args.n)
        results["execute_cold"] = show("execute trivial, cold (no pool)", cold)

        # sustained: fresh containers, `concurrency` executes in flight
        t0 = time.perf_counter()
        total = max(args.n, 2 * args.concurrency)
        sem = asyncio.Semaphore(args.concurrency)

        async def one() -> None:
            async with sem:
                await cold_server.execute(TRIVIAL, subject=subject)

        with MachineCPU() as fresh_cpu:
            await asyncio.gather(*(one() for _ in range(total)))
        rate = total / (time.perf_counter() - t0)
        results["sustained"] = {"per_s": rate, "concurrency": args.concurrency, "vs_raw": rate / raw_conc}
        print(
            f"{'sustained executes/s (fresh)':<34} {rate:.2f}/s at concurrency {args.concurrency}"
            f"  = {rate / raw_conc:.2f}x the raw engine rate at the same concurrency"
        )
        print(f"{'':<34} {fresh_cpu.per(total)}")
        await cold_server.aclose()

        default_cpu = MachineCPU(args.by_process)
        default = await default_rate(
            args.image, args.runtime, args.pool, args.concurrency, total, default_cpu
        )
        cpu_ms = 1000 * default_cpu.busy / total
        results["default_mode"] = {"per_s": default, "vs_raw": default / raw_conc, "cpu_ms": cpu_ms}
        print(
            f"{'default mode executes/s (pool ' + str(args.pool) + ')':<34} {default:.2f}/s at concurrency "
            f"{args.concurrency}  = {default / raw_conc:.2f}x the raw engine rate (goal >= 1.5)"
        )
        print(f"{'':<34} {default_cpu.per(total)}")
        default_cpu.print_parts(total)
        bound = results["engine_raw"]["cpu_ms"] / cpu_ms
        print(
            f"{'':<34} CPU per container, raw / default = {bound:.2f} (the rate ratio's ceiling "
            "were both series to keep every core busy)"
        )

        warm_pool = codemode.WarmPool(
            DockerRuntime(DockerOptions(image=args.image, oci_runtime=args.runtime)), args.pool
        )
        warm_server = build_server(warm_pool)
        await warm_server.start()

        async def warm(source: str) -> None:
            await warm_pool.wait_warm(120)
            t0 = time.perf_counter()
            await warm_server.execute(source, subject=subject)
            warm_times.append(time.perf_counter() - t0)

        warm_times: list[float] = []
        for _ in range(args.n):
            await warm(TRIVIAL)
        results["execute_warm"] = show("execute trivial, warm (pool)", warm_times)
        warm_times = []
        for _ in range(args.n):
            await warm(ONE_CALL)
        results["execute_warm_one_call"] = show("execute one native call, warm", warm_times)
        await warm_server.aclose()

        if "naive_docker_run" in results:
            ratio = results["naive_docker_run"]["p50_ms"] / results["execute_warm"]["p50_ms"]
            results["warm_vs_naive"] = ratio
            print(f"{'warm p50 vs naive docker run p50':<34} {ratio:.1f}x faster")

    leaked = api.containers(all=True, filters={"label": ["io.codemode.role=worker"]})
    leaked += api.containers(all=True, filters={"label": ["io.codemode.role=bench-raw"]})
    print(f"leaked containers: {len(leaked)}")
    api.close()
    return results


async def default_rate(
    image: str,
    oci: str | None,
    pool_size: int,
    concurrency: int,
    total: int,
    cpu: MachineCPU | None = None,
    entrypoint: tuple[str, ...] | None = None,
) -> float:
    """Executes/s of the default mode (a fresh container per execute, over a warm pool of
    ``pool_size``), ``concurrency`` in flight, once the pool is warm; ``cpu`` (when given) measures
    the machine's CPU over the same executes; ``entrypoint`` replaces the worker's."""
    import codemode
    from codemode import authz

    options = DockerOptions(image=image, oci_runtime=oci, entrypoint=entrypoint)
    pool = codemode.WarmPool(DockerRuntime(options), pool_size)
    server = build_server(pool)
    await server.start()
    try:
        await pool.wait_warm(120)
        subject = authz.Subject("bench")
        sem = asyncio.Semaphore(concurrency)
        failed: list[str] = []

        async def one() -> None:
            async with sem:
                try:
                    await server.execute(TRIVIAL, subject=subject)
                except codemode.CodeModeError as exc:  # counted, not the end of the series
                    failed.append(str(exc))

        with cpu or MachineCPU():
            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(total)))
            wall = time.perf_counter() - t0
        if failed:
            print(f"  default mode: {len(failed)} of {total} executes failed ({sorted(set(failed))})")
        return (total - len(failed)) / wall
    finally:
        await server.aclose()


def raw_rate(
    api: Any, image: str, oci: str | None, concurrency: int, total: int, network_disabled: bool = False
) -> float:
    """The raw engine's hardened containers per second, ``concurrency`` at a time
    (``network_disabled``: see ``engine_raw_once``)."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: engine_raw_once(api, image, oci, network_disabled), range(total)))
    return total / (time.perf_counter() - t0)


async def oci_compare(args: argparse.Namespace) -> dict[str, Any]:
    """The OCI runtimes of ``--oci-compare`` side by side, interleaved round by round."""
    import docker

    api = docker.APIClient(version="auto", timeout=60)
    names = list(args.oci_compare)
    total = max(args.n, 2 * args.concurrency)
    got: dict[str, dict[str, list[float]]] = {
        n: {"raw": [], "raw_no_net": [], "default": [], "spawn": [], "destroy": []} for n in names
    }
    print(
        f"OCI runtimes {', '.join(names)}: {args.rounds} rounds, {total} containers or executes per series, "
        f"concurrency {args.concurrency}, pool {args.pool}, image {args.image}"
    )
    for name in list(names):  # warm the image and page cache under each; drop one that cannot run
        try:
            engine_raw_once(api, args.image, name)
        except docker.errors.APIError as exc:
            print(f"{name}: cannot start a container here: {exc.explanation or exc}")
            names.remove(name)
            del got[name]
    if not names:
        api.close()
        return {}
    for _ in range(args.rounds):
        for name in names:
            got[name]["raw"].append(
                await asyncio.to_thread(raw_rate, api, args.image, name, args.concurrency, total)
            )
            got[name]["raw_no_net"].append(
                await asyncio.to_thread(raw_rate, api, args.image, name, args.concurrency, total, True)
            )
            got[name]["default"].append(
                await default_rate(args.image, name, args.pool, args.concurrency, total)
            )
            rt = DockerRuntime(DockerOptions(image=args.image, oci_runtime=name))
            for _ in range(5):
                t0 = time.perf_counter()
                sandbox = await rt.spawn()
                t1 = time.perf_counter()
                await sandbox.destroy()
                got[name]["spawn"].append(t1 - t0)
                got[name]["destroy"].append(time.perf_counter() - t1)
            await rt.aclose()
    out: dict[str, Any] = {}
    columns = [("raw engine/s", 13), ("no network", 11), ("default mode/s", 15), ("ratio", 6)]
    columns += [("spawn p50", 10), ("destroy p50", 12)]
    print(f"{'runtime':<8} " + " ".join(f"{title:>{width}}" for title, width in columns))
    for name in names:
        g = got[name]
        raw, default = statistics.median(g["raw"]), statistics.median(g["default"])
        out[name] = {
            "raw_per_s": raw,
            "raw_no_network_per_s": statistics.median(g["raw_no_net"]),
            "default_per_s": default,
            "spawn_p50_ms": statistics.median(g["spawn"]) * 1e3,
            "destroy_p50_ms": statistics.median(g["destroy"]) * 1e3,
        }
        print(
            f"{name:<8} {raw:13.2f} {out[name]['raw_no_network_per_s']:11.2f} "
            f"{default:15.2f} {default / raw:5.2f}x "
            f"{out[name]['spawn_p50_ms']:8.0f} ms {out[name]['destroy_p50_ms']:10.0f} ms"
        )
    base = names[0]
    for name in names[1:]:
        print(
            f"{name} / {base}: raw {out[name]['raw_per_s'] / out[base]['raw_per_s']:.2f}x, "
            f"no network {out[name]['raw_no_network_per_s'] / out[base]['raw_no_network_per_s']:.2f}x, "
            f"default mode {out[name]['default_per_s'] / out[base]['default_per_s']:.2f}x "
            f"(medians of {args.rounds} rounds)"
        )
        print(
            f"default mode on {name} / raw engine on {base}: "
            f"{out[name]['default_per_s'] / out[base]['raw_per_s']:.2f}x (goal >= 1.5 when {base} is the "
            f"engine's default)"
        )
    api.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=30, help="samples per measurement")
    p.add_argument("--image", default=DEFAULT_IMAGE)
    p.add_argument("--runtime", default=None, help="OCI runtime name, e.g. runsc")
    p.add_argument("--pool", type=int, default=4, help="warm pool size")
    p.add_argument("--concurrency", type=int, default=4, help="in-flight executes for the sustained rate")
    p.add_argument("--skip-execute", action="store_true", help="only engine/runtime numbers")
    p.add_argument("--json", action="store_true", help="print the results as JSON at the end")
    p.add_argument(
        "--by-process",
        action="store_true",
        help="also print which processes the raw and default series' CPU went to (perf; root)",
    )
    p.add_argument(
        "--burst-pattern", action="store_true", help="only fixed against demand-sized pools (pool_burst)"
    )
    p.add_argument(
        "--oci-compare",
        nargs="+",
        metavar="RUNTIME",
        help="only compare these OCI runtimes (registered with dockerd), e.g. runc crun",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of --oci-compare (default 3)")
    pool_burst.add_arguments(p)
    args = p.parse_args()
    if args.oci_compare:
        found_oci = asyncio.run(oci_compare(args))
        if args.json:
            json.dump(found_oci, sys.stdout, indent=2)
            print()
        return
    if args.burst_pattern:
        args.window = args.window or [2.0]
        image, oci = args.image, args.runtime
        found = asyncio.run(
            pool_burst.run_all(lambda: DockerRuntime(DockerOptions(image=image, oci_runtime=oci)), args)
        )
        if args.json:
            json.dump([vars(r) for r in found], sys.stdout, indent=2)
            print()
        return
    results = asyncio.run(bench(args))
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()


if __name__ == "__main__":
    main()
