"""``parallel(...)`` in a Docker worker: the batch frames cross the container's
attach stream like any call, and the calls run at once. Skips locally without an engine or the
worker image; fails under ``CI=true`` (the ``docker_api`` fixture)."""

from __future__ import annotations

import asyncio
from typing import Any

import codemode
from tests.integration.execution.test_parallel import Gates, gated_capabilities
from tests.support.recorder import ALICE


async def test_parallel_in_a_docker_worker(docker_api: Any) -> None:
    gates = Gates(barrier=asyncio.Barrier(4))
    builder = codemode.Builder(
        authorizer=codemode.authz.allow_all(),
        limits=codemode.Limits(max_execution_time=30.0),
        runtime=codemode.DockerRuntime(),
    )
    builder.register(*gated_capabilities(gates))
    server = builder.build()
    source = (
        "def main():\n"
        "    met = parallel([(gate.meet, {'value': str(i)}) for i in range(4)])\n"
        "    bad = parallel([(gate.quick, {'value': 1})])[0]['error']\n"
        "    return [r['value']['value'] for r in met] + [bad]\n"
    )
    try:
        run = await server.run(source, subject=ALICE)  # one at a time, the first call would wait forever
    finally:
        await server.aclose()
    assert run.value == [
        "0",
        "1",
        "2",
        "3",
        'invalid capability arguments: argument "value" must be str, got int',
    ]
    assert [c.outcome for c in run.calls] == ["ok"] * 4 + ["invalid arguments"]
