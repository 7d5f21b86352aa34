"""Suspension on the Docker runtime (the matrix runs on the process runtime, one row
here): through the official client on 2026-07-28, no worker container exists while the question
waits, and the retry resumes the execute by replay in a fresh container (the earlier call is not
run again)."""

from __future__ import annotations

from typing import Any

import pytest

import codemode
from codemode.runtimes.docker import DockerRuntime
from codemode_capabilities.records import RecordStore
from codemode_capabilities.records import capabilities as record_caps
from tests.integration.execution.test_suspension import ask, count, mcp, retry
from tests.support.approval import AskDeletes, create_then_delete
from tests.support.docker_engine import worker_containers
from tests.support.mcp_client import execute_value, ledger, wait_until

pytestmark = pytest.mark.docker


async def test_docker_accept_holds_no_container_while_asked_and_replays(docker_api: Any) -> None:
    runtime = DockerRuntime()
    records = RecordStore()
    builder = codemode.Builder(authorizer=AskDeletes(), runtime=runtime)
    builder.register(*record_caps(records))
    server = builder.build()
    mine = f"io.codemode.runtime-instance={runtime.instance_id}"
    src = create_then_delete()
    try:
        async with mcp(server) as alice:
            first = await ask(alice, src)
            assert await wait_until(lambda: not worker_containers(docker_api, mine), 60), (
                "a worker container is held while the user is asked"
            )
            done = await retry(alice, src, first.request_state or "")
        assert execute_value(done) == {"id": 1, "deleted": True}
        assert ledger(done) == [("records.create", "ok"), ("records.delete", "ok")]
        assert count(records) == 0
    finally:
        await server.aclose()
