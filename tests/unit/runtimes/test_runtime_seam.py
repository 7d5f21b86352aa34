"""The runtime seam is declared: what the executor and the pools use beyond
``Runtime``/``Sandbox`` is a protocol of ``codemode.runtimes.base``, checked with ``isinstance``, and
``spawn_for`` returns what it knows (``Spawned``) instead of setting a context variable on the side.

The executor serves any object implementing ``SubjectSpawner`` through ``spawn_for`` (its answer's
``warm`` reaches the trace), and a runtime without it through ``spawn()``; the pools read
``concurrent_refill`` and ``max_lifetime`` only from runtimes declaring them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import codemode
from codemode import authz
from codemode.common.errors import client_text
from codemode.runtimes.base import (
    ConcurrentRefill,
    ExitInfo,
    LimitedLifetime,
    MemoryLimited,
    ReusableSandbox,
    Runtime,
    Sandbox,
    Spawned,
    SubjectSpawner,
    SupervisingRuntime,
)
from codemode.runtimes.exhaustion import memory_limited
from codemode.runtimes.pool import WarmPool
from codemode.runtimes.process import ProcessOptions
from codemode.runtimes.reuse import ReusePool
from tests.support.fakes import QuietLifecycle


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


class ForSubjects:
    """A runtime handing out sandboxes per subject: the process runtime's, said to be warm."""

    name = "process+subjects"

    def __init__(self) -> None:
        self.inner = codemode.ProcessRuntime()
        self.subjects: list[str] = []

    async def start(self) -> None:
        await self.inner.start()

    async def check(self) -> None:
        await self.inner.check()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def spawn(self) -> Sandbox:
        raise AssertionError("the executor has a subject: spawn_for, not spawn")

    async def spawn_for(self, subject: str) -> Spawned:
        self.subjects.append(subject)
        return Spawned(await self.inner.spawn(), warm=True)


def _acquire_warm(exporter: InMemorySpanExporter) -> list[object]:
    return [
        (s.attributes or {}).get("codemode.sandbox.warm")
        for s in exporter.get_finished_spans()
        if s.name == "codemode.sandbox.acquire"
    ]


async def test_the_executor_uses_spawn_for_and_its_answer(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    runtime = ForSubjects()
    assert isinstance(runtime, SubjectSpawner)
    builder = codemode.Builder(
        authorizer=authz.allow_all(),
        runtime=runtime,
        tracing=codemode.Tracing(provider),
    )
    async with builder.build() as server:
        result = await server.run("def main():\n    return 7\n", subject=authz.Subject("alice"))
    assert result.value == 7
    assert runtime.subjects == ["alice"]
    assert _acquire_warm(exporter) == [True]


async def test_a_runtime_without_spawn_for_is_asked_to_spawn(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    runtime = codemode.ProcessRuntime()
    assert isinstance(runtime, Runtime) and not isinstance(runtime, SubjectSpawner)
    builder = codemode.Builder(
        authorizer=authz.allow_all(),
        runtime=runtime,
        tracing=codemode.Tracing(provider),
    )
    async with builder.build() as server:
        result = await server.run("def main():\n    return 8\n", subject=authz.Subject("bob"))
    assert result.value == 8
    assert _acquire_warm(exporter) == [False]


class Box:
    def __init__(self) -> None:
        self.worker_id = "w"

    async def write(self, data: bytes) -> None:
        return None

    async def read(self, max_bytes: int) -> bytes:
        return b""

    async def close_input(self) -> None:
        return None

    def alive(self) -> bool:
        return True

    async def destroy(self) -> ExitInfo:
        return ExitInfo(exit_code=0)


class Plain(QuietLifecycle):
    """A runtime with nothing beyond ``Runtime``."""

    name = "plain"

    async def spawn(self) -> Sandbox:
        return Box()


class Cheap(Plain):
    concurrent_refill = True


class Supervising(Plain):
    max_lifetime = 100

    async def spawn_supervised(self) -> object:
        raise AssertionError("not started in this test")


async def test_the_warm_pool_says_warm_or_cold_in_its_answer() -> None:
    pool = WarmPool(Plain(), 1)
    assert isinstance(pool, SubjectSpawner)
    await pool.start()
    try:
        await pool.wait_warm(5)
        first = await pool.spawn_for("alice")
        assert isinstance(first, Spawned) and first.warm and isinstance(first.sandbox, Box)
        pool._idle.clear()  # nothing ready now: the next one starts on demand
        second = await pool.spawn_for("alice")
        assert not second.warm
    finally:
        await pool.aclose()


def test_the_pools_read_only_declared_hints() -> None:
    cpus = max(1, os.cpu_count() or 1)
    assert not isinstance(Plain(), ConcurrentRefill)
    assert WarmPool(Plain(), 1, maximum=64).refill_concurrency == cpus
    assert isinstance(Cheap(), ConcurrentRefill)
    assert WarmPool(Cheap(), 1, maximum=64).refill_concurrency == 64

    supervising = Supervising()
    assert isinstance(supervising, SupervisingRuntime) and isinstance(supervising, LimitedLifetime)
    assert not isinstance(Plain(), SupervisingRuntime)
    pool = ReusePool(supervising, 1)  # type: ignore[arg-type]
    assert pool.max_age == pytest.approx(90)
    assert isinstance(pool, SubjectSpawner)


def test_only_a_lease_is_marked_reusable() -> None:
    assert not isinstance(Box(), ReusableSandbox)


def test_a_memory_limit_counts_only_when_declared() -> None:
    class Undeclared(Plain):
        memory_bytes = 64 * 1024**2  # an attribute of that name is not the seam

    assert not memory_limited(Undeclared()) and not memory_limited(WarmPool(Undeclared(), 0))


FAKE_WORKER = str(Path(__file__).resolve().parents[2] / "adversarial" / "fake_worker.py")


@pytest.mark.parametrize("pooled", ["bare", "warm pool"])
async def test_an_allocation_abort_under_a_memory_limit_is_memory_behind_a_pool_too(pooled: str) -> None:
    # The worker dies of SIGABRT with the allocator's line, under the process runtime's
    # address-space limit: out of memory, whether the executor holds the runtime or a pool of it.
    runtime: Runtime = codemode.ProcessRuntime(
        ProcessOptions(argv=[sys.executable, FAKE_WORKER, "abort_alloc"])
    )
    assert isinstance(runtime, MemoryLimited) and runtime.memory_limited
    if pooled == "warm pool":
        runtime = WarmPool(runtime, 0)
        assert isinstance(runtime, MemoryLimited) and runtime.memory_limited
    builder = codemode.Builder(authorizer=authz.allow_all(), runtime=runtime)
    async with builder.build() as server:
        with pytest.raises(codemode.ResourceLimit) as info:
            await server.run("def main():\n    return 1\n", subject=authz.Subject("alice"))
    assert client_text(info.value) == "resource limit exceeded: memory"
