"""Operating the service: health, readiness, metrics, audit log, settings and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

import codemode
from codemode import authz
from codemode.execution.observe import ExecuteEvent
from codemode.runtimes.base import Sandbox
from codemode.service import create_app
from codemode.startup.config import ConfigError, load_settings
from tests.support.service import (
    PACK_SPEC,
    ToggleRuntime,
    call,
    execute,
    http_get,
    mcp_client,
    metric,
    scrape,
    service,
    settings,
    write_token_file,
)

ECHO = "def main():\n    return svc.echo(value=%r)['value']\n"
SLOW = "def main():\n    return svc.slow(seconds=%s)['value']\n"


class DenyWhoami:
    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        if input.capability_id == "svc.whoami.v1":
            raise authz.Denied("rule no_whoami")


# --------------------------------------------------------------------------------------------------
# health and readiness
# --------------------------------------------------------------------------------------------------


async def test_healthz_and_readyz_need_no_auth(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path)) as srv:
        health = await http_get(srv.url + "/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        ready = await http_get(srv.url + "/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        for path in ("/docs", "/openapi.json", "/redoc"):
            assert (await http_get(srv.url + path)).status_code == 404


async def test_readiness_flips_when_the_runtime_goes_away_and_recovers(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    runtime = ToggleRuntime(codemode.ProcessRuntime())
    async with service(settings(token_file=tokens.path), runtime=runtime) as srv:
        assert (await http_get(srv.url + "/readyz")).status_code == 200
        runtime.down = True
        resp = await http_get(srv.url + "/readyz")
        assert resp.status_code == 503
        assert resp.json() == {"status": "not ready", "reason": "runtime unavailable"}
        assert "secret" not in resp.text
        assert (await http_get(srv.url + "/healthz")).status_code == 200  # still alive
        assert await execute(srv.mcp_url, tokens["alice"], ECHO % "x") == ("error", "internal failure")
        samples = await scrape(srv.metrics_url)
        assert metric(samples, "codemode_ready") == 0
        runtime.down = False
        assert (await http_get(srv.url + "/readyz")).status_code == 200
        assert await execute(srv.mcp_url, tokens["alice"], ECHO % "x") == {"result": "x"}
        samples = await scrape(srv.metrics_url)
        assert metric(samples, "codemode_ready") == 1


async def test_readiness_waits_for_the_pool_and_pool_metrics(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, pool=2)) as srv:
        pool = srv.service.pool
        assert pool is not None and pool.size == 2
        statuses = []
        async with asyncio.timeout(30):
            while True:
                resp = await http_get(srv.url + "/readyz")
                statuses.append(resp.status_code)
                if resp.status_code == 200:
                    break
                assert resp.json()["reason"].startswith("pool warming (")
                await asyncio.sleep(0.05)
        before = await scrape(srv.metrics_url)
        assert metric(before, "codemode_pool_target_workers") == 2
        assert metric(before, "codemode_pool_idle_workers") == 2
        refills = metric(before, "codemode_pool_refill_duration_seconds_count")
        assert refills >= 2
        assert await execute(srv.mcp_url, tokens["alice"], ECHO % "p") == {"result": "p"}
        async with asyncio.timeout(30):
            while metric(await scrape(srv.metrics_url), "codemode_pool_refill_duration_seconds_count") < (
                refills + 1
            ):
                await asyncio.sleep(0.05)
        await pool.wait_warm(30)
    assert pool.idle == 0  # drained at shutdown


async def test_a_pool_drained_by_load_keeps_the_instance_ready(tmp_path: Path) -> None:
    # One tenant's burst empties the pool; the instance must stay in rotation for the others (the
    # pool gates readiness only until it is warm once).
    class Gated(ToggleRuntime):
        """Refills wait while ``gate`` is clear: the pool stays as empty as the burst left it."""

        gate = asyncio.Event()

        async def spawn(self) -> Sandbox:
            await self.gate.wait()
            return await self.inner.spawn()

    tokens = write_token_file(tmp_path, ["alice"])
    runtime = Gated(codemode.ProcessRuntime())
    runtime.gate.set()
    async with service(settings(token_file=tokens.path, pool=2), runtime=runtime) as srv:
        pool = srv.service.pool
        assert isinstance(pool, codemode.WarmPool)
        async with asyncio.timeout(30):
            while (await http_get(srv.url + "/readyz")).status_code != 200:
                await asyncio.sleep(0.05)
        runtime.gate.clear()
        held = [await pool.spawn() for _ in range(2)]  # what a burst holds
        try:
            assert pool.idle == 0
            resp = await http_get(srv.url + "/readyz")
            assert resp.status_code == 200, resp.text
        finally:
            runtime.gate.set()
            for sandbox in held:
                await sandbox.destroy()


async def test_a_demand_sized_pool_exposes_its_target_and_measured_demand(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, pool=1, pool_max=6)) as srv:
        pool = srv.service.pool
        assert isinstance(pool, codemode.WarmPool) and (pool.minimum, pool.maximum) == (1, 6)
        await pool.wait_warm(30)
        idle = await scrape(srv.metrics_url)
        assert metric(idle, "codemode_pool_arrival_rate") == 0
        for i in range(4):
            assert await execute(srv.mcp_url, tokens["alice"], ECHO % str(i)) == {"result": str(i)}
        after = await scrape(srv.metrics_url)
        assert metric(after, "codemode_pool_arrival_rate") > 0
        assert metric(after, "codemode_pool_spawn_seconds") > 0
        assert 1 <= metric(after, "codemode_pool_target_workers") <= 6


# --------------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------------


async def test_metrics_change_as_expected(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice", "bob"])
    async with service(settings(token_file=tokens.path), authorizer=DenyWhoami()) as srv:
        url = srv.metrics_url
        before = await scrape(url)
        async with mcp_client(srv.mcp_url, tokens["alice"]) as client:
            assert await call(client, "execute", source=ECHO % "m") == {"result": "m"}
            broken = await call(client, "execute", source="def main(:\n")
            assert broken[0] == "error" and broken[1].startswith("invalid program")
            denied = "def main():\n    return svc.whoami()\n"
            assert await call(client, "execute", source=denied) == ("error", "permission denied")
        # refused requests
        async with httpx.AsyncClient() as http:
            await http.post(srv.mcp_url, json={})
            await http.post(srv.mcp_url, json={}, headers={"Authorization": "Bearer nope"})
        after = await scrape(url)

        def delta(name: str, **labels: str) -> float:
            return metric(after, name, **labels) - metric(before, name, **labels)

        assert delta("codemode_executes_total", outcome="ok") == 1
        assert delta("codemode_executes_total", outcome="invalid_program") == 1
        assert delta("codemode_executes_total", outcome="permission_denied") == 1
        assert delta("codemode_execute_duration_seconds_count", outcome="ok") == 1
        assert delta("codemode_execute_duration_seconds_count", outcome="permission_denied") == 1
        assert delta("codemode_native_calls_total", capability_id="svc.echo.v1", decision="allow") == 1
        assert delta("codemode_native_calls_total", capability_id="svc.whoami.v1", decision="deny") == 1
        assert delta("codemode_native_call_handler_duration_seconds_count", capability_id="svc.echo.v1") == 1
        assert delta("codemode_auth_failures_total", reason="missing_token") == 1
        assert delta("codemode_auth_failures_total", reason="unknown_token") == 1
        assert delta("codemode_oom_kills_total") == 0

        # active subjects (never labelled by subject id), seen while a slow execute runs
        task = asyncio.create_task(execute(srv.mcp_url, tokens["bob"], SLOW % "1.5"))
        async with asyncio.timeout(10):
            while metric(await scrape(url), "codemode_active_subjects") != 1:
                await asyncio.sleep(0.02)
        during = await scrape(url)
        assert metric(during, "codemode_active_executes") == 1
        assert metric(during, "codemode_busiest_subject_executes") == 1
        assert await task == {"result": "slept"}
        done = await scrape(url)
        assert metric(done, "codemode_active_subjects") == 0
        assert metric(done, "codemode_active_executes") == 0

        # OOM kills come from the execute event (the process runtime cannot produce one here)
        srv.service.metrics.execute_outcome(
            ExecuteEvent("bob", "resource_limit", 0.2, 0, "w-1", oom_killed=True)
        )
        assert metric(await scrape(url), "codemode_oom_kills_total") == 1


async def test_metrics_on_a_separate_port(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, metrics_port=0)) as srv:
        assert (await http_get(srv.url + "/metrics")).status_code == 404
        host, port = srv.service.metrics_address
        assert host == "127.0.0.1" and port != 0
        murl = f"http://{host}:{port}/metrics"
        before = metric(await scrape(murl), "codemode_executes_total", outcome="ok")
        assert await execute(srv.mcp_url, tokens["alice"], ECHO % "x") == {"result": "x"}
        assert metric(await scrape(murl), "codemode_executes_total", outcome="ok") == before + 1
        assert (await http_get(f"http://{host}:{port}/mcp")).status_code == 404
    with pytest.raises(httpx.ConnectError):
        await http_get(murl)


async def test_host_pressure_on_the_metrics_port_only(tmp_path: Path) -> None:
    import os
    import resource

    import psutil

    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, metrics_port=0)) as srv:
        host, port = srv.service.metrics_address
        samples = await scrape(f"http://{host}:{port}/metrics")
        # The values are the host's own, read when scraped (compared with psutil read just after).
        available = metric(samples, "codemode_host_memory_available_bytes")
        assert 0 < available <= psutil.virtual_memory().total
        fds = metric(samples, "codemode_host_open_fds")
        assert 3 <= fds <= len(os.listdir("/proc/self/fd")) + 16
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert metric(samples, "codemode_host_fd_limit") == (
            float("inf") if soft == resource.RLIM_INFINITY else soft
        )
        load = [metric(samples, "codemode_host_load_average", minutes=m) for m in ("1", "5", "15")]
        assert all(v >= 0 for v in load) and any(v > 0 for v in load)
        # Never on the port tenants reach.
        page = await http_get(srv.url + "/metrics")
        assert page.status_code == 404 and "codemode_host" not in page.text


# --------------------------------------------------------------------------------------------------
# audit log
# --------------------------------------------------------------------------------------------------


async def test_audit_lines_have_ids_and_never_values_or_tokens(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    audit = tmp_path / "audit.jsonl"
    nonce = "NONCE-c0ffee-4242"
    cfg = settings(token_file=tokens.path, audit_log=str(audit))
    async with service(cfg, authorizer=DenyWhoami()) as srv:
        assert await execute(srv.mcp_url, tokens["alice"], ECHO % nonce) == {"result": nonce}
        denied = "def main():\n    return svc.whoami()\n"
        assert await execute(srv.mcp_url, tokens["alice"], denied) == ("error", "permission denied")
        async with httpx.AsyncClient() as http:
            await http.post(srv.mcp_url, json={}, headers={"Authorization": f"Bearer {tokens['alice']}WRONG"})
    text = audit.read_text()
    assert nonce not in text
    assert tokens["alice"] not in text
    assert "svc.echo(" not in text and "def main" not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert all(isinstance(line["ts"], str) and line["ts"].endswith("Z") for line in lines)
    calls = [x for x in lines if x["event"] == "native_call"]
    executes = [x for x in lines if x["event"] == "execute"]
    failures = [x for x in lines if x["event"] == "auth_failure"]
    assert [
        (c["subject"], c["capability_id"], c["capability"], c["decision"], c["outcome"]) for c in calls
    ] == [
        ("alice", "svc.echo.v1", "svc.echo", "allow", "ok"),
        ("alice", "svc.whoami.v1", "svc.whoami", "deny", "not_run"),
    ]
    assert all(c["worker_id"] and c["authz_ms"] >= 0 and c["handler_ms"] >= 0 for c in calls)
    assert [(e["subject"], e["outcome"], e["native_calls"]) for e in executes] == [
        ("alice", "ok", 1),
        ("alice", "permission_denied", 1),
    ]
    assert all(e["duration_ms"] > 0 and e["worker_id"] and e["oom_killed"] is False for e in executes)
    assert calls[0]["worker_id"] == executes[0]["worker_id"]
    assert [(f["reason"], f["path"], f["client"]) for f in failures] == [
        ("unknown_token", "/mcp", "127.0.0.1")
    ]
    assert set(calls[0]) == {
        "ts",
        "event",
        "subject",
        "capability_id",
        "capability",
        "decision",
        "outcome",
        "authz_ms",
        "handler_ms",
        "worker_id",
    }


# --------------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------------


def test_settings_from_env_and_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("CODEMODE_"):
            monkeypatch.delenv(key)
    (tmp_path / "tokens.json").write_text("{}")
    (tmp_path / "policy.rego").write_text("package codemode\nallow := true\n")
    config = tmp_path / "codemode.toml"
    config.write_text(
        'host = "0.0.0.0"\nport = 9000\ntoken_file = "tokens.json"\nrego_policy = ["policy.rego"]\n'
        'rego_decision = "data.codemode.allow"\npacks = ["a:b"]\nruntime = "docker"\n'
        'docker_memory = "128m"\nsubject_quota = 2\n'
        "[limits]\nmax_execution_time = 2.5\nmax_native_calls = 7\n"
    )
    monkeypatch.setenv("CODEMODE_CONFIG", str(config))
    monkeypatch.setenv("CODEMODE_PORT", "9100")
    monkeypatch.setenv("CODEMODE_PACKS", "x.y:pack, z:p")
    monkeypatch.setenv("CODEMODE_MAX_NATIVE_CALLS", "9")
    monkeypatch.setenv("CODEMODE_POOL", "3")
    s = load_settings(host="127.0.0.2")
    assert s.host == "127.0.0.2"  # keyword beats environment and file
    assert s.port == 9100  # environment beats file
    assert s.packs == ["x.y:pack", "z:p"]
    assert s.token_file == tmp_path / "tokens.json"  # relative to the config file
    assert s.rego_policy == [tmp_path / "policy.rego"]
    assert s.runtime == "docker" and s.docker.memory == 128 * 1024 * 1024
    assert s.pool == 3 and s.subject_quota == 2
    limits = s.limits
    assert limits.max_execution_time == 2.5 and limits.max_native_calls == 9
    assert limits.max_value_depth == 32  # the library default, shown as the setting's default

    monkeypatch.setenv("CODEMODE_AUTH_MODE", "jwt")
    text = "; ".join(load_settings().http_problems())
    assert "--jwks-file / CODEMODE_JWKS_FILE" in text and "--jwks-url / CODEMODE_JWKS_URL" in text
    assert "--jwt-issuer / CODEMODE_JWT_ISSUER" in text and "--jwt-audience / CODEMODE_JWT_AUDIENCE" in text
    with pytest.raises(ConfigError, match="--jwt-issuer / CODEMODE_JWT_ISSUER"):
        create_app(load_settings())

    monkeypatch.delenv("CODEMODE_AUTH_MODE")
    monkeypatch.setenv("CODEMODE_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings()


def test_settings_require_an_explicit_authorizer_and_credentials(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(config_file=None, token_file=tmp_path / "t.json")
    assert "authorizer" in str(info.value)
    problems = load_settings(allow_all=True, token_file=tmp_path / "missing").http_problems()
    assert any("--token-file / CODEMODE_TOKEN_FILE" in p and "does not exist" in p for p in problems)
    problems = load_settings(
        allow_all=True,
        auth_mode="jwt",
        jwks_url="http://example.com/jwks",
        jwt_issuer="i",
        jwt_audience="a",
    ).http_problems()
    assert any("--jwks-url / CODEMODE_JWKS_URL: must be https" in p for p in problems)


def test_a_token_file_the_service_user_cannot_read_says_so_not_create_one(tmp_path: Path) -> None:
    """The service image runs as uid 10001; a token file ``codemode token new`` made as root (0600)
    exists but cannot be read: the hint is to make it readable, not to create it (found by the
    third new-user run of the operator's first day)."""
    hidden = tmp_path / "hidden"  # pytest's folders are 0700: uid 10001 cannot reach this one
    hidden.mkdir()
    shared = Path(tempfile.mkdtemp(prefix="codemode-token-"))
    shared.chmod(0o755)
    tokens = write_token_file(shared, ["alice"])
    tokens.path.chmod(0o600)  # as `codemode token new` makes it, owned by root
    probe = (
        "import json, sys; from pathlib import Path; from codemode.startup.config import load_settings; "
        "print(json.dumps(load_settings(allow_all=True, token_file=Path(sys.argv[1])).http_problems()))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
    env["HOME"] = "/"
    try:
        unreadable = (tokens.path, "is not readable by uid 10001")
        for path, reason in (unreadable, (hidden / "t.json", "cannot be reached")):
            as_service = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups"]
            done = subprocess.run(
                [*as_service, sys.executable, "-c", probe, str(path)],
                capture_output=True, text=True, env=env, cwd="/", timeout=60,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            (problem,) = [p for p in json.loads(done.stdout) if "--token-file / CODEMODE_TOKEN_FILE" in p]
            assert reason in problem and "chmod" in problem, problem
            assert "create one" not in problem, problem
    finally:
        shutil.rmtree(shared)


def test_bad_pack_or_catalog_is_a_config_error(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    with pytest.raises(ConfigError, match="no_such_module"):
        create_app(settings(token_file=tokens.path, packs=["no_such_module:pack"]))
    with pytest.raises(ConfigError, match=r"nope\.v1"):
        create_app(settings(token_file=tokens.path, packs=[PACK_SPEC], disable=["nope.v1"]))


# --------------------------------------------------------------------------------------------------
# shutdown
# --------------------------------------------------------------------------------------------------


async def test_graceful_shutdown_finishes_in_flight_executes(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path, pool=1)) as srv:
        await srv.service.pool.wait_warm(30)
        async with mcp_client(srv.mcp_url, tokens["alice"]) as client:
            await client.list_tools()  # the client validates results against the listed schemas
            task = asyncio.create_task(call(client, "execute", source=SLOW % "1.0"))
            async with asyncio.timeout(10):
                while srv.service.inflight == 0:
                    await asyncio.sleep(0.01)
            srv.server.should_exit = True  # what SIGTERM does
            assert await task == {"result": "slept"}
        pool = srv.service.pool
    assert srv.service.inflight == 0
    assert pool.idle == 0


async def test_draining_refuses_new_mcp_requests(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(settings(token_file=tokens.path)) as srv:
        srv.service.draining = True
        async with httpx.AsyncClient() as http:
            resp = await http.post(
                srv.mcp_url, json={}, headers={"Authorization": f"Bearer {tokens['alice']}"}
            )
        assert resp.status_code == 503
        ready = await http_get(srv.url + "/readyz")
        assert ready.status_code == 503 and ready.json()["reason"] == "shutting down"
        srv.service.draining = False


async def test_serve_from_environment_and_toml_then_sigterm(tmp_path: Path) -> None:
    """``codemode.service.serve()`` in its own process, configured only by CODEMODE_* and TOML."""
    import signal
    import socket
    import subprocess
    import sys

    tokens = write_token_file(tmp_path, ["alice"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "codemode.toml"
    config.write_text(
        f'token_file = "{tokens.path.name}"\nallow_all = true\npacks = ["{PACK_SPEC}"]\n'
        'audit_log = "audit.jsonl"\nsubject_quota = 1\n[limits]\nmax_execution_time = 10\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
    root = Path(__file__).resolve().parents[3]
    env.update(
        {
            "CODEMODE_CONFIG": str(config),
            "CODEMODE_PORT": str(port),
            "CODEMODE_METRICS_PORT": "0",  # any free port: a running service may hold the default
            "CODEMODE_HEALTH_PORT": "0",
            "CODEMODE_LOG_LEVEL": "warning",
            "PYTHONPATH": str(root),
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", "from codemode.service import serve; serve()"],
        cwd=str(root),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(30):
            while True:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else b""
                try:
                    if (await http_get(base + "/readyz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        async with mcp_client(base + "/mcp", tokens["alice"]) as client:
            await client.list_tools()
            running_call = asyncio.create_task(call(client, "execute", source=SLOW % "1.0"))
            await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)  # graceful: the in-flight execute still completes
            assert await running_call == {"result": "slept"}
        code = await asyncio.to_thread(proc.wait, 30)
        assert code in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(x["event"], x["outcome"]) for x in lines] == [("native_call", "ok"), ("execute", "ok")]


async def test_metrics_port_in_use_fails_startup_cleanly(tmp_path: Path) -> None:
    import socket

    tokens = write_token_file(tmp_path, ["alice"])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        cfg = settings(token_file=tokens.path, metrics_port=busy.getsockname()[1], pool=1)
        app = create_app(cfg)
        with pytest.raises(ConfigError, match="--metrics-port / CODEMODE_METRICS_PORT: cannot listen"):
            async with app.router.lifespan_context(app):
                pass
    assert app.state.codemode.pool.idle == 0  # the runtime that started was closed again
