"""The shared quota store under contention, against an in-memory stand-in for the Kubernetes Lease
API (the store is the real :class:`codemode.KubernetesQuota`; only the API server is replaced, with
its create/replace/delete conflict rules: 409 on a taken name or a stale resourceVersion, 404 on a
missing Lease). Each test is an attack from the hostile review of the store:

- a tenant whose subjects sit at their quota and re-send as fast as they are refused cannot make
  another subject's acquire wait past ``timeout`` (it was refused only after a Lease list each, on
  the store's 16 threads, so the refusals queued ahead of everyone);
- a connected replica holding many Leases on a slow API renews every one before it expires (the
  renewals ran one after another);
- an acquire cancelled while its create is on the wire leaves no live Lease behind;
- expired slot Leases seen during a list are deleted (they were never removed).
The store against the real cluster: tests/e2e_kubernetes/test_shared_quota.py."""

from __future__ import annotations

import asyncio
import copy
import datetime
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiException

import codemode
from codemode.execution.quota import QuotaUnavailable
from codemode.execution.quota_kubernetes import lease_name


class LeaseAPI:
    """The Lease calls the store makes, kept in memory, each taking ``latency`` seconds (per
    method name) of a worker thread like a slow but answering API server."""

    def __init__(self, **latency: float) -> None:
        self.latency = latency
        self.leases: dict[str, Any] = {}
        self.version = 0
        self.lock = threading.Lock()
        self.written: dict[str, list[float]] = {}
        self.calls: dict[str, int] = {}
        self.api_client = SimpleNamespace(close=lambda: None)

    def _wait(self, method: str) -> None:
        with self.lock:
            self.calls[method] = self.calls.get(method, 0) + 1
        time.sleep(self.latency.get(method, 0.0))

    def _stamp(self, body: Any) -> Any:
        self.version += 1
        body = copy.deepcopy(body)
        body.metadata.resource_version = str(self.version)
        self.leases[body.metadata.name] = body
        self.written.setdefault(body.metadata.name, []).append(time.monotonic())
        return copy.deepcopy(body)

    def list_namespaced_lease(self, namespace: str, label_selector: str, **_: Any) -> Any:
        self._wait("list")
        digest = label_selector.partition("=")[2]
        with self.lock:
            items = [
                copy.deepcopy(v)
                for v in self.leases.values()
                if v.metadata.labels.get("codemode.io/quota-subject") == digest
            ]
        return SimpleNamespace(items=items)

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Any:
        self._wait("read")
        with self.lock:
            if name not in self.leases:
                raise ApiException(status=404, reason="Not Found")
            return copy.deepcopy(self.leases[name])

    def create_namespaced_lease(self, namespace: str, body: Any, **_: Any) -> Any:
        self._wait("create")
        with self.lock:
            if body.metadata.name in self.leases:
                raise ApiException(status=409, reason="Conflict")
            return self._stamp(body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any, **_: Any) -> Any:
        self._wait("replace")
        with self.lock:
            current = self.leases.get(name)
            if current is None:
                raise ApiException(status=404, reason="Not Found")
            if body.metadata.resource_version != current.metadata.resource_version:
                raise ApiException(status=409, reason="Conflict")
            return self._stamp(body)

    def delete_namespaced_lease(self, name: str, namespace: str, body: Any = None, **_: Any) -> Any:
        self._wait("delete")
        with self.lock:
            current = self.leases.get(name)
            if current is None:
                raise ApiException(status=404, reason="Not Found")
            version = getattr(getattr(body, "preconditions", None), "resource_version", None)
            if version is not None and version != current.metadata.resource_version:
                raise ApiException(status=409, reason="Conflict")
            del self.leases[name]


async def admits_a_victim(
    store: codemode.KubernetesQuota, flood: list[asyncio.Task[None]], holds: list[codemode.Hold]
) -> None:
    """A subject with nothing in flight is admitted while ``flood`` runs; then all is stopped."""
    try:
        victim = await store.acquire("victim", 2)
        assert victim is not None
        store.release(victim)
    except QuotaUnavailable as exc:
        pytest.fail(f"a victim with no execute in flight failed closed: {exc}")
    finally:
        for t in flood:
            t.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
        for hold in holds:
            store.release(hold)
        await store.aclose()


async def test_a_tenant_at_its_quota_cannot_make_another_fail_closed() -> None:
    api = LeaseAPI(list=0.1)
    store = codemode.KubernetesQuota("ns", lease_seconds=30, timeout=5.0, api=api)
    attackers = [f"attacker-{i}" for i in range(16)]
    held = [await store.acquire(s, 1) for s in attackers]  # each at its quota of 1
    assert all(h is not None for h in held)

    async def hammer(subject: str) -> None:
        while True:  # refused at quota, re-sent at once (64 open requests per subject)
            assert await store.acquire(subject, 1) is None
            await asyncio.sleep(0.05)  # the refusal's round trip to the client and back

    # Before the fix each refusal cost a list: ~1000 queued lists of 0.1 s on 16 threads, more
    # than the 5 s timeout ahead of the victim.
    flood = [asyncio.create_task(hammer(s)) for s in attackers for _ in range(64)]
    await asyncio.sleep(0.5)
    await admits_a_victim(store, flood, [h for h in held if h is not None])


async def test_a_subject_flooding_new_acquires_cannot_occupy_the_store_threads() -> None:
    # Not at its quota (1000, so no refusal from this replica's holds): one subject's 500 open
    # requests, each re-sent as soon as it ends, reach the API one at a time, not 16 at a time.
    api = LeaseAPI(list=0.1)
    store = codemode.KubernetesQuota("ns", lease_seconds=30, timeout=2.0, api=api)
    taken: list[codemode.Hold] = []

    async def resend() -> None:
        while True:
            try:
                hold = await store.acquire("attacker", 1000)
            except QuotaUnavailable:
                continue  # its own requests queue behind each other: that is its own business
            if hold is not None:
                taken.append(hold)

    flood = [asyncio.create_task(resend()) for _ in range(500)]
    await asyncio.sleep(2.5)  # past the first timeouts: the flood is re-sending
    await admits_a_victim(store, flood, taken)


async def test_concurrent_acquires_of_one_subject_never_exceed_its_quota() -> None:
    api = LeaseAPI(list=0.01, create=0.01)
    store = codemode.KubernetesQuota("ns", lease_seconds=30, timeout=5.0, api=api)
    results = await asyncio.gather(*(store.acquire("alice", 3) for _ in range(12)))
    holds = [h for h in results if h is not None]
    try:
        assert len(holds) == 3 and len(api.leases) == 3
        assert await store.acquire("alice", 3) is None  # refused from this replica's own holds
    finally:
        for h in holds:
            store.release(h)
        await store.aclose()


async def test_a_connected_replica_keeps_every_held_lease_renewed_within_its_lease() -> None:
    api = LeaseAPI(replace=0.3)
    store = codemode.KubernetesQuota("ns", lease_seconds=3, timeout=2.0, api=api)
    holds = [await store.acquire(f"subject-{i}", 1) for i in range(10)]
    assert all(h is not None for h in holds)
    await asyncio.sleep(3 + 10 * 0.3 + 0.5)  # one full round one after another
    try:
        gaps = {name: times[1] - times[0] for name, times in api.written.items() if len(times) > 1}
        missing = [name for name, times in api.written.items() if len(times) < 2]
        # Every Lease renewed before it expired (3 s after it was written).
        assert not missing and max(gaps.values()) < 3, (missing, sorted(gaps.values()))
    finally:
        for h in holds:
            assert h is not None
            store.release(h)
        await store.aclose()


async def test_a_slow_renewal_round_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    api = LeaseAPI(replace=1.2)  # more than a third of the 3 s lease
    store = codemode.KubernetesQuota("ns", lease_seconds=3, timeout=2.0, api=api)
    hold = await store.acquire("alice", 1)
    assert hold is not None
    with caplog.at_level("WARNING", logger="codemode.quota"):
        await asyncio.sleep(1 + 1.2 + 0.5)
    try:
        assert any("renewal round" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        store.release(hold)
        await store.aclose()


async def test_a_cancelled_acquire_leaves_no_slot_held() -> None:
    api = LeaseAPI(create=0.5)
    store = codemode.KubernetesQuota("ns", lease_seconds=15, timeout=2.0, api=api)
    call = asyncio.create_task(store.acquire("alice", 1))
    await asyncio.sleep(0.2)  # the create is on the wire
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    await asyncio.sleep(1.0)  # the create lands; the store has had time to give it back
    try:
        assert not api.leases, "a Lease nobody holds is left behind"
        assert await store.acquire("alice", 1) is not None, "alice is locked out by a Lease nobody holds"
    finally:
        await store.aclose()


async def test_an_acquire_timing_out_during_its_create_leaves_no_slot_held() -> None:
    api = LeaseAPI(create=1.5)
    store = codemode.KubernetesQuota("ns", lease_seconds=15, timeout=1.0, api=api)
    with pytest.raises(QuotaUnavailable):
        await store.acquire("alice", 1)
    await asyncio.sleep(1.5)  # the create lands after the acquire gave up
    try:
        assert not api.leases, "a Lease nobody holds is left behind"
    finally:
        await store.aclose()


async def test_expired_slot_leases_seen_in_a_list_are_deleted() -> None:
    api = LeaseAPI()
    store = codemode.KubernetesQuota("ns", lease_seconds=3, timeout=2.0, api=api)
    hold = await store.acquire("alice", 4)
    assert hold is not None
    # Three Leases of alice's whose replica died long ago, one at a slot above today's quota.
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    with api.lock:
        template = api.leases[str(hold.key)]
        others = [i for i in range(4) if lease_name("alice", i) != hold.key]
        for index in (*others[:2], 7):
            dead = copy.deepcopy(template)
            dead.metadata.name = lease_name("alice", index)
            dead.spec.holder_identity = "gone-replica/1"
            dead.spec.renew_time = long_ago
            api._stamp(dead)
    other = await store.acquire("alice", 4)
    assert other is not None
    for _ in range(100):  # the deletes run in the background
        if len(api.leases) <= 2:
            break
        await asyncio.sleep(0.02)
    try:
        # alice's two live holds stay (the second may have taken over a dead one); the dead are gone.
        assert set(api.leases) == {str(hold.key), str(other.key)}
    finally:
        store.release(hold)
        store.release(other)
        await store.aclose()
