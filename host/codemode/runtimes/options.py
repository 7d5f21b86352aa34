"""The worker options of each runtime, one frozen type each, with one name per concept across
runtimes (docs/reference/runtimes.md): ``memory`` (the worker's memory limit), ``max_processes``
(processes and threads), ``open_files`` (descriptors), ``image``. The settings hold one of each
(``settings.process``, ``settings.docker``, ``settings.kubernetes``: the ``--<runtime>-<name>`` flags,
``CODEMODE_<RUNTIME>_<NAME>`` variables and ``[<runtime>]`` TOML tables). Each type lives with its
runtime (``codemode.runtimes.process.options``, ``.docker.options``, ``.kubernetes.options``) and is
that runtime's whole options, taken by its constructor as they are; this module names them together.
"""

from __future__ import annotations

from .docker.options import DockerOptions
from .kubernetes.options import KubernetesOptions
from .process.options import ProcessOptions

__all__ = ["OPTIONS", "DockerOptions", "KubernetesOptions", "ProcessOptions", "RuntimeOptions"]

RuntimeOptions = ProcessOptions | DockerOptions | KubernetesOptions

#: The options type of each runtime, by the name ``--runtime`` takes.
OPTIONS: dict[str, type[ProcessOptions] | type[DockerOptions] | type[KubernetesOptions]] = {
    "process": ProcessOptions,
    "docker": DockerOptions,
    "kubernetes": KubernetesOptions,
}
