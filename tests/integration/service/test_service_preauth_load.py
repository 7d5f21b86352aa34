"""The pre-authentication load test: an attacker without a token keeps 2 x max_connections idle and
half-sent sockets open for 60 s from several loopback addresses, re-opening each one the server
closes, while an authenticated tenant's executes (official MCP client) and ``/healthz`` keep
succeeding throughout. The service is ``codemode.service.serve()`` in its own process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.service import PACK_SPEC, execute, write_token_file
from tests.support.service_process import service_process

MAX_CONNECTIONS = 64
PER_ADDRESS = 8
ATTACKERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
SECONDS = 60.0
ECHO = "def main():\n    return svc.echo(value='x')['value']\n"


@dataclass
class Attack:
    open: int = 0
    most_open: int = 0
    closed_by_server: int = 0
    connect_errors: int = 0
    answers: dict[bytes, int] = field(default_factory=dict)

    def opened(self) -> None:
        self.open += 1
        self.most_open = max(self.most_open, self.open)


async def _hold(port: int, source: str, style: str, stop: asyncio.Event, attack: Attack) -> None:
    """One attacker socket: open it, send nothing / half a request / a trickle, and when the server
    closes it, open it again."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        except OSError:
            attack.connect_errors += 1
            await asyncio.sleep(0.05)
            continue
        attack.opened()
        try:
            if style != "idle":
                writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
            while not stop.is_set():
                try:
                    async with asyncio.timeout(1.0):
                        data = await reader.read(4096)
                except TimeoutError:
                    if style == "trickle":
                        writer.write(b"X")  # one header byte a second
                    continue
                if not data:
                    attack.closed_by_server += 1
                    break
                status = data[:12]
                attack.answers[status] = attack.answers.get(status, 0) + 1
        except OSError:
            attack.closed_by_server += 1
        finally:
            attack.open -= 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        # Re-open at once, pausing only long enough to stay a holding attack rather than a
        # connect flood (a SYN flood is the kernel's and the ingress's business).
        await asyncio.sleep(0.01)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_idle_and_half_sent_sockets_do_not_deny_a_tenant_or_the_probes(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    toml = (
        f'token_file = "{tokens.path}"\nallow_all = true\npacks = ["{PACK_SPEC}"]\n'
        'audit_log = "none"\nlog_level = "warning"\n'
        f"max_connections = {MAX_CONNECTIONS}\n"
        f"max_unauthenticated_connections_per_address = {PER_ADDRESS}\n"
        "header_timeout = 2.0\n"
    )
    async with service_process(tmp_path, toml) as srv:
        stop = asyncio.Event()
        attack = Attack()
        styles = ("idle", "half", "idle", "trickle")
        sockets = [
            asyncio.create_task(_hold(srv.port, ATTACKERS[i % len(ATTACKERS)], styles[i % 4], stop, attack))
            for i in range(2 * MAX_CONNECTIONS)
        ]
        failures: list[str] = []
        executes = probes = 0
        try:
            async with asyncio.timeout(20):
                while attack.most_open < len(ATTACKERS) * PER_ADDRESS:
                    await asyncio.sleep(0.05)
            deadline = time.monotonic() + SECONDS
            async with httpx.AsyncClient(timeout=10) as probe:
                while time.monotonic() < deadline:
                    try:
                        resp = await probe.get(srv.health_url + "/healthz")
                        probes += 1
                        if resp.status_code != 200:
                            failures.append(f"healthz {resp.status_code}")
                    except httpx.HTTPError as exc:
                        failures.append(f"healthz {type(exc).__name__}")
                    try:
                        async with asyncio.timeout(30):
                            result = await execute(srv.mcp_url, tokens["alice"], ECHO)
                        executes += 1
                        if result != {"result": "x"}:
                            failures.append(f"execute {result!r}")
                    except Exception as exc:
                        failures.append(f"execute {type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.5)
        finally:
            stop.set()
            await asyncio.gather(*sockets, return_exceptions=True)
    print(
        f"\nattack: {2 * MAX_CONNECTIONS} sockets from {len(ATTACKERS)} addresses for {SECONDS:.0f} s; "
        f"most open at once {attack.most_open}, closed by the server {attack.closed_by_server}, "
        f"answers {dict(attack.answers)}; tenant: {executes} executes, {probes} probes, "
        f"{len(failures)} failures"
    )
    assert failures == []
    assert executes >= 20 and probes >= 20
    # The attack was real: every address held its bound, and the server kept closing sockets.
    assert attack.most_open >= len(ATTACKERS) * PER_ADDRESS
    assert attack.closed_by_server >= 2 * MAX_CONNECTIONS
