"""The embedded default runtime: one fresh local Python process per execute.

``sys.executable -I -m codemode_worker`` with an environment holding only the worker marker, no
inherited file descriptors beyond stdio, its own session, and rlimits (address space, CPU seconds,
no core files, file size 0, few open files). Good for development and single-user stdio; it is not
tenant isolation — use the Docker or Kubernetes runtime for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import resource
import signal
import sys
from collections.abc import Callable, Sequence

from codemode_worker import WORKER_ENV_MARKER

from .base import ExitInfo, SandboxClosed, SpawnFailed
from .handshake import probe

__all__ = ["ProcessRuntime", "ProcessSandbox"]

STDERR_TAIL = 8 * 1024
_ids = itertools.count(1)


class ProcessSandbox:
    """A worker child process reached through its stdin/stdout pipes."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        worker_id: str,
        on_reaped: Callable[[ProcessSandbox], None] | None = None,
    ) -> None:
        self._proc = proc
        self._on_reaped = on_reaped
        self._id = worker_id
        self._stderr = bytearray()
        self._exit: ExitInfo | None = None
        self._destroying: asyncio.Future[ExitInfo] | None = None
        assert proc.stderr is not None
        self._stderr_task = asyncio.get_running_loop().create_task(self._drain_stderr(proc.stderr))

    @property
    def worker_id(self) -> str:
        return self._id

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        # Keep only a bounded tail for host logs; reading it all keeps the pipe from filling.
        while True:
            chunk = await stream.read(64 * 1024)
            if not chunk:
                return
            self._stderr += chunk
            if len(self._stderr) > STDERR_TAIL:
                del self._stderr[: len(self._stderr) - STDERR_TAIL]

    async def write(self, data: bytes) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.is_closing() or self._exit is not None:
            raise SandboxClosed(self._id)
        try:
            stdin.write(data)
            await stdin.drain()
        except (ConnectionError, RuntimeError, OSError) as exc:
            raise SandboxClosed(self._id) from exc

    async def read(self, max_bytes: int) -> bytes:
        stdout = self._proc.stdout
        if stdout is None or self._exit is not None:
            return b""
        try:
            return await stdout.read(max_bytes)
        except (ConnectionError, OSError):
            return b""

    async def close_input(self) -> None:
        stdin = self._proc.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
            with contextlib.suppress(ConnectionError, OSError):
                await stdin.wait_closed()

    def alive(self) -> bool:
        return self._exit is None and self._proc.returncode is None

    async def destroy(self) -> ExitInfo:
        if self._destroying is None:
            self._destroying = asyncio.get_running_loop().create_future()
            try:
                info = await self._destroy_once()
            except BaseException as exc:
                info = ExitInfo(exit_code=None)
                self._destroying.set_result(info)
                if isinstance(exc, Exception):
                    return info
                raise
            self._destroying.set_result(info)
            return info
        return await asyncio.shield(self._destroying)

    async def _destroy_once(self) -> ExitInfo:
        proc = self._proc
        with contextlib.suppress(Exception):
            await self.close_input()
        if proc.returncode is None:
            # The worker leads its own session; kill the whole group in case it forked. Not
            # proc.kill(): Popen.send_signal polls first and would reap the child behind asyncio's
            # watcher, losing the exit status.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            except PermissionError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        # A paused stdout pipe (nobody reading a flooding worker) would keep the transport, and so
        # wait(), from finishing: discard what is left until EOF, which comes once the worker is dead.
        drain = asyncio.get_running_loop().create_task(_discard(proc.stdout))
        code = await proc.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(drain, 1.0)
        drain.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._stderr_task, 1.0)
        self._stderr_task.cancel()
        sig = -code if code < 0 else None
        info = ExitInfo(
            exit_code=code if code >= 0 else None,
            signal=sig,
            cpu_limited=sig == signal.SIGXCPU,
            stderr_tail=bytes(self._stderr),
        )
        self._exit = info
        if self._on_reaped is not None:
            self._on_reaped(self)
        return info


async def _discard(stream: asyncio.StreamReader | None) -> None:
    if stream is None:
        return
    while await stream.read(256 * 1024):
        pass


class ProcessRuntime:
    """Spawns ``python -I -m codemode_worker`` children."""

    def __init__(
        self,
        *,
        python: str | None = None,
        address_space_bytes: int = 2 * 1024**3,
        cpu_seconds: float = 30.0,
        open_files: int = 32,
        spawn_timeout: float = 10.0,
        module: str = "codemode_worker",
        extra_env: dict[str, str] | None = None,
        argv: Sequence[str] | None = None,
    ) -> None:
        self.python = python or sys.executable
        self.address_space_bytes = address_space_bytes
        self.cpu_seconds = cpu_seconds
        self.open_files = open_files
        self.spawn_timeout = spawn_timeout
        self.module = module
        self.extra_env = dict(extra_env or {})
        self.argv = list(argv) if argv is not None else None
        self._live: set[ProcessSandbox] = set()

    @property
    def name(self) -> str:
        return "process"

    def command(self) -> Sequence[str]:
        """The worker command; ``argv`` replaces it entirely (tests run fake workers this way)."""
        if self.argv is not None:
            return self.argv
        return [self.python, "-I", "-m", self.module]

    def _preexec(self) -> None:  # runs in the child between fork and exec
        cpu = max(1, math.ceil(self.cpu_seconds))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))
        if self.address_space_bytes > 0:
            resource.setrlimit(resource.RLIMIT_AS, (self.address_space_bytes, self.address_space_bytes))

    async def start(self) -> None:
        return None

    async def check(self) -> None:
        return None

    async def spawn(self) -> ProcessSandbox:
        env = {WORKER_ENV_MARKER: "1", **self.extra_env}
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                close_fds=True,
                start_new_session=True,
                preexec_fn=self._preexec,
                cwd="/",
            )
        except OSError as exc:
            raise SpawnFailed(f"cannot start worker process: {exc}") from exc
        sandbox = ProcessSandbox(proc, f"proc-{os.getpid()}-{next(_ids)}", self._live.discard)
        self._live.add(sandbox)
        try:
            await probe(sandbox, self.spawn_timeout)
        except BaseException:
            await sandbox.destroy()
            raise
        return sandbox

    async def aclose(self) -> None:
        await asyncio.gather(*(s.destroy() for s in list(self._live)), return_exceptions=True)
