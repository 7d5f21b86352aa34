"""The Docker runtime: one hardened, single-use container per execute, through the Docker Engine API.

Every worker container is created with::

    network_mode=none, read_only rootfs, memory = memory+swap limit, CPU quota (NanoCpus),
    pids limit, cap_drop=ALL, no-new-privileges, the worker's seccomp profile (``seccomp_profile``:
    derived from the worker's own filter, which the worker installs on top), a numeric non-root
    user, no volumes, an environment holding only the worker marker, ulimits nofile/core, a private
    IPC namespace without /dev/shm, a read-only /dev/mqueue, the machine's counters in /proc and
    /sys masked (``masked_paths``), the log driver ``none`` (the
    protocol runs over the attach stream; a ``json-file`` log would store everything the worker
    prints on the host's disk, ~36 bytes per 2-byte line, until the container is removed), and
    labels naming the owner.

The worker's stdin/stdout/stderr are attached (one hijacked HTTP connection) *before* the container
starts, so no output can be lost. Docker multiplexes stdout and stderr on that connection in frames
with an 8-byte header (``>BxxxL``: stream 1 = stdout, 2 = stderr) that do not respect protocol
frame boundaries; the sandbox demultiplexes them: stdout into a bounded buffer that ``read()``
drains (a full buffer stops reading, which back-pressures the worker), stderr into a bounded tail
kept for host logs only. On a plain (unix or TCP) socket the event loop reads the connection itself
and sends small writes straight from the loop (no thread hop per native call); a TLS connection
keeps a reader thread per sandbox and sends through the pool.

``destroy()`` closes the streams, kills the container if it still runs, waits for it, reads
``State.OOMKilled`` and the exit code, and removes it, exactly once, whatever happened before; it
never raises. ``start()`` removes worker containers orphaned by a crashed host (see docs/docker.md).

All Docker SDK calls (and a write the socket cannot take at once) are blocking; they run on a small
thread pool owned by the runtime. The client
has timeouts, so a dead or hung daemon gives ``RuntimeUnavailable`` rather than a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from codemode_worker import PROTOCOL_VERSION, WORKER_ENV_MARKER

from .base import ExitInfo, RuntimeUnavailable, SpawnFailed
from .masked_paths import MASKED_PATHS
from .seccomp_profile import docker_profile, supervisor_profile
from .streams import STDERR_TAIL as STDERR_TAIL
from .streams import STDOUT_BUFFER, BlockingRuntime, HostIdentity, LaunchHandoff, ThreadedStreamSandbox
from .streams import process_start as _process_start
from .supervised import Supervised, supervisor_command
from .testing import TESTING_ENTRY, TESTING_ENV
from .testing import WARNING as TESTING_WARNING

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_LABEL_PREFIX",
    "DEFAULT_MEMORY_BYTES",
    "IMAGE_PROTOCOL_LABEL",
    "IMAGE_ROLE_LABEL",
    "TESTING_ENTRY",
    "WORKER_USER",
    "CleanupMode",
    "DockerRuntime",
    "DockerSandbox",
]

log = logging.getLogger("codemode.runtimes.docker")

#: The worker image; its tag is the protocol version it speaks.
DEFAULT_IMAGE = f"codemode-worker:{PROTOCOL_VERSION}"
#: Image labels set by worker_image/Dockerfile and checked by ``check()``.
IMAGE_PROTOCOL_LABEL = "io.codemode.protocol-version"
IMAGE_ROLE_LABEL = "io.codemode.role"
#: The numeric non-root user every worker runs as.
WORKER_USER = "65532:65532"

DEFAULT_LABEL_PREFIX = "io.codemode"
DEFAULT_MEMORY_BYTES = 256 * 1024 * 1024
_HEADER = struct.Struct(">BxxxL")
_RECV = 64 * 1024

# Docker mounts a writable mqueue filesystem at /dev/mqueue, and gVisor mounts a writable tmpfs at
# /tmp unless the spec has a /tmp mount: shadow both with tiny read-only, empty tmpfs mounts.
_READ_ONLY_TMPFS = {
    "/dev/mqueue": "ro,nosuid,nodev,noexec,size=4k,mode=0555",
    "/tmp": "ro,nosuid,nodev,noexec,size=4k,mode=0555",
}

#: No container log: the host reads the worker's output on the attach stream (stderr into a bounded
#: tail) and nothing reads ``docker logs`` of a worker.
_NO_LOG = {"Type": "none", "Config": {}}
#: ``--security-opt seccomp=<json>`` of every worker container (the profile's text, not a path).
_SECCOMP_OPT = "seccomp=" + json.dumps(docker_profile(), separators=(",", ":"))
#: The same for a reusable sandbox (the reuse mode): its PID 1 supervisor forks, waits and scrubs.
_SUPERVISOR_SECCOMP_OPT = "seccomp=" + json.dumps(supervisor_profile(), separators=(",", ":"))

CleanupMode = Literal["dead", "all", "none"]
_RemoveOutcome = Literal["removed", "gone", "failed"]


# ----------------------------------------------------------------------------------- owner identity


#: Identity of this host process, recorded in every container's labels.
_OWNER = HostIdentity()
# A forked child is another host process: it gets its own owner id.
os.register_at_fork(after_in_child=_OWNER.refresh)


# ----------------------------------------------------------------------------------- helpers


def _api_error_text(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return str(explanation or exc)


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    if isinstance(code, int):
        return code
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def _is_not_found(exc: BaseException) -> bool:
    import docker.errors

    return isinstance(exc, docker.errors.NotFound) or _status(exc) == 404


def _is_connection_error(exc: BaseException) -> bool:
    import docker.errors
    import requests.exceptions

    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return True
    # APIClient(version="auto") wraps connection failures in a plain DockerException.
    return type(exc) is docker.errors.DockerException


class _Demux:
    """Docker's stdout/stderr multiplexing on an attach stream: frames with an 8-byte header
    (``>BxxxL``: stream 1 = stdout, 2 = stderr) that do not respect protocol frame boundaries."""

    __slots__ = ("header", "remaining", "stream")

    def __init__(self) -> None:
        self.header = bytearray()
        self.stream = 0
        self.remaining = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The (stream, payload) pieces in ``data``; partial headers and payloads carry over."""
        out: list[tuple[int, bytes]] = []
        i, n = 0, len(data)
        while i < n:
            if self.remaining == 0:
                take = min(_HEADER.size - len(self.header), n - i)
                self.header += data[i : i + take]
                i += take
                if len(self.header) < _HEADER.size:
                    break
                self.stream, self.remaining = _HEADER.unpack(self.header)
                self.header.clear()
                continue
            take = min(self.remaining, n - i)
            out.append((self.stream, data[i : i + take]))
            i += take
            self.remaining -= take
        return out


def _loop_readable(sock: Any) -> bool:
    """Whether the event loop can read (and write) this attach socket itself: a plain socket.
    TLS connections (``DOCKER_TLS_VERIFY``) keep the reader thread."""
    return type(sock) is socket.socket


# ----------------------------------------------------------------------------------- sandbox


def _close_attach(attach: Any) -> None:
    """Close an attach stream from ``attach_socket``: the SDK's wrapper and the socket under it
    (closing only the wrapper leaves the connection open)."""
    sock = getattr(attach, "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()
    with contextlib.suppress(Exception):
        attach.close()


class DockerSandbox(ThreadedStreamSandbox["DockerRuntime"]):
    """One worker container reached through its attached stdin/stdout."""

    _log = log
    _kind = "docker"
    _send_errors: ClassVar[tuple[type[Exception], ...]] = (OSError,)
    _read_errors: ClassVar[tuple[type[Exception], ...]] = (OSError, ValueError)

    def __init__(
        self,
        runtime: DockerRuntime,
        container_id: str,
        attach: Any,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """One started worker container (made by :meth:`DockerRuntime.spawn`).

        Args:
            runtime: the runtime that owns it.
            container_id: the container.
            attach: the SDK's attach stream to its stdin/stdout.
            loop: the event loop that reads it.
        """
        self.container_id = container_id
        self._attach = attach  # keep the SDK object (and the response it pins) alive
        self._sock: socket.socket = getattr(attach, "_sock", attach)
        with contextlib.suppress(OSError):
            self._sock.settimeout(None)
        self.removed = False
        super().__init__(
            runtime, f"docker-{container_id[:12]}", loop, f"codemode-docker-reader-{container_id[:12]}"
        )

    # -- extras ----------------------------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Worker stdout received but not yet read (bounded by ``stdout_buffer_bytes`` + 64 KiB)."""
        with self._cond:
            return len(self._out)

    # -- transport -------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        self._sock.sendall(data)

    async def _half_close(self) -> None:
        self._shutdown_write()

    def _shutdown_input(self) -> None:
        if self._input_closed:
            return
        self._input_closed = True
        self._shutdown_write()

    def _shutdown_write(self) -> None:
        # Half-close: the daemon closes the container's stdin (StdinOnce) and keeps streaming output.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def _pump(self) -> None:
        # The reader thread (TLS attach streams only): demultiplex stdout from stderr.
        demux = _Demux()
        while True:
            data = self._sock.recv(_RECV)
            if not data:
                return
            for stream, chunk in demux.feed(data):
                if stream == 1:
                    # Waits while the buffer is full; while being destroyed it keeps draining (and
                    # discarding): the daemon won't finish removing a container whose output blocks.
                    self._push_stdout(chunk, wait_for_room=True)
                else:  # 2 = stderr; anything else is not expected: keep it with stderr
                    self._push_tail(self._stderr, chunk)

    # -- reading on the event loop (plain sockets: no thread hop per chunk) --------------------

    def _start_reading(self, reader_name: str) -> None:
        # The loop reads the socket itself only when this is set up on the loop's own thread.
        self._on_loop = _loop_readable(self._sock) and self._loop_thread is not None
        if not self._on_loop:
            super()._start_reading(reader_name)
            return
        self._demux = _Demux()
        self._fd = self._sock.fileno()
        self._reading = False  # registered with the loop (loop thread only)
        self._ended = False  # the stream has ended; never read again (loop thread only)
        #: Set once the loop will never read the socket again (it may be closed from then on).
        self._unregistered = threading.Event()
        self._resume()

    def _resume(self) -> None:
        """Read again (loop thread): at start, after ``read()`` made room, when destroying."""
        if self._reading or self._ended:
            return
        try:
            self._loop.add_reader(self._fd, self._on_readable)
        except (OSError, ValueError, RuntimeError):  # the socket or the loop is gone
            self._end_reading()
            return
        self._reading = True

    def _room_made(self) -> None:
        if not self._on_loop:
            super()._room_made()
        elif threading.get_ident() == self._loop_thread:
            self._resume()
        else:  # _begin_destroy on the runtime's pool: resume so the rest is drained and discarded
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._resume)

    def _on_readable(self) -> None:
        try:
            data = self._sock.recv(_RECV, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._end_reading()
            return
        for stream, chunk in self._demux.feed(data):
            if stream == 1:
                self._push_stdout(chunk)  # discarded while being destroyed
            else:  # 2 = stderr; anything else is not expected: keep it with stderr
                self._push_tail(self._stderr, chunk)
        with self._cond:
            full = len(self._out) >= self._out_limit and not self._closing
        if full and self._reading:
            # Bounded: stop reading until read() makes room (TCP back-pressure to the worker).
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _end_reading(self) -> None:
        if self._reading:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
            self._reading = False
        self._ended = True
        with self._cond:
            self._eof = True
            self._cond.notify_all()
        self._notify()
        self._unregistered.set()

    def _send_now(self, data: bytes) -> int:
        # Most frames fit the socket buffer: sent from the loop; the rest (a full socket buffer)
        # goes through the pool, blocking there. TLS connections send everything from the pool.
        if not self._on_loop:
            return 0
        try:
            return self._sock.send(data, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0

    def _stop_reader(self) -> None:
        # The container is gone, so its stream has ended or is about to: give the reader a moment
        # to collect the rest of stderr, then cut the connection.
        if self._on_loop and threading.get_ident() == self._loop_thread:
            # Run inline on the loop (the runtime's pool is shut down): nothing else will read.
            self._input_closed = True
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._end_reading()
            self._close_socket()
            return
        if self._on_loop and self._loop.is_closed():
            # The loop that read the socket is gone (nothing is registered any more).
            self._unregistered.set()
        if self._on_loop:
            self._unregistered.wait(0.5)
        else:
            self._reader.join(timeout=0.5)
        self._input_closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self._on_loop:
            # The loop sees the end of the stream and stops reading; only then may the socket close
            # (a closed descriptor left registered with the loop could be reused under it).
            if not self._unregistered.wait(2.0):
                with contextlib.suppress(RuntimeError):  # a closed loop reads nothing any more
                    self._loop.call_soon_threadsafe(self._end_reading)
                self._unregistered.wait(1.0)
        else:
            self._reader.join(timeout=2.0)
        self._close_socket()

    def _close_socket(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(Exception):
            self._attach.close()

    def _destroy_blocking(self) -> ExitInfo:
        """Close, kill if running, wait, inspect, remove. Runs once, on the runtime's pool.

        A worker whose output stream already ended has exited (or is exiting): wait for it, read
        ``State.OOMKilled`` and ``State.ExitCode``, remove it. A worker still running is killed by
        the host: ``remove(force=True)`` kills (SIGKILL) and removes in one call, and the exit is
        reported as SIGKILL (137) without asking the daemon.
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
                with contextlib.suppress(Exception):
                    api.wait(cid, timeout=rt.wait_timeout)
                state = api.inspect_container(cid).get("State") or {}
                oom = bool(state.get("OOMKilled"))
                code = state.get("ExitCode")
                if isinstance(code, int) and not state.get("Running"):
                    exit_code = code
            except Exception as exc:
                if not _is_not_found(exc):
                    log.warning("docker: inspecting worker %s failed: %s", self._id, _api_error_text(exc))
            self.removed = rt._remove_blocking(cid) != "failed"
        else:
            outcome = rt._remove_blocking(cid)
            self.removed = outcome != "failed"
            exit_code = 128 + 9 if outcome == "removed" else None
        self._stop_reader()
        return self._finish_destroy(exit_code, None, oom)


# ----------------------------------------------------------------------------------- runtime


class DockerRuntime(BlockingRuntime[DockerSandbox]):
    """Spawns one hardened container per execute from the worker image.

    Args:
        image: worker image (default ``codemode-worker:<protocol version>``).
        memory_bytes: cgroup memory limit; swap is disabled (memory+swap = the same value).
        cpus: CPU quota in CPUs (``NanoCpus``).
        pids_limit: cgroup pids limit (threads count).
        nofile: RLIMIT_NOFILE inside the container (core files are always disabled).
        runtime: OCI runtime name registered with dockerd (e.g. ``"runsc"`` for gVisor), or None.
        base_url: Docker endpoint; default from ``DOCKER_HOST``/``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``,
            else ``unix:///var/run/docker.sock``.
        owner_id: host instance id written to the owner label (default: random per host process).
        label_prefix: prefix of the container labels (``<prefix>.role``, ``<prefix>.owner``, ...).
        cleanup_orphans: what ``start()`` removes: ``"dead"`` (containers whose owner is provably
            dead), ``"all"`` (every worker container not owned by this instance), ``"none"``.
        spawn_timeout: seconds for the worker to answer the probe after start.
        api_timeout: seconds for one Docker API call (connect and read).
        check_timeout: seconds for ``check()`` as a whole.
        wait_timeout: seconds ``destroy()`` waits for a killed container to stop.
        stdout_buffer_bytes: how much worker stdout is buffered before the reader stops reading.
        executor_threads: size of the thread pool that runs blocking Docker calls.
        entrypoint: replaces the image entrypoint (operators' diagnostics and tests only).
        testing_entry: TEST ONLY. Runs ``codemode_worker.testing_entry`` with
            ``CODEMODE_WORKER_TESTING=1``: a worker that executes arbitrary Python. It exists to prove
            the container contains a compromised interpreter; never enable it in a deployment.
        supervisor_entrypoint: the command of a reusable sandbox (``spawn_supervised``, the reuse
            mode; default ``python3 -I -m codemode_worker.supervisor``, with ``--testing`` under
            ``testing_entry``); tests only.
        end_timeout: seconds a reusable sandbox's supervisor has to end an execute's worker, scrub
            and verify before the sandbox is recycled instead.
    """

    def __init__(
        self,
        *,
        image: str = DEFAULT_IMAGE,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        cpus: float = 1.0,
        pids_limit: int = 64,
        nofile: int = 64,
        runtime: str | None = None,
        base_url: str | None = None,
        owner_id: str | None = None,
        label_prefix: str = DEFAULT_LABEL_PREFIX,
        cleanup_orphans: CleanupMode = "dead",
        spawn_timeout: float = 10.0,
        api_timeout: float = 30.0,
        check_timeout: float = 5.0,
        wait_timeout: float = 10.0,
        stdout_buffer_bytes: int = STDOUT_BUFFER,
        executor_threads: int = 32,
        entrypoint: Sequence[str] | None = None,
        testing_entry: bool = False,
        supervisor_entrypoint: Sequence[str] | None = None,
        end_timeout: float = 5.0,
    ) -> None:
        if memory_bytes < 6 * 1024 * 1024:
            raise ValueError("memory_bytes must be at least 6 MiB (Docker's minimum)")
        if cpus <= 0:
            raise ValueError("cpus must be positive")
        if pids_limit <= 0 or nofile <= 0:
            raise ValueError("pids_limit and nofile must be positive")
        if cleanup_orphans not in ("dead", "all", "none"):
            raise ValueError("cleanup_orphans must be 'dead', 'all' or 'none'")
        self.image = image
        self.memory_bytes = memory_bytes
        self.cpus = cpus
        self.pids_limit = pids_limit
        self.nofile = nofile
        self.runtime = runtime
        self.base_url = base_url
        self.owner_id = owner_id
        self.label_prefix = label_prefix
        self.cleanup_orphans: CleanupMode = cleanup_orphans
        self.spawn_timeout = spawn_timeout
        self.api_timeout = api_timeout
        self.check_timeout = check_timeout
        self.wait_timeout = wait_timeout
        self.stdout_buffer_bytes = max(64 * 1024, stdout_buffer_bytes)
        self.testing_entry = testing_entry
        if testing_entry:
            log.warning(TESTING_WARNING, "docker")
            self.entrypoint: list[str] | None = list(TESTING_ENTRY)
        else:
            self.entrypoint = list(entrypoint) if entrypoint is not None else None
        self.supervisor_entrypoint = (
            list(supervisor_entrypoint)
            if supervisor_entrypoint is not None
            else supervisor_command(testing_entry)
        )
        self.end_timeout = end_timeout
        #: Unique per runtime object; lets aclose() sweep this runtime's own containers.
        self.instance_id = uuid.uuid4().hex
        self._init_blocking(executor_threads, "codemode-docker")
        self._api: Any = None
        self._api_lock = threading.Lock()

    # -- labels ----------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "docker" if self.runtime is None else f"docker:{self.runtime}"

    @property
    def owner(self) -> str:
        """The owner id in every worker's labels (this host process's, unless ``owner_id`` is set)."""
        return self.owner_id or _OWNER.id

    def label(self, key: str) -> str:
        """The full name of one of this runtime's labels.

        Args:
            key: the label's own name (``role``, ``owner``, ...).

        Returns:
            ``<label_prefix>.<key>``.
        """
        return f"{self.label_prefix}.{key}"

    def labels(self) -> dict[str, str]:
        """The labels every worker container of this runtime gets.

        Returns:
            Role, owner and the owner's identity (pid, start time, host, boot, PID namespace).
        """
        return {
            self.label("role"): "worker",
            self.label("owner"): self.owner,
            self.label("owner-pid"): str(_OWNER.pid),
            self.label("owner-start"): _OWNER.start,
            self.label("owner-host"): _OWNER.host,
            self.label("owner-boot"): _OWNER.boot,
            self.label("owner-pidns"): _OWNER.pidns,
            self.label("runtime-instance"): self.instance_id,
            self.label("protocol-version"): str(PROTOCOL_VERSION),
        }

    # -- blocking plumbing -----------------------------------------------------------------------

    def _client(self) -> Any:
        """The low-level Docker API client (created on first use, in a worker thread)."""
        with self._api_lock:
            if self._api is None:
                import docker

                try:
                    if self.base_url is None:
                        kwargs = docker.utils.kwargs_from_env()
                        kwargs.setdefault("base_url", "unix:///var/run/docker.sock")
                    else:
                        kwargs = {"base_url": self.base_url}
                    self._api = docker.APIClient(
                        version="auto", timeout=self.api_timeout, max_pool_size=64, **kwargs
                    )
                except Exception as exc:
                    raise RuntimeUnavailable(
                        f"docker daemon unreachable at {self._endpoint()}: {_api_error_text(exc)}"
                    ) from exc
            return self._api

    def _endpoint(self) -> str:
        return self.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"

    def _unavailable(self, what: str, exc: BaseException) -> RuntimeUnavailable:
        return RuntimeUnavailable(f"docker: {what} at {self._endpoint()}: {_api_error_text(exc)}")

    def _remove_blocking(self, cid: str) -> _RemoveOutcome:
        """Remove one container (killing it if it runs). Never raises.

        Returns ``"removed"`` (this call removed it), ``"gone"`` (it was not there any more) or
        ``"failed"`` (logged; left for the ``aclose()`` sweep and the orphan rule).

        ``remove(force=True)`` races with a container that is exiting on its own ("cannot remove -
        ... is not running", 409) and with a removal already under way ("removal ... already in
        progress"): retry the first, wait for the second. A 404 means it is gone already.
        """
        deadline = time.monotonic() + self.wait_timeout + self.api_timeout
        delay = 0.02
        while True:
            try:
                api = self._client()
                api.remove_container(cid, force=True)
                return "removed"
            except Exception as exc:
                if _is_not_found(exc):
                    return "gone"
                text = _api_error_text(exc)
                if "already in progress" in text:
                    if self._wait_gone(cid, deadline):
                        return "removed"
                elif time.monotonic() < deadline and (
                    _status(exc) in (409, 500, 503) or "is not running" in text or _is_connection_error(exc)
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
                if _is_not_found(exc):
                    return True
            time.sleep(0.05)
        return False

    # -- Runtime protocol ------------------------------------------------------------------------

    async def check(self) -> None:
        try:
            await asyncio.wait_for(self._run_blocking(self._check_blocking), self.check_timeout)
        except TimeoutError:
            raise RuntimeUnavailable(
                f"docker daemon at {self._endpoint()} did not answer within {self.check_timeout}s"
            ) from None

    def _check_blocking(self) -> None:
        api = self._client()
        try:
            api.ping()
        except Exception as exc:
            raise self._unavailable("daemon did not answer ping", exc) from exc
        try:
            image = api.inspect_image(self.image)
        except Exception as exc:
            if _is_not_found(exc):
                raise RuntimeUnavailable(
                    f"docker: worker image {self.image!r} not found on the daemon at {self._endpoint()} "
                    "(build it with scripts/provision-docker.sh or docs/docker.md)"
                ) from exc
            raise self._unavailable(f"cannot inspect image {self.image!r}", exc) from exc
        labels = (image.get("Config") or {}).get("Labels") or {}
        version = labels.get(IMAGE_PROTOCOL_LABEL)
        if version != str(PROTOCOL_VERSION):
            raise RuntimeUnavailable(
                f"docker: image {self.image!r} has {IMAGE_PROTOCOL_LABEL}={version!r}, "
                f"this host speaks protocol {PROTOCOL_VERSION}"
            )
        if labels.get(IMAGE_ROLE_LABEL) != "worker":
            raise RuntimeUnavailable(
                f"docker: image {self.image!r} is not labelled {IMAGE_ROLE_LABEL}=worker"
            )
        if self.runtime is not None:
            try:
                runtimes = api.info().get("Runtimes") or {}
            except Exception as exc:
                raise self._unavailable("cannot read daemon info", exc) from exc
            if self.runtime not in runtimes:
                raise RuntimeUnavailable(
                    f"docker: OCI runtime {self.runtime!r} is not registered with the daemon "
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
        owner = labels.get(self.label("owner"), "")
        if labels.get(self.label("role")) != "worker" or owner == self.owner:
            return False
        if self.cleanup_orphans == "all":
            return True
        if self.cleanup_orphans != "dead":
            return False
        host = labels.get(self.label("owner-host"), "")
        boot = labels.get(self.label("owner-boot"), "")
        pidns = labels.get(self.label("owner-pidns"), "")
        same_machine = bool(boot) and boot == _OWNER.boot and bool(pidns) and pidns == _OWNER.pidns
        if same_machine:
            # Same kernel boot and pid namespace: the owner is alive iff its pid runs and is the
            # same process (start time guards against pid reuse).
            try:
                pid = int(labels.get(self.label("owner-pid"), ""))
            except ValueError:
                return False
            start = labels.get(self.label("owner-start"), "")
            now = _process_start(pid)
            return not now or (bool(start) and now != start)
        # The same host name in another boot or pid namespace: this host was restarted (a rebooted
        # machine, a restarted host container or pod keeps its name), so the old owner is dead. A
        # guess that only this host's start may make: a live peer can share the host name (host
        # networking, a set hostname), and this host can't see into its pid namespace.
        return not proven_only and bool(host) and host == _OWNER.host

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
        return await self._adopt(DockerSandbox(self, cid, attach, loop), self.spawn_timeout)

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
        box = Supervised(raw, end_timeout=self.end_timeout)
        await self._adopt_with(raw, lambda: box.started(self.spawn_timeout))
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
        _close_attach(attach)
        self._remove_blocking(cid)

    def _launch_blocking(self, handoff: LaunchHandoff, supervised: bool = False) -> tuple[str, Any]:
        """create -> attach -> start; removes the container again on any failure."""
        api = self._client()
        cid: str | None = None
        attach: Any = None
        try:
            host_config = api.create_host_config(
                network_mode="none",
                read_only=True,
                mem_limit=self.memory_bytes,
                memswap_limit=self.memory_bytes,
                nano_cpus=int(self.cpus * 1e9),
                pids_limit=self.pids_limit,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges", _SUPERVISOR_SECCOMP_OPT if supervised else _SECCOMP_OPT],
                ulimits=[
                    {"Name": "nofile", "Soft": self.nofile, "Hard": self.nofile},
                    {"Name": "core", "Soft": 0, "Hard": 0},
                ],
                ipc_mode="none",
                tmpfs=dict(_READ_ONLY_TMPFS),
                log_config=_NO_LOG,
                privileged=False,
                runtime=self.runtime,
            )
            host_config["MaskedPaths"] = list(MASKED_PATHS)  # the machine's counters (masked_paths)
            env = {WORKER_ENV_MARKER: "1"}
            if self.testing_entry:
                env[TESTING_ENV] = "1"
            entrypoint = self.supervisor_entrypoint if supervised else self.entrypoint
            labels = self.labels()
            if supervised:
                labels[self.label("mode")] = "reuse"
            created = api.create_container(
                self.image,
                entrypoint=entrypoint,
                command=[] if entrypoint is not None else None,
                stdin_open=True,
                tty=False,
                user=WORKER_USER,
                environment=env,
                labels=labels,
                working_dir="/",
                hostname="worker",
                network_disabled=True,
                host_config=host_config,
            )
            cid = created["Id"]
            attach = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            api.start(cid)
        except Exception as exc:
            if attach is not None:
                _close_attach(attach)
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
        text = _api_error_text(exc)
        if _is_connection_error(exc):
            return RuntimeUnavailable(f"docker daemon unreachable at {self._endpoint()}: {text}")
        lowered = text.lower()
        if _is_not_found(exc) and ("image" in lowered or self.image in text):
            return RuntimeUnavailable(
                f"docker: worker image {self.image!r} not found (build it with scripts/provision-docker.sh)"
            )
        if "unknown runtime" in lowered:
            return RuntimeUnavailable(f"docker: OCI runtime {self.runtime!r} is not registered: {text}")
        return SpawnFailed(f"docker: cannot start a worker container: {text}")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Launches still in flight (a cancelled spawn, a pool refill) remove their own container.
        await self._destroy_all(self.api_timeout)
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
