"""``quotas tune``'s recommendation, pure: what a run measured (:class:`RunSample`, a burst), the
factors and steps, and :func:`recommend` (the method: docs/operators.md, and the text of
:mod:`codemode.ops.quotas`). ``codemode.ops.quotas`` measures and re-exports these."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .percentile import percentile
from .quota_probes import Reading

__all__ = [
    "CPU_FACTOR",
    "CPU_REQUEST_STEP",
    "CPU_STEP",
    "DEADLINE_FLOOR",
    "MEMORY_FACTOR",
    "MEMORY_STEP",
    "METHOD",
    "OPEN_FILES_FLOOR",
    "PIDS_FACTOR",
    "PIDS_FLOOR",
    "PROCESSES_FLOOR",
    "TIME_FACTOR",
    "TIME_STEP",
    "Burst",
    "MiB",
    "Recommendation",
    "RunSample",
    "recommend",
]

MiB = 1024 * 1024
#: The recommendation's factors and rounding steps (the module text; :data:`METHOD` says them).
MEMORY_FACTOR = 1.5
MEMORY_STEP = 16 * MiB
CPU_FACTOR = 1.25
CPU_STEP = 0.25
CPU_REQUEST_STEP = 0.05
PIDS_FACTOR = 2
PIDS_FLOOR = 16
OPEN_FILES_FLOOR = 16
PROCESSES_FLOOR = 8
TIME_FACTOR = 2.0
TIME_STEP = 0.1
#: The least deadline recommended (seconds): below it, a pause of the host (a reap, a collection, a
#: neighbour's burst) fails executes that did nothing wrong.
DEADLINE_FLOOR = 1.0


@dataclass
class RunSample(Reading):
    """What one measured run used: the worker's :class:`~codemode.ops.quota_probes.Reading`, given
    by keyword and documented there (``memory_peak_bytes``, ``memory_method``,
    ``memory_rss_end_bytes``, ``address_space_peak_bytes``, ``cpu_s``, ``throttled_periods``,
    ``pids_peak``, ``threads_peak``, ``fds_peak``, ``counters_final``; None: not measured on this
    runtime), and the run's own figures.

    Attributes:
        outcome: ``ok`` or the coarse error text (e.g. ``resource limit exceeded``).
        execute_s: the execute's wall time (starting the worker included).
        detail: for a failed run, the text an execute's client gets (the coarse text plus its
            approved suffix, e.g. ``invalid program: <codemode>:2:12: ...``); ``""`` for ``ok``.
        spawn_s: the worker's spawn time.
        oom_killed: whether the worker was killed for memory.
    """

    outcome: str
    execute_s: float
    detail: str = ""
    spawn_s: float | None = None
    oom_killed: bool = False

    @property
    def cpu_utilisation(self) -> float | None:
        """CPU time over execute wall time (None when either is unknown)."""
        if self.cpu_s is None or self.execute_s <= 0:
            return None
        return self.cpu_s / self.execute_s


@dataclass
class Recommendation:
    """Worker sizing for one runtime.

    Attributes:
        runtime: the runtime measured.
        settings: ``serve`` settings → the values to use.
        max_execution_time: the deadline, with or without a warm pool (a worker start included).
        slots: the ``max_concurrent_executions`` the burst was measured with (None: no burst).
        basis: the measured figures the recommendation comes from.
        assumes: what the deadline assumes, one sentence each.
    """

    runtime: str
    settings: dict[str, Any]
    max_execution_time: float
    slots: int | None = None
    basis: dict[str, Any] = field(default_factory=dict)
    assumes: list[str] = field(default_factory=list)

    def serve_flags(self) -> list[str]:
        """``serve`` flags, with or without ``--pool``.

        Returns:
            ``--runtime``, each setting's flag, ``--max-concurrent-executions`` (the burst's slots)
            and ``--max-execution-time``.
        """
        flags = ["--runtime", self.runtime]
        for name, value in self.settings.items():
            flags += ["--" + name.replace("_", "-"), f"{value:g}" if isinstance(value, float) else str(value)]
        if self.slots is not None:
            flags += ["--max-concurrent-executions", str(self.slots)]
        return [*flags, "--max-execution-time", f"{self.max_execution_time:g}"]


@dataclass
class Burst:
    """A burst of executes sent at once to a server with ``slots`` slots and no warm worker.

    Attributes:
        executes: how many were sent at once.
        slots: the server's ``max_concurrent_executions``.
        seconds: the wall time of each execute that succeeded.
        outcomes: how the executes ended (``ok`` or the client's text) → how many.
    """

    executes: int
    slots: int
    seconds: list[float]
    outcomes: dict[str, int]


# --------------------------------------------------------------------------------------------------
# Recommendation (pure)
# --------------------------------------------------------------------------------------------------


def _round_up(value: float, step: float) -> float:
    return math.ceil(round(value / step, 9)) * step


def _mebibytes(n: int, unit: str) -> str:
    return f"{n // MiB}{unit}"


def _millicores(cpus: float) -> str:
    return f"{round(cpus * 1000)}m"


def _docker_settings(good: list[RunSample], basis: dict[str, Any]) -> dict[str, Any]:
    peak = basis["memory_peak_bytes"]
    memory = max(MEMORY_STEP, int(_round_up(peak * MEMORY_FACTOR, MEMORY_STEP))) if peak else 256 * MiB
    util = basis["cpu_utilisation_max"]
    cpus = max(CPU_STEP, _round_up(util * CPU_FACTOR, CPU_STEP)) if util is not None else 1.0
    pids = max((s.pids_peak for s in good if s.pids_peak), default=None)
    basis["pids_peak"] = pids
    return {
        "docker_memory": _mebibytes(memory, "m"),
        "docker_cpus": round(cpus, 2),
        "docker_max_processes": max(PIDS_FLOOR, PIDS_FACTOR * pids) if pids else 64,
    }


def _kubernetes_settings(good: list[RunSample], basis: dict[str, Any]) -> dict[str, Any]:
    peak = basis["memory_peak_bytes"]
    memory = max(MEMORY_STEP, int(_round_up(peak * MEMORY_FACTOR, MEMORY_STEP))) if peak else 256 * MiB
    utils = [u for s in good if (u := s.cpu_utilisation) is not None]
    cpu = max(CPU_STEP, _round_up(max(utils) * CPU_FACTOR, CPU_STEP)) if utils else 1.0
    median = percentile(utils, 50) if utils else None
    basis["cpu_utilisation_p50"] = median
    request = _round_up(median * CPU_FACTOR, CPU_REQUEST_STEP) if median is not None else 0.1
    request = min(cpu, max(CPU_REQUEST_STEP, request))
    return {
        "kubernetes_memory": _mebibytes(memory, "Mi"),
        "kubernetes_cpu": _millicores(cpu),
        "kubernetes_cpu_request": _millicores(request),
    }


def _process_settings(good: list[RunSample], basis: dict[str, Any]) -> dict[str, Any]:
    space = max((s.address_space_peak_bytes for s in good if s.address_space_peak_bytes), default=None)
    cpu = max((s.cpu_s for s in good if s.cpu_s is not None), default=None)
    fds = max((s.fds_peak for s in good if s.fds_peak), default=None)
    threads = max((s.threads_peak for s in good if s.threads_peak), default=None)
    basis.update(address_space_peak_bytes=space, fds_peak=fds, threads_peak=threads)
    memory = int(_round_up(space * MEMORY_FACTOR, MEMORY_STEP)) if space else 2048 * MiB
    return {
        "process_memory": _mebibytes(memory, "m"),
        "process_cpu_seconds": float(max(1, math.ceil(round(cpu * TIME_FACTOR, 9)))) if cpu else 30.0,
        "process_open_files": max(OPEN_FILES_FLOOR, PIDS_FACTOR * fds) if fds else 32,
        "process_max_processes": max(PROCESSES_FLOOR, PIDS_FACTOR * threads) if threads else 16,
    }


_SETTINGS = {"docker": _docker_settings, "kubernetes": _kubernetes_settings, "process": _process_settings}


def _deadline(slowest: float) -> float:
    return max(DEADLINE_FLOOR, round(_round_up(slowest * TIME_FACTOR, TIME_STEP), 1))


def _assumptions(basis: dict[str, Any], burst: Burst | None) -> list[str]:
    out = []
    if burst is not None:
        queued = " (the later ones waited for a slot)" if burst.executes > burst.slots else ""
        out.append(
            f"at most {burst.executes} executes at once arrive on a server of {burst.slots} slots "
            f"(--max-concurrent-executions {burst.slots}){queued}, with no warm worker for any: a pool "
            f"that is not warm yet (just started, or emptied by a burst) starts workers while executes "
            f"wait; measured, the slowest took {basis['burst_slowest_s']:.3f} s"
        )
    else:
        out.append(
            "one execute at a time (--burst 0): executes that arrive together wait for slots and "
            "workers, which this deadline does not count; measure with --burst N"
        )
    out += [
        f"the program's work stays within what the runs saw (the slowest run took "
        f"{basis['execute_max_s']:.3f} s, a worker start included); x {TIME_FACTOR:g} for the rest",
        "this machine, no busier than while measuring: other load on the host, the engine or the "
        "cluster stretches every execute",
        f"at least {DEADLINE_FLOOR:g} s: a shorter deadline fails executes for a pause of the host",
    ]
    return out


def recommend(
    samples: list[RunSample], runtime: str = "docker", burst: Burst | None = None
) -> Recommendation | None:
    """The worker sizing of ``runtime`` for ``samples`` (the successful ones count).

    Args:
        samples: the measured runs.
        runtime: ``docker``, ``kubernetes`` or ``process``.
        burst: the burst measured after the runs (None: none was).

    Returns:
        The recommendation, or None when no run succeeded.
    """
    good = [s for s in samples if s.outcome == "ok"]
    if not good:
        return None
    peaks = [s.memory_peak_bytes for s in good if s.memory_peak_bytes]
    utils = [u for s in good if (u := s.cpu_utilisation) is not None]
    times = [s.execute_s for s in good]
    warm = [max(0.0, s.execute_s - (s.spawn_s or 0.0)) for s in good]
    basis: dict[str, Any] = {
        "runs_ok": len(good),
        "memory_peak_bytes": max(peaks) if peaks else None,
        "memory_method": sorted({s.memory_method for s in good if s.memory_method}),
        "cpu_utilisation_max": max(utils) if utils else None,
        "cpu_seconds_max": max((s.cpu_s for s in good if s.cpu_s is not None), default=None),
        "execute_p50_s": percentile(times, 50),
        "execute_p99_s": percentile(times, 99),
        "execute_max_s": max(times),
        "execute_minus_spawn_p99_s": percentile(warm, 99),
        "spawn_p50_s": percentile([s.spawn_s for s in good if s.spawn_s is not None] or [0.0], 50),
        "throttled_periods_max": max((s.throttled_periods or 0 for s in good), default=0),
    }
    slowest = max(times)
    if burst is not None and burst.seconds:
        basis["burst_slowest_s"] = max(burst.seconds)
        basis["burst_p50_s"] = percentile(burst.seconds, 50)
        slowest = max(slowest, basis["burst_slowest_s"])
    elif burst is not None:
        burst = None  # no execute of the burst succeeded: its failures are reported, not counted
    settings = _SETTINGS[runtime](good, basis)
    return Recommendation(
        runtime=runtime,
        settings=settings,
        max_execution_time=_deadline(slowest),
        slots=burst.slots if burst is not None else None,
        basis=basis,
        assumes=_assumptions(basis, burst),
    )


#: How each recommended setting was derived, per runtime (``common``: every runtime), for the report.
METHOD: dict[str, dict[str, str]] = {
    "common": {
        "max_execution_time": f"the slowest execute of the runs and of the burst x {TIME_FACTOR}, "
        f"rounded up to {TIME_STEP} s, at least {DEADLINE_FLOOR:g} s; with or without --pool (a pool "
        "that is not warm starts workers while executes wait)",
    },
    "docker": {
        "docker_memory": f"peak x {MEMORY_FACTOR}, rounded up to {MEMORY_STEP // MiB} MiB",
        "docker_cpus": f"max CPU utilisation x {CPU_FACTOR}, rounded up to {CPU_STEP}, at least {CPU_STEP}",
        "docker_max_processes": f"max pids x {PIDS_FACTOR}, at least {PIDS_FLOOR}",
    },
    "kubernetes": {
        "kubernetes_memory": f"cgroup peak x {MEMORY_FACTOR}, rounded up to {MEMORY_STEP // MiB} Mi",
        "kubernetes_cpu": f"max CPU utilisation x {CPU_FACTOR}, rounded up to {CPU_STEP}, "
        f"at least {CPU_STEP}",
        "kubernetes_cpu_request": f"median CPU utilisation x {CPU_FACTOR}, rounded up to "
        f"{CPU_REQUEST_STEP}, at least {CPU_REQUEST_STEP}, at most the limit",
    },
    "process": {
        "process_memory": f"address-space peak (VmPeak) x {MEMORY_FACTOR}, "
        f"rounded up to {MEMORY_STEP // MiB} MiB",
        "process_cpu_seconds": f"max CPU seconds x {TIME_FACTOR}, rounded up to 1 s",
        "process_open_files": f"max open files x {PIDS_FACTOR}, at least {OPEN_FILES_FLOOR}",
        "process_max_processes": f"max threads x {PIDS_FACTOR}, at least {PROCESSES_FLOOR}",
    },
}
