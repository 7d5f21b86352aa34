"""Stateful sessions opened by one tenant: memory and the other tenants (prints numbers; not a test).

    python -m tests.benchmarks.bench_sessions [--n 10000] [--clients 16]

Starts ``codemode.service.serve()`` in stateful mode in a subprocess on loopback, lets one subject
open ``--n`` sessions (``initialize`` without a session id) from ``--clients`` connections, then
has a second subject open one. Prints how many of the first subject's were admitted, the time, the
server's resident memory (VmRSS) before and after, and the second subject's status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from codemode.service.auth import hash_token

from .bench_preauth import ROOT, _free_port

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "b", "version": "1"},
    },
}
ACCEPT = "application/json, text/event-stream"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _run(n: int, clients: int) -> None:
    with tempfile.TemporaryDirectory(prefix="codemode-bench-sessions-") as tmp:
        d = Path(tmp)
        (d / "tokens.json").write_text(
            json.dumps({hash_token("mallory-token"): "mallory", hash_token("alice-token"): "alice"})
        )
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
        env.update(
            {
                "CODEMODE_PORT": str(port),
                "CODEMODE_METRICS_PORT": "0",
                "CODEMODE_HEALTH_PORT": "0",
                "CODEMODE_TOKEN_FILE": str(d / "tokens.json"),
                "CODEMODE_ALLOW_ALL": "true",
                "CODEMODE_AUDIT_LOG": "none",
                "CODEMODE_LOG_LEVEL": "error",
                "CODEMODE_MCP_STATELESS": "false",
                "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p),
            }
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", "from codemode.service import serve; serve()"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        statuses: Counter[int] = Counter()
        try:
            async with httpx.AsyncClient(timeout=5) as http:
                for _ in range(300):
                    try:
                        if (await http.get(base + "/healthz")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        await asyncio.sleep(0.1)
            before = _rss_mib(proc.pid)
            queue = iter(range(n))

            async def client() -> None:
                headers = {"Authorization": "Bearer mallory-token", "Accept": ACCEPT}
                async with httpx.AsyncClient(timeout=30) as http:
                    for _ in queue:
                        statuses[
                            (await http.post(base + "/mcp", json=INIT, headers=headers)).status_code
                        ] += 1

            t0 = time.monotonic()
            await asyncio.gather(*(client() for _ in range(clients)))
            seconds = time.monotonic() - t0
            await asyncio.sleep(1.0)
            after = _rss_mib(proc.pid)
            async with httpx.AsyncClient(timeout=30) as http:
                other = await http.post(
                    base + "/mcp",
                    json=INIT,
                    headers={"Authorization": "Bearer alice-token", "Accept": ACCEPT},
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        print(
            f"one subject opened {n} sessions in {seconds:.1f} s from {clients} connections: {dict(statuses)}"
        )
        print(f"server RSS: {before:.0f} MiB before, {after:.0f} MiB after (+{after - before:.0f} MiB)")
        print(f"another subject's new session: HTTP {other.status_code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(_run(args.n, args.clients))


if __name__ == "__main__":
    main()
