"""Orphaned worker pods: this host's identity as written on every pod it makes, and the orphan rule
that decides which pods of a crashed host ``start()`` (and the periodic sweep) may delete
(docs/kubernetes.md, "Orphans: the rule"). ``OrphanRule`` is the runtime's part that lists and
judges; the runtime supplies the API client and the delete."""

from __future__ import annotations

import datetime
import logging
import math
import os
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..streams import CleanupMode, HostIdentity
from ..streams import process_start as _process_start
from ..streams import read_text as _read_text
from ._api_errors import _api_error_text, _status
from .options import KubernetesOptions
from .pod import OWNER_LABEL, ROLE_LABEL

log = logging.getLogger("codemode.runtimes.kubernetes")

_OWNER_ANNOTATIONS = ("pod", "pod-uid", "host", "boot", "pidns", "pid", "start", "started")

# ----------------------------------------------------------------------------------- owner identity


def _own_pod() -> tuple[str, str]:
    """("namespace/name", uid) of the pod this host runs in, ("", "") outside Kubernetes.

    From the downward API (``POD_NAMESPACE``, ``POD_NAME``, ``POD_UID``: k8s/base/deployment.yaml sets
    them); inside a pod without them, the service account namespace and the host name, with no
    uid: recorded for the operator, but the orphan rule never judges an owner pod without a uid
    (that name may be every replica's, with ``spec.hostname``, or the node's, with hostNetwork).
    """
    name = os.environ.get("POD_NAME", "")
    namespace = os.environ.get("POD_NAMESPACE", "")
    if not name and os.environ.get("KUBERNETES_SERVICE_HOST"):
        name = socket.gethostname()
    if name and not namespace:
        namespace = _read_text("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if not (name and namespace):
        return "", ""
    return f"{namespace}/{name}", os.environ.get("POD_UID", "")


class _Owner(HostIdentity):
    """Identity of this host process, recorded in every worker pod's labels and annotations."""

    def refresh(self) -> None:
        super().refresh()
        self.pod, self.pod_uid = _own_pod()
        #: Wall-clock time (UTC, whole seconds, rounded up) at or after this process started: a
        #: container of the owner pod that started later cannot be this process's (the orphan rule).
        self.started = datetime.datetime.fromtimestamp(math.ceil(time.time()), datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )

    def annotations(self) -> dict[str, str]:
        values = (
            self.pod,
            self.pod_uid,
            self.host,
            self.boot,
            self.pidns,
            str(self.pid),
            self.start,
            self.started,
        )
        return {f"io.codemode.owner-{k}": v for k, v in zip(_OWNER_ANNOTATIONS, values, strict=True)}


_OWNER = _Owner()
# A forked child is another host process: it gets its own owner id.
os.register_at_fork(after_in_child=_OWNER.refresh)


# ----------------------------------------------------------------------------------- owner pods


def _restarted_since(pod: Any, started: str) -> bool:
    """Whether no container of the live owner pod ``pod`` can still run the owner process, which
    started at or before ``started`` (its ``owner-started`` annotation). Each container (and each
    restartable init container: a sidecar; an init container that ran to completion before the
    others started is no owner) must provably have ended an instance at or after ``started``: it
    runs an instance that started later, or its current or last instance ended at or after it.
    Anything else may still be the owner: a container waiting without such an end (the kubelet
    has not reported the first start yet) or showing an end from before ``started`` (a previous
    instance's crash, not yet replaced by the running one in the status). Both times are the owner
    node's clock. No ``started`` (a pod made by an older host) or no statuses: False."""
    try:
        when = datetime.datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return False
    spec, status = getattr(pod, "spec", None), getattr(pod, "status", None)
    sidecars = {
        c.name
        for c in getattr(spec, "init_containers", None) or []
        if getattr(c, "restart_policy", None) == "Always"
    }
    statuses = [*(getattr(status, "container_statuses", None) or [])]
    statuses += [c for c in getattr(status, "init_container_statuses", None) or [] if c.name in sidecars]
    return bool(statuses) and all(_ended_since(container, when) for container in statuses)


def _ended_since(container: Any, when: datetime.datetime) -> bool:
    """Whether the container provably ran no instance from before ``when`` to now (its times are
    whole seconds, rounded down: an end in ``when``'s second counts, a start must be later)."""
    state = getattr(container, "state", None)
    running = getattr(state, "running", None)
    if running is not None:
        begun = getattr(running, "started_at", None)
        return isinstance(begun, datetime.datetime) and begun > when
    for ended in (
        getattr(state, "terminated", None),
        getattr(getattr(container, "last_state", None), "terminated", None),
    ):
        finished = getattr(ended, "finished_at", None)
        if isinstance(finished, datetime.datetime) and finished >= when:
            return True
    return False


# ----------------------------------------------------------------------------------- the rule


class OrphanRule:
    """The runtime's orphan handling: list the namespace's worker pods, judge each by the rule,
    delete the orphans (``_remove_orphans_blocking``)."""

    if TYPE_CHECKING:
        options: KubernetesOptions
        cleanup_orphans: CleanupMode

        @property
        def owner(self) -> str: ...
        def _client(self) -> Any: ...
        def _unavailable(self, what: str, exc: BaseException) -> Exception: ...
        def _delete_blocking(self, pod_name: str) -> str: ...

    def _remove_orphans_blocking(self, proven_only: bool) -> int:
        api = self._client()
        pods: list[Any] = []
        token: str | None = None
        while True:
            try:
                page = api.list_namespaced_pod(
                    self.options.namespace,
                    label_selector=f"{ROLE_LABEL}=worker",
                    limit=500,
                    _continue=token,
                    _request_timeout=self.options.api_timeout,
                )
            except Exception as exc:
                raise self._unavailable(
                    f"cannot list worker pods in namespace {self.options.namespace}", exc
                ) from exc
            pods.extend(page.items or [])
            token = getattr(page.metadata, "var_continue", None)
            if not token:
                break
        owners: dict[tuple[str, str], bool | None] = {}
        removed = 0
        for pod in pods:
            meta = pod.metadata
            if not self._is_orphan(meta.labels or {}, meta.annotations or {}, owners, proven_only):
                continue
            log.warning(
                "kubernetes: deleting orphaned worker pod %s (owner %s, pod %s, pid %s on %s)",
                meta.name,
                (meta.labels or {}).get(OWNER_LABEL),
                (meta.annotations or {}).get("io.codemode.owner-pod"),
                (meta.annotations or {}).get("io.codemode.owner-pid"),
                (meta.annotations or {}).get("io.codemode.owner-host"),
            )
            if self._delete_blocking(meta.name) != "failed":
                removed += 1
        return removed

    def _is_orphan(
        self,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        owners: dict[tuple[str, str], bool | None],
        proven_only: bool = False,
    ) -> bool:
        """The orphan rule (docs/kubernetes.md): may ``start()`` delete a pod with these labels?
        ``proven_only`` (the periodic sweep): without the host-name rule, a start-time guess."""
        if labels.get(ROLE_LABEL) != "worker" or labels.get(OWNER_LABEL, "") == self.owner:
            return False
        if self.cleanup_orphans != "dead":
            return self.cleanup_orphans == "all"
        ann = {k: annotations.get(f"io.codemode.owner-{k}", "") for k in _OWNER_ANNOTATIONS}
        me = _OWNER
        if ann["boot"] and ann["boot"] == me.boot and ann["pidns"] and ann["pidns"] == me.pidns:
            # 1. Same kernel boot and pid namespace: alive iff its pid runs with the same start time.
            try:
                pid = int(ann["pid"])
            except ValueError:
                return False
            now = _process_start(pid)
            return not now or (bool(ann["start"]) and now != ann["start"])
        if ann["pod"]:
            # 2. The owner ran in a pod. Only a pod known by its uid (the downward API) can be
            # checked: a name from the host-name fallback may be shared (spec.hostname) or no pod's
            # (hostNetwork: the node's name). Our own pod in another pid namespace: our container
            # was restarted, the old process is gone. Another pod: dead iff it no longer exists.
            if not ann["pod-uid"]:
                return False
            if ann["pod"] == me.pod and ann["pod-uid"] == me.pod_uid:
                return True
            key = (ann["pod"], ann["pod-uid"])
            if key not in owners:
                owners[key] = self._owner_pod_gone(*key)
            if owners[key] is None:
                return False
            return owners[key] is True or _restarted_since(owners[key], ann["started"])
        # 3. Outside Kubernetes: the same host name in another boot or pid namespace was restarted
        # (a guess only this host's start may make: later it may be a live peer with that name).
        return not proven_only and bool(ann["host"]) and ann["host"] == me.host and not me.pod

    def _owner_pod_gone(self, ref: str, uid: str) -> bool | Any | None:
        """True: the owner pod is gone (404, another uid, ended); None: can't tell; else the live
        pod object (its containers tell whether the owner process still runs)."""
        namespace, _, name = ref.partition("/")
        try:
            pod = self._client().read_namespaced_pod(
                name, namespace, _request_timeout=self.options.api_timeout
            )
        except Exception as exc:
            if _status(exc) == 404:
                return True
            log.warning(
                "kubernetes: cannot tell whether owner pod %s is alive: %s", ref, _api_error_text(exc)
            )
            return None
        if uid and getattr(pod.metadata, "uid", None) != uid:
            return True  # another pod of the same name (e.g. a StatefulSet replacement)
        if getattr(pod.status, "phase", None) in ("Succeeded", "Failed"):
            return True
        return pod
