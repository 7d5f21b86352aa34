"""Whose worker a container is, and the orphan rule (docs/docker.md): which containers of a
crashed or restarted host ``start()`` and the periodic sweep may remove.

Every worker container carries labels naming its owner: an id, and the owner process's pid, start
time, host name, kernel boot and PID namespace (``_OWNER``, this host process; a forked child is
another host process and gets its own).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from codemode_worker import PROTOCOL_VERSION

from ..streams import CleanupMode, HostIdentity, process_start

__all__ = ["OWNER", "is_orphan", "owner_labels"]

#: Identity of this host process, recorded in every container's labels.
OWNER = HostIdentity()
# A forked child is another host process: it gets its own owner id.
os.register_at_fork(after_in_child=OWNER.refresh)


def owner_labels(prefix: str, owner: str, instance_id: str) -> dict[str, str]:
    """The labels every worker container of a runtime gets.

    Args:
        prefix: the runtime's label prefix.
        owner: the owner id (this host process's, unless the options name one).
        instance_id: the runtime object's id (``aclose()`` sweeps its own containers by it).

    Returns:
        Role, owner and the owner's identity (pid, start time, host, boot, PID namespace).
    """
    return {
        f"{prefix}.role": "worker",
        f"{prefix}.owner": owner,
        f"{prefix}.owner-pid": str(OWNER.pid),
        f"{prefix}.owner-start": OWNER.start,
        f"{prefix}.owner-host": OWNER.host,
        f"{prefix}.owner-boot": OWNER.boot,
        f"{prefix}.owner-pidns": OWNER.pidns,
        f"{prefix}.runtime-instance": instance_id,
        f"{prefix}.protocol-version": str(PROTOCOL_VERSION),
    }


def is_orphan(
    labels: Mapping[str, str], *, prefix: str, owner: str, cleanup: CleanupMode, proven_only: bool = False
) -> bool:
    """The orphan rule: may a container with these labels be removed?

    Args:
        labels: the container's labels.
        prefix: the runtime's label prefix.
        owner: the runtime's own owner id (its containers are never orphans).
        cleanup: ``"dead"`` (owner provably dead), ``"all"`` (any other owner), ``"none"``.
        proven_only: skip the host-name rule, a guess that holds only at this host's start.

    Returns:
        True for a worker of this label prefix whose owner process is gone.
    """
    theirs = labels.get(f"{prefix}.owner", "")
    if labels.get(f"{prefix}.role") != "worker" or theirs == owner:
        return False
    if cleanup == "all":
        return True
    if cleanup != "dead":
        return False
    host = labels.get(f"{prefix}.owner-host", "")
    boot = labels.get(f"{prefix}.owner-boot", "")
    pidns = labels.get(f"{prefix}.owner-pidns", "")
    same_machine = bool(boot) and boot == OWNER.boot and bool(pidns) and pidns == OWNER.pidns
    if same_machine:
        # Same kernel boot and pid namespace: the owner is alive iff its pid runs and is the
        # same process (start time guards against pid reuse).
        try:
            pid = int(labels.get(f"{prefix}.owner-pid", ""))
        except ValueError:
            return False
        start = labels.get(f"{prefix}.owner-start", "")
        now = process_start(pid)
        return not now or (bool(start) and now != start)
    # The same host name in another boot or pid namespace: this host was restarted (a rebooted
    # machine, a restarted host container or pod keeps its name), so the old owner is dead. A
    # guess that only this host's start may make: a live peer can share the host name (host
    # networking, a set hostname), and this host can't see into its pid namespace.
    return not proven_only and bool(host) and host == OWNER.host
