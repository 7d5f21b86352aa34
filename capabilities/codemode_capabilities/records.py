"""A SQLite-backed records store: the first real capability pack.

Load it with ``--pack codemode_capabilities.records:pack``. What it offers (the five capabilities,
ownership, per-subject ids, search, validation, quotas, storage, file modes) is docs/mcp.md, "The
records pack". For the code reader: :class:`RecordStore` is the store (one connection guarded by a
lock; every query filters by owner, so a missing record and another subject's read the same),
:class:`RecordHandlers` binds it to the capabilities' handlers (sync: the host runs them in
threads), :func:`capabilities` registers them, and :class:`RecordsPack` opens one store per built
server from the pack options.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from codemode import AgentError, CallContext, Capability
from codemode.authz import Subject
from codemode.packs import PackSettings

__all__ = [
    "DB_ENV",
    "DB_FILE",
    "DEFAULT_LIMIT",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_RECORDS",
    "MAX_BODY",
    "MAX_BYTES_ENV",
    "MAX_LIMIT",
    "MAX_RECORDS_ENV",
    "MAX_SEARCH_TEXT",
    "MAX_TAG",
    "MAX_TAGS",
    "MAX_TITLE",
    "QUOTA_EXCEEDED",
    "SIDE_FILES",
    "CreateInput",
    "DeleteInput",
    "DeleteOutput",
    "GetInput",
    "Record",
    "RecordHandlers",
    "RecordStore",
    "RecordsPack",
    "SearchInput",
    "SearchOutput",
    "UpdateInput",
    "capabilities",
    "pack",
]

log = logging.getLogger("codemode.capabilities.records")

#: The pack options (or environment variables): the database, the two per-subject quotas.
DB_ENV = "CODEMODE_RECORDS_DB"
MAX_RECORDS_ENV = "CODEMODE_RECORDS_MAX_RECORDS"
MAX_BYTES_ENV = "CODEMODE_RECORDS_MAX_BYTES"
#: The database's name in the host's data directory.
DB_FILE = "records.sqlite3"
#: What SQLite keeps beside a database ``F``: ``F-wal``, ``F-shm`` (WAL mode), ``F-journal``.
SIDE_FILES = ("-wal", "-shm", "-journal")
#: Per-subject quotas: records, and UTF-8 bytes of their titles, bodies and tags.
DEFAULT_MAX_RECORDS = 1_000
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
#: The ``AgentError`` text of a create or update over a quota.
QUOTA_EXCEEDED = "storage quota exceeded"
#: Input bounds, in characters (tags: per record).
MAX_SEARCH_TEXT = 200
MAX_TITLE = 200
MAX_BODY = 20_000
MAX_TAGS = 16
MAX_TAG = 50
#: ``records.search``'s ``limit``: when omitted, and at most.
DEFAULT_LIMIT = 20
MAX_LIMIT = 100


@dataclass
class Record:
    """One record, as the capabilities return it.

    Attributes:
        id: its id, numbered per owner.
        title: its title.
        body: its body text.
        tags: its tags, in the order given.
        created_at: when it was created (UTC, ISO 8601 with microseconds and ``Z``).
        updated_at: when it last changed (same form).
    """

    id: int
    title: str
    body: str
    tags: list[str]
    created_at: str
    updated_at: str


@dataclass
class CreateInput:
    """``records.create``'s arguments.

    Attributes:
        title: 1 to 200 characters after trimming.
        body: optional text of at most 20,000 characters.
        tags: optional labels (at most 16 distinct, 1 to 50 characters each).
    """

    title: str
    body: str | None = None
    tags: list[str] | None = None


@dataclass
class GetInput:
    """``records.get``'s arguments.

    Attributes:
        id: the record's id.
    """

    id: int


@dataclass
class SearchInput:
    """``records.search``'s arguments.

    Attributes:
        text: matched in titles, bodies and tags (at most 200 characters).
        tag: an exact tag (at most 50 characters).
        limit: records returned, 1 to 100 (default 20).
    """

    text: str | None = None
    tag: str | None = None
    limit: int | None = None


@dataclass
class SearchOutput:
    """``records.search``'s result.

    Attributes:
        records: the matching records, by id.
        truncated: whether more matched than ``limit``.
    """

    records: list[Record] = field(default_factory=list)
    truncated: bool = False


@dataclass
class UpdateInput:
    """``records.update``'s arguments (an omitted field keeps its value).

    Attributes:
        id: the record's id.
        title: a new title.
        body: a new body.
        tags: new tags (replacing the old ones).
    """

    id: int
    title: str | None = None
    body: str | None = None
    tags: list[str] | None = None


@dataclass
class DeleteInput:
    """``records.delete``'s arguments.

    Attributes:
        id: the record's id.
    """

    id: int


@dataclass
class DeleteOutput:
    """``records.delete``'s result.

    Attributes:
        id: the deleted record's id.
        deleted: always true (a missing record fails instead).
    """

    id: int
    deleted: bool


_SCHEMA = """
CREATE TABLE IF NOT EXISTS owners (
    owner TEXT PRIMARY KEY,
    next_id INTEGER NOT NULL,
    records INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
    owner TEXT NOT NULL,
    id INTEGER NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    size INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (owner, id)
);
CREATE TABLE IF NOT EXISTS entry_tags (
    owner TEXT NOT NULL,
    record_id INTEGER NOT NULL,
    position INTEGER NOT NULL,
    tag TEXT NOT NULL,
    PRIMARY KEY (owner, record_id, position),
    FOREIGN KEY (owner, record_id) REFERENCES entries(owner, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS entry_tags_tag ON entry_tags(owner, tag);
"""

# The first schema numbered records globally (records / record_tags); its ids are unique, so each
# record keeps its id under its owner and each owner's counter continues after its largest id.
_MIGRATE_V1 = """
INSERT INTO entries (owner, id, title, body, size, created_at, updated_at)
    SELECT owner, id, title, body, length(CAST(title AS BLOB)) + length(CAST(body AS BLOB)),
           created_at, updated_at FROM records;
INSERT INTO entry_tags (owner, record_id, position, tag)
    SELECT r.owner, t.record_id, t.position, t.tag FROM record_tags t JOIN records r ON r.id = t.record_id;
UPDATE entries SET size = size + coalesce((SELECT sum(length(CAST(t.tag AS BLOB))) FROM entry_tags t
    WHERE t.owner = entries.owner AND t.record_id = entries.id), 0);
INSERT INTO owners (owner, next_id, records, bytes)
    SELECT owner, max(id) + 1, count(*), sum(size) FROM entries GROUP BY owner;
DROP TABLE record_tags;
DROP TABLE records;
"""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _check_title(title: str) -> str:
    title = title.strip()
    if not 1 <= len(title) <= MAX_TITLE:
        raise AgentError(f"title must be 1 to {MAX_TITLE} characters (after trimming spaces)")
    return title


def _check_body(body: str | None) -> str:
    body = body or ""
    if len(body) > MAX_BODY:
        raise AgentError(f"body must be at most {MAX_BODY} characters")
    return body


def _check_tags(tags: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for tag in tags or []:
        tag = tag.strip()
        if not 1 <= len(tag) <= MAX_TAG:
            raise AgentError(f"each tag must be 1 to {MAX_TAG} characters (after trimming spaces)")
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise AgentError(f"at most {MAX_TAGS} distinct tags per record")
    return out


def _check_search(text: str | None, tag: str | None) -> tuple[str | None, str | None]:
    text = text.strip() if text is not None else None
    tag = tag.strip() if tag is not None else None
    if text is not None and len(text) > MAX_SEARCH_TEXT:
        raise AgentError(f"search text must be at most {MAX_SEARCH_TEXT} characters")
    if tag is not None and len(tag) > MAX_TAG:
        raise AgentError(f"search tag must be at most {MAX_TAG} characters")
    return text or None, tag or None


def _size(title: str, body: str, tags: Sequence[str]) -> int:
    return len(title.encode("utf-8")) + len(body.encode("utf-8")) + sum(len(t.encode("utf-8")) for t in tags)


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _make_private(path: str) -> None:
    """Create the database ``0600`` if it is missing and take group and other bits away from it and
    from the side files already there. SQLite creates each side file with the database's mode."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            _tighten(fd, path)
    finally:
        os.close(fd)
    for suffix in SIDE_FILES:
        side = path + suffix
        try:
            info = os.lstat(side)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_mode & 0o077:
            _tighten(side, side)


def _tighten(target: str | int, path: str) -> None:
    """``chmod 0600`` of ``target`` (the file ``path``, or an open descriptor of it)."""
    try:
        os.chmod(target, 0o600)
    except OSError as exc:
        log.warning("records store: %s is readable by other users and cannot be made 0600: %s", path, exc)
    else:
        log.warning("records store: %s was readable by other users; it is now 0600", path)


class RecordStore:
    """The SQLite store (one connection, guarded by a lock). Opening it creates the schema and
    migrates a store of the earlier schema in place.

    In every method, ``owner`` is the subject id; a missing record and another owner's record both
    fail with ``AgentError("record N not found")``, a bad input with an ``AgentError`` naming it,
    and a create or update over a quota with ``AgentError(QUOTA_EXCEEDED)``, changing nothing.

    Args:
        path: the database file (created ``0600``); None or ``":memory:"``: a private in-memory
            database.
        max_records: records per owner (0: unlimited).
        max_bytes: UTF-8 bytes of title, body and tags per owner (0: unlimited).
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.path = path if path and path != ":memory:" else ":memory:"
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        if self.path != ":memory:":
            _make_private(self.path)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=5.0, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        with self._lock:
            self._conn.execute("PRAGMA foreign_keys = ON")
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                old = self._conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'records'"
                ).fetchone()
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._conn.execute(statement)
                if old is not None:
                    for statement in _MIGRATE_V1.split(";"):
                        if statement.strip():
                            self._conn.execute(statement)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    # -- helpers (caller holds the lock) ----------------------------------------------------------

    def _tags(self, owner: str, record_id: int) -> list[str]:
        rows = self._conn.execute(
            "SELECT tag FROM entry_tags WHERE owner = ? AND record_id = ? ORDER BY position",
            (owner, record_id),
        ).fetchall()
        return [str(r["tag"]) for r in rows]

    def _row_to_record(self, row: sqlite3.Row) -> Record:
        return Record(
            id=int(row["id"]),
            title=str(row["title"]),
            body=str(row["body"]),
            tags=self._tags(str(row["owner"]), int(row["id"])),
            created_at=str(row["created_at"]),
            updated_at=str(row["updated_at"]),
        )

    def _owned(self, owner: str, record_id: int) -> sqlite3.Row:
        row = self._conn.execute(
            "SELECT * FROM entries WHERE owner = ? AND id = ?", (owner, record_id)
        ).fetchone()
        if row is None:
            raise AgentError(f"record {record_id} not found")
        return row  # type: ignore[no-any-return]

    def _set_tags(self, owner: str, record_id: int, tags: list[str]) -> None:
        self._conn.execute("DELETE FROM entry_tags WHERE owner = ? AND record_id = ?", (owner, record_id))
        self._conn.executemany(
            "INSERT INTO entry_tags (owner, record_id, position, tag) VALUES (?, ?, ?, ?)",
            [(owner, record_id, i, t) for i, t in enumerate(tags)],
        )

    def _usage(self, owner: str) -> tuple[int, int, int]:
        """(next id, records, bytes) of ``owner``."""
        row = self._conn.execute(
            "SELECT next_id, records, bytes FROM owners WHERE owner = ?", (owner,)
        ).fetchone()
        if row is None:
            return 1, 0, 0
        return int(row["next_id"]), int(row["records"]), int(row["bytes"])

    def _check_quota(self, records: int, size: int) -> None:
        if (self.max_records and records > self.max_records) or (self.max_bytes and size > self.max_bytes):
            raise AgentError(QUOTA_EXCEEDED)

    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn)

    # -- operations ---------------------------------------------------------------------------------

    def create(self, owner: str, title: str, body: str | None, tags: Sequence[str] | None) -> Record:
        """Create a record with the owner's next id.

        Args:
            owner: the subject id.
            title: 1 to :data:`MAX_TITLE` characters after trimming.
            body: at most :data:`MAX_BODY` characters (None: empty).
            tags: at most :data:`MAX_TAGS` distinct tags of 1 to :data:`MAX_TAG` characters
                (trimmed; duplicates dropped, order kept).

        Returns:
            The new record.
        """
        title, body_text, tag_list = _check_title(title), _check_body(body), _check_tags(tags)
        size = _size(title, body_text, tag_list)
        now = _now()
        with self._lock, self._transaction():
            next_id, records, used = self._usage(owner)
            self._check_quota(records + 1, used + size)
            self._conn.execute(
                "INSERT INTO owners (owner, next_id, records, bytes) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(owner) DO UPDATE SET next_id = excluded.next_id, "
                "records = excluded.records, bytes = excluded.bytes",
                (owner, next_id + 1, records + 1, used + size),
            )
            self._conn.execute(
                "INSERT INTO entries (owner, id, title, body, size, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (owner, next_id, title, body_text, size, now, now),
            )
            self._set_tags(owner, next_id, tag_list)
            return self._row_to_record(self._owned(owner, next_id))

    def get(self, owner: str, record_id: int) -> Record:
        """One of the owner's records.

        Args:
            owner: the subject id.
            record_id: the record's id.

        Returns:
            The record.
        """
        with self._lock:
            return self._row_to_record(self._owned(owner, record_id))

    def search(self, owner: str, text: str | None, tag: str | None, limit: int | None) -> SearchOutput:
        """The owner's records matching ``text`` and ``tag``, by id.

        Args:
            owner: the subject id.
            text: a substring of the title, body or a tag (trimmed; at most
                :data:`MAX_SEARCH_TEXT` characters).
            tag: an exact tag (at most :data:`MAX_TAG` characters).
            limit: records returned, 1 to :data:`MAX_LIMIT` (None: :data:`DEFAULT_LIMIT`).

        Returns:
            The records and whether more matched.

        Raises:
            AgentError: ``limit`` or a search text is out of bounds.
        """
        n = DEFAULT_LIMIT if limit is None else limit
        if not 1 <= n <= MAX_LIMIT:
            raise AgentError(f"limit must be between 1 and {MAX_LIMIT}")
        text, tag = _check_search(text, tag)
        sql = "SELECT r.* FROM entries r WHERE r.owner = ?"
        params: list[Any] = [owner]
        if text is not None:
            pattern = _like_pattern(text)
            sql += (
                " AND (r.title LIKE ? ESCAPE '\\' OR r.body LIKE ? ESCAPE '\\' OR EXISTS ("
                "SELECT 1 FROM entry_tags t WHERE t.owner = r.owner AND t.record_id = r.id "
                "AND t.tag LIKE ? ESCAPE '\\'))"
            )
            params += [pattern, pattern, pattern]
        if tag is not None:
            sql += (
                " AND EXISTS (SELECT 1 FROM entry_tags t WHERE t.owner = r.owner AND t.record_id = r.id"
                " AND t.tag = ?)"
            )
            params.append(tag)
        sql += " ORDER BY r.id LIMIT ?"
        params.append(n + 1)
        with self._lock:
            rows = self._conn.execute(sql, params).fetchall()
            records = [self._row_to_record(r) for r in rows[:n]]
        return SearchOutput(records=records, truncated=len(rows) > n)

    def update(
        self,
        owner: str,
        record_id: int,
        title: str | None,
        body: str | None,
        tags: Sequence[str] | None,
    ) -> Record:
        """Change a record (a field given as None keeps its value; the quota is checked only
        when the record grows).

        Args:
            owner: the subject id.
            record_id: the record's id.
            title: a new title.
            body: a new body.
            tags: new tags.

        Returns:
            The record as changed.
        """
        new_title = _check_title(title) if title is not None else None
        new_body = _check_body(body) if body is not None else None
        new_tags = _check_tags(tags) if tags is not None else None
        with self._lock, self._transaction():
            row = self._owned(owner, record_id)
            final_title = new_title if new_title is not None else str(row["title"])
            final_body = new_body if new_body is not None else str(row["body"])
            final_tags = new_tags if new_tags is not None else self._tags(owner, record_id)
            size = _size(final_title, final_body, final_tags)
            _, records, used = self._usage(owner)
            grown = used - int(row["size"]) + size
            if size > int(row["size"]):
                self._check_quota(records, grown)
            self._conn.execute("UPDATE owners SET bytes = ? WHERE owner = ?", (grown, owner))
            self._conn.execute(
                "UPDATE entries SET title = ?, body = ?, size = ?, updated_at = ? WHERE owner = ? AND id = ?",
                (final_title, final_body, size, _now(), owner, record_id),
            )
            if new_tags is not None:
                self._set_tags(owner, record_id, new_tags)
            return self._row_to_record(self._owned(owner, record_id))

    def delete(self, owner: str, record_id: int) -> DeleteOutput:
        """Delete a record (its id is never reused).

        Args:
            owner: the subject id.
            record_id: the record's id.

        Returns:
            The deleted id.
        """
        with self._lock, self._transaction():
            row = self._owned(owner, record_id)
            self._conn.execute("DELETE FROM entries WHERE owner = ? AND id = ?", (owner, record_id))
            self._conn.execute(
                "UPDATE owners SET records = records - 1, bytes = bytes - ? WHERE owner = ?",
                (int(row["size"]), owner),
            )
        return DeleteOutput(id=record_id, deleted=True)


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any exception (the caller holds the lock)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        self.conn.execute("ROLLBACK" if kind is not None else "COMMIT")


class RecordHandlers:
    """The capability handlers bound to one store (sync: the host runs them in threads).

    Args:
        store: the store.
    """

    def __init__(self, store: RecordStore) -> None:
        self.store = store

    def create(self, ctx: CallContext, subject: Subject, args: CreateInput) -> Record:
        """``records.create``.

        Args:
            ctx: the call's context (unused).
            subject: the caller: the records' owner.
            args: the title, body and tags.

        Returns:
            The new record.
        """
        return self.store.create(subject.id, args.title, args.body, args.tags)

    def get(self, ctx: CallContext, subject: Subject, args: GetInput) -> Record:
        """``records.get``.

        Args:
            ctx: the call's context (unused).
            subject: the caller: the records' owner.
            args: the id.

        Returns:
            The record.
        """
        return self.store.get(subject.id, args.id)

    def search(self, ctx: CallContext, subject: Subject, args: SearchInput) -> SearchOutput:
        """``records.search``.

        Args:
            ctx: the call's context (unused).
            subject: the caller: the records' owner.
            args: the text, tag and limit.

        Returns:
            The matching records.
        """
        return self.store.search(subject.id, args.text, args.tag, args.limit)

    def update(self, ctx: CallContext, subject: Subject, args: UpdateInput) -> Record:
        """``records.update``.

        Args:
            ctx: the call's context (unused).
            subject: the caller: the records' owner.
            args: the id and the fields to change.

        Returns:
            The record as changed.
        """
        return self.store.update(subject.id, args.id, args.title, args.body, args.tags)

    def delete(self, ctx: CallContext, subject: Subject, args: DeleteInput) -> DeleteOutput:
        """``records.delete``.

        Args:
            ctx: the call's context (unused).
            subject: the caller: the records' owner.
            args: the id.

        Returns:
            The deleted id.
        """
        return self.store.delete(subject.id, args.id)


def capabilities(store: RecordStore) -> list[Capability]:
    """The five capabilities over ``store``.

    Args:
        store: the store.

    Returns:
        ``records.create``, ``get``, ``search``, ``update`` and ``delete``.
    """
    h = RecordHandlers(store)
    return [
        Capability(
            id="records.entry.create",
            name="records.create",
            summary="Create a new record (a note with a title, optional body text and tags) and return it.",
            description=(
                "Stores a new record owned by you and returns it with its new integer id and "
                f"timestamps. title: 1-{MAX_TITLE} characters. body: optional text up to {MAX_BODY} "
                f"characters. tags: optional list of up to {MAX_TAGS} short labels (1-{MAX_TAG} "
                "characters each; duplicates are dropped, order is kept). Only you can see your records."
            ),
            search_terms=["add note", "new entry", "save item", "insert document", "store memo"],
            handler=h.create,
        ),
        Capability(
            id="records.entry.get",
            name="records.get",
            summary="Fetch one of your records by its id.",
            description=(
                "Returns the record with this id, including body, tags and timestamps. A record that "
                'does not exist or is not yours fails with "record N not found".'
            ),
            search_terms=["read note", "fetch entry", "load item", "lookup document", "show memo"],
            handler=h.get,
        ),
        Capability(
            id="records.entry.search",
            name="records.search",
            summary="List your records, optionally filtered by text and/or an exact tag.",
            description=(
                "Returns your records in creation order (oldest first). text: case-insensitive "
                "substring matched against title, body and tags. tag: exact tag match. Both filters "
                f"are optional (none lists everything). limit: 1-{MAX_LIMIT}, default "
                f"{DEFAULT_LIMIT}; truncated=true means more records matched than were returned."
            ),
            search_terms=["find notes", "list entries", "query items", "filter by tag", "browse documents"],
            handler=h.search,
        ),
        Capability(
            id="records.entry.update",
            name="records.update",
            summary="Change the title, body or tags of one of your records.",
            description=(
                "Updates only the fields you pass (title, body, tags; tags replaces the whole list) "
                'and returns the updated record. A record that is not yours fails with "record N '
                'not found".'
            ),
            search_terms=["edit note", "modify entry", "rename item", "retag document", "change memo"],
            handler=h.update,
        ),
        Capability(
            id="records.entry.delete",
            name="records.delete",
            summary="Delete one of your records by its id.",
            description=(
                "Permanently removes the record and returns {id, deleted: true}. A record that does "
                'not exist or is not yours fails with "record N not found".'
            ),
            search_terms=["remove note", "erase entry", "drop item", "destroy document", "discard memo"],
            handler=h.delete,
        ),
    ]


def _quota_option(settings: PackSettings, key: str, default: int) -> int:
    raw = settings.get(key)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 1:
        raise ValueError(f"{key}: must be a positive whole number, got {raw!r}")
    return value


class RecordsPack:
    """The pack object: one store per ``capabilities(settings)`` call (i.e. per built server)."""

    def capabilities(self, settings: PackSettings) -> list[Capability]:
        if settings is None:
            settings = PackSettings()
        path = settings.get(DB_ENV)
        if (path is None or not path.strip()) and settings.data_dir is not None:
            directory = Path(settings.data_dir)
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = str(directory / DB_FILE)
        store = RecordStore(
            path,
            max_records=_quota_option(settings, MAX_RECORDS_ENV, DEFAULT_MAX_RECORDS),
            max_bytes=_quota_option(settings, MAX_BYTES_ENV, DEFAULT_MAX_BYTES),
        )
        log.info("records store: %s", store.path)
        return capabilities(store)


pack = RecordsPack()
