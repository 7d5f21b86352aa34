"""What a worker container does not see of ``/proc`` and ``/sys``: the machine's counters.

A container's ``/proc`` and ``/sys`` show the whole machine's counters, and every container of the
node reads the same ones. Whatever a worker can move (threads, a fork, memory, open files, cached
names, locks) another tenant's worker on the node can read: a covert channel between tenants, which
measured 15 to 25 bits/s through ``/proc/stat``'s fork count and ``/proc/loadavg``'s thread count
(tests/adversarial/test_docker_channels.py). The same counters also tell a worker how
busy the node's other tenants are.

``MASKED_PATHS`` is the ``MaskedPaths`` of every worker container (``DockerRuntime``): the engine's
own default list (an explicit list replaces it), the counters of ``/proc`` and everything of
``/sys`` but ``/sys/fs`` (the reuse mode's supervisor reads its cgroup's files there; the
file-system entries beside it count writes, which no worker can make). The engine mounts an empty
file or directory over each one; a path the node does not have is skipped. Nothing a worker runs
needs them: glibc's processor count (``os.cpu_count``) falls back from ``/sys`` and ``/proc/stat`` to
``sched_getaffinity``.

The worker's own seccomp filter refuses ``sysinfo``, which tells the process count and free memory
without ``/proc``, and its Landlock domain (``codemode_worker.readable``) refuses every file of
``/proc`` and ``/sys`` on every runtime, its own ``numa_maps`` and ``smaps`` included (they tell how
many processes of the node map a page: a channel no mask here covers). These masks are what holds on
a kernel without Landlock. Kubernetes has no per-path mask in a pod's spec: docs/reference/runtimes.md
and SECURITY.md say what stays readable there without Landlock and what closes it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ENGINE_DEFAULTS", "MACHINE_COUNTERS", "MASKED_PATHS"]

#: Docker's own default masks (20.10 and later; a later engine added the powercap entry).
ENGINE_DEFAULTS: Final = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)

#: The machine-wide counters and lists of ``/proc`` (a pid namespace and a network namespace
#: already make ``/proc/<pid>``, ``/proc/net`` and ``/proc/sysvipc`` the container's own).
MACHINE_COUNTERS: Final = (
    "/proc/stat",  # forks, running threads, CPU time, interrupts
    "/proc/loadavg",  # running and existing threads, load
    "/proc/uptime",  # idle time of every CPU
    "/proc/meminfo",
    "/proc/vmstat",
    "/proc/zoneinfo",
    "/proc/buddyinfo",
    "/proc/pagetypeinfo",
    "/proc/slabinfo",
    "/proc/vmallocinfo",
    "/proc/swaps",
    "/proc/diskstats",
    "/proc/interrupts",
    "/proc/softirqs",
    "/proc/schedstat",
    "/proc/pressure",
    "/proc/locks",  # every file lock of the machine
    "/proc/key-users",
    "/proc/cgroups",  # how many cgroups (containers) exist
    "/proc/sys/fs",  # open files, inodes, cached names (file-nr, inode-nr, dentry-state)
    "/proc/sys/kernel/pty",  # pseudo-terminals in use
)

#: ``/sys`` but ``/sys/fs``.
_SYS: Final = (
    "/sys/block",
    "/sys/bus",
    "/sys/class",
    "/sys/dev",
    "/sys/devices",
    "/sys/hypervisor",
    "/sys/kernel",
    "/sys/module",
    "/sys/power",
)

MASKED_PATHS: Final = tuple(dict.fromkeys((*ENGINE_DEFAULTS, *MACHINE_COUNTERS, *_SYS)))
"""Every worker container's ``MaskedPaths``."""
