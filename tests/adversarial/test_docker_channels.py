"""Covert channels between tenants on one Docker node: two compromised workers, each in
a container of its own (one per execute, and two reusable sandboxes of the reuse mode), try to pass
bits to each other through kernel objects both can reach. The programs are ``channel_probes``' Python,
run by the TEST-ONLY worker entry under the worker's own seccomp filter and the container's profile.

Each test prints the rate it measured (``-s`` shows it) and asserts that nothing got through.

Skips locally without Docker (visible reason); fails under CI=true.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from codemode import authz
from codemode.runtimes.docker import DockerOptions, DockerRuntime
from codemode.runtimes.docker._orphans import OWNER as _OWNER
from codemode.runtimes.docker.masked_paths import ENGINE_DEFAULTS, MASKED_PATHS
from tests.support.docker_engine import worker_containers
from tests.support.reuse import reuse_server

from . import channel_probes as cp
from . import reuse_probe as rp
from .test_docker_escape import GVISOR, OCI_RUNTIME, TESTING_IMAGE, run_python

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def no_leaked_containers(docker_api: Any) -> Iterator[None]:
    yield
    deadline = time.monotonic() + 30
    mine = f"io.codemode.owner={_OWNER.id}"
    while (left := worker_containers(docker_api, mine)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"leaked worker containers: {[c['Id'][:12] for c in left]}"


@pytest.fixture
async def runtime(docker_api: Any) -> AsyncIterator[DockerRuntime]:
    rt = DockerRuntime(DockerOptions(oci_runtime=OCI_RUNTIME, testing_entry=True, image=TESTING_IMAGE))
    yield rt
    await rt.aclose()


async def two_containers(rt: DockerRuntime, first: str, second: str) -> tuple[Any, Any]:
    """``first`` and ``second`` run at the same time, each in a fresh container of its own."""
    a, b = await asyncio.gather(rt.spawn(), rt.spawn())
    try:
        one, two = await asyncio.gather(run_python(a, first), run_python(b, second))
        return one, two
    finally:
        await asyncio.gather(a.destroy(), b.destroy())


def futex_rate(sent: dict[str, Any], got: dict[str, Any], where: str) -> float:
    bits = cp.rate(got["bits"], sent["seconds"])
    print(
        f"\nfutex channel, {where}: {bits:,.0f} bits/s ({len(got['bits'])} bits in"
        f" {sent['seconds']:.3f} s; sender refused: {sent['refused']}, receiver refused: {got['refused']})"
    )
    return bits


async def test_no_futex_channel_between_containers(runtime: DockerRuntime) -> None:
    sent, got = await two_containers(runtime, cp.futex_sender(), cp.futex_receiver())
    bits = futex_rate(sent, got, "two containers of one image")
    assert (got["bits"], sent["acked"], bits) == ("", 0, 0.0), (sent, got["refused"])
    # Both ends are refused by the filter: the shared wake and the shared wait.
    assert sent["refused"] == "EPERM" and got["refused"] == ["EAGAIN"], (sent, got["refused"])


async def test_no_wake_through_a_thread_end_between_containers(runtime: DockerRuntime) -> None:
    # The sender makes no futex call at all: its threads' ends wake the word (a shared wake the kernel
    # makes, no filter sees); the receiver's shared wait is what must be refused.
    sent, got = await two_containers(runtime, cp.exit_wake_sender(3.0), cp.exit_wake_receiver(3.0))
    print(f"\nthread-end wakes between containers: {got['woken']} of {sent['threads']} threads' ends")
    assert got == {"woken": 0, "refused": "EAGAIN"}, (sent, got)


async def test_shared_kernel_objects_stay_refused(runtime: DockerRuntime) -> None:
    sandbox = await runtime.spawn()
    try:
        report = await run_python(sandbox, cp.REFUSED_PRIMITIVES)
    finally:
        await sandbox.destroy()
    assert cp.not_refused(report) == {}, report


async def test_no_futex_channel_between_reuse_sandboxes(docker_api: Any) -> None:
    rt = DockerRuntime(
        DockerOptions(
            oci_runtime=OCI_RUNTIME,
            testing_entry=True,
            image=TESTING_IMAGE,
            supervisor_entrypoint=rp.SUPERVISOR,
        )
    )
    server, _, seen = await reuse_server(rt, size=2)
    try:
        sent, got = await asyncio.gather(
            server.execute(cp.futex_sender(), subject=authz.Subject("alice")),
            server.execute(cp.futex_receiver(), subject=authz.Subject("bob")),
        )
    finally:
        await server.aclose()
    assert len(set(seen.sandboxes())) == 2, seen.workers()  # two sandboxes, one per subject
    bits = futex_rate(sent, got, "two reuse sandboxes")
    assert (got["bits"], sent["acked"], bits) == ("", 0, 0.0), (sent, got["refused"])
    assert sent["refused"] == "EPERM" and got["refused"] == ["EAGAIN"], (sent, got["refused"])


def mapcount_rate(sent: dict[str, Any], got: dict[str, Any], where: str) -> float:
    bits = cp.mapcount_capacity(sent, got)
    print(f"\nmapping-count channel, {where}: {bits:,.0f} bits/s (receiver refused: {got['refused']})")
    return bits


async def test_no_mapping_count_channel_between_containers(runtime: DockerRuntime) -> None:
    # Each page of an image file is one page-cache page for every container of the node; a worker's
    # own numa_maps and smaps show how many processes map it. The worker reads no file of /proc.
    begin = time.time() + 6  # both containers are up and waiting by then
    sent, got = await two_containers(runtime, cp.mapcount_sender(begin), cp.mapcount_receiver(begin))
    bits = mapcount_rate(sent, got, "two containers of one image")
    assert (got["bits"], bits) == ("", 0.0), got["refused"]
    if not GVISOR:  # no Landlock there; nor does another sandbox share its pages
        assert got["refused"] == dict.fromkeys(cp.MAP_VIEWS, "EACCES"), got["refused"]


async def test_no_mapping_count_channel_between_reuse_sandboxes(docker_api: Any) -> None:
    rt = DockerRuntime(
        DockerOptions(
            oci_runtime=OCI_RUNTIME,
            testing_entry=True,
            image=TESTING_IMAGE,
            supervisor_entrypoint=rp.SUPERVISOR,
        )
    )
    server, _, seen = await reuse_server(rt, size=2)
    begin = time.time() + 6
    try:
        sent, got = await asyncio.gather(
            server.execute(cp.mapcount_sender(begin), subject=authz.Subject("alice")),
            server.execute(cp.mapcount_receiver(begin), subject=authz.Subject("bob")),
        )
    finally:
        await server.aclose()
    assert len(set(seen.sandboxes())) == 2, seen.workers()
    bits = mapcount_rate(sent, got, "two reuse sandboxes")
    assert (got["bits"], bits) == ("", 0.0), got["refused"]
    if not GVISOR:
        assert got["refused"] == dict.fromkeys(cp.MAP_VIEWS, "EACCES"), got["refused"]


@pytest.mark.parametrize("counter", cp.COUNTERS)
async def test_host_wide_counters_carry_nothing(runtime: DockerRuntime, counter: str) -> None:
    begin = time.time() + 6  # both containers are up and waiting by then
    sent, got = await two_containers(
        runtime, cp.counter_sender(counter, begin), cp.counter_receiver(counter, begin)
    )
    bits = cp.counter_capacity(sent["sent"], got["samples"], counter)
    print(f"\n{counter} between containers: {bits:,.1f} bits/s (refused: {got['refused']})")
    assert bits == 0.0, got


MASKS_PROBE = """
import os
seen = {}
for path in PATHS:
    try:
        if os.path.isdir(path):
            seen[path] = sorted(os.listdir(path))[:5]
        else:
            with open(path, "rb") as f:
                seen[path] = f.read(64).decode(errors="replace")
    except OSError as exc:
        seen[path] = exc.strerror
final({"seen": seen, "cgroup": sorted(os.listdir("/sys/fs/cgroup"))[:3], "cpus": os.cpu_count()})
"""


async def test_the_machines_counters_are_masked(runtime: DockerRuntime) -> None:
    if GVISOR:
        pytest.skip("gVisor's /proc and /sys are its own: they count the sandbox, not the node")
    sandbox = await runtime.spawn()
    try:
        paths = [p for p in MASKED_PATHS if p not in ENGINE_DEFAULTS]
        report = await run_python(sandbox, f"PATHS = {paths!r}\n" + MASKS_PROBE)
    finally:
        await sandbox.destroy()
    # Each one is empty (or absent on this kernel); the cgroup's own files and the CPU count are not.
    assert {p: v for p, v in report["seen"].items() if v not in ("", [], "No such file or directory")} == {}
    assert report["cgroup"] and report["cpus"], report


async def test_a_joined_thread_still_works(runtime: DockerRuntime) -> None:
    sandbox = await runtime.spawn()
    try:
        results = await run_python(sandbox, cp.JOIN_PROBE)
    finally:
        await sandbox.destroy()
    assert cp.joined(results), results
