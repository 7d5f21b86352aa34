"""A SQLite-backed records store: the first real capability pack.

Load it with ``--pack codemode.capabilities.records:pack``. Capabilities (id → model-facing name):

=========================  ==================  ==============================================
id                         name                what
=========================  ==================  ==============================================
``records.entry.create``   ``records.create``  create a record owned by the caller
``records.entry.get``      ``records.get``     fetch one of the caller's records by id
``records.entry.search``   ``records.search``  list the caller's records by text and/or tag
``records.entry.update``   ``records.update``  change title/body/tags of one record
``records.entry.delete``   ``records.delete``  delete one record
=========================  ==================  ==============================================

**Ownership.** Every record belongs to the subject that created it (``subject.id``, resolved by the
host, never by the program). Get, search, update and delete only ever see the caller's own records;
a missing record and another subject's record give the same ``AgentError("record N not found")``,
so a program learns nothing about records it does not own.

**Storage.** ``CODEMODE_RECORDS_DB`` (or the pack option of that name) names the SQLite file. When it
is unset or ``:memory:``, the store is an in-memory database private to the host process: it lives
as long as the process and is lost on exit (a fresh, empty store per ``codemode serve``). A file path
is created if missing (parent directories must exist) and may be shared by several host processes
(WAL journal, 5 s busy timeout).

**Concurrency.** Sync handlers run in worker threads; each store has one connection guarded by a
lock, so concurrent calls are serialized and safe.

**Validation.** Inputs are bounded (title 1..200 characters, body ≤ 20,000 characters, at most 16
tags of 1..50 characters, search limit 1..100); a violation is an ``AgentError`` naming the problem.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from codemode import AgentError, CallContext, Capability
from codemode.authz import Subject
from codemode.packs import PackSettings

__all__ = [
    "CreateInput",
    "DeleteInput",
    "DeleteOutput",
    "GetInput",
    "Record",
    "RecordStore",
    "RecordsPack",
    "SearchInput",
    "SearchOutput",
    "UpdateInput",
    "capabilities",
    "pack",
]

DB_ENV = "CODEMODE_RECORDS_DB"
MAX_TITLE = 200
MAX_BODY = 20_000
MAX_TAGS = 16
MAX_TAG = 50
DEFAULT_LIMIT = 20
MAX_LIMIT = 100


@dataclass
class Record:
    id: int
    title: str
    body: str
    tags: list[str]
    created_at: str
    updated_at: str


@dataclass
class CreateInput:
    title: str
    body: str | None = None
    tags: list[str] | None = None


@dataclass
class GetInput:
    id: int


@dataclass
class SearchInput:
    text: str | None = None
    tag: str | None = None
    limit: int | None = None


@dataclass
class SearchOutput:
    records: list[Record] = field(default_factory=list)
    truncated: bool = False


@dataclass
class UpdateInput:
    id: int
    title: str | None = None
    body: str | None = None
    tags: list[str] | None = None


@dataclass
class DeleteInput:
    id: int


@dataclass
class DeleteOutput:
    id: int
    deleted: bool


_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS record_tags (
    record_id INTEGER NOT NULL REFERENCES records(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    tag TEXT NOT NULL,
    PRIMARY KEY (record_id, position)
);
CREATE INDEX IF NOT EXISTS records_owner ON records(owner, id);
CREATE INDEX IF NOT EXISTS record_tags_tag ON record_tags(tag);
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


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class RecordStore:
    """The SQLite store. ``path`` None or ``":memory:"`` is a private in-memory database."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path if path and path != ":memory:" else ":memory:"
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=5.0, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        with self._lock:
            self._conn.execute("PRAGMA foreign_keys = ON")
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- helpers (caller holds the lock) ----------------------------------------------------------

    def _tags(self, record_id: int) -> list[str]:
        rows = self._conn.execute(
            "SELECT tag FROM record_tags WHERE record_id = ? ORDER BY position", (record_id,)
        ).fetchall()
        return [str(r["tag"]) for r in rows]

    def _row_to_record(self, row: sqlite3.Row) -> Record:
        return Record(
            id=int(row["id"]),
            title=str(row["title"]),
            body=str(row["body"]),
            tags=self._tags(int(row["id"])),
            created_at=str(row["created_at"]),
            updated_at=str(row["updated_at"]),
        )

    def _owned(self, owner: str, record_id: int) -> sqlite3.Row:
        row = self._conn.execute(
            "SELECT * FROM records WHERE id = ? AND owner = ?", (record_id, owner)
        ).fetchone()
        if row is None:
            raise AgentError(f"record {record_id} not found")
        return row  # type: ignore[no-any-return]

    def _set_tags(self, record_id: int, tags: list[str]) -> None:
        self._conn.execute("DELETE FROM record_tags WHERE record_id = ?", (record_id,))
        self._conn.executemany(
            "INSERT INTO record_tags (record_id, position, tag) VALUES (?, ?, ?)",
            [(record_id, i, t) for i, t in enumerate(tags)],
        )

    # -- operations ---------------------------------------------------------------------------------

    def create(self, owner: str, title: str, body: str | None, tags: Sequence[str] | None) -> Record:
        title, body_text, tag_list = _check_title(title), _check_body(body), _check_tags(tags)
        now = _now()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                cur = self._conn.execute(
                    "INSERT INTO records (owner, title, body, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                    (owner, title, body_text, now, now),
                )
                record_id = int(cur.lastrowid or 0)
                self._set_tags(record_id, tag_list)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            return self._row_to_record(self._owned(owner, record_id))

    def get(self, owner: str, record_id: int) -> Record:
        with self._lock:
            return self._row_to_record(self._owned(owner, record_id))

    def search(self, owner: str, text: str | None, tag: str | None, limit: int | None) -> SearchOutput:
        n = DEFAULT_LIMIT if limit is None else limit
        if not 1 <= n <= MAX_LIMIT:
            raise AgentError(f"limit must be between 1 and {MAX_LIMIT}")
        sql = "SELECT r.* FROM records r WHERE r.owner = ?"
        params: list[Any] = [owner]
        if text is not None and text.strip():
            pattern = _like_pattern(text.strip())
            sql += (
                " AND (r.title LIKE ? ESCAPE '\\' OR r.body LIKE ? ESCAPE '\\' OR EXISTS ("
                "SELECT 1 FROM record_tags t WHERE t.record_id = r.id AND t.tag LIKE ? ESCAPE '\\'))"
            )
            params += [pattern, pattern, pattern]
        if tag is not None and tag.strip():
            sql += " AND EXISTS (SELECT 1 FROM record_tags t WHERE t.record_id = r.id AND t.tag = ?)"
            params.append(tag.strip())
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
        new_title = _check_title(title) if title is not None else None
        new_body = _check_body(body) if body is not None else None
        new_tags = _check_tags(tags) if tags is not None else None
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                row = self._owned(owner, record_id)
                self._conn.execute(
                    "UPDATE records SET title = ?, body = ?, updated_at = ? WHERE id = ?",
                    (
                        new_title if new_title is not None else row["title"],
                        new_body if new_body is not None else row["body"],
                        _now(),
                        record_id,
                    ),
                )
                if new_tags is not None:
                    self._set_tags(record_id, new_tags)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            return self._row_to_record(self._owned(owner, record_id))

    def delete(self, owner: str, record_id: int) -> DeleteOutput:
        with self._lock:
            self._owned(owner, record_id)
            self._conn.execute("DELETE FROM records WHERE id = ? AND owner = ?", (record_id, owner))
        return DeleteOutput(id=record_id, deleted=True)


class RecordHandlers:
    """The capability handlers bound to one store (sync: the host runs them in threads)."""

    def __init__(self, store: RecordStore) -> None:
        self.store = store

    def create(self, ctx: CallContext, subject: Subject, args: CreateInput) -> Record:
        return self.store.create(subject.id, args.title, args.body, args.tags)

    def get(self, ctx: CallContext, subject: Subject, args: GetInput) -> Record:
        return self.store.get(subject.id, args.id)

    def search(self, ctx: CallContext, subject: Subject, args: SearchInput) -> SearchOutput:
        return self.store.search(subject.id, args.text, args.tag, args.limit)

    def update(self, ctx: CallContext, subject: Subject, args: UpdateInput) -> Record:
        return self.store.update(subject.id, args.id, args.title, args.body, args.tags)

    def delete(self, ctx: CallContext, subject: Subject, args: DeleteInput) -> DeleteOutput:
        return self.store.delete(subject.id, args.id)


def capabilities(store: RecordStore) -> list[Capability]:
    """The five capabilities over ``store``."""
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


class RecordsPack:
    """The pack object: one store per ``capabilities(settings)`` call (i.e. per built server)."""

    def capabilities(self, settings: PackSettings) -> list[Capability]:
        path = settings.get(DB_ENV) if settings is not None else os.environ.get(DB_ENV)
        return capabilities(RecordStore(path))


pack = RecordsPack()
