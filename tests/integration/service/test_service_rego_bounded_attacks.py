"""Review R21 (hostile), the served path (real uvicorn, official MCP client, process runtime): a
tenant keeps a bounded policy's slow decisions on the event loop's thread by calling a cheap
capability between them (R21-B2 of tests/unit/authz/test_rego_bounded_attacks.py, end to end; a strict xfail
until the guard stopped letting quick decisions cancel overruns)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from tests.support.service import call, mcp_client, service, settings, write_token_file

#: svc.whoami is allowed at once; svc.echo's value is checked against 400 patterns (each line
#: lower-cases it again): bounded by the allow-list, slow only for a long value.
POLICY = (
    "package codemode\nimport rego.v1\n\ndefault allow := false\n\n"
    'allow if input.capability.name == "svc.whoami"\n\n'
    'allow if {\n\tinput.capability.name == "svc.echo"\n'
    + "".join(f'\tnot contains(lower(input.arguments.value), "pattern-{i}")\n' for i in range(400))
    + "}\n"
)

#: 4,000 four-byte characters: within the inline character cap (code points are counted).
PROGRAM = """def main():
    value = %r
    for i in range(20):  # 80 native calls: within the default limit of 100
        svc.echo(value=value)
        svc.whoami()
        svc.whoami()
        svc.whoami()
    return "done"
""" % ("\U0001f600" * 4000)


def rego_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("codemode-rego-")}


async def test_a_tenant_cannot_keep_slow_decisions_on_the_served_loop(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    policy = tmp_path / "policy.rego"
    policy.write_text(POLICY)
    app_settings = settings(
        allow_all=False,
        rego_policy=[policy],
        rego_decision="data.codemode.allow",
        token_file=tokens.path,
        max_execution_time=30,
    )
    stalls: list[float] = []
    running = True

    async def ticker() -> None:
        while running:
            started = time.perf_counter()
            await asyncio.sleep(0)
            stalls.append(time.perf_counter() - started)

    before = rego_threads()
    async with service(app_settings) as srv, mcp_client(srv.mcp_url, tokens["alice"]) as client:
        task = asyncio.create_task(ticker())
        try:
            assert await call(client, "execute", source=PROGRAM) == {"result": "done"}
        finally:
            running = False
            await task
        over = sorted(s for s in stalls if s > 0.002)
        worst = over[-1] if over else 0.0
        print(f"loop stalls over 2 ms during the execute: {len(over)}, {sum(over) * 1e3:.1f} ms in all")
        print("longest:", ", ".join(f"{s * 1e3:.1f}" for s in over[-5:]), "ms")
        # 20 decisions over the budget: the guard must have sent later ones to evaluation threads.
        assert rego_threads() - before, f"every decision ran on the loop (longest stall {worst * 1e3:.1f} ms)"
