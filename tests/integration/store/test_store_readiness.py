"""``/readyz`` reports the store of suspensions and state and the quota store (docs/service.md):
through a real uvicorn server, a PostgreSQL store that is refused, cut off or hung, and a Kubernetes
quota store whose API refuses, each make it 503 with a coarse reason and one host-log line that
names the store and holds no credential; the store back, it is ready again."""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from pathlib import Path

import pytest

from tests.support import postgres
from tests.support.service import http_get, service, settings, write_token_file

pytestmark = pytest.mark.timeout(120)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "codemode.service" and "readiness" in r.getMessage()
    ]


async def test_a_refused_postgres_store_makes_readyz_fail_without_the_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    password = "pw-" + secrets.token_hex(8)
    tokens = write_token_file(tmp_path, ["alice"])
    dsn = f"postgresql://codemode:{password}@127.0.0.1:{_closed_port()}/codemode"
    caplog.set_level(logging.WARNING, logger="codemode.service")
    async with service(settings(token_file=tokens.path, store=dsn, store_timeout=1.0)) as srv:
        ready = await http_get(srv.url + "/readyz")
        health = await http_get(srv.health_url + "/readyz")
    assert ready.status_code == 503
    assert ready.json() == {"status": "not ready", "reason": "store unavailable"}
    assert health.status_code == 503
    lines = _lines(caplog)
    assert lines and all("\n" not in line and password not in line for line in lines)
    assert "store postgres unavailable: postgres store at 127.0.0.1" in lines[0]
    assert password not in ready.text


async def test_a_postgres_store_that_goes_away_flips_readyz(
    tmp_path: Path, postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    postgres.reset(postgres_dsn)
    tokens = write_token_file(tmp_path, ["alice"])
    relay = postgres.Relay(postgres_dsn)
    through = await relay.start()
    caplog.set_level(logging.WARNING, logger="codemode.service")
    try:
        app_settings = settings(
            token_file=tokens.path, store=through, store_timeout=1.0, ready_check_timeout=3.0
        )
        async with service(app_settings) as srv:
            assert (await http_get(srv.url + "/readyz")).status_code == 200
            relay.freeze()  # hung: connections open, nothing answers
            hung = await http_get(srv.url + "/readyz")
            assert hung.status_code == 503
            assert hung.json()["reason"] == "store unavailable"
            await relay.cut()  # stopped: refused
            gone = await http_get(srv.url + "/readyz")
            assert gone.status_code == 503
            assert gone.json()["reason"] == "store unavailable"
    finally:
        await relay.cut()
    assert any("no answer within 1 s" in line for line in _lines(caplog))


async def test_the_store_back_readyz_is_ready_again(tmp_path: Path, postgres_dsn: str) -> None:
    postgres.reset(postgres_dsn)
    tokens = write_token_file(tmp_path, ["alice"])
    relay = postgres.Relay(postgres_dsn)
    through = await relay.start()
    try:
        async with service(settings(token_file=tokens.path, store=through, store_timeout=1.0)) as srv:
            assert (await http_get(srv.url + "/readyz")).status_code == 200
            await relay.cut()
            assert (await http_get(srv.url + "/readyz")).status_code == 503
            await relay.start(relay.port)  # the same address answers again
            # the pool reconnects on its own, backing off while the server was away
            async with asyncio.timeout(30):
                while (await http_get(srv.url + "/readyz")).status_code != 200:
                    await asyncio.sleep(0.2)
    finally:
        await relay.cut()


async def test_an_unreachable_quota_store_makes_readyz_fail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:{_closed_port()}', "
        "insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: not-a-real-token}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    caplog.set_level(logging.WARNING, logger="codemode.service")
    app_settings = settings(
        token_file=tokens.path,
        store="memory",
        quota_store="kubernetes",
        quota_namespace="codemode",
        quota_kubeconfig=kubeconfig,
        quota_store_timeout=1.0,
    )
    async with service(app_settings) as srv:
        ready = await http_get(srv.url + "/readyz")
    assert ready.status_code == 503
    assert ready.json() == {"status": "not ready", "reason": "quota store unavailable"}
    lines = _lines(caplog)
    assert lines and "quota store kubernetes unavailable" in lines[0]
    assert "not-a-real-token" not in " ".join(lines)
