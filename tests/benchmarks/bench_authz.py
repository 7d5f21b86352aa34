"""Rego authorizer benchmark: decisions/s on 1 and 4 threads, p50 latency (goal: p50 ≤ 100 µs).

Run: ``python -m tests.benchmarks.bench_authz [--decisions N] [--threads T]``. Prints numbers; asserts
nothing. Measures, on one realistic policy:

- ``decide()`` on the calling thread (the evaluation itself: input conversion, compiled-entrypoint
  evaluation, result classification), single-threaded and from T threads at once;
- ``authorize()`` from asyncio (adds the hop to an evaluation thread and back), one at a time and with
  many tasks in flight;
- for comparison, the same evaluation through regopy's public API only, and an ad-hoc query.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import threading
import time
from collections.abc import Callable

import regopy

from codemode.authz import AuthorizationInput, Denied, Subject
from codemode.authz import rego as rego_module
from codemode.authz.rego import RegoAuthorizer

POLICY = """package codemode.authz

import rego.v1

default allow := false

admins := {"alice", "carol"}

read_only := {"records.lookup", "records.search", "records.status"}

allow if input.subject.id in admins

allow if {
	input.capability.name in read_only
	not startswith(input.arguments.key, "secret/")
	count(input.arguments.tags) <= 8
}

allow if {
	input.capability.name == "records.update"
	input.arguments.owner == input.subject.id
}
"""

SIMPLE_POLICY = """package codemode.authz

import rego.v1

default allow := false

allow if input.subject.id == "alice"
"""

NAMES = ["records.lookup", "records.search", "records.update", "records.delete", "records.status"]


def make_inputs(n: int, seed: int = 1) -> list[AuthorizationInput]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        subject = rng.choice(["alice", "bob", "dave", f"user-{i}"])
        name = rng.choice(NAMES)
        args = {
            "key": rng.choice(["a/b", "secret/x", f"k{i}"]),
            "tags": [f"t{j}" for j in range(rng.randrange(0, 10))],
            "owner": rng.choice([subject, "someone"]),
            "limit": rng.randrange(100),
        }
        out.append(
            AuthorizationInput(Subject(subject), name.replace("records.", "records.entry."), name, args)
        )
    return out


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def report(label: str, count: int, elapsed: float, lat_ns: list[float] | None = None) -> None:
    line = f"{label:<44} {count / elapsed:>10,.0f} decisions/s"
    if lat_ns:
        line += (
            f"   p50 {pct(lat_ns, 50) / 1000:7.1f} µs   p90 {pct(lat_ns, 90) / 1000:7.1f} µs"
            f"   p99 {pct(lat_ns, 99) / 1000:7.1f} µs"
        )
    print(line)


def bench_sync(authz: RegoAuthorizer, inputs: list[AuthorizationInput], n: int) -> tuple[float, list[float]]:
    lat: list[float] = []
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for i in range(n):
        t0 = clock()
        authz.decide(inputs[i % len(inputs)])
        lat.append(clock() - t0)
    return time.perf_counter() - start, lat


def bench_threads(
    authz: RegoAuthorizer, inputs: list[AuthorizationInput], n: int, threads: int
) -> tuple[float, list[float]]:
    per = n // threads
    lats: list[list[float]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def worker(k: int) -> None:
        authz.decide(inputs[0])  # builds this thread's interpreter outside the timing
        barrier.wait()
        clock = time.perf_counter_ns
        mine = lats[k]
        for i in range(per):
            t0 = clock()
            authz.decide(inputs[(i * threads + k) % len(inputs)])
            mine.append(clock() - t0)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - start
    return elapsed, [x for lat in lats for x in lat]


async def one(authz: RegoAuthorizer, item: AuthorizationInput) -> None:
    with contextlib.suppress(Denied):
        await authz.authorize(None, item)


async def bench_async_sequential(
    authz: RegoAuthorizer, inputs: list[AuthorizationInput], n: int
) -> tuple[float, list[float]]:
    for item in inputs[:200]:
        await one(authz, item)  # warm every pool thread
    lat: list[float] = []
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for i in range(n):
        t0 = clock()
        await one(authz, inputs[i % len(inputs)])
        lat.append(clock() - t0)
    return time.perf_counter() - start, lat


async def bench_async_concurrent(authz: RegoAuthorizer, inputs: list[AuthorizationInput], n: int) -> float:
    sem = asyncio.Semaphore(64)

    async def limited(item: AuthorizationInput) -> None:
        async with sem:
            await one(authz, item)

    start = time.perf_counter()
    await asyncio.gather(*(limited(inputs[i % len(inputs)]) for i in range(n)))
    return time.perf_counter() - start


def bench_adhoc(inputs: list[AuthorizationInput], n: int) -> tuple[float, list[float]]:
    interp = regopy.Interpreter()
    interp.log_level = regopy.LogLevel.NONE
    interp.strict_built_in_errors = True
    interp.add_module("policy.rego", POLICY)
    lat: list[float] = []
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for i in range(n):
        item = inputs[i % len(inputs)]
        t0 = clock()
        interp.set_input(
            {
                "subject": {"id": item.subject.id},
                "capability": {"id": item.capability_id, "name": item.capability_name},
                "arguments": item.arguments,
            }
        )
        interp.query("x := data.codemode.authz.allow")
        lat.append(clock() - t0)
    return time.perf_counter() - start, lat


def timed(label: str, fn: Callable[[], RegoAuthorizer]) -> RegoAuthorizer:
    t0 = time.perf_counter()
    a = fn()
    print(f"{label:<44} {(time.perf_counter() - t0) * 1000:10.1f} ms")
    return a


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    n = args.decisions
    inputs = make_inputs(1000)

    print(f"regopy {regopy.__version__}, {os.cpu_count()} CPUs, {n:,} decisions per run")
    print(f"direct C-API path available: {rego_module._DIRECT is not None}")
    p50s: dict[str, float] = {}
    for label, source in (("simple", SIMPLE_POLICY), ("realistic", POLICY)):
        print(f"\n== {label} policy")
        authz = timed(
            "construction (validate, compile, audit, probe)",
            lambda source=source: RegoAuthorizer("data.codemode.authz.allow", {"policy.rego": source}),
        )
        allowed = sum(authz.decide(i) for i in inputs)
        print(f"mix: {allowed} of {len(inputs)} inputs allowed")

        bench_sync(authz, inputs, 2000)  # warm-up
        elapsed, lat = bench_sync(authz, inputs, n)
        report("decide(), 1 thread", n, elapsed, lat)
        p50s[label] = pct(lat, 50) / 1000

        elapsed, lat = bench_threads(authz, inputs, n, args.threads)
        report(f"decide(), {args.threads} threads", n - n % args.threads, elapsed, lat)

        elapsed, lat = asyncio.run(bench_async_sequential(authz, inputs, n // 2))
        report("authorize() from asyncio, one at a time", n // 2, elapsed, lat)
        elapsed = asyncio.run(bench_async_concurrent(authz, inputs, n))
        report("authorize() from asyncio, 64 in flight", n, elapsed)
        authz.close()

    print("\n== comparisons (realistic policy)")
    saved = rego_module._DIRECT
    rego_module._DIRECT = None
    try:
        public = RegoAuthorizer("data.codemode.authz.allow", {"policy.rego": POLICY})
        bench_sync(public, inputs, 1000)
        elapsed, lat = bench_sync(public, inputs, n // 2)
        report("public regopy API, compiled entrypoint", n // 2, elapsed, lat)
    finally:
        rego_module._DIRECT = saved
    elapsed, lat = bench_adhoc(inputs, n // 10)
    report("public regopy API, ad-hoc query", n // 10, elapsed, lat)

    print()
    for label, p50 in p50s.items():
        verdict = "met" if p50 <= 100 else "NOT met"
        print(f"goal p50 ≤ 100 µs (decide, 1 thread, {label} policy): {verdict} ({p50:.1f} µs)")


if __name__ == "__main__":
    main()
