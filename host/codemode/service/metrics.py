"""Prometheus metrics of one service instance, on its own ``CollectorRegistry``.

Fed by the execute pipeline's observer hooks (ids, decisions, outcomes and durations; never values)
and, for the warm pool, the worker slots and the upstreams, by sampling them when scraped (the pool
also every half second). k8s/monitoring/ alerts on these families and charts them; its tests read
them off a real service's ``/metrics`` (tests/integration/test_monitoring_metrics.py).
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil
from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE_LATEST
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..execution.causes import QUOTA_STORE
from ..execution.observe import CallEvent, ExecuteEvent
from ..execution.tracing import subject_hash
from ..packs.health import upstream_restarts

if TYPE_CHECKING:
    from ..execution.admission import FairAdmission
    from ..runtimes.pool import WarmPool
    from ..runtimes.reuse import ReusePool

__all__ = ["CONTENT_TYPE_LATEST", "EXECUTE_BUCKETS", "SPAWN_BUCKETS", "TOP_SUBJECTS", "Metrics"]

log = logging.getLogger("codemode.service.metrics")

#: How many subjects ``codemode_subject_top_active_executes`` shows (a bounded set of series).
TOP_SUBJECTS = 5

#: Histogram buckets (seconds) of execute wall times, and of worker spawns.
EXECUTE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SPAWN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The service's metric families. Thread-safe (prometheus-client is).

    Args:
        pool: the warm or reuse pool whose gauges are sampled for each scrape, if any.
        slots: the server's worker slots, sampled for each scrape, if any.
        suspensions: counts the store's pending suspensions (``Server.pending_suspensions``),
            sampled for each scrape, if any.
    """

    def __init__(
        self,
        pool: WarmPool | ReusePool | None = None,
        slots: FairAdmission | None = None,
        suspensions: Callable[[], int | None] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.executes = Counter(
            "codemode_executes", "Finished execute calls by outcome.", ["outcome"], registry=r
        )
        self.execute_seconds = Histogram(
            "codemode_execute_duration_seconds",
            "Wall time of execute calls (from before waiting for a worker slot to the result).",
            ["outcome"],
            buckets=EXECUTE_BUCKETS,
            registry=r,
        )
        self.native_calls = Counter(
            "codemode_native_calls",
            "Native calls by capability id and authorization decision.",
            ["capability_id", "decision"],
            registry=r,
        )
        self.native_call_seconds = Histogram(
            "codemode_native_call_handler_duration_seconds",
            "Handler time of allowed native calls by capability id.",
            ["capability_id"],
            buckets=SPAWN_BUCKETS,
            registry=r,
        )
        self.oom_kills = Counter("codemode_oom_kills", "Workers killed by their memory limit.", registry=r)
        self.execute_limits = Counter(
            "codemode_execute_limits",
            "Executes ended by a resource limit, by kind (the client's kind with _ for spaces; "
            "deadline_waiting_for_slot / deadline_waiting_for_worker: the deadline passed before the "
            "program began, the client was told 'concurrency').",
            ["kind"],
            registry=r,
        )
        self.quota_store_failures = Counter(
            "codemode_quota_store_failures",
            "Executes that failed closed (internal failure) because the quota store did not answer.",
            registry=r,
        )
        self.approval_answers = Counter(
            "codemode_approval_answers",
            "Calls the policy left to the user, by what became of the question (accept, decline, "
            "cancel, unanswered, unavailable, busy: the subject had max_pending_approvals open).",
            ["answer"],
            registry=r,
        )
        self.suspensions_pending = Gauge(
            "codemode_suspensions_pending",
            "Suspended executes waiting for the user's answer, in the whole store (every replica "
            "sharing it), as counted after this replica's last expiry sweep, suspend or resume.",
            registry=r,
        )
        self.slots_total = Gauge(
            "codemode_execution_slots",
            "Worker slots (max_concurrent_executions) of this replica.",
            registry=r,
        )
        self.slots_held = Gauge(
            "codemode_execution_slots_held",
            "Slots held now: an execute starting or holding a worker (a slot is free again once its "
            "worker is reaped).",
            registry=r,
        )
        self.slots_waiting = Gauge(
            "codemode_execution_slot_waiters", "Executes waiting for a slot now.", registry=r
        )
        self.pool_handouts = Counter(
            "codemode_pool_handouts",
            "Workers (reuse mode: sandboxes) the pool handed to executes: warm=true from its idle "
            "ones, warm=false started for the execute while it waited (a miss).",
            ["warm"],
            registry=r,
        )
        self.upstream_restarts = Counter(
            "codemode_upstream_restarts",
            "Sessions of an upstream MCP server that ended and were started again, or failed to "
            "start, by upstream (its configured name).",
            ["upstream"],
            registry=r,
        )
        # Never labelled by subject id: ids are tenant data, and one series per tenant is unbounded.
        self.active_subjects = Gauge(
            "codemode_active_subjects", "Subjects with at least one execute running.", registry=r
        )
        self.busiest_subject = Gauge(
            "codemode_busiest_subject_executes",
            "Executes running for the subject that has the most running (compare with the quota).",
            registry=r,
        )
        self.subject_top = Gauge(
            "codemode_subject_top_active_executes",
            f"Executes running for each of the {TOP_SUBJECTS} subjects with the most running, labelled by "
            "the subject's pseudonym (the codemode.subject of its traces), never its id.",
            ["subject"],
            registry=r,
        )
        self.active_total = Gauge(
            "codemode_active_executes", "Executes currently running, all subjects.", registry=r
        )
        self.auth_failures = Counter(
            "codemode_auth_failures",
            "Requests to /mcp refused by bearer authentication, by reason.",
            ["reason"],
            registry=r,
        )
        self.requests_refused = Counter(
            "codemode_mcp_requests_refused",
            "Authenticated /mcp requests refused because too many requests (subject, total) or sessions "
            "(session_subject, session_total) were open, by bound.",
            ["bound"],
            registry=r,
        )
        self.connections_refused = Counter(
            "codemode_connections_refused",
            "Connections to the main port refused at accept (address, total), refused at their "
            "subject's first request (subject), or closed for not sending a request head in time "
            "(header_timeout) or not reading an answer in time (write_timeout).",
            ["reason"],
            registry=r,
        )
        self.pool_idle = Gauge(
            "codemode_pool_idle_workers", "Warm workers ready in the pool right now.", registry=r
        )
        self.pool_target = Gauge(
            "codemode_pool_target_workers",
            "The pool's target size now (0 = no pool); a demand-sized pool moves it between its bounds.",
            registry=r,
        )
        self.pool_arrival_rate = Gauge(
            "codemode_pool_arrival_rate",
            "Workers asked of the warm pool per second, as the pool measures it for its target "
            "(decayed over its window; 0 = no demand-sized pool).",
            registry=r,
        )
        self.pool_spawn_seconds = Gauge(
            "codemode_pool_spawn_seconds",
            "The warm pool's moving average of one worker's start time, used for its target "
            "(0 = not measured yet, or no demand-sized pool).",
            registry=r,
        )
        self.pool_refill_seconds = Histogram(
            "codemode_pool_refill_duration_seconds",
            "Time to start one warm worker for the pool.",
            buckets=SPAWN_BUCKETS,
            registry=r,
        )
        self.ready = Gauge("codemode_ready", "1 when the last readiness check passed, else 0.", registry=r)
        # Only on the metrics port: the detail that /readyz keeps from the unauthenticated port.
        self.startup_problems = Gauge(
            "codemode_startup_problem",
            "1 per pack, upstream or runtime that failed at a degraded start (problem: its one-line detail).",
            ["component", "problem"],
            registry=r,
        )
        # Host pressure, read (psutil) when scraped: what runs out first when tenants push the host.
        self.host_memory_available = Gauge(
            "codemode_host_memory_available_bytes",
            "Memory the host's kernel reports available for new allocations (MemAvailable).",
            registry=r,
        )
        self.host_open_fds = Gauge(
            "codemode_host_open_fds", "File descriptors this host process has open.", registry=r
        )
        self.host_fd_limit = Gauge(
            "codemode_host_fd_limit",
            "This host process's file-descriptor limit (RLIMIT_NOFILE, soft); compare with open fds.",
            registry=r,
        )
        self.host_load = Gauge(
            "codemode_host_load_average",
            "The machine's load average over 1, 5 and 15 minutes, per CPU.",
            ["minutes"],
            registry=r,
        )
        self._process = psutil.Process()
        self._active: dict[str, int] = {}
        self._pool = pool
        self._slots = slots
        self._suspensions = suspensions
        self._seen: dict[tuple[str, str], float] = {}  # counts sampled from elsewhere, last seen
        self._last_refill: float | None = None
        self.pool_target.set(pool.size if pool is not None else 0)

    # ------------------------------------------------------------------ observer hooks
    def native_call(self, event: CallEvent) -> None:
        self.native_calls.labels(event.capability_id, event.decision).inc()
        if event.approval:
            self.approval_answers.labels(event.approval).inc()
        if event.decision in ("allow", "approved") and event.outcome != "not_run":
            self.native_call_seconds.labels(event.capability_id).observe(event.handler_seconds)

    def execute_outcome(self, event: ExecuteEvent) -> None:
        self.executes.labels(event.outcome).inc()
        self.execute_seconds.labels(event.outcome).observe(max(0.0, event.seconds))
        if event.oom_killed:
            self.oom_kills.inc()
        if event.outcome == "resource_limit":
            self.execute_limits.labels((event.cause or "unknown").replace(" ", "_")).inc()
        elif event.cause == QUOTA_STORE:
            self.quota_store_failures.inc()

    def execute_started(self, subject_id: str) -> None:
        self._active[subject_id] = self._active.get(subject_id, 0) + 1
        self._sample_subjects()
        self.active_total.inc()

    def execute_finished(self, subject_id: str) -> None:
        n = self._active.get(subject_id, 0) - 1
        if n > 0:
            self._active[subject_id] = n
        else:
            self._active.pop(subject_id, None)
        self._sample_subjects()
        self.active_total.dec()

    def _sample_subjects(self) -> None:
        self.active_subjects.set(len(self._active))
        self.busiest_subject.set(max(self._active.values(), default=0))

    # ------------------------------------------------------------------ pool sampling
    def sample_pool(self) -> None:
        """Copy the pool's idle count, its target now, its measured demand and any refill times not
        seen yet into the metrics."""
        pool = self._pool
        if pool is None:
            return
        self.pool_idle.set(pool.idle)
        self.pool_target.set(pool.size)
        demand = getattr(pool, "demand", None)  # a WarmPool's (codemode.runtimes.demand.Demand)
        if demand is not None:
            self.pool_arrival_rate.set(demand.rate())
            self.pool_spawn_seconds.set(demand.spawn_seconds() or 0.0)
        times = pool.refill_seconds
        if not times:
            return
        # The pool keeps its last 1000 refill times; find the last one already observed by
        # identity (each is a distinct float object) and observe what came after it.
        start = 0
        last = self._last_refill
        if last is not None:
            for i in range(len(times) - 1, -1, -1):
                if times[i] is last:
                    start = i + 1
                    break
        for value in times[start:]:
            self.pool_refill_seconds.observe(value)
        self._last_refill = times[-1]

    def _advance(self, counter: Counter, labels: tuple[str, str], total: float) -> None:
        """Bring a counter up to a count kept elsewhere (it only grows; a lower one is a restart
        of its source, counted again from there)."""
        last = self._seen.get(labels, 0.0)
        if total > last:
            counter.labels(labels[1]).inc(total - last)
        self._seen[labels] = total

    def sample_counts(self) -> None:
        """The slots now, and the counts the pool and the upstream packs keep, into the metrics."""
        pending = self._suspensions() if self._suspensions is not None else None
        if pending is not None:
            self.suspensions_pending.set(pending)
        slots = self._slots
        if slots is not None:
            self.slots_total.set(slots.slots)
            self.slots_held.set(slots.slots - slots.free)
            self.slots_waiting.set(slots.waiting)
        pool = self._pool
        if pool is not None:
            cold = getattr(pool, "cold_taken", None)  # a WarmPool's; a ReusePool counts leases
            if cold is None:
                cold = pool.cold  # type: ignore[union-attr]
                warm = pool.leases - cold  # type: ignore[union-attr]
            else:
                warm = pool.warm_taken  # type: ignore[union-attr]
            self._advance(self.pool_handouts, ("pool", "true"), warm)
            self._advance(self.pool_handouts, ("pool", "false"), cold)
        self.subject_top.clear()
        top = sorted(self._active.items(), key=lambda item: -item[1])[:TOP_SUBJECTS]
        for subject, running in top:
            self.subject_top.labels(subject_hash(subject)).set(running)
        for upstream, count in upstream_restarts().items():
            self._advance(self.upstream_restarts, ("upstream", upstream), count)
        self.pool_handouts.labels("true")
        self.pool_handouts.labels("false")

    def sample_host(self) -> None:
        """Host pressure now: available memory, open fds against the limit, load per CPU."""
        self.host_memory_available.set(psutil.virtual_memory().available)
        self.host_open_fds.set(self._process.num_fds())
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.host_fd_limit.set(float("inf") if soft == resource.RLIM_INFINITY else soft)
        cpus = psutil.cpu_count() or 1
        for minutes, load in zip(("1", "5", "15"), psutil.getloadavg(), strict=True):
            self.host_load.labels(minutes).set(load / cpus)

    def render(self) -> bytes:
        """Sample the pool and the host, then render every family (a failed sample is logged).

        Returns:
            The Prometheus text exposition (:data:`CONTENT_TYPE_LATEST`).
        """
        for sample in (self.sample_pool, self.sample_counts, self.sample_host):
            try:
                sample()
            except Exception:
                log.exception("sampling for /metrics failed: %s", sample.__name__)
        return generate_latest(self.registry)
