"""Launching one worker pod: create it, attach as soon as its container runs, read the worker's
first answer; try another node when the first pod's node turns out silent, and say why a launch
failed in the error the caller gets (docs/kubernetes.md, "Start-up phases", "A node lost
mid-execute", "Sizing"). ``PodLaunching`` is the runtime's part that does it, on the runtime's
thread pool; the runtime supplies the API client, the manifest and the delete."""

from __future__ import annotations

import contextlib
import logging
import random
import select
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubernetes import client as k8s

from ..base import CapacityExhausted, RuntimeClosing, RuntimeUnavailable, SpawnFailed
from ..handshake import PROBE
from ..reuse.supervised import PING
from ..streams import LaunchHandoff
from ._api_errors import _RETRY_STATUSES, _api_error_text, _is_connection_error, _maybe_sent, _status
from ._attach import (
    _CLOSE,
    _ERROR,
    _OP_BINARY,
    _OP_CLOSE,
    _OP_TEXT,
    _STDOUT,
    _Attached,
    _error_status,
    _hangup,
    _Refused,
    not_running_yet,
)
from .nodes import NodeQuarantine
from .options import KubernetesOptions
from .pod import Progress, acknowledged, progress, scheduled
from .upgrade import upgrade_timed_out

log = logging.getLogger("codemode.runtimes.kubernetes")

#: Creates retried when the API server refuses one with 409 for a race on the namespace's
#: ResourceQuota usage (concurrent creates; nothing was created), after 20-80 ms each.
CREATE_CONFLICT_RETRIES = 3
#: Pods one spawn may make when the first ones land on silent nodes (each on another node).
_NODE_ATTEMPTS = 3


class _NodeSilent(SpawnFailed):
    """The pod was bound to a node whose kubelet never acknowledged it (``node_ack_timeout``) and
    that the API server cannot reach."""

    def __init__(self, node: str, detail: str) -> None:
        super().__init__(detail)
        self.node = node


class _Unplaceable(SpawnFailed):
    """A pod kept off suspected nodes is unschedulable: no other node can take it."""


@dataclass
class _Watch:
    """What one launch knows of its starting pod, read after read (``_start_blocking``)."""

    pod_name: str
    t0: float
    phases: dict[str, float]
    avoiding: bool
    #: Attach while the pod is still starting (``attach_early``; off after an unknown refusal).
    early: bool
    detail: str = "not read yet"
    unschedulable_since: float | None = None
    bound_since: float | None = None
    #: When the unacknowledged pod's node is checked (next).
    check_at: float | None = None
    #: A check found the node's kubelet reachable.
    node_answered: bool = False


class PodLaunching:
    """The launch of the runtime's pods (``_launch_blocking``), run on its thread pool."""

    if TYPE_CHECKING:
        options: KubernetesOptions
        quarantine: NodeQuarantine
        last_phases: dict[str, float]
        last_attach_attempts: int
        _closed: bool
        _created_any: bool

        def _client(self) -> Any: ...
        def pod_manifest(
            self, pod_name: str, supervised: bool = False, avoided_nodes: list[str] | None = None
        ) -> k8s.V1Pod: ...
        def _open_attach(self, api: Any, pod_name: str, *, stdin: bool, upgrade_within: float) -> Any: ...
        def _delete_blocking(self, pod_name: str) -> str: ...
        def _discard_blocking(self, pod_name: str, attached: Any) -> None: ...
        def _kubelet_unreachable_blocking(self, pod_name: str) -> str | None: ...
        def _unavailable(self, what: str, exc: BaseException) -> RuntimeUnavailable: ...

    def _given_up(self, pod_name: str | None, handoff: LaunchHandoff) -> Exception:
        """A launch stops polling: its caller is gone (cancelled or out of time: the caller logs
        that) or the runtime is closing (``_closing``: one line here, no traceback anywhere)."""
        if handoff.abandoned:
            return SpawnFailed("spawn cancelled")
        return self._closing(pod_name)

    @staticmethod
    def _closing(pod_name: str | None) -> RuntimeClosing:
        what = f"worker pod {pod_name}: its start is given up" if pod_name else "no worker pod is started"
        log.warning("kubernetes: %s: the runtime is closing", what)
        return RuntimeClosing(f"kubernetes: {what}: the runtime is closing")

    def _launch_blocking(self, handoff: LaunchHandoff, supervised: bool = False) -> tuple[str, _Attached]:
        """create -> attach -> the worker's first answer, on another node when the first pod's node turns
        out silent (up to ``_NODE_ATTEMPTS`` pods, all within ``spawn_timeout``)."""
        deadline = time.monotonic() + self.options.spawn_timeout
        attempt = 0
        while True:
            attempt += 1
            avoided = self.quarantine.nodes()
            try:
                return self._launch_once(handoff, supervised, deadline, avoided)
            except _NodeSilent as exc:
                if self.quarantine.suspect(exc.node):
                    log.warning(
                        "kubernetes: node %s did not take on worker pod within %ss (%s): suspecting it"
                        " dead; new worker pods avoid it for %ss",
                        exc.node,
                        self.options.node_ack_timeout,
                        exc,
                        self.quarantine.seconds,
                    )
                if attempt >= _NODE_ATTEMPTS or time.monotonic() >= deadline:
                    raise
            except _Unplaceable as exc:
                # Only the suspected nodes could take it: a hint must never cost the spawn.
                log.warning("kubernetes: %s; trying the suspected node(s) %s again", exc, ", ".join(avoided))
                self.quarantine.forget(avoided)
                if attempt >= _NODE_ATTEMPTS or time.monotonic() >= deadline:
                    raise SpawnFailed(str(exc)) from exc

    def _launch_once(
        self, handoff: LaunchHandoff, supervised: bool, deadline: float, avoided: list[str]
    ) -> tuple[str, _Attached]:
        """One pod: create -> attach (as soon as the container runs) -> the worker's first answer;
        deletes the pod again on any failure."""
        api = self._client()
        pod_name = f"codemode-worker-{uuid.uuid4().hex[:16]}"
        t0 = time.monotonic()
        phases: dict[str, float] = {}
        created = False
        self._created_any = True
        try:
            try:
                self._create_blocking(api, self.pod_manifest(pod_name, supervised, avoided), deadline)
                created = True
                phases["created"] = time.monotonic() - t0
            except k8s.ApiException as exc:
                created = not (exc.status and 400 <= exc.status < 500)  # 4xx: certainly not created
                raise
            except Exception as exc:
                created = _maybe_sent(exc)  # a timeout or lost response: the pod may exist
                raise
            greeting = PING if supervised else PROBE
            attached = self._start_blocking(
                api, pod_name, deadline, handoff, greeting, t0, phases, bool(avoided)
            )
            self.last_phases = phases
            log.debug(
                "kubernetes: worker pod %s %s (%s, %d attach attempts)",
                pod_name,
                " ".join(f"{k} {v * 1000:.0f}ms" for k, v in phases.items()),
                getattr(attached.stream, "subprotocol", None) or "?",
                self.last_attach_attempts,
            )
        except Exception as exc:
            if created:
                self._delete_blocking(pod_name)
            raise self._launch_error(pod_name, exc) from exc
        with handoff.lock:
            if not handoff.abandoned:
                handoff.delivered = True
                return pod_name, attached
        # The spawning coroutine was cancelled meanwhile: nobody will use this pod.
        self._discard_blocking(pod_name, attached)
        raise SpawnFailed("spawn cancelled")

    def _start_blocking(
        self,
        api: Any,
        pod_name: str,
        deadline: float,
        handoff: LaunchHandoff,
        greeting: bytes,
        t0: float,
        phases: dict[str, float],
        avoiding: bool = False,
    ) -> _Attached:
        """Read the pod and attach to it as soon as its container runs: 25 ms apart, growing to
        100 ms (``attach_early``: from the moment it is scheduled, else once the API reports it
        Running).

        The pod's status reaches the API only after the kubelet's next relist (up to a second
        after the container started), but the kubelet serves an attach as soon as the container
        runtime runs the container. So an attempt is made on every read of a scheduled, starting
        pod; a refusal that says exactly "not running yet" (``not_running_yet``) is retried on
        the next read, anything else ends the spawn. A refused attempt never reached the
        container (the kubelet found none to attach to), so the ``stdinOnce`` stdin is untouched
        and no byte of the greeting was delivered. Records when the pod was first seen scheduled
        and running in ``phases``. A pod the scheduler reports Unschedulable for
        ``unschedulable_grace`` seconds is given up (``CapacityExhausted``; at once,
        ``_Unplaceable``, when it is ``avoiding`` suspected nodes). A pod bound to a node whose
        kubelet has not acknowledged it within ``node_ack_timeout`` has its node checked, and again
        every ``node_ack_timeout`` (``_check_silent_node``): given up (``_NodeSilent``) only when
        the API server cannot reach that kubelet; a kubelet that answers is only slow, and the pod
        is waited for (up to ``spawn_timeout``).
        """
        watch = _Watch(pod_name, t0, phases, avoiding, self.options.attach_early)
        self.last_attach_attempts = 0
        delay = 0.025
        while True:
            if handoff.abandoned or self._closed:
                if watch.unschedulable_since is not None:
                    self._log_unschedulable(pod_name, watch.detail)
                raise self._given_up(pod_name, handoff)
            pod = self._read_starting(api, watch)
            if pod is not None:
                where = self._judge(pod, watch)
                if where == "running" or (watch.early and where == "waiting" and "scheduled" in phases):
                    attached = self._try_attach(api, watch, greeting, handoff, where == "running")
                    if attached is not None:
                        return attached
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._out_of_time(watch)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.1)

    def _read_starting(self, api: Any, watch: _Watch) -> Any:
        """The starting pod as the API has it now; None (and why, in ``watch.detail``) when the
        read failed in a way worth another read."""
        try:
            return api.read_namespaced_pod(
                watch.pod_name, self.options.namespace, _request_timeout=self.options.api_timeout
            )
        except Exception as exc:
            if _status(exc) == 404:
                raise SpawnFailed(f"kubernetes: worker pod {watch.pod_name} vanished while starting") from exc
            if not (_status(exc) in _RETRY_STATUSES or _is_connection_error(exc)):
                raise
            watch.detail = f"API error: {_api_error_text(exc)}"
            return None

    def _judge(self, pod: Any, watch: _Watch) -> Progress:
        """Where one read of the pod finds it (``progress``), recording its phases and checking an
        unacknowledged pod's node when due; raises when it will never run here (ended, no image,
        unschedulable past ``unschedulable_grace``, or at once when ``avoiding``)."""
        now = time.monotonic()
        if "scheduled" not in watch.phases and scheduled(pod):
            watch.phases["scheduled"] = now - watch.t0
        node = getattr(pod.spec, "node_name", None)
        waiting_for_node = bool(node) and not acknowledged(pod)
        if node and waiting_for_node:
            watch.bound_since = watch.bound_since or now
            watch.check_at = watch.check_at or watch.bound_since + self.options.node_ack_timeout
            if now >= watch.check_at:
                watch.check_at = self._check_silent_node(watch.pod_name, node) + self.options.node_ack_timeout
                watch.node_answered = True
        where, watch.detail = progress(pod)
        if waiting_for_node and watch.node_answered:
            watch.detail = (
                f"bound to node {node}, whose kubelet (not unreachable) has not taken it on; {watch.detail}"
            )
        if where == "running":
            watch.phases.setdefault("running", now - watch.t0)
        if where == "ended":
            raise SpawnFailed(f"kubernetes: worker pod {watch.pod_name} ended before attach: {watch.detail}")
        if where == "no-image":
            image = self.options.image
            raise RuntimeUnavailable(f"kubernetes: worker image {image!r} unavailable: {watch.detail}")
        if where != "unschedulable":
            watch.unschedulable_since = None
        elif watch.avoiding:
            raise _Unplaceable(
                f"kubernetes: worker pod {watch.pod_name} kept off the suspected nodes is"
                f" unschedulable: {watch.detail}"
            )
        else:
            watch.unschedulable_since = watch.unschedulable_since or now
            if now - watch.unschedulable_since >= self.options.unschedulable_grace:
                raise self._unschedulable(watch)
        return where

    def _try_attach(
        self, api: Any, watch: _Watch, greeting: bytes, handoff: LaunchHandoff, running: bool
    ) -> _Attached | None:
        """One attach attempt (``_attach_blocking``); None when it was refused with a retryable
        "not running yet" (``_known_refusal``; an unknown refusal of a starting pod stops the early
        attaches)."""
        try:
            attached = self._attach_blocking(api, watch.pod_name, greeting, handoff)
        except _Refused as refused:
            known = self._known_refusal(watch.pod_name, refused.text, running)
            watch.early = watch.early and known
            watch.detail = f"attach refused: {refused.text}"
            return None
        watch.phases["attached"] = time.monotonic() - watch.t0
        return attached

    def _out_of_time(self, watch: _Watch) -> Exception:
        """The error of a pod not attached within ``spawn_timeout``."""
        if watch.unschedulable_since is not None:
            return self._unschedulable(watch)
        return SpawnFailed(
            f"kubernetes: worker pod {watch.pod_name} not running after"
            f" {self.options.spawn_timeout}s: {watch.detail}"
        )

    def _unschedulable(self, watch: _Watch) -> CapacityExhausted:
        self._log_unschedulable(watch.pod_name, watch.detail)
        return CapacityExhausted(f"kubernetes: worker pod {watch.pod_name} unschedulable: {watch.detail}")

    def _check_silent_node(self, pod_name: str, node: str) -> float:
        """The node check (``_kubelet_unreachable_blocking``) for a pod whose node's kubelet has
        not acknowledged it within ``node_ack_timeout``.

        A loaded node's kubelet can be slow to write ``status.startTime`` (its status writes are
        rate limited, its pod workers share the node's CPU), so the timer alone proves nothing:
        only the API server's failure to dial the kubelet does. Anything else (the kubelet's own
        refusal, such as "container worker not found", an attach that holds, or no word within the
        check's wait) suspects nothing.

        Raises:
            _NodeSilent: the API server cannot reach the node's kubelet.

        Returns:
            When the check ended (monotonic clock): the next one is due ``node_ack_timeout`` later.
        """
        unreachable = self._kubelet_unreachable_blocking(pod_name)
        if unreachable is not None:
            raise _NodeSilent(
                node,
                f"kubernetes: worker pod {pod_name} bound to node {node}, whose kubelet did not"
                f" acknowledge it within {self.options.node_ack_timeout}s and cannot be reached"
                f" ({unreachable})",
            )
        log.debug(
            "kubernetes: node %s has not taken on worker pod %s within %ss, but the API server does not"
            " report its kubelet unreachable: waiting (the node is not suspected)",
            node,
            pod_name,
            self.options.node_ack_timeout,
        )
        return time.monotonic()

    def _known_refusal(self, pod_name: str, text: str, running: bool) -> bool:
        """Whether a refused attach says exactly "not running yet" (then retried). Any other
        refusal of a pod the API reports running ends the spawn; of a starting pod, it makes
        the launch attach only once the API reports it running (as without ``attach_early``)."""
        if not_running_yet(text, pod_name, self.options.namespace):
            return True
        if running:
            raise SpawnFailed(f"kubernetes: attaching to worker pod {pod_name} was refused: {text}")
        log.warning(
            "kubernetes: attach to starting worker pod %s refused (%s); attaching once it runs",
            pod_name,
            text,
        )
        return False

    def _attach_blocking(self, api: Any, pod_name: str, greeting: bytes, handoff: LaunchHandoff) -> _Attached:
        """One attach attempt: open the stream, send ``greeting`` and read until the worker's first
        stdout bytes (which prove the stream reaches it), for at most ``probe_timeout``.

        Raises:
            _Refused: the API server or kubelet refused the attach before it reached the container
                (the websocket handshake failed, or a Status came on the error channel first).
            SpawnFailed: the stream ended, or nothing came in time, after the attach may have
                reached the container (its stdin is then closed: ``stdinOnce``).
        """
        self.last_attach_attempts += 1
        try:
            stream = self._open_attach(api, pod_name, stdin=True, upgrade_within=self.options.api_timeout)
        except k8s.ApiException as exc:
            if upgrade_timed_out(exc):
                raise SpawnFailed(
                    f"kubernetes: attaching to worker pod {pod_name}: the API server did not complete"
                    f" the websocket upgrade within {self.options.api_timeout}s"
                ) from None
            if exc.status == 0 and "Handshake status 403" not in str(exc.reason):
                raise _Refused(str(exc.reason)) from None  # the handshake's status line and body
            raise
        handed_over = False
        try:
            ws = getattr(stream, "sock", None)
            if ws is None:
                raise SpawnFailed(f"kubernetes: attaching to worker pod {pod_name} gave no stream")
            attached = _Attached(stream)
            stream.write_stdin(greeting)
            answer_by = time.monotonic() + self.options.probe_timeout
            while not self._answered(ws, attached, answer_by, handoff):
                pass
            handed_over = True
            return attached
        finally:
            if not handed_over:
                _hangup(stream)

    def _answered(self, ws: Any, attached: _Attached, answer_by: float, handoff: LaunchHandoff) -> bool:
        """Read one message of a fresh attach stream (waiting at most until ``answer_by``; a
        cancelled spawn is noticed within 100 ms): True once it carried stdout bytes."""
        while True:
            if handoff.abandoned or self._closed:
                raise self._given_up(None, handoff)
            left = answer_by - time.monotonic()
            if left <= 0:
                raise SpawnFailed(f"kubernetes: worker did not answer within {self.options.probe_timeout}s")
            sock = ws.sock
            pending = getattr(sock, "pending", None)
            if (pending is not None and pending()) or select.select([sock], [], [], min(left, 0.1))[0]:
                break
        ws.sock.settimeout(max(left, 0.1))
        try:
            opcode, frame = ws.recv_data_frame(True)
        finally:
            with contextlib.suppress(OSError):
                ws.sock.settimeout(None)
        if opcode == _OP_CLOSE:
            raise SpawnFailed("kubernetes: the attach stream ended before the worker answered")
        if opcode not in (_OP_BINARY, _OP_TEXT):
            return False
        data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
        if len(data) < 2:
            return False  # a channel's opening message
        channel, payload = data[0], data[1:]
        if channel == _ERROR:
            status, message = _error_status(payload)
            if status == "Success":  # the attach reached the container, which has ended
                raise SpawnFailed("kubernetes: the worker ended before it answered")
            raise _Refused(message)
        if channel == _CLOSE:
            raise SpawnFailed("kubernetes: the attach stream ended before the worker answered")
        attached.early.append(data)
        return channel == _STDOUT

    def _log_unschedulable(self, pod_name: str, detail: str) -> None:
        log.error(
            "kubernetes: no node has room for worker pod %s in namespace %s (%s). Each worker reserves"
            " cpu %s and memory %s: add nodes, lower the reservation (the runtime's cpu_request;"
            " --kubernetes-memory / CODEMODE_KUBERNETES_MEMORY) or lower max_concurrent_executions"
            " + pool. Clients get 'resource limit exceeded'.",
            pod_name,
            self.options.namespace,
            detail,
            self.options.cpu_request,
            self.options.memory,
        )

    def _create_blocking(self, api: Any, pod: k8s.V1Pod, deadline: float) -> None:
        """Create the pod; a 409 for a race on the ResourceQuota's usage (not a name clash: the name
        is random) is retried up to ``CREATE_CONFLICT_RETRIES`` times before the deadline."""
        for attempt in range(CREATE_CONFLICT_RETRIES + 1):
            try:
                api.create_namespaced_pod(
                    self.options.namespace, pod, _request_timeout=self.options.api_timeout
                )
                return
            except k8s.ApiException as exc:
                pause = random.uniform(0.02, 0.08)
                quota_race = exc.status == 409 and "resourcequotas" in _api_error_text(exc)
                if (
                    not quota_race
                    or attempt == CREATE_CONFLICT_RETRIES
                    or time.monotonic() + pause > deadline
                ):
                    raise
                time.sleep(pause)

    def _launch_error(self, pod_name: str, exc: Exception) -> Exception:
        if isinstance(exc, RuntimeUnavailable | SpawnFailed):
            return exc
        status = _status(exc)
        text = _api_error_text(exc)
        if _is_connection_error(exc) or status in (401, 404, 400, 422):
            # unreachable, credentials, no such namespace, or the cluster rejects the pod spec
            return self._unavailable(f"cannot create worker pod in namespace {self.options.namespace}", exc)
        if status == 403:
            if "exceeded quota" in text:
                log.error(
                    "kubernetes: the ResourceQuota of namespace %s refused worker pod %s: %s. Raise the"
                    " quota (k8s/base/resourcequota.yaml) or lower max_concurrent_executions + pool or the"
                    " per-worker resources. Clients get 'resource limit exceeded'.",
                    self.options.namespace,
                    pod_name,
                    text,
                )
                return CapacityExhausted(f"kubernetes: worker pod quota exhausted: {text}")
            # RBAC, Pod Security admission, RuntimeClass admission
            return self._unavailable(f"worker pod refused in namespace {self.options.namespace}", exc)
        if status == 0 and "403" in text:  # websocket handshake refused: no pods/attach permission
            return self._unavailable(f"cannot attach to worker pod {pod_name}", exc)
        return SpawnFailed(f"kubernetes: cannot start worker pod {pod_name}: {text}")
