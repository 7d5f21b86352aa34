"""Native call cost against the transport floor, per runtime (prints numbers; not a test).

    python -m tests.benchmarks.bench_native_calls [--n 20] [--rounds 50] [--runtimes process,docker]

For each runtime, every sample takes a fresh worker, measures the **transport floor** on it (``--rounds``
probe → probe_ack echoes through the runtime's own channel: pipes, the Docker attach stream, the
Kubernetes attach websocket; same framing on both sides as a native call), then times one warm
execute on that same worker. Series (p50 over ``--n`` samples):

- trivial (no call), one call, 100 calls of ``util.echo`` (async handler) with ``allow_all()``;
- 100 calls of ``util.secho`` (the same echo as a sync handler, which runs in a thread);
- one call and 100 calls with a Rego authorizer in the path: the default (this bounded policy with
  a small input is evaluated on the loop's thread), the previous default (``bounded_inline=False``:
  an evaluation thread with a bounded wait on the loop's thread) and ``evaluate_inline=True``, and
  the bare ``decide()`` p50 of the same policy on the same input.

Each figure is shown as the p50 and the best sample (the machine's noise only ever adds time).
The per-call time spent authorizing is also read from the pipeline itself (``CallEvent.authz_seconds``:
typed-argument construction plus the authorizer), which is far less noisy than a difference of two
whole-execute times.
Derived: per-call cost = (100 calls − one call) / 99; ratio = per-call / floor (goal ≤ 1.3); Rego
cost per call = per-call(Rego) − per-call(allow_all), and its ratio to ``decide()`` (goal ≤ 1.5).
Kubernetes is measured when ``kubectl get nodes`` works (KUBECONFIG from
scripts/provision-kubernetes.sh), else it prints ``kubernetes: no cluster``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from codemode import authz
from codemode.authz.rego import RegoAuthorizer
from codemode.execution.observe import CallEvent, NullObserver
from codemode.ops.bench import HUNDRED, ONE_CALL, SUBJECT, TRIVIAL, EchoFloor, build_server
from codemode.runtimes.base import Runtime

POLICY = """package bench

import rego.v1

default allow := false

allow if {
	input.subject.id == "bench"
	input.capability.name in {"util.echo", "util.secho"}
	count(input.arguments.value) <= 64
}
"""

#: The ratio goals: a native call's cost to the transport floor, Rego's cost to a bare decide().
GOALS = {"floor": 1.30, "decide": 1.50}

HUNDRED_SYNC = HUNDRED.replace("util.echo", "util.secho")


def _process() -> Runtime:
    from codemode.runtimes.process import ProcessRuntime

    return ProcessRuntime()


def _docker() -> Runtime:
    from codemode.runtimes.docker import DockerRuntime

    return DockerRuntime()


def cluster_reachable() -> bool:
    """``kubectl get nodes`` works (KUBECONFIG from scripts/provision-kubernetes.sh)."""
    try:
        done = subprocess.run(["kubectl", "get", "nodes"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _kubernetes() -> Runtime | None:
    if not cluster_reachable():
        return None
    from codemode.runtimes.kubernetes import KubernetesRuntime

    return KubernetesRuntime()


RUNTIMES: dict[str, Callable[[], Runtime | None]] = {
    "process": _process,
    "docker": _docker,
    "kubernetes": _kubernetes,
}


class AuthzTimes(NullObserver):
    """Keeps each native call's time in authorization (the pipeline's own measurement)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def native_call(self, event: CallEvent) -> None:
        self.seconds.append(event.authz_seconds)


async def sample(floor: EchoFloor, server: Any, source: str, floors: list[float] | None = None) -> float:
    """One warm execute on a fresh worker whose floor (median echo) was measured just before."""
    echoes = await floor.prepare()
    if floors is not None:
        floors.append(statistics.median(echoes))
    t0 = time.perf_counter()
    await server.execute(source, subject=SUBJECT)
    return time.perf_counter() - t0


def decide_times(authorizer: RegoAuthorizer, batches: int = 20, size: int = 100) -> list[float]:
    """Bare ``decide()`` on the calling thread, on the input the benchmark's calls produce: the
    median of each batch."""
    inp = authz.AuthorizationInput(SUBJECT, "util.echo", "util.echo", {"value": "x"})
    for _ in range(100):
        authorizer.decide(inp)
    medians = []
    for _ in range(batches):
        xs = []
        for _ in range(size):
            t0 = time.perf_counter()
            authorizer.decide(inp)
            xs.append(time.perf_counter() - t0)
        medians.append(statistics.median(xs))
    return medians


async def bench_runtime(name: str, runtime: Runtime, n: int, rounds: int) -> dict[str, float]:
    floor = EchoFloor(runtime, rounds)
    rego = RegoAuthorizer("data.bench.allow", {"bench.rego": POLICY})
    try:
        inline = RegoAuthorizer("data.bench.allow", {"bench.rego": POLICY}, evaluate_inline=True)
    except TypeError:  # a codemode without the option (measuring an older tree): same as the default
        inline = RegoAuthorizer("data.bench.allow", {"bench.rego": POLICY})
    try:
        handed = RegoAuthorizer("data.bench.allow", {"bench.rego": POLICY}, bounded_inline=False)
    except TypeError:  # a codemode without the option: its default is the hand-off
        handed = RegoAuthorizer("data.bench.allow", {"bench.rego": POLICY})
    seen = {"allow_all": AuthzTimes(), "rego": AuthzTimes(), "handoff": AuthzTimes(), "inline": AuthzTimes()}
    plain = build_server(floor, observer=seen["allow_all"])
    with_rego = build_server(floor, rego, seen["rego"])
    with_handoff = build_server(floor, handed, seen["handoff"])
    with_inline = build_server(floor, inline, seen["inline"])
    await runtime.check()
    await plain.start()
    try:
        plan = {
            "trivial": (plain, TRIVIAL),
            "one": (plain, ONE_CALL),
            "hundred": (plain, HUNDRED),
            "hundred_sync": (plain, HUNDRED_SYNC),
            "rego_one": (with_rego, ONE_CALL),
            "rego_hundred": (with_rego, HUNDRED),
            "handoff_one": (with_handoff, ONE_CALL),
            "handoff_hundred": (with_handoff, HUNDRED),
            "inline_one": (with_inline, ONE_CALL),
            "inline_hundred": (with_inline, HUNDRED),
        }
        for server, source in plan.values():  # warm caches and evaluators; not measured
            await sample(floor, server, source)
        for observer in seen.values():
            observer.seconds.clear()
        # Round robin, so a change in the machine's load affects every series alike.
        times: dict[str, list[float]] = {key: [] for key in plan}
        floors: list[float] = []
        for _ in range(n):
            for key, (server, source) in plan.items():
                times[key].append(await sample(floor, server, source, floors))
        decide = decide_times(rego)
    finally:
        await plain.aclose()
        rego.close()
        handed.close()
        inline.close()
    times["floor"] = floors
    times["decide"] = decide
    for key, observer in seen.items():  # medians of batches of 100 calls, like decide()
        xs = observer.seconds
        times[f"authz_{key}"] = [statistics.median(xs[i : i + 100]) for i in range(0, len(xs) - 99, 100)]
    print(f"{name}: n={n} samples per series; floor and decide() are medians of batches", flush=True)
    print(f"  {'':<36} {'p50':>10}    {'best':>10}", flush=True)
    out: dict[str, float] = {}
    for stat, pick in (("p50", statistics.median), ("best", min)):
        r = {key: pick(xs) * 1e6 for key, xs in times.items()}
        r["per_call"] = (r["hundred"] - r["one"]) / 99
        r["per_call_sync"] = (r["hundred_sync"] - r["one"]) / 99
        r["rego_per_call"] = (r["rego_hundred"] - r["rego_one"]) / 99
        r["rego_cost"] = r["rego_per_call"] - r["per_call"]
        r["handoff_per_call"] = (r["handoff_hundred"] - r["handoff_one"]) / 99
        r["handoff_cost"] = r["handoff_per_call"] - r["per_call"]
        r["inline_per_call"] = (r["inline_hundred"] - r["inline_one"]) / 99
        r["inline_cost"] = r["inline_per_call"] - r["per_call"]
        r["authz_rego_cost"] = r["authz_rego"] - r["authz_allow_all"]
        r["authz_inline_cost"] = r["authz_inline"] - r["authz_allow_all"]
        r["authz_handoff_cost"] = r["authz_handoff"] - r["authz_allow_all"]
        out.update({f"{key}_{stat}": value for key, value in r.items()})
    rows = [
        ("transport floor (probe echo)", "floor", ""),
        ("trivial execute (no call)", "trivial", ""),
        ("one call", "one", ""),
        ("100 calls", "hundred", ""),
        ("per-call cost", "per_call", "floor"),
        ("per-call cost, sync handler", "per_call_sync", "floor"),
        ("Rego: one call", "rego_one", ""),
        ("Rego: 100 calls", "rego_hundred", ""),
        ("Rego: per-call cost", "rego_per_call", "floor"),
        ("Rego: bare decide()", "decide", ""),
        ("Rego: cost over allow_all per call", "rego_cost", "decide"),
        ("Rego hand-off: one call", "handoff_one", ""),
        ("Rego hand-off: 100 calls", "handoff_hundred", ""),
        ("Rego hand-off: per-call cost", "handoff_per_call", "floor"),
        ("Rego hand-off: cost over allow_all", "handoff_cost", "decide"),
        ("Rego inline: one call", "inline_one", ""),
        ("Rego inline: 100 calls", "inline_hundred", ""),
        ("Rego inline: per-call cost", "inline_per_call", "floor"),
        ("Rego inline: cost over allow_all", "inline_cost", "decide"),
        ("in-pipeline authorization, allow_all", "authz_allow_all", ""),
        ("in-pipeline authorization, Rego", "authz_rego", ""),
        ("  Rego over allow_all", "authz_rego_cost", "decide"),
        ("in-pipeline authorization, hand-off", "authz_handoff", ""),
        ("  hand-off over allow_all", "authz_handoff_cost", "decide"),
        ("in-pipeline authorization, inline", "authz_inline", ""),
        ("  inline over allow_all", "authz_inline_cost", "decide"),
    ]
    for label, key, base in rows:
        cells = f"{out[key + '_p50']:10.1f} µs {out[key + '_best']:10.1f} µs"
        if base:
            ratios = [out[f"{key}_{st}"] / out[f"{base}_{st}"] for st in ("p50", "best")]
            goal = GOALS[base]
            cells += f"   ratio to {base} {ratios[0]:5.2f} / {ratios[1]:5.2f} (goal <= {goal:.2f})"
        print(f"  {label:<36} {cells}", flush=True)
    return out


BenchRuntime = Callable[[str, Runtime, int, int], Awaitable[dict[str, float]]]


async def run_all(title: str, runtimes: dict[str, Callable[[], Runtime | None]], bench: BenchRuntime) -> None:
    """The command line of a per-runtime benchmark: ``--n``, ``--rounds``, ``--runtimes``; each
    runtime benched in turn (``no cluster`` when its factory gives None; a failure is printed and
    the next runtime still runs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20, help="samples per series (default 20)")
    parser.add_argument("--rounds", type=int, default=50, help="floor echoes per worker (default 50)")
    parser.add_argument("--runtimes", default="process,docker,kubernetes")
    a = parser.parse_args()
    print(f"python {sys.version.split()[0]}; {title}", flush=True)
    for name in [x for x in a.runtimes.split(",") if x]:
        runtime = runtimes[name]()
        if runtime is None:
            print(f"{name}: no cluster", flush=True)
            continue
        try:
            await bench(name, runtime, a.n, a.rounds)
        except Exception as exc:  # one runtime failing must not hide the others' numbers
            print(f"{name}: failed: {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    asyncio.run(run_all("per runtime: floor, pipeline and ratio in one run", RUNTIMES, bench_runtime))
