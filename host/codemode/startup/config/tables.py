"""The runtimes' settings: one nested table each (``[process]``, ``[docker]``, ``[kubernetes]`` in
TOML; ``settings.docker.memory``), with one name per concept across runtimes (``memory``,
``max_processes``, ``open_files``, ``image``). Flat, they are ``--docker-memory`` /
``CODEMODE_DOCKER_MEMORY`` / ``docker_memory`` (:func:`~codemode.startup.config.facts.leaves`). A
field left None takes the runtime's own default; :meth:`~ProcessTable.options` gives the runtime's
options object (the options may hold more, for code: tests, benchmarks, operator tools)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

from ...runtimes.options import DockerOptions, KubernetesOptions, ProcessOptions
from .facts import Table, setting

Options = TypeVar("Options", ProcessOptions, DockerOptions, KubernetesOptions)


class RuntimeTable(Table, Generic[Options]):
    """A runtime's table: its fields are options of the runtime's options type."""

    options_type: ClassVar[type[Any]]

    def options(self) -> Options:
        """The runtime's options object.

        Returns:
            The options with the fields that are set (the others keep the options' defaults).

        Raises:
            ValueError: the options refuse a value (the Kubernetes runtime's ``OptionError`` names
                the option).
        """
        options: Options = self.options_type(**self.model_dump(exclude_none=True))
        return options


class ProcessTable(RuntimeTable[ProcessOptions]):
    """The process runtime's settings (``[process]``, ``--process-*``)."""

    options_type = ProcessOptions

    spawn: Literal["template", "classic"] | None = setting(
        None,
        "how worker processes are made: template (default: forked from a pre-imported "
        "worker template) or classic (python -I started for each worker)",
    )
    memory: int | None = setting(
        None, "worker address-space limit (RLIMIT_AS), bytes or 512m/2g (default 2g)", kind="size"
    )
    cpu_seconds: float | None = setting(
        None, "worker CPU time limit in seconds (RLIMIT_CPU, default 30)", kind="duration", gt=0
    )
    open_files: int | None = setting(None, "worker open files limit (RLIMIT_NOFILE, default 32)", gt=0)
    max_processes: int | None = setting(
        None, "processes and threads per worker uid (RLIMIT_NPROC; host as root; default 16)", gt=0
    )
    worker_uid_base: int | None = setting(
        None, "first worker uid when the host runs as root (default 1000000000; 0 = no uid change)", ge=0
    )
    worker_uids: int | None = setting(
        None, "worker uids to hand out, one per live worker (default 4096)", gt=0
    )


class DockerTable(RuntimeTable[DockerOptions]):
    """The Docker runtime's settings (``[docker]``, ``--docker-*``)."""

    options_type = DockerOptions

    image: str | None = setting(None, "worker image (default codemode-worker:<protocol>)")
    base_url: str | None = setting(None, "Docker Engine endpoint (default: DOCKER_HOST or the local socket)")
    memory: int | None = setting(
        None, "worker memory (= memory+swap) limit, bytes or 256m/1g (default 256m)", kind="size"
    )
    cpus: float | None = setting(None, "worker CPU quota in CPUs (default 1)", gt=0)
    max_processes: int | None = setting(
        None, "processes and threads per worker (pids limit, default 64)", gt=0
    )
    open_files: int | None = setting(None, "worker open files limit (RLIMIT_NOFILE, default 64)", gt=0)
    oci_runtime: str | None = setting(None, "OCI runtime such as runsc (gVisor)")


class KubernetesTable(RuntimeTable[KubernetesOptions]):
    """The Kubernetes runtime's settings (``[kubernetes]``, ``--kubernetes-*``)."""

    options_type = KubernetesOptions

    namespace: str | None = setting(None, "namespace of worker pods (default codemode-workers)")
    image: str | None = setting(None, "worker image for pods")
    memory: str | None = setting(None, "memory request = limit of a worker pod, e.g. 256Mi")
    cpu: str | None = setting(None, "CPU limit of a worker pod, e.g. 500m")
    cpu_request: str | None = setting(
        None, "CPU request of a worker pod, e.g. 100m (default 100m: Burstable QoS)"
    )
    runtime_class: str | None = setting(None, "RuntimeClass of worker pods, e.g. gvisor")
    seccomp_profile: str | None = setting(
        None,
        "Localhost seccomp profile of worker pods, relative to the kubelet's seccomp root "
        "(default RuntimeDefault)",
    )
    kubeconfig: Path | None = setting(
        None, "kubeconfig file (default: in-cluster, then $KUBECONFIG / ~/.kube/config)", kind="path"
    )
    context: str | None = setting(None, "kubeconfig context")
