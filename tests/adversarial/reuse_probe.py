"""Programs for the reuse-mode escape suites (Docker: test_docker_reuse.py; Kubernetes:
tests/e2e_kubernetes/test_reuse.py). Each is **Python** for the TEST-ONLY worker entry: a compromised
interpreter in a reusable sandbox. Not a test module.

``LEAVE`` tries to leave everything behind for the subject's next execute in the same sandbox: a
process (which would signal every process it can, the next worker included), a file in every
writable mount and in the known writable files, an extended attribute on each, System V IPC
objects, POSIX message queues, an environment variable, and signals to the supervisor. It reports
what each attempt did.

``FIND`` is what the next execute runs: it reports every process, file, extended attribute, IPC
object, queue, environment variable, descriptor and pending signal it can see, and which sandbox it
is in.

``REACH`` attacks the supervisor (PID 1): signals, ``ptrace``, its memory, descriptors and
environment through /proc, ``process_vm_readv``, ``pidfd_getfd``, and the attributes a same-uid
process may change (resource limits, nice value, CPU affinity).

``SLICE`` sets a custom scheduling slice (``sched_setattr``, ``sched_runtime``) on the supervisor,
which its later workers would inherit; ``OWN_SLICE`` is what the next execute runs: its own slice.

``UNCONFINED`` is the supervisor's command with ``--testing-unconfined``: its workers do not
install the worker's seccomp filter (only the test entry honours it; the production image has no
test entry), so the suites see the layers under the filter (the kernel's rules for PID 1 and
non-dumpable processes, the container's profile, the scrub) hold on their own.
"""

from __future__ import annotations

import os
from typing import Any

#: ``CODEMODE_TEST_SUPERVISOR_MUTATION``: Python run in the supervisor before it starts, to check
#: that the suites fail when one of its defences is taken away (e.g.
#: ``s.scrub.kill_others = lambda seconds=0: []``; ``s`` is ``codemode_worker.supervisor``).
MUTATION = os.environ.get("CODEMODE_TEST_SUPERVISOR_MUTATION", "")


def _command(*flags: str) -> list[str]:
    if not MUTATION:
        return ["python3", "-I", "-m", "codemode_worker.supervisor", *flags]
    code = f"import codemode_worker.supervisor as s\n{MUTATION}\nraise SystemExit(s.main({list(flags)!r}))"
    return ["python3", "-I", "-c", code]


SUPERVISOR = _command("--testing")
UNCONFINED = _command("--testing", "--testing-unconfined")
MARK = "codemode-leftover"

_PRELUDE = f"""
import ctypes, errno, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
MARK = {MARK!r}
res = {{}}

def attempt(name, fn):
    try:
        out = fn()
        res[name] = "ok" if out is None else out
    except OSError as exc:
        res[name] = errno.errorcode.get(exc.errno, str(exc.errno))
    except Exception as exc:
        res[name] = type(exc).__name__

def read_or_error(path):
    # a confined worker may not open it at all (the Landlock domain refuses device nodes): the
    # error is then what both executes see
    try:
        return open(path).read()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

def check(value):
    if value == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return value

def marked_places():
    # where a worker could hang an extended attribute: every writable mount point and file
    places = writable_mounts()
    if os.path.exists("/dev/termination-log"):
        places.append("/dev/termination-log")
    return sorted(set(places))

def user_xattrs(path):
    try:
        return sorted(n for n in os.listxattr(path) if n.startswith("user."))
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

def own_slice():
    # the fair class's slice of this process (inherited from the supervisor at the fork)
    try:
        for line in proc_text("/proc/self/sched").splitlines():
            if line.startswith("se.slice"):
                return int(line.split(":")[1])
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return None

def writable_mounts():
    out = []
    for line in proc_text("/proc/self/mountinfo").splitlines():
        f = line.split()
        fstype = f[f.index("-") + 1]
        if "rw" in f[5].split(",") and fstype not in ("proc", "sysfs", "cgroup", "cgroup2"):
            out.append(f[4])
    return sorted(set(out))
"""

LEAVE = (
    _PRELUDE
    + r"""
def lingerer():
    pid = os.fork()
    if pid == 0:
        parent = os.getppid()
        while os.getppid() == parent:  # until this execute's worker is gone
            time.sleep(0.005)
        while True:  # then signal everything it may: the next worker included
            try:
                os.kill(-1, signal.SIGUSR1)
            except OSError:
                pass
            time.sleep(0.005)
    return "pid %d" % pid

attempt("process", lingerer)
for d in writable_mounts():
    path = os.path.join(d, MARK) if os.path.isdir(d) else d
    if os.path.isdir(d):
        attempt("file " + path, lambda path=path: open(path, "w").write("x"))
        attempt("dir " + path + ".d", lambda path=path: os.makedirs(path + ".d/deep/deeper"))
    elif os.path.isfile(path):  # a mounted regular file (a device such as runc's /dev/null
        # over the masked /proc files stores nothing)
        attempt("append " + path, lambda path=path: open(path, "a").write(MARK))
if os.path.exists("/dev/termination-log"):
    attempt("append /dev/termination-log", lambda: open("/dev/termination-log", "a").write(MARK))
for path in marked_places():  # an extended attribute outlives the file's contents
    attempt("setxattr " + path, lambda path=path: os.setxattr(path, "user." + MARK, b"x"))
libc.mq_open.restype = ctypes.c_int
QUEUE = b"/" + MARK.encode()
attempt("mq_open", lambda: "fd %d" % check(libc.mq_open(QUEUE, os.O_CREAT | os.O_RDWR, 0o600, None)))
attempt("shmget", lambda: "id %d" % check(libc.shmget(0x51ce, 4096, 0o1000 | 0o600)))
attempt("semget", lambda: "id %d" % check(libc.semget(0x51cf, 1, 0o1000 | 0o600)))
attempt("msgget", lambda: "id %d" % check(libc.msgget(0x51d0, 0o1000 | 0o600)))
os.environ["CODEMODE_LEFTOVER"] = "1"
libc.setenv(b"CODEMODE_LEFTOVER_C", b"1", 1)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGSTOP, signal.SIGKILL):
    attempt("kill 1 " + sig.name, lambda sig=sig: os.kill(1, sig))
final(res)
"""
)

FIND = (
    _PRELUDE
    + r"""
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
time.sleep(0.3)  # a lingering process would signal us meanwhile
status = dict(l.split(":", 1) for l in proc_text("/proc/self/status").splitlines() if ":" in l)
files = []
for d in writable_mounts() + ["/dev/mqueue"]:
    if os.path.isdir(d):
        files += [os.path.join(d, n) for n in os.listdir(d) if MARK in n]
sysvipc = {}
for kind in ("shm", "sem", "msg"):
    try:
        sysvipc[kind] = proc_text("/proc/sysvipc/" + kind).splitlines()[1:]
    except OSError:
        sysvipc[kind] = None
final({
    "pid": os.getpid(),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "files": sorted(files),
    "termination_log": (
        read_or_error("/dev/termination-log") if os.path.exists("/dev/termination-log") else None
    ),
    "mqueue": sorted(os.listdir("/dev/mqueue")) if os.path.isdir("/dev/mqueue") else None,
    "xattrs": {path: user_xattrs(path) for path in marked_places()},
    "sysvipc": sysvipc,
    "env": sorted(os.environ),
    "fds": sorted(os.listdir("/proc/self/fd")),
    "signals": len(got),
    "sigpnd": status["SigPnd"].strip(),
    "shdpnd": status["ShdPnd"].strip(),
    "supervisor": proc_text("/proc/1/stat").rpartition(")")[2].split()[19],
    "supervisor_limits": proc_text("/proc/1/limits"),
    "sandbox": proc_text("/proc/self/cgroup"),
})
"""
)

REACH = (
    _PRELUDE
    + r"""
import resource
for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
    attempt("kill " + sig.name, lambda sig=sig: os.kill(1, sig))
attempt("ptrace attach", lambda: check(libc.ptrace(16, 1, None, None)))
attempt("ptrace seize", lambda: check(libc.ptrace(0x4206, 1, None, None)))
def peek():
    with open("/proc/1/mem", "rb") as mem:
        maps = open("/proc/1/maps").read().split()
        mem.seek(int(maps[0].split("-")[0], 16))
        return "read %d bytes" % len(mem.read(16))
attempt("/proc/1/mem", peek)
attempt("/proc/1/mem write", lambda: open("/proc/1/mem", "wb"))
attempt("/proc/1/maps", lambda: open("/proc/1/maps").read()[:40])
attempt("/proc/1/environ", lambda: open("/proc/1/environ").read()[:40])
attempt("/proc/1/fd", lambda: os.listdir("/proc/1/fd"))
attempt("/proc/1/fd/0", lambda: open("/proc/1/fd/0", "rb").read(1))
attempt("/proc/1/fd/1", lambda: open("/proc/1/fd/1", "wb").write(b"forged"))
attempt("/proc/1/cwd", lambda: os.listdir("/proc/1/cwd"))
attempt("/proc/1/oom_score_adj", lambda: open("/proc/1/oom_score_adj", "w").write("1000"))
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(16)
local, remote = IoVec(ctypes.addressof(buf), 16), IoVec(0x400000, 16)
def vm_read():
    return check(libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
attempt("process_vm_readv", vm_read)
def steal_fd():
    pidfd = check(libc.syscall(434, 1, 0))  # pidfd_open
    return "fd %d" % check(libc.syscall(438, pidfd, 1, 0))  # pidfd_getfd: the channel
attempt("pidfd_getfd", steal_fd)
attempt("prlimit 1 NOFILE", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (16, 16)))
attempt("setpriority 1", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19))
attempt("sched_setaffinity 1", lambda: os.sched_setaffinity(1, {0}))
final(res)
"""
)

SLICE = (
    _PRELUDE
    + r"""
import struct
def set_slice():
    try:
        nice = os.getpriority(os.PRIO_PROCESS, 1)
    except OSError:
        nice = 0
    # struct sched_attr: size, policy (SCHED_OTHER), flags, nice, priority, runtime (the slice:
    # 5 ms), deadline, period, util_min, util_max; sched_setattr is 314 on x86_64
    attr = struct.pack("=IIqiIQQQII", 56, 0, 0, nice, 0, 5_000_000, 0, 0, 0, 0)
    return check(libc.syscall(314, 1, ctypes.c_char_p(attr), 0))
attempt("sched_setattr 1 slice", set_slice)
final({"tried": res["sched_setattr 1 slice"], "slice": own_slice()})
"""
)

OWN_SLICE = _PRELUDE + 'final({"slice": own_slice()})\n'

#: Attempts that must be refused whatever the worker's own filter does (the kernel's rules for a
#: non-dumpable process of the same uid): their results start with these error names.
REFUSED_BY_THE_KERNEL = (
    "ptrace attach",
    "ptrace seize",
    "/proc/1/mem",
    "/proc/1/mem write",
    "/proc/1/maps",
    "/proc/1/environ",
    "/proc/1/fd",
    "/proc/1/fd/0",
    "/proc/1/fd/1",
    "/proc/1/cwd",
    "/proc/1/oom_score_adj",
    "process_vm_readv",
    "pidfd_getfd",
)
#: What a same-uid process may change about the supervisor unless something refuses it.
ATTRIBUTES = ("prlimit 1 NOFILE", "setpriority 1", "sched_setaffinity 1")


def refused(result: Any) -> bool:
    """An attempt's result is an error (EPERM, EACCES, ESRCH ...), not a success."""
    return isinstance(result, str) and result.startswith("E")


def clean(found: dict[str, Any], pristine: dict[str, Any]) -> dict[str, Any]:
    """What ``FIND`` saw that a pristine worker of the same kind of sandbox does not (empty: nothing
    was left behind)."""
    diff: dict[str, Any] = {}
    if found["pids"] != [1, found["pid"]]:
        diff["pids"] = found["pids"]
    for key in ("files", "signals"):
        if found[key]:
            diff[key] = found[key]
    for key in (
        "termination_log",
        "mqueue",
        "xattrs",
        "sysvipc",
        "env",
        "fds",
        "sigpnd",
        "shdpnd",
        "supervisor_limits",
    ):
        if found[key] != pristine[key]:
            diff[key] = (found[key], pristine[key])
    return diff
