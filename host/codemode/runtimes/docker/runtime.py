"""The Docker runtime: one hardened, single-use container per execute, through the Docker Engine API
(docs/docker.md; the options: ``DockerOptions``, docs/reference/runtimes.md).

``DockerRuntime`` creates each worker container (``container``: its hardening), attaches to it
before it starts (``attach``: the attach stream; ``DockerSandbox`` adds ``destroy()``), and
answers for the daemon:
``check()`` (the daemon, the image's labels, the OCI runtime), ``start()`` (the orphans of a crashed
host, ``_orphans``) and ``aclose()``.

All Docker SDK calls (and a write the socket cannot take at once) are blocking; they run on a small
thread pool owned by the runtime. The client has timeouts, so a dead or hung daemon gives
``RuntimeUnavailable`` rather than a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from codemode_worker import PROTOCOL_VERSION

from ..base import ExitInfo, RuntimeUnavailable, SpawnFailed
from ..reuse.supervised import Supervised
from ..streams import BlockingRuntime, LaunchHandoff
from ..testing import WARNING as TESTING_WARNING
from ._api_errors import api_error_text, is_connection_error, is_not_found, status
from ._orphans import OWNER, is_orphan, owner_labels
from .attach import AttachedContainer, close_attach
from .container import IMAGE_PROTOCOL_LABEL, IMAGE_ROLE_LABEL, create_args, host_config
from .options import DockerOptions

__all__ = ["DockerRuntime", "DockerSandbox"]

log = logging.getLogger("codemode.runtimes.docker")

_RemoveOutcome = Literal["removed", "gone", "failed"]


def _clean_exit(waited: Any) -> bool:
    """Whether a ``wait`` answer says the container's process exited 0."""
    return isinstance(waited, dict) and waited.get("StatusCode") == 0 and not waited.get("Error")


class DockerSandbox(AttachedContainer["DockerRuntime"]):
    """One worker container reached through its attached stdin/stdout; ``destroy()`` closes the
    streams, kills the container if it still runs, waits for it, reads ``State.OOMKilled`` and the
    exit code (not for a single-use worker that exited 0: below), and removes it, exactly once,
    whatever happened before; it never raises.

    A single-use worker is the container's only process (the container's seccomp profile lets it
    start threads only), and the OOM killer ends it with SIGKILL (137): one that exited 0 was not
    OOM-killed, so its ``State.OOMKilled`` is not read (one API call less per container). A
    reusable sandbox's supervisor forks workers, so its container's state is always read.
    """

    #: The container runs one single-use worker (False: a reusable sandbox's supervisor).
    single_worker = True

    def _destroy_blocking(self) -> ExitInfo:
        """Close, kill if running, wait, inspect, remove. Runs once, on the runtime's pool.

        A worker whose output stream already ended has exited (or is exiting): wait for it; unless a
        single-use worker exited 0, read ``State.OOMKilled`` and ``State.ExitCode``; remove it. A
        worker still running is killed by the host: ``remove(force=True)`` kills (SIGKILL) and
        removes in one call, and the exit is reported as SIGKILL (137) without asking the daemon.
        """
        rt = self._runtime
        cid = self.container_id
        exit_code: int | None = None
        oom = False
        self._shutdown_input()
        exited = self._begin_destroy()
        if exited:
            try:
                api = rt._client()
                waited: Any = None
                with contextlib.suppress(Exception):
                    waited = api.wait(cid, timeout=rt.options.wait_timeout)
                if self.single_worker and _clean_exit(waited):
                    exit_code = 0
                else:
                    state = api.inspect_container(cid).get("State") or {}
                    oom = bool(state.get("OOMKilled"))
                    code = state.get("ExitCode")
                    if isinstance(code, int) and not state.get("Running"):
                        exit_code = code
            except Exception as exc:
                if not is_not_found(exc):
                    log.warning("docker: inspecting worker %s failed: %s", self._id, api_error_text(exc))
            self.removed = rt._remove_blocking(cid) != "failed"
        else:
            outcome = rt._remove_blocking(cid)
            self.removed = outcome != "failed"
            exit_code = 128 + 9 if outcome == "removed" else None
        self._stop_reader()
        return self._finish_destroy(exit_code, None, oom)


class DockerRuntime(BlockingRuntime[DockerSandbox]):
    """Spawns one hardened container per execute from the worker image.

    Args:
        options: every option of the runtime (``DockerOptions``; default: its defaults).
    """

    def __init__(self, options: DockerOptions | None = None) -> None:
        if options is None:
            options = DockerOptions()
        elif not isinstance(options, DockerOptions):
            raise TypeError(f"DockerRuntime takes a DockerOptions, got {type(options).__name__}")
        #: The options, whole (frozen).
        self.options = options
        self.cleanup_orphans = options.cleanup_orphans
        self.stdout_buffer_bytes = max(64 * 1024, options.stdout_buffer_bytes)
        if options.testing_entry:
            log.warning(TESTING_WARNING, "docker")
        #: Unique per runtime object; lets aclose() sweep this runtime's own containers.
        self.instance_id = uuid.uuid4().hex
        self._init_blocking(options.executor_threads, "codemode-docker")
        self._api: Any = None
        self._api_lock = threading.Lock()

    # -- labels ----------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        oci = self.options.oci_runtime
        return "docker" if oci is None else f"docker:{oci}"

    @property
    def memory_limited(self) -> bool:
        """Every worker container runs under a cgroup memory limit (``options.memory``), so a worker
        that died of an allocation failure hit it (``MemoryLimited``)."""
        return True

    @property
    def owner(self) -> str:
        """The owner id in every worker's labels (this host process's, unless ``options.owner`` is set)."""
        return self.options.owner or OWNER.id

    def label(self, key: str) -> str:
        """The full name of one of this runtime's labels.

        Args:
            key: the label's own name (``role``, ``owner``, ...).

        Returns:
            ``<label_prefix>.<key>``.
        """
        return f"{self.options.label_prefix}.{key}"

    def labels(self) -> dict[str, str]:
        """The labels every worker container of this runtime gets.

        Returns:
            Role, owner and the owner's identity (pid, start time, host, boot, PID namespace).
        """
        return owner_labels(self.options.label_prefix, self.owner, self.instance_id)

    # -- blocking plumbing -----------------------------------------------------------------------

    def _client(self) -> Any:
        """The low-level Docker API client (created on first use, in a worker thread)."""
        with self._api_lock:
            if self._api is None:
                import docker

                try:
                    if self.options.base_url is None:
                        kwargs = docker.utils.kwargs_from_env()
                        kwargs.setdefault("base_url", "unix:///var/run/docker.sock")
                    else:
                        kwargs = {"base_url": self.options.base_url}
                    self._api = docker.APIClient(
                        version="auto", timeout=self.options.api_timeout, max_pool_size=64, **kwargs
                    )
                except Exception as exc:
                    raise RuntimeUnavailable(
                        f"docker daemon unreachable at {self._endpoint()}: {api_error_text(exc)}"
                    ) from exc
            return self._api

    def _endpoint(self) -> str:
        return self.options.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"

    def _unavailable(self, what: str, exc: BaseException) -> RuntimeUnavailable:
        return RuntimeUnavailable(f"docker: {what} at {self._endpoint()}: {api_error_text(exc)}")

    def _remove_blocking(self, cid: str) -> _RemoveOutcome:
        """Remove one container (killing it if it runs). Never raises.

        Returns ``"removed"`` (this call removed it), ``"gone"`` (it was not there any more) or
        ``"failed"`` (logged; left for the ``aclose()`` sweep and the orphan rule).

        ``remove(force=True)`` races with a container that is exiting on its own ("cannot remove -
        ... is not running", 409) and with a removal already under way ("removal ... already in
        progress"): retry the first, wait for the second. A 404 means it is gone already.
        """
        deadline = time.monotonic() + self.options.wait_timeout + self.options.api_timeout
        delay = 0.02
        while True:
            try:
                api = self._client()
                api.remove_container(cid, force=True, v=True)  # v: an image VOLUME's anonymous volume
                return "removed"
            except Exception as exc:
                if is_not_found(exc):
                    return "gone"
                text = api_error_text(exc)
                if "already in progress" in text:
                    if self._wait_gone(cid, deadline):
                        return "removed"
                elif time.monotonic() < deadline and (
                    status(exc) in (409, 500, 503) or "is not running" in text or is_connection_error(exc)
                ):
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                log.error("docker: could not remove worker container %s: %s", cid[:12], text)
                return "failed"

    def _wait_gone(self, cid: str, deadline: float) -> bool:
        while time.monotonic() < deadline:
            try:
                self._client().inspect_container(cid)
            except Exception as exc:
                if is_not_found(exc):
                    return True
            time.sleep(0.05)
        return False

    # -- Runtime protocol ------------------------------------------------------------------------

    async def check(self) -> None:
        try:
            await asyncio.wait_for(self._run_blocking(self._check_blocking), self.options.check_timeout)
        except TimeoutError:
            raise RuntimeUnavailable(
                f"docker daemon at {self._endpoint()} did not answer within {self.options.check_timeout}s"
            ) from None

    def _check_blocking(self) -> None:
        api = self._client()
        name, oci = self.options.image, self.options.oci_runtime
        try:
            api.ping()
        except Exception as exc:
            raise self._unavailable("daemon did not answer ping", exc) from exc
        try:
            image = api.inspect_image(name)
        except Exception as exc:
            if is_not_found(exc):
                raise RuntimeUnavailable(
                    f"docker: worker image {name!r} not found on the daemon at {self._endpoint()} "
                    "(build it with scripts/provision-docker.sh or docs/docker.md)"
                ) from exc
            raise self._unavailable(f"cannot inspect image {name!r}", exc) from exc
        labels = (image.get("Config") or {}).get("Labels") or {}
        version = labels.get(IMAGE_PROTOCOL_LABEL)
        if version != str(PROTOCOL_VERSION):
            raise RuntimeUnavailable(
                f"docker: image {name!r} has {IMAGE_PROTOCOL_LABEL}={version!r}, "
                f"this host speaks protocol {PROTOCOL_VERSION}"
            )
        if labels.get(IMAGE_ROLE_LABEL) != "worker":
            raise RuntimeUnavailable(f"docker: image {name!r} is not labelled {IMAGE_ROLE_LABEL}=worker")
        volumes = ", ".join(map(ascii, sorted((image.get("Config") or {}).get("Volumes") or {})))
        if volumes:  # ascii(): the image names them, and this line reaches the operator's terminal
            raise RuntimeUnavailable(
                f"docker: image {name!r} declares VOLUME {volumes}: each would be a writable volume "
                "in every worker; rebuild the image without it (codemode image audit)"
            )
        if oci is not None:
            try:
                runtimes = api.info().get("Runtimes") or {}
            except Exception as exc:
                raise self._unavailable("cannot read daemon info", exc) from exc
            if oci not in runtimes:
                raise RuntimeUnavailable(
                    f"docker: OCI runtime {oci!r} is not registered with the daemon "
                    f"(has: {', '.join(sorted(runtimes)) or 'none'})"
                )

    def is_orphan(self, labels: Mapping[str, str], *, proven_only: bool = False) -> bool:
        """The orphan rule (docs/docker.md): may ``start()`` remove a container with these labels?

        Args:
            labels: the container's labels.
            proven_only: skip the host-name rule, a guess that holds only at this host's start
                (the periodic sweep: ``remove_orphans(proven_only=True)``).

        Returns:
            True for a worker of this label prefix whose owner process is gone.
        """
        return is_orphan(
            labels,
            prefix=self.options.label_prefix,
            owner=self.owner,
            cleanup=self.cleanup_orphans,
            proven_only=proven_only,
        )

    def _remove_orphans_blocking(self, proven_only: bool) -> int:
        api = self._client()
        try:
            found = api.containers(all=True, filters={"label": [f"{self.label('role')}=worker"]})
        except Exception as exc:
            raise self._unavailable("cannot list containers", exc) from exc
        removed = 0
        for c in found:
            labels = c.get("Labels") or {}
            if not self.is_orphan(labels, proven_only=proven_only):
                continue
            cid = c["Id"]
            log.warning(
                "docker: removing orphaned worker container %s (owner %s, pid %s on %s)",
                cid[:12],
                labels.get(self.label("owner")),
                labels.get(self.label("owner-pid")),
                labels.get(self.label("owner-host")),
            )
            if self._remove_blocking(cid) != "failed":
                removed += 1
        return removed

    async def spawn(self) -> DockerSandbox:
        if self._closed:
            raise RuntimeUnavailable("docker runtime is closed")
        loop = asyncio.get_running_loop()
        cid, attach = await self._launch(None)
        return await self._adopt(DockerSandbox(self, cid, attach, loop), self.options.spawn_timeout)

    async def spawn_supervised(self) -> Supervised:
        """A reusable sandbox (the reuse mode, ``codemode.runtimes.reuse``): the same container,
        with ``codemode_worker.supervisor`` as PID 1 and the supervisor's seccomp profile.

        Returns:
            The started container, its supervisor not yet greeted (``Supervised.started``).

        Raises:
            RuntimeUnavailable: the runtime is closed or the daemon cannot create containers.
        """
        if self._closed:
            raise RuntimeUnavailable("docker runtime is closed")
        loop = asyncio.get_running_loop()
        cid, attach = await self._launch(None, True)
        raw = DockerSandbox(self, cid, attach, loop)
        raw.single_worker = False
        box = Supervised(raw, end_timeout=self.options.end_timeout)
        await self._adopt_with(raw, lambda: box.started(self.options.spawn_timeout))
        return box

    def _log_spawn_failure(self, sandbox: DockerSandbox, exc: SpawnFailed, info: ExitInfo) -> None:
        log.warning(
            "docker: worker %s failed to start: %s (exit %s, oom %s, stderr %r)",
            sandbox.worker_id,
            exc,
            info.exit_code,
            info.oom_killed,
            info.stderr_tail[-512:],
        )

    def _discard_blocking(self, cid: str, attach: Any) -> None:
        close_attach(attach)
        self._remove_blocking(cid)

    def _launch_blocking(self, handoff: LaunchHandoff, supervised: bool = False) -> tuple[str, Any]:
        """create -> attach -> start; removes the container again on any failure."""
        api = self._client()
        cid: str | None = None
        attach: Any = None
        try:
            labels = self.labels()
            if supervised:
                labels[self.label("mode")] = "reuse"
            created = api.create_container(
                **create_args(self.options, labels, supervised=supervised),
                host_config=host_config(api, self.options, supervised=supervised),
            )
            cid = created["Id"]
            attach = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            api.start(cid)
        except Exception as exc:
            if attach is not None:
                close_attach(attach)
            if cid is not None:
                self._remove_blocking(cid)
            raise self._launch_error(exc) from exc
        with handoff.lock:
            if not handoff.abandoned:
                handoff.delivered = True
                return cid, attach
        # The spawning coroutine was cancelled meanwhile: nobody will use this container.
        self._discard_blocking(cid, attach)
        raise SpawnFailed("spawn cancelled")

    def _launch_error(self, exc: Exception) -> Exception:
        if isinstance(exc, RuntimeUnavailable | SpawnFailed):
            return exc
        text = api_error_text(exc)
        if is_connection_error(exc):
            return RuntimeUnavailable(f"docker daemon unreachable at {self._endpoint()}: {text}")
        lowered = text.lower()
        image, oci = self.options.image, self.options.oci_runtime
        if is_not_found(exc) and ("image" in lowered or image in text):
            return RuntimeUnavailable(
                f"docker: worker image {image!r} not found (build it with scripts/provision-docker.sh)"
            )
        if "unknown runtime" in lowered:
            return RuntimeUnavailable(f"docker: OCI runtime {oci!r} is not registered: {text}")
        return SpawnFailed(f"docker: cannot start a worker container: {text}")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Launches still in flight (a cancelled spawn, a pool refill) remove their own container.
        await self._destroy_all(self.options.api_timeout)
        # Belt and braces: anything of this runtime object that escaped the bookkeeping.
        with contextlib.suppress(Exception):
            await self._run_blocking(self._sweep_own_blocking)
        self._executor.shutdown(wait=False)
        api, self._api = self._api, None
        if api is not None:
            with contextlib.suppress(Exception):
                api.close()

    def _sweep_own_blocking(self) -> None:
        if self._api is None:
            return
        found = self._api.containers(
            all=True, filters={"label": [f"{self.label('runtime-instance')}={self.instance_id}"]}
        )
        for c in found:
            log.warning("docker: removing leftover worker container %s at close", c["Id"][:12])
            self._remove_blocking(c["Id"])
