"""``ProcessOptions``: every option of the process runtime, checked when it is made.

``ProcessRuntime(options)`` takes them whole. The names are the runtimes' one name per concept
(docs/reference/runtimes.md): ``memory`` the worker's memory limit, ``max_processes`` its processes
and threads, ``open_files`` its descriptors. The settings (``settings.process``: the
``--process-<name>`` flags, ``CODEMODE_PROCESS_<NAME>`` variables and the ``[process]`` TOML table)
set the ones an operator may choose; the others (the worker's command, its environment, the spawn
timeout) are for tests, benchmarks and operator tools. A refused value raises ``OptionError`` (a
``ValueError``), one line naming the option.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from ..base import OptionError

__all__ = ["SPAWN_MODES", "TEMPLATE_ENTRIES", "ProcessOptions", "Spawn"]

Spawn = Literal["template", "classic"]
#: How worker processes are made: forked from the worker template (default), or started one by one.
SPAWN_MODES: tuple[Spawn, ...] = ("template", "classic")
#: The worker modules the template can fork, and the template's flag for each.
TEMPLATE_ENTRIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"codemode_worker": (), "codemode_worker.testing_entry": ("--testing",)}
)


def _command(name: str, value: Sequence[str] | None) -> tuple[str, ...] | None:
    """A command line as a tuple nobody can change, or None; ``OptionError`` otherwise."""
    if value is None:
        return None
    if isinstance(value, str) or not value or not all(isinstance(p, str) for p in value) or not value[0]:
        raise OptionError(name, f"{name} must be a list of strings, the first naming the program")
    return tuple(value)


@dataclass(frozen=True)
class ProcessOptions:
    """Every option of ``ProcessRuntime``, frozen and checked.

    Args:
        spawn: ``"template"`` (forked from the worker template) or ``"classic"`` (``python -I``
            started for each worker); None: the template, or classic when ``argv`` replaces the
            worker's command (a command is started, not forked).
        memory: ``RLIMIT_AS`` of each worker in bytes (0: none).
        cpu_seconds: ``RLIMIT_CPU`` of each worker.
        open_files: ``RLIMIT_NOFILE`` of each worker.
        max_processes: ``RLIMIT_NPROC`` of a worker's uid (processes and threads; only with a uid
            of its own, the limit counts per uid).
        worker_uid_base: first of ``worker_uids`` uids given to live workers, one each; None =
            ``DEFAULT_UID_BASE`` when the host runs as root, else no uid change; 0 = never change
            uid.
        worker_uids: how many uids from ``worker_uid_base`` on.
        spawn_timeout: seconds a worker has to start and answer the probe.
        python: the interpreter (None: the host's own).
        module: the worker module ``python -I -m`` runs.
        extra_env: variables added to the worker's minimal environment.
        argv: replaces the whole worker command line (tests run fake workers this way).
        template_argv: replaces the template's command (tests only).

    Raises:
        OptionError: a value is refused (one line naming the option).
    """

    spawn: Spawn | None = None
    memory: int = 2 * 1024**3
    cpu_seconds: float = 30.0
    open_files: int = 32
    max_processes: int = 16
    worker_uid_base: int | None = None
    worker_uids: int = 4096
    spawn_timeout: float = 10.0
    python: str | None = None
    module: str = "codemode_worker"
    extra_env: Mapping[str, str] | None = None
    argv: Sequence[str] | None = None
    template_argv: Sequence[str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", _command("argv", self.argv))  # frozen: tuples
        object.__setattr__(self, "template_argv", _command("template_argv", self.template_argv))
        if self.extra_env is not None:
            env = dict(self.extra_env)
            if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in env.items()):
                raise OptionError("extra_env", "extra_env must map non-empty names to strings")
            object.__setattr__(self, "extra_env", MappingProxyType(env))
        self._check_numbers()
        if self.python is not None and not (isinstance(self.python, str) and self.python):
            raise OptionError("python", "python must be the path of an interpreter")
        if self.spawn is not None and self.spawn not in SPAWN_MODES:
            raise OptionError("spawn", f"spawn must be one of {', '.join(SPAWN_MODES)}, not {self.spawn!r}")
        if self.spawn == "template" and self.argv is not None:
            raise OptionError("spawn", "argv replaces the worker's command: it needs spawn='classic'")
        if (
            self.spawn_mode == "template"
            and self.template_argv is None
            and self.module not in TEMPLATE_ENTRIES
        ):
            raise OptionError(
                "module", f"the worker template cannot fork module {self.module!r} (use spawn='classic')"
            )

    def _check_numbers(self) -> None:
        for name, least in (("memory", 0), ("open_files", 1), ("max_processes", 1), ("worker_uids", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise OptionError(name, f"{name} must be a whole number of at least {least}, got {value!r}")
        base = self.worker_uid_base
        if base is not None and (isinstance(base, bool) or not isinstance(base, int) or base < 0):
            raise OptionError(
                "worker_uid_base", f"worker_uid_base must be a whole number of at least 0, got {base!r}"
            )
        for name in ("cpu_seconds", "spawn_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise OptionError(name, f"{name} must be a number of seconds, got {value!r}")
            if value <= 0:
                raise OptionError(name, f"{name} must be positive, got {value!r}")

    @property
    def spawn_mode(self) -> Spawn:
        """How workers are made: ``spawn``, or its default (classic when ``argv`` is given)."""
        if self.spawn is not None:
            return self.spawn
        return "classic" if self.argv is not None else "template"

    def with_command(self, command: Sequence[str]) -> ProcessOptions:
        """These options with the worker's command replaced (operator tools that measure a worker,
        ``codemode quotas tune``): started for each worker, never forked from the template.

        Args:
            command: the worker's whole command line.

        Returns:
            The new options.
        """
        return dataclasses.replace(self, argv=tuple(command), spawn=None)
