"""The worker options of each runtime, one frozen type each, with one name per concept across
runtimes (docs/reference/runtimes.md): ``memory`` (the worker's memory limit), ``max_processes``
(processes and threads), ``open_files`` (descriptors), ``image``. The settings hold one of each
(``settings.process``, ``settings.docker``, ``settings.kubernetes``: the ``--<runtime>-<name>`` flags,
``CODEMODE_<RUNTIME>_<NAME>`` variables and ``[<runtime>]`` TOML tables). ``ProcessOptions``
(``codemode.runtimes.process.options``) and ``KubernetesOptions``
(``codemode.runtimes.kubernetes.options``) are those runtimes' whole options, taken by their
constructors as they are; of ``DockerOptions`` a field left None takes the runtime's own default, and
:meth:`runtime_kwargs` names the runtime's constructor parameters."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .kubernetes.options import KubernetesOptions
from .process.options import ProcessOptions

__all__ = ["OPTIONS", "DockerOptions", "KubernetesOptions", "ProcessOptions", "RuntimeOptions"]


def _given(options: object, parameters: dict[str, str]) -> dict[str, Any]:
    """The fields of ``options`` that are set, under their constructor parameter names."""
    return {
        parameters.get(f.name, f.name): getattr(options, f.name)
        for f in fields(options)  # type: ignore[arg-type]
        if getattr(options, f.name) is not None
    }


@dataclass(frozen=True)
class DockerOptions:
    """``DockerRuntime``'s options: ``image`` the worker image, ``base_url`` the Docker Engine
    endpoint, ``memory`` memory+swap in bytes, ``cpus`` the CPU quota, ``max_processes`` the pids
    limit, ``open_files`` ``RLIMIT_NOFILE``, ``oci_runtime`` the OCI runtime (e.g. ``runsc``)."""

    image: str | None = None
    base_url: str | None = None
    memory: int | None = None
    cpus: float | None = None
    max_processes: int | None = None
    open_files: int | None = None
    oci_runtime: str | None = None

    def runtime_kwargs(self) -> dict[str, Any]:
        """The constructor arguments of these options.

        Returns:
            ``DockerRuntime(**kwargs)`` for the fields that are set, under its parameter names.
        """
        return _given(
            self,
            {
                "memory": "memory_bytes",
                "max_processes": "pids_limit",
                "open_files": "nofile",
                "oci_runtime": "runtime",
            },
        )


RuntimeOptions = ProcessOptions | DockerOptions | KubernetesOptions

#: The options type of each runtime, by the name ``--runtime`` takes.
OPTIONS: dict[str, type[ProcessOptions] | type[DockerOptions] | type[KubernetesOptions]] = {
    "process": ProcessOptions,
    "docker": DockerOptions,
    "kubernetes": KubernetesOptions,
}
