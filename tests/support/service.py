"""Shared pieces for the service tests (no tests here): a test capability pack, a counting
authorizer, a toggleable runtime, credentials, a real uvicorn server on loopback and an MCP client
over streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from prometheus_client.parser import text_string_to_metric_families

import codemode
from codemode import authz
from codemode.runtimes.base import RuntimeUnavailable, Sandbox
from codemode.service import create_app
from codemode.service.app import server_config
from codemode.service.auth import hash_token
from codemode.startup.config import Settings
from tests.support.recorder import EchoIn, EchoOut

# --------------------------------------------------------------------------------------------------
# A test pack: module-level counters so tests can see what ran
# --------------------------------------------------------------------------------------------------


@dataclass
class SlowIn:
    seconds: float


@dataclass
class Calls:
    handler: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str) -> None:
        with self.lock:
            self.handler.append(name)

    def reset(self) -> None:
        with self.lock:
            self.handler.clear()


CALLS = Calls()


async def _echo(ctx: codemode.CallContext, subject: authz.Subject, args: EchoIn) -> EchoOut:
    CALLS.add("svc.echo")
    return EchoOut(args.value)


async def _slow(ctx: codemode.CallContext, subject: authz.Subject, args: SlowIn) -> EchoOut:
    CALLS.add("svc.slow")
    await asyncio.sleep(args.seconds)
    return EchoOut("slept")


def _whoami(ctx: codemode.CallContext, subject: authz.Subject) -> EchoOut:
    CALLS.add("svc.whoami")
    return EchoOut(subject.id)


PACK = [
    codemode.Capability(id="svc.echo.v1", name="svc.echo", summary="Echo a string.", handler=_echo),
    codemode.Capability(id="svc.slow.v1", name="svc.slow", summary="Sleep a while.", handler=_slow),
    codemode.Capability(id="svc.whoami.v1", name="svc.whoami", summary="The caller.", handler=_whoami),
]
PACK_SPEC = "tests.support.service:PACK"
RECORDS_SPEC = "codemode_capabilities.records:pack"


class CountingAuthorizer:
    """Allows everything and remembers every decision input (ids only are inspected)."""

    def __init__(self) -> None:
        self.calls: list[authz.AuthorizationInput] = []

    def authorize(self, ctx: Any, input: authz.AuthorizationInput) -> None:
        self.calls.append(input)


class ToggleRuntime:
    """Wraps a runtime; ``down = True`` makes ``check()`` and ``spawn()`` fail like a stopped daemon."""

    def __init__(self, inner: codemode.Runtime) -> None:
        self.inner = inner
        self.down = False

    @property
    def name(self) -> str:
        return "toggle"

    async def start(self) -> None:
        await self.inner.start()

    async def spawn(self) -> Sandbox:
        if self.down:
            raise RuntimeUnavailable("daemon at unix:///secret/docker.sock is down")
        return await self.inner.spawn()

    async def check(self) -> None:
        if self.down:
            raise RuntimeUnavailable("daemon at unix:///secret/docker.sock is down")
        await self.inner.check()

    async def aclose(self) -> None:
        await self.inner.aclose()


# --------------------------------------------------------------------------------------------------
# Credentials
# --------------------------------------------------------------------------------------------------


@dataclass
class Tokens:
    path: Path
    by_subject: dict[str, str]

    def __getitem__(self, subject: str) -> str:
        return self.by_subject[subject]


def write_token_file(directory: Path, subjects: list[str], *, lines: bool = False) -> Tokens:
    tokens = {s: secrets.token_urlsafe(24) for s in subjects}
    if lines:
        path = directory / "tokens.txt"
        body = "# sha256(token) subject\n" + "".join(f"{hash_token(t)} {s}\n" for s, t in tokens.items())
        path.write_text(body)
    else:
        path = directory / "tokens.json"
        path.write_text(json.dumps({hash_token(t): s for s, t in tokens.items()}))
    return Tokens(path, tokens)


ISSUER = "https://issuer.test"
AUDIENCE = "codemode-test"


@dataclass
class JWTIssuer:
    jwks_path: Path
    key: rsa.RSAPrivateKey
    kid: str

    def token(
        self, sub: str, *, exp_in: float = 300, iss: str = ISSUER, aud: str = AUDIENCE, **extra: Any
    ) -> str:
        now = int(time.time())
        claims = {"sub": sub, "iss": iss, "aud": aud, "iat": now, "exp": now + int(exp_in), **extra}
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})


def make_jwt_issuer(directory: Path, kid: str = "k1") -> JWTIssuer:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": kid, "use": "sig", "alg": "RS256"})
    path = directory / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk]}))
    return JWTIssuer(path, key, kid)


def settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "allow_all": True,
        "packs": [PACK_SPEC],
        "audit_log": "none",
        "log_level": "warning",
        "metrics_port": 0,
        "health_port": 0,
        "pack_options": ["CODEMODE_RECORDS_DB=:memory:"],
    }
    base.update(overrides)
    return Settings(**base)


# --------------------------------------------------------------------------------------------------
# Log lines that pass a rate limiter
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def passed_records(logger: logging.Logger, limiter: logging.Filter) -> Iterator[list[logging.LogRecord]]:
    """The records ``logger`` handles while the block runs that pass ``limiter``."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect()
    handler.addFilter(limiter)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


# --------------------------------------------------------------------------------------------------
# A real uvicorn server on loopback
# --------------------------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class Running:
    url: str
    app: Any
    server: uvicorn.Server

    @property
    def service(self) -> Any:
        return self.app.state.codemode

    @property
    def mcp_url(self) -> str:
        return self.url + "/mcp"

    @property
    def metrics_url(self) -> str:
        host, port = self.service.metrics_address
        return f"http://{host}:{port}/metrics"

    @property
    def health_url(self) -> str:
        host, port = self.service.health_address
        return f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def running(app: Any) -> AsyncIterator[Running]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    if hasattr(app.state, "codemode"):
        # The configuration serve() uses (guarded protocol, connection bounds), on this socket.
        config = server_config(app, host="127.0.0.1", port=port, log_level="warning")
    else:  # another app the tests run (a JWKS endpoint)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, lifespan="on", log_level="warning", ws="none"
        )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(20):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("uvicorn exited during startup")
                await asyncio.sleep(0.01)
        yield Running(f"http://127.0.0.1:{port}", app, server)
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(30):
                await task
        finally:
            sock.close()


@contextlib.asynccontextmanager
async def service(app_settings: Settings, **kwargs: Any) -> AsyncIterator[Running]:
    CALLS.reset()
    async with running(create_app(app_settings, **kwargs)) as r:
        yield r


# --------------------------------------------------------------------------------------------------
# The official MCP client over streamable HTTP
# --------------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def mcp_client(url: str, token: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60))
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        yield client


#: An MCP initialize request of the 2025-06-18 handshake (opens a session in stateful mode).
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


def tool_value(result: Any) -> Any:
    """``structuredContent`` of a success (for ``execute`` without its call ledger and prints:
    ``{"result": ...}``), or ``("error", text)`` of an ``isError`` result."""
    if result.is_error:
        return ("error", result.content[0].text)
    out = result.structured_content
    if isinstance(out, dict) and "calls" in out:
        assert isinstance(out["calls"], list), out
        return {key: value for key, value in out.items() if key not in ("calls", "prints")}
    return out


async def call(client: Client, tool: str, **arguments: str) -> Any:
    return tool_value(await client.call_tool(tool, arguments))


async def execute(url: str, token: str, source: str) -> Any:
    async with mcp_client(url, token) as client:
        return await call(client, "execute", source=source)


# --------------------------------------------------------------------------------------------------
# Plain HTTP and metrics
# --------------------------------------------------------------------------------------------------


async def http_get(url: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=15) as client:
        return await client.get(url, **kwargs)


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of one /metrics scrape."""
    resp = await http_get(url)
    assert resp.status_code == 200, resp.status_code
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def metric(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything the server sent on a raw connection until it closed it (TimeoutError if it did
    not within ``seconds``). A reset counts as closed: a server closing a socket with unread bytes
    in it (the body a client is still sending) makes the kernel answer with a reset, not a FIN."""
    data = b""
    async with asyncio.timeout(seconds):
        try:
            while chunk := await reader.read(65536):
                data += chunk
        except ConnectionResetError:
            pass
    return data
