"""A setting's facts beside its type and default: its kind (``size``, ``list``, ``path``, ...), the
mode of ``serve`` it applies to, its flag group and, when it is not its name, its flag. They live in
the field's metadata (:func:`setting` puts them there, :func:`facts` reads them back), and the flag,
environment, TOML and docs generators read them from there: no other module keeps a list of
setting names. A runtime's settings are a nested :class:`Table`; :func:`leaves` walks the model
and names each setting of a table flat (``docker_memory``: ``--docker-memory``,
``CODEMODE_DOCKER_MEMORY``)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.config import JsonDict
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

#: The prefix of every setting's environment variable.
ENV_PREFIX = "CODEMODE_"

#: What a setting's value is, beyond its Python type: ``size`` bytes or ``256m``/``1g``; ``list``
#: a repeatable flag, a JSON array or comma-separated text in the environment; ``path`` a file or
#: directory (in TOML relative to the file); ``paths`` a list of them; ``duration`` seconds.
Kind = Literal["size", "list", "path", "paths", "duration"]
#: The transport a setting applies to (``serve --stdio``, ``serve --http`` or both).
Mode = Literal["both", "stdio", "http"]

#: The flag groups of ``serve --help`` by the name a setting's facts give, with their titles.
GROUPS: dict[str, str] = {
    "general": "general",
    "capabilities": "capabilities",
    "authorization": "authorization (exactly one: --allow-all, or --rego-policy with --rego-decision)",
    "runtime": "runtime",
    "limits": "limits",
    "stdio": "stdio only",
    "http": "HTTP only (see docs/service.md)",
}


@dataclass(frozen=True)
class Facts:
    """What a setting's metadata says: ``group`` its ``--help`` group (:data:`GROUPS`), ``mode``
    the transport it applies to, ``kind`` what its value is (:data:`Kind`), ``flag`` its flag when
    not the name's, ``flagged`` False for a table without a flag, ``shown_default`` the default as
    ``--help`` says it when it is computed, ``metavar`` the flag's value name (:func:`setting`)."""

    group: str = "general"
    mode: Mode = "both"
    kind: Kind | None = None
    flag: str | None = None
    flagged: bool = True
    shown_default: str | None = None
    metavar: str | None = None

    @property
    def repeated(self) -> bool:
        """A list setting: a repeatable flag that adds to the environment's list."""
        return self.kind in ("list", "paths")

    @property
    def is_path(self) -> bool:
        """A path, or a list of them: relative to the TOML file it is written in."""
        return self.kind in ("path", "paths")


def setting(
    default: Any = PydanticUndefined,
    description: str = "",
    *,
    kind: Kind | None = None,
    mode: Mode = "both",
    group: str | None = None,
    flag: str | None = None,
    flagged: bool = True,
    shown_default: str | None = None,
    metavar: str | None = None,
    **field: Any,
) -> Any:
    """A settings field with its facts in its metadata (``json_schema_extra``).

    Args:
        default: the default (or give ``default_factory``).
        description: what ``--help`` and docs/configuration.md say.
        kind: what the value is beyond its type (:data:`Kind`).
        mode: the transport it applies to; a flag given in the other one is an error.
        group: its ``--help`` group (:data:`GROUPS`; default: the mode's for http and stdio, else
            ``general``).
        flag: its flag when it is not the name's (a repeatable one is singular: ``--pack``).
        flagged: False for a setting without a flag (the TOML tables).
        shown_default: the default as ``--help`` and the docs say it, when it is computed.
        metavar: the flag's value name when the kind's is not right.
        field: more ``pydantic.Field`` arguments (constraints, ``default_factory``, ``repr``).

    Returns:
        The ``pydantic`` field.

    Raises:
        ValueError: ``group`` is not one of :data:`GROUPS`.
    """
    group = group or (mode if mode != "both" else "general")
    if group not in GROUPS:
        raise ValueError(f"unknown settings group {group!r}")
    extra: JsonDict = {"group": group, "mode": mode, "flagged": flagged}
    optional = {"kind": kind, "flag": flag, "shown_default": shown_default, "metavar": metavar}
    extra.update({k: v for k, v in optional.items() if v is not None})
    return Field(default, description=description, json_schema_extra=extra, **field)


_FACTS = {f.name for f in dataclasses.fields(Facts)}


def facts(field: FieldInfo) -> Facts:
    """The facts of a settings field.

    Args:
        field: the field (``Model.model_fields[name]``).

    Returns:
        What :func:`setting` recorded (a field declared otherwise has the defaults).
    """
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return Facts(**{k: v for k, v in extra.items() if k in _FACTS})  # type: ignore[arg-type]


def split_list(value: Any) -> Any:
    """A list setting's value: text from the environment is a JSON array or comma-separated.

    Args:
        value: the raw value.

    Returns:
        A list for text, else the value itself.
    """
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


_SIZE = re.compile(r"^(\d+)\s*([kmg]?)(?:i?b)?$")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(text: str) -> int:
    """Bytes of ``256m``/``1g``/``512k``/``1048576`` (binary units).

    Args:
        text: the size (a trailing ``b``/``ib`` is accepted, case does not matter).

    Returns:
        The byte count.

    Raises:
        ValueError: it is not a positive byte count or size.
    """
    match = _SIZE.match(text.strip().lower())
    if match is None or int(match.group(1)) <= 0:
        raise ValueError("must be a positive byte count or a size such as 256m")
    return int(match.group(1)) * _UNITS[match.group(2)]


def coerce(field: FieldInfo, value: Any) -> Any:
    """A raw value in the form its field's kind takes: a list from text, bytes from a size.

    Args:
        field: the field.
        value: the value as a source gave it.

    Returns:
        The value to validate.

    Raises:
        ValueError: a size that is no size.
    """
    kind = facts(field).kind
    if kind in ("list", "paths"):
        return split_list(value)
    if kind == "size" and value is not None:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("must be a byte count or a size such as 256m")
        return parse_size(str(value))
    return value


class Table(BaseModel):
    """A TOML table of settings (a runtime's): its fields are settings named ``<table>_<field>``
    when flat (``--docker-memory``, ``CODEMODE_DOCKER_MEMORY``)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    @field_validator("*", mode="before")
    @classmethod
    def _by_kind(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return coerce(cls.model_fields[info.field_name], value)


def is_table(field: FieldInfo) -> bool:
    """Whether a settings field is a :class:`Table`.

    Args:
        field: the field.

    Returns:
        True for a table.
    """
    kind = field.annotation
    return isinstance(kind, type) and issubclass(kind, Table)


@dataclass(frozen=True)
class Leaf:
    """One setting as the flags, variables and docs see it: ``name`` flat (``docker_memory``),
    ``path`` where it is in the model (``("docker", "memory")``), ``field`` its pydantic field and
    ``facts`` its :class:`Facts` (a table's setting has the table's group and mode)."""

    name: str
    path: tuple[str, ...]
    field: FieldInfo
    facts: Facts

    @property
    def flag(self) -> str:
        """Its flag: ``--`` and the name with ``-`` for ``_``, unless its facts give one."""
        return self.facts.flag or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        """Its environment variable: ``CODEMODE_`` and the name in upper case."""
        return ENV_PREFIX + self.name.upper()


def leaves(model: type[BaseModel]) -> Iterator[Leaf]:
    """Every setting of a model, a table's each flat under the table's group and mode.

    Args:
        model: the settings model.

    Yields:
        The settings in declaration order.
    """
    for name, field in model.model_fields.items():
        outer = facts(field)
        if not is_table(field):
            yield Leaf(name, (name,), field, outer)
            continue
        table: type[Table] = field.annotation  # type: ignore[assignment]
        for inner_name, inner in table.model_fields.items():
            inner_facts = dataclasses.replace(facts(inner), group=outer.group, mode=outer.mode)
            yield Leaf(f"{name}_{inner_name}", (name, inner_name), inner, inner_facts)
