"""Where settings come from, highest first: keyword overrides (the flags), ``CODEMODE_*`` variables,
the TOML file of ``--config`` / ``CODEMODE_CONFIG``. Each source puts a runtime table's flat names
(``docker_memory``, ``CODEMODE_DOCKER_MEMORY``) in their table before the sources are merged, so
precedence holds per setting. A TOML file's relative paths are relative to the file, and it may
hold the tables of several runtimes: those of the runtimes not chosen are left out with a note."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, TomlConfigSettingsSource

from .facts import Table, is_table, leaves
from .naming import CONFIG_ENV, ConfigError, names

log = logging.getLogger("codemode.config")

_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "codemode_config_file", default=None
)
_noted: set[str] = set()


@contextlib.contextmanager
def using_config(path: Path | None) -> Iterator[None]:
    """Read the settings file ``path`` (instead of ``CODEMODE_CONFIG``) inside the block.

    Args:
        path: the file (None: ``CODEMODE_CONFIG``, if set).

    Yields:
        Nothing.
    """
    token = _config_file.set(path)
    try:
        yield
    finally:
        _config_file.reset(token)


def config_file() -> Path | None:
    """The settings file in use: ``--config`` (:func:`using_config`), else ``CODEMODE_CONFIG``.

    Returns:
        Its path, or None.
    """
    path = _config_file.get()
    if path is None:
        env_path = os.environ.get(CONFIG_ENV, "").strip()
        path = Path(env_path) if env_path else None
    return path


def config_origin() -> str:
    """Where a configuration problem is, for its one line: ``--config / CODEMODE_CONFIG: 'path'``
    when a file was read (the only source of a table or an unknown key), else ``settings``.

    Returns:
        The origin, without a trailing colon.
    """
    path = config_file()
    return f"--config / {CONFIG_ENV}: {str(path)!r}" if path is not None else "settings"


def nest(model: type[BaseModel], data: Mapping[str, Any], *, known_only: bool = False) -> dict[str, Any]:
    """One source's values with each table's flat names (``docker_memory``) in the table
    (``docker.memory``); the flat name wins over the table's in one source. A table given as an
    object counts as the fields it sets, a runtime's options object as those differing from its
    defaults.

    Args:
        model: the settings model.
        data: what the source read.
        known_only: leave out the names a table does not have (the environment's: an unknown
            variable is ignored, :func:`~codemode.startup.config.load.misspelled_variables`).

    Returns:
        The values.
    """
    out = dict(data)
    for name, field in model.model_fields.items():
        if not is_table(field):
            continue
        table_type: type[Table] = field.annotation  # type: ignore[assignment]
        value = out.get(name)
        if isinstance(value, Table):
            value = value.model_dump(exclude_unset=True)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = _changed(value)
        if value is not None and not isinstance(value, Mapping):
            continue  # not a table: its validation says so
        table = dict(value or {})
        for key in [k for k in out if k.startswith(name + "_")]:
            if key[len(name) + 1 :] in table_type.model_fields:
                table[key[len(name) + 1 :]] = out.pop(key)
        if known_only:
            table = {k: v for k, v in table.items() if k in table_type.model_fields}
        if table or name in out:
            out[name] = table
    return out


class Nesting(PydanticBaseSettingsSource):
    """A source whose flat table names go in their tables (:func:`nest`)."""

    def __init__(
        self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource, *, known_only: bool = False
    ) -> None:
        super().__init__(settings_cls)
        self._inner = inner
        self._known_only = known_only

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads through the inner source

    def __call__(self) -> dict[str, Any]:
        return nest(self.settings_cls, self._inner(), known_only=self._known_only)


class TomlSource(TomlConfigSettingsSource):
    """The TOML file: tables nested (:func:`nest`), relative paths relative to the file, and the
    tables of the runtimes not chosen left out, with one note naming them."""

    def __init__(self, settings_cls: type[BaseSettings], toml_file: Path, runtime: str | None) -> None:
        self._runtime = runtime  # chosen by a higher source (a flag, the environment), if any
        self._model = settings_cls  # the parent sets settings_cls only after reading the file
        super().__init__(settings_cls, toml_file=toml_file)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        where = f"--config / {CONFIG_ENV}: {str(file_path)!r}"
        try:
            data = nest(self._model, super()._read_file(file_path))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where} is not valid TOML: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--config / {CONFIG_ENV}: cannot read {str(file_path)!r}: {exc}") from None
        base = Path(str(file_path)).resolve().parent
        for leaf in leaves(self._model):
            holder: Any = data
            for part in leaf.path[:-1]:
                holder = holder.get(part) if isinstance(holder, dict) else None
            if leaf.facts.is_path and isinstance(holder, dict) and leaf.path[-1] in holder:
                holder[leaf.path[-1]] = _relative_to(base, holder[leaf.path[-1]])
        return self._chosen_tables(data, where)

    def _chosen_tables(self, data: dict[str, Any], where: str) -> dict[str, Any]:
        fields = self._model.model_fields
        runtime = self._runtime or data.get("runtime") or fields["runtime"].default
        ignored = [
            name for name, field in fields.items() if is_table(field) and name != runtime and name in data
        ]
        if ignored:
            for name in ignored:
                del data[name]
            tables = " and ".join(f"[{name}]" for name in ignored)
            note = (
                f"{where}: the {tables} table{'s are' if len(ignored) > 1 else ' is'} ignored "
                f"({names('runtime')} is {runtime})"
            )
            if note not in _noted:
                _noted.add(note)
                log.warning("%s", note)
        return data


def _changed(options: Any) -> dict[str, Any]:
    """The fields of a runtime's options object that differ from the options type's defaults."""
    default = type(options)()
    return {
        f.name: getattr(options, f.name)
        for f in dataclasses.fields(options)
        if getattr(options, f.name) != getattr(default, f.name)
    }


def _relative_to(base: Path, value: Any) -> Any:
    """A path (or list of paths) of the file at ``base``; the audit log's words stay words."""
    if isinstance(value, list):
        return [_relative_to(base, item) for item in value]
    if isinstance(value, str) and value and value not in ("stderr", "stdout", "none"):
        return str(base / value)
    return value
