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
from codemode.runtimes.process import ProcessOptions, ProcessRuntime
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


def test_the_check_reports_into_a_file(tmp_path: Path) -> None:
    """Found by review: with stdout redirected to a file the check printed nothing and exited 1 (its
    report hit its own ``RLIMIT_FSIZE`` 0, and so did the traceback on a redirected stderr)."""
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        done = subprocess.run(
            [sys.executable, "-I", "-m", "codemode_worker.confinement"],
            stdout=stdout,
            stderr=stderr,
            timeout=60,
        )
    assert (done.returncode, err.read_text()) == (0, "")
    assert out.read_text().startswith("seccomp filter holds (")


def test_a_failed_check_reports_into_a_file(tmp_path: Path) -> None:
    """A failure found after the limits are set (here a filter that refuses nothing) reaches a
    redirected stderr too."""
    code = textwrap.dedent(
        """
        import sys
        from codemode_worker import confinement
        sc = confinement.binding()
        confinement.prepare = lambda: sc.SyscallFilter(defaction=sc.ALLOW)
        sys.exit(confinement.main())
        """
    )
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        done = subprocess.run([sys.executable, "-I", "-c", code], stdout=stdout, stderr=stderr, timeout=60)
    assert (done.returncode, out.read_text()) == (EXIT_CONFINEMENT, "")
    assert err.read_text() == "codemode worker: cannot confine itself: the seccomp filter does not hold\n"


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
        await ProcessRuntime(ProcessOptions(python=str(fake))).check()
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


# ------------------------------------------------------------------ other ABIs

_AUDIT_ARCH_X86_64, _AUDIT_ARCH_I386, _X32_BIT = 0xC000003E, 0x40000003, 0x40000000
_RET_ERRNO, _RET_ALLOW = 0x00050000, 0x7FFF0000


def _run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """The action the classic-BPF seccomp ``program`` returns for one call (the instructions
    libseccomp emits: absolute word loads of ``struct seccomp_data``, constant jumps and ANDs, the
    scratch store/load, returns). An instruction outside that set fails the test."""
    words = [nr & 0xFFFFFFFF, arch, 0, 0]  # nr, arch, instruction pointer (lo, hi)
    for value in (*args, *(0,) * (6 - len(args))):
        words += [value & 0xFFFFFFFF, value >> 32]
    insns = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    acc, x, mem, pc = 0, 0, [0] * 16, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            acc = words[k // 4]
        elif code == 0x00:  # ld #k
            acc = k
        elif code == 0x54:  # and #k
            acc &= k
        elif code == 0x02:  # st M[k]
            mem[k] = acc
        elif code == 0x60:  # ld M[k]
            acc = mem[k]
        elif code == 0x07:  # tax
            x = acc
        elif code == 0x87:  # txa
            acc = x
        elif code in (0x15, 0x25, 0x35, 0x45):  # jeq, jgt, jge, jset #k
            taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        elif code == 0x05:  # ja
            pc += k
        elif code == 0x06:  # ret #k
            return int(k)
        else:
            raise AssertionError(f"BPF instruction {code:#x} not modelled")


def _exported_filter() -> bytes:
    import tempfile

    with tempfile.TemporaryFile() as out:
        confinement.build_filter(confinement.binding()).export_bpf(out)
        out.seek(0)
        return out.read()


def test_the_filter_answers_other_abis_with_enosys() -> None:
    """A compromised interpreter can make any call of the x32 ABI (the x86_64 audit arch with bit
    30 of the number set: another table, with its own execve, socket, memfd_create ...) or of the
    32-bit ABI (``int 0x80``). This machine's kernel may lack x32 (CONFIG_X86_X32_ABI), so the
    filter itself is checked: the BPF libseccomp exports answers every x32 number of every call the
    worker's policy names, and every i386 call, with ENOSYS; the native forms keep their action."""
    sc = confinement.binding()
    program = _exported_filter()
    enosys = _RET_ERRNO | syscalls.UNLISTED_ERRNO
    names = syscalls.ALLOWED | syscalls.DENIED | set(syscalls.CONDITIONAL) | syscalls.OWN_PROCESS
    native = sc.Arch("x86_64")
    for name in sorted(names):
        nr = sc.resolve_syscall(native, name)
        assert _run_bpf(program, _X32_BIT | nr, _AUDIT_ARCH_X86_64) == enosys, name
        assert _run_bpf(program, nr, _AUDIT_ARCH_I386) == enosys, name
    assert _run_bpf(program, sc.resolve_syscall(native, "getpid"), _AUDIT_ARCH_X86_64) == _RET_ALLOW
    memfd = sc.resolve_syscall(native, "memfd_create")
    assert _run_bpf(program, memfd, _AUDIT_ARCH_X86_64) == _RET_ERRNO | syscalls.DENY_ERRNO
    # x32 numbers: 512 and up are x32-only entries (execve is 520, execveat 545).
    for nr in (520, 545, 512 + 7):
        assert _run_bpf(program, _X32_BIT | nr, _AUDIT_ARCH_X86_64) == enosys, nr
