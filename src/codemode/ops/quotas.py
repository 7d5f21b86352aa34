"""``codemode quotas tune``: measure a workload to tune the worker cgroup quotas (docs/operators.md).

Method, in short:

- the program runs ``--runs`` times (after ``--warmup`` unmeasured runs), one after another, each
  in a fresh container of the Docker runtime with *generous* limits (``--memory``, ``--cpus``,
  ``--pids``, ``--timeout``) and otherwise the runtime's full hardening;
- the worker inside runs exactly the image's worker code (``codemode_worker.entry.main``) but is
  started as ``python3 -I -c <hold>``: after it has sent its final frame it stays idle, holding its
  cgroup, until the host closes its stdin. That lets the host read the container's counters *after*
  the program finished and *before* the container goes away (a worker that exits takes its cgroup,
  and with it the counters, along);
- per run: the execute's wall time (``Server.execute``, which includes starting the container, as
  ``max_execution_time`` does), the spawn time, and from ``container stats`` (one-shot) at the end:
  peak memory (cgroup v1 ``memory.max_usage_in_bytes``, a high-water mark; on cgroup v2, where the
  Engine reports no peak, the highest sampled usage), CPU time (``cpuacct.usage``: everything the
  container ran, interpreter start and warm-up included), throttled periods, and the pids count
  (sampled about once a second while the worker runs, plus at the end: cgroup v1 has no pids peak);
- recommendation: memory = peak × 1.5 rounded up to 16 MiB; CPUs = 1.25 × the highest CPU
  utilisation (CPU time / execute wall time) rounded up to 0.25, at least 0.25; pids = twice the
  highest pids count, at least 16; max_execution_time = p99 of the execute wall time × 2, rounded
  up to 0.1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..common.errors import CodeModeError
from ..runtimes.base import ExitInfo, RuntimeUnavailable, Sandbox

__all__ = [
    "HOLD_ENTRYPOINT",
    "MeasuringRuntime",
    "Recommendation",
    "RunSample",
    "TuneError",
    "add_arguments",
    "format_report",
    "recommend",
    "run",
    "tune",
]

MiB = 1024 * 1024
MEMORY_FACTOR = 1.5
MEMORY_STEP = 16 * MiB
CPU_FACTOR = 1.25
CPU_STEP = 0.25
PIDS_FACTOR = 2
PIDS_FLOOR = 16
TIME_FACTOR = 2.0
TIME_STEP = 0.1

#: The image's worker, run in-process, then held until stdin closes so its cgroup can be read.
_HOLD = (
    "import os, sys\n"
    "from codemode_worker.entry import main\n"
    "code = main()\n"
    "try:\n"
    "    sys.stderr.flush()\n"
    "    while sys.stdin.buffer.read(65536):\n"
    "        pass\n"
    "except Exception:\n"
    "    pass\n"
    "os._exit(code)\n"
)
HOLD_ENTRYPOINT = ("python3", "-I", "-c", _HOLD)


@dataclass
class RunSample:
    """What one measured run used."""

    outcome: str  # "ok" or the coarse error text (e.g. "resource limit exceeded")
    execute_s: float
    spawn_s: float | None = None
    memory_peak_bytes: int | None = None
    memory_method: str = ""  # "max_usage" (cgroup v1 high-water mark) | "sampled usage" | ""
    memory_rss_end_bytes: int | None = None
    cpu_s: float | None = None
    throttled_periods: int | None = None
    pids_peak: int | None = None
    oom_killed: bool = False
    #: False when the container had exited before the final reading (the worker died): the
    #: counters are then those of the last reading while it ran, i.e. lower bounds.
    counters_final: bool = True

    @property
    def cpu_utilisation(self) -> float | None:
        if self.cpu_s is None or self.execute_s <= 0:
            return None
        return self.cpu_s / self.execute_s


@dataclass
class Recommendation:
    memory_bytes: int
    cpus: float
    pids_limit: int
    max_execution_time: float
    basis: dict[str, Any] = field(default_factory=dict)

    def serve_flags(self) -> list[str]:
        return [
            "--runtime",
            "docker",
            "--docker-memory",
            f"{self.memory_bytes // MiB}m",
            "--docker-cpus",
            f"{self.cpus:g}",
            "--docker-pids",
            str(self.pids_limit),
            "--max-execution-time",
            f"{self.max_execution_time:g}",
        ]


# --------------------------------------------------------------------------------------------------
# Measuring runtime: a DockerRuntime whose sandboxes read their container's stats before destroy
# --------------------------------------------------------------------------------------------------


class _Sampler:
    """Reads ``container stats`` (one-shot) of one container: in a loop while it runs, once at the end."""

    def __init__(self, api: Any, container_id: str) -> None:
        self.api = api
        self.cid = container_id
        self.lock = threading.Lock()
        self.pids_peak: int | None = None
        self.usage_peak: int | None = None
        self.last: dict[str, Any] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self._loop, name=f"codemode-quotas-{self.cid[:12]}", daemon=True
        )
        self.thread.start()

    def sample(self) -> dict[str, Any]:
        try:
            stats = self.api.stats(self.cid, stream=False, one_shot=True)
        except Exception:
            return {}
        if not isinstance(stats, dict):
            return {}
        memory = stats.get("memory_stats") or {}
        pids = (stats.get("pids_stats") or {}).get("current")
        with self.lock:
            if isinstance(pids, int):
                self.pids_peak = max(self.pids_peak or 0, pids)
            usage = memory.get("usage")
            if isinstance(usage, int):
                self.usage_peak = max(self.usage_peak or 0, usage)
            if memory:  # an exited container reports empty stats: keep the last real sample
                self.last = stats
        return stats

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.sample()  # the Engine's collector answers about once a second
            self.stop.wait(0.05)

    def finish(self) -> dict[str, Any]:
        self.stop.set()
        final = bool(self.sample().get("memory_stats"))
        self.thread.join(timeout=5.0)
        with self.lock:
            return {
                "last": self.last,
                "final": final,
                "pids_peak": self.pids_peak,
                "usage_peak": self.usage_peak,
            }


class _MeasuredSandbox:
    def __init__(self, runtime: MeasuringRuntime, inner: Any, spawn_s: float) -> None:
        self._runtime = runtime
        self._inner = inner
        self.spawn_s = spawn_s
        self._sampler = _Sampler(runtime.api, inner.container_id)
        self._destroying: asyncio.Future[ExitInfo] | None = None

    @property
    def worker_id(self) -> str:
        return str(self._inner.worker_id)

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)

    async def read(self, max_bytes: int) -> bytes:
        data: bytes = await self._inner.read(max_bytes)
        return data

    async def close_input(self) -> None:
        # The hold entry exits when stdin closes: read the counters first.
        await self._runtime.finish(self)
        await self._inner.close_input()

    def alive(self) -> bool:
        return bool(self._inner.alive())

    async def destroy(self) -> ExitInfo:
        if self._destroying is None:
            self._destroying = asyncio.ensure_future(self._destroy())
        return await asyncio.shield(self._destroying)

    async def _destroy(self) -> ExitInfo:
        await self._runtime.finish(self)
        info: ExitInfo = await self._inner.destroy()
        self._runtime.exits[self] = info
        self._runtime.done(self)
        return info

    async def finish_sampling(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._sampler.finish)


class MeasuringRuntime:
    """Wraps a :class:`~codemode.runtimes.docker.DockerRuntime` started with :data:`HOLD_ENTRYPOINT`."""

    def __init__(self, inner: Any, api: Any) -> None:
        self.inner = inner
        self.api = api
        self.stats: dict[_MeasuredSandbox, dict[str, Any]] = {}
        self.exits: dict[_MeasuredSandbox, ExitInfo] = {}
        self._finishing: dict[_MeasuredSandbox, asyncio.Future[dict[str, Any]]] = {}
        self._done: dict[_MeasuredSandbox, asyncio.Event] = {}
        self.sandboxes: list[_MeasuredSandbox] = []

    @property
    def name(self) -> str:
        return f"{self.inner.name}+measured"

    async def start(self) -> None:
        await self.inner.start()

    async def check(self) -> None:
        await self.inner.check()

    async def spawn(self) -> Sandbox:
        t0 = time.perf_counter()
        inner = await self.inner.spawn()
        sandbox = _MeasuredSandbox(self, inner, time.perf_counter() - t0)
        self._done[sandbox] = asyncio.Event()
        self.sandboxes.append(sandbox)
        return sandbox

    async def finish(self, sandbox: _MeasuredSandbox) -> dict[str, Any]:
        future = self._finishing.get(sandbox)
        if future is None:
            future = self._finishing[sandbox] = asyncio.ensure_future(sandbox.finish_sampling())
        result = await asyncio.shield(future)
        self.stats[sandbox] = result
        return result

    def done(self, sandbox: _MeasuredSandbox) -> None:
        self._done[sandbox].set()

    async def wait_destroyed(self, sandbox: _MeasuredSandbox, timeout: float) -> None:
        await asyncio.wait_for(self._done[sandbox].wait(), timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _sample_from(
    outcome: str, execute_s: float, sandbox: _MeasuredSandbox | None, rt: MeasuringRuntime
) -> RunSample:
    sample = RunSample(outcome=outcome, execute_s=execute_s)
    if sandbox is None:
        return sample
    sample.spawn_s = sandbox.spawn_s
    info = rt.exits.get(sandbox)
    if info is not None:
        sample.oom_killed = info.oom_killed
    data = rt.stats.get(sandbox) or {}
    sample.counters_final = bool(data.get("final"))
    last: Mapping[str, Any] = data.get("last") or {}
    memory = last.get("memory_stats") or {}
    if isinstance(memory.get("max_usage"), int) and memory["max_usage"] > 0:
        sample.memory_peak_bytes = memory["max_usage"]
        sample.memory_method = "max_usage"
    elif data.get("usage_peak"):
        sample.memory_peak_bytes = int(data["usage_peak"])
        sample.memory_method = "sampled usage"
    inner_stats = memory.get("stats") or {}
    rss = inner_stats.get("total_rss", inner_stats.get("anon"))
    if isinstance(rss, int):
        sample.memory_rss_end_bytes = rss
    cpu = last.get("cpu_stats") or {}
    total = (cpu.get("cpu_usage") or {}).get("total_usage")
    if isinstance(total, int) and total > 0:
        sample.cpu_s = total / 1e9
    throttled = (cpu.get("throttling_data") or {}).get("throttled_periods")
    if isinstance(throttled, int):
        sample.throttled_periods = throttled
    if data.get("pids_peak"):
        sample.pids_peak = int(data["pids_peak"])
    if sample.oom_killed:
        sample.memory_peak_bytes = rt.inner.memory_bytes
        sample.memory_method = "OOM-killed at the limit"
    return sample


# --------------------------------------------------------------------------------------------------
# Recommendation (pure)
# --------------------------------------------------------------------------------------------------


def _pct(xs: list[float], p: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _round_up(value: float, step: float) -> float:
    return math.ceil(round(value / step, 9)) * step


def recommend(samples: list[RunSample]) -> Recommendation | None:
    """The quotas for ``samples`` (the successful ones count), or None without a usable sample."""
    good = [s for s in samples if s.outcome == "ok"]
    if not good:
        return None
    peaks = [s.memory_peak_bytes for s in good if s.memory_peak_bytes]
    utils = [u for s in good if (u := s.cpu_utilisation) is not None]
    pids = [s.pids_peak for s in good if s.pids_peak]
    times = [s.execute_s for s in good]
    peak = max(peaks) if peaks else None
    memory = int(_round_up(peak * MEMORY_FACTOR, MEMORY_STEP)) if peak else 256 * MiB
    memory = max(memory, MEMORY_STEP)
    util = max(utils) if utils else None
    cpus = max(CPU_STEP, _round_up(util * CPU_FACTOR, CPU_STEP)) if util is not None else 1.0
    pids_peak = max(pids) if pids else None
    pids_limit = max(PIDS_FLOOR, PIDS_FACTOR * pids_peak) if pids_peak else 64
    p99 = _pct(times, 99)
    max_time = round(_round_up(p99 * TIME_FACTOR, TIME_STEP), 1)
    return Recommendation(
        memory_bytes=memory,
        cpus=round(cpus, 2),
        pids_limit=pids_limit,
        max_execution_time=max_time,
        basis={
            "runs_ok": len(good),
            "memory_peak_bytes": peak,
            "memory_method": sorted({s.memory_method for s in good if s.memory_method}),
            "cpu_utilisation_max": util,
            "cpu_seconds_max": max((s.cpu_s for s in good if s.cpu_s is not None), default=None),
            "pids_peak": pids_peak,
            "execute_p50_s": _pct(times, 50),
            "execute_p99_s": p99,
            "spawn_p50_s": _pct([s.spawn_s for s in good if s.spawn_s is not None] or [0.0], 50),
            "throttled_periods_max": max((s.throttled_periods or 0 for s in good), default=0),
        },
    )


# --------------------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------------------


class TuneError(Exception):
    """A problem with the arguments or the environment (exit 2)."""


def _size(text: str) -> int:
    from ..startup.config import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise TuneError(f"--memory: {exc}") from None


def _settings(args: argparse.Namespace) -> Any:
    """The measurement's settings through the one settings model (packs, authorizer, limits)."""
    from ..startup.config import ConfigError, load_settings

    overrides: dict[str, Any] = {
        "packs": list(args.pack),
        "pack_options": list(args.pack_option),
        "allow_all": bool(args.allow_all) or not args.pack,  # nothing to call without a pack
        "rego_policy": list(args.rego_policy),
        "rego_decision": args.rego_decision,
        "max_execution_time": args.timeout,
        "max_concurrent_executions": 1,
        "subject_quota": 0,
    }
    if args.max_execution_steps:
        overrides["max_execution_steps"] = args.max_execution_steps
    if args.max_native_calls:
        overrides["max_native_calls"] = args.max_native_calls
    if args.pack and not args.allow_all and not args.rego_policy and not args.rego_decision:
        raise TuneError(
            "with --pack, choose the authorizer the program's capability calls go through: "
            "--allow-all, or --rego-policy FILE --rego-decision data.<pkg>.allow (the calls are real)"
        )
    if overrides["allow_all"] and (args.rego_policy or args.rego_decision):
        overrides["allow_all"] = bool(args.allow_all)
    try:
        return load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as exc:
        raise TuneError(str(exc)) from None


def _server(args: argparse.Namespace, runtime: Any) -> Any:
    from ..startup.bootstrap import build_server
    from ..startup.config import ConfigError

    settings = _settings(args)
    try:
        return build_server(settings, runtime=runtime)
    except ConfigError as exc:
        raise TuneError(str(exc)) from None


async def tune(args: argparse.Namespace, source: str, progress: bool = True) -> dict[str, Any]:
    """Run the measurement; returns the JSON report."""
    import docker

    from .. import authz
    from ..runtimes.docker import DockerRuntime

    memory = _size(args.memory)
    kwargs: dict[str, Any] = {
        "memory_bytes": memory,
        "cpus": args.cpus,
        "pids_limit": args.pids,
        "entrypoint": HOLD_ENTRYPOINT,
        "cleanup_orphans": "none",
    }
    if args.docker_image:
        kwargs["image"] = args.docker_image
    if args.docker_base_url:
        kwargs["base_url"] = args.docker_base_url
    if args.docker_oci_runtime:
        kwargs["runtime"] = args.docker_oci_runtime
    try:
        inner = DockerRuntime(**kwargs)
    except ValueError as exc:
        raise TuneError(f"docker runtime: {exc}") from None
    runtime = MeasuringRuntime(inner, None)
    try:
        server = _server(args, runtime)
    except BaseException:
        await inner.aclose()
        raise
    subject = authz.Subject(args.subject)
    samples: list[RunSample] = []
    try:
        # A precise RuntimeUnavailable first: daemon unreachable, image missing or mislabelled.
        await runtime.check()
        env_kwargs: dict[str, Any] = (
            {"base_url": args.docker_base_url} if args.docker_base_url else docker.utils.kwargs_from_env()
        )
        env_kwargs.setdefault("base_url", "unix:///var/run/docker.sock")
        runtime.api = docker.APIClient(version="auto", timeout=60, max_pool_size=16, **env_kwargs)
        total = args.warmup + args.runs
        for i in range(total):
            measured = i >= args.warmup
            before = len(runtime.sandboxes)
            t0 = time.perf_counter()
            try:
                await server.execute(source, subject=subject)
                outcome = "ok"
            except CodeModeError as exc:
                outcome = str(exc)
            elapsed = time.perf_counter() - t0
            sandbox = runtime.sandboxes[before] if len(runtime.sandboxes) > before else None
            if sandbox is not None:
                await runtime.wait_destroyed(sandbox, timeout=args.timeout + 120)
            if not measured:
                if progress:
                    print(f"warm-up run: {outcome} in {elapsed:.3f} s", file=sys.stderr, flush=True)
                continue
            sample = _sample_from(outcome, elapsed, sandbox, runtime)
            samples.append(sample)
            if progress:
                print(
                    f"run {len(samples)}/{args.runs}: {outcome} in {elapsed:.3f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        await server.aclose()
        if runtime.api is not None:
            with contextlib.suppress(Exception):
                runtime.api.close()
    rec = recommend(samples)
    return {
        "program": args.program,
        "runs": args.runs,
        "warmup": args.warmup,
        "image": inner.image,
        "oci_runtime": inner.runtime,
        "measurement_limits": {
            "memory_bytes": memory,
            "cpus": args.cpus,
            "pids_limit": args.pids,
            "max_execution_time": args.timeout,
        },
        "samples": [asdict(s) | {"cpu_utilisation": s.cpu_utilisation} for s in samples],
        "recommendation": None
        if rec is None
        else {
            "memory_bytes": rec.memory_bytes,
            "cpus": rec.cpus,
            "pids_limit": rec.pids_limit,
            "max_execution_time": rec.max_execution_time,
            "serve_flags": rec.serve_flags(),
            "basis": rec.basis,
        },
        "method": {
            "memory": f"peak x {MEMORY_FACTOR}, rounded up to {MEMORY_STEP // MiB} MiB",
            "cpus": f"max CPU utilisation x {CPU_FACTOR}, rounded up to {CPU_STEP}, at least {CPU_STEP}",
            "pids_limit": f"max pids x {PIDS_FACTOR}, at least {PIDS_FLOOR}",
            "max_execution_time": f"p99 execute wall time x {TIME_FACTOR}, rounded up to {TIME_STEP} s",
        },
    }


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MiB:.1f} MiB"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_report(report: dict[str, Any]) -> str:
    lim = report["measurement_limits"]
    lines = [
        f"codemode quotas tune: {report['program']} on {report['image']}"
        + (f" ({report['oci_runtime']})" if report["oci_runtime"] else ""),
        f"measured with memory {_mib(lim['memory_bytes'])}, cpus {lim['cpus']:g}, pids {lim['pids_limit']}, "
        f"timeout {lim['max_execution_time']:g} s; {report['runs']} run(s) after {report['warmup']} warm-up",
        "",
        f"{'run':>3} {'outcome':<24} {'execute':>9} {'spawn':>9} {'cpu':>9} {'cpu/wall':>8} "
        f"{'mem peak':>11} {'rss end':>11} {'pids':>4} {'throttled':>9}",
    ]
    for i, s in enumerate(report["samples"], 1):
        cells = [
            f"{i:>3}",
            f"{s['outcome'][:24]:<24}",
            f"{s['execute_s']:>7.3f} s",
            f"{_num(s['spawn_s'], '>7.3f')} s",
            f"{_num(s['cpu_s'], '>7.3f')} s",
            f"{_num(s['cpu_utilisation'], '>8.2f')}",
            f"{_mib(s['memory_peak_bytes']):>11}",
            f"{_mib(s['memory_rss_end_bytes']):>11}",
            f"{_num(s['pids_peak'], '>4')}",
            f"{_num(s['throttled_periods'], '>9')}",
        ]
        notes = ["OOM-killed"] if s["oom_killed"] else []
        if not s["counters_final"]:
            notes.append("counters partial: the container exited early")
        lines.append(" ".join(cells) + "".join(f"  ({n})" for n in notes))
    rec = report["recommendation"]
    lines.append("")
    if rec is None:
        lines.append("no successful run: no recommendation (raise the measurement limits or fix the program)")
        return "\n".join(lines)
    b = rec["basis"]
    method = report["method"]
    how = f" ({', '.join(b['memory_method'])})" if b["memory_method"] else ""
    lines += [
        "recommendation (method: docs/operators.md)",
        f"  memory              {_mib(rec['memory_bytes']):>12}   {method['memory']}; "
        f"peak {_mib(b['memory_peak_bytes'])}{how}",
        f"  cpus                {rec['cpus']:>12g}   {method['cpus']}; "
        f"max {_num(b['cpu_utilisation_max'], '.2f')}",
        f"  pids limit          {rec['pids_limit']:>12}   {method['pids_limit']}; "
        f"max {b['pids_peak'] or '-'} (sampled)",
        f"  max_execution_time  {rec['max_execution_time']:>10g} s   {method['max_execution_time']}; "
        f"p99 {b['execute_p99_s']:.3f} s (includes spawn, p50 {b['spawn_p50_s']:.3f} s)",
        "",
        "serve flags: " + " ".join(rec["serve_flags"]),
    ]
    if b.get("throttled_periods_max"):
        lines.append(
            "note: the program was CPU-throttled even at the measurement quota; "
            "measure again with more --cpus"
        )
    failed = [s for s in report["samples"] if s["outcome"] != "ok"]
    if failed:
        lines.append(f"note: {len(failed)} run(s) did not succeed and were left out of the recommendation")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--program", required=True, metavar="FILE", help="Starlark program to measure (def main(): ...)"
    )
    p.add_argument("--runs", type=int, default=10, metavar="N", help="measured runs (default 10)")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="unmeasured runs first (default 1)")
    p.add_argument(
        "--runtime",
        choices=["process", "docker", "kubernetes"],
        default="docker",
        help="where to measure (default docker: the only runtime whose cgroup counters it reads)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    g = p.add_argument_group("capabilities the program calls (as for serve)")
    g.add_argument(
        "--pack", action="append", default=[], metavar="MODULE:OBJECT", help="capability pack (repeatable)"
    )
    g.add_argument(
        "--pack-option", action="append", default=[], metavar="KEY=VALUE", help="pack setting (repeatable)"
    )
    g.add_argument(
        "--allow-all",
        action="store_true",
        default=None,
        help="allow every call (required with --pack unless Rego)",
    )
    g.add_argument("--rego-policy", action="append", default=[], metavar="FILE", help="Rego v1 module file")
    g.add_argument("--rego-decision", metavar="REF", help="decision reference, e.g. data.codemode.allow")
    g.add_argument(
        "--subject", default="quotas-tune", help="subject id the program runs as (default quotas-tune)"
    )
    m = p.add_argument_group("generous limits for the measurement")
    m.add_argument("--memory", default="1g", metavar="SIZE", help="container memory+swap (default 1g)")
    m.add_argument(
        "--cpus",
        type=float,
        default=float(min(2, os.cpu_count() or 1)),
        metavar="N",
        help="CPU quota (default 2)",
    )
    m.add_argument("--pids", type=int, default=256, metavar="N", help="pids limit (default 256)")
    m.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="max_execution_time (default 60)"
    )
    m.add_argument(
        "--max-execution-steps", type=int, metavar="N", help="interpreter work units (default: the default)"
    )
    m.add_argument(
        "--max-native-calls", type=int, metavar="N", help="native calls per run (default: the default)"
    )
    d = p.add_argument_group("docker")
    d.add_argument("--docker-image", metavar="IMAGE", help="worker image (default codemode-worker:1)")
    d.add_argument("--docker-base-url", metavar="URL", help="Docker Engine endpoint (default: DOCKER_HOST)")
    d.add_argument("--docker-oci-runtime", metavar="NAME", help="OCI runtime such as runsc")


def run(args: argparse.Namespace) -> int:
    """``codemode quotas tune``: 0 with a recommendation from all runs, 1 when a run failed or the
    runtime is unavailable, 2 on bad arguments."""
    if args.runtime != "docker":
        print(
            f"codemode quotas tune: --runtime {args.runtime} cannot be measured: quotas tune reads each "
            "worker's cgroup counters through the Docker Engine (use --runtime docker)",
            file=sys.stderr,
        )
        return 2
    if args.runs <= 0 or args.warmup < 0:
        print("codemode quotas tune: --runs must be positive and --warmup not negative", file=sys.stderr)
        return 2
    if args.timeout <= 0 or args.cpus <= 0 or args.pids <= 0:
        print("codemode quotas tune: --timeout, --cpus and --pids must be positive", file=sys.stderr)
        return 2
    try:
        with open(args.program, encoding="utf-8") as fh:
            source = fh.read()
    except OSError as exc:
        print(f"codemode quotas tune: cannot read {args.program!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(tune(args, source, progress=not args.json))
    except TuneError as exc:
        print(f"codemode quotas tune: {exc}", file=sys.stderr)
        return 2
    except RuntimeUnavailable as exc:
        print(f"codemode quotas tune: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"codemode quotas tune: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print(format_report(report))
    ok = report["recommendation"] is not None and all(s["outcome"] == "ok" for s in report["samples"])
    return 0 if ok else 1
