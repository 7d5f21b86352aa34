"""Covert channels between two tenants' worker pods on one node.

Every pod of one image on a node reads the image's files through the same lower inode of the node's
snapshotter, so a futex on a ``MAP_SHARED`` mapping of one is one futex for every pod there. Two
compromised workers (the test twin of the worker image, ``CODEMODE_TESTING_IMAGE``: arbitrary Python
under the worker's own filter and the pod's RuntimeDefault profile), in two pods pinned to the same
node, try to pass bits (``channel_probes``). ``-s`` shows the rates measured.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from kubernetes import client as k8s

import codemode
from codemode import authz
from codemode.runtimes.kubernetes import KubernetesOptions, KubernetesRuntime
from tests.support.cluster import KUBECONFIG, WORKERS, ready_nodes

from ..adversarial import channel_probes as cp
from .test_containment import TESTING_IMAGE

pytestmark = pytest.mark.kubernetes


class OnOneNode(KubernetesRuntime):
    """Worker pods pinned to one node (the runtime spreads them otherwise)."""

    def __init__(self, node: str, **options: Any) -> None:
        super().__init__(KubernetesOptions(**options))
        self.node = node

    def pod_manifest(
        self, pod_name: str, supervised: bool = False, avoided_nodes: list[str] | None = None
    ) -> k8s.V1Pod:
        pod = super().pod_manifest(pod_name, supervised, avoided_nodes)
        assert pod.spec is not None
        pod.spec.node_selector = {"kubernetes.io/hostname": self.node}
        pod.spec.affinity = None
        pod.spec.topology_spread_constraints = None
        return pod


async def on_one_node(*sources: str) -> list[Any]:
    """Each of ``sources`` at the same time, in a fresh pod of its own (a subject of its own), all
    on one node; their values."""
    node = ready_nodes()[0]
    rt = OnOneNode(
        node,
        kubeconfig=KUBECONFIG,
        namespace=WORKERS,
        image=TESTING_IMAGE,
        testing_entry=True,
        spawn_timeout=60.0,
    )
    server = codemode.Builder(
        authorizer=authz.allow_all(), runtime=rt, limits=codemode.Limits(max_execution_time=60.0)
    ).build()
    try:
        runs = (server.execute(s, subject=authz.Subject(f"tenant-{i}")) for i, s in enumerate(sources))
        return list(await asyncio.gather(*runs))
    finally:
        await server.aclose()


async def test_no_futex_channel_between_pods_on_one_node(cluster: None) -> None:
    sent, got = await on_one_node(cp.futex_sender(), cp.futex_receiver())
    bits = cp.rate(got["bits"], sent["seconds"])
    print(f"\nfutex channel, two pods on one node: {bits:,.0f} bits/s ({sent}, {got['refused']})")
    assert (got["bits"], sent["acked"], bits) == ("", 0, 0.0), (sent, got["refused"])
    assert sent["refused"] == "EPERM" and got["refused"] == ["EAGAIN"], (sent, got["refused"])


async def test_no_wake_through_a_thread_end_between_pods(cluster: None) -> None:
    sent, got = await on_one_node(cp.exit_wake_sender(3.0), cp.exit_wake_receiver(3.0))
    print(f"\nthread-end wakes between pods on one node: {got['woken']} of {sent['threads']}")
    assert got == {"woken": 0, "refused": "EAGAIN"}, (sent, got)


async def test_the_machines_process_count_carries_nothing(cluster: None) -> None:
    # sysinfo() is refused by the worker's filter; /proc/stat and /proc/loadavg stay readable in a
    # pod (a pod's spec has no per-path mask): SECURITY.md gives their rate and what closes them.
    begin = time.time() + 20  # both pods are up and waiting by then
    sender, receiver = cp.counter_sender("sysinfo_procs", begin), cp.counter_receiver("sysinfo_procs", begin)
    sent, got = await on_one_node(sender, receiver)
    bits = cp.counter_capacity(sent["sent"], got["samples"], "sysinfo_procs")
    print(f"\nsysinfo_procs between pods on one node: {bits:,.1f} bits/s (refused: {got['refused']})")
    assert bits == 0.0 and got["refused"], got


async def test_no_mapping_count_channel_between_pods_on_one_node(cluster: None) -> None:
    # A page of the image is one page-cache page for every pod of the node, and a worker's own
    # numa_maps and smaps show how many processes map it: the worker reads no file of /proc.
    begin = time.time() + 20  # both pods are up and waiting by then
    sent, got = await on_one_node(cp.mapcount_sender(begin), cp.mapcount_receiver(begin))
    bits = cp.mapcount_capacity(sent, got)
    print(f"\nmapping-count channel, two pods on one node: {bits:,.0f} bits/s ({got['refused']})")
    assert (got["bits"], bits) == ("", 0.0), got["refused"]
    assert got["refused"] == dict.fromkeys(cp.MAP_VIEWS, "EACCES"), got["refused"]


@pytest.mark.parametrize("counter", ["proc_stat_processes", "proc_loadavg_threads"])
async def test_the_machines_counters_in_proc_carry_nothing(cluster: None, counter: str) -> None:
    # A pod's spec has no per-path mask: the worker's Landlock domain refuses every file of /proc.
    begin = time.time() + 20
    sent, got = await on_one_node(cp.counter_sender(counter, begin), cp.counter_receiver(counter, begin))
    bits = cp.counter_capacity(sent["sent"], got["samples"], counter)
    print(f"\n{counter} between pods on one node: {bits:,.1f} bits/s (refused: {got['refused']})")
    assert bits == 0.0 and got["refused"], got


async def test_shared_kernel_objects_stay_refused(cluster: None) -> None:
    (report,) = await on_one_node(cp.REFUSED_PRIMITIVES)
    assert cp.not_refused(report) == {}, report


async def test_a_joined_thread_still_works(cluster: None) -> None:
    (results,) = await on_one_node(cp.JOIN_PROBE)
    assert cp.joined(results), results
