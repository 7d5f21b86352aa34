"""The one settings model: :class:`Settings` is every setting (:mod:`.fields`), read from its sources
(:mod:`.sources`) and checked across settings (:mod:`.checks`) when it is made."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from ...common.did_you_mean import did_you_mean
from ...execution.admission import default_quota
from ...execution.limits import DEFAULTS, Limits
from . import checks
from .facts import Leaf
from .facts import leaves as walk
from .fields import SettingsFields
from .naming import CONFIG_ENV, ConfigError
from .sources import Nesting, TomlSource, config_file, config_origin


class Settings(SettingsFields):
    """Everything a front end needs. See docs/configuration.md for each setting."""

    #: Where these settings were read from, for problems found after loading (:meth:`origin`).
    _origin: str = PrivateAttr(default="settings")

    def origin(self) -> str:
        """Where a problem of these settings is, for its one line: the configuration file
        (``--config / CODEMODE_CONFIG: 'path'``) when one was read, else ``settings``.

        Returns:
            The origin, without a trailing colon.
        """
        return self._origin

    @model_validator(mode="before")
    @classmethod
    def _flatten_limits(cls, data: Any) -> Any:
        """Accept ``limits = {...}`` / a ``[limits]`` table (or a ``codemode.Limits``) as flat fields."""
        if isinstance(data, dict) and "limits" in data:
            data = dict(data)
            nested = data.pop("limits")
            if isinstance(nested, Limits):
                # the fields it changes: the others are left to the environment and the file
                nested = {k: v for k, v in dataclasses.asdict(nested).items() if v != DEFAULTS[k]}
            if not isinstance(nested, dict):
                raise ValueError("limits must be a table of limit values")
            known = [f.name for f in dataclasses.fields(Limits)]
            unknown = sorted(set(nested) - set(known))
            if unknown:
                raise ValueError("; ".join(_unknown_limit(key, known) for key in unknown))
            for key, value in nested.items():
                data.setdefault(key, value)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        slots = self.max_concurrent_executions
        if self.transport == "stdio":
            # One static subject: nobody to protect it from, so it may use every slot.
            for name in ("subject_quota", "reserved_slots"):
                if name not in self.model_fields_set:
                    self.__dict__[name] = 0
        elif "subject_quota" not in self.model_fields_set and self.effective_reserved_slots < slots:
            # Not configured: the default quota, lowered so that one subject can reach it.
            self.__dict__["subject_quota"] = default_quota(slots, self.effective_reserved_slots)
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def problems(self) -> list[str]:
        """Cross-field configuration problems, each naming its flag and environment variable.

        Returns:
            The problems (empty when there are none).
        """
        return checks.problems(self)

    def http_problems(self) -> list[str]:
        """What ``serve --http`` needs beyond :meth:`problems`: authentication and listening.

        Returns:
            The problems (empty when there are none).
        """
        return checks.http_problems(self)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        init, env = Nesting(settings_cls, init_settings), Nesting(settings_cls, env_settings, known_only=True)
        sources: list[PydanticBaseSettingsSource] = [init, env]
        path = config_file()
        if path is not None:
            if not path.is_file():
                raise ConfigError(f"--config / {CONFIG_ENV}: config file {str(path)!r} does not exist")
            runtime = init().get("runtime") or env().get("runtime")
            sources.append(TomlSource(settings_cls, path, runtime))
        return tuple(sources)


def _unknown_limit(key: str, known: list[str]) -> str:
    """An unknown key of the ``[limits]`` table, said as an unknown top-level key is: where it
    is, and the closest limit name."""
    return f"{config_origin()}: unknown limit {key!r} in [limits]{did_you_mean(key, known)}"


def leaves(model: type[BaseModel] = Settings) -> list[Leaf]:
    """Every setting of a settings model, a runtime table's each flat (``docker_memory``): what
    the flag, variable and docs generators walk.

    Args:
        model: the model (:class:`Settings`, or a model derived from it).

    Returns:
        The settings in declaration order.
    """
    return list(walk(model))
