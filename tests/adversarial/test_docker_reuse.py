"""Escape suite of the reuse mode on Docker: a compromised worker in a reusable sandbox attacks its
supervisor and tries to leave anything behind for its subject's next execute.

The TEST-ONLY worker entry runs each exec frame's source as **Python** (``reuse_probe``: the
programs). Each test runs twice: with the worker's own seccomp filter (the real configuration) and
``unconfined`` (the supervisor's ``--testing-unconfined``: its workers skip the filter), which shows
that the layers under the filter hold on their own: the kernel's rules for a pid namespace's init
and for a non-dumpable process, the container's seccomp profile, and the scrub. Image: the test image
(``CODEMODE_TEST_TESTING_IMAGE``, default ``codemode-worker-testing:1``).

Skips locally without Docker (visible reason); fails under CI=true.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.runtimes.docker import DockerOptions, DockerRuntime
from codemode.runtimes.docker._orphans import OWNER as _OWNER
from tests.support.docker_engine import worker_containers
from tests.support.reuse import Sandboxes, reuse_server

from . import reuse_probe as rp
from .test_docker_escape import OCI_RUNTIME, TESTING_IMAGE

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ALICE = authz.Subject("alice")


@pytest.fixture(scope="module", autouse=True)
def no_leaked_containers(docker_api: Any) -> Iterator[None]:
    yield
    deadline = time.monotonic() + 30
    mine = f"io.codemode.owner={_OWNER.id}"
    while (left := worker_containers(docker_api, mine)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"leaked worker containers: {[c['Id'][:12] for c in left]}"


@pytest.fixture(params=["confined", "unconfined"])
async def reuse(
    request: pytest.FixtureRequest, docker_api: Any
) -> AsyncIterator[tuple[codemode.Server, Sandboxes]]:
    command = rp.UNCONFINED if request.param == "unconfined" else rp.SUPERVISOR
    rt = DockerRuntime(
        DockerOptions(
            oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE, supervisor_entrypoint=command
        )
    )
    server, _, seen = await reuse_server(rt)
    yield server, seen
    await server.aclose()
    assert not worker_containers(docker_api, f"io.codemode.runtime-instance={rt.instance_id}")


async def test_nothing_is_left_for_the_next_execute(reuse: tuple[codemode.Server, Sandboxes]) -> None:
    server, seen = reuse
    pristine = await server.execute(rp.FIND, subject=ALICE)
    left = await server.execute(rp.LEAVE, subject=ALICE)
    found = await server.execute(rp.FIND, subject=ALICE)
    # The same sandbox served all three (a fresh worker process each): it was scrubbed, not replaced.
    assert seen.sandbox(0) == seen.sandbox(1) == seen.sandbox(2), seen.workers()
    assert found["sandbox"] == pristine["sandbox"]
    assert found["supervisor"] == pristine["supervisor"]  # the same PID 1, untouched by the attack
    assert len({pristine["pid"], found["pid"]}) == 2
    assert rp.clean(found, pristine) == {}, left
    # Docker: nothing in the sandbox is writable and its profile refuses System V IPC, with or
    # without the worker's filter; signals to PID 1 never arrive (no handler: the kernel drops them).
    for name, result in left.items():
        if name.startswith(("file ", "dir ", "append ", "setxattr ", "shmget", "semget", "msgget", "mq_")):
            assert rp.refused(result), (name, result)


async def test_the_supervisor_is_out_of_reach(reuse: tuple[codemode.Server, Sandboxes]) -> None:
    server, seen = reuse
    pristine = await server.execute(rp.FIND, subject=ALICE)
    tried = await server.execute(rp.REACH, subject=ALICE)
    for name in rp.REFUSED_BY_THE_KERNEL:
        assert rp.refused(tried[name]), (name, tried[name])
    after = await server.execute(rp.FIND, subject=ALICE)  # SIGSTOP or SIGKILL would hang or end it
    changed = [name for name in rp.ATTRIBUTES if not rp.refused(tried[name])]
    if changed:
        # A same-uid process changed what the supervisor's workers inherit: the scrub saw it and the
        # sandbox was recycled (a new one served the next execute).
        assert seen.sandbox(2) != seen.sandbox(1), (changed, seen.workers())
        assert after["supervisor_limits"] == pristine["supervisor_limits"]
    else:
        assert seen.sandbox(2) == seen.sandbox(1), seen.workers()
        assert after["supervisor"] == pristine["supervisor"]
    assert rp.clean(after, pristine) == {}


async def test_a_slice_set_on_the_supervisor_reaches_no_later_worker(
    reuse: tuple[codemode.Server, Sandboxes],
) -> None:
    """A custom scheduling slice on PID 1 (``sched_setattr``, ``sched_runtime``) left
    the policy, priority and nice value alone, passed the scrub and was inherited by every later
    worker. Here the container's profile refuses the call (with or without the worker's filter);
    where it passes (Kubernetes, tests/e2e_kubernetes/test_reuse.py) the scrub sees it."""
    server, seen = reuse
    pristine = await server.execute(rp.OWN_SLICE, subject=ALICE)
    tried = await server.execute(rp.SLICE, subject=ALICE)
    after = await server.execute(rp.OWN_SLICE, subject=ALICE)
    assert after["slice"] == pristine["slice"], (tried, pristine, after)
    if rp.refused(tried["tried"]):
        assert seen.sandbox(2) == seen.sandbox(1), seen.workers()
    else:  # the scrub compared the whole sched_getattr: the sandbox was recycled
        assert seen.sandbox(2) != seen.sandbox(1), (tried, seen.workers())
