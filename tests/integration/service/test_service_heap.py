"""The served process's start-up heap is out of the cyclic collector before its port accepts
(codemode.service.heap): a real ``serve()`` process, watched from inside by a ``sitecustomize``
that records the collector's state; and ``serve_async`` awaited inside an application freezes
nothing of it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import time
import weakref
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from codemode.service import serve_async
from codemode.service.app import Service
from tests.support.service import PACK_SPEC, settings, write_token_file
from tests.support.service_process import ROOT, free_port, service_process

# Loaded by the served interpreter at its start (it is first on PYTHONPATH): writes, every 20 ms,
# when (wall clock) and how many objects are frozen to the file TEST_GC_PROBE_FILE names. (Not
# gc.get_objects(): from another thread it can take a reference to a tuple still being built, and
# the interpreter then fails with SystemError, as a first version of this probe did.)
PROBE = """\
import gc, json, os, threading, time

_path = os.environ["TEST_GC_PROBE_FILE"]


def _write():
    while True:
        with open(_path + ".partial", "w") as f:
            json.dump({"at": time.time(), "frozen": gc.get_freeze_count()}, f)
        os.replace(_path + ".partial", _path)
        time.sleep(0.02)


threading.Thread(target=_write, daemon=True).start()
"""


async def test_the_start_up_heap_is_frozen_before_the_port_accepts(tmp_path: Path) -> None:
    """Before: nothing was frozen, and every full collection of the served process walked the
    whole start-up heap (~135k objects) while every request waited: 204-229 ms each in a load run
    on the 2-core machine (tests/benchmarks/bench_service_load.py, docs/performance.md)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    state_file = tmp_path / "gc.json"
    tokens = write_token_file(tmp_path, ["alice"])
    toml = f'token_file = "{tokens.path}"\nallow_all = true\npacks = ["{PACK_SPEC}"]\naudit_log = "none"\n'
    env = {
        "PYTHONPATH": os.pathsep.join((str(probe), str(ROOT))),
        "TEST_GC_PROBE_FILE": str(state_file),
    }
    async with service_process(tmp_path, toml, env=env) as srv:
        ready_at = time.time()  # /readyz has passed
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(srv.url + "/healthz")).status_code == 200
        state = await _written_after(state_file, ready_at)
    # Ready means frozen: the start-up heap (modules, the catalog, the app: ~135k objects) is in
    # the permanent generation.
    assert state["frozen"] > 50_000, state


async def _written_after(state_file: Path, moment: float) -> dict[str, Any]:
    """The probe's first record written after ``moment`` (it writes every 20 ms)."""
    async with asyncio.timeout(10):
        while True:
            with contextlib.suppress(FileNotFoundError, ValueError):
                state: dict[str, Any] = json.loads(state_file.read_text())
                if state["at"] > moment:
                    return state
            await asyncio.sleep(0.02)


async def test_serve_async_in_an_application_leaves_its_collector_as_it_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before (found by a hostile review): the freeze ran in ``serve_async`` too, which an
    application awaits in its own process: it froze the application's whole heap (~160k objects
    here), never gave it back, and each stopped service stayed uncollectable (3 runs, 3 services
    alive)."""
    services: list[weakref.ref[Service]] = []
    real_init = Service.__init__

    def recorded_init(self: Service, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        services.append(weakref.ref(self))

    monkeypatch.setattr(Service, "__init__", recorded_init)
    frozen_before = gc.get_freeze_count()
    frozen_while_serving = await _serve_until_ready(monkeypatch, tmp_path)
    assert frozen_while_serving == frozen_before
    gc.collect()
    assert len(services) == 1 and services[0]() is None  # the stopped service was collected


async def _serve_until_ready(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> int:
    """``serve_async`` in this process until ``/readyz`` passes, then stopped the way SIGTERM
    stops it; how many objects were frozen while it served."""
    servers: list[uvicorn.Server] = []
    real_serve = uvicorn.Server.serve

    async def recorded_serve(self: uvicorn.Server, *args: Any, **kwargs: Any) -> None:
        servers.append(self)
        await real_serve(self, *args, **kwargs)

    monkeypatch.setattr(uvicorn.Server, "serve", recorded_serve)
    port, health = free_port(), free_port()
    tokens = write_token_file(tmp_path, ["alice"])
    task = asyncio.create_task(serve_async(settings(port=port, health_port=health, token_file=tokens.path)))
    try:
        async with asyncio.timeout(60), httpx.AsyncClient(timeout=2) as http:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"http://127.0.0.1:{health}/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.02)
        return gc.get_freeze_count()
    finally:
        for running in servers:
            running.should_exit = True
        async with asyncio.timeout(30):
            await task
        monkeypatch.undo()
