"""Two replicas under a load of official MCP clients (20; 12 for the rolling update), through the
Service as kube-proxy routes it (:class:`ServiceProxy`: each new connection to a ready endpoint of
the Service, from a real watch of its EndpointSlices).

The load is the load benchmark's client (``tests/benchmarks/bench_service_load.client_loop``): 20
official MCP clients, one subject each, each execute a ``records.create`` of a nonce whose result
must come back to that client. An execute is **lost** when its call raised (a transport error:
refused, reset, closed before the answer) or returned an error result (a server error); no call is
retried (the HTTP client reopens a kept-alive connection the server had closed only if it notices
before it sends).

- a rolling update (``kubectl rollout restart``) during the load loses no execute: the old replica
  stops saying ready at SIGTERM, closes each connection after its response and still serves for
  ``drain_delay`` (while its endpoint is removed), finishes what is in flight, deletes its workers;
- a replica whose process is SIGKILLed costs only the executes in flight on it, and the other
  replica's orphan sweep deletes their worker pods.

Both work on one node too (the two replicas then share it); the e2e overlay's Deployment (one
replica) is scaled to two for the test and back after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from codemode.runtimes.kubernetes import KubernetesOptions, KubernetesRuntime
from tests.support.cluster import KUBECONFIG, SERVICE_NS, WORKERS, core_api, kubectl, worker_pods

from ..benchmarks.bench_service_load import Outcome, client_loop
from .service_proxy import PodStops, ServiceProxy

pytestmark = pytest.mark.kubernetes

CLIENTS = 20
#: The rolling update's load. A closed loop of clients waits clients / throughput on average (Little's
#: law): 20 clients over the 8 slots of two replicas starting a pod per execute made 1.5 executes/s
#: on the 2-core test machine during a rollout (194 executes in 124 s), a 13 s mean wait, and one
#: execute then reached the overlay's 30 s deadline queued for a slot (`concurrency`). What the test
#: is about is what the rollout itself loses (connections, drain, in-flight executes), not the
#: machine's capacity: 12 clients wait about 8 s.
ROLLING_CLIENTS = 12
#: One records.create per execute; the title comes back (the records pack of the e2e overlay).
PROGRAM = "def main():\n    return {'nonce': records.create(title=%r)['title']}\n"
HOST_SELECTOR = "app.kubernetes.io/name=codemode"


def expect(nonce: str, subject: str) -> object:
    return {"nonce": nonce}


def token(i: int) -> str:
    """The load client ``i``'s token (its sha256 is in overlay/kustomization.yaml)."""
    return f"codemode-e2e-load-{i:02d}"


def rollout_status() -> None:
    kubectl("rollout", "status", "-n", SERVICE_NS, "deployment/codemode", "--timeout=240s", timeout=260)


@pytest.fixture
def two_replicas(deployed: None) -> Iterator[None]:
    """The Deployment at two replicas (as k8s/ ships it); its earlier count again after."""
    spec = json.loads(kubectl("get", "deployment", "codemode", "-n", SERVICE_NS, "-o", "json"))["spec"]
    try:
        kubectl("scale", "-n", SERVICE_NS, "deployment/codemode", "--replicas=2")
        rollout_status()
        yield
    finally:
        kubectl("scale", "-n", SERVICE_NS, "deployment/codemode", f"--replicas={spec['replicas']}")
        rollout_status()


@dataclass
class Load:
    """The load clients' outcome so far."""

    outcome: Outcome = field(default_factory=lambda: Outcome(latencies=[], errors=Counter(), seen=set()))
    lost: list[str] = field(default_factory=list)
    jobs: asyncio.Queue[str] = field(default_factory=asyncio.Queue)

    @property
    def total(self) -> int:
        return self.outcome.ok + self.outcome.mixed + len(self.lost)


async def run_load(url: str, load: Load, clients: int = CLIENTS) -> None:
    for i in range(100_000):
        load.jobs.put_nowait(f"n-{i:06d}")
    await asyncio.gather(
        *(
            client_loop(
                url + "/mcp",
                f"e2e-load-{i:02d}",
                token(i),
                load.jobs,
                load.outcome,
                load.lost,
                "execute",
                program=PROGRAM,
                expect=expect,
            )
            for i in range(clients)
        )
    )


@contextlib.asynccontextmanager
async def under_load(proxy: ServiceProxy, clients: int = CLIENTS) -> AsyncIterator[Load]:
    """The load of ``clients`` runs through ``proxy`` while the body runs; it stops (no new execute;
    the ones in flight finish) when the body ends."""
    load = Load()
    task = asyncio.create_task(run_load(proxy.url, load, clients))
    try:
        yield load
    finally:
        while not load.jobs.empty():
            load.jobs.get_nowait()
        async with asyncio.timeout(180):
            await task


async def until(what: str, check: object, timeout: float = 120) -> float:
    t0 = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return time.monotonic() - t0


def live_host_pods() -> list[str]:
    pods = core_api().list_namespaced_pod(SERVICE_NS, label_selector=HOST_SELECTOR).items
    return sorted(p.metadata.name for p in pods if p.metadata.deletion_timestamp is None)


def workers_of(pods: set[str]) -> list[str]:
    """Worker pods (not yet deleting) created by the host pods ``pods``."""
    return [
        w.metadata.name
        for w in worker_pods()
        if (w.metadata.annotations or {}).get("io.codemode.owner-pod", "").partition("/")[2] in pods
        and w.metadata.deletion_timestamp is None
    ]


async def test_a_rolling_update_under_load_loses_no_execute(two_replicas: None) -> None:
    proxy, stops = ServiceProxy(), PodStops()
    stops.start()
    await proxy.start()
    try:
        old = set(live_host_pods())
        assert len(old) == 2
        await until("both replicas in the Service", lambda: proxy.ready_pods() == old)
        async with under_load(proxy, ROLLING_CLIENTS) as load:
            await until("the load running", lambda: load.outcome.ok >= ROLLING_CLIENTS, timeout=180)
            started = time.monotonic()
            kubectl("rollout", "restart", "-n", SERVICE_NS, "deployment/codemode")
            await asyncio.to_thread(rollout_status)
            await until("the old pods gone", lambda: not (old & set(live_host_pods())), timeout=120)
            rolled = time.monotonic() - started
            before_end = load.total
            await asyncio.sleep(3)  # executes on the new replicas only
        new = set(live_host_pods())
        # The endpoint controller's part (seen by the watch), and with the modelled kube-proxy sync.
        controller = {p: proxy.seen_removed_at[p] - stops.deleting_at[p] for p in old}
        propagation = {p: proxy.removed_at[p] - stops.deleting_at[p] for p in old}
        print(
            f"\nrolling update: {load.total} executes ({load.total - before_end} after the rollout), "
            f"ok {load.outcome.ok}, lost {len(load.lost)} {dict(load.outcome.errors or {})}, "
            f"mixed {load.outcome.mixed}; rollout {rolled:.1f} s; pod deleting -> not a ready endpoint "
            f"{', '.join(f'{v * 1e3:.0f} ms' for v in controller.values())} (EndpointSlice), "
            f"{', '.join(f'{v * 1e3:.0f} ms' for v in propagation.values())} (with the proxy's "
            f"{proxy.lag:g} s sync); refused connects {dict(proxy.refused)}; "
            f"connections {dict(proxy.connections)}"
        )
        assert not load.lost, (len(load.lost), load.outcome.errors)
        assert load.outcome.mixed == 0
        assert load.outcome.ok > ROLLING_CLIENTS
        # No connection met a closed port: each old replica still listened until its endpoint was gone.
        assert not proxy.refused, dict(proxy.refused)
        assert new.isdisjoint(old) and len(new) == 2
        # The new replicas took over the load (the Service follows the update; which of them got
        # the reconnecting clients is the proxy's choice: clients keep their connections, so the
        # replica that became ready last may get none), and the old ones left no worker.
        assert sum(proxy.connections[p] for p in new) > 0, dict(proxy.connections)
        await until("no worker of the old replicas", lambda: not workers_of(old), timeout=60)
    finally:
        await proxy.aclose()
        stops.stop()


def main_process(pod: str) -> int:
    """The host pid of ``pod``'s container's main process (pid 1 in the container's pid namespace):
    every node of this cluster runs on this machine, so its processes are ours to find."""
    status = core_api().read_namespaced_pod(pod, SERVICE_NS).status
    (container,) = status.container_statuses
    cid = container.container_id.partition("://")[2]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if cid not in (entry / "cgroup").read_text():
                continue
            nspid = next(x for x in (entry / "status").read_text().splitlines() if x.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if nspid.split()[-1] == "1":
            return int(entry.name)
    raise AssertionError(f"no main process found for {pod}'s container {cid}")


#: Run in the service container: its ``codemode_active_executes`` (the metrics port is loopback there).
ACTIVE = (
    "import urllib.request; t = urllib.request.urlopen('http://127.0.0.1:9090/metrics', timeout=5)"
    ".read().decode(); print([x for x in t.splitlines() if x.startswith('codemode_active_executes ')][0])"
)


async def active_executes(pod: str) -> float:
    """The executes running in ``pod`` now (its ``codemode_active_executes``)."""
    out = await asyncio.to_thread(kubectl, "exec", "-n", SERVICE_NS, pod, "--", "python3", "-c", ACTIVE)
    return float(out.split()[-1])


def restarts(pod: str) -> int:
    (container,) = core_api().read_namespaced_pod(pod, SERVICE_NS).status.container_statuses
    return int(container.restart_count)


async def test_a_sigkilled_replica_costs_only_its_in_flight_executes(two_replicas: None) -> None:
    proxy = ServiceProxy()
    await proxy.start()
    try:
        victim, other = live_host_pods()
        await until("both replicas in the Service", lambda: proxy.ready_pods() == {victim, other})
        restarted = restarts(victim)
        async with under_load(proxy) as load:
            await until("the load running", lambda: load.outcome.ok >= CLIENTS, timeout=180)
            await until("executes in flight on the victim", lambda: workers_of({victim}), timeout=60)
            pid = main_process(victim)
            active = await active_executes(victim)
            lost_before = len(load.lost)
            in_flight = proxy.open[victim]  # each connection carries at most one request at a time
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            # Its worker pods now: nobody but the orphan rule deletes them any more.
            orphans = {
                w.metadata.name: w.metadata for w in worker_pods() if w.metadata.name in workers_of({victim})
            }
            assert orphans, "no worker pod of the victim's in-flight executes"
            await until(
                "the orphaned worker pods deleted",
                lambda: (
                    not (
                        set(orphans)
                        & {w.metadata.name for w in worker_pods() if w.metadata.deletion_timestamp is None}
                    )
                ),
                timeout=120,
            )
            cleaned = time.monotonic() - killed
            await until("the victim's container restarted", lambda: restarts(victim) > restarted, timeout=120)
            await until("the victim back in the Service", lambda: victim in proxy.ready_pods(), timeout=180)
            await asyncio.sleep(5)  # both replicas serving again
        # Who deleted them: the other replica's sweep, or the victim's restarted container at start.
        other_log = kubectl("logs", "-n", SERVICE_NS, other)
        victim_log = kubectl("logs", "-n", SERVICE_NS, victim)
        by_other = [n for n in orphans if f"orphaned worker pod {n}" in other_log]
        by_victim = [n for n in orphans if f"orphaned worker pod {n}" in victim_log]
        print(
            f"\nSIGKILL: {load.total} executes, ok {load.outcome.ok}, lost {len(load.lost)} "
            f"(the victim at the kill had {in_flight} open connections, "
            f"{active:.0f} executes running, "
            f"{len(orphans)} worker pods) {dict(load.outcome.errors or {})}; orphans "
            f"deleted {cleaned:.1f} s after the kill (by the other replica: {len(by_other)}, by the "
            f"restarted container: {len(by_victim)}); refused connects {dict(proxy.refused)}"
        )
        assert lost_before == 0
        # Only what was in flight on the victim (each of its open connections carried at most one
        # request; an idle one counts too), and only transport errors: no server error anywhere.
        assert 1 <= len(load.lost) <= in_flight, (len(load.lost), in_flight, load.outcome.errors)
        assert all(k.startswith("client: ") for k in load.outcome.errors or {}), load.outcome.errors
        assert load.outcome.mixed == 0
        assert set(by_other) | set(by_victim) == set(orphans), (by_other, by_victim)
        # The rule itself, judged now by a host that is neither replica: the victim's old process is
        # dead (its container restarted after that process started), the other replica is alive.
        judge = KubernetesRuntime(KubernetesOptions(kubeconfig=KUBECONFIG, namespace=WORKERS))
        try:
            for meta in orphans.values():
                assert judge._is_orphan(meta.labels, meta.annotations, {}, proven_only=True)
            for w in worker_pods():
                if (w.metadata.annotations or {}).get("io.codemode.owner-pod", "").endswith("/" + other):
                    assert not judge._is_orphan(
                        w.metadata.labels, w.metadata.annotations, {}, proven_only=True
                    )
        finally:
            await judge.aclose()
    finally:
        await proxy.aclose()
