"""What every worker container is made of: the hardening of its host config and its create request.

Every worker container is created with::

    network_mode=none, read_only rootfs, memory = memory+swap limit, CPU quota (NanoCpus),
    pids limit, cap_drop=ALL, no-new-privileges, the worker's seccomp profile (``seccomp_profile``:
    derived from the worker's own filter, which the worker installs on top), a numeric non-root
    user, no volumes, an environment holding only the worker marker, ulimits nofile/core, a private
    IPC namespace without /dev/shm, a read-only /dev/mqueue, the machine's counters in /proc and
    /sys masked (``masked_paths``), the log driver ``none`` (the
    protocol runs over the attach stream; a ``json-file`` log would store everything the worker
    prints on the host's disk, ~36 bytes per 2-byte line, until the container is removed), and
    labels naming the owner.

A reusable sandbox (the reuse mode) is the same container with ``codemode_worker.supervisor`` as
PID 1 and the supervisor's seccomp profile. Pure: the Docker SDK client is passed in.
"""

from __future__ import annotations

import json
from typing import Any

from codemode_worker import WORKER_ENV_MARKER

from ..reuse.supervised import supervisor_command
from ..seccomp_profile import docker_profile, supervisor_profile
from ..testing import TESTING_ENTRY, TESTING_ENV
from .masked_paths import MASKED_PATHS
from .options import DockerOptions

__all__ = [
    "IMAGE_PROTOCOL_LABEL",
    "IMAGE_ROLE_LABEL",
    "WORKER_USER",
    "create_args",
    "host_config",
    "worker_command",
]

#: Image labels set by worker_image/Dockerfile and checked by ``DockerRuntime.check()``.
IMAGE_PROTOCOL_LABEL = "io.codemode.protocol-version"
IMAGE_ROLE_LABEL = "io.codemode.role"
#: The numeric non-root user every worker runs as.
WORKER_USER = "65532:65532"

# Docker mounts a writable mqueue filesystem at /dev/mqueue, and gVisor mounts a writable tmpfs at
# /tmp unless the spec has a /tmp mount: shadow both with tiny read-only, empty tmpfs mounts.
_READ_ONLY_TMPFS = {
    "/dev/mqueue": "ro,nosuid,nodev,noexec,size=4k,mode=0555",
    "/tmp": "ro,nosuid,nodev,noexec,size=4k,mode=0555",
}

#: No container log: the host reads the worker's output on the attach stream (stderr into a bounded
#: tail) and nothing reads ``docker logs`` of a worker.
_NO_LOG = {"Type": "none", "Config": {}}
#: ``--security-opt seccomp=<json>`` of every worker container (the profile's text, not a path).
_SECCOMP_OPT = "seccomp=" + json.dumps(docker_profile(), separators=(",", ":"))
#: The same for a reusable sandbox (the reuse mode): its PID 1 supervisor forks, waits and scrubs.
_SUPERVISOR_SECCOMP_OPT = "seccomp=" + json.dumps(supervisor_profile(), separators=(",", ":"))


def worker_command(options: DockerOptions, *, supervised: bool = False) -> list[str] | None:
    """The command a worker container runs instead of the image's entrypoint.

    Args:
        options: the runtime's options (``entrypoint``, ``supervisor_entrypoint``, ``testing_entry``).
        supervised: a reusable sandbox (its supervisor's command).

    Returns:
        The command, or None for the image's own entrypoint.
    """
    if supervised:
        if options.supervisor_entrypoint is not None:
            return list(options.supervisor_entrypoint)
        return supervisor_command(options.testing_entry)
    if options.testing_entry:
        return list(TESTING_ENTRY)
    return list(options.entrypoint) if options.entrypoint is not None else None


def host_config(api: Any, options: DockerOptions, *, supervised: bool = False) -> dict[str, Any]:
    """The hardened host config of a worker container.

    Args:
        api: the Docker SDK's ``APIClient`` (its ``create_host_config`` checks the API version).
        options: the runtime's options (memory, CPUs, processes, open files, OCI runtime).
        supervised: a reusable sandbox (the supervisor's seccomp profile).

    Returns:
        The ``HostConfig`` of the create request.
    """
    config: dict[str, Any] = api.create_host_config(
        network_mode="none",
        read_only=True,
        mem_limit=options.memory,
        memswap_limit=options.memory,
        nano_cpus=int(options.cpus * 1e9),
        pids_limit=options.max_processes,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges", _SUPERVISOR_SECCOMP_OPT if supervised else _SECCOMP_OPT],
        ulimits=[
            {"Name": "nofile", "Soft": options.open_files, "Hard": options.open_files},
            {"Name": "core", "Soft": 0, "Hard": 0},
        ],
        ipc_mode="none",
        tmpfs=dict(_READ_ONLY_TMPFS),
        log_config=_NO_LOG,
        privileged=False,
        runtime=options.oci_runtime,
    )
    config["MaskedPaths"] = list(MASKED_PATHS)  # the machine's counters (masked_paths)
    return config


def create_args(
    options: DockerOptions, labels: dict[str, str], *, supervised: bool = False
) -> dict[str, Any]:
    """The create request of a worker container, but its host config.

    Args:
        options: the runtime's options (image, commands, the testing entry).
        labels: the container's labels.
        supervised: a reusable sandbox (the supervisor's command).

    Returns:
        The keyword arguments of ``APIClient.create_container`` (``image`` included).
    """
    env = {WORKER_ENV_MARKER: "1"}
    if options.testing_entry:
        env[TESTING_ENV] = "1"
    entrypoint = worker_command(options, supervised=supervised)
    return {
        "image": options.image,
        "entrypoint": entrypoint,
        "command": [] if entrypoint is not None else None,
        "stdin_open": True,
        "tty": False,
        "user": WORKER_USER,
        "environment": env,
        "labels": labels,
        "working_dir": "/",
        "hostname": "worker",
        "network_disabled": True,
    }
