"""A Rego policy in the served path (real uvicorn, official MCP client, process runtime): a decision
a tenant can make slow fails at the execute's deadline while /healthz keeps answering, and a bounded
policy's decisions (evaluated on the event loop's thread) are served as the policy says."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from codemode.startup.config import Settings
from tests.support.service import call, http_get, mcp_client, service, settings, write_token_file

ECHO = "def main():\n    return svc.echo(value=%r)['value']\n"

#: svc.echo with a short value is allowed at once; a longer one makes the policy count millions.
SLOW_POLICY = """package codemode
import rego.v1

default allow := false

allow if {
	input.capability.name == "svc.echo"
	count(input.arguments.value) < 4
}

allow if {
	input.capability.name == "svc.echo"
	count(input.arguments.value) >= 4
	count([x | some x in numbers.range(1, count(input.arguments.value) * 400000)]) > 0
}
"""

BOUNDED_POLICY = """package codemode
import rego.v1

default allow := false

allow if {
	input.capability.name == "svc.echo"
	not startswith(input.arguments.value, "secret")
}
"""


def rego_settings(tmp_path: Path, source: str, tokens: Path) -> Settings:
    policy = tmp_path / "policy.rego"
    policy.write_text(source)
    return settings(
        allow_all=False,
        rego_policy=[policy],
        rego_decision="data.codemode.allow",
        token_file=tokens,
        max_execution_time=1.5,
    )


async def test_a_slow_decision_keeps_the_deadline_and_health_answers(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    async with service(rego_settings(tmp_path, SLOW_POLICY, tokens.path)) as srv:
        async with mcp_client(srv.mcp_url, tokens["alice"]) as client:
            assert await call(client, "execute", source=ECHO % "ok") == {"result": "ok"}
            started = time.monotonic()
            slow = asyncio.create_task(call(client, "execute", source=ECHO % ("x" * 10)))
            answered = 0
            while not slow.done():
                health = await http_get(srv.health_url + "/healthz")
                assert health.status_code == 200
                answered += 1
                await asyncio.sleep(0.05)
            outcome = await slow
            elapsed = time.monotonic() - started
        assert answered >= 5, f"/healthz answered {answered} times while the policy evaluated"
        assert outcome == ("error", "resource limit exceeded: time"), outcome
        assert elapsed < 15  # the evaluation alone takes many seconds; the execute ends at its deadline


async def test_a_bounded_policy_decides_in_the_served_path(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path, ["alice"])
    app_settings = rego_settings(tmp_path, BOUNDED_POLICY, tokens.path)
    async with service(app_settings) as srv, mcp_client(srv.mcp_url, tokens["alice"]) as client:
        assert await call(client, "execute", source=ECHO % "public") == {"result": "public"}
        denied = await call(client, "execute", source=ECHO % "secret-1")
        assert "permission denied" in str(denied), denied
        big = "y" * 10_000  # over the inline cap: decided on an evaluation thread, the same way
        assert await call(client, "execute", source=ECHO % big) == {"result": big}
