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
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from tests.support.service import INITIALIZE

from .bench_preauth import start_service, stop_service

ACCEPT = "application/json, text/event-stream"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _run(n: int, clients: int) -> None:
    with tempfile.TemporaryDirectory(prefix="codemode-bench-sessions-") as tmp:
        subjects = {"mallory-token": "mallory", "alice-token": "alice"}
        settings = {"audit_log": "none", "log_level": "error", "mcp_stateless": "false"}
        proc, base = await start_service(Path(tmp), subjects, **settings)
        statuses: Counter[int] = Counter()
        try:
            before = _rss_mib(proc.pid)
            queue = iter(range(n))

            async def client() -> None:
                headers = {"Authorization": "Bearer mallory-token", "Accept": ACCEPT}
                async with httpx.AsyncClient(timeout=30) as http:
                    for _ in queue:
                        statuses[
                            (await http.post(base + "/mcp", json=INITIALIZE, headers=headers)).status_code
                        ] += 1

            t0 = time.monotonic()
            await asyncio.gather(*(client() for _ in range(clients)))
            seconds = time.monotonic() - t0
            await asyncio.sleep(1.0)
            after = _rss_mib(proc.pid)
            async with httpx.AsyncClient(timeout=30) as http:
                other = await http.post(
                    base + "/mcp",
                    json=INITIALIZE,
                    headers={"Authorization": "Bearer alice-token", "Accept": ACCEPT},
                )
        finally:
            stop_service(proc)
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
