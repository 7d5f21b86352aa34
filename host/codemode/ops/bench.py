"""``codemode bench``: how fast does this machine run executes? (docs/operators.md)

A user-facing cut of ``tests/benchmarks/bench_execute.py`` (which imports its measuring helpers
from here): on the chosen runtime it times

- a trivial execute, **cold** (no pool: every execute starts its own worker),
- a trivial execute, **warm** (``WarmPool``: a started worker is waiting; the pool refills between
  samples, which are not timed),
- one native call, warm (the program calls one echo capability once; the host rebinds, authorizes
  with ``allow_all()`` and dispatches it), and 100 native calls, warm,
- the transport floor: probe → probe_ack echoes through the runtime's channel to a fresh worker,

- sustained load: ``--load`` trivial executes from ``--clients`` subjects in flight at once (each
  sends its next execute when the last one returned), over a ``WarmPool`` of ``--pool``: executes
  per second, p50/p99 latency, and the CPU per execute of this process and its children (the
  process runtime's workers; not a container engine's or a cluster's side, which may be elsewhere),

and prints p50/p99 of each, then the cost of one native call ((100 calls − one call) / 99) and its
ratio to the floor. With ``--reuse N`` (Docker, Kubernetes) it adds the reuse mode
(docs/reference/runtimes.md): a trivial execute in a reused sandbox of the same subject (a fresh,
scrubbed worker process; the scrub is part of each sample), and the same sustained load over
reused sandboxes (``--clients`` idle ones). It registers only its own echo capability: no pack is
loaded and nothing outside the process and the worker is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from codemode_worker import PROTOCOL_VERSION
from codemode_worker.protocol import encode_frame

from .. import authz
from ..catalog.capability import Capability
from ..common.command import FAILED, CommandError
from ..common.errors import CodeModeError, ResourceLimit
from ..execution.builder import Builder
from ..execution.context import CallContext
from ..execution.frames import HostFrameDecoder
from ..execution.limits import Limits
from ..execution.observe import Observer
from ..execution.server import Server
from ..runtimes.base import Runtime, Sandbox
from .percentile import percentile

__all__ = [
    "HUNDRED",
    "ONE_CALL",
    "SUBJECT",
    "TRIVIAL",
    "EchoFloor",
    "EchoIn",
    "EchoOut",
    "add_arguments",
    "aecho",
    "build_server",
    "echo",
    "line",
    "run",
    "run_bench",
    "timed",
]

#: The one subject every timed execute runs for.
SUBJECT = authz.Subject("bench")
#: The programs timed: a trivial one, one native call, 100 native calls.
TRIVIAL = "def main():\n    return 1\n"
ONE_CALL = "def main():\n    return util.echo(value='x')['value']\n"
HUNDRED = (
    "def main():\n    n = 0\n    for i in range(100):\n"
    "        n += len(util.echo(value='x')['value'])\n    return n\n"
)


@dataclass
class EchoIn:
    """The echo capability's arguments.

    Attributes:
        value: the text to echo.
    """

    value: str


@dataclass
class EchoOut:
    """The echo capability's result.

    Attributes:
        value: the text echoed.
    """

    value: str


def echo(ctx: CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    """``util.secho``: the sync echo handler.

    Args:
        ctx: the call's context (unused).
        subject: the caller (unused).
        args: the text.

    Returns:
        The same text.
    """
    return EchoOut(args.value)


async def aecho(ctx: CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    """``util.echo``: the async echo handler.

    Args:
        ctx: the call's context (unused).
        subject: the caller (unused).
        args: the text.

    Returns:
        The same text.
    """
    return EchoOut(args.value)


def build_server(
    runtime: Runtime,
    authorizer: authz.Authorizer | None = None,
    observer: Observer | None = None,
    limits: Limits | None = None,
) -> Server:
    """A server with ``util.echo`` (async) and ``util.secho`` (sync).

    Args:
        runtime: where workers run.
        authorizer: the authorizer (default: ``allow_all()``).
        observer: told about executes and calls, if given.
        limits: the execution limits (default: ``Limits()``).

    Returns:
        The built server (not started).
    """
    b = Builder(authorizer=authorizer or authz.allow_all(), runtime=runtime, observer=observer, limits=limits)
    b.register(Capability(name="util.echo", summary="Echo.", handler=aecho))
    b.register(Capability(name="util.secho", summary="Echo (sync).", handler=echo))
    return b.build()


def line(label: str, xs: list[float], *, quiet: bool = False) -> dict[str, float]:
    """Print (unless ``quiet``) and return p50/p99 of ``xs`` seconds, in milliseconds.

    Args:
        label: the series' name on the printed line.
        xs: the samples, in seconds.
        quiet: print nothing.

    Returns:
        ``{"p50": ms, "p99": ms}``.
    """
    p50, p99 = percentile(xs, 50) * 1e3, percentile(xs, 99) * 1e3
    if not quiet:
        print(f"{label:<38} n={len(xs):<5} p50={p50:8.3f} ms  p99={p99:8.3f} ms", flush=True)
    return {"p50": p50, "p99": p99}


async def timed(n: int, fn: Callable[[], Awaitable[Any]]) -> list[float]:
    """Wall time of ``n`` sequential awaits of ``fn()``, in seconds.

    Args:
        n: how many.
        fn: what to await.

    Returns:
        One time per await.
    """
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


_PROBE = encode_frame({"k": "probe", "v": PROTOCOL_VERSION})


class EchoFloor:
    """A runtime wrapper that measures the transport floor on each worker before handing it out.

    ``prepare()`` spawns one worker from the wrapped runtime and times ``rounds`` probe → probe_ack
    round trips on it: an echo through the very channel (pipes, the Docker attach stream, the
    Kubernetes attach websocket) and the same two processes the next execute uses, with the same
    framing on both sides (the worker reads and answers a probe exactly as it reads a
    ``native_result`` and sends a ``native_call``). ``spawn()`` then returns that worker, so an
    execute timed after ``prepare()`` is a warm execute on the worker whose floor was just measured.

    Args:
        runtime: the runtime wrapped.
        rounds: probe round trips per worker.
    """

    def __init__(self, runtime: Runtime, rounds: int = 50) -> None:
        self.runtime = runtime
        self.rounds = rounds
        self.floors: list[float] = []
        self._ready: Sandbox | None = None

    @property
    def name(self) -> str:
        return self.runtime.name

    async def start(self) -> None:
        await self.runtime.start()

    async def check(self) -> None:
        await self.runtime.check()

    async def prepare(self) -> list[float]:
        """Spawn the next worker and time its echoes.

        Returns:
            Its ``rounds`` echo times, in seconds.

        Raises:
            RuntimeError: the worker ended during the echo.
        """
        if self._ready is not None:
            await self._ready.destroy()
        sandbox = await self.runtime.spawn()
        self._ready = sandbox
        decoder = HostFrameDecoder(4096)  # the execute pipeline's own reader
        out = []
        for _ in range(self.rounds):
            t0 = time.perf_counter()
            await sandbox.write(_PROBE)
            while True:
                data = await sandbox.read(4096)
                if not data:
                    raise RuntimeError(f"worker {sandbox.worker_id} ended during the echo")
                if decoder.feed(data):
                    break
            out.append(time.perf_counter() - t0)
        self.floors += out
        return out

    async def spawn(self) -> Sandbox:
        if self._ready is None:
            await self.prepare()
        sandbox, self._ready = self._ready, None
        assert sandbox is not None
        return sandbox

    async def aclose(self) -> None:
        if self._ready is not None:
            await self._ready.destroy()
            self._ready = None
        await self.runtime.aclose()


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``codemode bench``'s flags.

    Args:
        p: the subcommand's parser.
    """
    p.add_argument(
        "--runtime",
        choices=["process", "docker", "kubernetes"],
        default="process",
        help="where workers run (default: process)",
    )
    p.add_argument(
        "--pool", type=int, default=4, metavar="N", help="warm pool size for the warm series (default 4)"
    )
    p.add_argument("--n", type=int, default=30, metavar="N", help="samples per series (default 30)")
    p.add_argument(
        "--reuse",
        type=int,
        default=0,
        metavar="N",
        help="also measure the reuse mode, N executes per sandbox (docker, kubernetes; default 0: skip)",
    )
    p.add_argument(
        "--clients",
        type=int,
        default=20,
        metavar="N",
        help="subjects in flight at once in the sustained-load series (default 20; 0: skip it)",
    )
    p.add_argument(
        "--load",
        type=int,
        default=200,
        metavar="N",
        help="executes of the sustained-load series (default 200)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="max_execution_time of the sustained-load series (default: chosen from the measured cold"
        " start, see docs/operators.md)",
    )
    p.add_argument("--docker-image", metavar="IMAGE", help="worker image (default codemode-worker:1)")
    p.add_argument("--docker-base-url", metavar="URL", help="Docker Engine endpoint (default: DOCKER_HOST)")
    p.add_argument("--docker-oci-runtime", metavar="NAME", help="OCI runtime such as runsc")
    p.add_argument(
        "--kubernetes-namespace", metavar="NS", help="worker pod namespace (default codemode-workers)"
    )
    p.add_argument("--kubernetes-image", metavar="IMAGE", help="worker pod image")
    p.add_argument("--kubernetes-kubeconfig", metavar="FILE", help="kubeconfig (default: $KUBECONFIG)")
    p.add_argument("--kubernetes-context", metavar="NAME", help="kubeconfig context")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")


_RUNTIME_FLAGS = (
    "docker_image",
    "docker_base_url",
    "docker_oci_runtime",
    "kubernetes_namespace",
    "kubernetes_image",
    "kubernetes_kubeconfig",
    "kubernetes_context",
)


def _make_runtime(args: argparse.Namespace) -> Runtime:
    """The runtime through the one settings model (flags on top of ``CODEMODE_*``)."""
    from ..startup.bootstrap import build_runtime
    from ..startup.config import load_settings

    overrides: dict[str, Any] = {"runtime": args.runtime, "allow_all": True, "rego_policy": [], "pool": 0}
    for name in _RUNTIME_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    return build_runtime(load_settings(**overrides))


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the series (and the reuse series with ``--reuse``), printing lines unless ``args.json``.

    Args:
        args: the parsed flags.

    Returns:
        The JSON report.
    """
    from ..runtimes.pool import WarmPool

    quiet = bool(args.json)
    n = args.n
    report: dict[str, Any] = {
        "runtime": args.runtime,
        "pool": args.pool,
        "n": n,
        "python": platform.python_version(),
        "unit": "ms",
        "series": {},
    }
    if not quiet:
        print(
            f"codemode bench: runtime {args.runtime}, pool {args.pool}, n={n}, "
            f"python {platform.python_version()}",
            flush=True,
        )

    runtime = _make_runtime(args)
    await runtime.check()
    cold_server = build_server(runtime)
    try:
        await cold_server.execute(TRIVIAL, subject=SUBJECT)  # warm caches; not measured
        cold = await timed(n, lambda: cold_server.execute(TRIVIAL, subject=SUBJECT))
        report["series"]["trivial_cold"] = line("trivial execute, cold (no pool)", cold, quiet=quiet)
    finally:
        await cold_server.aclose()

    if args.pool <= 0:
        if not quiet:
            print("(--pool 0: warm series skipped)", flush=True)
        return report

    pool = WarmPool(_make_runtime(args), args.pool)
    server = build_server(pool)
    await server.start()
    try:

        async def series(source: str) -> list[float]:
            out = []
            for _ in range(n):
                await pool.wait_warm(120)  # refills are not part of the measurement
                t0 = time.perf_counter()
                await server.execute(source, subject=SUBJECT)
                out.append(time.perf_counter() - t0)
            return out

        report["series"]["trivial_warm"] = line(
            f"trivial execute, warm (pool {args.pool})", await series(TRIVIAL), quiet=quiet
        )
        one = report["series"]["one_call_warm"] = line(
            f"one native call, warm (pool {args.pool})", await series(ONE_CALL), quiet=quiet
        )
        hundred = report["series"]["hundred_calls_warm"] = line(
            f"100 native calls, warm (pool {args.pool})", await series(HUNDRED), quiet=quiet
        )
    finally:
        await server.aclose()

    # The transport floor: probe echoes through the same channel to a few fresh workers.
    floor = EchoFloor(_make_runtime(args), rounds=50)
    try:
        echoes: list[float] = []
        for _ in range(3):
            echoes += await floor.prepare()
    finally:
        await floor.aclose()
    if args.clients > 0:
        limits = Limits(max_execution_time=await _load_deadline(args, quiet))
        fresh = WarmPool(_make_runtime(args), args.pool)
        server = build_server(fresh, limits=limits)
        await server.start()
        try:
            report["load"] = await _warm_load(
                fresh, server, f"sustained, {args.clients} in flight (pool {args.pool})", args, quiet
            )
        finally:
            await server.aclose()
    if args.reuse > 0:
        report["reuse"] = await _reuse_series(args, quiet)
    per_call_us = (hundred["p50"] - one["p50"]) / 99 * 1e3
    floor_us = statistics.median(echoes) * 1e6
    report["native_call"] = {
        "per_call_us": round(per_call_us, 1),
        "floor_us": round(floor_us, 1),
        "ratio": round(per_call_us / floor_us, 2),
    }
    if not quiet:
        print(
            f"{'transport floor (probe echo)':<38} n={len(echoes):<5} p50={floor_us / 1e3:8.3f} ms",
            flush=True,
        )
        print(
            f"{'per native call (100 - 1) / 99':<38} {'':7} p50={per_call_us / 1e3:8.3f} ms  "
            f"({per_call_us / floor_us:.1f}x the floor)",
            flush=True,
        )
    return report


async def _start_rate(args: argparse.Namespace, slots: int) -> float:
    """Workers started and destroyed per second when ``slots`` of them run at once (all started,
    then all destroyed, both timed: each execute of a closed loop over an empty pool costs a start
    and a removal on the same machine). A start that fails counts as not started."""
    runtime = _make_runtime(args)
    await runtime.start()
    try:
        t0 = time.perf_counter()
        started = await asyncio.gather(*(runtime.spawn() for _ in range(slots)), return_exceptions=True)
        boxes = [s for s in started if not isinstance(s, BaseException)]
        await asyncio.gather(*(box.destroy() for box in boxes), return_exceptions=True)
        elapsed = time.perf_counter() - t0
    finally:
        await runtime.aclose()
    return max(len(boxes), 1) / elapsed


async def _load_deadline(args: argparse.Namespace, quiet: bool) -> float:
    """The sustained series' deadline (``max_execution_time``): ``--deadline``, else the default
    unless a closed loop of ``--clients`` over cold starts would pass it: by Little's law an execute
    then waits ``clients / rate`` on average, with ``rate`` the workers started and destroyed per
    second with a slot's worth at once (``_start_rate``), so ``max(default, 2 × clients / rate)``
    (printed with its reason).

    On Kubernetes on a loaded 2-core machine the series ran at 1.3 executes/s (one pod alone starts
    in 1.2-1.6 s), so 20 clients wait about 15 s, and the default 5 s ended 188 of 200 executes in
    ``concurrency``: the series measured the deadline, not the runtime.
    """
    default = Limits()
    slots = default.max_concurrent_executions
    if args.deadline is not None:
        chosen, why = float(args.deadline), "--deadline"
    else:
        rate = await _start_rate(args, slots)
        chosen = round(max(default.max_execution_time, 2 * args.clients / rate), 1)
        why = (
            f"max(default {default.max_execution_time:g} s, 2 x {args.clients} clients / {rate:.2f}"
            f" starts+removals/s with {slots} at once); --deadline sets it"
        )
    if not quiet:
        print(f"{'sustained series deadline':<38} {chosen:g} s  ({why})", flush=True)
    return chosen


def _tree_cpu() -> float:
    """CPU seconds of this process and its live descendants, with what each has reaped."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in (me, *me.children(recursive=True)):
        try:
            t = proc.cpu_times()
        except psutil.Error:  # gone meanwhile: its parent counts it once reaped
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


async def _load(server: Server, n: int, subjects: int) -> dict[str, Any]:
    """``n`` trivial executes from ``subjects`` subjects in flight at once (closed loop): executes
    per second, p50/p99 in ms (of the executes that returned), CPU ms per execute of this process
    and its children, and how many executes ended in each limit (``limits``: kind -> count) or
    failed otherwise (``failed``: error class -> count). An execute that ends in a limit is part of
    the result, not the end of the series."""
    latencies: list[float] = []
    limits: dict[str, int] = {}
    failed: dict[str, int] = {}
    each = max(1, n // subjects)

    async def one_subject(i: int) -> None:
        subject = authz.Subject(f"bench-{i}")
        for _ in range(each):
            t0 = time.perf_counter()
            try:
                await server.execute(TRIVIAL, subject=subject)
            except ResourceLimit as exc:
                kind = exc.kind or "unnamed"
                limits[kind] = limits.get(kind, 0) + 1
                continue
            except CodeModeError as exc:
                failed[type(exc).__name__] = failed.get(type(exc).__name__, 0) + 1
                continue
            latencies.append(time.perf_counter() - t0)

    cpu0, t0 = _tree_cpu(), time.perf_counter()
    await asyncio.gather(*(one_subject(i) for i in range(subjects)))
    wall, cpu = time.perf_counter() - t0, _tree_cpu() - cpu0
    done = len(latencies)
    ended = done + sum(limits.values()) + sum(failed.values())
    return {
        "executes": done,
        "rate": round(done / wall, 2),
        "p50": round(percentile(latencies, 50) * 1e3, 3) if latencies else None,
        "p99": round(percentile(latencies, 99) * 1e3, 3) if latencies else None,
        "cpu_ms_per_execute": round(cpu / ended * 1e3, 3),
        "limits": dict(sorted(limits.items())),
        "failed": dict(sorted(failed.items())),
    }


async def _warm_load(
    pool: Any, server: Server, label: str, args: argparse.Namespace, quiet: bool
) -> dict[str, Any]:
    """The sustained-load series over ``pool`` once it is warm, printed as ``label``."""
    await pool.wait_warm(120)
    result = await _load(server, args.load, args.clients)
    result["deadline_s"] = server.limits.max_execution_time
    return _load_line(label, result, quiet)


def _load_line(label: str, result: dict[str, Any], quiet: bool) -> dict[str, Any]:
    if not quiet:
        p50 = "-" if result["p50"] is None else f"{result['p50']:8.3f}"
        p99 = "-" if result["p99"] is None else f"{result['p99']:8.3f}"
        print(
            f"{label:<38} n={int(result['executes']):<5} p50={p50} ms  "
            f"p99={p99} ms  {result['rate']:.1f} executes/s, "
            f"CPU {result['cpu_ms_per_execute']:.1f} ms per execute (this process and its children)",
            flush=True,
        )
        ended = [f"{kind} {count}" for kind, count in result["limits"].items()]
        ended += [f"failed ({name}) {count}" for name, count in result["failed"].items()]
        print(f"{'  ended in a limit':<38} {', '.join(ended) or 'none'}", flush=True)
    return result


async def _reuse_series(args: argparse.Namespace, quiet: bool) -> dict[str, Any]:
    """The reuse mode: a trivial execute in a reused sandbox, and the sustained load over them."""
    from ..runtimes.reuse import ReusePool, SupervisingRuntime

    inner = _make_runtime(args)
    if not isinstance(inner, SupervisingRuntime):
        raise ValueError(f"the {inner.name} runtime has no reuse mode (--reuse needs docker or kubernetes)")
    subjects = max(1, args.clients, args.pool)
    out: dict[str, Any] = {"executes_per_sandbox": args.reuse, "subjects": subjects}
    reuse = ReusePool(inner, subjects, max_executes=args.reuse)
    server = build_server(reuse)
    await server.start()
    try:
        await server.execute(TRIVIAL, subject=SUBJECT)  # its sandbox; not measured
        warm = await timed(args.n, lambda: server.execute(TRIVIAL, subject=SUBJECT))
        out["trivial_reused"] = line(f"trivial execute, reused (reuse {args.reuse})", warm, quiet=quiet)
        if args.clients > 0:
            out["load"] = await _warm_load(
                reuse, server, f"sustained, {args.clients} in flight, reused", args, quiet
            )
    finally:
        await server.aclose()
    return out


def run(args: argparse.Namespace) -> int:
    """``codemode bench``.

    Args:
        args: the parsed flags.

    Returns:
        The exit status: 0 on success.

    Raises:
        CommandError: status 2 on bad arguments, 1 when the runtime fails.
    """
    if args.n <= 0:
        raise CommandError("--n must be positive")
    if args.pool < 0:
        raise CommandError("--pool must not be negative")
    if args.clients < 0 or args.load <= 0:
        raise CommandError("--clients must not be negative and --load must be positive")
    if args.deadline is not None and not args.deadline > 0:
        raise CommandError("--deadline must be positive")
    if args.reuse < 0 or (args.reuse and args.runtime == "process"):
        raise CommandError("--reuse needs --runtime docker or kubernetes and N >= 0")
    from ..startup.config import ConfigError

    try:
        _make_runtime(args)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    try:
        report = asyncio.run(run_bench(args))
    except Exception as exc:
        raise CommandError(f"failed: {type(exc).__name__}: {exc}", FAILED) from None
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    return 0
