"""``serve`` flags generated from the settings model: one flag per setting
(:func:`~codemode.startup.config.leaves`), its help showing the real default, the unit and the
environment variable, its group, kind and the modes (``--stdio``, ``--http``) in which it means
something read from the setting's facts (:func:`~codemode.startup.config.setting`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

from ..startup.config import ConfigError, Leaf, Settings, leaves
from ..startup.config.facts import GROUPS

__all__ = ["Mode", "add_settings_flags", "overrides", "settings_table"]

#: The transport ``serve`` runs.
Mode = Literal["stdio", "http"]

#: The value name of a flag by its setting's kind.
_METAVARS = {"size": "SIZE", "list": "VALUE", "paths": "FILE", "path": "FILE", "duration": "SECONDS"}


def _default_text(leaf: Leaf) -> str:
    if leaf.facts.shown_default is not None:
        return leaf.facts.shown_default
    default = leaf.field.get_default(call_default_factory=True)
    if default is None or default == []:
        return ""
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, list):
        return ",".join(str(v) for v in default)
    return str(default)


def _scalar(annotation: Any) -> Any:
    """The argparse ``type`` of a field (None for strings and paths)."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    args = (
        [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) else [annotation]
    )
    kind = args[0] if args else annotation
    if kind is bool:
        return bool
    if kind in (int, float):
        return kind
    if get_origin(kind) is Literal:
        return list(get_args(kind))
    return None


def _metavar(leaf: Leaf, kind: Any) -> str:
    if leaf.facts.metavar:
        return leaf.facts.metavar
    if leaf.facts.kind is not None:
        return _METAVARS[leaf.facts.kind]
    if kind in (int, float):
        return "N"
    return leaf.name.rsplit("_", 1)[-1].upper()


def add_settings_flags(parser: argparse.ArgumentParser, model: type[BaseModel] = Settings) -> None:
    """One flag per setting, grouped; every flag defaults to None (= not given).

    Args:
        parser: the ``serve`` parser.
        model: the settings model (a model derived from :class:`Settings` adds its own).
    """
    groups: dict[str, Any] = {}
    for leaf in leaves(model):
        if not leaf.facts.flagged:
            continue
        title = GROUPS[leaf.facts.group]
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        group, field = groups[title], leaf.field
        default = _default_text(leaf)
        help_text = field.description or leaf.name
        help_text += f" (default: {default}; {leaf.env})" if default else f" ({leaf.env})"
        help_text = help_text.replace("%", "%%")
        kind = None if leaf.facts.kind == "size" else _scalar(field.annotation)
        if leaf.facts.repeated:
            group.add_argument(
                leaf.flag,
                dest=leaf.name,
                action="append",
                default=None,
                metavar=_metavar(leaf, kind),
                help=help_text + "; repeatable",
            )
        elif kind is bool:
            action = argparse.BooleanOptionalAction if field.default is True else "store_const"
            extra = {} if field.default is True else {"const": True}
            group.add_argument(
                leaf.flag, dest=leaf.name, action=action, default=None, help=help_text, **extra
            )
        elif isinstance(kind, list):
            group.add_argument(leaf.flag, dest=leaf.name, choices=kind, default=None, help=help_text)
        else:
            group.add_argument(
                leaf.flag,
                dest=leaf.name,
                type=kind,
                default=None,
                metavar=_metavar(leaf, kind),
                help=help_text,
            )


def overrides(
    args: argparse.Namespace,
    mode: Mode,
    environ: Mapping[str, str] | None = None,
    model: type[BaseModel] = Settings,
) -> dict[str, Any]:
    """The settings given as flags. Repeatable flags add to the comma-separated lists of their
    environment variables.

    Args:
        args: the parsed flags.
        mode: the transport.
        environ: the environment (None: ``os.environ``).
        model: the settings model the flags were made from.

    Returns:
        Setting name (flat: ``docker_memory``) → value, ``transport`` included.

    Raises:
        ConfigError: a flag means nothing in ``mode`` (an HTTP-only one with ``--stdio``, or the
            other way round).
    """
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {"transport": mode}
    for leaf in leaves(model):
        value = getattr(args, leaf.name, None) if leaf.facts.flagged else None
        if value is None:
            continue
        if mode == "stdio" and leaf.facts.mode == "http":
            raise ConfigError(f"{leaf.flag} is for serve --http; it does nothing with --stdio")
        if mode == "http" and leaf.facts.mode == "stdio":
            raise ConfigError(f"{leaf.flag} is for serve --stdio; HTTP subjects come from authentication")
        if leaf.facts.repeated:
            base = [p.strip() for p in environ.get(leaf.env, "").split(",") if p.strip()]
            value = [*base, *value]
        out[leaf.name] = value
    return out


def settings_table(model: type[BaseModel] = Settings) -> str:
    """The Markdown table of every setting (docs/configuration.md carries it; a test compares).

    Args:
        model: the settings model.

    Returns:
        The table: flag, environment variable, default, modes and meaning of each setting.
    """
    rows = ["| flag | environment | default | modes | meaning |", "|---|---|---|---|---|"]
    for leaf in leaves(model):
        if not leaf.facts.flagged:
            continue
        default = (_default_text(leaf) or "—").replace("|", "\\|")
        rows.append(
            f"| `{leaf.flag}` | `{leaf.env}` | {default} | {leaf.facts.mode} | {leaf.field.description} |"
        )
    return "\n".join(rows)
