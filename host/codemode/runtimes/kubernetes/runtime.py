"""The Kubernetes runtime: one hardened, single-use pod per execute, through the Kubernetes API.

What the pod gets, how a spawn and a destroy go, the streams and the orphan rule are
docs/kubernetes.md ("The worker pod", "Streams", "Lifecycle and exit information", "Orphans: the
rule"); the settings are docs/reference/runtimes.md. For the code reader: the manifest and the
reading of pod status are pure and live in ``pod``; the launch of a pod in ``_launch``, the orphan
rule in ``_orphans``, the attach websocket's framing in ``_attach``; this module is the runtime and
its sandbox, the API calls of a pod's end and the node check.

Every client call blocks, so each runs on the runtime's small thread pool with a request timeout (an
unreachable API server is ``RuntimeUnavailable``, never a hang). A reader thread per sandbox takes
the attach websocket one message at a time into bounded buffers (never ``WSClient.update()``, which
buffers without bound); small writes go out on the event loop's thread only when the socket provably
takes them (``_has_room``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from kubernetes import client as k8s

from ..base import ExitInfo, RuntimeUnavailable, SpawnFailed
from ..handshake import probe
from ..reuse.supervised import Supervised, supervisor_command
from ..streams import BlockingRuntime, ThreadedStreamSandbox
from ..testing import TESTING_ENTRY, TESTING_ENV
from ..testing import WARNING as TESTING_WARNING
from ._api_errors import _RETRY_STATUSES, _api_error_text, _is_connection_error, _status, _status_message
from ._attach import (
    _CLOSE,
    _DIRECT_SEND_MAX,
    _ERROR,
    _OP_BINARY,
    _OP_CLOSE,
    _OP_TEXT,
    _STDERR,
    _STDOUT,
    _V5,
    _WRITE_CHUNK,
    _close_reason,
    _hangup,
    _has_room,
    _open_attach,
    _shut,
)
from ._launch import PodLaunching
from ._orphans import _OWNER, OrphanRule
from .nodes import NodeQuarantine, kubelet_unreachable
from .options import DEFAULT_NAMESPACE, CleanupMode, KubernetesOptions
from .pod import DEFAULT_IMAGE, INSTANCE_LABEL, OWNER_LABEL, PROTOCOL_LABEL, ROLE_LABEL, PodSizing, worker_pod
from .pod import worker_status as _worker_status

__all__ = ["DEFAULT_NAMESPACE", "KubernetesRuntime", "KubernetesSandbox"]

log = logging.getLogger("codemode.runtimes.kubernetes")


_DeleteOutcome = Literal["deleted", "gone", "failed"]
#: Seconds a worker whose stream ended must still read as running before its node is checked, and
#: how long the check waits for the API server's word on the node's kubelet.
_LOST_CHECK_AFTER = 1.0
_LOST_CHECK_WAIT = 1.0
#: Seconds (at most ``api_timeout``) the node check's websocket may take to connect and upgrade.
_LOST_CHECK_UPGRADE = 5.0


# ----------------------------------------------------------------------------------- sandbox


class KubernetesSandbox(ThreadedStreamSandbox["KubernetesRuntime"]):
    """One worker pod reached through its attached stdin/stdout (a websocket to the API server)."""

    _log = log
    _kind = "kubernetes"

    def __init__(
        self,
        runtime: KubernetesRuntime,
        pod_name: str,
        stream: Any,
        loop: asyncio.AbstractEventLoop,
        early: Sequence[bytes] = (),
    ):
        """One started worker pod (made by :meth:`KubernetesRuntime.spawn`).

        Args:
            runtime: the runtime that owns it.
            pod_name: the pod.
            stream: the attach websocket to its stdin/stdout.
            loop: the event loop the sandbox answers on.
            early: the stream's messages the launch read already (the worker's first answer).
        """
        self.pod_name = pod_name
        self._early = list(early)
        self._stream = stream  # kubernetes.stream.ws_client.WSClient
        self._ws = stream.sock  # its websocket.WebSocket
        self._v5 = getattr(stream, "subprotocol", None) == _V5
        self._error = bytearray()
        #: The pod was deleted (by this sandbox) or found gone.
        self.deleted = False
        #: How the attach stream ended, for host logs ("" while it runs).
        self.stream_end = ""
        super().__init__(runtime, f"k8s-{pod_name}", loop, f"codemode-k8s-{pod_name}")

    # -- extras ----------------------------------------------------------------------------------

    @property
    def error_channel(self) -> bytes:
        """What the API server/kubelet reported on the error channel (a Status, for host logs)."""
        with self._cond:
            return bytes(self._error)

    # -- transport -------------------------------------------------------------------------------

    def _send_now(self, data: bytes) -> int:
        # A native call's round trip would otherwise cross to the pool and back for every result
        # frame. Sent here only when the socket takes the whole message at once (room in its send
        # buffer and under its not-sent limit): a worker that stops reading its stdin fills the path
        # back to this socket, and then every write takes the pool again (the event loop never
        # blocks on a worker).
        if len(data) > _DIRECT_SEND_MAX or threading.get_ident() != self._loop_thread:
            return 0
        sock = getattr(self._ws, "sock", None)
        if sock is None or not _has_room(sock, len(data)):
            return 0
        self._stream.write_stdin(data)  # one websocket message: all of it or nothing
        return len(data)

    def _send(self, data: bytes) -> None:
        # Several small websocket messages rather than one huge one (servers cap message size).
        for i in range(0, max(len(data), 1), _WRITE_CHUNK):
            self._stream.write_stdin(data[i : i + _WRITE_CHUNK])

    async def _half_close(self) -> None:
        if self._v5:  # v4 has no half-close: stdin closes with the stream (stdinOnce)
            with contextlib.suppress(Exception):
                await self._runtime._run_blocking(self._stream.close_channel, 0)

    def _pump(self) -> None:
        try:
            self.stream_end = self._pump_frames()
        except Exception as exc:
            self.stream_end = f"broke: {type(exc).__name__}: {str(exc)[:200]}"
            raise

    def _pump_frames(self) -> str:
        for data in self._early:  # read by the launch (small: the worker's first answer)
            self._take(data)
        self._early = []
        while True:
            with self._cond:
                # Bounded: a worker flooding stdout waits until the host reads (TCP back-pressure
                # through the API server and kubelet to the worker's pipe).
                self._wait_for_room()
            opcode, frame = self._ws.recv_data_frame(True)
            if opcode == _OP_CLOSE:
                return f"closed by the API server ({_close_reason(frame)})"
            if opcode not in (_OP_BINARY, _OP_TEXT):
                continue  # ping/pong
            data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
            if data and not self._take(data):
                return "the worker's stdout closed"

    def _take(self, data: bytes) -> bool:
        """Dispatch one channel message; False when it closes stdout."""
        channel, payload = data[0], data[1:]
        if channel == _STDOUT:
            self._push_stdout(payload)  # discarded while being destroyed
        elif channel == _CLOSE and payload[:1] == bytes([_STDOUT]):
            return False
        elif channel in (_STDERR, _ERROR):
            self._push_tail(self._stderr if channel == _STDERR else self._error, payload)
        return True

    def _close_stream(self) -> None:
        self._input_closed = True
        _shut(self._ws)  # wakes the reader blocked in recv, and a pool thread blocked in send
        self._reader.join(timeout=2.0)
        _hangup(self._stream)

    def _destroy_blocking(self) -> ExitInfo:
        """Close the stream, read how the worker ended, delete the pod. Runs once, on the pool.

        A worker whose output stream had already ended has exited (or is exiting): read its
        terminated state (bounded wait), then delete the pod. If its container still runs and the
        API server cannot reach its node's kubelet, the worker is **lost** (``ExitInfo.lost``,
        exit unknown: its node died or is cut off), said so in the log and its node suspected. A
        worker still running is being killed by the host: delete it at once (grace period 0) and
        report SIGKILL (137) without another round trip.
        """
        rt = self._runtime
        exited = self._begin_destroy()
        self._close_stream()
        exit_code: int | None = None
        sig: int | None = None
        oom = False
        found = "running"
        if exited:
            found, term = rt._terminated_blocking(self.pod_name, self.stream_end or "ended")
            if term is not None:
                exit_code = term.exit_code
                sig = term.signal
                oom = term.reason == "OOMKilled"
        outcome = rt._delete_blocking(self.pod_name)
        self.deleted = outcome != "failed"
        if found == "running" and outcome == "deleted":
            exit_code, sig = 128 + 9, 9
        return self._finish_destroy(exit_code, sig, oom, found == "lost")


# ----------------------------------------------------------------------------------- runtime


class KubernetesRuntime(PodLaunching, OrphanRule, BlockingRuntime[KubernetesSandbox]):
    """Spawns one hardened pod per execute from the worker image.

    Creating a pod costs this host nothing but an API call, so a warm pool may refill concurrently
    (``concurrent_refill``).

    Args:
        options: every option of the runtime (``KubernetesOptions``: namespace, image, sizing,
            timeouts, ...; checked when they were made). Default: ``KubernetesOptions()``.
        api: a ``kubernetes.client.CoreV1Api``. Without it the client is configured from
            ``options.kubeconfig``/``options.context``, else as ``KubernetesOptions`` says.
        attach: the function that opens the attach websocket (default ``kubernetes.stream.stream``).
    """

    concurrent_refill = True

    def __init__(
        self,
        options: KubernetesOptions | None = None,
        *,
        api: Any = None,
        attach: Callable[..., Any] | None = None,
    ) -> None:
        if options is None:
            options = KubernetesOptions()
        elif not isinstance(options, KubernetesOptions):
            raise TypeError(f"KubernetesRuntime takes KubernetesOptions, not {type(options).__name__}")
        #: The runtime's options, whole.
        self.options = options
        self.sizing = PodSizing(
            memory=options.memory,
            cpu=options.cpu,
            cpu_request=options.cpu_request,
            ephemeral_storage=options.ephemeral_storage,
        )
        #: The nodes suspected dead, which new pods avoid (``nodes``).
        self.quarantine = NodeQuarantine(options.node_quarantine)
        #: Seconds from the start of the last successful launch to each phase it reached
        #: (created, scheduled, running, attached); for benchmarks and debugging.
        self.last_phases: dict[str, float] = {}
        #: Attach attempts of the last launch (refused ones included); for benchmarks and debugging.
        self.last_attach_attempts = 0
        self.cleanup_orphans: CleanupMode = options.cleanup_orphans
        self.stdout_buffer_bytes = max(64 * 1024, options.stdout_buffer_bytes)
        testing = options.testing_entry
        #: The worker container's command (None: the image's) and a reusable pod's.
        self.command = list(TESTING_ENTRY) if testing else (list(options.entrypoint or ()) or None)
        self.supervisor_command = list(options.supervisor_entrypoint or supervisor_command(testing))
        if testing:
            log.warning(TESTING_WARNING, "kubernetes")
        #: Unique per runtime object; lets aclose() sweep this runtime's own pods.
        self.instance_id = uuid.uuid4().hex
        self._api: Any = api
        self._owns_api = api is None
        self._attach = attach
        self._api_lock = threading.Lock()
        self._init_blocking(options.executor_threads, "codemode-k8s")
        self._created_any = False

    # -- identity and the pod ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return (
            "kubernetes" if self.options.runtime_class is None else f"kubernetes:{self.options.runtime_class}"
        )

    @property
    def max_lifetime(self) -> float:
        """Seconds a pod lives at most (its ``activeDeadlineSeconds``; ``LimitedLifetime``)."""
        return float(self.options.max_lifetime)

    @property
    def memory_limited(self) -> bool:
        """True: every pod has a cgroup memory limit (``MemoryLimited``)."""
        return True

    @property
    def owner(self) -> str:
        """The owner id in every worker pod's labels (this host process's, unless ``owner_id`` is set)."""
        return self.options.owner or _OWNER.id

    def labels(self) -> dict[str, str]:
        """The labels every worker pod of this runtime gets (the NetworkPolicy selects the role).

        Returns:
            Role, owner and the owner's identity.
        """
        return {
            ROLE_LABEL: "worker",
            OWNER_LABEL: self.owner,
            INSTANCE_LABEL: self.instance_id,
            PROTOCOL_LABEL: DEFAULT_IMAGE.rsplit(":", 1)[1],
        }

    def pod_manifest(
        self, pod_name: str, supervised: bool = False, avoided_nodes: list[str] | None = None
    ) -> k8s.V1Pod:
        """The exact pod ``spawn()`` submits (built by ``pod.worker_pod``).

        Args:
            pod_name: the pod's name.
            supervised: the reusable pod of ``spawn_supervised()`` instead (the supervisor as PID 1).
            avoided_nodes: nodes the pod must not run on (``spawn()`` passes the suspected ones).

        Returns:
            The pod object.
        """
        labels = self.labels()
        if supervised:
            labels["io.codemode.mode"] = "reuse"
        return worker_pod(
            pod_name,
            namespace=self.options.namespace,
            image=self.options.image,
            labels=labels,
            annotations=_OWNER.annotations(),
            sizing=self.sizing,
            runtime_class=self.options.runtime_class,
            seccomp_profile=self.options.seccomp_profile,
            max_lifetime=self.options.max_lifetime,
            image_pull_policy=self.options.image_pull_policy,
            command=self.supervisor_command if supervised else self.command,
            extra_env={TESTING_ENV: "1"} if self.options.testing_entry else None,
            avoided_nodes=avoided_nodes,
        )

    # -- blocking plumbing -----------------------------------------------------------------------

    def _client(self) -> Any:
        """The CoreV1Api (created on first use, in a worker thread)."""
        with self._api_lock:
            if self._api is None:
                self._api = k8s.CoreV1Api(k8s.ApiClient(self._configuration()))
            return self._api

    def _configuration(self) -> k8s.Configuration:
        from kubernetes import config

        try:
            if self.options.kubeconfig is not None or self.options.context is not None:
                configuration = k8s.Configuration()
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=os.fspath(self.options.kubeconfig) if self.options.kubeconfig else None,
                    context=self.options.context,
                    client_configuration=configuration,
                )
                return configuration
            loaded = k8s.Configuration.get_default_copy()
            if loaded.host != k8s.Configuration().host:
                return loaded  # the caller ran config.load_kube_config()/load_incluster_config()
            configuration = k8s.Configuration()
            try:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return configuration
        except Exception as exc:
            kubeconfig, context = self.options.kubeconfig, self.options.context
            where = f"kubeconfig {kubeconfig or '(default)'} context {context or '(current)'}"
            raise RuntimeUnavailable(
                f"kubernetes: no API configuration ({where}; neither in-cluster nor a kubeconfig; set"
                f" --kubernetes-kubeconfig / CODEMODE_KUBERNETES_KUBECONFIG): {exc}"
            ) from exc

    def _endpoint(self) -> str:
        host = getattr(getattr(getattr(self._api, "api_client", None), "configuration", None), "host", None)
        return host if isinstance(host, str) else "the configured API server"

    def _unavailable(self, what: str, exc: BaseException) -> RuntimeUnavailable:
        if _is_connection_error(exc):
            return RuntimeUnavailable(
                f"kubernetes: API server unreachable at {self._endpoint()} ({what}): {_api_error_text(exc)}"
            )
        hint = ""
        if _status(exc) == 401:
            hint = " (credentials rejected)"
        elif _status(exc) == 403:
            hint = (
                " (forbidden: check the host's RBAC (k8s/base/rbac.yaml), the namespace's Pod Security"
                " level and the RuntimeClass)"
            )
        return RuntimeUnavailable(f"kubernetes: {what}: {_api_error_text(exc)}{hint}")

    def _open_attach(self, api: Any, pod_name: str, *, stdin: bool, upgrade_within: float) -> Any:
        """Attach to the worker container of ``pod_name`` (``_attach._open_attach``)."""
        return _open_attach(
            self._attach, api, pod_name, self.options.namespace, stdin=stdin, upgrade_within=upgrade_within
        )

    def _delete_blocking(self, pod_name: str) -> _DeleteOutcome:
        """Delete one pod with grace period 0. Never raises.

        ``"deleted"`` (this call deleted it), ``"gone"`` (404: it was not there any more) or
        ``"failed"`` (logged; left to the ``aclose()`` sweep, the orphan rule and
        ``activeDeadlineSeconds``). Conflicts, throttling, server errors and connection errors are
        retried with backoff for up to ``api_timeout``.
        """
        deadline = time.monotonic() + self.options.api_timeout
        delay = 0.02
        while True:
            try:
                self._client().delete_namespaced_pod(
                    pod_name,
                    self.options.namespace,
                    grace_period_seconds=0,
                    _request_timeout=self.options.api_timeout,
                )
                return "deleted"
            except Exception as exc:
                if _status(exc) == 404:
                    return "gone"
                retry = _status(exc) in _RETRY_STATUSES or _is_connection_error(exc)
                if retry and time.monotonic() < deadline:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                log.error("kubernetes: could not delete worker pod %s: %s", pod_name, _api_error_text(exc))
                return "failed"

    def _terminated_blocking(
        self, pod_name: str, stream_end: str = "ended"
    ) -> tuple[Literal["terminated", "running", "gone", "lost"], Any]:
        """The worker container's terminated state, waiting up to ``exit_wait`` for the kubelet.

        A container that still reads as running ``_LOST_CHECK_AFTER`` seconds after its stream
        ended (``stream_end`` says how) has its node checked (``_kubelet_unreachable_blocking``):
        unreachable means ``"lost"`` at once (logged, the node suspected).
        """
        start = time.monotonic()
        deadline = start + self.options.exit_wait
        checked = False
        while True:
            try:
                pod = self._client().read_namespaced_pod(
                    pod_name, self.options.namespace, _request_timeout=self.options.api_timeout
                )
            except Exception as exc:
                if _status(exc) == 404:
                    return "gone", None
                log.warning("kubernetes: reading worker pod %s failed: %s", pod_name, _api_error_text(exc))
                return "running", None
            reason = getattr(pod.status, "reason", None)
            if reason in ("DeadlineExceeded", "Evicted"):
                log.warning("kubernetes: worker pod %s ended: %s", pod_name, reason)
            state = getattr(_worker_status(pod), "state", None)
            term = getattr(state, "terminated", None)
            if term is not None:
                return "terminated", term
            node = getattr(pod.spec, "node_name", None) or ""
            now = time.monotonic()
            if not checked and node and now >= min(start + _LOST_CHECK_AFTER, deadline):
                checked = True
                unreachable = self._kubelet_unreachable_blocking(pod_name)
                if unreachable is not None:
                    self._log_lost(pod_name, node, stream_end, unreachable)
                    return "lost", None
            if time.monotonic() >= deadline:
                return "running", None
            time.sleep(0.1)

    def _kubelet_unreachable_blocking(self, pod_name: str) -> str | None:
        """Whether the API server can reach the kubelet of a pod's node: one attach to its
        container's stderr (``pods/attach``, which the host has; nodes it may not read), read for
        at most ``_LOST_CHECK_WAIT`` seconds, then closed. The API server accepts the websocket
        first and reports a failure to dial the kubelet on the error channel (1.30+; older ones
        refuse the handshake). Returns that dial error, or None when the kubelet answered (the
        attach holds, or the kubelet reported an error of its own, such as a stopped container) or
        nothing could be told."""
        try:
            upgrade_within = min(self.options.api_timeout, _LOST_CHECK_UPGRADE)
            stream = self._open_attach(self._client(), pod_name, stdin=False, upgrade_within=upgrade_within)
        except Exception as exc:
            text = _api_error_text(exc)
            return _status_message(text) if kubelet_unreachable(text) else None
        error = bytearray()
        ws: Any = getattr(stream, "sock", None)
        deadline = time.monotonic() + _LOST_CHECK_WAIT
        try:
            while ws is not None and (left := deadline - time.monotonic()) > 0:
                ws.settimeout(left)
                opcode, frame = ws.recv_data_frame(True)
                if opcode == _OP_CLOSE:
                    break
                data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
                if data[:1] == bytes([_ERROR]):
                    error += data[1:1024]
        except Exception:
            pass  # the wait ran out with the attach holding (or the socket broke): no dial error
        finally:
            _hangup(stream)
        text = error.decode("utf-8", "replace")
        return _status_message(text) if kubelet_unreachable(text) else None

    def _log_lost(self, pod_name: str, node: str, stream_end: str, unreachable: str) -> None:
        first = self.quarantine.suspect(node)
        log.warning(
            "kubernetes: worker pod %s lost with its node %s: its attach stream %s while the API still"
            " says its container runs, and the API server cannot reach the node's kubelet (%s). How"
            " the worker ended is unknown (not killed by this host); its pod is deleted from the API,"
            " and the node's kubelet removes the container when the node is back.%s",
            pod_name,
            node,
            stream_end,
            unreachable,
            f" New worker pods avoid {node} for {self.quarantine.seconds}s." if first else "",
        )

    # -- Runtime protocol ------------------------------------------------------------------------

    async def check(self) -> None:
        try:
            await asyncio.wait_for(self._run_blocking(self._check_blocking), self.options.check_timeout)
        except TimeoutError:
            raise RuntimeUnavailable(
                f"kubernetes: API server at {self._endpoint()} did not answer within"
                f" {self.options.check_timeout}s"
            ) from None

    def _check_blocking(self) -> None:
        api = self._client()
        try:
            api.list_namespaced_pod(
                self.options.namespace,
                label_selector=f"{ROLE_LABEL}=worker",
                limit=1,
                _request_timeout=self.options.check_timeout,
            )
        except Exception as exc:
            raise self._unavailable(f"cannot list pods in namespace {self.options.namespace}", exc) from exc

    async def spawn(self) -> KubernetesSandbox:
        if self._closed:
            raise self._closing(None)
        loop = asyncio.get_running_loop()
        # The launch bounds its own wait for the pod and the worker's answer; this also bounds a
        # hung create or attach.
        bound = self._launch_bound()
        try:
            pod_name, attached = await self._launch(bound)
        except TimeoutError:
            raise SpawnFailed(f"kubernetes: worker pod launch did not finish within {bound}s") from None
        sandbox = KubernetesSandbox(self, pod_name, attached.stream, loop, attached.early)
        await self._adopt_with(sandbox, lambda: probe(sandbox, self.options.probe_timeout, sent=True))
        return sandbox

    def _launch_bound(self) -> float:
        return self.options.spawn_timeout + self.options.api_timeout + self.options.probe_timeout

    async def spawn_supervised(self) -> Supervised:
        """A reusable pod (the reuse mode, ``codemode.runtimes.reuse``): the same pod, with
        ``codemode_worker.supervisor`` as PID 1; one attach for the pod's whole life.

        Returns:
            The started pod, its supervisor not yet greeted (``Supervised.started``).

        Raises:
            RuntimeUnavailable: the runtime is closed or the API server cannot create pods.
            SpawnFailed: this pod did not start in time.
        """
        if self._closed:
            raise self._closing(None)
        loop = asyncio.get_running_loop()
        bound = self._launch_bound()
        try:
            pod_name, attached = await self._launch(bound, True)
        except TimeoutError:
            raise SpawnFailed(f"kubernetes: worker pod launch did not finish within {bound}s") from None
        raw = KubernetesSandbox(self, pod_name, attached.stream, loop, attached.early)
        box = Supervised(raw, end_timeout=self.options.end_timeout)
        await self._adopt_with(raw, lambda: box.started(self.options.probe_timeout, sent=True))
        return box

    def _log_spawn_failure(self, sandbox: KubernetesSandbox, exc: SpawnFailed, info: ExitInfo) -> None:
        log.warning(
            "kubernetes: worker %s failed to start: %s (exit %s, oom %s, stderr %r, error %r)",
            sandbox.worker_id,
            exc,
            info.exit_code,
            info.oom_killed,
            info.stderr_tail[-512:],
            sandbox.error_channel[-512:],
        )

    def _discard_blocking(self, pod_name: str, attached: Any) -> None:
        _hangup(attached.stream)
        self._delete_blocking(pod_name)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Launches in flight see _closed and delete their own pod.
        await self._destroy_all(self.options.api_timeout)
        # Belt and braces: any pod of this runtime object that escaped the bookkeeping (bounded: the
        # API server may be the reason we are closing).
        if self._created_any:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._run_blocking(self._sweep_own_blocking), self.options.api_timeout)
        self._executor.shutdown(wait=False)
        api, self._api = self._api, None
        if api is not None and self._owns_api:
            with contextlib.suppress(Exception):
                api.api_client.close()

    def _sweep_own_blocking(self) -> None:
        if self._api is None:
            return
        found = self._api.list_namespaced_pod(
            self.options.namespace,
            label_selector=f"{INSTANCE_LABEL}={self.instance_id}",
            _request_timeout=self.options.api_timeout,
        )
        for pod in found.items or []:
            log.warning("kubernetes: deleting leftover worker pod %s at close", pod.metadata.name)
            self._delete_blocking(pod.metadata.name)
