"""Quotas that hold across replicas (docs/service.md, "Several replicas: a shared quota"): two
servers in one process stand for two replicas; they share the per-subject quota through Lease
objects of the project's real cluster (``codemode.KubernetesQuota``). Attack first: one subject
sends its executes to both replicas (before the shared store: twice its quota ran at once)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

import codemode
from codemode import authz
from tests.support.cluster import KUBECONFIG, core_api, require_cluster

pytestmark = pytest.mark.kubernetes

NS = "codemode-quota-test"
QUOTA = 2
HOLD = "def main():\n    return svc.hold()['value']\n"


@dataclass
class Out:
    value: str


@dataclass
class Gate:
    """Counts the executes inside ``svc.hold`` (past the quota and a worker slot), per subject,
    and keeps them there until opened (``pause``: or that many seconds)."""

    pause: float | None = None
    inside: Counter[str] = field(default_factory=Counter)
    most: int = 0
    opened: asyncio.Event = field(default_factory=asyncio.Event)

    async def hold(self, ctx: codemode.CallContext, subject: authz.Subject) -> Out:
        self.inside[subject.id] += 1
        self.most = max(self.most, self.inside.total())
        try:
            if self.pause is None:
                await self.opened.wait()
            else:
                await asyncio.sleep(self.pause)
        finally:
            self.inside[subject.id] -= 1
        return Out(value=subject.id)


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    """A namespace of this module's own for the quota Leases, deleted afterwards."""
    require_cluster()
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = core_api()
    deadline = time.monotonic() + 120
    while True:  # one left terminating by an earlier run refuses new Leases: wait until it is gone
        try:
            api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
            break
        except ApiException as exc:
            if exc.status != 409:
                raise
        if api.read_namespace(NS).status.phase != "Terminating":
            break
        assert time.monotonic() < deadline, f"namespace {NS} still terminating"
        time.sleep(0.5)
    yield NS
    api.delete_namespace(NS)


def store(**options: Any) -> codemode.KubernetesQuota:
    return codemode.KubernetesQuota(NS, kubeconfig=options.pop("kubeconfig", KUBECONFIG), **options)


@asynccontextmanager
async def replica(
    gate: Gate, quota_store: codemode.QuotaStore | None, *, slots: int = 4, **builder: Any
) -> AsyncIterator[codemode.Server]:
    b = codemode.Builder(
        authorizer=authz.allow_all(),
        runtime=codemode.ProcessRuntime(),
        limits=codemode.Limits(max_concurrent_executions=slots, max_execution_time=60.0),
        quota_store=quota_store,
        **builder,
    )
    b.register(codemode.Capability(name="svc.hold", summary="Waits at a gate.", handler=gate.hold))
    async with b.build() as server:
        yield server


async def until(condition: Any, what: str, seconds: float = 60) -> None:
    try:
        async with asyncio.timeout(seconds):
            while not condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {seconds} s: {what}") from None


def refused_quota(result: object) -> bool:
    return isinstance(result, codemode.ResourceLimit) and result.kind == "quota"


async def test_two_replicas_admit_no_more_than_one_quota_of_a_subject(namespace: str) -> None:
    gate = Gate()
    alice = authz.Subject("alice-two-replicas")
    async with (
        replica(gate, store(), subject_quota=QUOTA) as one,
        replica(gate, store(), subject_quota=QUOTA) as two,
    ):
        tasks = [
            asyncio.ensure_future(s.execute(HOLD, subject=alice))
            for s in (one, two)
            for _ in range(QUOTA + 1)
        ]
        await until(lambda: gate.inside.total() + sum(t.done() for t in tasks) == len(tasks), "all settled")
        admitted = gate.inside.total()
        gate.opened.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    # One quota for the service as a whole: two replicas must not make it two.
    assert admitted <= QUOTA, f"{admitted} executes of one subject admitted at once with a quota of {QUOTA}"
    assert sum(map(refused_quota, results)) == len(tasks) - QUOTA, results
    assert sum(r == "alice-two-replicas" for r in results) == QUOTA, results


async def test_overshoot_under_churn_is_zero(namespace: str) -> None:
    # 20 clients of one subject, 10 on each replica, each sending short executes back to back: the
    # most executes inside at any moment is the measured overshoot's base.
    gate = Gate(pause=0.2)
    quota = 3
    bob = authz.Subject("bob-churn")
    one_store, two_store = store(), store()
    async with (
        replica(gate, one_store, slots=4, subject_quota=quota) as one,
        replica(gate, two_store, slots=4, subject_quota=quota) as two,
    ):

        async def client(server: codemode.Server) -> tuple[int, int]:
            ran = refused = 0
            while ran < 2:  # each client gets two executes through, retrying when refused
                try:
                    await server.execute(HOLD, subject=bob)
                    ran += 1
                except codemode.ResourceLimit as exc:
                    assert exc.kind == "quota", exc
                    refused += 1
                    await asyncio.sleep(0.05)
            return ran, refused

        counts = await asyncio.gather(*(client(s) for s in (one, two) for _ in range(10)))
    ran = sum(c[0] for c in counts)
    writes = one_store.writes + two_store.writes
    print(
        f"\nchurn: quota {quota}, most at once {gate.most} (overshoot {gate.most - quota}), {ran} ran, "
        f"{sum(c[1] for c in counts)} refused, {writes / max(1, ran):.2f} API writes per execute"
    )
    assert ran > 0
    assert gate.most <= quota, f"overshoot: {gate.most} of one subject at once with a quota of {quota}"


async def test_fair_share_counts_a_subjects_executes_on_the_other_replica(namespace: str) -> None:
    # Replica two: 4 slots, 2 of them reserved for subjects with nothing in flight. bob holds the 2
    # others. alice already runs one execute on replica one: on replica two she is no newcomer, so
    # the reserve is not hers (per replica, she took it and left carol one slot fewer).
    gate = Gate()
    alice, bob, carol = (authz.Subject(f"{n}-fair") for n in ("alice", "bob", "carol"))
    async with (
        replica(gate, store(), subject_quota=2) as one,
        replica(gate, store(), slots=4, reserved_slots=2, subject_quota=2) as two,
    ):
        first = asyncio.ensure_future(one.execute(HOLD, subject=alice))
        bobs = [asyncio.ensure_future(two.execute(HOLD, subject=bob)) for _ in range(2)]
        await until(lambda: gate.inside[alice.id] == 1 and gate.inside[bob.id] == 2, "alice 1, bob 2 inside")
        second = asyncio.ensure_future(two.execute(HOLD, subject=alice))
        slots = two._executor.slots  # the admission state is what is observed
        await until(lambda: slots.waiting == 1, "alice's second execute waits for a slot")
        third = asyncio.ensure_future(two.execute(HOLD, subject=carol))
        await until(lambda: gate.inside[carol.id] == 1, "carol, a newcomer, starts at once")
        assert gate.inside[alice.id] == 1 and slots.waiting == 1
        gate.opened.set()
        results = await asyncio.gather(first, *bobs, second, third)
    assert sorted(results) == sorted([alice.id, bob.id, bob.id, alice.id, carol.id])


HOLDER = """
import asyncio, sys
import codemode

async def main():
    store = codemode.KubernetesQuota(sys.argv[1], kubeconfig=sys.argv[2], lease_seconds=3)
    holds = [await store.acquire("dave-dies", 2) for _ in range(2)]
    assert all(holds), holds
    print("held", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_killed_replicas_holds_expire(namespace: str, tmp_path: Path) -> None:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen(
        [sys.executable, str(script), NS, KUBECONFIG],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    other = store(lease_seconds=3)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        # Alive, it renews: its holds outlast their lease.
        await asyncio.sleep(7)
        assert await other.acquire("dave-dies", 2) is None
        os.killpg(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait()
        hold = None
        while hold is None and time.monotonic() - killed < 30:
            await asyncio.sleep(0.25)
            hold = await other.acquire("dave-dies", 2)
        waited = time.monotonic() - killed
        print(
            f"\nthe killed replica's holds expired; a slot was free {waited:.1f} s after the kill (lease 3 s)"
        )
        assert hold is not None, "a dead replica's holds never expired"
        other.release(hold)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        await other.aclose()


class Proxy:
    """A TCP relay in front of the API server: stopping it is the store going down."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server: asyncio.Server | None = None
        self.port = 0
        self.links: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._link, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is None:
            return
        self.server.close()
        for w in list(self.links):
            w.transport.abort()
        await self.server.wait_closed()
        self.server = None

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.links |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.links -= {writer, up_writer}


def kubeconfig_through(proxy: Proxy, tmp_path: Path) -> Path:
    config = yaml.safe_load(Path(KUBECONFIG).read_text())
    server = config["clusters"][0]["cluster"]["server"]
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path = tmp_path / "through-proxy.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert server.startswith("https://127.0.0.1:")
    return path


async def test_store_down_fails_closed_with_internal_failure(
    namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = yaml.safe_load(Path(KUBECONFIG).read_text())
    host, port = config["clusters"][0]["cluster"]["server"].removeprefix("https://").rsplit(":", 1)
    proxy = Proxy((host, int(port)))
    await proxy.start()
    gate = Gate(pause=0.0)
    erin = authz.Subject("erin-store-down")
    shared = store(kubeconfig=kubeconfig_through(proxy, tmp_path), timeout=2.0)
    caplog.set_level(logging.WARNING, logger="codemode.execute")
    try:
        async with replica(gate, shared, subject_quota=QUOTA) as server:
            assert await server.execute(HOLD, subject=erin) == erin.id
            await proxy.stop()
            for _ in range(2):  # each execute fails closed; the log says it once per outage
                started = time.monotonic()
                with pytest.raises(codemode.Internal) as info:
                    await server.execute(HOLD, subject=erin)
                assert str(info.value) == "internal failure"
                assert time.monotonic() - started < 30
            down = [r.getMessage() for r in caplog.records if "quota store" in r.getMessage()]
            assert len(down) == 1, down
            assert "--quota-store / CODEMODE_QUOTA_STORE" in down[0] and "fail closed" in down[0], down
            assert "erin" not in down[0]
            await proxy.start()  # the same port: the store is back
            assert await server.execute(HOLD, subject=erin) == erin.id
    finally:
        await proxy.stop()  # its listener and the links still open (closed, not left to the collector)
    assert any("answers again" in r.getMessage() for r in caplog.records)
