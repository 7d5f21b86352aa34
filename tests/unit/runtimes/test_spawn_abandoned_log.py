"""A worker start given up because the runtime or its pool is closing is one host-log line, not a
traceback: ``codemode bench --runtime kubernetes`` closed its server under executes
whose pods were still starting, and each logged ``execute failed in the host: SpawnFailed`` with
the traceback of ``SpawnFailed: spawn cancelled`` (and ``RuntimeUnavailable: pool is closed`` for
the ones still waiting for a slot).

The Kubernetes side is the fake API server of ``test_kubernetes_runtime`` (its pods never run here,
so the start is in flight when the server closes); the executes are real ``Server.execute`` calls.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

import codemode
from codemode import authz
from codemode.common.errors import Internal
from codemode.runtimes.pool import WarmPool
from tests.unit.runtimes.test_kubernetes_runtime import FakeCluster, cluster, make_runtime, wait_until

__all__ = ["cluster"]  # the fixture, imported for the tests below

TRIVIAL = "def main():\n    return 1\n"


def _server(runtime: codemode.Runtime) -> codemode.Server:
    limits = codemode.Limits(max_execution_time=30, max_concurrent_executions=1)
    return codemode.Builder(authorizer=authz.allow_all(), runtime=runtime, limits=limits).build()


@pytest.mark.parametrize("pooled", [False, True], ids=["bare", "pool"])
async def test_a_start_cut_short_by_close_is_one_line(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture, pooled: bool
) -> None:
    cluster.run_after_reads = None  # the pod never runs: its start is in flight at the close
    runtime = make_runtime(cluster, spawn_timeout=30)
    server = _server(WarmPool(runtime, 0, maximum=1) if pooled else runtime)
    await server.start()
    with caplog.at_level(logging.DEBUG):
        # the first execute's pod is starting; the second waits for the one slot
        tasks = [asyncio.create_task(server.execute(TRIVIAL, subject=authz.Subject(s))) for s in "ab"]
        await wait_until(lambda: bool(cluster.api.pods))
        await server.aclose()
        for task in tasks:
            with pytest.raises(Internal):
                await task
        await wait_until(lambda: not cluster.api.pods)
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    closing = [r.getMessage() for r in caplog.records if "closing" in r.getMessage()]
    assert len(closing) == 2, [r.getMessage() for r in caplog.records]  # one line per execute
    assert any("worker pod" in line for line in closing)
    assert all("\n" not in line for line in closing)
