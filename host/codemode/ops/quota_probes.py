"""What ``codemode quotas tune`` reads of each worker, per runtime (docs/operators.md, "Method").

Every measured worker runs the image's own worker code started as ``python3 -I -c <hold>``
(:func:`hold_command`): after it has sent its final frame it writes one line to stderr — its own
counters, :data:`REPORT_PREFIX` followed by JSON — and stays idle until the host closes its stdin,
so the host can read the counters *after* the program finished and *before* the worker goes away.
The counters come from three places, one per runtime:

- **docker**: the Engine's ``container stats`` (one-shot), sampled while the worker runs and once at
  the end (:class:`DockerProbe`): the container's cgroup as the Engine reports it;
- **kubernetes**: the worker pod's own cgroup, read by the worker itself in the hold line
  (``memory.max_usage_in_bytes`` or ``memory.peak``, ``cpuacct.usage`` or ``cpu.stat``)
  (:class:`ReportProbe`): the API server offers no high-water mark, the kubelet's summary is sampled
  every few seconds, while the container's cgroup has both counters exactly;
- **process**: psutil on the worker's pid, sampled while it runs and once at the end (CPU time,
  address space, RSS, open files, threads), plus the worker's own ``VmPeak`` from the hold line
  (:class:`ProcessProbe`). A process worker has no cgroup of its own.

The hold line is what the measured worker says about itself: fit for tuning an operator's own
program, never a security boundary. It is written under the worker's own seccomp filter and Landlock
domain, which refuses every file of ``/proc`` and ``/sys``: the hold opens the few it reads
(``/proc/self/status`` and ``stat``, the cgroup's counters) before the worker confines itself and
reads them again through those descriptors, then writes to stderr (the ``fds`` it reports, and what
the process probe counts, leave those descriptors out).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..runtimes.base import ExitInfo, Sandbox

__all__ = [
    "REPORT_PREFIX",
    "DockerProbe",
    "MeasuringRuntime",
    "Probe",
    "ProcessProbe",
    "Reading",
    "ReportProbe",
    "hold_command",
    "measured",
    "parse_report",
]

#: How the hold line starts (JSON follows).
REPORT_PREFIX = "codemode-quotas-report "

#: The image's worker, run in-process; then its own counters on stderr; then held until stdin closes.
_HOLD = r"""
import json, os, sys
cg = '/sys/fs/cgroup'
# Opened now: once confined, the worker's Landlock domain refuses every file of /proc and /sys.
HELD = {}
for path in ('/proc/self/status', '/proc/self/stat', cg + '/memory/memory.max_usage_in_bytes',
             cg + '/memory.peak', cg + '/cpuacct/cpuacct.usage', cg + '/cpu,cpuacct/cpuacct.usage',
             cg + '/cpu.stat', cg + '/pids/pids.current', cg + '/pids.peak', cg + '/pids.current'):
    try:
        HELD[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        pass
from codemode_worker.entry import main
code = main()
def read(path):  # its text now, through the descriptor opened before
    try:
        text = b''
        while chunk := os.pread(HELD[path], 65536, len(text)):
            text += chunk
        return text.decode()
    except (KeyError, OSError, UnicodeDecodeError):
        return None
def first_int(text):
    try:
        return int(text.split()[0])
    except (AttributeError, IndexError, ValueError):
        return None
report = {}
for line in (read('/proc/self/status') or '').splitlines():
    key, _, value = line.partition(':')
    if key in ('VmPeak', 'VmHWM', 'Threads'):
        report[key] = first_int(value)
report['held'] = len(HELD)  # descriptors of this hold, not of the worker
try:
    report['fds'] = len(os.listdir('/proc/self/fd')) - len(HELD)
except OSError:
    pass
stat = (read('/proc/self/stat') or '').rpartition(')')[2].split()
if len(stat) > 12:  # utime, stime in clock ticks (the worker's filter refuses getrusage)
    report['process_cpu_s'] = (int(stat[11]) + int(stat[12])) / os.sysconf('SC_CLK_TCK')
peak = read(cg + '/memory/memory.max_usage_in_bytes') or read(cg + '/memory.peak')
report['cgroup_memory_peak'] = first_int(peak)
ns = read(cg + '/cpuacct/cpuacct.usage') or read(cg + '/cpu,cpuacct/cpuacct.usage')
if ns is not None:
    report['cgroup_cpu_s'] = (first_int(ns) or 0) / 1e9
else:
    for line in (read(cg + '/cpu.stat') or '').splitlines():
        if line.startswith('usage_usec '):
            report['cgroup_cpu_s'] = int(line.split()[1]) / 1e6
pids = read(cg + '/pids/pids.current') or read(cg + '/pids.peak') or read(cg + '/pids.current')
report['cgroup_pids'] = first_int(pids)
sys.stderr.write('codemode-quotas-report ' + json.dumps(report) + '\n')
try:
    sys.stderr.flush()
    while sys.stdin.buffer.read(65536):
        pass
except Exception:
    pass
os._exit(code)
"""


def hold_command(python: str = "python3") -> list[str]:
    """The measured worker's command line.

    Args:
        python: the interpreter (the image's ``python3``, or the host's for processes).

    Returns:
        ``[python, "-I", "-c", <hold program>]``.
    """
    return [python, "-I", "-c", _HOLD]


def parse_report(stderr_tail: bytes) -> dict[str, Any]:
    """The hold line's counters from a worker's stderr tail.

    Args:
        stderr_tail: the end of the worker's stderr.

    Returns:
        The last hold line's JSON object ({} when there is none or it is not an object).
    """
    for line in reversed(stderr_tail.decode("utf-8", "replace").splitlines()):
        if line.startswith(REPORT_PREFIX):
            try:
                data = json.loads(line[len(REPORT_PREFIX) :])
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


def _number(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(kw_only=True)
class Reading:
    """What one worker used, as far as its runtime can tell (None = not measured there); a run's
    sample of ``quotas tune`` (``codemode.ops.quotas.RunSample``) is one, plus what the run adds.

    Attributes:
        memory_peak_bytes: its peak memory.
        memory_method: how that peak was measured (``max_usage``, ``cgroup high-water mark``,
            ``VmHWM (peak RSS)``, a sampled value...).
        memory_rss_end_bytes: its resident memory at the end.
        address_space_peak_bytes: its peak address space (process runtime).
        cpu_s: CPU seconds it used.
        throttled_periods: CFS periods it was throttled in (Docker).
        pids_peak: the most processes it had (Docker).
        threads_peak: the most threads it had.
        fds_peak: the most open files it had (process runtime).
        counters_final: whether the final reading was taken; False when the worker had exited
            before it (it died): the counters are then those of the last reading while it ran,
            i.e. lower bounds.
    """

    memory_peak_bytes: int | None = None
    memory_method: str = ""
    memory_rss_end_bytes: int | None = None
    address_space_peak_bytes: int | None = None
    cpu_s: float | None = None
    throttled_periods: int | None = None
    pids_peak: int | None = None
    threads_peak: int | None = None
    fds_peak: int | None = None
    counters_final: bool = True


class Probe:
    """Reads one worker: ``finish()`` once the program is done, ``reading(exit)`` after destroy."""

    def finish(self) -> None:
        """The program has finished and the worker holds: take the final reading (blocking)."""

    def reading(self, exit: ExitInfo) -> Reading:
        """What the worker used.

        Args:
            exit: how the worker ended (its stderr tail holds the hold line).

        Returns:
            The reading.

        Raises:
            NotImplementedError: in this base class.
        """
        raise NotImplementedError


class ReportProbe(Probe):
    """Kubernetes: the worker container's own cgroup, from its hold line.

    The line travels on the worker's stderr, which may arrive after its final frame: ``finish()``
    waits for it (up to ``wait`` seconds) before the host closes the worker's stdin.

    Args:
        sandbox: the worker (its ``stderr_tail`` is read).
        wait: seconds ``finish()`` waits for the hold line.
    """

    def __init__(self, sandbox: Any, wait: float = 10.0) -> None:
        self._sandbox = sandbox
        self._wait = wait
        self._tail = b""

    def _current(self) -> bytes:
        return bytes(getattr(self._sandbox, "stderr_tail", b"") or b"")

    def finish(self) -> None:
        deadline = time.monotonic() + self._wait
        while not parse_report(self._current()) and time.monotonic() < deadline and self._sandbox.alive():
            time.sleep(0.01)
        self._tail = self._current()

    def reading(self, exit: ExitInfo) -> Reading:
        data = parse_report(exit.stderr_tail) or parse_report(self._tail)
        out = Reading(counters_final=bool(data))
        peak = _number(data, "cgroup_memory_peak")
        if peak:
            out.memory_peak_bytes = int(peak)
            out.memory_method = "cgroup high-water mark"
        out.cpu_s = _number(data, "cgroup_cpu_s")
        threads = _number(data, "Threads")
        out.threads_peak = int(threads) if threads else None
        return out


class ProcessProbe(Probe):
    """The process runtime: psutil on the worker's pid, sampled every :attr:`INTERVAL` seconds
    in a thread, plus the worker's ``VmPeak``, ``VmHWM`` and open files from its hold line.

    Args:
        pid: the worker's pid.
    """

    INTERVAL = 0.01

    def __init__(self, pid: int) -> None:
        import psutil

        self._process = psutil.Process(pid)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.vms_peak = 0
        self.rss_peak = 0
        self.rss_end: int | None = None
        self.fds_peak = 0
        self.threads_peak = 0
        self.cpu_s: float | None = None
        self.final = False
        self._thread = threading.Thread(target=self._loop, name=f"codemode-quotas-{pid}", daemon=True)
        self._thread.start()

    def _sample(self) -> bool:
        import psutil

        try:
            with self._process.oneshot():
                memory = self._process.memory_info()
                fds = self._process.num_fds()
                threads = self._process.num_threads()
                times = self._process.cpu_times()
        except psutil.Error:
            return False
        with self._lock:
            self.vms_peak = max(self.vms_peak, memory.vms)
            self.rss_peak = max(self.rss_peak, memory.rss)
            self.rss_end = memory.rss
            self.fds_peak = max(self.fds_peak, fds)
            self.threads_peak = max(self.threads_peak, threads)
            self.cpu_s = times.user + times.system
        return True

    def _loop(self) -> None:
        while not self._stop.is_set() and self._sample():
            self._stop.wait(self.INTERVAL)

    def finish(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.final = self._sample()

    def reading(self, exit: ExitInfo) -> Reading:
        data = parse_report(exit.stderr_tail)
        with self._lock:
            out = Reading(
                memory_peak_bytes=self.rss_peak or None,
                memory_method="sampled RSS" if self.rss_peak else "",
                memory_rss_end_bytes=self.rss_end,
                address_space_peak_bytes=self.vms_peak or None,
                cpu_s=self.cpu_s,
                threads_peak=self.threads_peak or None,
                # less the descriptors the hold itself keeps for its line (in every sample)
                fds_peak=max(self.fds_peak - int(_number(data, "held") or 0), 0) or None,
                counters_final=self.final,
            )
        # The kernel's own high-water marks (kB), when the worker wrote its hold line.
        if (vm_peak := _number(data, "VmPeak")) is not None:
            out.address_space_peak_bytes = max(out.address_space_peak_bytes or 0, int(vm_peak) * 1024)
        if (hwm := _number(data, "VmHWM")) is not None:
            out.memory_peak_bytes = max(out.memory_peak_bytes or 0, int(hwm) * 1024)
            out.memory_method = "VmHWM (peak RSS)"
        if (fds := _number(data, "fds")) is not None:
            out.fds_peak = max(out.fds_peak or 0, int(fds))
        return out


class DockerProbe(Probe):
    """Docker: ``container stats`` (one-shot) in a loop while the worker runs, once at the end.

    Args:
        api: the Engine API client.
        container_id: the worker's container.
    """

    def __init__(self, api: Any, container_id: str) -> None:
        self.api = api
        self.cid = container_id
        self.lock = threading.Lock()
        self.pids_peak: int | None = None
        self.usage_peak: int | None = None
        self.last: dict[str, Any] = {}
        self.final = False
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self._loop, name=f"codemode-quotas-{self.cid[:12]}", daemon=True
        )
        self.thread.start()

    def sample(self) -> dict[str, Any]:
        """One ``container stats`` reading, keeping the peaks of pids and memory usage.

        Returns:
            The Engine's stats ({} when it gave none).
        """
        try:
            stats = self.api.stats(self.cid, stream=False, one_shot=True)
        except Exception:
            return {}
        if not isinstance(stats, dict):
            return {}
        memory = stats.get("memory_stats") or {}
        pids = (stats.get("pids_stats") or {}).get("current")
        with self.lock:
            if isinstance(pids, int):
                self.pids_peak = max(self.pids_peak or 0, pids)
            usage = memory.get("usage")
            if isinstance(usage, int):
                self.usage_peak = max(self.usage_peak or 0, usage)
            if memory:  # an exited container reports empty stats: keep the last real sample
                self.last = stats
        return stats

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.sample()  # the Engine's collector answers about once a second
            self.stop.wait(0.05)

    def finish(self) -> None:
        self.stop.set()
        self.final = bool(self.sample().get("memory_stats"))
        self.thread.join(timeout=5.0)

    def reading(self, exit: ExitInfo) -> Reading:
        with self.lock:
            last, usage_peak, pids_peak = self.last, self.usage_peak, self.pids_peak
        out = Reading(counters_final=self.final, pids_peak=pids_peak or None)
        memory = last.get("memory_stats") or {}
        if isinstance(memory.get("max_usage"), int) and memory["max_usage"] > 0:
            out.memory_peak_bytes = memory["max_usage"]
            out.memory_method = "max_usage"
        elif usage_peak:
            out.memory_peak_bytes = int(usage_peak)
            out.memory_method = "sampled usage"
        inner = memory.get("stats") or {}
        rss = inner.get("total_rss", inner.get("anon"))
        if isinstance(rss, int):
            out.memory_rss_end_bytes = rss
        cpu = last.get("cpu_stats") or {}
        total = (cpu.get("cpu_usage") or {}).get("total_usage")
        if isinstance(total, int) and total > 0:
            out.cpu_s = total / 1e9
        throttled = (cpu.get("throttling_data") or {}).get("throttled_periods")
        if isinstance(throttled, int):
            out.throttled_periods = throttled
        return out


class _MeasuredSandbox:
    def __init__(self, runtime: MeasuringRuntime, inner: Any, spawn_s: float, probe: Probe) -> None:
        self._runtime = runtime
        self._inner = inner
        self.spawn_s = spawn_s
        self.probe = probe
        self.exit: ExitInfo | None = None
        self._finishing: asyncio.Future[None] | None = None
        self._destroying: asyncio.Future[ExitInfo] | None = None
        self.destroyed = asyncio.Event()

    @property
    def worker_id(self) -> str:
        return str(self._inner.worker_id)

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)

    async def read(self, max_bytes: int) -> bytes:
        data: bytes = await self._inner.read(max_bytes)
        return data

    async def close_input(self) -> None:
        # The hold entry exits when stdin closes: take the final reading first.
        await self.finish()
        await self._inner.close_input()

    def alive(self) -> bool:
        return bool(self._inner.alive())

    async def finish(self) -> None:
        if self._finishing is None:
            self._finishing = asyncio.ensure_future(asyncio.to_thread(self.probe.finish))
        await asyncio.shield(self._finishing)

    async def destroy(self) -> ExitInfo:
        if self._destroying is None:
            self._destroying = asyncio.ensure_future(self._destroy())
        return await asyncio.shield(self._destroying)

    async def _destroy(self) -> ExitInfo:
        await self.finish()
        info: ExitInfo = await self._inner.destroy()
        self.exit = info
        self.destroyed.set()
        return info

    def reading(self) -> Reading:
        assert self.exit is not None
        return self.probe.reading(self.exit)


class MeasuringRuntime:
    """Wraps a runtime started with :func:`hold_command`, timing each spawn.

    Args:
        inner: the runtime.
        probe_for: makes the probe that reads a spawned worker (run in a thread).
    """

    def __init__(self, inner: Any, probe_for: Callable[[Any], Probe]) -> None:
        self.inner = inner
        self.probe_for = probe_for
        self.sandboxes: list[_MeasuredSandbox] = []
        #: Called once the measurement is over (e.g. to close the Engine client of the probes).
        self.closers: list[Callable[[], object]] = []

    @property
    def name(self) -> str:
        return f"{self.inner.name}+measured"

    async def start(self) -> None:
        await self.inner.start()

    async def check(self) -> None:
        await self.inner.check()

    async def spawn(self) -> Sandbox:
        t0 = time.perf_counter()
        inner = await self.inner.spawn()
        spawn_s = time.perf_counter() - t0
        try:
            probe = await asyncio.to_thread(self.probe_for, inner)
        except BaseException:
            await inner.destroy()
            raise
        sandbox = _MeasuredSandbox(self, inner, spawn_s, probe)
        self.sandboxes.append(sandbox)
        return sandbox

    async def aclose(self) -> None:
        await self.inner.aclose()


def measured(sandboxes: Sequence[_MeasuredSandbox], before: int) -> _MeasuredSandbox | None:
    """The sandbox a run spawned (the first one after ``before``), if any.

    Args:
        sandboxes: every sandbox the measuring runtime spawned.
        before: how many there were before the run.

    Returns:
        That sandbox, or None.
    """
    return sandboxes[before] if len(sandboxes) > before else None
