"""The worker's own seccomp filter (codemode_worker.confinement, codemode_worker.syscalls).

Every test that loads a filter does it in a child process (a filter cannot be taken back). Needs
libseccomp's Python binding on this host (Debian's python3-seccomp, as the process runtime does).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from codemode.runtimes.base import RuntimeUnavailable
from codemode.runtimes.process import ProcessRuntime
from codemode_worker import confinement, syscalls
from codemode_worker.confinement import EXIT_CONFINEMENT

PROBE = json.dumps({"k": "probe", "v": 1}).encode()
PROBE_FRAME = struct.pack(">I", len(PROBE)) + PROBE


def worker(prelude: str, *, stdin: bytes = PROBE_FRAME) -> subprocess.CompletedProcess[bytes]:
    """``python -I -c prelude + run the worker entry`` with a probe on stdin."""
    code = prelude + "\nfrom codemode_worker.entry import run\nrun()\n"
    return subprocess.run(
        [sys.executable, "-I", "-c", code],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={"CODEMODE_WORKER": "1"},
    )


def test_the_lists_are_disjoint_and_known_to_libseccomp() -> None:
    sc = confinement.binding()
    allowed, denied = syscalls.ALLOWED, syscalls.DENIED
    conditional = set(syscalls.CONDITIONAL) | syscalls.OWN_PROCESS
    assert not allowed & denied and not allowed & conditional and not denied & conditional
    assert syscalls.ABSENT.isdisjoint(allowed | denied | conditional)
    assert syscalls.OWN_PROCESS.isdisjoint(allowed | denied | set(syscalls.CONDITIONAL))
    names = allowed | denied | conditional | syscalls.ABSENT
    unknown = [n for n in sorted(names) if sc.resolve_syscall(sc.Arch(), n) < 0]
    assert unknown == []
    # What the libc falls back from when a call "does not exist" must not be denied with EPERM.
    assert {"clone3", "faccessat2", "statx", "openat2", "rseq"}.isdisjoint(denied)


def test_the_filter_refuses_each_denied_kind_and_keeps_threads() -> None:
    """What the worker image's build runs: execve, fork, socket, memfd_create, open for writing and
    unshare are refused under the filter; a thread still starts."""
    out = subprocess.run(
        [sys.executable, "-I", "-m", "codemode_worker.confinement"],
        capture_output=True,
        timeout=60,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "seccomp filter holds" in out.stdout


CHECK = textwrap.dedent(
    """
    import errno, os, resource, signal, socket, sys, threading
    from codemode_worker import confinement
    confinement.confine(confinement.prepare())
    def outcome(fn):
        try:
            fn()
        except OSError as exc:
            return errno.errorcode[exc.errno]
        except ValueError:  # what resource.setrlimit makes of EPERM
            return "ValueError"
        return "allowed"
    seen = {}
    t = threading.Thread(target=lambda: seen.update(
        thread_socket=outcome(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))))
    t.start(); t.join()
    print(dict(
        seen,
        read=outcome(lambda: open("/proc/self/status").read()),
        write=outcome(lambda: open("/proc/self/comm", "w")),
        append=outcome(lambda: open("/dev/null", "a")),
        clone3=outcome(lambda: os.posix_spawn(sys.executable, [sys.executable], {})),
        fsize=resource.getrlimit(resource.RLIMIT_FSIZE),
        setrlimit=outcome(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (8, 8))),
        setuid=outcome(lambda: os.setuid(os.getuid())),
        signal_other=outcome(lambda: signal.pthread_kill(threading.main_thread().ident, 0) or
                             os.kill(os.getppid(), 0)),
    ))
    """
)


def test_a_confined_process_reads_but_cannot_write_spawn_or_change_limits() -> None:
    out = subprocess.run([sys.executable, "-I", "-c", CHECK], capture_output=True, timeout=60, text=True)
    assert out.returncode == 0, out.stderr
    got = eval(out.stdout)  # a dict literal printed by the child
    assert got == {
        "thread_socket": "EPERM",  # the filter holds on every thread (TSYNC)
        "read": "allowed",
        "write": "EPERM",
        "append": "EPERM",
        "clone3": "EPERM",  # posix_spawn: clone3 is "absent" (ENOSYS), its clone fallback refused
        "fsize": (0, 0),
        "setrlimit": "ValueError",  # EPERM
        "setuid": "EPERM",
        "signal_other": "EPERM",  # tgkill of its own threads works, kill of another process does not
    }


def test_a_confined_abort_is_still_sigabrt() -> None:
    """A failed allocation makes the interpreter abort(): the SIGABRT (tgkill of itself) must still
    arrive, since the host reads it as the memory limit (runtimes/exhaustion.py)."""
    code = "from codemode_worker import confinement\nconfinement.confine(confinement.prepare())\n"
    code += "import os\nos.abort()\n"
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, timeout=60)
    assert out.returncode == -6, out.stderr


def test_a_worker_without_the_binding_exits_before_reading_a_frame() -> None:
    """Fail closed: no libseccomp binding, no probe_ack (nothing on stdout), exit 5."""
    prelude = "import sys\nsys.modules['seccomp'] = None\nfrom codemode_worker import confinement\n"
    prelude += "confinement.BINDING_DIRECTORIES = ()\n"
    out = worker(prelude)
    assert out.returncode == EXIT_CONFINEMENT
    assert out.stdout == b""
    assert b"cannot confine itself" in out.stderr and b"python3-seccomp" in out.stderr


def test_a_worker_whose_filter_the_kernel_refuses_exits_before_reading_a_frame() -> None:
    """Fail closed: a worker started under a filter that refuses seccomp() itself (as an engine's
    profile could) cannot load its own, so it answers nothing and exits 5."""
    prelude = textwrap.dedent(
        """
        import errno
        from codemode_worker import confinement
        sc = confinement.binding()
        outer = sc.SyscallFilter(sc.ALLOW)
        outer.add_rule(sc.ERRNO(errno.EPERM), "seccomp")
        outer.add_rule(sc.ERRNO(errno.EPERM), "prctl", sc.Arg(0, sc.EQ, 22))  # PR_SET_SECCOMP
        outer.load()
        """
    )
    out = worker(prelude)
    assert out.returncode == EXIT_CONFINEMENT, out.stderr
    assert out.stdout == b""
    assert b"cannot confine itself" in out.stderr


def test_a_confined_worker_still_serves_its_program() -> None:
    limits = {
        "max_steps": 100_000,
        "max_value_depth": 32,
        "max_value_bytes": 1 << 20,
        "max_native_calls": 10,
        "max_callstack": 100,
    }
    source = "def main():\n    return json.decode(json.encode({'a': [1, 2.5, None]}))\n"
    body = json.dumps({"k": "exec", "v": 1, "source": source, "manifest": [], "limits": limits}).encode()
    out = worker("", stdin=PROBE_FRAME + struct.pack(">I", len(body)) + body)
    assert out.returncode == 0, out.stderr
    frames = []
    data = out.stdout
    while data:
        (n,) = struct.unpack(">I", data[:4])
        frames.append(json.loads(data[4 : 4 + n]))
        data = data[4 + n :]
    assert frames == [{"k": "probe_ack", "v": 1}, {"k": "final", "value": {"a": [1, 2.5, None]}}]


@pytest.mark.parametrize("name", sorted(syscalls.CONDITIONAL))
def test_each_conditional_call_has_an_allowed_form(name: str) -> None:
    assert syscalls.CONDITIONAL[name].allow


async def test_the_process_runtime_check_names_what_is_missing(tmp_path: Path) -> None:
    """Readiness says why no worker could start, before a spawn fails: this Python cannot load
    libseccomp's binding (a wrapper that hides it)."""
    prelude = (
        "import sys; sys.modules['seccomp'] = None; from codemode_worker import confinement; "
        "confinement.BINDING_DIRECTORIES = (); exec(sys.argv[1])"
    )
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} -I -c "{prelude}" "$3"\n')
    fake.chmod(0o755)
    with pytest.raises(RuntimeUnavailable, match="python3-seccomp"):
        await ProcessRuntime(python=str(fake)).check()
    runtime = ProcessRuntime()
    try:
        await runtime.check()  # the host's own Python has it
    finally:
        await runtime.aclose()


def test_the_compiled_filter_is_libseccomps_program_for_each_pid() -> None:
    """The template compiles the filter once (``CompiledFilter``); the program a forked worker loads
    must be byte for byte the one libseccomp builds for that worker's pid."""
    import random

    sc = confinement.binding()
    compiled = confinement.CompiledFilter(sc)
    pids = [1, 2, 4_194_304, *random.Random(21).sample(range(3, 4_194_304), 40)]
    for pid in pids:
        assert compiled.program(pid) == confinement.export(confinement.build_filter(sc, pid)), pid
    with pytest.raises(ValueError):
        compiled.program(0)


def test_the_compiled_filter_refuses_programs_that_differ_beyond_the_pid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A libseccomp whose program for another pid differs in any other way (a different tree) is not
    patched: the template then has each worker build its own filter."""
    sc = confinement.binding()
    real = confinement.build_filter

    def other_tree(binding: object, pid: int | None = None) -> object:
        flt = real(binding, pid)
        if pid == confinement.CompiledFilter.SENTINELS[1]:
            flt.add_rule(sc.ERRNO(1), "sync")  # one more rule: another program
        return flt

    monkeypatch.setattr(confinement, "build_filter", other_tree)
    with pytest.raises(ValueError):
        confinement.CompiledFilter(sc)
    assert confinement.compile_filter() is None


def test_a_compiled_filter_holds_in_a_forked_process() -> None:
    """Loaded through ``confine``, the compiled program refuses what the filter refuses (the check of
    ``confine`` and one denied call of each kind: ``confinement.main`` with the compiled filter)."""
    code = textwrap.dedent(
        """
        import os, sys
        from codemode_worker import confinement
        compiled = confinement.compile_filter()
        assert compiled is not None
        pid = os.fork()
        if pid == 0:
            confinement.prepare = lambda: compiled
            code = confinement.main()
            sys.stdout.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert b"seccomp filter holds" in done.stdout
