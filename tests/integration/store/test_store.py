"""The store's contract (codemode.store.Store), the same tests over every backend: memory, a SQLite
file and a real PostgreSQL server (tests/support/postgres.py; required with CI=true).

What is checked: a suspension is claimed once, by its subject, before its expiry; expired records
are gone from the tables; the per-subject bounds (suspensions, suspension bytes, state keys, state
bytes) hold, also against racing writers on separate connections; compare-and-set, TTL and paging
of the state; texts come back exactly as given; an unreachable server is StoreUnavailable within a
bound, never a hang, and its message holds no credential."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from codemode.store import StateConflict, StateEntry, Store, StoreFull, StoreUnavailable, Suspension
from codemode.store.memory import MemoryStore
from codemode.store.sqlite import SqliteStore
from tests.support import postgres

pytestmark = pytest.mark.timeout(120)

BACKENDS = ["memory", "sqlite", "postgres"]
NOW = 1_800_000_000.0
BIG = 10**9


@dataclass
class Backend:
    """One backend under test: ``make()`` opens another store on the same data (a second replica or
    connection), ``rows(table)`` counts what is really in a table."""

    kind: str
    store: Store
    make: Callable[[], Store]
    rows: Callable[[str], int]
    opened: list[Store]


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    kind = request.param
    opened: list[Store] = []
    if kind == "memory":
        memory = MemoryStore()

        def make() -> Store:
            return memory

        def rows(table: str) -> int:
            if table == "codemode_suspensions":
                return len(memory._suspensions)
            return sum(len(keys.entries) for keys in memory._state.values())

    elif kind == "sqlite":
        path = tmp_path / "data" / "store.sqlite3"

        def make() -> Store:
            store = SqliteStore(path)
            opened.append(store)
            return store

        def rows(table: str) -> int:
            with sqlite3.connect(path) as db:
                return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    else:
        from codemode.store.postgres import PostgresStore

        dsn = request.getfixturevalue("postgres_dsn")
        postgres.reset(dsn)

        def make() -> Store:
            store = PostgresStore(dsn, timeout=5.0)
            opened.append(store)
            return store

        def rows(table: str) -> int:
            count = postgres.query(dsn, f"SELECT count(*) FROM {table}")[0][0]
            assert isinstance(count, int)
            return count

    try:
        yield Backend(kind, make(), make, rows, opened)
    finally:
        for store in opened:
            await store.aclose()


def record(
    subject: str = "alice",
    *,
    expires: float = NOW + 600,
    source: str = "def main():\n    return 1\n",
    body: str = '{"calls":[]}',
) -> Suspension:
    return Suspension(secrets.token_hex(16), subject, NOW, expires, source, body)


async def put(store: Store, subject: str, key: str, value: str = "1", **kw: object) -> StateEntry:
    args: dict[str, object] = {"expect": None, "expires": None, "now": NOW, "max_keys": BIG, "max_bytes": BIG}
    args.update(kw)
    return await store.state_put(subject, key, value, **args)  # type: ignore[arg-type]


# -- suspensions ---------------------------------------------------------------------------------


async def test_a_suspension_is_claimed_once_by_its_subject(backend: Backend) -> None:
    store = backend.store
    rec = record()
    await store.suspend(rec, max_records=10, max_bytes=BIG)
    assert await store.pending("alice") == 1
    assert await store.pending() == 1
    assert await store.claim(rec.id, "mallory", NOW) is None  # another subject finds nothing
    assert await store.claim(secrets.token_hex(16), "alice", NOW) is None
    assert await store.claim(rec.id, "alice", NOW) == rec
    assert await store.claim(rec.id, "alice", NOW) is None  # the second claim loses
    assert await store.pending("alice") == 0
    assert backend.rows("codemode_suspensions") == 1  # claimed, not yet dropped
    await store.drop(rec.id)
    assert backend.rows("codemode_suspensions") == 0
    await store.drop(rec.id)  # twice is harmless


async def test_an_expired_suspension_is_not_claimed_and_expire_removes_the_rows(backend: Backend) -> None:
    store = backend.store
    late, soon = record(expires=NOW + 100), record(expires=NOW + 10)
    claimed = record(expires=NOW + 10)
    for rec in (late, soon, claimed):
        await store.suspend(rec, max_records=10, max_bytes=BIG)
    assert await store.claim(claimed.id, "alice", NOW) == claimed
    assert await store.claim(soon.id, "alice", NOW + 10) is None  # its last instant is past
    await put(store, "alice", "ttl", expires=NOW + 10)
    await put(store, "alice", "kept")
    assert backend.rows("codemode_suspensions") == 3
    assert backend.rows("codemode_state") == 2
    assert await store.expire(NOW + 10) == 3  # soon, claimed (crashed resume) and the key
    assert backend.rows("codemode_suspensions") == 1
    assert backend.rows("codemode_state") == 1
    assert await store.claim(late.id, "alice", NOW + 10) == late
    assert await store.expire(NOW + 1000) == 1
    assert backend.rows("codemode_suspensions") == 0


async def test_the_suspension_bounds_are_per_subject(backend: Backend) -> None:
    store = backend.store
    for _ in range(2):
        await store.suspend(record(), max_records=2, max_bytes=BIG)
    with pytest.raises(StoreFull) as full:
        await store.suspend(record(), max_records=2, max_bytes=BIG)
    assert full.value.kind == "suspensions"
    await store.suspend(record("bob"), max_records=2, max_bytes=BIG)  # another subject's own bound
    big = record("carol", body="x" * 1000)
    await store.suspend(big, max_records=10, max_bytes=2 * big.size)
    with pytest.raises(StoreFull) as full:
        await store.suspend(record("carol", body="x" * 1000), max_records=10, max_bytes=2 * big.size - 1)
    assert full.value.kind == "suspension bytes"
    # room again once a record is no longer pending, or has expired
    assert await store.claim(big.id, "carol", NOW) is not None
    await store.suspend(record("carol", body="x" * 1000), max_records=10, max_bytes=2 * big.size - 1)
    dave = record("dave", expires=NOW + 1)
    await store.suspend(dave, max_records=1, max_bytes=BIG)
    later = Suspension(secrets.token_hex(16), "dave", NOW + 1, NOW + 100, "s", "b")
    await store.suspend(later, max_records=1, max_bytes=BIG)
    assert await store.pending("alice") == 2


async def test_a_suspension_id_is_never_overwritten(backend: Backend) -> None:
    rec = record()
    await backend.store.suspend(rec, max_records=10, max_bytes=BIG)
    with pytest.raises(ValueError):
        await backend.store.suspend(
            Suspension(rec.id, "mallory", NOW, NOW + 600, "evil", "{}"), max_records=10, max_bytes=BIG
        )
    assert await backend.store.claim(rec.id, "alice", NOW) == rec


# -- state ---------------------------------------------------------------------------------------


async def test_state_versions_and_compare_and_set(backend: Backend) -> None:
    store = backend.store
    assert (await put(store, "alice", "k", "1")).version == 1
    assert (await put(store, "alice", "k", "2")).version == 2
    with pytest.raises(StateConflict):
        await put(store, "alice", "k", "3", expect=1)
    with pytest.raises(StateConflict):
        await put(store, "alice", "k", "3", expect=0)  # 0: only if absent
    assert (await put(store, "alice", "k", "3", expect=2)).version == 3
    assert (await put(store, "alice", "new", "1", expect=0)).version == 4  # the subject's 4th put
    assert await store.state_get("alice", "k", NOW) == StateEntry("k", "3", 3, None)
    with pytest.raises(StateConflict):
        await store.state_delete("alice", "k", expect=2, now=NOW)
    assert await store.state_delete("alice", "k", expect=3, now=NOW) is True
    assert await store.state_get("alice", "k", NOW) is None
    assert await store.state_delete("alice", "k", expect=None, now=NOW) is False
    assert await store.state_delete("alice", "k", expect=0, now=NOW) is False
    with pytest.raises(StateConflict):
        await store.state_delete("alice", "k", expect=1, now=NOW)


async def test_a_key_deleted_and_made_again_never_repeats_a_version(backend: Backend) -> None:
    """ABA: an execute reads version v, another deletes the key and a third makes it again; the
    first one's compare-and-set must fail, not overwrite the new key's value."""
    store = backend.store
    seen = (await put(store, "alice", "k", '"first"')).version
    assert await store.state_delete("alice", "k", expect=seen, now=NOW)
    again = await put(store, "alice", "k", '"second"', expect=0)
    assert again.version != seen
    with pytest.raises(StateConflict):
        await put(store, "alice", "k", '"stale writer"', expect=seen)
    # the same through an expiry
    ttl = await put(store, "alice", "t", '"a"', expires=NOW + 1)
    renewed = await put(store, "alice", "t", '"b"', expect=0, now=NOW + 1)
    assert renewed.version != ttl.version
    with pytest.raises(StateConflict):
        await put(store, "alice", "t", '"c"', expect=ttl.version, now=NOW + 1)
    entry = await store.state_get("alice", "k", NOW)
    assert entry is not None and entry.value == '"second"'


async def test_one_subject_never_reaches_anothers_keys(backend: Backend) -> None:
    store = backend.store
    await put(store, "alice", "secret", '"a"')
    assert await store.state_get("bob", "secret", NOW) is None
    assert await store.state_list("bob", "", after=None, limit=100, now=NOW) == []
    assert await store.state_delete("bob", "secret", expect=None, now=NOW) is False
    assert (await put(store, "bob", "secret", '"b"', expect=0)).version == 1
    entry = await store.state_get("alice", "secret", NOW)
    assert entry is not None and entry.value == '"a"'


async def test_a_key_with_a_ttl_is_gone_at_its_time(backend: Backend) -> None:
    store = backend.store
    await put(store, "alice", "t", "1", expires=NOW + 10)
    assert await store.state_get("alice", "t", NOW + 9.5) == StateEntry("t", "1", 1, NOW + 10)
    assert await store.state_get("alice", "t", NOW + 10) is None
    assert await store.state_list("alice", "", after=None, limit=10, now=NOW + 10) == []
    # an expired key is absent: a put makes it anew (expect 0 holds), and the TTL can be dropped
    entry = await put(store, "alice", "t", "2", expect=0, now=NOW + 10)
    assert (entry.version, entry.expires) == (2, None)
    assert await store.expire(NOW + 1000) == 0
    assert backend.rows("codemode_state") == 1


async def test_the_state_bounds_are_per_subject(backend: Backend) -> None:
    store = backend.store
    await put(store, "alice", "a", max_keys=2)
    await put(store, "alice", "b", max_keys=2)
    with pytest.raises(StoreFull) as full:
        await put(store, "alice", "c", max_keys=2)
    assert full.value.kind == "state keys"
    await put(store, "alice", "b", "2", max_keys=2)  # replacing a key adds none
    await put(store, "bob", "c", max_keys=2)
    # bytes: key + value, UTF-8; a replaced value counts once
    await put(store, "carol", "k", "é" * 10, max_bytes=21)
    await put(store, "carol", "k", "x" * 20, max_bytes=21)
    with pytest.raises(StoreFull) as full:
        await put(store, "carol", "k", "x" * 21, max_bytes=21)
    assert full.value.kind == "state bytes"
    with pytest.raises(StoreFull):
        await put(store, "carol", "j", "", max_bytes=21)
    # expired keys count for nothing
    await put(store, "dave", "old", expires=NOW + 1, max_keys=1)
    await put(store, "dave", "new", now=NOW + 1, max_keys=1)
    entry = await store.state_get("carol", "k", NOW)
    assert entry is not None and entry.value == "x" * 20


async def test_list_pages_in_key_order(backend: Backend) -> None:
    store = backend.store
    keys = [f"a/{i:03d}" for i in range(25)] + ["a/é", "a/z", "a/\U0001f600", "a/\uffff", "a", "b/1", ""]
    for key in reversed(keys):
        await put(store, "alice", key, json.dumps(key))
    expected = sorted(k for k in keys if k.startswith("a/"))
    pages: list[list[str]] = []
    after = None
    while True:
        page = await store.state_list("alice", "a/", after=after, limit=10, now=NOW)
        if not page:
            break
        pages.append([e.key for e in page])
        after = page[-1].key
    assert [len(p) for p in pages] == [10, 10, 9]
    assert [k for p in pages for k in p] == expected  # code point order
    everything = await store.state_list("alice", "", after=None, limit=100, now=NOW)
    assert [e.key for e in everything] == sorted(keys)
    assert everything[0].key == ""
    assert await store.state_list("alice", "a/", after=None, limit=0, now=NOW) == []
    assert [e.key for e in await store.state_list("alice", "a", after="a/z", limit=100, now=NOW)] == [
        "a/é",
        "a/\uffff",
        "a/\U0001f600",
    ]
    assert await store.state_list("alice", "%", after=None, limit=10, now=NOW) == []  # not a pattern


# -- texts ---------------------------------------------------------------------------------------

SOURCE = 'def main():\r\n    s = "é\\u2028\U0001f600\\t"\n    return {"z": 1, "a": 2}\n\n'
BODY = (
    '{"z":1,"a":[9223372036854775807,123456789012345678901234567890,1.0000000000000001e+400],'
    '"dup":1,"dup":2,"é":"\u2028\\u0000","nested":{"b":{},"a":[]}}'
)


async def test_texts_come_back_exactly_as_given(backend: Backend) -> None:
    store = backend.store
    rec = record(source=SOURCE, body=BODY)
    await store.suspend(rec, max_records=10, max_bytes=BIG)
    other = backend.make()  # read back through another connection
    got = await other.claim(rec.id, "alice", NOW)
    assert got is not None
    assert (got.source, got.body) == (SOURCE, BODY)
    assert (got.created, got.expires) == (rec.created, rec.expires)
    await put(store, "alice", "k\u00e9y \U0001f600", BODY)
    entry = await other.state_get("alice", "k\u00e9y \U0001f600", NOW)
    assert entry is not None and entry.value == BODY
    assert rec.size == len(SOURCE.encode()) + len(BODY.encode())


async def test_texts_no_backend_can_keep_are_refused_alike(backend: Backend) -> None:
    store = backend.store
    await store.check()
    for bad in ("a\x00b", "\ud800"):
        with pytest.raises(ValueError):
            await put(store, "alice", bad)
        with pytest.raises(ValueError):
            await put(store, "alice", "k", bad)
        with pytest.raises(ValueError):
            await store.suspend(record(bad), max_records=10, max_bytes=BIG)
        assert await store.state_get("alice", bad, NOW) is None
        assert await store.state_get(bad, "k", NOW) is None
        assert await store.claim(bad, "alice", NOW) is None
        assert await store.state_list("alice", bad, after=None, limit=5, now=NOW) == []
        assert await store.state_delete("alice", bad, expect=None, now=NOW) is False
    assert backend.rows("codemode_state") == 0


async def test_postgres_keeps_texts_as_text_never_jsonb(postgres_dsn: str) -> None:
    from codemode.store.postgres import PostgresStore

    postgres.reset(postgres_dsn)
    store = PostgresStore(postgres_dsn)
    try:
        await store.check()
    finally:
        await store.aclose()
    types = postgres.query(
        postgres_dsn,
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_name LIKE 'codemode_%%' AND column_name IN ('source', 'body', 'value', 'key', 'id')",
    )
    assert len(types) == 5
    assert {t[2] for t in types} == {"text"}


# -- races across connections --------------------------------------------------------------------


async def test_two_stores_racing_to_claim_one_record_have_one_winner(backend: Backend) -> None:
    first, second = backend.store, backend.make()
    await first.check()
    await second.check()
    wins = [0, 0]
    rounds = 60
    for _ in range(rounds):
        rec = record()
        await first.suspend(rec, max_records=BIG, max_bytes=BIG)
        got = await asyncio.gather(first.claim(rec.id, "alice", NOW), second.claim(rec.id, "alice", NOW))
        assert sum(g is not None for g in got) == 1, got
        wins[got.index(next(g for g in got if g is not None))] += 1
        await first.drop(rec.id)
    assert sum(wins) == rounds


async def test_racing_writers_cannot_pass_a_subjects_bounds_together(backend: Backend) -> None:
    stores = [backend.store, backend.make(), backend.make()]
    for store in stores:
        await store.check()

    async def suspend(store: Store) -> bool:
        try:
            await store.suspend(record(), max_records=3, max_bytes=BIG)
        except StoreFull:
            return False
        return True

    async def put_key(store: Store, key: str) -> bool:
        try:
            await put(store, "alice", key, max_keys=3)
        except StoreFull:
            return False
        return True

    done = await asyncio.gather(*(suspend(stores[i % 3]) for i in range(12)))
    assert sum(done) == 3
    assert await backend.store.pending("alice") == 3
    done = await asyncio.gather(*(put_key(stores[i % 3], f"k{i}") for i in range(12)))
    assert sum(done) == 3
    assert backend.rows("codemode_state") == 3

    # compare-and-set from several connections: every success is a distinct version
    key = next(f"k{i}" for i, ok in enumerate(done) if ok)
    before = await backend.store.state_get("alice", key, NOW)
    assert before is not None
    results = await asyncio.gather(*(_cas(stores[i % 3], key) for i in range(9)))
    after = await backend.store.state_get("alice", key, NOW)
    assert after is not None
    won = [v for v in results if v]
    assert won and len(set(won)) == len(won)  # each success its own version
    assert min(won) > before.version and after.version == max(won)


async def _cas(store: Store, key: str) -> int:
    """The version a compare-and-set made, or 0 when another writer came first."""
    entry = await store.state_get("alice", key, NOW)
    assert entry is not None
    try:
        return (await put(store, "alice", key, str(entry.version), expect=entry.version)).version
    except StateConflict:
        return 0


# -- SQLite: the file ----------------------------------------------------------------------------


async def test_the_sqlite_file_is_private_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "data" / "store.sqlite3"
    old = os.umask(0o022)
    try:
        store = SqliteStore(path)
        rec = record()
        await store.suspend(rec, max_records=10, max_bytes=BIG)
        await put(store, "alice", "k", "1")
        companions = [Path(f"{path}{s}") for s in ("", "-wal", "-shm")]
        assert all(p.exists() for p in companions)
        assert {stat.S_IMODE(p.stat().st_mode) for p in companions} == {0o600}
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        await store.aclose()
    finally:
        os.umask(old)
    again = SqliteStore(path)
    try:
        assert await again.claim(rec.id, "alice", NOW) == rec
        assert await again.state_get("alice", "k", NOW) == StateEntry("k", "1", 1, None)
    finally:
        await again.aclose()


async def test_a_dropped_record_leaves_no_bytes_in_the_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    marker = "tenant-secret-" + secrets.token_hex(8)
    store = SqliteStore(path)
    rec = record(body=json.dumps({"result": marker * 20}))
    await store.suspend(rec, max_records=10, max_bytes=BIG)
    await put(store, "alice", "k", json.dumps(marker))
    await store.drop(rec.id)
    await store.state_delete("alice", "k", expect=None, now=NOW)
    await store.aclose()  # the last connection checkpoints the write-ahead log into the file
    assert not Path(f"{path}-wal").exists()
    assert marker.encode() not in path.read_bytes()
    # the control: without secure_delete (some SQLite builds' default) the bytes stay behind
    control = tmp_path / "control.sqlite3"
    with contextlib.closing(sqlite3.connect(control)) as db:
        db.execute("PRAGMA secure_delete=OFF")
        db.execute("CREATE TABLE t (v TEXT)")
        db.execute("INSERT INTO t VALUES (?)", (marker * 20,))
        db.commit()
        db.execute("DELETE FROM t")
        db.commit()
    assert marker.encode() in control.read_bytes()


async def test_an_unusable_sqlite_path_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = SqliteStore(blocker / "store.sqlite3")  # under a file: no directory can be made
    try:
        with pytest.raises(StoreUnavailable):
            await store.check()
        with pytest.raises(StoreUnavailable):
            await store.suspend(record(), max_records=1, max_bytes=BIG)
    finally:
        await store.aclose()


# -- PostgreSQL: unreachable ---------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _unavailable_within(store: Store, seconds: float) -> str:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as down:
        await store.check()
    with pytest.raises(StoreUnavailable):
        await store.claim("x" * 32, "alice", NOW)
    assert time.monotonic() - started < seconds
    return str(down.value)


async def test_a_refused_postgres_is_unavailable_at_once_and_names_no_password(postgres_dsn: str) -> None:
    from codemode.store.postgres import PostgresStore

    password = "s3cret-" + secrets.token_hex(8)
    dsn = f"postgresql://codemode:{password}@127.0.0.1:{_closed_port()}/codemode"
    store = PostgresStore(dsn, timeout=1.0)
    try:
        message = await _unavailable_within(store, 10)
    finally:
        await store.aclose()
    assert password not in message
    assert "127.0.0.1" in message


async def test_a_postgres_that_stops_answering_is_unavailable_within_the_timeout(postgres_dsn: str) -> None:
    from codemode.store.postgres import PostgresStore

    postgres.reset(postgres_dsn)
    relay = postgres.Relay(postgres_dsn)
    store = PostgresStore(await relay.start(), timeout=1.0)
    try:
        await store.check()
        rec = record()
        await store.suspend(rec, max_records=10, max_bytes=BIG)
        relay.freeze()  # a black hole: connections open, nothing answers
        await _unavailable_within(store, 10)
        await relay.cut()  # the server is gone: refused
        await _unavailable_within(store, 10)
    finally:
        await relay.cut()
        await store.aclose()
    # nothing was claimed while it was away
    direct = PostgresStore(postgres_dsn)
    try:
        assert await direct.claim(rec.id, "alice", NOW) == rec
    finally:
        await direct.aclose()


async def test_a_postgres_dsn_that_cannot_be_parsed_is_not_echoed() -> None:
    from codemode.store.postgres import PostgresStore

    with pytest.raises(ValueError) as bad:
        PostgresStore("host=db password=hunter2 oops")
    assert "hunter2" not in str(bad.value)


# -- the server's store --------------------------------------------------------------------------


async def test_the_builder_hands_its_store_to_the_server_which_closes_it(tmp_path: Path) -> None:
    from codemode import Builder, InvalidRegistration, authz

    store = SqliteStore(tmp_path / "store.sqlite3")
    server = Builder(authorizer=authz.allow_all(), store=store).build()
    assert server.plan.store is store
    await store.check()
    await server.aclose()
    with pytest.raises(StoreUnavailable):
        await store.check()  # closed with the server
    default = Builder(authorizer=authz.allow_all()).build()
    assert isinstance(default.plan.store, MemoryStore)  # library use: memory
    await default.aclose()
    with pytest.raises(InvalidRegistration, match="store: must be"):
        Builder(authorizer=authz.allow_all(), store=object()).build()  # type: ignore[arg-type]
