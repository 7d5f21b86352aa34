"""One tenant's burst must not keep the warm pool empty for the others (issue 21, pool sizing).

A real ``WarmPool`` of real workers (processes with the classic spawn: ``python -I`` per worker, so a
cold spawn costs what it costs in production; and Docker containers: run it under the engines lock),
one flooding subject whose executes hold their workers, and one victim. The victim's executes must
get warm workers while the flood holds its own: a subject takes at most its share of the pool's warm
workers until the pool has refilled them (``docs/reference/runtimes.md``, Warm pool). Whether a
worker was warm is read from the execute's ``codemode.sandbox.acquire`` span (the same flag
operators see in traces), never from a timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import codemode
from codemode import authz
from codemode.execution.tracing import subject_hash

POOL = 4
FLOOD = 8


@dataclass
class HoldOut:
    value: str


@pytest.fixture(params=["process", "docker"])
def make_runtime(request: pytest.FixtureRequest) -> Callable[[], codemode.Runtime]:
    if request.param == "docker":
        request.getfixturevalue("docker_api")  # skips without an engine (fails under CI=true)
        from codemode.runtimes.docker import DockerRuntime

        return DockerRuntime
    return lambda: codemode.ProcessRuntime(spawn="classic")


def _warm_by_subject(exporter: InMemorySpanExporter) -> dict[str, list[bool]]:
    spans = list(exporter.get_finished_spans())
    executes = {
        s.context.span_id: str((s.attributes or {}).get("codemode.subject"))
        for s in spans
        if s.name == "codemode.execute"
    }
    out: dict[str, list[bool]] = {}
    for s in spans:
        if s.name == "codemode.sandbox.acquire" and s.parent is not None:
            subject = executes.get(s.parent.span_id, "?")
            out.setdefault(subject, []).append(bool((s.attributes or {}).get("codemode.sandbox.warm")))
    return out


async def test_a_flooding_subject_cannot_drain_the_pool_for_another(
    make_runtime: Callable[[], codemode.Runtime],
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gate = asyncio.Event()
    holding = 0

    async def hold(ctx: codemode.CallContext, subject: authz.Subject) -> HoldOut:
        nonlocal holding
        holding += 1
        await gate.wait()
        return HoldOut(value="done")

    pool = codemode.WarmPool(make_runtime(), POOL)
    builder = codemode.Builder(
        authorizer=authz.allow_all(),
        limits=codemode.Limits(max_concurrent_executions=FLOOD + 4, max_execution_time=120),
        runtime=pool,
        tracing=codemode.Tracing(provider),  # type: ignore[arg-type]
    )
    builder.register(codemode.Capability(name="util.hold", summary="Waits for the test.", handler=hold))
    server = builder.build()
    flooder, victim = authz.Subject("flooder"), authz.Subject("victim")
    try:
        async with server:
            await pool.wait_warm(120)
            flood = [
                asyncio.create_task(server.run("def main():\n    return util.hold()\n", subject=flooder))
                for _ in range(FLOOD)
            ]
            async with asyncio.timeout(120):
                while holding < FLOOD:  # every flood execute holds a worker now
                    await asyncio.sleep(0.02)
            for _ in range(2):
                assert (await server.run("def main():\n    return 1\n", subject=victim)).value == 1
            gate.set()
            assert [r.value for r in await asyncio.gather(*flood)] == [{"value": "done"}] * FLOOD
    finally:
        gate.set()
        provider.shutdown()
    warm = _warm_by_subject(exporter)
    flood_warm = warm[subject_hash("flooder")]
    assert len(flood_warm) == FLOOD
    # The victim's executes were served warm while the flood held its workers.
    assert warm[subject_hash("victim")] == [True, True], warm
    # The flood got its share of warm workers, the rest of it started cold.
    assert 1 <= sum(flood_warm) < POOL, flood_warm
