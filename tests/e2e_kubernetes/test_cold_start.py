"""The cold start on a real node: the runtime attaches as soon as the kubelet runs the worker
container, before the API reports the pod Running (docs/kubernetes.md, "Start-up phases"), and
retries exactly the "not running yet" refusals of the API server and the kubelet."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from kubernetes import client as k8s

import codemode
from codemode import authz
from codemode.ops.bench import aecho
from codemode.runtimes import kubernetes as kmod
from codemode.runtimes.handshake import PROBE
from codemode.runtimes.kubernetes import INSTANCE_LABEL, KubernetesOptions, KubernetesRuntime
from codemode.runtimes.kubernetes import _attach as kattach
from codemode.runtimes.streams import LaunchHandoff
from tests.support.cluster import KUBECONFIG, WORKERS, core_api

pytestmark = pytest.mark.kubernetes

ALICE = authz.Subject("alice")
ONE_CALL = "def main():\n    return util.echo(value='across the node')['value']\n"
#: Frames both ways, more than one websocket message each (the program's value is 200 KB).
MANY_FRAMES = (
    "def main():\n"
    "    got = [util.echo(value=str(i) * 1000)['value'] for i in range(20)]\n"
    "    return [len(g) for g in got] + [len('x' * 200000)]\n"
)
HOLD = 2.0


class HeldPod(KubernetesRuntime):
    """Worker pods with an init container that holds them for ``HOLD`` seconds: scheduled, the
    worker container not running yet (what every attach meets in the first ~0.5 s of a pod)."""

    def pod_manifest(
        self, pod_name: str, supervised: bool = False, avoided_nodes: list[str] | None = None
    ) -> k8s.V1Pod:
        pod = super().pod_manifest(pod_name, supervised, avoided_nodes)
        assert pod.spec is not None
        worker = pod.spec.containers[0]
        pod.spec.init_containers = [
            k8s.V1Container(
                name="hold",
                image=worker.image,
                image_pull_policy=worker.image_pull_policy,
                command=["python3", "-I", "-c", f"import time; time.sleep({HOLD})"],
                security_context=worker.security_context,
                resources=worker.resources,
            )
        ]
        return pod


def server(rt: Any) -> Any:
    b = codemode.Builder(
        authorizer=authz.allow_all(), runtime=rt, limits=codemode.Limits(max_execution_time=60.0)
    )
    b.register(codemode.Capability(name="util.echo", summary="Echo.", handler=aecho))
    return b.build()


async def gone(rt: KubernetesRuntime, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while core_api().list_namespaced_pod(WORKERS, label_selector=f"{INSTANCE_LABEL}={rt.instance_id}").items:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


async def test_a_fresh_pod_is_attached_before_the_api_reports_it_running_and_loses_no_frame(
    cluster: None,
) -> None:
    rt = KubernetesRuntime(KubernetesOptions(kubeconfig=KUBECONFIG, namespace=WORKERS, spawn_timeout=60.0))
    srv = server(rt)
    early: list[dict[str, float]] = []
    try:
        # The runtime reads the pod before every attempt: an attach that succeeded while its
        # reads never saw Running was made before the API reported the pod running. One such
        # start in five proves it (a start can lose the race to the kubelet's relist: ~5 %).
        for _ in range(5):
            assert await srv.execute(ONE_CALL, subject=ALICE) == "across the node"
            phases = dict(rt.last_phases)
            assert list(phases)[:2] == ["created", "scheduled"] and "attached" in phases, phases
            if "running" not in phases:
                early.append(phases)
                break
        assert early, "every attach came after the API reported Running"
        # Every frame of a program with many native calls and a large value, on an early pod.
        assert await srv.execute(MANY_FRAMES, subject=ALICE) == [1000] * 10 + [2000] * 10 + [200000]
    finally:
        await srv.aclose()
    assert await gone(rt)


async def test_a_pod_whose_worker_does_not_run_yet_is_refused_exactly_and_retried(cluster: None) -> None:
    rt = HeldPod(KubernetesOptions(kubeconfig=KUBECONFIG, namespace=WORKERS, spawn_timeout=60.0))
    api = core_api()
    # What the API server and the kubelet answer now (the texts the retry decision matches).
    name = f"codemode-worker-{time.monotonic_ns() % 10**16:016d}"
    api.create_namespaced_pod(WORKERS, rt.pod_manifest(name))
    try:
        refusals = []
        for _ in range(2):
            with pytest.raises(kattach._Refused) as refused:
                rt._attach_blocking(api, name, PROBE, LaunchHandoff())
            refusals.append(refused.value.text)
            while not api.read_namespaced_pod(name, WORKERS).spec.node_name:
                await asyncio.sleep(0.05)
        # The last one: scheduled, the init container holding the worker container back.
        assert "unable to upgrade connection: container worker not found in pod" in refusals[-1], refusals
        assert all(kmod.not_running_yet(text, name, WORKERS) for text in refusals), refusals
    finally:
        api.delete_namespaced_pod(name, WORKERS, grace_period_seconds=0)
    # The launch retries them, and the refused attempts leave the worker's stdin (stdinOnce) to
    # the one that reaches it: the probe and every frame after it arrive.
    srv = server(rt)
    try:
        assert await srv.execute(MANY_FRAMES, subject=ALICE) == [1000] * 10 + [2000] * 10 + [200000]
        phases = rt.last_phases
        assert phases["attached"] - phases["scheduled"] >= HOLD - 0.5, phases
        assert rt.last_attach_attempts >= 5, rt.last_attach_attempts
    finally:
        await srv.aclose()
    assert await gone(rt)
