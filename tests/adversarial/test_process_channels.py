"""Covert channels between two process-runtime workers: every worker of one host maps
the same files (the interpreter's ``os.py``: one inode), so a futex on a ``MAP_SHARED`` mapping of it
is one futex for all of them. Two compromised workers (arbitrary Python through the test-only entry,
under their own filter) of two subjects run at the same time and try to pass bits. Needs a host
running as root (uid drop). ``-s`` shows the rates measured.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.runtimes.process import SPAWN_MODES, ProcessOptions, ProcessRuntime, Spawn
from tests.support.recorder import make_server

from . import channel_probes as cp

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop needs a host running as root")

TESTING = {"CODEMODE_WORKER_TESTING": "1"}
ALICE, BOB = authz.Subject("alice"), authz.Subject("bob")


@pytest.fixture(params=SPAWN_MODES)
async def server(request: pytest.FixtureRequest) -> AsyncIterator[codemode.Server]:
    spawn: Spawn = request.param
    runtime = ProcessRuntime(
        ProcessOptions(module="codemode_worker.testing_entry", extra_env=TESTING, spawn=spawn)
    )
    srv, _ = make_server(runtime=runtime, max_execution_time=40.0)
    yield srv
    await srv.aclose()


async def both(server: codemode.Server, first: str, second: str) -> tuple[Any, Any]:
    one, two = await asyncio.gather(server.execute(first, subject=ALICE), server.execute(second, subject=BOB))
    return one, two


async def test_no_futex_channel_between_workers(server: codemode.Server) -> None:
    sent, got = await both(server, cp.futex_sender(), cp.futex_receiver())
    bits = cp.rate(got["bits"], sent["seconds"])
    print(f"\nfutex channel, two process-runtime workers: {bits:,.0f} bits/s ({sent}, {got['refused']})")
    assert (got["bits"], sent["acked"], bits) == ("", 0, 0.0), (sent, got["refused"])
    assert sent["refused"] == "EPERM" and got["refused"] == ["EAGAIN"], (sent, got["refused"])


async def test_no_wake_through_a_thread_end_between_workers(server: codemode.Server) -> None:
    sent, got = await both(server, cp.exit_wake_sender(3.0), cp.exit_wake_receiver(3.0))
    print(f"\nthread-end wakes between process-runtime workers: {got['woken']} of {sent['threads']}")
    assert got == {"woken": 0, "refused": "EAGAIN"}, (sent, got)


async def test_shared_kernel_objects_stay_refused(server: codemode.Server) -> None:
    report = await server.execute(cp.REFUSED_PRIMITIVES, subject=ALICE)
    assert cp.not_refused(report) == {}, report


async def test_no_mapping_count_channel_between_workers(server: codemode.Server) -> None:
    # Every worker maps the host's files: a page's mapping count, which a worker's own numa_maps and
    # smaps show, is a channel unless the worker reads no file of /proc (its Landlock domain).
    begin = time.time() + 3
    sent, got = await both(server, cp.mapcount_sender(begin), cp.mapcount_receiver(begin))
    bits = cp.mapcount_capacity(sent, got)
    print(f"\nmapping-count channel, two process-runtime workers: {bits:,.0f} bits/s ({got['refused']})")
    assert (got["bits"], bits) == ("", 0.0), got["refused"]
    assert got["refused"] == dict.fromkeys(cp.MAP_VIEWS, "EACCES"), got["refused"]


async def test_the_machines_process_count_carries_nothing(server: codemode.Server) -> None:
    # sysinfo() is refused by the worker's filter. /proc/stat and /proc/loadavg are the host's own
    # here (no namespace, no mask): SECURITY.md gives their rate and what closes them.
    counter = "sysinfo_procs"
    begin = time.time() + 3  # both workers are up and waiting by then
    sent, got = await both(server, cp.counter_sender(counter, begin), cp.counter_receiver(counter, begin))
    bits = cp.counter_capacity(sent["sent"], got["samples"], counter)
    print(f"\n{counter} between process-runtime workers: {bits:,.1f} bits/s (refused: {got['refused']})")
    assert bits == 0.0 and got["refused"], got


async def test_a_joined_thread_still_works(server: codemode.Server) -> None:
    # glibc's pthread_join waits on a shared futex: under the filter it waits again until the
    # thread's end, where a refusal by ENOSYS or EPERM would abort the worker.
    results = await server.execute(cp.JOIN_PROBE, subject=ALICE)
    assert cp.joined(results), results
