"""records pack under hostile tenants: storage quotas, bounded text inputs, per-subject ids, and an
on-disk default store when the host names a data directory."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from codemode import AgentError
from codemode.packs import PackSettings
from codemode_capabilities.records import RecordStore, pack


def test_per_subject_record_count_quota() -> None:
    store = RecordStore(max_records=3)
    for i in range(3):
        store.create("alice", f"n{i}", None, None)
    with pytest.raises(AgentError, match=r"^storage quota exceeded$"):
        store.create("alice", "one too many", None, None)
    store.create("bob", "bob is unaffected", None, None)
    store.delete("alice", 1)
    store.create("alice", "room again", None, None)


def test_per_subject_byte_quota_counts_creates_and_updates() -> None:
    store = RecordStore(max_bytes=10_000)
    r = store.create("alice", "t", "x" * 9_000, None)
    with pytest.raises(AgentError, match=r"^storage quota exceeded$"):
        store.create("alice", "t", "x" * 2_000, None)
    with pytest.raises(AgentError, match=r"^storage quota exceeded$"):
        store.update("alice", r.id, None, "x" * 10_500, None)
    assert store.get("alice", r.id).body == "x" * 9_000  # nothing lost
    store.update("alice", r.id, None, "short", None)
    store.create("alice", "t", "x" * 9_000, None)  # the update freed the bytes


def test_search_text_and_tag_are_bounded_with_a_clear_error() -> None:
    store = RecordStore()
    store.create("alice", "hello", None, ["t"])
    with pytest.raises(AgentError, match="search text must be at most"):
        store.search("alice", "x" * 50_001, None, None)
    with pytest.raises(AgentError, match="tag must be at most"):
        store.search("alice", None, "x" * 51, None)
    assert len(store.search("alice", "x" * 10 + "hello", None, None).records) == 0


def test_record_ids_are_per_subject() -> None:
    store = RecordStore()
    assert store.create("alice", "a1", None, None).id == 1
    assert store.create("alice", "a2", None, None).id == 2
    # Bob's first id does not reveal that alice created two records.
    assert store.create("bob", "b1", None, None).id == 1
    assert store.get("bob", 1).title == "b1" and store.get("alice", 1).title == "a1"
    store.delete("alice", 2)
    assert store.create("alice", "a3", None, None).id == 3  # ids are never reused


def test_a_store_of_the_previous_schema_is_migrated_without_loss(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL,
            title TEXT NOT NULL, body TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
        CREATE TABLE record_tags (record_id INTEGER NOT NULL REFERENCES records(id) ON DELETE CASCADE,
            position INTEGER NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (record_id, position));
        INSERT INTO records VALUES (1, 'alice', 'a', 'body a', 't', 't'), (2, 'bob', 'b', '', 't', 't'),
            (3, 'alice', 'c', '', 't', 't');
        INSERT INTO record_tags VALUES (1, 0, 'x'), (1, 1, 'y'), (2, 0, 'z');
        """
    )
    conn.commit()
    conn.close()
    store = RecordStore(str(path))
    assert store.get("alice", 1).tags == ["x", "y"]
    assert store.get("bob", 2).title == "b"
    assert store.get("alice", 3).title == "c"
    assert store.create("alice", "new", None, None).id == 4
    assert store.create("bob", "new", None, None).id == 3
    store.close()


def test_the_pack_keeps_its_store_on_disk_in_the_host_data_directory(tmp_path: Path) -> None:
    settings = PackSettings(environ={}, options={}, data_dir=tmp_path / "data")
    caps = {c.name: c for c in pack.capabilities(settings)}
    assert (tmp_path / "data" / "records.sqlite3").is_file()
    assert caps["records.create"] is not None
    # In memory only when asked.
    asked = PackSettings(environ={}, options={"CODEMODE_RECORDS_DB": ":memory:"}, data_dir=tmp_path / "other")
    pack.capabilities(asked)
    assert not (tmp_path / "other").exists()


def test_quota_options_are_read_and_checked() -> None:
    settings = PackSettings(environ={}, options={"CODEMODE_RECORDS_MAX_RECORDS": "0"})
    with pytest.raises(ValueError, match="CODEMODE_RECORDS_MAX_RECORDS"):
        pack.capabilities(settings)
