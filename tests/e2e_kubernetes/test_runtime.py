"""KubernetesRuntime on a real node (the cluster of scripts/provision-kubernetes.sh), through the
execute pipeline: programs, native calls, limits, quota, pool, orphans, the attach protocol."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.common.errors import ResourceLimit
from codemode.execution.observe import ExecuteEvent, NullObserver
from codemode.ops.bench import aecho
from codemode.runtimes.base import CapacityExhausted
from codemode.runtimes.kubernetes import INSTANCE_LABEL, KubernetesOptions, KubernetesRuntime
from tests.support.cluster import KUBECONFIG, REPO, WORKERS, core_api, kubectl, worker_pods
from tests.support.recorder import value_at_the_limit

pytestmark = pytest.mark.kubernetes

ALICE = authz.Subject("alice")
TRIVIAL = "def main():\n    return 1\n"
ONE_CALL = "def main():\n    return util.echo(value='across the node')['value']\n"
LOOP = "def main():\n    n = 0\n    for i in range(2000000000):\n        n += 1\n    return n\n"
BOMB = 'def main():\n    s = "x" * 40000000\n    return len([s + str(i) for i in range(8)])\n'
#: Where the negotiated attach protocol is recorded (for docs and the report).
RECORD = Path(os.environ.get("CODEMODE_K8S_RECORD", "/var/log/codemode-k8s/e2e-facts.json"))


class Events(NullObserver):
    def __init__(self) -> None:
        self.events: list[ExecuteEvent] = []

    def execute_outcome(self, event: ExecuteEvent) -> None:
        self.events.append(event)


def runtime(**kwargs: Any) -> KubernetesRuntime:
    kwargs.setdefault("namespace", WORKERS)
    kwargs.setdefault("spawn_timeout", 60.0)
    return KubernetesRuntime(KubernetesOptions(kubeconfig=KUBECONFIG, **kwargs))


def server(rt: Any, *, time_limit: float = 30.0, observer: Any = None, steps: int | None = None) -> Any:
    given = {} if steps is None else {"max_execution_steps": steps}  # left out: the default
    b = codemode.Builder(
        authorizer=authz.allow_all(),
        runtime=rt,
        limits=codemode.Limits(max_execution_time=time_limit, max_concurrent_executions=8, **given),
        observer=observer,
    )
    b.register(codemode.Capability(name="util.echo", summary="Echo.", handler=aecho))
    return b.build()


def mine(rt: KubernetesRuntime) -> list[Any]:
    return list(
        core_api().list_namespaced_pod(WORKERS, label_selector=f"{INSTANCE_LABEL}={rt.instance_id}").items
    )


async def gone(rt: KubernetesRuntime, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while mine(rt):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


def record(key: str, value: Any) -> None:
    with_dir = RECORD.parent
    with_dir.mkdir(parents=True, exist_ok=True)
    facts = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    facts[key] = value
    RECORD.write_text(json.dumps(facts, indent=2, sort_keys=True))


@pytest.fixture
async def cold(cluster: None) -> AsyncIterator[KubernetesRuntime]:
    rt = runtime()
    yield rt
    await rt.aclose()
    assert await gone(rt)


async def test_trivial_program_and_a_native_call_on_a_real_node(cold: KubernetesRuntime) -> None:
    srv = server(cold)
    try:
        assert await srv.execute(TRIVIAL, subject=ALICE) == 1
        assert await srv.execute(ONE_CALL, subject=ALICE) == "across the node"
        phases = cold.last_phases
        # "running" only when a read saw the API report it before the attach succeeded.
        assert [k for k in phases if k != "running"] == ["created", "scheduled", "attached"], phases
        record("cold_start_phases_ms", {k: round(v * 1000) for k, v in phases.items()})
    finally:
        await srv.aclose()
    assert await gone(cold)


async def test_attach_protocol_negotiated(cold: KubernetesRuntime) -> None:
    sandbox = await cold.spawn()
    try:
        protocol = getattr(sandbox._stream, "subprotocol", None)
        assert protocol in ("v5.channel.k8s.io", "v4.channel.k8s.io"), protocol
        record("attach_protocol", protocol)
        # Half-close works on v5 (stdin closes, the worker sees EOF); v4 closes with the stream.
        assert sandbox._v5 == (protocol == "v5.channel.k8s.io")
    finally:
        await sandbox.destroy()


async def test_memory_bomb_is_resource_limit_from_the_oom_killed_status(cluster: None) -> None:
    rt = runtime(memory="48Mi")
    events = Events()
    srv = server(rt, observer=events)
    try:
        with pytest.raises(ResourceLimit):
            await srv.execute(BOMB, subject=ALICE)
        (event,) = events.events
        assert event.outcome == "resource_limit" and event.oom_killed, event
    finally:
        await srv.aclose()
    assert await gone(rt)


async def test_deadline_kills_the_worker_and_deletes_its_pod(cluster: None) -> None:
    rt = runtime()
    pool = codemode.WarmPool(rt, 1)
    # A step limit far beyond what 3 s can use: the deadline, not the step count, must end it.
    events = Events()
    srv = server(pool, time_limit=3.0, steps=10**12, observer=events)
    try:
        await srv.start()
        await pool.wait_warm(60)
        t0 = time.monotonic()
        with pytest.raises(ResourceLimit):
            await srv.execute(LOOP, subject=ALICE)
        assert 3.0 <= time.monotonic() - t0 < 3.0 + 5.0
        (event,) = events.events
        assert event.outcome == "resource_limit" and not event.oom_killed
    finally:
        await srv.aclose()
    assert await gone(rt)


async def test_the_deadline_includes_waiting_for_a_worker(cluster: None) -> None:
    # docs/kubernetes.md "The deadline": max_execution_time bounds the whole execute as the client
    # sees it, including a cold pod start; a warm pool takes the start off the request path.
    rt = runtime()
    srv = server(rt, time_limit=0.3)
    try:
        with pytest.raises(ResourceLimit):
            await srv.execute(TRIVIAL, subject=ALICE)
    finally:
        await srv.aclose()
    assert await gone(rt)  # the cancelled start deleted its pod
    rt = runtime()
    pool = codemode.WarmPool(rt, 1)
    srv = server(pool, time_limit=1.0)
    try:
        await srv.start()
        await pool.wait_warm(60)
        assert await srv.execute(TRIVIAL, subject=ALICE) == 1
    finally:
        await srv.aclose()
    assert await gone(rt)


async def test_active_deadline_seconds_is_the_backstop(cluster: None) -> None:
    rt = runtime(max_lifetime=2)
    sandbox = await rt.spawn()
    try:
        name = sandbox.pod_name
        deadline = time.monotonic() + 60
        while True:
            pod = core_api().read_namespaced_pod(name, WORKERS)
            if pod.status.phase == "Failed":
                break
            assert time.monotonic() < deadline, pod.status
            await asyncio.sleep(0.5)
        assert pod.status.reason == "DeadlineExceeded"
    finally:
        await sandbox.destroy()
    assert await gone(rt)


async def test_resource_quota_exhausted_is_a_clear_operator_log_and_client_text(
    cluster: None, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "codemode-e2e-full", "namespace": WORKERS},
        "spec": {"hard": {"pods": "0"}},
    }
    kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    try:
        deadline = time.monotonic() + 30
        while not (core_api().read_namespaced_resource_quota("codemode-e2e-full", WORKERS).status.hard or {}):
            assert time.monotonic() < deadline, "quota controller did not fill the status"
            await asyncio.sleep(0.2)
        rt = runtime()
        srv = server(rt)
        try:
            with (
                caplog.at_level(logging.ERROR, logger="codemode.runtimes.kubernetes"),
                pytest.raises(ResourceLimit) as info,
            ):
                await srv.execute(TRIVIAL, subject=ALICE)
            assert codemode.common.errors.client_text(info.value) == "resource limit exceeded: concurrency"
            assert "ResourceQuota of namespace codemode-workers refused worker pod" in caplog.text
            assert "exceeded quota: codemode-e2e-full" in caplog.text
        finally:
            await srv.aclose()
    finally:
        kubectl("delete", "resourcequota", "codemode-e2e-full", "-n", WORKERS, "--wait=true")


async def test_unschedulable_worker_is_a_clear_operator_log_and_client_text(
    cluster: None, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime(cpu="60", cpu_request="60")  # no node has 60 CPUs (within the namespace quota)
    srv = server(rt)
    try:
        with caplog.at_level(logging.ERROR, logger="codemode.runtimes.kubernetes"):
            t0 = time.monotonic()
            with pytest.raises(ResourceLimit) as info:
                await srv.execute(TRIVIAL, subject=ALICE)
            assert time.monotonic() - t0 < 20
            assert codemode.common.errors.client_text(info.value) == "resource limit exceeded: concurrency"
        assert "no node has room for worker pod" in caplog.text and "Insufficient cpu" in caplog.text
    finally:
        await srv.aclose()
    assert await gone(rt)


async def test_capacity_exhausted_is_a_spawn_failure_for_the_pool(cluster: None) -> None:
    rt = runtime(cpu="60", cpu_request="60", unschedulable_grace=0.5)
    try:
        with pytest.raises(CapacityExhausted):
            await rt.spawn()
    finally:
        await rt.aclose()
    assert await gone(rt)


async def test_warm_pool_of_pods_serves_back_to_back_executes(cluster: None) -> None:
    rt = runtime()
    pool = codemode.WarmPool(rt, 2)
    srv = server(pool)
    try:
        await srv.start()
        await pool.wait_warm(90)
        assert len(mine(rt)) == 2
        for _ in range(4):
            assert await srv.execute(ONE_CALL, subject=ALICE) == "across the node"
        await pool.wait_warm(90)  # refilled (concurrently: a remote runtime)
        assert pool.concurrent
    finally:
        await srv.aclose()
    assert await gone(rt)


_HOST = textwrap.dedent(
    """
    import asyncio, sys
    import codemode
    from codemode import authz
    from codemode.runtimes.kubernetes import KubernetesOptions, KubernetesRuntime

    async def main():
        rt = KubernetesRuntime(KubernetesOptions(kubeconfig=sys.argv[1], namespace=sys.argv[2]))
        b = codemode.Builder(
            authorizer=authz.allow_all(),
            runtime=rt,
            limits=codemode.Limits(max_execution_time=600, max_execution_steps=10**12),
        )
        srv = b.build()
        print("executing", flush=True)
        await srv.execute(sys.argv[3], subject=authz.Subject("victim"))

    asyncio.run(main())
    """
)


async def test_orphans_of_a_host_sigkilled_mid_execute_are_removed_by_the_next_host(cluster: None) -> None:
    before = {p.metadata.name for p in worker_pods()}
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOST, KUBECONFIG, WORKERS, LOOP],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "executing"
        # Its worker pod runs the program (attached, mid-execute) ...
        deadline = time.monotonic() + 60
        while True:
            running = [
                p for p in worker_pods() if p.metadata.name not in before and p.status.phase == "Running"
            ]
            if running:
                break
            assert proc.poll() is None and time.monotonic() < deadline, "the host's worker never ran"
            await asyncio.sleep(0.1)
        (pod,) = running
        await asyncio.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGKILL)  # ... when the host dies without any clean-up
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert pod.metadata.name in {p.metadata.name for p in worker_pods()}  # the host died; its pod did not
    rt = runtime()  # the next host: same machine, pid namespace and boot -> the owner is provably dead
    try:
        await rt.start()
        deadline = time.monotonic() + 20
        while pod.metadata.name in {p.metadata.name for p in worker_pods()}:
            assert time.monotonic() < deadline, "orphan not removed"
            await asyncio.sleep(0.2)
    finally:
        await rt.aclose()


def _gvisor_problem() -> str | None:
    nodes = core_api().list_node(label_selector="codemode.io/gvisor=true").items
    if not nodes:
        return (
            "no node labelled codemode.io/gvisor=true: gVisor is opt-in (CODEMODE_K8S_GVISOR=1 for"
            " scripts/provision-kubernetes.sh); with Debian's runsc 20221219 behind the runc shim the"
            " attached worker's stdout ends during the probe (docs/kubernetes.md)"
        )
    return None


async def test_optional_runtime_class_gvisor(cluster: None) -> None:
    problem = _gvisor_problem()
    if problem:
        pytest.skip(problem)
    kubectl("apply", "-f", str(REPO / "k8s" / "overlays" / "gvisor" / "runtimeclass.yaml"))
    rt = runtime(runtime_class="gvisor")
    srv = server(rt)
    try:
        assert await srv.execute(ONE_CALL, subject=ALICE) == "across the node"
        record("gvisor_cold_start_phases_ms", {k: round(v * 1000) for k, v in rt.last_phases.items()})
    finally:
        await srv.aclose()
    assert await gone(rt)


async def test_a_final_value_at_the_size_limit_crosses_the_attach_intact(cluster: None) -> None:
    """The largest value a worker may send, written just before it exits, reaches the host whole
    through API server, kubelet and websocket, with a 64 KiB stdout buffer that makes the reader
    pause and resume many times within that frame (and one byte more is a resource limit)."""
    rt = runtime(stdout_buffer_bytes=64 * 1024)
    srv = server(rt)
    at_limit, over, expected = value_at_the_limit(srv.limits.max_value_bytes)
    try:
        assert await srv.execute(at_limit, subject=ALICE) == expected
        with pytest.raises(ResourceLimit):
            await srv.execute(over, subject=ALICE)
    finally:
        await srv.aclose()
    assert await gone(rt)
