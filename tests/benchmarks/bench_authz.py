"""Rego authorizer benchmark: decisions/s on 1 and 4 threads, p50 latency (goal: p50 ≤ 100 µs).

Run: ``python -m tests.benchmarks.bench_authz [--decisions N] [--threads T]``. Prints numbers; asserts
nothing. Measures, on one realistic policy:

- ``decide()`` on the calling thread (the evaluation itself: input conversion, compiled-entrypoint
  evaluation, result classification), single-threaded and from T threads at once;
- ``authorize()`` from asyncio, one at a time, on every path in the same run, each with its ratio to
  ``decide()``: the default (a bounded policy with a small input evaluates on the loop's thread), the
  previous default (``bounded_inline=False``: the evaluation thread with a bounded wait), the plain
  asynchronous wait (``wait_budget=0``) and ``evaluate_inline=True``; then the default with many tasks
  in flight;
- the hand-off's own floor: an empty job through a daemon thread, waited for blocking and awaited;
- the inline bound: ``decide()`` on the largest input a bounded policy still evaluates inline
  (``codemode.authz.rego._bounded``: values and characters at their caps) and on the costliest nesting
  (chains at the depth cap), against ``INLINE_BUDGET``; and what the construction's calibration measured
  (``codemode.authz.rego._calibrate``: the most the policy adds over its worst inputs);
- for comparison, the same evaluation through regopy's public API only, and an ad-hoc query.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import regopy

from codemode.authz import AuthorizationInput, Denied, Subject
from codemode.authz.rego import INLINE_BUDGET, RegoAuthorizer
from codemode.authz.rego import _authorizer as rego_module
from codemode.authz.rego import _bounded as bounded
from codemode.authz.rego import _calibrate as calibrate

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
    line = f"{label:<60} {count / elapsed:>10,.0f} decisions/s"
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


def bench_handoff_floor(n: int) -> tuple[list[float], list[float]]:
    """An empty job through a daemon thread: waited for on the calling thread, and awaited (the
    future posted back through the loop's self-pipe). What any hand-off costs before evaluating."""
    jobs: queue.SimpleQueue[concurrent.futures.Future[bool] | None] = queue.SimpleQueue()

    def worker() -> None:
        while (fut := jobs.get()) is not None:
            if fut.set_running_or_notify_cancel():
                fut.set_result(True)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    clock = time.perf_counter_ns
    blocking: list[float] = []
    for _ in range(n):
        t0 = clock()
        fut: concurrent.futures.Future[bool] = concurrent.futures.Future()
        jobs.put(fut)
        fut.result(1.0)
        blocking.append(clock() - t0)

    async def awaited() -> list[float]:
        lat: list[float] = []
        for _ in range(n):
            t0 = clock()
            fut: concurrent.futures.Future[bool] = concurrent.futures.Future()
            jobs.put(fut)
            await asyncio.wrap_future(fut)
            lat.append(clock() - t0)
        return lat

    asynchronous = asyncio.run(awaited())
    jobs.put(None)
    thread.join()
    return blocking, asynchronous


def largest_inline_input() -> AuthorizationInput:
    """An input at both caps of ``small_input`` (one value and a few characters under each)."""
    keys = 4  # subject, capability (id, name), arguments: the document's own objects and strings
    room = bounded.MAX_INLINE_VALUES - 3 - keys - 3  # the document, its two objects, the tags list
    per = (bounded.MAX_INLINE_CHARS - 200) // room
    item = AuthorizationInput(
        Subject("dave"),
        "records.entry.lookup",
        "records.lookup",
        {"key": "a/b", "tags": ["t" * per for _ in range(room)]},
    )
    document = {
        "subject": {"id": item.subject.id},
        "capability": {"id": item.capability_id, "name": item.capability_name},
        "arguments": item.arguments,
    }
    assert bounded.small_input(document), "the largest input must still be evaluated inline"
    return item


def costliest_nested_input() -> AuthorizationInput:
    """Chains of objects at ``MAX_INLINE_DEPTH`` filling the value cap: the costliest nesting still
    evaluated inline (a deeper chain takes the hand-off)."""
    chain = bounded.MAX_INLINE_DEPTH - 2  # the document and `arguments` are the first two levels
    arguments: dict[str, Any] = {}
    for i in range((bounded.MAX_INLINE_VALUES - 6) // (chain + 1)):
        value: Any = 1
        for _ in range(chain):
            value = {"k": value}
        arguments[f"c{i}"] = value
    return AuthorizationInput(Subject("dave"), "records.entry.lookup", "records.lookup", arguments)


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
    print(f"{label:<60} {(time.perf_counter() - t0) * 1000:10.1f} ms")
    return a


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    n = args.decisions
    inputs = make_inputs(1000)

    print(f"regopy {regopy.__version__}, {os.cpu_count()} CPUs, {n:,} decisions per run")
    print(f"direct C-API path available: {rego_module._DIRECT is not None}")  # type: ignore[attr-defined]
    p50s: dict[str, float] = {}
    ratios: dict[tuple[str, str], float] = {}

    def new(source: str, **options: Any) -> RegoAuthorizer:
        return RegoAuthorizer("data.codemode.authz.allow", {"policy.rego": source}, **options)

    blocking, awaited = bench_handoff_floor(n // 2)
    print(f"hand-off floor (empty job): blocking wait p50 {pct(blocking, 50) / 1000:.1f} µs, ", end="")
    print(f"awaited p50 {pct(awaited, 50) / 1000:.1f} µs")
    for label, source in (("simple", SIMPLE_POLICY), ("realistic", POLICY)):
        print(f"\n== {label} policy")
        authz = timed(
            "construction (validate, compile, audit, probe, calibrate)",
            partial(RegoAuthorizer, "data.codemode.authz.allow", {"policy.rego": source}),
        )
        allowed = sum(authz.decide(i) is True for i in inputs)
        print(f"mix: {allowed} of {len(inputs)} inputs allowed")

        bench_sync(authz, inputs, 2000)  # warm-up
        elapsed, lat = bench_sync(authz, inputs, n)
        report("decide(), 1 thread", n, elapsed, lat)
        p50s[label] = pct(lat, 50) / 1000
        decide_p50 = pct(lat, 50)

        elapsed, lat = bench_threads(authz, inputs, n, args.threads)
        report(f"decide(), {args.threads} threads", n - n % args.threads, elapsed, lat)

        paths = {
            "default": authz,
            "previous default (bounded_inline=False)": new(source, bounded_inline=False),
            "async wait only (wait_budget=0)": new(source, bounded_inline=False, wait_budget=0),
            "evaluate_inline=True": new(source, evaluate_inline=True),
        }
        # Round robin in slices, so a change in the machine's load affects every path alike.
        lats: dict[str, list[float]] = {key: [] for key in paths}
        for _ in range(10):
            for key, path in paths.items():
                lats[key] += asyncio.run(bench_async_sequential(path, inputs, n // 20))[1]
        for key, samples in lats.items():
            ratio = pct(samples, 50) / decide_p50
            report(f"authorize() one at a time, {key}", len(samples), sum(samples) / 1e9, samples)
            print(f"{'':<60} ratio to decide() p50 {ratio:5.2f} (goal <= 1.50)")
            ratios[(label, key)] = ratio
        elapsed = asyncio.run(bench_async_concurrent(authz, inputs, n))
        report("authorize() from asyncio, 64 in flight", n, elapsed)
        largest = largest_inline_input()
        elapsed, lat = bench_sync(authz, [largest], n // 20)
        report("decide(), largest input evaluated inline", n // 20, elapsed, lat)
        print(
            f"{'':<60} inline bound: p99 {pct(lat, 99) / 1000:.1f} µs"
            f" of a {INLINE_BUDGET * 1e6:.0f} µs budget"
        )
        elapsed, lat = bench_sync(authz, [costliest_nested_input()], n // 20)
        report("decide(), costliest nesting evaluated inline", n // 20, elapsed, lat)
        inputs_ = calibrate.worst_inputs(bounded.input_paths({"policy.rego": source}))
        evaluate, baseline = authz._evaluator().evaluate, rego_module._baseline().evaluate
        # A limit of 0 makes it measure the policy's own part of every input (it stops at the first).
        added = max(calibrate.worst_case(evaluate, baseline, [d], 0.0) for d in inputs_)
        print(
            f"{'':<60} calibration: the policy adds {added * 1e6:.0f} µs at most over {len(inputs_)} worst"
            f" inputs (limit {INLINE_BUDGET / 4 * 1e6:.0f} µs)"
        )
        for path in paths.values():
            path.close()

    print("\n== comparisons (realistic policy)")
    saved = rego_module._DIRECT  # type: ignore[attr-defined]
    rego_module._DIRECT = None  # type: ignore[attr-defined]
    try:
        public = RegoAuthorizer("data.codemode.authz.allow", {"policy.rego": POLICY})
        bench_sync(public, inputs, 1000)
        elapsed, lat = bench_sync(public, inputs, n // 2)
        report("public regopy API, compiled entrypoint", n // 2, elapsed, lat)
    finally:
        rego_module._DIRECT = saved  # type: ignore[attr-defined]
    elapsed, lat = bench_adhoc(inputs, n // 10)
    report("public regopy API, ad-hoc query", n // 10, elapsed, lat)

    print()
    for label, p50 in p50s.items():
        verdict = "met" if p50 <= 100 else "NOT met"
        print(f"goal p50 ≤ 100 µs (decide, 1 thread, {label} policy): {verdict} ({p50:.1f} µs)")
    for (label, key), ratio in ratios.items():
        verdict = "met" if ratio <= 1.5 else "NOT met"
        print(f"goal authorize() ≤ 1.5x decide() ({label} policy, {key}): {verdict} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
