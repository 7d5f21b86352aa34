"""The store in one SQLite file: the default for one host (``store = "sqlite"``: a file in the data
dir).

The file and its ``-wal``/``-shm`` companions are created mode 0600 (the host's user alone reads
them). Every statement runs on one thread of the store's own (stdlib ``sqlite3`` blocks), never on the
event loop; that thread owns the one connection, so statements run one at a time and each method is a
transaction of its own (``BEGIN IMMEDIATE``: a second process on the same file waits its turn, up to
the busy timeout). Texts are kept as ``TEXT``, byte for byte what was given.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from . import StateConflict, StateEntry, StoreFull, StoreUnavailable, Suspension
from .rules import STATE_BYTES, STATE_KEYS, SUSPENSION_BYTES, SUSPENSIONS, check_texts, state_size, storable

__all__ = ["SCHEMA_VERSION", "SqliteStore"]

T = TypeVar("T")

#: The schema this code writes (table ``codemode_schema``); a newer file is refused.
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS codemode_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS codemode_suspensions (
    id TEXT PRIMARY KEY,
    subject_id TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL,
    source TEXT NOT NULL,
    body TEXT NOT NULL,
    size INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending'
);
CREATE INDEX IF NOT EXISTS codemode_suspensions_subject ON codemode_suspensions (subject_id, state);
CREATE INDEX IF NOT EXISTS codemode_suspensions_expires ON codemode_suspensions (expires);
CREATE TABLE IF NOT EXISTS codemode_state (
    subject_id TEXT NOT NULL,
    key TEXT NOT NULL,
    version INTEGER NOT NULL,
    expires REAL,
    size INTEGER NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (subject_id, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS codemode_state_versions (
    subject_id TEXT PRIMARY KEY,
    last INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS codemode_state_expires ON codemode_state (expires) WHERE expires IS NOT NULL;
"""

_LIVE = "(expires IS NULL OR expires > ?)"
#: The subject's next state version: never given twice, so a key deleted (or expired) and made again
#: does not repeat one, and a compare-and-set by a stale reader fails (ABA).
_NEXT_VERSION = (
    "INSERT INTO codemode_state_versions (subject_id, last) VALUES (?, 1) "
    "ON CONFLICT (subject_id) DO UPDATE SET last = last + 1 RETURNING last"
)
# The state is clustered by subject (WITHOUT ROWID, the value last): a put's bound check reads one
# subject's rows side by side and never a value (2,000 keys: 0.45 ms a put, 3.5 ms with rowids).


class SqliteStore:
    """Suspensions and state in the SQLite file ``path`` (see the module's text).

    Args:
        path: the file (its directory is created, mode 0700, when missing).
        busy_timeout: seconds a statement waits for another process's lock before the store is
            unavailable.
    """

    name = "sqlite"

    def __init__(self, path: str | Path, *, busy_timeout: float = 5.0) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="codemode-store"
        )
        self._db: sqlite3.Connection | None = None
        self._closed = False

    # -- the thread ----------------------------------------------------------------------------

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreUnavailable(f"sqlite store {self.path}: closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, self._in_thread, work)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {type(exc).__name__}: {exc}") from None
        except OSError as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from None

    def _in_thread(self, work: Callable[[sqlite3.Connection], T]) -> T:
        db = self._connection()
        db.execute("BEGIN IMMEDIATE")
        try:
            out = work(db)
        except BaseException:
            db.rollback()
            raise
        db.commit()
        return out

    def _connection(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Created 0600 before SQLite opens it: SQLite keeps an existing file's mode and gives the
        # -wal and -shm files it creates the main file's (left over ones are tightened too).
        _create_private(self.path)
        for suffix in ("-wal", "-shm"):
            companion = Path(f"{self.path}{suffix}")
            if companion.exists():
                os.chmod(companion, 0o600, follow_symlinks=False)
        db = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            # A deleted record's bytes are overwritten, not left in free pages (tenant data).
            db.execute("PRAGMA secure_delete=ON")
            db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
            db.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            row = db.execute("SELECT max(version) FROM codemode_schema").fetchone()
            if row[0] is None:
                db.execute("INSERT INTO codemode_schema (version) VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] > SCHEMA_VERSION:
                raise sqlite3.DatabaseError(
                    f"schema version {row[0]} is newer than this codemode's ({SCHEMA_VERSION})"
                )
            db.commit()
        except BaseException:
            db.close()
            raise
        self._db = db
        return db

    # -- suspensions ---------------------------------------------------------------------------

    async def suspend(self, record: Suspension, *, max_records: int, max_bytes: int) -> None:
        """Keep ``record`` as pending (:meth:`codemode.store.Store.suspend`)."""
        check_texts(record.id, record.subject_id, record.source, record.body)

        def work(db: sqlite3.Connection) -> str | None:
            count, used = db.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM codemode_suspensions "
                "WHERE subject_id = ? AND state = 'pending' AND expires > ?",
                (record.subject_id, record.created),
            ).fetchone()
            if count + 1 > max_records:
                return SUSPENSIONS
            if used + record.size > max_bytes:
                return SUSPENSION_BYTES
            try:
                db.execute(
                    "INSERT INTO codemode_suspensions (id, subject_id, created, expires, source, body, size) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        record.id,
                        record.subject_id,
                        record.created,
                        record.expires,
                        record.source,
                        record.body,
                        record.size,
                    ),
                )
            except sqlite3.IntegrityError:
                return ""
            return None

        full = await self._run(work)
        if full == "":
            raise ValueError("a suspension with this id exists")
        if full is not None:
            raise StoreFull(full)

    async def claim(self, record_id: str, subject_id: str, now: float) -> Suspension | None:
        """Take a pending suspension, one winner (:meth:`codemode.store.Store.claim`)."""
        if not storable(record_id, subject_id):
            return None

        def work(db: sqlite3.Connection) -> Any:
            return db.execute(
                "UPDATE codemode_suspensions SET state = 'claimed' "
                "WHERE id = ? AND subject_id = ? AND state = 'pending' AND expires > ? "
                "RETURNING id, subject_id, created, expires, source, body",
                (record_id, subject_id, now),
            ).fetchone()

        row = await self._run(work)
        return None if row is None else Suspension(*row)

    async def drop(self, record_id: str) -> None:
        """Forget a suspension (:meth:`codemode.store.Store.drop`)."""
        await self._run(lambda db: db.execute("DELETE FROM codemode_suspensions WHERE id = ?", (record_id,)))

    async def expire(self, now: float) -> int:
        """Forget every record whose time has passed (:meth:`codemode.store.Store.expire`)."""

        def work(db: sqlite3.Connection) -> int:
            gone = db.execute("DELETE FROM codemode_suspensions WHERE expires <= ?", (now,)).rowcount
            gone += db.execute(
                "DELETE FROM codemode_state WHERE expires IS NOT NULL AND expires <= ?", (now,)
            ).rowcount
            return int(gone)

        return await self._run(work)

    async def pending(self, subject_id: str | None = None) -> int:
        """Pending suspensions (:meth:`codemode.store.Store.pending`)."""

        def work(db: sqlite3.Connection) -> int:
            if subject_id is None:
                row = db.execute("SELECT count(*) FROM codemode_suspensions WHERE state = 'pending'")
            else:
                row = db.execute(
                    "SELECT count(*) FROM codemode_suspensions WHERE state = 'pending' AND subject_id = ?",
                    (subject_id,),
                )
            return int(row.fetchone()[0])

        return await self._run(work)

    # -- state ---------------------------------------------------------------------------------

    async def state_get(self, subject_id: str, key: str, now: float) -> StateEntry | None:
        """The subject's key (:meth:`codemode.store.Store.state_get`)."""
        if not storable(subject_id, key):
            return None

        def work(db: sqlite3.Connection) -> Any:
            return db.execute(
                f"SELECT key, value, version, expires FROM codemode_state "
                f"WHERE subject_id = ? AND key = ? AND {_LIVE}",
                (subject_id, key, now),
            ).fetchone()

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
        """Set the subject's key (:meth:`codemode.store.Store.state_put`)."""
        check_texts(subject_id, key, value)
        size = state_size(key, value)

        def work(db: sqlite3.Connection) -> StateEntry | Exception:
            old = db.execute(
                f"SELECT version FROM codemode_state WHERE subject_id = ? AND key = ? AND {_LIVE}",
                (subject_id, key, now),
            ).fetchone()
            version = old[0] if old is not None else 0
            if expect is not None and expect != version:
                return StateConflict()
            count, used = db.execute(
                f"SELECT count(*), coalesce(sum(size), 0) FROM codemode_state "
                f"WHERE subject_id = ? AND key != ? AND {_LIVE}",
                (subject_id, key, now),
            ).fetchone()
            if count + 1 > max_keys:
                return StoreFull(STATE_KEYS)
            if used + size > max_bytes:
                return StoreFull(STATE_BYTES)
            (version,) = db.execute(_NEXT_VERSION, (subject_id,)).fetchone()
            db.execute(
                "INSERT INTO codemode_state (subject_id, key, value, version, expires, size) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (subject_id, key) DO UPDATE SET "
                "value = excluded.value, version = excluded.version, expires = excluded.expires, "
                "size = excluded.size",
                (subject_id, key, value, version, expires, size),
            )
            return StateEntry(key, value, version, expires)

        out = await self._run(work)
        if isinstance(out, Exception):
            raise out
        return out

    async def state_delete(self, subject_id: str, key: str, *, expect: int | None, now: float) -> bool:
        """Remove the subject's key (:meth:`codemode.store.Store.state_delete`)."""
        if not storable(subject_id, key):
            if expect:
                raise StateConflict()
            return False

        def work(db: sqlite3.Connection) -> bool | None:
            old = db.execute(
                f"SELECT version FROM codemode_state WHERE subject_id = ? AND key = ? AND {_LIVE}",
                (subject_id, key, now),
            ).fetchone()
            if expect is not None and expect != (old[0] if old is not None else 0):
                return None
            db.execute("DELETE FROM codemode_state WHERE subject_id = ? AND key = ?", (subject_id, key))
            return old is not None

        out = await self._run(work)
        if out is None:
            raise StateConflict()
        return out

    async def state_list(
        self, subject_id: str, prefix: str, *, after: str | None, limit: int, now: float
    ) -> list[StateEntry]:
        """The subject's keys (:meth:`codemode.store.Store.state_list`), in code point order: SQLite
        compares UTF-8 bytes."""
        if not storable(subject_id, prefix, after or ""):
            return []

        def work(db: sqlite3.Connection) -> list[Any]:
            return db.execute(
                f"SELECT key, value, version, expires FROM codemode_state "
                f"WHERE subject_id = ? AND substr(key, 1, ?) = ? AND (? IS NULL OR key > ?) AND {_LIVE} "
                f"ORDER BY key LIMIT ?",
                (subject_id, len(prefix), prefix, after, after, now, max(limit, 0)),
            ).fetchall()

        return [StateEntry(*row) for row in await self._run(work)]

    # -- life ----------------------------------------------------------------------------------

    async def check(self) -> None:
        """Readiness: the file opens and answers a read.

        Raises:
            StoreUnavailable: it does not.
        """
        await self._run(lambda db: db.execute("SELECT count(*) FROM codemode_schema").fetchone())

    async def aclose(self) -> None:
        """Close the connection and the store's thread (idempotent)."""
        if self._closed:
            return
        self._closed = True

        def close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.get_running_loop().run_in_executor(self._thread, close)
        self._thread.shutdown(wait=True)


def _create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it is missing; tighten an existing file to 0600."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600, follow_symlinks=False)
        return
    os.close(fd)
