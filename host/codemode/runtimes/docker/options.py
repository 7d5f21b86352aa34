"""``DockerOptions``: every option of the Docker runtime, checked when it is made.

``DockerRuntime(options)`` takes them whole. The names are the runtime's one name per concept
(docs/reference/runtimes.md): ``memory`` the worker's memory, ``max_processes`` its processes and
threads, ``open_files`` its descriptors, ``image`` its image, ``oci_runtime`` the OCI runtime. The
settings (``settings.docker``: the ``--docker-<name>`` flags, ``CODEMODE_DOCKER_<NAME>`` variables
and the ``[docker]`` TOML table) set the ones an operator may choose; the others are for tests,
benchmarks and operator tools. A refused value raises ``OptionError`` (``codemode.runtimes.base``),
one line naming the option. This module imports no Docker SDK.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from codemode_worker import PROTOCOL_VERSION

from ..base import OptionError
from ..streams import STDOUT_BUFFER, CleanupMode

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_LABEL_PREFIX",
    "DEFAULT_MEMORY_BYTES",
    "MIN_MEMORY_BYTES",
    "CleanupMode",
    "DockerOptions",
    "OptionError",
]

#: The worker image; its tag is the protocol version it speaks.
DEFAULT_IMAGE = f"codemode-worker:{PROTOCOL_VERSION}"
DEFAULT_LABEL_PREFIX = "io.codemode"
DEFAULT_MEMORY_BYTES = 256 * 1024 * 1024
#: The least memory limit the Docker Engine accepts.
MIN_MEMORY_BYTES = 6 * 1024 * 1024

#: Options in seconds (each must be positive).
_SECONDS = ("spawn_timeout", "api_timeout", "check_timeout", "wait_timeout", "end_timeout")
#: Options that are counts (each a positive whole number).
_COUNTS = ("max_processes", "open_files", "stdout_buffer_bytes", "executor_threads")


@dataclass(frozen=True)
class DockerOptions:
    """Every option of ``DockerRuntime``, frozen and checked.

    Args:
        image: the worker image (default ``codemode-worker:<protocol version>``).
        base_url: the Docker Engine endpoint; None: ``DOCKER_HOST``/``DOCKER_TLS_VERIFY``/
            ``DOCKER_CERT_PATH``, else ``unix:///var/run/docker.sock``.
        memory: the container's memory limit in bytes; swap is disabled (memory+swap = the same
            value). At least 6 MiB (the engine's minimum).
        cpus: the CPU quota in CPUs (``NanoCpus``).
        max_processes: the cgroup pids limit (processes and threads).
        open_files: ``RLIMIT_NOFILE`` inside the container (core files are always disabled).
        oci_runtime: an OCI runtime registered with dockerd (e.g. ``"runsc"`` for gVisor), or None
            for the daemon's default.
        owner: this host's instance id, written to the owner label (default: random per host
            process, renewed after fork).
        label_prefix: the prefix of the container labels (``<prefix>.role``, ``<prefix>.owner``, ...).
        cleanup_orphans: what ``start()`` removes: ``"dead"`` (containers whose owner is provably
            dead), ``"all"`` (every worker container not owned by this instance), ``"none"``.
        spawn_timeout: seconds for the worker to answer the probe after start.
        api_timeout: seconds for one Docker API call (connect and read).
        check_timeout: seconds for ``check()`` as a whole.
        wait_timeout: seconds ``destroy()`` waits for a killed container to stop.
        stdout_buffer_bytes: how much worker stdout is buffered before the reader stops reading
            (at least 64 KiB are).
        executor_threads: size of the thread pool that runs blocking Docker calls (at least 4 run).
        entrypoint: replaces the image's entrypoint (operators' diagnostics and tests only: ``codemode
            quotas tune`` runs the image's worker through a holding wrapper); None = the image's.
        supervisor_entrypoint: the command of a reusable sandbox (``spawn_supervised``, the reuse
            mode; default ``python3 -I -m codemode_worker.supervisor``, with ``--testing`` under
            ``testing_entry``); tests only.
        end_timeout: seconds a reusable sandbox's supervisor has to end an execute's worker, scrub
            and verify before the sandbox is recycled instead.
        testing_entry: TEST ONLY. Runs ``codemode_worker.testing_entry`` with
            ``CODEMODE_WORKER_TESTING=1`` (use the test image, ``codemode-worker-testing``): a worker
            that executes arbitrary Python. It exists to prove the container contains a compromised
            interpreter; never enable it in a deployment. Excludes ``entrypoint``.

    Raises:
        OptionError: a value is refused (one line naming the option).
    """

    image: str = DEFAULT_IMAGE
    base_url: str | None = None
    memory: int = DEFAULT_MEMORY_BYTES
    cpus: float = 1.0
    max_processes: int = 64
    open_files: int = 64
    oci_runtime: str | None = None
    owner: str | None = None
    label_prefix: str = DEFAULT_LABEL_PREFIX
    cleanup_orphans: CleanupMode = "dead"
    spawn_timeout: float = 10.0
    api_timeout: float = 30.0
    check_timeout: float = 5.0
    wait_timeout: float = 10.0
    stdout_buffer_bytes: int = STDOUT_BUFFER
    executor_threads: int = 32
    entrypoint: Sequence[str] | None = None
    supervisor_entrypoint: Sequence[str] | None = None
    end_timeout: float = 5.0
    testing_entry: bool = False

    def __post_init__(self) -> None:
        for name in ("entrypoint", "supervisor_entrypoint"):
            command = getattr(self, name)
            if command is not None:
                if isinstance(command, str):
                    raise OptionError(name, f"{name} must be a list of strings, not one string")
                command = tuple(command)
                if not command or not all(isinstance(part, str) and part for part in command):
                    raise OptionError(name, f"{name} must be a non-empty list of non-empty strings")
                object.__setattr__(self, name, command)  # frozen: a tuple nobody can change
        for name in ("image", "label_prefix"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise OptionError(name, f"{name} must be a non-empty string, got {value!r}")
        for name in ("base_url", "oci_runtime", "owner"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise OptionError(name, f"{name} must be a non-empty string or None, got {value!r}")
        self._check_sizes()
        self._check_times()
        if self.cleanup_orphans not in ("dead", "all", "none"):
            raise OptionError("cleanup_orphans", "cleanup_orphans must be 'dead', 'all' or 'none'")
        if self.testing_entry and self.entrypoint is not None:
            raise OptionError("entrypoint", "entrypoint and testing_entry exclude each other")

    def _check_sizes(self) -> None:
        memory = self.memory
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < MIN_MEMORY_BYTES:
            raise OptionError("memory", f"memory must be at least 6 MiB (Docker's minimum), got {memory!r}")
        cpus = self.cpus
        if (
            isinstance(cpus, bool)
            or not isinstance(cpus, int | float)
            or not math.isfinite(cpus)
            or cpus <= 0
        ):
            raise OptionError("cpus", f"cpus must be a positive number of CPUs, got {cpus!r}")
        for name in _COUNTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise OptionError(name, f"{name} must be a positive whole number, got {value!r}")

    def _check_times(self) -> None:
        for name in _SECONDS:
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise OptionError(name, f"{name} must be a positive number of seconds, got {value!r}")
