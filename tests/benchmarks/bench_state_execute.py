"""The state pack's ``get`` and ``put`` through an execute (beside bench_store's
store-level figures; prints numbers, not a test).

    python -m tests.benchmarks.bench_state_execute [--n 9] [--calls 50]

On the process runtime, for the memory and SQLite stores (and PostgreSQL when the local cluster or
``CODEMODE_TEST_POSTGRES_DSN`` is there): the p50 over ``--n`` executes of a program making
``--calls`` calls of ``state.put`` (distinct keys, a small JSON value), of ``state.get`` of those
keys, and, as the floor of the same run, of a trivial async capability that returns its argument.
Each is printed per call (the execute's time over the calls) with its ratio to the floor: what the
store adds to a native call's round trip through the worker, the host's binding and the authorizer.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import codemode
from codemode import authz
from codemode.store import Store
from codemode.store.memory import MemoryStore
from codemode.store.sqlite import SqliteStore
from codemode_capabilities.state import capabilities

from .shared_parts import echo, postgres_dsn

SUBJECT = authz.Subject("bench")


def programs(calls: int) -> dict[str, str]:
    return {
        "trivial (floor)": f"def main():\n    return [bench.echo(n=i) for i in range({calls})]\n",
        "state.put": (
            f"def main():\n    return [state.put(key='k%d' % i, value={{'n': i, 't': 'x' * 80}})"
            f" for i in range({calls})]\n"
        ),
        "state.get": f"def main():\n    return [state.get(key='k%d' % i) for i in range({calls})]\n",
    }


async def measure(name: str, store: Store, n: int, calls: int) -> None:
    builder = codemode.Builder(
        authorizer=authz.allow_all(),
        limits=codemode.Limits(max_native_calls=max(100, calls), max_execution_time=60.0),
        runtime=codemode.ProcessRuntime(),
        store=store,
    )
    builder.register(*capabilities(), codemode.Capability(name="bench.echo", summary="Echo.", handler=echo))
    async with builder.build() as server:
        sources = programs(calls)
        for source in sources.values():  # warm: the worker template, the store's tables
            await server.execute(source, subject=SUBJECT)
        times: dict[str, list[float]] = {label: [] for label in sources}
        for _ in range(n):  # alternately, so the machine's noise hits each alike
            for label, source in sources.items():
                t0 = time.perf_counter()
                await server.execute(source, subject=SUBJECT)
                times[label].append((time.perf_counter() - t0) * 1000 / calls)
        floor = statistics.median(times["trivial (floor)"])
        print(f"{name}: per call, p50 over {n} executes of {calls} calls")
        for label, samples in times.items():
            p50 = statistics.median(samples)
            print(
                f"  {label:16s} p50 {p50:7.3f} ms/call (best {min(samples):7.3f})  {p50 / floor:5.2f}x floor"
            )


async def main(n: int, calls: int) -> None:
    await measure("memory", MemoryStore(), n, calls)
    with tempfile.TemporaryDirectory() as tmp:
        await measure("sqlite", SqliteStore(Path(tmp) / "store.sqlite3"), n, calls)
    with postgres_dsn() as dsn:
        if dsn is not None:
            from codemode.store.postgres import PostgresStore

            await measure("postgres", PostgresStore(dsn), n, calls)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=9)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.calls))
