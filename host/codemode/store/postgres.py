"""The store in PostgreSQL: replicas that share suspensions and state (``store =
"postgresql://..."``).

- Texts are ``text`` columns, byte for byte what was given. Never ``jsonb``: it reorders an object's
  keys (and drops duplicates), so a result read back would iterate in another order than the one the
  program saw, and its replay would diverge.
- A claim is one ``UPDATE ... WHERE state = 'pending' ... RETURNING``: under PostgreSQL's row locks a
  second claim of the same record re-reads it after the first commits and matches nothing, so there
  is one winner across connections and replicas.
- A subject's bounds are checked and written in one transaction holding a transaction-level advisory
  lock of that subject (one for its suspensions, one for its state keys): two replicas cannot both
  pass the check and both write.
- Every operation is bounded by ``timeout`` (the pool's wait for a connection, ``connect_timeout``,
  ``statement_timeout`` and an overall deadline): past it, or when the server refuses or is gone, the
  store raises :class:`~codemode.store.StoreUnavailable`; nothing waits forever.
- The DSN holds a credential: messages name the store by host, port and database only, and any text
  from the driver is scrubbed of the password.

The schema is created when missing (tables ``codemode_schema``, ``codemode_suspensions``,
``codemode_state``), by one replica at a time; a database whose schema is newer than this code's is
refused. The database must be UTF8.
"""

from __future__ import annotations

import asyncio
import math
import select
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from . import StateConflict, StateEntry, StoreFull, StoreUnavailable, Suspension
from .rules import STATE_BYTES, STATE_KEYS, SUSPENSION_BYTES, SUSPENSIONS, check_texts, state_size, storable

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

T = TypeVar("T")

#: The schema this code writes (table ``codemode_schema``); a newer one is refused.
SCHEMA_VERSION = 1

#: The advisory lock that serializes schema creation between replicas (an arbitrary constant).
_SCHEMA_LOCK = 0x636F64656D6F6465

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS codemode_schema (version integer NOT NULL)",
    # text, never jsonb (see the module's text); key order of the state in code points ("C").
    """CREATE TABLE IF NOT EXISTS codemode_suspensions (
        id text COLLATE "C" PRIMARY KEY,
        subject_id text COLLATE "C" NOT NULL,
        created double precision NOT NULL,
        expires double precision NOT NULL,
        source text NOT NULL,
        body text NOT NULL,
        size bigint NOT NULL,
        state text NOT NULL DEFAULT 'pending'
    )""",
    "CREATE INDEX IF NOT EXISTS codemode_suspensions_subject ON codemode_suspensions (subject_id, state)",
    "CREATE INDEX IF NOT EXISTS codemode_suspensions_expires ON codemode_suspensions (expires)",
    """CREATE TABLE IF NOT EXISTS codemode_state (
        subject_id text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        value text NOT NULL,
        version bigint NOT NULL,
        expires double precision,
        size bigint NOT NULL,
        PRIMARY KEY (subject_id, key)
    )""",
    "CREATE INDEX IF NOT EXISTS codemode_state_expires ON codemode_state (expires) WHERE expires IS NOT NULL",
    # The last state version given to each subject: never given twice, so a key deleted (or
    # expired) and made again does not repeat one, and a stale compare-and-set fails (ABA).
    """CREATE TABLE IF NOT EXISTS codemode_state_versions (
        subject_id text COLLATE "C" PRIMARY KEY,
        last bigint NOT NULL
    )""",
    # A suspend and a state put are one function each: the subject's lock, the bound and the write
    # in one statement, one round trip (the lock keys are _lock_subject's).
    """CREATE OR REPLACE FUNCTION codemode_suspend(
        p_id text, p_subject text, p_created double precision, p_expires double precision,
        p_source text, p_body text, p_size bigint, p_max_records bigint, p_max_bytes bigint
    ) RETURNS text LANGUAGE plpgsql AS $$
    DECLARE n bigint; used bigint;
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended('codemode:suspensions:' || p_subject, 0));
        SELECT count(*), coalesce(sum(size), 0) INTO n, used FROM codemode_suspensions
            WHERE subject_id = p_subject AND state = 'pending' AND expires > p_created;
        IF n + 1 > p_max_records THEN RETURN 'suspensions'; END IF;
        IF used + p_size > p_max_bytes THEN RETURN 'suspension bytes'; END IF;
        INSERT INTO codemode_suspensions (id, subject_id, created, expires, source, body, size)
            VALUES (p_id, p_subject, p_created, p_expires, p_source, p_body, p_size)
            ON CONFLICT (id) DO NOTHING;
        IF NOT FOUND THEN RETURN 'taken'; END IF;
        RETURN 'ok';
    END $$""",
    """CREATE OR REPLACE FUNCTION codemode_state_put(
        p_subject text, p_key text, p_value text, p_expect bigint, p_expires double precision,
        p_now double precision, p_size bigint, p_max_keys bigint, p_max_bytes bigint
    ) RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE old bigint; n bigint; used bigint; given bigint;
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended('codemode:state:' || p_subject, 0));
        SELECT version INTO old FROM codemode_state
            WHERE subject_id = p_subject AND key = p_key AND (expires IS NULL OR expires > p_now);
        old := coalesce(old, 0);
        IF p_expect IS NOT NULL AND p_expect <> old THEN RETURN -1; END IF;
        SELECT count(*), coalesce(sum(size), 0) INTO n, used FROM codemode_state
            WHERE subject_id = p_subject AND key <> p_key AND (expires IS NULL OR expires > p_now);
        IF n + 1 > p_max_keys THEN RETURN -2; END IF;
        IF used + p_size > p_max_bytes THEN RETURN -3; END IF;
        INSERT INTO codemode_state_versions AS v (subject_id, last) VALUES (p_subject, 1)
            ON CONFLICT (subject_id) DO UPDATE SET last = v.last + 1 RETURNING last INTO given;
        INSERT INTO codemode_state (subject_id, key, value, version, expires, size)
            VALUES (p_subject, p_key, p_value, given, p_expires, p_size)
            ON CONFLICT (subject_id, key) DO UPDATE SET value = excluded.value,
                version = excluded.version, expires = excluded.expires, size = excluded.size;
        RETURN given;
    END $$""",
)

_LIVE = "(expires IS NULL OR expires > %s)"
#: Bounds past PostgreSQL's bigint are no bound at all.
_BIGINT = 2**63 - 1
_COLUMNS = "id, subject_id, created, expires, source, body"


class PostgresStore:
    """Suspensions and state in the PostgreSQL database ``dsn`` names (see the module's text).

    Args:
        dsn: a libpq connection string or URI (``postgresql://user:password@host:5432/db``); use
            ``sslmode=verify-full`` across a network.
        timeout: seconds one operation may take in all (connecting included).
        max_connections: the pool's connections at most (one is kept open).

    Raises (the constructor):
        ValueError: the DSN cannot be parsed (the message holds none of it).
    """

    name = "postgres"

    def __init__(self, dsn: str, *, timeout: float = 2.0, max_connections: int = 8) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be more than 0")
        try:
            info = conninfo_to_dict(dsn)
        except Exception:
            raise ValueError("the PostgreSQL connection string cannot be parsed") from None
        self.timeout = timeout
        password = info.get("password")
        self._secrets = [str(password)] if password else []
        self.where = (
            f"postgres store at {info.get('host') or 'the default socket'}:{info.get('port') or 5432}"
            f"/{info.get('dbname') or ''}"
        )
        self._pool = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max(1, max_connections),
            open=False,
            timeout=timeout,
            kwargs={"autocommit": True, "connect_timeout": max(2, math.ceil(timeout))},
            configure=self._configure,
            # A connection is checked before it is handed out (without a round trip, see
            # _check): after a server restart or a cut network the pool's old connections are
            # dropped there, so one failed operation is not followed by one more for each
            # connection the pool still holds.
            check=_check,
            name="codemode-store",
        )
        self._opened = False
        self._schema_ready = False
        self._closed = False
        self._lock: asyncio.Lock | None = None
        self._abandoned: set[asyncio.Task[Any]] = set()

    # -- connections ---------------------------------------------------------------------------

    async def _configure(self, conn: AsyncConnection[Any]) -> None:
        milliseconds = max(1, int(self.timeout * 1000))
        await conn.execute(f"SET statement_timeout = {milliseconds}")
        await conn.execute(f"SET lock_timeout = {milliseconds}")
        await conn.execute(f"SET idle_in_transaction_session_timeout = {max(milliseconds, 10_000)}")

    async def _ready(self) -> AsyncConnectionPool[Any]:
        if self._closed:
            raise StoreUnavailable(f"{self.where}: closed")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._opened:
                await self._pool.open(wait=False)
                self._opened = True
            if not self._schema_ready:
                async with self._pool.connection() as conn:
                    await _create_schema(conn)
                self._schema_ready = True
        return self._pool

    async def _run(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run ``work`` on a pooled connection; the caller waits ``timeout`` at most. Past it the
        operation is cancelled in the background: psycopg's clean-up of a cancelled query (a cancel
        request, then closing the connection) may itself wait on a server that does not answer,
        and the caller must not."""
        task = asyncio.get_running_loop().create_task(self._on_connection(work))
        done, _ = await asyncio.wait({task}, timeout=self.timeout)
        if not done:
            task.cancel()
            self._abandoned.add(task)
            task.add_done_callback(self._forget)
            raise StoreUnavailable(f"{self.where}: no answer within {self.timeout:g} s")
        try:
            return task.result()
        except PoolTimeout:
            raise StoreUnavailable(
                f"{self.where}: no connection within {self.timeout:g} s (refused, unreachable or all busy)"
            ) from None
        except psycopg.Error as exc:
            raise StoreUnavailable(f"{self.where}: {type(exc).__name__}: {self._scrub(exc)}") from None
        except OSError as exc:
            raise StoreUnavailable(f"{self.where}: {type(exc).__name__}: {self._scrub(exc)}") from None

    async def _on_connection(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        pool = await self._ready()
        async with pool.connection() as conn:
            return await work(conn)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._abandoned.discard(task)
        if not task.cancelled():
            task.exception()  # seen: it was reported as StoreUnavailable

    def _scrub(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split())
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    # -- suspensions ---------------------------------------------------------------------------

    async def suspend(self, record: Suspension, *, max_records: int, max_bytes: int) -> None:
        """Keep ``record`` as pending (:meth:`codemode.store.Store.suspend`); the subject's bounds
        are checked and the record written under the subject's advisory lock."""
        check_texts(record.id, record.subject_id, record.source, record.body)

        async def work(conn: AsyncConnection[Any]) -> str:
            cur = await conn.execute(
                "SELECT codemode_suspend(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    record.id,
                    record.subject_id,
                    record.created,
                    record.expires,
                    record.source,
                    record.body,
                    record.size,
                    min(max_records, _BIGINT),
                    min(max_bytes, _BIGINT),
                ),
            )
            return str((await _one(cur))[0])

        outcome = await self._run(work)
        if outcome == "taken":
            raise ValueError("a suspension with this id exists")
        if outcome in (SUSPENSIONS, SUSPENSION_BYTES):
            raise StoreFull(outcome)
        if outcome != "ok":
            raise StoreUnavailable(f"{self.where}: codemode_suspend answered {outcome[:40]!r}")

    async def claim(self, record_id: str, subject_id: str, now: float) -> Suspension | None:
        """Take a pending suspension, one winner across replicas (:meth:`codemode.store.Store.claim`)."""
        if not storable(record_id, subject_id):
            return None  # no stored record holds such a text (and PostgreSQL would refuse it)

        async def work(conn: AsyncConnection[Any]) -> Any:
            cur = await conn.execute(
                "UPDATE codemode_suspensions SET state = 'claimed' "
                "WHERE id = %s AND subject_id = %s AND state = 'pending' AND expires > %s "
                f"RETURNING {_COLUMNS}",
                (record_id, subject_id, now),
            )
            return await cur.fetchone()

        row = await self._run(work)
        return None if row is None else Suspension(*row)

    async def drop(self, record_id: str) -> None:
        """Forget a suspension (:meth:`codemode.store.Store.drop`)."""

        async def work(conn: AsyncConnection[Any]) -> None:
            await conn.execute("DELETE FROM codemode_suspensions WHERE id = %s", (record_id,))

        await self._run(work)

    async def expire(self, now: float) -> int:
        """Forget every record whose time has passed (:meth:`codemode.store.Store.expire`)."""

        async def work(conn: AsyncConnection[Any]) -> int:
            async with conn.transaction():
                first = await conn.execute("DELETE FROM codemode_suspensions WHERE expires <= %s", (now,))
                second = await conn.execute(
                    "DELETE FROM codemode_state WHERE expires IS NOT NULL AND expires <= %s", (now,)
                )
                return max(first.rowcount, 0) + max(second.rowcount, 0)

        return await self._run(work)

    async def pending(self, subject_id: str | None = None) -> int:
        """Pending suspensions (:meth:`codemode.store.Store.pending`)."""

        async def work(conn: AsyncConnection[Any]) -> int:
            if subject_id is None:
                cur = await conn.execute("SELECT count(*) FROM codemode_suspensions WHERE state = 'pending'")
            else:
                cur = await conn.execute(
                    "SELECT count(*) FROM codemode_suspensions WHERE state = 'pending' AND subject_id = %s",
                    (subject_id,),
                )
            return int((await _one(cur))[0])

        return await self._run(work)

    # -- state ---------------------------------------------------------------------------------

    async def state_get(self, subject_id: str, key: str, now: float) -> StateEntry | None:
        """The subject's key (:meth:`codemode.store.Store.state_get`)."""
        if not storable(subject_id, key):
            return None

        async def work(conn: AsyncConnection[Any]) -> Any:
            cur = await conn.execute(
                f"SELECT key, value, version, expires FROM codemode_state "
                f"WHERE subject_id = %s AND key = %s AND {_LIVE}",
                (subject_id, key, now),
            )
            return await cur.fetchone()

        row = await self._run(work)
        return None if row is None else StateEntry(*row)

    async def state_put(
        self,
        subject_id: str,
        key: str,
        value: str,
        *,
        expect: int | None,
        expires: float | None,
        now: float,
        max_keys: int,
        max_bytes: int,
    ) -> StateEntry:
        """Set the subject's key (:meth:`codemode.store.Store.state_put`); the version check, the
        bounds and the write happen under the subject's advisory lock."""
        check_texts(subject_id, key, value)
        size = state_size(key, value)

        async def work(conn: AsyncConnection[Any]) -> int:
            cur = await conn.execute(
                "SELECT codemode_state_put(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    subject_id,
                    key,
                    value,
                    expect,
                    expires,
                    now,
                    size,
                    min(max_keys, _BIGINT),
                    min(max_bytes, _BIGINT),
                ),
            )
            return int((await _one(cur))[0])

        version = await self._run(work)
        if version == -1:
            raise StateConflict()
        if version == -2:
            raise StoreFull(STATE_KEYS)
        if version == -3:
            raise StoreFull(STATE_BYTES)
        return StateEntry(key, value, version, expires)

    async def state_delete(self, subject_id: str, key: str, *, expect: int | None, now: float) -> bool:
        """Remove the subject's key (:meth:`codemode.store.Store.state_delete`)."""
        if not storable(subject_id, key):
            if expect:
                raise StateConflict()
            return False

        async def work(conn: AsyncConnection[Any]) -> bool | None:
            async with conn.transaction():
                await _lock_subject(conn, "state", subject_id)
                cur = await conn.execute(
                    f"SELECT version FROM codemode_state WHERE subject_id = %s AND key = %s AND {_LIVE}",
                    (subject_id, key, now),
                )
                old = await cur.fetchone()
                if expect is not None and expect != (int(old[0]) if old is not None else 0):
                    return None
                await conn.execute(
                    "DELETE FROM codemode_state WHERE subject_id = %s AND key = %s", (subject_id, key)
                )
                return old is not None

        out = await self._run(work)
        if out is None:
            raise StateConflict()
        return out

    async def state_list(
        self, subject_id: str, prefix: str, *, after: str | None, limit: int, now: float
    ) -> list[StateEntry]:
        """The subject's keys (:meth:`codemode.store.Store.state_list`), in code point order: the ``C``
        collation of a UTF8 database."""
        if not storable(subject_id, prefix, after or ""):
            return []

        async def work(conn: AsyncConnection[Any]) -> list[Any]:
            cur = await conn.execute(
                f"SELECT key, value, version, expires FROM codemode_state "
                f"WHERE subject_id = %s AND left(key, %s) = %s AND (%s::text IS NULL OR key > %s) "
                f"AND {_LIVE} ORDER BY key LIMIT %s",
                (subject_id, len(prefix), prefix, after, after, now, max(limit, 0)),
            )
            return await cur.fetchall()

        return [StateEntry(*row) for row in await self._run(work)]

    # -- life ----------------------------------------------------------------------------------

    async def check(self) -> None:
        """Readiness: the database answers a query within ``timeout`` (its schema created).

        Raises:
            StoreUnavailable: it does not.
        """

        async def work(conn: AsyncConnection[Any]) -> None:
            await conn.execute("SELECT 1 FROM codemode_schema LIMIT 1")

        await self._run(work)

    async def aclose(self) -> None:
        """Close the pool's connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._abandoned):
            task.cancel()
        if self._abandoned:
            await asyncio.wait(set(self._abandoned), timeout=self.timeout)
        if self._opened:
            await self._pool.close(timeout=self.timeout)


async def _check(conn: AsyncConnection[Any]) -> None:
    """An idle connection is usable unless it is closed or its socket is readable: the server says
    nothing on an idle connection except to end it (a shutdown's FATAL message, then EOF), so
    readable means gone. No round trip (psycopg's own check costs one per operation); a network
    that silently drops everything is caught by the operation's timeout instead."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        await conn.close()  # closed, the pool discards it (a connection merely refused goes back)
        raise psycopg.OperationalError("the server ended an idle connection")


async def _one(cur: psycopg.AsyncCursor[Any]) -> Any:
    row = await cur.fetchone()
    assert row is not None  # an aggregate always answers one row
    return row


async def _lock_subject(conn: AsyncConnection[Any], facet: str, subject_id: str) -> None:
    """Hold the subject's advisory lock of ``facet`` until the transaction ends."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"codemode:{facet}:{subject_id}",)
    )


async def _create_schema(conn: AsyncConnection[Any]) -> None:
    async with conn.transaction():
        cur = await conn.execute("SHOW server_encoding")
        encoding = str((await _one(cur))[0])
        if encoding.upper() not in ("UTF8", "UTF-8"):
            raise psycopg.DataError(f"the database's encoding is {encoding}; codemode's store needs UTF8")
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        for statement in _SCHEMA:
            await conn.execute(statement)
        cur = await conn.execute("SELECT max(version) FROM codemode_schema")
        version = (await _one(cur))[0]
        if version is None:
            await conn.execute("INSERT INTO codemode_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
        elif version > SCHEMA_VERSION:
            raise psycopg.DataError(
                f"the schema's version {version} is newer than this codemode's ({SCHEMA_VERSION})"
            )
