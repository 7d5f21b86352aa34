"""The ``codemode`` Service as the load tests reach it from the host.

The project's cluster runs no kube-proxy (docs/kubernetes.md, "The local cluster"), so a ClusterIP
or NodePort carries nothing here. :class:`ServiceProxy` does, on a loopback port, what kube-proxy
does on every node: it follows the Service's EndpointSlices (a real watch) and sends each **new**
TCP connection to one of the endpoints that are ``ready`` at that moment (round robin); a
connection, once made, stays with its pod until one side closes it (kube-proxy's conntrack).
The host reaches the service pods' addresses directly (the local CNI routes them). Nothing else
of kube-proxy (session affinity, the terminating-endpoint fallback) is used by the tests.

kube-proxy also takes a while to apply an endpoint change on its node (its iptables or nftables
sync: ``--*-min-sync-period``, 1 s by default, longer on a busy node), and that delay is what a
replica's ``drain_delay`` must cover. Here the watch sees a change within a few milliseconds, so
the proxy applies each change ``lag`` seconds after it sees it (2 s by default), as a node's
kube-proxy would.

One difference: kube-proxy's DNAT lets a dead endpoint refuse the client's SYN (the client may
safely connect again: nothing was sent), but this proxy has accepted the connection already. So
when an endpoint refuses, the proxy tries the next ready one (standing in for that reconnect) and
counts the refusal in ``refused``: a test that must show no connection reached a closed port
asserts that it stays empty.

:class:`PodStops` records when each host pod is first seen terminating, so a test can measure the
endpoint propagation: from the pod's deletion to its removal from the ready endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import Counter
from typing import Any

from tests.support.cluster import SERVICE_NS, configuration

__all__ = ["PodStops", "ServiceProxy"]

#: One EndpointSlice: its ready (address, pod name) pairs and the port.
_Slice = tuple[list[tuple[str, str]], int | None]


class _Watch:
    """A list+watch of one kind in a thread, restarted when the API server ends it."""

    def __init__(self, list_fn: Any, selector: str, on_event: Any) -> None:
        from kubernetes import watch

        self._watch = watch.Watch()
        self._list = list_fn
        self._selector = selector
        self._on_event = on_event
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.synced = threading.Event()

    def start(self) -> None:
        self._thread.start()
        assert self.synced.wait(30), "the watch did not start"

    def _run(self) -> None:
        while not self._stopped.is_set():
            with contextlib.suppress(Exception):
                initial = self._list(SERVICE_NS, label_selector=self._selector)
                for item in initial.items:
                    self._on_event("ADDED", item)
                self.synced.set()
                for event in self._watch.stream(
                    self._list,
                    SERVICE_NS,
                    label_selector=self._selector,
                    resource_version=initial.metadata.resource_version,
                    timeout_seconds=60,
                ):
                    self._on_event(event["type"], event["object"])
                    if self._stopped.is_set():
                        return
            time.sleep(0.2)

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()


class ServiceProxy:
    """kube-proxy for one Service, on 127.0.0.1 (see the module text).

    Args:
        service: the Service's name (namespace ``codemode``).
        port_name: the Service port whose endpoints' port the connections go to.
        lag: seconds between seeing an EndpointSlice change and routing by it.
    """

    def __init__(self, service: str = "codemode", port_name: str = "http", lag: float = 2.0) -> None:
        from kubernetes import client

        self.service = service
        self.lag = lag
        #: Pod name -> monotonic time the watch saw it leave the ready endpoints (before ``lag``).
        self.seen_removed_at: dict[str, float] = {}
        self.port_name = port_name
        self._discovery = client.DiscoveryV1Api(client.ApiClient(configuration()))
        self._lock = threading.Lock()
        self._slices: dict[str, _Slice] = {}
        self._seen: dict[str, _Slice] = {}
        #: Ready address -> pod name, now.
        self.ready: dict[str, str] = {}
        #: Pod name -> monotonic time it left the ready endpoints.
        self.removed_at: dict[str, float] = {}
        #: Pod name -> new connections sent to it.
        self.connections: Counter[str] = Counter()
        #: Pod name -> connections it refused (its port closed while it was a ready endpoint).
        self.refused: Counter[str] = Counter()
        #: Pod name -> connections to it open now.
        self.open: Counter[str] = Counter()
        self._rr = itertools.count()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self._watch = _Watch(
            self._discovery.list_namespaced_endpoint_slice,
            f"kubernetes.io/service-name={service}",
            self._on_slice,
        )

    # -- endpoints -------------------------------------------------------------------------------

    def _on_slice(self, kind: str, obj: Any) -> None:
        now = time.monotonic()
        with self._lock:
            before = {pod for ready, _ in self._seen.values() for _, pod in ready}
            self._update(self._seen, kind, obj)
            after = {pod for ready, _ in self._seen.values() for _, pod in ready}
            for pod in before - after:
                self.seen_removed_at.setdefault(pod, now)
        if self.lag > 0:
            timer = threading.Timer(self.lag, self._apply, (kind, obj))
            timer.daemon = True
            timer.start()
        else:
            self._apply(kind, obj)

    def _update(self, slices: dict[str, _Slice], kind: str, obj: Any) -> None:
        name = obj.metadata.name
        if kind == "DELETED":
            slices.pop(name, None)
        else:
            port = next((p.port for p in obj.ports or [] if p.name == self.port_name), None)
            ready = [
                (address, (e.target_ref.name if e.target_ref else address))
                for e in obj.endpoints or []
                if e.conditions is not None and e.conditions.ready
                for address in e.addresses
            ]
            slices[name] = (ready, port)

    def _apply(self, kind: str, obj: Any) -> None:
        with self._lock:
            self._update(self._slices, kind, obj)
            now = {a: pod for ready, _ in self._slices.values() for a, pod in ready}
            for pod in set(self.ready.values()) - set(now.values()):
                self.removed_at.setdefault(pod, time.monotonic())
            self.ready = now

    def _pick(self, tried: set[str]) -> tuple[str, int, str] | None:
        with self._lock:
            ports = [p for _, p in self._slices.values() if p is not None]
            ready = sorted((a, pod) for a, pod in self.ready.items() if pod not in tried)
            if not ready or not ports:
                return None
            address, pod = ready[next(self._rr) % len(ready)]
            return address, ports[0], pod

    async def _connect(self) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter] | None:
        tried: set[str] = set()
        while (target := self._pick(tried)) is not None:
            address, port, pod = target
            tried.add(pod)
            try:
                up_reader, up_writer = await asyncio.open_connection(address, port)
            except OSError:
                self.refused[pod] += 1
                continue
            self.connections[pod] += 1
            return pod, up_reader, up_writer
        return None  # no ready endpoint (left): kube-proxy rejects the connection

    def ready_pods(self) -> set[str]:
        with self._lock:
            return set(self.ready.values())

    # -- the proxy -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._watch.start()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            upstream = await self._connect()
            if upstream is None:
                return
            pod, up_reader, up_writer = upstream
            self._writers.add(up_writer)
            self.open[pod] += 1
            try:
                await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
            finally:
                self.open[pod] -= 1
                up_writer.close()
                self._writers.discard(up_writer)
        finally:
            writer.close()
            self._writers.discard(writer)
            self._tasks.discard(task)

    async def aclose(self) -> None:
        self._watch.stop()
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):  # every pump ends at its stream's close
            writer.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close ``dst``; a reset ends the copy."""
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()


class PodStops:
    """When each host pod (``app.kubernetes.io/name=codemode``) was first seen terminating, and its
    node; from a real watch of the pods."""

    def __init__(self) -> None:
        from tests.support.cluster import core_api

        self._lock = threading.Lock()
        #: Pod name -> monotonic time its deletionTimestamp was first seen.
        self.deleting_at: dict[str, float] = {}
        #: Pod name -> (uid, node) of every host pod seen.
        self.pods: dict[str, tuple[str, str | None]] = {}
        self._watch = _Watch(core_api().list_namespaced_pod, "app.kubernetes.io/name=codemode", self._on_pod)

    def _on_pod(self, kind: str, pod: Any) -> None:
        with self._lock:
            self.pods[pod.metadata.name] = (pod.metadata.uid, pod.spec.node_name)
            if pod.metadata.deletion_timestamp is not None or kind == "DELETED":
                self.deleting_at.setdefault(pod.metadata.name, time.monotonic())

    def start(self) -> None:
        self._watch.start()

    def stop(self) -> None:
        self._watch.stop()
