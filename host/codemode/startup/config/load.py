"""Loading the settings: :func:`load_settings` makes them from the flags given, the environment and
the file, and turns every problem into one :class:`~.naming.ConfigError` line naming the flag and
the variable; a ``CODEMODE_*`` variable close to a setting's but no setting is warned about."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from ...common.did_you_mean import closest, did_you_mean
from .facts import ENV_PREFIX, is_table, leaves
from .model import Settings
from .naming import CONFIG_ENV, ConfigError, names
from .sources import config_origin, using_config

log = logging.getLogger("codemode.config")

#: ``CODEMODE_*`` variables that are not settings but are read (never flagged as misspelled; packs
#: read their own ``CODEMODE_<PACK>_*`` variables, which are never compared with the settings).
OTHER_VARIABLES = frozenset({CONFIG_ENV, "CODEMODE_TRANSPORT"})
_warned: set[str] = set()


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Settings from keyword overrides, the environment and a TOML file.

    Args:
        config_file: the TOML file; takes the place of ``CODEMODE_CONFIG``.
        overrides: setting values that win over the environment and the file (the flags); a
            runtime's settings flat (``docker_memory``) or as its table (``docker={...}``).

    Returns:
        The settings.

    Raises:
        ConfigError: every problem (never quoting a value: ``store`` may hold a password).
    """
    from pathlib import Path

    path = Path(config_file) if config_file is not None else None
    _warn_misspelled()
    with using_config(path):
        try:
            settings = Settings(**overrides)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None
        settings._origin = config_origin()
        return settings


def _describe(exc: ValidationError) -> str:
    """One line for a pydantic ``ValidationError``: each problem with its flag and variable."""
    parts = []
    fields = Settings.model_fields
    for err in exc.errors(include_url=False, include_input=False):
        loc = [str(p) for p in err["loc"]]
        message = str(err["msg"]).removeprefix("Value error, ")
        table = len(loc) >= 2 and loc[0] in fields and is_table(fields[loc[0]])
        if err["type"] == "extra_forbidden" and len(loc) == 1:
            parts.append(_unknown_setting(loc[0]))
        elif err["type"] == "extra_forbidden" and table and len(loc) == 2:
            choices = list(fields[loc[0]].annotation.model_fields)  # type: ignore[union-attr]
            parts.append(
                f"{config_origin()}: unknown setting {loc[1]!r} in [{loc[0]}]{did_you_mean(loc[1], choices)}"
            )
        elif table:
            parts.append(f"{names(f'{loc[0]}_{loc[1]}')}: {message}")
        elif loc and loc[0] in fields:
            parts.append(f"{names(loc[0])}: {message}")
        elif loc:
            parts.append(f"{'.'.join(loc)}: {message}")
        else:
            parts.append(message)
    return "; ".join(parts)


def _unknown_setting(key: str) -> str:
    """An unknown key: in the configuration file (the only source that can hold one), with the
    closest setting name (the tables' names among them: ``[limit]`` is a typo too)."""
    choices = [leaf.name for leaf in leaves(Settings)] + [
        n for n, f in Settings.model_fields.items() if is_table(f)
    ]
    return f"{config_origin()}: unknown setting {key!r}{did_you_mean(key, [*choices, 'limits'])}"


def misspelled_variables(environ: Mapping[str, str]) -> list[str]:
    """One warning per ``CODEMODE_*`` variable that is no setting but close to one (``did you
    mean``); variables close to no setting (a pack's options, say) are left alone.

    Args:
        environ: the environment.

    Returns:
        The warnings.
    """
    known = {leaf.env for leaf in leaves(Settings)}
    out = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known or name in OTHER_VARIABLES:
            continue
        close = closest(name, sorted(known), cutoff=0.88)
        if close:
            out.append(f"{name} is not a setting and is ignored: did you mean {close}?")
    return out


def _warn_misspelled() -> None:
    for line in misspelled_variables(os.environ):
        if line not in _warned:
            _warned.add(line)
            log.warning("%s", line)
