"""The per-subject quota shared by every replica, kept as Lease objects of the Kubernetes API
(docs/service.md, "Several replicas: a shared quota").

A subject with quota N has N numbered slot Leases, ``codemode-quota-<digest>-<i>`` for i < N (the
digest is a hash of the subject id: no tenant name is written to the cluster). An admitted execute
holds one: it created the Lease (or took over an expired one by a ``replace`` carrying the
``resourceVersion`` it read, a compare-and-swap), and deletes it when it ends. The names bound the
holds: two replicas cannot both create the same name, and a takeover fails if anyone wrote the
Lease since it was read, so at most N are held at once. Writes per execute: a create and a delete,
plus a renewal every ``lease_seconds / 3`` while it runs; a clash with another replica costs one
more list and write.

A replica that dies stops renewing: its Leases expire ``lease_seconds`` after their last renewal
(``renewTime`` + ``leaseDurationSeconds``, judged by the reader's clock: keep the replicas' clocks
within a small part of ``lease_seconds``) and are taken over. The Kubernetes client is blocking: its
calls run on this store's own threads, each bounded by ``timeout``. So that one subject cannot
occupy them, a subject at its quota by this replica's own holds is refused without a call, and a
subject's acquires reach the API one at a time; renewals run a bounded number at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import functools
import hashlib
import logging
import os
import random
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .quota import Hold, QuotaUnavailable

__all__ = ["SUBJECT_LABEL", "KubernetesQuota", "lease_name", "subject_digest"]

log = logging.getLogger("codemode.quota")

SUBJECT_LABEL = "codemode.io/quota-subject"
_MANAGED = {"app.kubernetes.io/managed-by": "codemode", "app.kubernetes.io/component": "quota"}


def subject_digest(subject_id: str) -> str:
    """The subject's name in the cluster: 20 hex digits of its SHA-256 (a valid label value).

    Args:
        subject_id: the subject id.

    Returns:
        The digest.
    """
    return hashlib.sha256(subject_id.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def lease_name(subject_id: str, index: int) -> str:
    """The name of a subject's slot Lease ``index``.

    Args:
        subject_id: the subject id.
        index: the slot, below the quota.

    Returns:
        The Lease name.
    """
    return f"codemode-quota-{subject_digest(subject_id)}-{index}"


#: Of the store's threads, how many the renewer may use at once (the rest stay for acquires).
_RENEWALS_AT_ONCE = 8
#: Expired slot Leases deleted at once (seen in lists; the rest wait for a later list).
_SWEEPS_AT_ONCE = 4
_THREADS = 16


@dataclass(eq=False)
class _Slot:
    """A slot Lease this replica holds: its latest object (its resourceVersion is the next CAS)."""

    lease: Any
    subject_id: str = ""
    released: bool = False


@dataclass(eq=False)
class _Subject:
    """The acquires of one subject in progress here: one at a time reaches the API, so a subject
    occupies one of the store's threads however many executes it sends."""

    lock: asyncio.Lock
    users: int = 0


class _Conflict(Exception):
    """Someone else wrote the Lease first (409) or it is gone (404)."""


class KubernetesQuota:
    """The quota counted in Lease objects of one namespace, shared by every replica that uses it.

    Args:
        namespace: where the Leases live (the service's own namespace, usually).
        kubeconfig: a kubeconfig file (None: in-cluster, else ``$KUBECONFIG`` or
            ``~/.kube/config``).
        context: the kubeconfig context (None: its current one).
        lease_seconds: how long a hold outlives its replica's last renewal (at least 3).
        timeout: seconds an acquire may take in all (each API request is bounded by it too).
        replica: this replica's name in the Leases' holder identity (default: host name, pid and
            a random part).
        api: a ready ``CoordinationV1Api`` (None: made from ``kubeconfig``/``context``).
    """

    name = "kubernetes"

    def __init__(
        self,
        namespace: str,
        *,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        lease_seconds: float = 15.0,
        timeout: float = 2.0,
        replica: str | None = None,
        api: Any = None,
    ) -> None:
        if lease_seconds < 3:
            raise ValueError("lease_seconds must be at least 3")
        if timeout <= 0:
            raise ValueError("timeout must be more than 0")
        self.namespace = namespace
        self.kubeconfig = None if kubeconfig is None else str(kubeconfig)
        self.context = context
        self.lease_seconds = lease_seconds
        self.timeout = timeout
        self.replica = replica or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._api = api
        self._api_lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._held: dict[str, _Slot] = {}  # by Lease name
        self._subjects: dict[str, _Subject] = {}  # acquires in progress, by subject id
        self._sweeping: set[str] = set()  # expired Lease names being deleted
        self._renewer: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        #: Writes sent to the API (creates, replaces, deletes; for the measurements in the docs).
        self.writes = 0

    # -- the store ---------------------------------------------------------------------------------

    async def acquire(self, subject_id: str, quota: int) -> Hold | None:
        """Count one more execute of ``subject_id``, unless it already has ``quota`` in flight.

        Args:
            subject_id: the subject.
            quota: the executes it may have in flight (at least 1).

        Returns:
            The hold, or None: the subject is at its quota.

        Raises:
            QuotaUnavailable: the API did not answer within ``timeout`` (fail closed).
        """
        self._start_renewer()
        if self._mine(subject_id) >= quota:
            return None  # at its quota by this replica's own holds: no API call
        turn = self._subjects.get(subject_id)
        if turn is None:
            turn = self._subjects[subject_id] = _Subject(asyncio.Lock())
        turn.users += 1
        try:
            async with asyncio.timeout(self.timeout):
                async with turn.lock:  # one acquire of a subject at a time reaches the API
                    if self._mine(subject_id) >= quota:
                        return None
                    return await self._acquire(subject_id, quota)
        except TimeoutError:
            if turn.users > 1:
                raise QuotaUnavailable(
                    f"{self._where()}: no answer within {self.timeout} s "
                    f"({turn.users} acquires of this subject queued here, one at a time)"
                ) from None
            raise QuotaUnavailable(f"{self._where()}: no answer within {self.timeout} s") from None
        finally:
            turn.users -= 1
            if not turn.users:
                del self._subjects[subject_id]

    def release(self, hold: Hold) -> None:
        """Give ``hold`` back: its Lease is deleted in the background (should that fail, it expires after
        ``lease_seconds``).

        Args:
            hold: a hold :meth:`acquire` returned, released once.
        """
        slot = self._held.pop(str(hold.key), None)
        if slot is None:
            return
        slot.released = True
        self._background_task(self._delete(slot))

    async def check(self) -> None:
        """Readiness (``/readyz``): the API lists this namespace's Leases within ``timeout``.

        Raises:
            QuotaUnavailable: it does not (unreachable, refused, forbidden, too slow).
        """
        try:
            async with asyncio.timeout(self.timeout):
                await self._call("list_namespaced_lease", limit=1)
        except TimeoutError:
            raise QuotaUnavailable(f"{self._where()}: no answer within {self.timeout} s") from None
        except _Conflict:
            raise QuotaUnavailable(f"{self._where()}: the namespace was not found") from None

    async def open(self) -> None:
        """Start renewing (``Server.attach``'s lifecycle); nothing is checked here: an execute
        that finds the store down fails closed."""
        self._start_renewer()

    async def aclose(self) -> None:
        """Stop renewing, delete the Leases still held (best effort, bounded by ``timeout``)."""
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None
        for name in list(self._held):
            self.release(Hold("", key=name))
        deadline = time.monotonic() + self.timeout
        while self._background and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(set(self._background), timeout=left)  # a landed write adds its delete
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        with self._api_lock:
            api, self._api = self._api, None
        if api is not None:
            api.api_client.close()  # its connections to the API server

    # -- acquiring ---------------------------------------------------------------------------------

    async def _acquire(self, subject_id: str, quota: int) -> Hold | None:
        from kubernetes import client as k8s

        digest = subject_digest(subject_id)
        for _attempt in range(2 * quota + 2):
            listed = await self._call("list_namespaced_lease", label_selector=f"{SUBJECT_LABEL}={digest}")
            leases = listed.items
            now = datetime.datetime.now(datetime.UTC)
            live = {lease.metadata.name: lease for lease in leases if _live(lease, now)}
            if len(live) >= quota:
                return None
            by_name = {lease.metadata.name: lease for lease in leases}
            free = [i for i in range(quota) if lease_name(subject_id, i) not in live]
            name = lease_name(subject_id, random.choice(free))  # spreads contenders over the slots
            self._sweep(
                lease for lease in leases if lease.metadata.name not in live and lease.metadata.name != name
            )
            holder = f"{self.replica}/{secrets.token_hex(4)}"
            expired = by_name.get(name)
            meta = k8s.V1ObjectMeta(name=name, labels={**_MANAGED, SUBJECT_LABEL: digest})
            if expired is not None:
                meta.resource_version = expired.metadata.resource_version  # the compare-and-swap
            body = k8s.V1Lease(
                metadata=meta,
                spec=k8s.V1LeaseSpec(
                    holder_identity=holder,
                    lease_duration_seconds=max(1, round(self.lease_seconds)),
                    renew_time=now,
                ),
            )
            if expired is not None:
                write = self._background_task(self._write("replace_namespaced_lease", body, name=name))
            else:
                write = self._background_task(self._write("create_namespaced_lease", body))
            try:
                # Shielded: a caller cancelled (or timed out) while the write is on the wire must
                # not leave a live Lease no one renews; the write's own callback gives it back.
                lease = await asyncio.shield(write)
            except _Conflict:
                continue  # another execute took this slot first: count again
            except asyncio.CancelledError:
                write.add_done_callback(functools.partial(self._give_back, subject_id))
                raise
            self._held[name] = _Slot(lease, subject_id)
            elsewhere = sum(1 for other in live.values() if not _holder(other).startswith(self.replica + "/"))
            return Hold(subject_id, elsewhere, name)
        log.info("quota: slot Leases of one subject kept changing under us; counted as at its quota")
        return None

    # -- renewing and releasing --------------------------------------------------------------------

    def _mine(self, subject_id: str) -> int:
        """The holds of ``subject_id`` this replica has."""
        return sum(1 for slot in self._held.values() if slot.subject_id == subject_id)

    def _background_task(self, work: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _give_back(self, subject_id: str, write: asyncio.Future[Any]) -> None:
        """The write of an acquire whose caller went away landed: delete the Lease it made."""
        if write.cancelled() or write.exception() is not None:
            return  # nothing written (the exception is retrieved here)
        slot = _Slot(write.result(), subject_id, released=True)
        log.info(
            "quota: acquire cancelled while its Lease was written; deleting %s", slot.lease.metadata.name
        )
        self._background_task(self._delete(slot))

    def _sweep(self, expired: Any) -> None:
        """Delete expired slot Leases seen in a list (each once, only if unchanged since read)."""
        for lease in expired:
            name = lease.metadata.name
            if name in self._sweeping or name in self._held:
                continue
            if len(self._sweeping) >= _SWEEPS_AT_ONCE:
                return  # the rest at a later list: the sweep never crowds out acquires
            self._sweeping.add(name)
            self._background_task(self._delete_expired(name, lease.metadata.resource_version))

    async def _delete_expired(self, name: str, version: str) -> None:
        from kubernetes import client as k8s

        options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(resource_version=version))
        try:
            await self._write("delete_namespaced_lease", name=name, body=options)
        except _Conflict:
            pass  # taken over or deleted meanwhile
        except QuotaUnavailable as exc:
            log.info("quota: deleting expired Lease %s failed (%s); left for a later list", name, exc)
        finally:
            self._sweeping.discard(name)

    def _start_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        period = self.lease_seconds / 3
        at_once = asyncio.Semaphore(_RENEWALS_AT_ONCE)

        async def bounded(name: str, slot: _Slot) -> None:
            async with at_once:
                await self._renew(name, slot)

        spent = 0.0
        while True:
            await asyncio.sleep(max(0.0, period - spent))
            started = time.monotonic()
            held = list(self._held.items())
            await asyncio.gather(*(bounded(name, slot) for name, slot in held))
            spent = time.monotonic() - started
            if spent > period:
                log.warning(
                    "quota: a renewal round of %d Leases took %.1f s, more than a third of "
                    "quota_lease_seconds (%s s): the Kubernetes API is slow; held Leases may expire "
                    "and be taken over while their executes run",
                    len(held),
                    spent,
                    self.lease_seconds,
                )

    async def _renew(self, name: str, slot: _Slot) -> None:
        if slot.released or self._held.get(name) is not slot:
            return  # released while the round waited
        lease = slot.lease
        lease.spec.renew_time = datetime.datetime.now(datetime.UTC)
        try:
            renewed = await self._write("replace_namespaced_lease", lease, name=name)
        except _Conflict:
            if self._held.get(name) is slot:
                del self._held[name]
                log.warning("quota: Lease %s/%s was taken over (not renewed in time)", self.namespace, name)
            return
        except QuotaUnavailable as exc:
            log.warning("quota: renewing Lease %s failed (%s); it expires unless renewed", name, exc)
            return
        slot.lease = renewed

    async def _delete(self, slot: _Slot) -> None:
        from kubernetes import client as k8s

        name = slot.lease.metadata.name
        for _attempt in range(3):
            version = slot.lease.metadata.resource_version
            options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(resource_version=version))
            try:
                await self._write("delete_namespaced_lease", name=name, body=options)
                return
            except _Conflict:
                # A renewal changed it meanwhile (or it expired and was taken over): read it again.
                try:
                    current = await self._call("read_namespaced_lease", name=name)
                except _Conflict:
                    return  # gone
                if _holder(current) != _holder(slot.lease):
                    return  # someone else's now
                slot.lease = current
            except QuotaUnavailable as exc:
                log.warning(
                    "quota: deleting Lease %s failed (%s); it expires within %s s",
                    name,
                    exc,
                    self.lease_seconds,
                )
                return

    # -- the API -----------------------------------------------------------------------------------

    def _where(self) -> str:
        return f"Kubernetes API Leases in namespace {self.namespace}"

    async def _write(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.writes += 1
        return await self._call(method, *args, **kwargs)

    async def _call(self, method: str, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
        """Call the ``CoordinationV1Api`` method on this store's namespace (and Lease ``name``), on
        the store's threads; 404/409 are :class:`_Conflict`, any other failure
        :class:`QuotaUnavailable`."""
        from kubernetes.client import ApiException

        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=_THREADS, thread_name_prefix="codemode-quota"
            )
        where = (self.namespace,) if name is None else (name, self.namespace)
        call = functools.partial(
            self._request, method, *where, *args, _request_timeout=self.timeout, **kwargs
        )
        started = time.monotonic()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except ApiException as exc:
            if exc.status in (404, 409):
                raise _Conflict() from None
            raise QuotaUnavailable(f"{self._where()}: HTTP {exc.status} {exc.reason}") from None
        except Exception as exc:
            spent = time.monotonic() - started
            raise QuotaUnavailable(
                f"{self._where()}: {type(exc).__name__} after {spent:.1f} s: {exc}"
            ) from None

    def _request(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._client(), method)(*args, **kwargs)

    def _client(self) -> Any:
        with self._api_lock:
            if self._api is None:
                from kubernetes import client as k8s

                configuration = _configuration(self.kubeconfig, self.context)
                configuration.retries = False  # fail fast; the execute fails closed
                configuration.connection_pool_maxsize = _THREADS
                self._api = k8s.CoordinationV1Api(k8s.ApiClient(configuration))
            return self._api


def _configuration(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import client as k8s
    from kubernetes import config

    configuration = k8s.Configuration()
    try:
        if kubeconfig is None and context is None:
            try:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                return configuration
            except config.ConfigException:
                pass
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    except Exception as exc:
        raise QuotaUnavailable(f"no Kubernetes API configuration (in-cluster or kubeconfig): {exc}") from None
    return configuration


def _holder(lease: Any) -> str:
    return str(getattr(lease.spec, "holder_identity", None) or "")


def _live(lease: Any, now: datetime.datetime) -> bool:
    """Whether a slot Lease is held: it has a holder and its last renewal is younger than its
    duration (by this replica's clock)."""
    spec = lease.spec
    if spec is None or not spec.holder_identity or spec.renew_time is None:
        return False
    renewed = spec.renew_time
    if renewed.tzinfo is None:
        renewed = renewed.replace(tzinfo=datetime.UTC)
    return bool(renewed + datetime.timedelta(seconds=spec.lease_duration_seconds or 0) > now)
