"""What tracing costs per execute (prints numbers, not a test).

    python -m tests.benchmarks.bench_tracing [--n 200] [--otlp http://127.0.0.1:4318/v1/traces]

Measured in one run, interleaved round by round so the machine's noise hits both sides alike:
- whole executes on a warm process pool (a trivial program, one native call, 100 native calls)
  with tracing off (no Tracing: OpenTelemetry not imported) and on (the SDK's batching processor;
  into an in-memory exporter, or over OTLP/HTTP to ``--otlp``);
- the trace hooks alone, without a worker: one execute's spans (execute, admission, acquire,
  teardown and N native calls) made and ended, against the no-op trace tracing off uses.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import codemode
from codemode import authz
from codemode.execution.tracing import NULL_TRACE, Tracer
from codemode.ops.bench import HUNDRED, ONE_CALL, SUBJECT, TRIVIAL, aecho, line


def provider(otlp: str | None) -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    out = TracerProvider()
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter: Any = OTLPSpanExporter(endpoint=otlp)
    else:
        exporter = InMemorySpanExporter()
    out.add_span_processor(BatchSpanProcessor(exporter))
    return out


def build(tracing: codemode.Tracing | None) -> tuple[codemode.Server, codemode.WarmPool]:
    pool = codemode.WarmPool(codemode.ProcessRuntime(), 4)
    b = codemode.Builder(authorizer=authz.allow_all(), runtime=pool, tracing=tracing)
    b.register(codemode.Capability(name="util.echo", summary="Echo.", handler=aecho))
    return b.build(), pool


async def whole(n: int, otlp: str | None) -> None:
    tp = provider(otlp)
    sides = {"off": build(None), "on": build(codemode.Tracing(tp))}
    for server, _ in sides.values():
        await server.start()
    try:
        for label, src, count in (
            ("trivial", TRIVIAL, n),
            ("1 call", ONE_CALL, n),
            ("100 calls", HUNDRED, n // 4),
        ):
            times: dict[str, list[float]] = {"off": [], "on": []}
            for _ in range(max(10, count)):
                for side, (server, pool) in sides.items():
                    await pool.wait_warm(60)
                    t0 = time.perf_counter()
                    await server.execute(src, subject=SUBJECT)
                    times[side].append(time.perf_counter() - t0)
            off = line(f"{label}, tracing off", times["off"])
            on = line(f"{label}, tracing on", times["on"])
            print(f"{'':<38} on/off p50 = {on['p50'] / off['p50']:.3f}  (+{on['p50'] - off['p50']:.3f} ms)")
    finally:
        for server, _ in sides.values():
            await server.aclose()
        tp.shutdown()


def hooks(n: int, calls: int, otlp: str | None) -> None:
    tp = provider(otlp)
    tracer = Tracer(codemode.Tracing(tp), "process")

    def one(trace: Any) -> None:
        t = trace.now()
        trace.admission(t, True)
        trace.acquire(t, True, True)
        for _ in range(calls):
            trace.native_call(trace.now(), "util.echo.v1", "util.echo", "allow", "ok", 1e-5, 1e-5)
        trace.teardown(t)
        trace.finish("ok", None, calls, "proc-1")

    def per_execute(make: Any) -> float:
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                one(make())
            samples.append((time.perf_counter() - t0) / n)
        return statistics.median(samples)

    off = per_execute(lambda: NULL_TRACE)
    on = per_execute(lambda: tracer.start("alice", None))
    print(
        f"{f'hooks alone, {calls} native calls':<38} off={off * 1e6:7.2f} µs  on={on * 1e6:7.2f} µs  "
        f"(+{(on - off) * 1e6:.1f} µs per execute)"
    )
    tp.shutdown()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--otlp", default=None, help="export over OTLP/HTTP to this URL instead of in memory")
    args = p.parse_args()
    exporter = "OTLP " + args.otlp if args.otlp else "in memory"
    print(f"python {sys.version.split()[0]}, n={args.n}, exporter={exporter}")
    for calls in (1, 100):
        hooks(max(200, args.n * 5), calls, args.otlp)
    asyncio.run(whole(args.n, args.otlp))


if __name__ == "__main__":
    main()
