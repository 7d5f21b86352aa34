"""One tenant's burst must not keep the warm pool empty for the others (pool sizing).

A real ``WarmPool`` of real workers (processes with the classic spawn: ``python -I`` per worker, so a
cold spawn costs what it costs in production; and Docker containers: run it under the engines lock),
one flooding subject whose executes hold their workers, and one victim served a moment before. The
victim's executes must get warm workers while the flood holds its own: a subject takes at most its
share of the pool's warm workers until the pool has refilled them, while another subject competes
for them (``docs/reference/runtimes.md``, Warm pool). A lone subject, with nobody else to leave them
to, takes every idle warm worker. Whether a worker was warm is read from the execute's
``codemode.sandbox.acquire`` span (the same flag operators see in traces), never from a timing.
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
from codemode.runtimes.process import ProcessOptions

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
    return lambda: codemode.ProcessRuntime(ProcessOptions(spawn="classic"))


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


class Rig:
    """A server over a real ``WarmPool`` with ``util.hold`` (waits for ``gate``), traced in memory."""

    def __init__(self, runtime: codemode.Runtime, size: int) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.gate = asyncio.Event()
        self.holding = 0
        self.pool = codemode.WarmPool(runtime, size)
        builder = codemode.Builder(
            authorizer=authz.allow_all(),
            limits=codemode.Limits(max_concurrent_executions=FLOOD + 4, max_execution_time=120),
            runtime=self.pool,
            tracing=codemode.Tracing(self.provider),
        )
        builder.register(
            codemode.Capability(name="util.hold", summary="Waits for the test.", handler=self.hold)
        )
        self.server = builder.build()

    async def hold(self, ctx: codemode.CallContext, subject: authz.Subject) -> HoldOut:
        self.holding += 1
        await self.gate.wait()
        return HoldOut(value="done")

    async def until_holding(self, n: int) -> None:
        async with asyncio.timeout(120):
            while self.holding < n:  # that many executes hold a worker now
                await asyncio.sleep(0.02)


async def test_a_flooding_subject_cannot_drain_the_pool_for_another(
    make_runtime: Callable[[], codemode.Runtime],
) -> None:
    rig = Rig(make_runtime(), POOL)
    exporter, provider, gate, pool, server = rig.exporter, rig.provider, rig.gate, rig.pool, rig.server
    flooder, victim = authz.Subject("flooder"), authz.Subject("victim")
    try:
        async with server:
            await pool.wait_warm(120)
            # The victim was served a moment ago: it competes for the warm workers.
            assert (await server.run("def main():\n    return 0\n", subject=victim)).value == 0
            await pool.wait_warm(120)
            flood = [
                asyncio.create_task(server.run("def main():\n    return util.hold()\n", subject=flooder))
                for _ in range(FLOOD)
            ]
            await rig.until_holding(FLOOD)
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
    assert warm[subject_hash("victim")] == [True, True, True], warm
    # The flood got its share of warm workers, the rest of it started cold.
    assert 1 <= sum(flood_warm) < POOL, flood_warm


async def test_a_lone_subject_takes_every_idle_warm_worker(
    make_runtime: Callable[[], codemode.Runtime],
) -> None:
    # Before: with the default share of 0.5 of a pool of 2, the second of two executes sent at once
    # started cold beside the idle warm worker (the refill had not replaced the first one yet).
    rig = Rig(make_runtime(), 2)
    lone = authz.Subject("lone")
    try:
        async with rig.server:
            await rig.pool.wait_warm(120)
            both = [
                asyncio.create_task(rig.server.run("def main():\n    return util.hold()\n", subject=lone))
                for _ in range(2)
            ]
            await rig.until_holding(2)
            rig.gate.set()
            assert [r.value for r in await asyncio.gather(*both)] == [{"value": "done"}] * 2
    finally:
        rig.gate.set()
        rig.provider.shutdown()
    assert _warm_by_subject(rig.exporter)[subject_hash("lone")] == [True, True]
