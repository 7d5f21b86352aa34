"""The FastAPI application of ``codemode serve --http`` (docs/service.md).

Routes:

- ``/mcp``: MCP streamable HTTP (the official SDK's session manager around
  ``codemode.mcp.create_server(server, ContextSubject())``), behind :class:`BearerAuthMiddleware`;
- ``/healthz``: liveness, 200 while the process serves;
- ``/readyz``: readiness: no pack or upstream was left out at a degraded start, the runtime answers
  ``check()`` (for Docker: daemon reachable, worker image present with the matching protocol
  version) and the warm pool, if any, is at its target; the reasons are coarse (the detail goes to
  the log and the metrics port); both also on their own listener (``health_port``), which nothing on
  the main port can saturate;
- ``/metrics``: Prometheus text, only on a second server (``metrics_port``, loopback by default),
  never on the port tenants reach.

Every listener runs the guarded protocol of :mod:`codemode.service.edge` (header timeout,
connection bounds before authentication); the client address is resolved by
:mod:`codemode.service.peers` (``trusted_proxies``).

Lifespan: start the runtime (orphan clean-up, pool warm-up) and run its check; a failure stops the
start with one line naming it (``ConfigError``), unless ``start_degraded``: then it is logged, shown
on the metrics port and retried by ``/readyz`` and the first execute (the start-up rule,
docs/service.md). Then the MCP session manager and the metrics and health servers. At SIGTERM:
not ready, ``Connection: close`` on every response, still serving for ``drain_delay``
(:mod:`codemode.service.stopping`); then uvicorn closes the listener and waits for open requests;
then the lifespan ends: refuse new MCP requests (503), wait up to ``shutdown_timeout`` for
in-flight executes, stop the session manager (which cancels what is left: a cancelled execute
kills and reaps its worker), then ``server.aclose()`` drains the pool. While serving, the orphan
rule runs every ``orphan_sweep_interval`` (the workers of a replica that died).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from mcp.server.transport_security import RequestBodyLimitMiddleware
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Scope

from .. import authz
from ..execution.observe import CallEvent, ExecuteEvent
from ..execution.quota import QuotaUnavailable
from ..execution.server import Server
from ..runtimes.base import Runtime, RuntimeUnavailable
from ..runtimes.pool import WarmPool
from ..runtimes.reuse import ReusePool
from ..runtimes.streams import BlockingRuntime
from ..startup.bootstrap import StartupProblem, build_runtime, build_server, check_runtime
from ..startup.config import ConfigError, Settings, load_settings, names
from ..store import StoreUnavailable
from ._hosts import HostOriginCheck, allowed_hosts_for
from ._jsonrpc import JSONRPCBodyCheck
from .audit import AuditLog, configure_audit_logger
from .auth import BearerAuthMiddleware, JWTAuthenticator, TokenFileAuthenticator, build_authenticator
from .edge import ConnectionGuard, connection_authenticated, guarded_protocol
from .heap import freeze_start_heap, thaw_start_heap
from .listeners import SIDE_CONNECTIONS, SideServer, bind_listeners, start_side_server
from .logconfig import configure_logging
from .logfilter import install_repeat_filter
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .open_requests import RequestGuard
from .peers import ClientAddress, TrustedProxies
from .refusals import RefusalSummary
from .sessions import BoundedSessionManager
from .stopping import AnnouncedStopServer, CloseWhenStopping

__all__ = [
    "Readiness",
    "Service",
    "connection_limit",
    "create_app",
    "health_app",
    "health_routes",
    "metrics_app",
    "serve",
    "serve_async",
    "server_config",
    "subject_connection_limit",
]

log = logging.getLogger("codemode.service")


# --------------------------------------------------------------------------------------------------
# The service object (app.state.codemode)
# --------------------------------------------------------------------------------------------------


async def _every(seconds: float, job: Callable[[], None], what: str) -> None:
    """Run ``job`` every ``seconds`` until cancelled; a failure is logged and the next run happens."""
    while True:
        await asyncio.sleep(seconds)
        try:
            job()
        except Exception:
            log.exception("%s failed", what)


async def _sweep(runtime: BlockingRuntime[Any], seconds: float) -> None:
    """The orphan rule every ``seconds`` (``orphan_sweep_interval``) until cancelled, only its parts
    that prove an owner dead (a live replica's workers are never touched); a failure is logged and
    the next run happens."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await runtime.remove_orphans(proven_only=True)
        except Exception as exc:
            log.warning("orphan sweep failed: %s: %s", type(exc).__name__, exc)


class _Observer:
    """Fans the pipeline's observer hooks out to metrics, audit and the in-flight count. An observer
    failure is logged and never disturbs an execute."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def native_call(self, event: CallEvent) -> None:
        for sink in (self.service.metrics, self.service.audit):
            try:
                sink.native_call(event)
            except Exception:
                log.exception("observer failed on a native call event")

    def execute_outcome(self, event: ExecuteEvent) -> None:
        for sink in (self.service.metrics, self.service.audit):
            try:
                sink.execute_outcome(event)
            except Exception:
                log.exception("observer failed on an execute event")

    def execute_started(self, subject_id: str) -> None:
        self.service.inflight += 1
        try:
            self.service.metrics.execute_started(subject_id)
        except Exception:
            log.exception("observer failed on execute_started")

    def execute_finished(self, subject_id: str) -> None:
        self.service.inflight -= 1
        try:
            self.service.metrics.execute_finished(subject_id)
        except Exception:
            log.exception("observer failed on execute_finished")


@dataclass(frozen=True)
class Readiness:
    """What ``/readyz`` answers.

    Attributes:
        ready: whether the service can serve executes.
        reason: why not (``ok`` when ready).
    """

    ready: bool
    reason: str


class Service:
    """Everything one app instance owns: the built server, its pool, metrics, audit, authentication
    and the MCP session manager.

    Args (of the constructor):
        settings: the service's settings (the transport is always ``http``).
        runtime: replaces the runtime the settings describe (embedding, tests).
        authorizer: replaces the authorizer the settings describe.

    Raises (the constructor):
        ConfigError: an unusable configuration or a start-up problem, one line.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        runtime: Runtime | None = None,
        authorizer: authz.Authorizer | None = None,
    ) -> None:
        from ..mcp.adapter import ContextSubject, create_server

        if settings.transport != "http":
            # This is the HTTP service whatever built the settings (packs keep state on disk).
            settings = settings.model_copy(update={"transport": "http"})
        self.settings = settings
        self.inflight = 0
        #: Set at the first SIGTERM (codemode.service.stopping): not ready, responses close their
        #: connection, requests are still served for ``drain_delay``.
        self.stopping = False
        #: Set when the lifespan ends (the listener is closed): new MCP requests are refused.
        self.draining = False
        #: Whether the MCP listener accepts connections (set by :func:`serve_async`: the health port
        #: starts first, during the lifespan, and must not say ready before the MCP port listens).
        self.listening: Callable[[], bool] | None = None
        self.metrics_address: tuple[str, int] | None = None
        self.health_address: tuple[str, int] | None = None
        self._periodic: list[asyncio.Task[None]] = []
        self._side: list[SideServer] = []
        #: The side listeners' sockets when :func:`serve_async` bound them before anything started
        #: (by setting name); else each side server binds its own at start.
        self.bound: dict[str, socket.socket] = {}

        self.authenticator: TokenFileAuthenticator | JWTAuthenticator = build_authenticator(settings)
        base = runtime if runtime is not None else build_runtime(settings)
        self.base_runtime = base
        #: Packs and upstreams left out at a degraded start (--start-degraded); /readyz fails while any.
        self.problems: list[StartupProblem] = []
        self.runtime_problem: StartupProblem | None = None
        self._start_checked = False
        self.server: Server = build_server(
            settings,
            runtime=base,
            authorizer=authorizer,
            observer=_Observer(self),
            problems=self.problems if settings.start_degraded else None,
        )
        self._pool_warmed = False
        self.pool: WarmPool | ReusePool | None = (
            self.server.runtime if isinstance(self.server.runtime, WarmPool | ReusePool) else None
        )
        self.metrics = Metrics(
            self.pool, slots=self.server.slots, suspensions=self.server.pending_suspensions
        )
        self.audit = AuditLog()
        for problem in self.problems:
            self.metrics.startup_problems.labels(problem.component, problem.detail[:300]).set(1)
        self.refusals = RefusalSummary(self.audit.emit, window=settings.auth_failure_window)

        self.mcp = create_server(self.server, ContextSubject())
        self.sessions = BoundedSessionManager(
            app=self.mcp,
            stateless=settings.mcp_stateless,
            json_response=settings.mcp_json_response,
            security_settings=None,  # Host and Origin: HostOriginCheck, each list on its own
            max_request_body_size=settings.max_request_body_bytes,
            session_idle_timeout=settings.session_idle_timeout,
            per_subject=settings.max_sessions_per_subject,
            total=settings.max_sessions,
            on_refused=lambda bound: self.metrics.requests_refused.labels(bound).inc(),
        )
        self.guard = RequestGuard(
            RequestBodyLimitMiddleware(
                JSONRPCBodyCheck(self.sessions.handle_request), settings.max_request_body_bytes
            ),
            stateless=settings.mcp_stateless,
            per_subject=settings.max_open_requests_per_subject,
            total=settings.max_open_requests,
            idle_timeout=settings.stream_idle_timeout,
            max_stream_seconds=settings.max_stream_seconds,
            on_refused=lambda bound: self.metrics.requests_refused.labels(bound).inc(),
        )
        self.mcp_endpoint = HostOriginCheck(
            BearerAuthMiddleware(
                self.guard,
                self.authenticator,
                on_failure=self._auth_failed,
                on_success=connection_authenticated,
                gate=self._accepting,
            ),
            allowed_hosts=allowed_hosts_for(settings.allowed_hosts, settings.host),
            allowed_origins=settings.allowed_origins,
        )
        self.proxies = TrustedProxies(settings.trusted_proxies, settings.trusted_proxy_header)
        self.edge = ConnectionGuard(
            max_connections=connection_limit(settings),
            per_address=settings.max_unauthenticated_connections_per_address,
            header_timeout=settings.header_timeout,
            per_subject=subject_connection_limit(settings),
            write_timeout=settings.write_timeout,
            proxies=self.proxies,
            on_event=lambda event: self.metrics.connections_refused.labels(event).inc(),
        )

    # ------------------------------------------------------------------ auth hooks
    def _auth_failed(self, reason: str, scope: Scope) -> None:
        self.metrics.auth_failures.labels(reason).inc()
        client = scope.get("client")
        self.refusals.refused(reason, client[0] if client else None, str(scope.get("path", "")))

    async def _accepting(self) -> bool:
        return not self.draining

    # ------------------------------------------------------------------ readiness
    async def readiness(self) -> Readiness:
        """What ``/readyz`` answers: not while draining, the runtime's check, start-up problems, the
        pool's warmth, the store's and the quota store's checks (docs/service.md).

        Returns:
            Ready or not, with the coarse reason.
        """
        if self.stopping or self.draining:
            return Readiness(False, "shutting down")
        if self.listening is not None and not self.listening():
            return Readiness(False, "starting")
        state = await self._runtime_readiness()
        if self.problems:
            # Coarse on purpose: the port is unauthenticated; the detail is in the log and on the
            # metrics port (codemode_startup_problem).
            return Readiness(False, "start-up problem")
        if not state.ready:
            return state
        return await self._stores_readiness()

    async def _stores_readiness(self) -> Readiness:
        """The store of suspensions and state, then the quota store: each answers its check within
        ``ready_check_timeout``, or ``/readyz`` fails with a coarse reason and the host log says why
        in one line (never a credential: the stores' messages name their server only)."""
        store = self.server.plan.store
        checks: list[tuple[str, str, Any, type[Exception]]] = []
        if store is not None:
            checks.append(("store", f"store {store.name}", store.check, StoreUnavailable))
        quota = self.server.plan.quota_store
        quota_check = getattr(quota, "check", None)
        if callable(quota_check):
            checks.append(("quota store", f"quota store {quota.name}", quota_check, QuotaUnavailable))
        for reason, what, check, unavailable in checks:
            try:
                async with asyncio.timeout(self.settings.ready_check_timeout):
                    await check()
            except unavailable as exc:
                log.warning("readiness: %s unavailable: %s", what, " ".join(str(exc).split()))
                return Readiness(False, f"{reason} unavailable")
            except TimeoutError:
                log.warning(
                    "readiness: %s check timed out after %g s", what, self.settings.ready_check_timeout
                )
                return Readiness(False, f"{reason} check timed out")
            except Exception as exc:
                log.warning("readiness: %s check failed: %s", what, type(exc).__name__)
                return Readiness(False, f"{reason} check failed")
        return Readiness(True, "ok")

    async def _runtime_readiness(self) -> Readiness:
        try:
            async with asyncio.timeout(self.settings.ready_check_timeout):
                await self.server.start()
                await self.server.runtime.check()
        except RuntimeUnavailable as exc:
            log.warning("readiness: runtime unavailable: %s", exc)
            return Readiness(False, "runtime unavailable")
        except TimeoutError:
            log.warning("readiness: runtime check timed out")
            return Readiness(False, "runtime check timed out")
        except Exception as exc:
            log.warning("readiness: runtime check failed: %s: %s", type(exc).__name__, exc)
            return Readiness(False, "runtime check failed")
        self._runtime_recovered()
        if self.pool is not None and not self._pool_warmed:
            # Only until the pool is warm once: a pool that load drains later is doing its job, and
            # gating on it would let one tenant's burst take the whole instance out of rotation.
            if not self.pool.warm():
                floor = self.pool.minimum if isinstance(self.pool, WarmPool) else self.pool.size
                return Readiness(False, f"pool warming ({self.pool.idle}/{floor})")
            self._pool_warmed = True
        return Readiness(True, "ok")

    def _runtime_recovered(self) -> None:
        problem, self.runtime_problem = self.runtime_problem, None
        if problem is not None:
            log.info("%s answers its check now", problem.component)
            self.metrics.startup_problems.remove(problem.component, problem.detail[:300])

    async def check_start(self) -> None:
        """The start-up rule's runtime half (docs/service.md, "Start-up problems"), once: start the
        runtime and run its check. A problem is a ``ConfigError`` (one line), unless
        ``start_degraded``: then it is logged and shown on the metrics port, /readyz keeps checking.

        Raises:
            ConfigError: the runtime or a pack cannot start (without ``start_degraded``).
        """
        if self._start_checked:
            return
        self._start_checked = True
        if self.problems:
            log.error(
                "degraded start: %d pack(s) or upstream(s) left out; /readyz answers 503 until a restart",
                len(self.problems),
            )
        problem = await check_runtime(self.server, self.settings)
        if problem is None:
            return
        if not self.settings.start_degraded:
            raise ConfigError(problem.detail)
        log.error("degraded start: %s (execute fails until it answers; /readyz retries)", problem.detail)
        self.runtime_problem = problem
        self.metrics.startup_problems.labels(problem.component, problem.detail[:300]).set(1)

    # ------------------------------------------------------------------ lifecycle
    async def startup(self) -> None:
        """Start what the service runs beside uvicorn: JWKS refresh, the start-up check, periodic
        tasks, the metrics and health servers.

        Raises:
            ConfigError: a start-up problem (without ``start_degraded``), one line.
        """
        if self.settings.runtime == "process":
            log.warning("runtime process is NOT tenant isolation: use --runtime docker (CODEMODE_RUNTIME)")
        if isinstance(self.authenticator, JWTAuthenticator):
            await self.authenticator.start()
        await self.check_start()
        loop = asyncio.get_running_loop()
        if self.pool is not None:
            self._periodic.append(
                loop.create_task(_every(0.5, self.metrics.sample_pool, "sampling the pool"))
            )
        self._periodic.append(
            loop.create_task(
                _every(self.refusals.window, self.refusals.flush, "writing the refusal summaries")
            )
        )
        logs = install_repeat_filter(names=())
        self._periodic.append(
            loop.create_task(_every(logs.window, logs.flush, "writing suppressed-line counts"))
        )
        sweep = self.settings.orphan_sweep_interval
        if sweep and isinstance(self.base_runtime, BlockingRuntime):
            self._periodic.append(loop.create_task(_sweep(self.base_runtime, sweep)))
        await self._start_side_servers()

    async def _start_side_servers(self) -> None:
        settings = self.settings
        side = ConnectionGuard(
            max_connections=SIDE_CONNECTIONS,
            per_address=settings.max_unauthenticated_connections_per_address,
            header_timeout=settings.header_timeout,
            write_timeout=settings.write_timeout,
            access_log=False,
            evict_idle=True,  # a probe is answered whatever idle sockets others hold
        )
        metrics = await start_side_server(
            metrics_app(self.metrics),
            host=settings.metrics_host_address,
            port=settings.metrics_port,
            field="metrics_port",
            guard=side,
            what="metrics",
            sock=self.bound.pop("metrics_port", None),
        )
        self._side.append(metrics)
        self.metrics_address = metrics.address
        health = await start_side_server(
            health_app(self),
            host=settings.health_host_address,
            port=settings.health_port,
            field="health_port",
            guard=dataclasses.replace(side, unauthenticated={}, idle={}),
            what="health",
            sock=self.bound.pop("health_port", None),
        )
        self._side.append(health)
        self.health_address = health.address

    def announce_stop(self) -> None:
        """The first step of a stop (SIGTERM): stop saying ready, close each connection after its
        response; keep serving (docs/service.md, "Shutdown")."""
        if not self.stopping:
            self.stopping = True
            self.metrics.ready.set(0)

    async def drain(self) -> None:
        """Refuse new MCP requests and wait (bounded) for in-flight executes."""
        self.draining = True
        deadline = time.monotonic() + self.settings.shutdown_timeout
        if self.inflight:
            log.info("shutdown: waiting for %d in-flight execute(s)", self.inflight)
        while self.inflight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.inflight > 0:
            log.warning("shutdown: cancelling %d execute(s) still running", self.inflight)

    async def shutdown(self) -> None:
        """Close the server (workers, pool, packs), stop the periodic tasks and the side servers."""
        try:
            await self.server.aclose()
        finally:
            while self._periodic:
                task = self._periodic.pop()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self.refusals.flush()
            install_repeat_filter(names=()).flush(final=True)
            while self._side:
                await self._side.pop().stop()


def metrics_app(metrics: Metrics) -> Starlette:
    """A tiny app serving only ``/metrics`` (for ``metrics_port``).

    Args:
        metrics: the service's metrics.

    Returns:
        The app.
    """

    async def endpoint(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", endpoint=endpoint, methods=["GET"])])


def health_routes(service: Service) -> list[Route]:
    """``/healthz`` and ``/readyz``: on the main port and on the health port.

    Args:
        service: the service whose readiness ``/readyz`` answers.

    Returns:
        The two routes.
    """

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"}, headers={"cache-control": "no-store"})

    async def readyz(request: Request) -> JSONResponse:
        state = await service.readiness()
        service.metrics.ready.set(1 if state.ready else 0)
        if state.ready:
            return JSONResponse({"status": "ready"}, headers={"cache-control": "no-store"})
        return JSONResponse(
            {"status": "not ready", "reason": state.reason},
            status_code=503,
            headers={"cache-control": "no-store"},
        )

    return [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]


def health_app(service: Service) -> Starlette:
    """The health port's app: the probes and nothing else.

    Args:
        service: the service.

    Returns:
        The app.
    """
    return Starlette(routes=health_routes(service))


# --------------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------------


def create_app(
    settings: Settings | None = None,
    *,
    runtime: Runtime | None = None,
    authorizer: authz.Authorizer | None = None,
) -> FastAPI:
    """The service's FastAPI application.

    Args:
        settings: the settings (default: :func:`load_settings`, environment + ``CODEMODE_CONFIG``).
        runtime: replaces the runtime the settings describe (embedding and tests); a configured
            pool still wraps it.
        authorizer: replaces the authorizer the settings describe.

    Returns:
        The app; its :class:`Service` is at ``app.state.codemode``.

    Raises:
        ConfigError: an unusable configuration (one line).
    """
    if settings is None:
        settings = load_settings()
    _check_http(settings)
    return _app(settings, runtime, authorizer)


def _check_http(settings: Settings) -> None:
    """The one check of what ``serve --http`` needs beyond the settings' own rules
    (``Settings.http_problems``: authentication, listening); :func:`create_app` and
    :func:`serve_async` make it first.

    Args:
        settings: the settings.

    Raises:
        ConfigError: the problems, in one line.
    """
    problems = settings.http_problems()
    if problems:
        raise ConfigError("; ".join(problems))


def _app(
    settings: Settings,
    runtime: Runtime | None,
    authorizer: authz.Authorizer | None,
    *,
    freeze_heap: bool = False,
) -> FastAPI:
    """:func:`create_app` once the settings are checked; ``freeze_heap`` (:func:`serve` only):
    the start-up heap leaves the cyclic collector once started (:mod:`codemode.service.heap`)."""
    configure_audit_logger(settings.audit_log)
    service = Service(settings, runtime=runtime, authorizer=authorizer)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await service.startup()
        except BaseException:
            await service.shutdown()
            raise
        if freeze_heap:
            frozen = freeze_start_heap()
            log.debug("start-up heap frozen: %d objects", frozen)
        try:
            async with service.sessions.run():
                try:
                    yield
                finally:
                    await service.drain()
        finally:
            await service.shutdown()
            if freeze_heap:
                thaw_start_heap()

    app = FastAPI(
        title="codemode",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.codemode = service

    app.router.routes.extend(health_routes(service))
    app.router.routes.append(Route("/mcp", endpoint=service.mcp_endpoint))
    app.add_middleware(ClientAddress, proxies=service.proxies)
    app.add_middleware(CloseWhenStopping, stopping=lambda: service.stopping or service.draining)
    return app


async def serve_async(settings: Settings | None = None) -> None:
    """Run the app under uvicorn on ``settings.host:settings.port`` until SIGINT/SIGTERM
    (the announced stop of :mod:`codemode.service.stopping`: ``drain_delay``, then uvicorn's own).
    The awaiting process's garbage collector is left as it is (only :func:`serve` freezes).

    Args:
        settings: the settings (default: :func:`load_settings`).
    """
    await _serve(settings, freeze_heap=False)


async def _serve(settings: Settings | None, *, freeze_heap: bool) -> None:
    """:func:`serve_async`; ``freeze_heap`` only from :func:`serve`, which owns its process (an
    application awaiting :func:`serve_async` keeps its collector as it is)."""
    if settings is None:
        settings = load_settings()
    _check_http(settings)
    # Every port first: one in use (any of the three) ends the start in one line naming its
    # setting (exit 2), before anything is logged or started.
    listeners = bind_listeners(settings)
    try:
        # Once, for every server of this process (the metrics and health servers touch nothing).
        configure_logging(settings.log_level)
        app = _app(settings, None, None, freeze_heap=freeze_heap)
        service: Service = app.state.codemode
        service.bound = {"metrics_port": listeners.metrics, "health_port": listeners.health}
        try:
            # The start-up rule before uvicorn: a problem stops the start in one line (exit 2), not
            # in a lifespan traceback.
            await service.check_start()
        except BaseException:
            await service.shutdown()
            raise
        main = _BoundServer(
            server_config(app), drain_delay=settings.drain_delay, announce=service.announce_stop
        )
        service.listening = lambda: main.started
        await main.serve(sockets=[listeners.main])
    finally:
        listeners.close()


class _BoundServer(AnnouncedStopServer):
    """The announced-stop server on a socket bound before it started: uvicorn logs its "running on"
    line only for the sockets it binds itself, so it is logged here."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if sockets is not None and self.started:
            self._log_started_message(sockets)


def server_config(app: FastAPI, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration :func:`serve` runs ``app`` (from :func:`create_app`) with: the
    guarded protocol of its :class:`Service` (header timeout, connection bounds), no proxy-header
    handling of uvicorn's own (``trusted_proxies`` decides, see codemode.service.peers).

    Args:
        app: an app from :func:`create_app`.
        overrides: ``uvicorn.Config`` options that replace the service's (``host``, ``port``).

    Returns:
        The configuration.
    """
    service: Service = app.state.codemode
    settings = service.settings
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        # Logging is configured once by serve() (codemode.service.logconfig), never by uvicorn.
        "log_config": None,
        "log_level": None,
        "lifespan": "on",
        "ws": "none",
        "server_header": False,
        "http": guarded_protocol(service.edge),
        # The guard refuses connections past max_connections itself; uvicorn's own count (which
        # answers 503 to every request once the table is full) then only bounds running requests.
        "limit_concurrency": service.edge.max_connections + 1,
        "proxy_headers": False,
        "backlog": settings.backlog,
        "timeout_keep_alive": 5,
        "timeout_graceful_shutdown": max(1, int(settings.shutdown_timeout))
        if settings.shutdown_timeout
        else None,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


def connection_limit(settings: Settings) -> int:
    """``max_connections``, or half the process's file-descriptor limit (at most 1000, at least 16):
    the rest stays free for workers, the token file, the store and the metrics port.

    Args:
        settings: the service settings.

    Returns:
        The bound on open connections.
    """
    if settings.max_connections is not None:
        return settings.max_connections
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1000
    if soft == resource.RLIM_INFINITY:
        return 1000
    return max(16, min(1000, soft // 2))


def subject_connection_limit(settings: Settings) -> int:
    """``max_connections_per_subject``, or 4 x ``max_open_requests_per_subject`` (a client's
    requests in flight and its idle keep-alive connections), at most half of the connection limit.

    Args:
        settings: the service settings.

    Returns:
        The bound on connections counted for one subject.

    Raises:
        ConfigError: ``max_connections_per_subject`` is not below the connection limit.
    """
    limit = connection_limit(settings)
    per_subject = settings.max_connections_per_subject
    if per_subject is None:
        return max(1, min(4 * settings.max_open_requests_per_subject, limit // 2))
    if per_subject >= limit:  # max_connections unset: its default is known only here
        raise ConfigError(
            f"{names('max_connections_per_subject')}: must be less than {names('max_connections')} "
            f"({limit} by default here), so that one subject cannot hold every connection"
        )
    return per_subject


def serve(settings: Settings | None = None) -> None:
    """Blocking :func:`serve_async` (what ``codemode serve --http`` calls), in a process of its own:
    once started, the process's start-up heap leaves the cyclic collector until the stop
    (:mod:`codemode.service.heap`).

    Args:
        settings: the settings (default: :func:`load_settings`).
    """
    asyncio.run(_serve(settings, freeze_heap=True))
