"""How close to the transport floor can a native call get on this machine? (prints numbers; not a test)

    python -m tests.benchmarks.bench_call_bounds [--n 20] [--rounds 50] [--runtimes process,docker,kubernetes]

``bench_native_calls`` compares the whole exchange (a Starlark program in the real worker, the
host's whole pipeline) with the transport floor. This benchmark splits that figure, on the same
channels, in one run, to show which part of the gap belongs to whom and what no implementation in
this language could remove. The worker is the test twin (``codemode_worker.testing_entry``: it
answers probes exactly like the real worker, then runs the exec frame's source as Python), so the
worker's side can be made as small as a loop writing ``native_call`` frames. Series, each with a
fresh worker whose floor was measured just before (p50 and best of ``--n`` samples):

- **floor**: probe → probe_ack echoes (``EchoFloor``; the worker decodes and encodes strictly);
- **host pipeline**: ``Server.execute`` of a worker-side Python loop that writes ``native_call``
  frames with no checks and reads the results with plain ``json.loads`` (a worker that costs no
  more than the floor's own echo), so what is added over the floor is the host's pipeline: strict
  read, checks, rebind, typed input, ``allow_all()``, the async handler's task, result conversion,
  write;
- **bare host**: the same worker loop against a host that does the least any host could: split the
  frame, ``json.loads``, ``await`` an async echo, ``json.dumps``, write (no checks, no task);
- **bare host, Starlark worker**: the same bare host, the worker's calls made from a Starlark loop
  through a plain Python callable (starlark-pyo3's own conversion, no checks): what Starlark adds.

Per-call cost = (100 calls − 1 call) / 99 (100 is the default call limit), timed from the exec frame
to the final frame (the worker's teardown is never timed); each row prints its ratio to the floor
(the issue's goal is ≤ 1.3) and the host's CPU time per call (``time.process_time()``: all its
threads, the same difference). Kubernetes is measured when a cluster is reachable
(its test image is imported by scripts/provision-kubernetes.sh).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from codemode.ops.bench import SUBJECT, EchoFloor, build_server
from codemode.runtimes.base import Runtime, Sandbox
from codemode.runtimes.process import ProcessOptions
from codemode.runtimes.testing import TESTING_ENTRY, TESTING_ENV
from codemode_worker import PROTOCOL_VERSION
from codemode_worker.protocol import encode_frame

from .bench_native_calls import cluster_reachable, run_all

_TESTING_ENV = {TESTING_ENV: "1"}
_TESTING_IMAGE = f"codemode-worker-testing:{PROTOCOL_VERSION}"
_LIMITS = {
    "max_steps": 10_000_000,
    "max_value_depth": 32,
    "max_value_bytes": 1 << 20,
    "max_native_calls": 1000,
    "max_callstack": 64,
}

# Worker-side programs (Python, run by the test twin). ``{n}`` is the number of calls.
PYTHON_CLIENT = """\
import json, struct
H = struct.Struct(">I")
read, write, flush = stdin.read, stdout.write, stdout.flush
total = 0
for seq in range(1, {n} + 1):
    body = b'{{"k":"native_call","seq":%d,"name":"util.echo","args":{{"value":"x"}}}}' % seq
    write(H.pack(len(body)) + body)
    flush()
    (size,) = H.unpack(read(4))
    total += len(json.loads(read(size))["value"]["value"])
final(total)
"""

STARLARK_CLIENT = """\
import json, struct
import starlark as sl
H = struct.Struct(">I")
read, write, flush = stdin.read, stdout.write, stdout.flush
state = [0]
def echo(value):
    state[0] += 1
    body = ('{{"k":"native_call","seq":%d,"name":"util.echo","args":{{"value":%s}}}}'
            % (state[0], json.dumps(value))).encode()
    write(H.pack(len(body)) + body)
    flush()
    (size,) = H.unpack(read(4))
    return json.loads(read(size))["value"]
module = sl.Module()
module.add_callable("echo", echo)
program = (
    "def main():\\n    n = 0\\n    for i in range({n}):\\n"
    "        n += len(echo(value='x')['value'])\\n    return n\\nmain()\\n"
)
final(sl.eval(module, sl.parse("bound.star", program, sl.Dialect.standard()), sl.Globals.standard()))
"""


def _process() -> Runtime:
    from codemode.runtimes.process import ProcessRuntime

    return ProcessRuntime(ProcessOptions(module=TESTING_ENTRY[-1], extra_env=_TESTING_ENV))


def _docker() -> Runtime:
    from codemode.runtimes.docker import DockerOptions, DockerRuntime

    return DockerRuntime(DockerOptions(testing_entry=True, image=_TESTING_IMAGE))


def _kubernetes() -> Runtime | None:
    if not cluster_reachable():
        return None
    from codemode.runtimes.kubernetes import KubernetesOptions, KubernetesRuntime

    return KubernetesRuntime(KubernetesOptions(testing_entry=True, image=_TESTING_IMAGE))


RUNTIMES: dict[str, Callable[[], Runtime | None]] = {
    "process": _process,
    "docker": _docker,
    "kubernetes": _kubernetes,
}


async def _echo(value: str) -> dict[str, str]:
    return {"value": value}


async def bare_host(sandbox: Sandbox, source: str) -> Any:
    """Drive one exec with the least work a host could do per frame; return the final value."""
    exec_frame = {"k": "exec", "v": PROTOCOL_VERSION, "source": source, "manifest": [], "limits": _LIMITS}
    await sandbox.write(encode_frame(exec_frame))
    buf = b""
    while True:
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            data = await sandbox.read(65536)
            if not data:
                raise RuntimeError("worker ended before its final frame")
            buf += data
        size = int.from_bytes(buf[:4], "big")
        frame = json.loads(buf[4 : 4 + size])
        buf = buf[4 + size :]
        if frame["k"] == "native_call":
            value = await _echo(**frame["args"])
            body = json.dumps({"k": "native_result", "seq": frame["seq"], "value": value}).encode()
            await sandbox.write(len(body).to_bytes(4, "big") + body)
        elif frame["k"] == "final":
            return frame["value"]
        else:
            raise RuntimeError(f"worker failed: {frame}")


async def _clocked(run: Awaitable[Any]) -> tuple[float, float]:
    """(wall seconds, host CPU seconds) of one awaited exchange: CPU of this process, every thread
    (the loop's and the runtime's readers), from the precise per-process clock."""
    c0, t0 = time.process_time(), time.perf_counter()
    await run
    return time.perf_counter() - t0, time.process_time() - c0


async def bench_runtime(name: str, runtime: Runtime, n: int, rounds: int) -> dict[str, float]:
    floor = EchoFloor(runtime, rounds)
    server = build_server(floor)

    def pipeline(calls: int) -> Callable[[], Awaitable[tuple[float, float]]]:
        source = PYTHON_CLIENT.format(n=calls)
        # The execute returns at the final frame; the worker is destroyed after it, untimed.
        return lambda: _clocked(server.execute(source, subject=SUBJECT))

    def bare(template: str, calls: int) -> Callable[[], Awaitable[tuple[float, float]]]:
        async def run() -> tuple[float, float]:
            sandbox = await floor.spawn()
            try:  # timed up to the final frame, like the pipeline; the teardown is not
                return await _clocked(bare_host(sandbox, template.format(n=calls)))
            finally:
                await sandbox.destroy()

        return run

    plan = {
        "pipeline_1": pipeline(1),
        "pipeline_100": pipeline(100),
        "bare_1": bare(PYTHON_CLIENT, 1),
        "bare_100": bare(PYTHON_CLIENT, 100),
        "starlark_1": bare(STARLARK_CLIENT, 1),
        "starlark_100": bare(STARLARK_CLIENT, 100),
    }
    floors: list[float] = []
    times: dict[str, list[float]] = {key: [] for key in plan}
    cpu: dict[str, list[float]] = {key: [] for key in plan}
    try:
        await runtime.check()
        await server.start()
        for run in plan.values():  # warm-up, not measured
            await floor.prepare()
            await run()
        for _ in range(n):  # round robin: the machine's load changes every series alike
            for key, run in plan.items():
                floors.append(statistics.median(await floor.prepare()))
                wall, host = await run()
                times[key].append(wall)
                cpu[key].append(host)
    finally:
        await server.aclose()
    print(f"{name}: n={n} samples per series (fresh worker each; floor = median echo of each)", flush=True)
    out: dict[str, float] = {}
    for stat, pick in (("p50", statistics.median), ("best", min)):
        r = {key: pick(xs) * 1e6 for key, xs in times.items()}
        c = {key: pick(xs) * 1e6 for key, xs in cpu.items()}
        out[f"floor_{stat}"] = pick(floors) * 1e6
        for series in ("pipeline", "bare", "starlark"):
            out[f"{series}_{stat}"] = (r[f"{series}_100"] - r[f"{series}_1"]) / 99
            out[f"{series}_cpu_{stat}"] = (c[f"{series}_100"] - c[f"{series}_1"]) / 99
    rows = (
        ("transport floor (probe echo)", "floor"),
        ("host pipeline, minimal worker", "pipeline"),
        ("bare host, minimal worker", "bare"),
        ("bare host, Starlark worker", "starlark"),
    )
    for label, key in rows:
        p50, best = out[f"{key}_p50"], out[f"{key}_best"]
        ratio = ""
        if key != "floor":
            ratio = (
                f"   ratio {p50 / out['floor_p50']:5.2f} / {best / out['floor_best']:5.2f}"
                f"   host CPU {out[f'{key}_cpu_p50']:6.1f} µs"
            )
        print(f"  {label:<32} p50 {p50:8.1f} µs  best {best:8.1f} µs{ratio}", flush=True)
    return out


if __name__ == "__main__":
    asyncio.run(run_all("per-call cost split by side, in one run", RUNTIMES, bench_runtime))
