"""The reuse mode on the real cluster: reusable worker pods (codemode.runtimes.reuse over
KubernetesRuntime) and their escape suite.

A pod whose PID 1 is ``codemode_worker.supervisor`` serves one subject's executes, a fresh worker
process each; subjects never share a pod. The escape suite runs the TEST-ONLY worker entry
(``codemode-worker-testing``, another tag with ``CODEMODE_TESTING_IMAGE``) with and without the
worker's own seccomp filter (``unconfined``: the supervisor's ``--testing-unconfined``). Without
the filter and under ``RuntimeDefault`` a compromised worker can do much more here than in a Docker
container (create System V IPC objects, write the kubelet's ``/dev/termination-log``, call
``ptrace``, renice or pin other processes): the scrub and the kernel's rules for PID 1 and for a
non-dumpable process must hold on their own.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.runtimes.kubernetes import KubernetesOptions, KubernetesRuntime
from codemode_worker import PROTOCOL_VERSION
from tests.support.cluster import KUBECONFIG, WORKERS, core_api
from tests.support.reuse import Sandboxes, reuse_server

from ..adversarial import reuse_probe as rp

pytestmark = pytest.mark.kubernetes

TESTING_IMAGE = os.environ.get("CODEMODE_TESTING_IMAGE") or f"codemode-worker-testing:{PROTOCOL_VERSION}"
ALICE = authz.Subject("alice")


def _runtime(**kwargs: Any) -> KubernetesRuntime:
    return KubernetesRuntime(
        KubernetesOptions(kubeconfig=KUBECONFIG, namespace=WORKERS, spawn_timeout=60.0, **kwargs)
    )


def _pods_of(rt: KubernetesRuntime) -> list[str]:
    found = core_api().list_namespaced_pod(
        WORKERS, label_selector=f"io.codemode.runtime-instance={rt.instance_id}"
    )
    return [p.metadata.name for p in found.items if p.metadata.deletion_timestamp is None]


async def test_one_subject_reuses_its_pod_and_subjects_never_share(cluster: None) -> None:
    rt = _runtime()
    server, pool, seen = await reuse_server(rt, 2)
    try:
        await pool.wait_warm(120)  # else a first execute may start a third pod while the two start
        for i in range(3):
            for subject in ("alice", "bob"):
                value = f"{subject}-{i}"
                assert (
                    await server.execute(
                        f"def main():\n    return {value!r}\n", subject=authz.Subject(subject)
                    )
                    == value
                )
        owner = seen.owners()
        assert all(len(who) == 1 for who in owner.values()), owner
        assert len(owner) == 2  # one pod each, reused: no pod start after the first two
        assert pool.reused == 4
    finally:
        await server.aclose()
    for _ in range(60):
        if not _pods_of(rt):
            break
        await asyncio.sleep(0.5)
    assert not _pods_of(rt)


@pytest.fixture(params=["confined", "unconfined"])
async def reuse(
    request: pytest.FixtureRequest, cluster: None
) -> AsyncIterator[tuple[codemode.Server, Sandboxes]]:
    command = rp.UNCONFINED if request.param == "unconfined" else rp.SUPERVISOR
    rt = _runtime(image=TESTING_IMAGE, testing_entry=True, supervisor_entrypoint=command)
    server, _, seen = await reuse_server(rt)
    yield server, seen
    await server.aclose()


async def test_nothing_is_left_for_the_next_execute(reuse: tuple[codemode.Server, Sandboxes]) -> None:
    server, seen = reuse
    pristine = await server.execute(rp.FIND, subject=ALICE)
    left = await server.execute(rp.LEAVE, subject=ALICE)
    found = await server.execute(rp.FIND, subject=ALICE)
    assert seen.sandbox(0) == seen.sandbox(1) == seen.sandbox(2), seen.workers()
    assert found["supervisor"] == pristine["supervisor"]
    assert found["pid"] != pristine["pid"]
    assert rp.clean(found, pristine) == {}, left


async def test_the_supervisor_is_out_of_reach(reuse: tuple[codemode.Server, Sandboxes]) -> None:
    server, seen = reuse
    pristine = await server.execute(rp.FIND, subject=ALICE)
    tried = await server.execute(rp.REACH, subject=ALICE)
    for name in rp.REFUSED_BY_THE_KERNEL:
        assert rp.refused(tried[name]), (name, tried[name])
    after = await server.execute(rp.FIND, subject=ALICE)
    changed = [name for name in rp.ATTRIBUTES if not rp.refused(tried[name])]
    if changed:
        assert seen.sandbox(2) != seen.sandbox(1), (changed, seen.workers())
    else:
        assert seen.sandbox(2) == seen.sandbox(1)
        assert after["supervisor"] == pristine["supervisor"]
    assert rp.clean(after, pristine) == {}


async def test_a_slice_set_on_the_supervisor_reaches_no_later_worker(
    reuse: tuple[codemode.Server, Sandboxes],
) -> None:
    """Without the worker's filter, ``RuntimeDefault`` lets a worker set a custom
    scheduling slice on PID 1 (``sched_setattr``, ``sched_runtime``), which left the policy, priority
    and nice value alone: it passed the scrub and every later worker inherited it. The scrub compares
    the whole ``sched_getattr`` now: the sandbox is recycled, and the next worker has the usual slice."""
    server, seen = reuse
    pristine = await server.execute(rp.OWN_SLICE, subject=ALICE)
    tried = await server.execute(rp.SLICE, subject=ALICE)
    after = await server.execute(rp.OWN_SLICE, subject=ALICE)
    assert after["slice"] == pristine["slice"], (tried, pristine, after)
    if rp.refused(tried["tried"]):
        assert seen.sandbox(2) == seen.sandbox(1), seen.workers()
    else:
        assert seen.sandbox(2) != seen.sandbox(1), (tried, seen.workers())
