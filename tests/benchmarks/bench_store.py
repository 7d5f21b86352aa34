"""The store's latency on memory, SQLite and PostgreSQL, in one run (prints numbers,
not a test).

    python -m tests.benchmarks.bench_store [--ops 2000] [--suspensions 500]

For each backend: ``state_put`` and ``state_get`` p50/p99 (distinct keys of one subject, a 100-byte
JSON value), ``suspend`` and ``claim`` p50/p99 (a 2 KiB record, 100 subjects), each operation
awaited alone as a caller would. Beside them, the floor of the same run: one empty round trip to
the same place (memory: an await; SQLite: a ``SELECT 1`` on the store's own thread; PostgreSQL:
``SELECT 1`` on one psycopg connection), and each figure's ratio to it. PostgreSQL is the local
cluster through a throwaway database (tests/support/postgres.py), or ``CODEMODE_TEST_POSTGRES_DSN``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from codemode.ops.percentile import percentile
from codemode.store import Store, Suspension
from codemode.store.memory import MemoryStore
from codemode.store.sqlite import SqliteStore

from .shared_parts import postgres_dsn

BIG = 10**12
NOW = time.time()


async def _time(n: int, op: Callable[[int], Awaitable[Any]]) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        await op(i)
        out.append(time.perf_counter() - started)
    return out


async def _measure(
    store: Store, floor: Callable[[], Awaitable[Any]], ops: int, suspensions: int
) -> dict[str, list[float]]:
    await store.check()
    value = json.dumps({"n": 1, "text": "x" * 80})
    subject = "bench-" + secrets.token_hex(4)
    floor_times = await _time(ops, lambda i: floor())

    async def put(i: int) -> None:
        await store.state_put(
            subject, f"k{i:06d}", value, expect=None, expires=None, now=NOW, max_keys=BIG, max_bytes=BIG
        )

    puts = await _time(ops, put)
    gets = await _time(ops, lambda i: store.state_get(subject, f"k{i:06d}", NOW))
    # spread over 100 subjects, as pending questions are (max_pending_approvals bounds each)
    records = [
        Suspension(
            secrets.token_hex(16),
            f"{subject}-{i % 100}",
            NOW,
            NOW + 3600,
            "def main():\n    pass\n",
            "y" * 2048,
        )
        for i in range(suspensions)
    ]
    suspends = await _time(suspensions, lambda i: store.suspend(records[i], max_records=BIG, max_bytes=BIG))
    claims = await _time(suspensions, lambda i: store.claim(records[i].id, records[i].subject_id, NOW))
    for rec in records:
        await store.drop(rec.id)
    return {"floor": floor_times, "state_put": puts, "state_get": gets, "suspend": suspends, "claim": claims}


def _print(name: str, results: dict[str, list[float]]) -> None:
    floor = statistics.median(results["floor"]) * 1000
    print(f"{name}: floor (empty round trip) p50 {floor:.3f} ms")
    for op in ("state_put", "state_get", "suspend", "claim"):
        p50, p99 = percentile(results[op], 50) * 1000, percentile(results[op], 99) * 1000
        ratio = f"{p50 / floor:6.1f}x floor" if floor > 0.001 else "       -"
        print(f"  {op:<10} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  ({ratio})")


async def main(ops: int, suspensions: int) -> None:
    memory = MemoryStore()

    async def nothing() -> None:
        await asyncio.sleep(0)

    _print("memory", await _measure(memory, nothing, ops, suspensions))

    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SqliteStore(Path(tmp) / "store.sqlite3")
        try:
            await sqlite.check()

            async def select_one() -> None:
                await sqlite._run(lambda db: db.execute("SELECT 1").fetchone())

            _print("sqlite", await _measure(sqlite, select_one, ops, suspensions))
        finally:
            await sqlite.aclose()

    with postgres_dsn() as dsn:
        if dsn is None:
            return
        import psycopg

        from codemode.store.postgres import PostgresStore

        store = PostgresStore(dsn)
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:

            async def pg_select_one() -> None:
                await (await conn.execute("SELECT 1")).fetchone()

            _print("postgres", await _measure(store, pg_select_one, ops, suspensions))
        finally:
            await conn.close()
            await store.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--suspensions", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(main(args.ops, args.suspensions))
