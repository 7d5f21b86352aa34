"""The embedded default runtime: one fresh local Python process per execute.

``sys.executable -I -m codemode_worker`` with an environment holding only the worker marker, no
inherited file descriptors beyond stdio, its own session, ``no_new_privs`` (setuid binaries gain
nothing), and rlimits (address space, CPU seconds, no core files, file size 0, no POSIX message
queue, few open files).

When the host runs as root, every live worker also gets a uid (and gid) of its own from an unused
range (``worker_uid_base``, default 1,000,000,000; no supplementary groups), with ``RLIMIT_NPROC``
bounding its processes and threads. That gives three things a same-uid child lacks: it cannot read
the host's environment (``/proc/<host>/environ``) or the host's private (0600) files, it cannot
signal or trace the host or other workers, and the host can find **every** descendant, even one that
forked, called ``setsid()`` and left the session: ``destroy()`` kills the session group, then kills
every process whose real uid is the worker's (a worker cannot change its real uid back), scanning
``/proc`` until none is left, and only then returns the uid to the pool.

Without root there is no uid to drop to: descendants that leave the worker's session survive
``destroy()`` and the worker reads what the host user can read. Either way this is not tenant
isolation (same kernel, network, and a view of every world-readable file): use the Docker or
Kubernetes runtime for untrusted tenants.

How a worker process is made (``spawn``): by default (``"template"``) a worker template
(``codemode_worker.template``, a pre-imported interpreter started like a worker) forks each worker
from its warm state, and the worker confines itself after the fork (``codemode.runtimes.process.template``,
``codemode.runtimes.process.forked``); ``"classic"`` starts ``python -I -m codemode_worker`` for every
worker. Either way every execute gets a fresh process that is killed and reaped exactly once, with
the same limits, uid and filter.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import itertools
import logging
import math
import os
import resource
import signal
import stat
import sys
import time
from collections.abc import Callable, Sequence

import psutil

from codemode_worker import WORKER_ENV_MARKER
from codemode_worker.privileges import UID_VARIABLE

from ..base import ExitInfo, OptionError, RuntimeUnavailable, SandboxClosed, SpawnFailed
from ..handshake import probe
from ..once import DestroyOnce
from . import host_memory
from .forked import ForkedSandbox
from .ipc_cleanup import remove_all_ipc_of
from .options import TEMPLATE_ENTRIES, ProcessOptions, Spawn
from .template import WorkerTemplate, drain_tail

__all__ = [
    "CLOSE_INPUT_GRACE",
    "CONFINEMENT_CHECK",
    "DEFAULT_UID_BASE",
    "ORPHAN_PIPE_GRACE",
    "UID_LOCK_DIR",
    "ZOMBIE_GRACE",
    "ProcessRuntime",
    "ProcessSandbox",
    "kill_uid",
]


log = logging.getLogger("codemode.runtimes.process")

#: First uid (and gid) handed to workers when the host runs as root; none is a real user.
DEFAULT_UID_BASE = 1_000_000_000
_PR_SET_NO_NEW_PRIVS = 38
_KILL_ROUNDS = 100
#: Seconds destroy() waits for the worker's pipes to close after the kill.
ORPHAN_PIPE_GRACE = 2.0
#: Seconds close_input() waits for the worker to take its unread input before dropping it.
CLOSE_INPUT_GRACE = 1.0
#: Seconds kill_uid() waits for the killed processes to be reaped.
ZOMBIE_GRACE = 1.0
#: One lock file per worker uid in use, shared by every host on the machine.
UID_LOCK_DIR = "/run/codemode/worker-uids"
#: What a uid's lock file holds: its holder released it with nothing of it left (``contained``), or
#: it is (or was, for a holder that died) in use.
_UID_CLEAN = b"clean\n"
_UID_HELD = b"held\n"
_ids = itertools.count(1)


def _open_lock(uid: int) -> int:
    """The uid's lock file, opened for its mark: never through a link, and only a plain file."""
    path = os.path.join(UID_LOCK_DIR, str(uid))
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:  # the first claim on this machine (or /run was emptied)
        os.makedirs(UID_LOCK_DIR, mode=0o700, exist_ok=True)
        fd = os.open(path, flags, 0o600)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.geteuid():
        os.close(fd)
        raise SpawnFailed(f"the worker uid lock {path} is not a plain file of this host's user")
    return fd


def _mark(fd: int, mark: bytes) -> None:
    os.pwrite(fd, mark, 0)
    os.ftruncate(fd, len(mark))


_DEAD = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
#: What ``check()`` runs with the worker's Python: the worker's own seccomp filter builds there.
CONFINEMENT_CHECK = "from codemode_worker.confinement import prepare\nprepare()\n"


def _processes_of(uid: int, zombies: bool = False) -> list[int]:
    """Pids of every live process (thread group) whose real uid is ``uid``; zombies (dead, waiting
    to be reaped by their new parent) run nothing and are left out unless ``zombies``."""
    found = []
    for proc in psutil.process_iter(["uids"], ad_value=None):
        uids = proc.info["uids"]
        if uids is None or uids.real != uid:
            continue  # gone meanwhile, or not the uid's
        try:
            if zombies or proc.status() not in _DEAD or _has_live_task(proc.pid):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def _has_live_task(pid: int) -> bool:
    """Whether a thread of ``pid`` other than a dead one runs: a process whose leader thread left
    with the raw ``exit`` call (not ``exit_group``) shows as a zombie while its other threads run."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as task_stat:
                state = task_stat.read().rpartition(b")")[2].split()[:1]
        except OSError:
            continue  # gone meanwhile
        if state and state[0] not in (b"Z", b"X"):
            return True
    return False


def _uids_of(pid: int) -> tuple[int, int] | None:
    """(its uid, its gid) when ``pid``'s real, effective and saved uids are one value and so are its
    gids (the worker drops them together with setresuid/setresgid, which set the filesystem ids to
    the same); None otherwise or when it is gone."""
    try:  # one read of the kernel's status file (psutil reads two and builds objects: ~4x the CPU)
        with open(f"/proc/{pid}/status", "rb") as status:
            text = status.read()
    except OSError:
        return None
    # Lines end in "\n" only: the kernel escapes "\n" in the process name (its first line), not "\r",
    # and the real Uid and Gid lines come after it.
    found: dict[bytes, set[int]] = {}
    for line in text.split(b"\n"):
        for key in (b"Uid:\t", b"Gid:\t"):
            if line.startswith(key):
                try:
                    found[key] = {int(v) for v in line[len(key) :].split()}
                except ValueError:
                    return None
    uids, gids = found.get(b"Uid:\t", set()), found.get(b"Gid:\t", set())
    if len(uids) != 1 or len(gids) != 1:
        return None
    return uids.pop(), gids.pop()


def kill_uid(uid: int) -> bool:
    """SIGKILL every process whose real uid is ``uid`` until none is left (a worker's processes
    cannot change their real uid), then remove the System V IPC objects, POSIX message queues and
    ``/dev/shm`` entries the uid left (``ipc_cleanup.remove_all_ipc_of``). Blocking (scans ``/proc``).

    Args:
        uid: the worker's uid.

    Returns:
        True when no process is left.
    """
    for _ in range(_KILL_ROUNDS):
        pids = _processes_of(uid)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    else:
        if _processes_of(uid):
            return False
    # Zombies still count toward the uid's RLIMIT_NPROC: give init a moment to reap them.
    deadline = time.monotonic() + ZOMBIE_GRACE
    while _processes_of(uid, zombies=True) and time.monotonic() < deadline:
        time.sleep(0.01)
    remove_all_ipc_of(uid)  # nothing of the uid runs any more, so nothing can make new ones
    return True


class ProcessSandbox:
    """A worker child process reached through its stdin/stdout pipes."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        worker_id: str,
        on_reaped: Callable[[ProcessSandbox], None] | None = None,
        uid: int | None = None,
    ) -> None:
        """One started worker process (made by :meth:`ProcessRuntime.spawn`).

        Args:
            proc: the process.
            worker_id: its id for host logs.
            on_reaped: called once it has been reaped.
            uid: the uid it runs as, when it has one of its own.
        """
        self._proc = proc
        self._on_reaped = on_reaped
        self._id = worker_id
        self.uid = uid
        self._stderr = bytearray()
        self._exit: ExitInfo | None = None
        self._destroy = DestroyOnce()
        self.contained = uid is None
        assert proc.stderr is not None
        # Keep only a bounded tail for host logs; reading it all keeps the pipe from filling.
        self._stderr_task = asyncio.get_running_loop().create_task(drain_tail(proc.stderr, self._stderr))

    @property
    def worker_id(self) -> str:
        return self._id

    @property
    def pid(self) -> int:
        """The worker process's id."""
        return self._proc.pid

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
            try:
                # A worker that stops reading would keep unread bytes in the transport, and
                # wait_closed() waiting, forever: give it a moment, then drop them.
                await asyncio.wait_for(stdin.wait_closed(), CLOSE_INPUT_GRACE)
            except TimeoutError:
                self._abort_input()
            except (ConnectionError, OSError):
                pass

    def _abort_input(self) -> None:
        """Close stdin at once, dropping whatever the worker never read."""
        stdin = self._proc.stdin
        if stdin is None:
            return
        transport = stdin.transport
        # A transport already closing with nothing left to write has its close scheduled: aborting
        # it again would make asyncio run that close twice (and report the second one failing).
        if transport.is_closing() and not transport.get_write_buffer_size():
            return
        with contextlib.suppress(Exception):
            transport.abort()

    def alive(self) -> bool:
        return self._exit is None and self._proc.returncode is None

    async def destroy(self) -> ExitInfo:
        return await self._destroy(self._destroy_once)

    async def _destroy_once(self) -> ExitInfo:
        proc = self._proc
        # Nothing is awaited before the kill: a worker that stopped reading its stdin (or a
        # cancellation) must not be able to delay it. Unread input is dropped.
        self._abort_input()
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
        if self.uid is not None:
            # Descendants that left the session (fork + setsid) still run as the worker's uid.
            self.contained = await asyncio.to_thread(kill_uid, self.uid)
        drain = asyncio.get_running_loop().create_task(_discard(proc.stdout))
        try:
            # wait() also waits for EOF on the worker's pipes, which a descendant that escaped the
            # kill (only possible without a uid of its own) could hold open forever.
            code = await asyncio.wait_for(asyncio.shield(proc.wait()), ORPHAN_PIPE_GRACE)
        except TimeoutError:
            log.warning("worker %s: a descendant keeps its pipes open; closing them", self._id)
            transport = getattr(proc, "_transport", None)
            if transport is not None:
                transport.close()
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
    """Makes one local worker process per execute: forked by the worker template (``spawn="template"``,
    the default) or started as ``python -I -m codemode_worker`` (``spawn="classic"``).

    Args (of the constructor):
        options: every option of the runtime (``ProcessOptions``: limits, worker uids, how workers
            are made, the worker's command; checked when they were made). Default:
            ``ProcessOptions()``.

    Raises (the constructor):
        TypeError: ``options`` is not a ``ProcessOptions``.
        OptionError: a uid base on a host not running as root.
    """

    def __init__(self, options: ProcessOptions | None = None) -> None:
        if options is None:
            options = ProcessOptions()
        elif not isinstance(options, ProcessOptions):
            raise TypeError(f"ProcessRuntime takes ProcessOptions, not {type(options).__name__}")
        #: The runtime's options, whole.
        self.options = options
        self.spawn_mode: Spawn = options.spawn_mode
        self.template_argv = list(options.template_argv) if options.template_argv is not None else None
        self._template: WorkerTemplate | None = None
        self._killer_uid: int | None = None
        self._template_lock = asyncio.Lock()
        self.templates_started = 0
        root = os.geteuid() == 0
        worker_uid_base = options.worker_uid_base
        if worker_uid_base is None:
            worker_uid_base = DEFAULT_UID_BASE if root else 0
        if worker_uid_base and not root:
            raise OptionError(
                "worker_uid_base", "worker_uid_base needs a host running as root (use 0 or leave it unset)"
            )
        host_memory.protect()  # before any worker exists: none can read the host's memory
        self.worker_uid_base = worker_uid_base
        self.max_processes = options.max_processes
        self.worker_uids = options.worker_uids
        self._uid_cursor = 0
        self._uid_locks: dict[int, int] = {}
        self._clean_uids: set[int] = set()  # claimed, and released clean by their last holder
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.python = options.python or sys.executable
        self.memory = options.memory
        self.cpu_seconds = options.cpu_seconds
        self.open_files = options.open_files
        self.spawn_timeout = options.spawn_timeout
        self.module = options.module
        self.extra_env = dict(options.extra_env or {})
        self.argv = list(options.argv) if options.argv is not None else None
        self._live: set[ProcessSandbox | ForkedSandbox] = set()
        self._confinement_checked = False

    @property
    def name(self) -> str:
        return "process"

    @property
    def memory_limited(self) -> bool:
        """Whether workers run under an address-space limit (``RLIMIT_AS``; 0: none)."""
        return self.memory > 0

    @property
    def concurrent_refill(self) -> bool:
        """A forked worker costs the host a few system calls, not a fork of itself: a pool starts
        every missing one at once (``runtimes.pool``; the classic spawn: one per CPU at a time)."""
        return self.spawn_mode == "template"

    def command(self) -> Sequence[str]:
        """The worker command; ``argv`` replaces it entirely (tests run fake workers this way).

        Returns:
            The command line.
        """
        if self.argv is not None:
            return self.argv
        return [self.python, "-I", "-m", self.module]

    @property
    def drops_privileges(self) -> bool:
        """Whether workers run under uids of their own (the host runs as root)."""
        return bool(self.worker_uid_base)

    def _preexec(self, uid: int | None) -> None:  # runs in the child between fork and exec
        # No privilege gain through execve (setuid/setgid binaries, file capabilities). Linux only.
        prctl = getattr(self._libc, "prctl", None)
        if prctl is not None:
            prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (self.max_processes, self.max_processes))
        cpu = max(1, math.ceil(self.cpu_seconds))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))  # no POSIX message queue at all
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))
        if self.memory > 0:
            resource.setrlimit(resource.RLIMIT_AS, (self.memory, self.memory))

    async def start(self) -> None:
        return None

    async def check(self) -> None:
        """The worker can confine itself with this Python: libseccomp's binding loads and the filter
        builds (checked once; a worker without it exits before its probe). ``RuntimeUnavailable``
        naming what is missing otherwise. With the template, also that it runs (started when it
        does not: readiness then means the first worker is a fork away)."""
        await self._check_confinement()
        if self.spawn_mode == "template":
            try:
                await self.template()
            except SpawnFailed as exc:
                raise RuntimeUnavailable(f"process runtime: {exc}") from None

    async def _check_confinement(self) -> None:
        if self._confinement_checked or self.argv is not None or self.template_argv is not None:
            return
        proc = await asyncio.create_subprocess_exec(
            self.python,
            "-I",
            "-c",
            CONFINEMENT_CHECK,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={WORKER_ENV_MARKER: "1"},
            cwd="/",
        )
        _, err = await proc.communicate()
        if proc.returncode != 0:
            reason = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            raise RuntimeUnavailable(f"process runtime: {self.python} cannot run a worker: {reason[0]}")
        self._confinement_checked = True

    def template_command(self) -> list[str]:
        """The worker template's command (``--control FD`` follows).

        Returns:
            The worker's Python, the worker's limits, the module it forks.
        """
        if self.template_argv is not None:
            return self.template_argv
        cpu = max(1, math.ceil(self.cpu_seconds))
        return [
            self.python,
            "-I",
            "-m",
            "codemode_worker.template",
            "--cpu-seconds",
            str(cpu),
            "--address-space",
            str(max(0, self.memory)),
            "--open-files",
            str(self.open_files),
            "--max-processes",
            str(self.max_processes),
            *TEMPLATE_ENTRIES[self.module],
        ]

    def _template_preexec(self) -> None:  # runs in the template between fork and exec
        prctl = getattr(self._libc, "prctl", None)
        if prctl is not None:
            prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    async def template(self) -> WorkerTemplate:
        """The running worker template; a new one when there is none or it died.

        Returns:
            The template.
        """
        current = self._template
        if current is not None and not current.gone:
            return current
        async with self._template_lock:
            current = self._template
            if current is not None and not current.gone:
                return current
            if current is not None:
                log.warning("worker template %d died; starting a new one", current.pid)
                await self._close_template()
            env = {WORKER_ENV_MARKER: "1", **self.extra_env}
            command = self.template_command()
            if self.worker_uid_base:
                # A uid nothing runs as, the template's real uid while it kills a worker's uid
                # (codemode_worker.template.UidKiller): held as long as the template lives.
                self._killer_uid = self._claim_uid()
                command = [*command, "--killer-uid", str(self._killer_uid)]
            try:
                self._template = await WorkerTemplate.start(
                    command, env, self._template_preexec, self.spawn_timeout
                )
            except BaseException:
                self._release_killer_uid()
                raise
            self.templates_started += 1
            return self._template

    async def _close_template(self) -> None:
        template, self._template = self._template, None
        if template is not None:
            await template.aclose()
        self._release_killer_uid()

    def _release_killer_uid(self) -> None:
        if self._killer_uid is not None:
            self._release_uid(self._killer_uid)
            self._killer_uid = None

    def _claim_uid(self) -> int:
        """A worker uid no live worker of any host on this machine holds: the one whose lock file
        (``UID_LOCK_DIR``) this runtime could ``flock``; the lock lives as long as the worker (and
        dies with a crashed host). Uids are taken round-robin, so a just-freed one rests longest.
        Whether its last holder released it clean (:meth:`_left_clean`) is read and the file marked
        held before the uid is used."""
        for _ in range(self.worker_uids):
            uid = self.worker_uid_base + self._uid_cursor
            self._uid_cursor = (self._uid_cursor + 1) % self.worker_uids
            fd = _open_lock(uid)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                clean = os.pread(fd, len(_UID_CLEAN) + 1, 0) == _UID_CLEAN
                _mark(fd, _UID_HELD)
            except OSError:
                os.close(fd)
                continue
            self._uid_locks[uid] = fd
            if clean:
                self._clean_uids.add(uid)
            return uid
        raise SpawnFailed("no free worker uid (raise worker_uids)")

    def _left_clean(self, uid: int) -> bool:
        """Whether ``uid``'s last holder (this host or another on the machine) released it clean:
        every process of it killed and what it left removed (a worker's ``contained``). Then nothing
        of the uid can be left, and the clean-up at spawn is skipped; a holder that died, or whose
        worker was not contained, left the file marked held, and the next claim cleans up first.
        Answers once per claim."""
        if uid in self._clean_uids:
            self._clean_uids.discard(uid)
            return True
        return False

    def _release_uid(self, uid: int, clean: bool = False) -> None:
        self._clean_uids.discard(uid)
        fd = self._uid_locks.pop(uid, None)
        if fd is not None:
            if clean:
                with contextlib.suppress(OSError):  # left held: the next claim cleans up
                    _mark(fd, _UID_CLEAN)
            os.close(fd)

    def _released(self, sandbox: ProcessSandbox | ForkedSandbox) -> None:
        self._live.discard(sandbox)
        if sandbox.uid is not None:
            if sandbox.contained:
                # Only the template's kill reaches every process of the uid at once (kill(-1) as the
                # uid); the classic spawn mode's /proc scan can race a fork chain, so its uids are
                # cleaned up again at the next claim.
                self._release_uid(sandbox.uid, clean=isinstance(sandbox, ForkedSandbox))
            else:  # something of it may still run: keep the uid locked while this host lives
                log.error("worker %s: processes of uid %d survived the kill", sandbox.worker_id, sandbox.uid)

    async def _uid(self) -> int | None:
        """A worker uid of its own for the next worker (None without root)."""
        if not self.worker_uid_base:
            return None
        uid = self._claim_uid()
        # Stray processes of an earlier holder (a host that died) must not share the uid.
        # (Every claim here: the classic spawn mode never trusts a clean mark; see _released.)
        if not await asyncio.to_thread(kill_uid, uid):
            raise SpawnFailed(f"processes of worker uid {uid} cannot be killed")
        return uid

    async def spawn(self) -> ProcessSandbox | ForkedSandbox:
        if self.spawn_mode == "template":
            return await self._fork()
        return await self._start()

    async def _fork(self) -> ForkedSandbox:
        # The template kills whatever of the uid an earlier holder (a host that died) left.
        uid = self._claim_uid() if self.worker_uid_base else None
        number = next(_ids)
        worker_id = f"proc-{os.getpid()}-{number}"
        ends: list[int] = []
        try:
            template = await self.template()
            for _ in range(3):
                ends.extend(os.pipe2(os.O_CLOEXEC))
            stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w = ends
            # The template gets its own copies of the worker's ends with the message; ours go at once.
            forking = template.fork(number, uid or 0, (stdin_r, stdout_w, stderr_w))
            try:
                pid, pidfd = await forking
            finally:
                for fd in (stdin_r, stdout_w, stderr_w):
                    os.close(fd)
                    ends.remove(fd)
        except BaseException as exc:
            for fd in ends:
                os.close(fd)
            if uid is not None:
                self._release_uid(uid)
            if isinstance(exc, OSError):
                raise SpawnFailed(f"cannot fork a worker: {exc}") from exc
            raise
        sandbox = ForkedSandbox(
            template, number, pid, pidfd, (stdin_w, stdout_r, stderr_r), worker_id, self._released, uid
        )
        if uid is not None and not self._left_clean(uid):
            # What an earlier holder's processes (killed by the template) left.
            await asyncio.to_thread(remove_all_ipc_of, uid)
        self._live.add(sandbox)
        try:
            await probe(sandbox, self.spawn_timeout)
            if uid is not None and _uids_of(pid) != (uid, uid):
                raise SpawnFailed(f"worker {worker_id} did not drop to uid {uid}")
        except BaseException:
            await sandbox.destroy()
            raise
        return sandbox

    async def _start(self) -> ProcessSandbox:
        env = {WORKER_ENV_MARKER: "1", **self.extra_env}
        uid = await self._uid()
        if uid is not None:
            # The worker drops to it itself, after warming up and before it reads any frame (the
            # interpreter may live where only root can read); the host checks it after the probe.
            env[UID_VARIABLE] = str(uid)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                close_fds=True,
                start_new_session=True,
                preexec_fn=lambda: self._preexec(uid),
                cwd="/",
            )
        except OSError as exc:
            if uid is not None:
                self._release_uid(uid)
            raise SpawnFailed(f"cannot start worker process: {exc}") from exc
        sandbox = ProcessSandbox(proc, f"proc-{os.getpid()}-{next(_ids)}", self._released, uid)
        self._live.add(sandbox)
        try:
            await probe(sandbox, self.spawn_timeout)
            if uid is not None and _uids_of(proc.pid) != (uid, uid):
                raise SpawnFailed(f"worker {sandbox.worker_id} did not drop to uid {uid}")
        except BaseException:
            await sandbox.destroy()
            raise
        return sandbox

    async def aclose(self) -> None:
        await asyncio.gather(*(s.destroy() for s in list(self._live)), return_exceptions=True)
        await self._close_template()
