"""Audit-log growth from requests without a valid token (prints numbers; not a test).

    python -m tests.benchmarks.bench_preauth [--n 5000] [--clients 8]

Starts ``codemode.service.serve()`` in a subprocess on loopback (audit log to a file), sends ``--n``
``/mcp`` requests with bad tokens from ``--clients`` keep-alive connections, stops the service
(SIGTERM, so the last window's summaries are written) and prints the audit log's size and line
count, and the same per 24 h at the measured rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from codemode.service.auth import hash_token

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_service(
    directory: Path, subjects: dict[str, str], **settings: str
) -> tuple[subprocess.Popen[bytes], str]:
    """``serve()`` in a subprocess on a free loopback port, with a token file of ``subjects``
    (token -> subject), allow-all and ``settings`` as ``CODEMODE_*`` variables; returns it and its
    base URL once ``/healthz`` answers. Only settings every version has: it runs against older
    trees too (``PYTHONPATH=OLD/src``) for before/after figures."""
    tokens = directory / "tokens.json"
    tokens.write_text(json.dumps({hash_token(t): s for t, s in subjects.items()}))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
    env.update({"CODEMODE_" + k.upper(): v for k, v in settings.items()})
    env.update(
        {
            "CODEMODE_PORT": str(port),
            "CODEMODE_METRICS_PORT": "0",
            "CODEMODE_HEALTH_PORT": "0",
            "CODEMODE_TOKEN_FILE": str(tokens),
            "CODEMODE_ALLOW_ALL": "true",
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
    async with httpx.AsyncClient(timeout=5) as http:
        for _ in range(300):
            try:
                if (await http.get(base + "/healthz")).status_code == 200:
                    return proc, base
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
    proc.kill()
    raise RuntimeError("the service did not start")


def stop_service(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)


async def _run(n: int, clients: int) -> None:
    with tempfile.TemporaryDirectory(prefix="codemode-bench-preauth-") as tmp:
        d = Path(tmp)
        audit = d / "audit.jsonl"
        proc, base = await start_service(
            d, {"the-real-token": "alice"}, audit_log=str(audit), log_level="warning"
        )
        try:
            queue = iter(range(n))

            async def client() -> None:
                async with httpx.AsyncClient(timeout=30) as http:
                    for i in queue:
                        resp = await http.post(
                            base + "/mcp",
                            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                            headers={"Authorization": f"Bearer bad-{i}"},
                        )
                        assert resp.status_code == 401, resp.status_code

            t0 = time.monotonic()
            await asyncio.gather(*(client() for _ in range(clients)))
            seconds = time.monotonic() - t0
            during = audit.stat().st_size if audit.exists() else 0
        finally:
            stop_service(proc)
        size = audit.stat().st_size if audit.exists() else 0
        lines = audit.read_text().splitlines() if audit.exists() else []
        refusals = sum(
            1 if x["event"] == "auth_failure" else x.get("count", 0) for x in map(json.loads, lines)
        )
        per_day = size / seconds * 86400 if seconds else 0.0
        print(f"{n} bad-token requests in {seconds:.1f} s from {clients} connections")
        print(f"audit log: {size:,} bytes in {len(lines)} lines ({during:,} bytes before shutdown)")
        print(f"refusals accounted for in the log: {refusals} of {n}")
        print(f"at this rate: {per_day / 2**30:.3f} GiB per day from one client address")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(_run(args.n, args.clients))


if __name__ == "__main__":
    main()
