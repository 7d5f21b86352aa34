"""The ``store`` setting (docs/configuration.md): which store the host builds, the default by mode,
and that a PostgreSQL URI, which may hold a password, is never quoted back."""

from __future__ import annotations

from pathlib import Path

import pytest

from codemode.startup.bootstrap import build_store
from codemode.startup.config import ConfigError, Settings, load_settings
from codemode.store.memory import MemoryStore
from codemode.store.postgres import PostgresStore
from codemode.store.sqlite import SqliteStore

SECRET = "hunter2-secret"


@pytest.fixture(autouse=True)
def _no_codemode_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)


def test_the_default_is_sqlite_in_the_data_dir_else_memory(tmp_path: Path) -> None:
    stdio = load_settings(allow_all=True, transport="stdio")
    assert stdio.store_kind == "memory"
    assert isinstance(build_store(stdio), MemoryStore)
    http = load_settings(allow_all=True, transport="http", data_dir=tmp_path)
    assert http.store_kind == "sqlite"
    store = build_store(http)
    assert isinstance(store, SqliteStore)
    assert store.path == tmp_path / "codemode-store.sqlite3"
    with_dir = load_settings(allow_all=True, transport="stdio", data_dir=tmp_path)
    assert with_dir.store_kind == "sqlite"
    assert load_settings(allow_all=True, transport="http", store="memory").store_kind == "memory"


def test_a_postgres_uri_from_the_environment_builds_the_postgres_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CODEMODE_STORE", f"postgresql://codemode:{SECRET}@db.example:5432/codemode")
    monkeypatch.setenv("CODEMODE_STORE_TIMEOUT", "3.5")
    settings = load_settings(allow_all=True)
    assert settings.store_kind == "postgres"
    assert SECRET not in repr(settings)
    assert SECRET not in str(settings)
    store = build_store(settings)
    assert isinstance(store, PostgresStore)
    assert store.timeout == 3.5
    assert SECRET not in store.where
    assert "db.example:5432/codemode" in store.where


@pytest.mark.parametrize(
    "value",
    [
        f"mysql://codemode:{SECRET}@db/x",
        f"host=db password={SECRET}",
        f"sqlite:///tmp/{SECRET}",
    ],
)
def test_a_bad_store_names_the_setting_and_quotes_nothing(value: str) -> None:
    with pytest.raises(ConfigError) as bad:
        load_settings(allow_all=True, store=value)
    text = str(bad.value)
    assert text.startswith("--store / CODEMODE_STORE: must be sqlite, memory or a postgresql:// URI")
    assert SECRET not in text
    assert "\n" not in text


def test_an_unparsable_postgres_uri_is_refused_without_quoting_it() -> None:
    settings = load_settings(allow_all=True, store=f"postgresql://u:{SECRET}%zz@db/x")
    with pytest.raises(ConfigError) as bad:
        build_store(settings)
    assert str(bad.value) == "--store / CODEMODE_STORE: the PostgreSQL connection string cannot be parsed"


def test_sqlite_needs_a_data_dir_and_the_timeout_needs_postgres() -> None:
    with pytest.raises(
        ConfigError, match=r"--store / CODEMODE_STORE sqlite needs --data-dir / CODEMODE_DATA_DIR"
    ):
        load_settings(allow_all=True, transport="stdio", store="sqlite")
    with pytest.raises(
        ConfigError, match=r"--store-timeout / CODEMODE_STORE_TIMEOUT applies to a PostgreSQL"
    ):
        load_settings(allow_all=True, transport="stdio", store_timeout=5)
    assert Settings(allow_all=True, store=" memory ").store == "memory"


def test_the_configuration_page_snippet_loads_as_written(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text(encoding="utf-8")
    block = next(b for b in doc.split("```toml\n")[1:] if b.startswith('store = "sqlite"')).split("```")[0]
    path = tmp_path / "codemode.toml"
    path.write_text(block)
    assert load_settings(path, allow_all=True, transport="http").store_kind == "sqlite"
    # the replicas' variant: its two lines uncommented instead
    replicas = [line.removeprefix("# ") for line in block.splitlines() if line.startswith("# store")]
    path.write_text("\n".join(replicas) + "\n")
    settings = load_settings(path, allow_all=True, transport="http")
    assert (settings.store_kind, settings.store_timeout) == ("postgres", 2.0)
    assert "secret" not in repr(settings)
