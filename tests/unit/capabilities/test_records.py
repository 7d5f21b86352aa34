"""The records pack: store semantics, ownership, validation, concurrency, and its registration."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.packs import PackSettings, load_pack
from codemode_capabilities import records
from codemode_capabilities.records import (
    MAX_LIMIT,
    CreateInput,
    DeleteInput,
    GetInput,
    RecordStore,
    SearchInput,
    UpdateInput,
    capabilities,
    pack,
)


@pytest.fixture
def store() -> RecordStore:
    return RecordStore()


def test_create_and_get(store: RecordStore) -> None:
    r = store.create("alice", "  Buy milk ", "two litres", ["shopping", "home", "shopping", " x "])
    assert r.id == 1
    assert r.title == "Buy milk"
    assert r.body == "two litres"
    assert r.tags == ["shopping", "home", "x"]
    assert r.created_at == r.updated_at
    assert r.created_at.endswith("Z") and "T" in r.created_at
    assert store.get("alice", 1) == r


def test_defaults(store: RecordStore) -> None:
    r = store.create("alice", "t", None, None)
    assert (r.body, r.tags) == ("", [])


def test_ownership_is_enforced(store: RecordStore) -> None:
    r = store.create("alice", "secret", None, ["a"])
    for op in (
        lambda: store.get("bob", r.id),
        lambda: store.update("bob", r.id, "stolen", None, None),
        lambda: store.delete("bob", r.id),
    ):
        with pytest.raises(codemode.AgentError) as info:
            op()
        assert info.value.message == f"record {r.id} not found"
    assert store.search("bob", None, None, None).records == []
    assert store.get("alice", r.id).title == "secret"


def test_missing_record(store: RecordStore) -> None:
    with pytest.raises(codemode.AgentError, match="record 42 not found"):
        store.get("alice", 42)


def test_search_text_tag_limit(store: RecordStore) -> None:
    store.create("alice", "Buy milk", "", ["shopping"])
    store.create("alice", "Call Bob", "about MILK prices", ["work"])
    store.create("alice", "100% done", "", ["work", "milky-way"])
    store.create("bob", "milk for bob", "", ["shopping"])
    titles = [r.title for r in store.search("alice", "milk", None, None).records]
    assert titles == ["Buy milk", "Call Bob", "100% done"]  # title, body (case-insensitive), tag
    assert [r.title for r in store.search("alice", None, "work", None).records] == ["Call Bob", "100% done"]
    assert [r.title for r in store.search("alice", "milk", "work", None).records] == ["Call Bob", "100% done"]
    assert [r.title for r in store.search("alice", "%", None, None).records] == ["100% done"]  # escaped
    assert [r.title for r in store.search("alice", "_", None, None).records] == []
    page = store.search("alice", None, None, 2)
    assert len(page.records) == 2 and page.truncated is True
    assert store.search("alice", None, None, 3).truncated is False
    assert len(store.search("alice", "  ", " ", None).records) == 3  # blank filters are ignored


def test_search_limit_bounds(store: RecordStore) -> None:
    for bad in (0, -1, MAX_LIMIT + 1):
        with pytest.raises(codemode.AgentError, match="limit must be between 1 and"):
            store.search("alice", None, None, bad)


def test_update(store: RecordStore) -> None:
    r = store.create("alice", "old", "body", ["a", "b"])
    time.sleep(0.002)
    u = store.update("alice", r.id, None, None, ["c"])
    assert (u.title, u.body, u.tags) == ("old", "body", ["c"])
    assert u.updated_at > r.updated_at and u.created_at == r.created_at
    u = store.update("alice", r.id, "new", "", None)
    assert (u.title, u.body, u.tags) == ("new", "", ["c"])
    assert store.update("alice", r.id, None, None, []).tags == []


def test_delete(store: RecordStore) -> None:
    r = store.create("alice", "gone", None, ["t"])
    out = store.delete("alice", r.id)
    assert (out.id, out.deleted) == (r.id, True)
    with pytest.raises(codemode.AgentError, match=f"record {r.id} not found"):
        store.delete("alice", r.id)
    assert store.search("alice", None, "t", None).records == []


@pytest.mark.parametrize(
    ("title", "body", "tags", "message"),
    [
        ("", None, None, "title must be 1 to 200"),
        ("   ", None, None, "title must be 1 to 200"),
        ("x" * 201, None, None, "title must be 1 to 200"),
        ("ok", "b" * 20_001, None, "body must be at most"),
        ("ok", None, [""], "each tag must be 1 to 50"),
        ("ok", None, ["t" * 51], "each tag must be 1 to 50"),
        ("ok", None, [f"t{i}" for i in range(17)], "at most 16 distinct tags"),
    ],
)
def test_validation(
    store: RecordStore, title: str, body: str | None, tags: list[str] | None, message: str
) -> None:
    with pytest.raises(codemode.AgentError, match=message):
        store.create("alice", title, body, tags)
    r = store.create("alice", "fine", None, None)
    with pytest.raises(codemode.AgentError, match=message.split(" ")[0]):
        store.update("alice", r.id, title if title != "ok" else None, body, tags)


def test_failed_update_leaves_record_unchanged(store: RecordStore) -> None:
    r = store.create("alice", "keep", "body", ["a"])
    with pytest.raises(codemode.AgentError):
        store.update("alice", r.id, "changed", None, [""])
    assert store.get("alice", r.id) == r


def test_concurrent_use_from_threads(store: RecordStore) -> None:
    errors: list[BaseException] = []

    def worker(owner: str) -> None:
        try:
            for i in range(40):
                r = store.create(owner, f"{owner}-{i}", None, [owner])
                store.update(owner, r.id, None, f"body {i}", None)
                store.get(owner, r.id)
                store.search(owner, None, owner, 5)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"user{n}",)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for n in range(8):
        assert len(store.search(f"user{n}", None, None, MAX_LIMIT).records) == 40
    for n in range(8):  # ids are numbered per subject
        ids = [r.id for r in store.search(f"user{n}", None, None, MAX_LIMIT).records]
        assert ids == list(range(1, 41))


def test_file_database_persists(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    first = RecordStore(str(path))
    first.create("alice", "persisted", None, ["x"])
    first.close()
    second = RecordStore(str(path))
    assert second.get("alice", 1).tags == ["x"]
    second.close()


def _modes(path: Path) -> dict[str, str]:
    """The permission bits of the database, its WAL and its shared-memory file (all must exist)."""
    return {suffix: oct(Path(f"{path}{suffix}").stat().st_mode & 0o777) for suffix in ("", "-wal", "-shm")}


PRIVATE = {"": "0o600", "-wal": "0o600", "-shm": "0o600"}


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_a_new_database_and_its_wal_and_shm_are_private(tmp_path: Path, umask: int) -> None:
    # Any umask, even none: the three files hold every subject's records, readable by the host only.
    path = tmp_path / "records.sqlite3"
    previous = os.umask(umask)
    try:
        store = RecordStore(str(path))
        store.create("alice", "private", None, None)  # the WAL and SHM exist while the store is open
    finally:
        os.umask(previous)
    try:
        assert _modes(path) == PRIVATE
    finally:
        store.close()


def test_an_existing_readable_database_is_made_private(tmp_path: Path) -> None:
    # A store an earlier version created 0644 (and its leftover WAL/SHM) is tightened when opened.
    path = tmp_path / "records.sqlite3"
    first = RecordStore(str(path))
    first.create("alice", "before", None, None)
    for suffix in ("", "-wal", "-shm"):
        os.chmod(f"{path}{suffix}", 0o644)
    second = RecordStore(str(path))  # opened while the first still holds the WAL and SHM
    try:
        assert _modes(path) == PRIVATE
        assert second.get("alice", 1).title == "before"
    finally:
        second.close()
        first.close()


def test_in_memory_stores_are_separate() -> None:
    a, b = RecordStore(), RecordStore(":memory:")
    a.create("alice", "only in a", None, None)
    assert b.search("alice", None, None, None).records == []


# ----------------------------------------------------------------------------------- as capabilities


def test_capabilities_register_and_describe() -> None:
    builder = codemode.Builder(authorizer=authz.allow_all())
    builder.register(*capabilities(RecordStore()))
    server = builder.build()
    by_name = {c.name: c for c in server.capabilities}
    assert set(by_name) == {
        "records.create",
        "records.get",
        "records.search",
        "records.update",
        "records.delete",
    }
    assert {c.id for c in server.capabilities} == {
        "records.entry.create",
        "records.entry.get",
        "records.entry.search",
        "records.entry.update",
        "records.entry.delete",
    }
    assert server.describe("records.get").signature == "records.get(*, id: int)"
    assert server.describe("records.update").signature == (
        "records.update(*, id: int, title: str | None, body: str | None, tags: list[str] | None)"
    )
    out = {o["name"]: o for o in server.describe("records.search").to_dict()["output"]}
    assert out["truncated"] == {"name": "truncated", "type": "bool", "required": True}
    assert out["records"]["type"].startswith("list[{id: int, title: str")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("create record", "records.create"),
        ("add note", "records.create"),
        ("fetch entry", "records.get"),
        ("find notes", "records.search"),
        ("filter by tag", "records.search"),
        ("edit note", "records.update"),
        ("delete record", "records.delete"),
        ("remove note", "records.delete"),
        ("records.update", "records.update"),
    ],
)
def test_search_finds_each_capability(query: str, expected: str) -> None:
    builder = codemode.Builder(authorizer=authz.allow_all())
    builder.register(*capabilities(RecordStore()))
    server = builder.build()
    names = [r["name"] for r in server.search(query).to_dict()["results"]]
    assert names and names[0] == expected, (query, names)


async def test_handlers_use_the_subject() -> None:
    store = RecordStore()
    handlers = records.RecordHandlers(store)
    ctx: Any = None
    alice, bob = authz.Subject("alice"), authz.Subject("bob")
    r = await asyncio.to_thread(handlers.create, ctx, alice, CreateInput(title="a", tags=["t"]))
    assert handlers.get(ctx, alice, GetInput(id=r.id)).title == "a"
    with pytest.raises(codemode.AgentError):
        handlers.get(ctx, bob, GetInput(id=r.id))
    assert handlers.search(ctx, alice, SearchInput(tag="t")).records[0].id == r.id
    assert handlers.update(ctx, alice, UpdateInput(id=r.id, body="b")).body == "b"
    assert handlers.delete(ctx, alice, DeleteInput(id=r.id)).deleted is True


def test_pack_reads_db_from_settings(tmp_path: Path) -> None:
    db = tmp_path / "via-env.db"
    caps = pack.capabilities(PackSettings(environ={"CODEMODE_RECORDS_DB": str(db)}))
    assert len(caps) == 5
    assert db.exists()
    db2 = tmp_path / "via-option.db"
    load_pack(
        "codemode_capabilities.records:pack",
        PackSettings(environ={"CODEMODE_RECORDS_DB": str(db)}, options={"CODEMODE_RECORDS_DB": str(db2)}),
    )
    assert db2.exists()


def test_pack_default_is_in_memory() -> None:
    caps = load_pack("codemode_capabilities.records:pack", PackSettings(environ={}))
    handler: Any = caps[0].handler
    assert handler.__self__.store.path == ":memory:"
