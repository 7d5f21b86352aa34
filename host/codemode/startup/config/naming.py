"""Every setting's flag and environment variable, and the one error type that names them: each
:class:`ConfigError` is one line citing ``--flag / CODEMODE_VARIABLE``. The names come from the
settings' facts (:func:`~codemode.startup.config.facts.leaves`)."""

from __future__ import annotations

import functools

from .facts import ENV_PREFIX, Leaf, leaves
from .fields import SettingsFields

#: The variable naming the TOML settings file (``--config``).
CONFIG_ENV = "CODEMODE_CONFIG"


class ConfigError(ValueError):
    """The configuration is unusable. The message is one line naming the setting's flag and
    environment variable; front ends print it and exit 2."""


@functools.cache
def _by_name() -> dict[str, Leaf]:
    return {leaf.name: leaf for leaf in leaves(SettingsFields)}


def leaf(name: str) -> Leaf | None:
    """The setting of a flat name.

    Args:
        name: the name (``pool``, ``docker_memory``).

    Returns:
        Its leaf, or None when no setting has that name.
    """
    return _by_name().get(name)


def flag(field: str) -> str:
    """The command-line flag of a setting.

    Args:
        field: the flat name (``max_execution_time``, ``docker_memory``).

    Returns:
        Its flag (``--max-execution-time``; a repeatable one is singular: ``--pack``).
    """
    found = leaf(field)
    return found.flag if found is not None else "--" + field.replace("_", "-")


def env_var(field: str) -> str:
    """The environment variable of a setting.

    Args:
        field: the flat name.

    Returns:
        ``CODEMODE_`` and the name in upper case.
    """
    return ENV_PREFIX + field.upper()


def names(field: str) -> str:
    """``--flag / CODEMODE_FIELD`` for a setting (what every configuration error cites).

    Args:
        field: the flat name.

    Returns:
        The flag and the variable.
    """
    return f"{flag(field)} / {env_var(field)}"
