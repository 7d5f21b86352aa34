"""``codemode quotas tune``: measure a workload to size the workers of a runtime (docs/operators.md).

Method, in short:

- the program runs ``--runs`` times (after ``--warmup`` unmeasured runs), one after another, each
  in a fresh worker of the chosen runtime (``--runtime docker``, ``kubernetes`` or ``process``) with
  *generous* limits (the same flags ``serve`` takes: ``--docker-memory``, ``--kubernetes-memory``,
  ``--process-memory``, ...) and otherwise the runtime's full hardening;
- the worker runs exactly the image's worker code but stays idle after its final frame until the
  host closes its stdin, so its counters can be read after the program finished
  (:mod:`codemode.ops.quota_probes` says what is read on each runtime);
- per run: the execute's wall time (``Server.execute``, which includes starting the worker, as
  ``max_execution_time`` does without a warm pool), the spawn time, peak memory, CPU time, and what
  the runtime limits besides (pids on Docker, address space, open files and threads for processes);
- recommendation (:func:`recommend`, :mod:`codemode.ops.quota_recommend`): memory = peak x 1.5
  rounded up to 16 MiB; CPU = 1.25 x the highest CPU utilisation (CPU time / execute wall time)
  rounded up to 0.25 (and on Kubernetes a request of 1.25 x the median, rounded up to 50m);
  pids/open files/threads twice the peak with a floor; ``max_execution_time`` = the slowest of the
  measured runs and of a burst (``--burst`` executes at once on ``--max-concurrent-executions``
  slots, none finding a warm worker) x 2, rounded up to 0.1 s, at least :data:`DEADLINE_FLOOR`: one
  deadline with or without ``--pool``, as a pool that is not warm (just started, or emptied by a
  burst) starts workers while executes wait; :attr:`Recommendation.assumes` says what the number
  assumes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any

from ..common.command import FAILED, CommandError
from ..common.errors import CodeModeError, client_text
from ..execution.limits import Limits
from ..runtimes.base import RuntimeUnavailable
from .percentile import percentile
from .quota_probes import (
    DockerProbe,
    MeasuringRuntime,
    Probe,
    ProcessProbe,
    Reading,
    ReportProbe,
    hold_command,
    measured,
)
from .quota_recommend import (
    CPU_FACTOR,
    CPU_REQUEST_STEP,
    CPU_STEP,
    DEADLINE_FLOOR,
    MEMORY_FACTOR,
    MEMORY_STEP,
    METHOD,
    OPEN_FILES_FLOOR,
    PIDS_FACTOR,
    PIDS_FLOOR,
    PROCESSES_FLOOR,
    TIME_FACTOR,
    TIME_STEP,
    Burst,
    MiB,
    Recommendation,
    RunSample,
    recommend,
)

__all__ = [
    "CPU_FACTOR",
    "CPU_REQUEST_STEP",
    "CPU_STEP",
    "DEADLINE_FLOOR",
    "DEFAULT_RUNTIME",
    "HOLD_ENTRYPOINT",
    "MEMORY_FACTOR",
    "MEMORY_STEP",
    "METHOD",
    "OPEN_FILES_FLOOR",
    "PIDS_FACTOR",
    "PIDS_FLOOR",
    "PROCESSES_FLOOR",
    "RUNTIME_FLAGS",
    "TIME_FACTOR",
    "TIME_STEP",
    "Burst",
    "MiB",
    "Recommendation",
    "RunSample",
    "TuneError",
    "add_arguments",
    "format_report",
    "recommend",
    "run",
    "tune",
]

#: ``serve``'s default ``max_concurrent_executions``: the slots a burst is measured on by default.
_DEFAULT_SLOTS = Limits().max_concurrent_executions

#: The runtime measured when ``--runtime`` is not given: the one ``serve`` and ``bench`` default to.
DEFAULT_RUNTIME = "process"

#: The worker command of the Docker and Kubernetes measurements (the image's own python3).
HOLD_ENTRYPOINT = tuple(hold_command())

#: The measurement limits of each runtime: settings of the same name as ``serve``'s, with their
#: generous defaults. A flag of another runtime than ``--runtime`` is refused.
RUNTIME_FLAGS: dict[str, dict[str, Any]] = {
    "docker": {
        "docker_memory": "1g",
        "docker_cpus": float(min(2, os.cpu_count() or 1)),
        "docker_max_processes": 256,
    },
    "kubernetes": {"kubernetes_memory": "1Gi", "kubernetes_cpu": "2", "kubernetes_cpu_request": "100m"},
    "process": {
        "process_memory": "4g",
        "process_cpu_seconds": 120.0,
        "process_open_files": 256,
        "process_max_processes": 64,
    },
}
#: Where the workers come from (not measurement limits, passed through as given).
_PLACEMENT = {
    "docker": ("docker_image", "docker_base_url", "docker_oci_runtime"),
    "kubernetes": (
        "kubernetes_namespace",
        "kubernetes_image",
        "kubernetes_kubeconfig",
        "kubernetes_context",
        "kubernetes_runtime_class",
    ),
    "process": (),
}


def _sample_from(
    outcome: str, detail: str, execute_s: float, sandbox: Any, limit_bytes: int | None
) -> RunSample:
    if sandbox is None:
        return RunSample(outcome, execute_s, detail)
    reading: Reading = sandbox.reading()
    sample = RunSample(outcome, execute_s, detail, sandbox.spawn_s, **asdict(reading))
    if sandbox.exit is not None and sandbox.exit.oom_killed:
        sample.oom_killed = True
        sample.memory_peak_bytes = limit_bytes
        sample.memory_method = "OOM-killed at the limit"
    return sample


# --------------------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------------------


class TuneError(CommandError):
    """A problem with the arguments or the environment (exit 2)."""


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    """The measurement limits of ``args.runtime`` (flags over the generous defaults); a flag of
    another runtime is an error."""
    for other, names in RUNTIME_FLAGS.items():
        if other == args.runtime:
            continue
        for name in (*names, *_PLACEMENT[other]):
            if getattr(args, name, None) is not None:
                flag = "--" + name.replace("_", "-")
                raise TuneError(f"{flag} applies to --runtime {other}, not --runtime {args.runtime}")
    limits = {name: getattr(args, name, None) for name in RUNTIME_FLAGS[args.runtime]}
    return {
        name: default if limits[name] is None else limits[name]
        for name, default in RUNTIME_FLAGS[args.runtime].items()
    }


def _settings(args: argparse.Namespace, limits: dict[str, Any], slots: int = 1) -> Any:
    """The measurement's settings through the one settings model (packs, authorizer, runtime);
    ``slots``: ``max_concurrent_executions`` (1 for the measured runs, one after another)."""
    from ..startup.config import ConfigError, load_settings

    overrides: dict[str, Any] = {
        "packs": list(args.pack),
        "pack_options": list(args.pack_option),
        "allow_all": bool(args.allow_all) or not args.pack,  # nothing to call without a pack
        "rego_policy": list(args.rego_policy),
        "rego_decision": args.rego_decision,
        "max_execution_time": args.max_execution_time,
        "max_concurrent_executions": slots,
        "subject_quota": 0,
        "runtime": args.runtime,
        **limits,
    }
    for name in _PLACEMENT[args.runtime]:
        overrides[name] = getattr(args, name, None)
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


def _measuring_runtime(settings: Any) -> tuple[MeasuringRuntime, int | None, dict[str, Any]]:
    """The runtime of ``settings`` with the hold entry, its probe, the memory limit, and where the
    workers ran (for the report)."""
    from ..startup.bootstrap import build_runtime

    runtime = settings.runtime
    inner: Any
    if runtime == "process":
        inner = build_runtime(settings, worker_command=hold_command(sys.executable))
        where: dict[str, Any] = {"python": inner.python}

        def probe_for(sandbox: Any) -> Probe:
            return ProcessProbe(sandbox.pid)

        return MeasuringRuntime(inner, probe_for), None, where
    inner = build_runtime(settings, worker_command=list(HOLD_ENTRYPOINT), cleanup_orphans="none")
    if runtime == "kubernetes":
        options = inner.options
        where = {
            "image": options.image,
            "namespace": options.namespace,
            "runtime_class": options.runtime_class,
        }
        return MeasuringRuntime(inner, ReportProbe), None, where
    docker_options = inner.options
    where = {"image": docker_options.image, "oci_runtime": docker_options.oci_runtime}
    api: list[Any] = []

    def docker_probe(sandbox: Any) -> Probe:
        if not api:
            import docker

            url = docker_options.base_url
            base = {"base_url": url} if url else docker.utils.kwargs_from_env()
            base.setdefault("base_url", "unix:///var/run/docker.sock")
            api.append(docker.APIClient(version="auto", timeout=60, max_pool_size=16, **base))
        return DockerProbe(api[0], sandbox.container_id)

    measuring = MeasuringRuntime(inner, docker_probe)
    measuring.closers.append(lambda: [a.close() for a in api])
    return measuring, docker_options.memory, where


async def tune(args: argparse.Namespace, source: str, progress: bool = True) -> dict[str, Any]:
    """Run the measurement.

    Args:
        args: the parsed flags.
        source: the program.
        progress: print a line per run to stderr.

    Returns:
        The JSON report (runs, recommendation, method).

    Raises:
        TuneError: bad flags, settings or runtime configuration.
    """
    from .. import authz
    from ..startup.bootstrap import build_server
    from ..startup.config import ConfigError

    limits = _limits(args)
    settings = _settings(args, limits)
    try:
        runtime, limit_bytes, where = _measuring_runtime(settings)
    except (ConfigError, ValueError) as exc:
        raise TuneError(f"{args.runtime} runtime: {exc}") from None
    try:
        server = build_server(settings, runtime=runtime)
    except ConfigError as exc:
        await runtime.aclose()
        raise TuneError(str(exc)) from None
    subject = authz.Subject(args.subject)
    samples: list[RunSample] = []
    try:
        # A precise RuntimeUnavailable first: daemon or cluster unreachable, image missing.
        await runtime.check()
        for i in range(args.warmup + args.runs):
            before = len(runtime.sandboxes)
            t0 = time.perf_counter()
            try:
                await server.execute(source, subject=subject)
                outcome, detail = "ok", ""
            except CodeModeError as exc:
                outcome, detail = str(exc), client_text(exc)  # what the execute's client is told
            elapsed = time.perf_counter() - t0
            sandbox = measured(runtime.sandboxes, before)
            if sandbox is not None:
                await asyncio.wait_for(sandbox.destroyed.wait(), settings.max_execution_time + 120)
            if i < args.warmup:
                if progress:
                    print(f"warm-up run: {detail or outcome} in {elapsed:.3f} s", file=sys.stderr, flush=True)
                continue
            samples.append(_sample_from(outcome, detail, elapsed, sandbox, limit_bytes))
            if progress:
                print(
                    f"run {len(samples)}/{args.runs}: {detail or outcome} in {elapsed:.3f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        await server.aclose()
        for close in runtime.closers:
            with contextlib.suppress(Exception):
                close()
    burst = await _burst(args, limits, source, progress) if args.burst and _any_ok(samples) else None
    rec = recommend(samples, args.runtime, burst)
    return {
        "program": args.program,
        "runtime": args.runtime,
        "runs": args.runs,
        "warmup": args.warmup,
        **where,
        "measurement_limits": {**limits, "max_execution_time": settings.max_execution_time},
        "samples": [asdict(s) | {"cpu_utilisation": s.cpu_utilisation} for s in samples],
        "burst": None if burst is None else asdict(burst),
        "recommendation": None
        if rec is None
        else {
            "settings": rec.settings,
            "max_execution_time": rec.max_execution_time,
            "serve_flags": rec.serve_flags(),
            "basis": rec.basis,
            "assumes": rec.assumes,
        },
        "method": METHOD[args.runtime] | METHOD["common"],
    }


def _any_ok(samples: list[RunSample]) -> bool:
    """Whether any measured run succeeded (a burst of a failing program measures nothing)."""
    return any(s.outcome == "ok" for s in samples)


async def _burst(args: argparse.Namespace, limits: dict[str, Any], source: str, progress: bool) -> Burst:
    """``--burst`` executes at once, each as a subject of its own, on a server of
    ``--max-concurrent-executions`` slots whose runtime is the one ``serve`` builds (no hold, no
    probe, no warm pool: every execute waits for its slot, then starts its worker)."""
    from .. import authz
    from ..startup.bootstrap import build_runtime, build_server
    from ..startup.config import ConfigError

    settings = _settings(args, limits, slots=args.max_concurrent_executions)
    extra = {} if args.runtime == "process" else {"cleanup_orphans": "none"}
    try:
        runtime = build_runtime(settings, **extra)
        server = build_server(settings, runtime=runtime)
    except (ConfigError, ValueError) as exc:
        raise TuneError(f"{args.runtime} runtime: {exc}") from None
    outcomes: dict[str, int] = {}
    seconds: list[float] = []

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            await server.execute(source, subject=authz.Subject(f"{args.subject}-burst-{i}"))
            outcome = "ok"
            seconds.append(time.perf_counter() - t0)
        except CodeModeError as exc:
            outcome = client_text(exc)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    async with server:
        await server.start()
        await asyncio.gather(*(one(i) for i in range(args.burst)))
    burst = Burst(args.burst, args.max_concurrent_executions, sorted(seconds), outcomes)
    if progress:
        slowest = f", slowest {max(seconds):.3f} s" if seconds else ""
        print(
            f"burst: {burst.executes} executes at once on {burst.slots} slots, no warm worker: "
            + ", ".join(f"{n} {what}" for what, n in outcomes.items())
            + slowest,
            file=sys.stderr,
            flush=True,
        )
    return burst


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MiB:.1f} MiB"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _where(report: dict[str, Any]) -> str:
    if report["runtime"] == "process":
        return f"process workers of {report['python']}"
    extra = report.get("oci_runtime") or report.get("runtime_class")
    place = f" in namespace {report['namespace']}" if report.get("namespace") else ""
    return f"{report['runtime']} workers of {report['image']}{place}" + (f" ({extra})" if extra else "")


def _limit_text(limits: dict[str, Any]) -> str:
    return ", ".join(
        f"{'--' + k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"{'--' + k.replace('_', '-')} {v}"
        for k, v in limits.items()
    )


_COLUMNS = {  # runtime -> the columns beyond run, outcome, execute, spawn, cpu, cpu/wall, memory peak
    "docker": (
        ("rss end", "memory_rss_end_bytes", "mib"),
        ("pids", "pids_peak", "int"),
        ("throttled", "throttled_periods", "int"),
    ),
    "kubernetes": (("threads", "threads_peak", "int"),),
    "process": (
        ("addr space", "address_space_peak_bytes", "mib"),
        ("rss end", "memory_rss_end_bytes", "mib"),
        ("fds", "fds_peak", "int"),
        ("threads", "threads_peak", "int"),
    ),
}


def _cell(value: Any, kind: str, width: int) -> str:
    text = _mib(value) if kind == "mib" else ("-" if value is None else str(value))
    return f"{text:>{width}}"


def format_report(report: dict[str, Any]) -> str:
    """The report as text: a table of the runs, then the recommendation and its method.

    Args:
        report: what :func:`tune` returned.

    Returns:
        The text.
    """
    runtime = report["runtime"]
    columns = _COLUMNS[runtime]
    lines = [
        f"codemode quotas tune: {report['program']} on {_where(report)}",
        f"measured with {_limit_text(report['measurement_limits'])}; "
        f"{report['runs']} run(s) after {report['warmup']} warm-up",
        "",
        f"{'run':>3} {'outcome':<24} {'execute':>9} {'spawn':>9} {'cpu':>9} {'cpu/wall':>8} {'mem peak':>11}"
        + "".join(f" {title:>11}" for title, _, _ in columns),
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
            *(_cell(s[key], kind, 11) for _, key, kind in columns),
        ]
        notes = ["OOM-killed"] if s["oom_killed"] else []
        if not s["counters_final"]:
            notes.append("counters partial: the worker exited early")
        lines.append(" ".join(cells) + "".join(f"  ({n})" for n in notes))
        if s.get("detail") and s["detail"] != s["outcome"]:
            lines.append(f"{'':>3} {s['detail']}")  # what the execute's client was told, in full
    burst = report.get("burst")
    if burst is not None:
        times = burst["seconds"]
        spread = f": p50 {percentile(times, 50):.3f} s, slowest {max(times):.3f} s" if times else ""
        lines += [
            "",
            f"burst: {burst['executes']} executes at once on {burst['slots']} slots, no warm worker, "
            f"{burst['outcomes'].get('ok', 0)} ok{spread}",
        ]
    rec = report["recommendation"]
    lines.append("")
    if rec is None:
        lines.append("no successful run: no recommendation (raise the measurement limits or fix the program)")
        return "\n".join(lines)
    b = rec["basis"]
    method = report["method"]
    how = f" ({', '.join(b['memory_method'])})" if b["memory_method"] else ""
    lines.append("recommendation (method: docs/operators.md)")
    for name, value in rec["settings"].items():
        lines.append(f"  {name:<26}{value!s:>10}   {method[name]}")
    slowest = max(b["execute_max_s"], b.get("burst_slowest_s") or 0.0)
    source = "of the burst" if b.get("burst_slowest_s", 0.0) >= b["execute_max_s"] else "of the runs"
    lines += [
        f"  {'max_execution_time':<26}{rec['max_execution_time']:>8g} s   with or without --pool: "
        f"slowest execute {source} {slowest:.3f} s x {TIME_FACTOR:g}, at least {DEADLINE_FLOOR:g} s "
        f"(a worker start included, p50 {b['spawn_p50_s']:.3f} s)",
        f"  memory peak {_mib(b['memory_peak_bytes'])}{how}; CPU utilisation max "
        f"{_num(b['cpu_utilisation_max'], '.2f')}",
        "  assumes:",
        *(f"  - {line}" for line in rec["assumes"]),
        "",
        "serve flags: " + " ".join(rec["serve_flags"]),
    ]
    if b.get("throttled_periods_max"):
        lines.append(
            "note: the program was CPU-throttled even at the measurement quota; measure again with more CPU"
        )
    failed = [s for s in report["samples"] if s["outcome"] != "ok"]
    if failed:
        lines.append(f"note: {len(failed)} run(s) did not succeed and were left out of the recommendation")
    burst = report.get("burst")
    if burst is not None:
        lost = {what: n for what, n in burst["outcomes"].items() if what != "ok"}
        if lost:
            lines.append(
                "note: in the burst, "
                + ", ".join(f"{n} x {what}" for what, n in lost.items())
                + " (left out of the recommendation; with the measurement's generous deadline this is "
                "the runtime's capacity, not the deadline: see the host log)"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``codemode quotas tune``'s flags.

    Args:
        p: the subcommand's parser.
    """
    p.add_argument(
        "--program", required=True, metavar="FILE", help="Starlark program to measure (def main(): ...)"
    )
    p.add_argument("--runs", type=int, default=10, metavar="N", help="measured runs (default 10)")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="unmeasured runs first (default 1)")
    p.add_argument(
        "--runtime",
        choices=["process", "docker", "kubernetes"],
        default=None,
        help=f"where to measure and what to size (default {DEFAULT_RUNTIME}, as for serve and bench)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument(
        "--burst",
        type=int,
        default=None,
        metavar="N",
        help="after the runs, N executes at once with no warm worker, counted in the deadline "
        "(default: --max-concurrent-executions; 0: none)",
    )
    p.add_argument(
        "--max-concurrent-executions",
        type=int,
        default=_DEFAULT_SLOTS,
        metavar="N",
        help=f"the slots of the server to size, for the burst (default {_DEFAULT_SLOTS}, as for serve)",
    )
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
    m = p.add_argument_group("generous limits for the measurement (the serve flags it recommends)")
    m.add_argument(
        "--max-execution-time",
        "--timeout",
        dest="max_execution_time",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="execution deadline of each run (default 60)",
    )
    m.add_argument(
        "--max-execution-steps", type=int, metavar="N", help="interpreter work units (default: the default)"
    )
    m.add_argument(
        "--max-native-calls", type=int, metavar="N", help="native calls per run (default: the default)"
    )
    d = p.add_argument_group("docker (--runtime docker)")
    d.add_argument(
        "--docker-memory", "--memory", dest="docker_memory", metavar="SIZE", help="memory+swap (default 1g)"
    )
    d.add_argument(
        "--docker-cpus", "--cpus", dest="docker_cpus", type=float, metavar="N", help="CPU quota (default 2)"
    )
    d.add_argument(
        "--docker-max-processes",
        "--pids",
        dest="docker_max_processes",
        type=int,
        metavar="N",
        help="processes and threads, the pids limit (default 256)",
    )
    d.add_argument("--docker-image", metavar="IMAGE", help="worker image (default codemode-worker:1)")
    d.add_argument("--docker-base-url", metavar="URL", help="Docker Engine endpoint (default: DOCKER_HOST)")
    d.add_argument("--docker-oci-runtime", metavar="NAME", help="OCI runtime such as runsc")
    k = p.add_argument_group("kubernetes (--runtime kubernetes)")
    k.add_argument("--kubernetes-memory", metavar="QUANTITY", help="worker pod memory (default 1Gi)")
    k.add_argument("--kubernetes-cpu", metavar="QUANTITY", help="worker pod CPU limit (default 2)")
    k.add_argument(
        "--kubernetes-cpu-request", metavar="QUANTITY", help="worker pod CPU request (default 100m)"
    )
    k.add_argument(
        "--kubernetes-namespace", metavar="NS", help="worker pod namespace (default codemode-workers)"
    )
    k.add_argument("--kubernetes-image", metavar="IMAGE", help="worker pod image")
    k.add_argument("--kubernetes-kubeconfig", metavar="FILE", help="kubeconfig (default: $KUBECONFIG)")
    k.add_argument("--kubernetes-context", metavar="NAME", help="kubeconfig context")
    k.add_argument("--kubernetes-runtime-class", metavar="NAME", help="RuntimeClass of the worker pods")
    r = p.add_argument_group("process (--runtime process)")
    r.add_argument("--process-memory", metavar="SIZE", help="address space, RLIMIT_AS (default 4g)")
    r.add_argument("--process-cpu-seconds", type=float, metavar="N", help="RLIMIT_CPU (default 120)")
    r.add_argument("--process-open-files", type=int, metavar="N", help="RLIMIT_NOFILE (default 256)")
    r.add_argument("--process-max-processes", type=int, metavar="N", help="RLIMIT_NPROC (default 64)")


def run(args: argparse.Namespace) -> int:
    """``codemode quotas tune``.

    Args:
        args: the parsed flags.

    Returns:
        The exit status: 0 with a recommendation from all runs, 1 when a run failed.

    Raises:
        CommandError: status 2 on bad arguments, 1 when the runtime is unavailable or fails.
    """
    if args.runtime is None:
        args.runtime = DEFAULT_RUNTIME
        print(
            f"codemode quotas tune: measuring --runtime {DEFAULT_RUNTIME} (the default, as for serve and "
            "bench); size the workers of another runtime with --runtime docker or --runtime kubernetes",
            file=sys.stderr,
        )
    if args.runs <= 0 or args.warmup < 0:
        raise CommandError("--runs must be positive and --warmup not negative")
    if args.burst is None:
        args.burst = args.max_concurrent_executions
    if args.burst < 0 or args.max_concurrent_executions < 1:
        raise CommandError("--burst must not be negative and --max-concurrent-executions must be at least 1")
    positive = ("max_execution_time", "docker_cpus", "docker_max_processes", "process_cpu_seconds")
    bad = [
        n
        for n in (*positive, "process_open_files", "process_max_processes")
        if (v := getattr(args, n)) is not None and v <= 0
    ]
    if bad:
        raise CommandError(", ".join("--" + n.replace("_", "-") for n in bad) + " must be positive")
    _limits(args)
    try:
        with open(args.program, encoding="utf-8") as fh:
            source = fh.read()
    except OSError as exc:
        raise CommandError(f"cannot read {args.program!r}: {exc.strerror or exc}") from None
    try:
        report = asyncio.run(tune(args, source, progress=not args.json))
    except CommandError:  # a TuneError: bad flags, settings or runtime configuration
        raise
    except RuntimeUnavailable as exc:
        raise CommandError(str(exc), FAILED) from None
    except Exception as exc:
        raise CommandError(f"failed: {type(exc).__name__}: {exc}", FAILED) from None
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print(format_report(report))
    burst = report["burst"]
    ok = report["recommendation"] is not None and all(s["outcome"] == "ok" for s in report["samples"])
    ok = ok and (burst is None or set(burst["outcomes"]) <= {"ok"})
    return 0 if ok else 1
