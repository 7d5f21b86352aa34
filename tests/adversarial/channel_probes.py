"""Covert channels between two confined workers on one node, shared by the process,
Docker, reuse and Kubernetes tests and the channel benchmarks (no tests here). Each probe is Python
for the TEST-ONLY worker entry (``final`` and ``protocol`` in scope), which runs it under the
worker's own seccomp filter.

``futex_sender(path)`` and ``futex_receiver(path)``: a futex on a ``MAP_SHARED`` mapping of a file
is keyed by the file's inode, and every container of one image on a node sees the same lower inode
of an image file (every process-runtime worker the same host file). Both map ``path`` (default: the
worker's ``protocol.py``, which every worker can read) read-only and use three words of its first
page: the sender wakes word 0 or word 1 (one bit) until the wake count says a waiter took it, then
waits on word 2; the receiver waits on words 0 and 1 (a thread each) and acknowledges each bit by
waking word 2. The sender reports how many bits were acknowledged, over how long, and what refused
it; the receiver what it got. ``rate(received, seconds)``: the bits per second that got through.

``exit_wake_sender`` and ``exit_wake_receiver``: the wake no filter sees. A thread that ends wakes
its ``clear_child_tid`` word with a shared wake (``set_tid_address`` points it into the mapping),
so a sender needs no ``futex`` call: only a refused shared wait closes the receiving end.

``JOIN_PROBE``: glibc's ``pthread_join``, which waits on a shared futex, under the filter.

``REFUSED_PRIMITIVES``: the other kernel objects keyed by a shared inode, shared content or a global
name (locks, leases, dnotify, inotify, fanotify, KSM's ``madvise``, ``mincore``, ``cachestat``,
``preadv2`` with ``RWF_NOWAIT``, ``futex_waitv`` and the futex2 calls, shared futexes of every
command); each outcome is ``"allowed"`` or the errno's name; ``not_refused(report)`` lists those
the filter did not refuse.

``counter_sender(what, begin)`` and ``counter_receiver(what, begin)``: the machine's counters
(``sysinfo()``'s process count, ``/proc/stat``'s fork count, ``/proc/loadavg``'s thread count, and the
id a new thread gets: the pid namespace's, which a process-runtime worker shares with the host). The
sender makes threads (each one counts in the whole machine's numbers) in the first or the second of
the two slots of ``SLOT`` seconds of each bit; the receiver samples the counter in every slot.
``counter_capacity(sent, samples, what)``: the bits per second that got through (the capacity of a
binary symmetric channel with the decoding's error rate).

``mapcount_sender(begin)`` and ``mapcount_receiver(begin)``: a page-cache page of a file every worker
can read is one page for every process of the node that maps it, and its mapping count shows in the
``/proc`` files of each (``MAP_VIEWS``: ``numa_maps``' ``mapmax``, ``smaps``' ``Shared_*``). The
sender maps the pages whose bits are 1 for a slot; the receiver maps every page once and reads which
ones another process maps too, ``MAP_PAGES`` bits per slot. ``mapcount_capacity(sent, got)``.

``inode_sender(begin)`` and ``inode_receiver(begin)``: the kernel numbers the inodes of ``/proc``
entries (and of pipes and sockets) from one counter for the whole machine; a lookup of a fresh
``/proc/self/fd`` entry takes a number. The sender takes numbers in the first or the second slot of
each bit; the receiver takes numbers all the time and counts the ones others took in between.
``inode_capacity(sent, gaps)``.
"""

from __future__ import annotations

import itertools
import math
import textwrap

__all__ = [
    "COUNTERS",
    "INODE_SLOT",
    "JOIN_PROBE",
    "MAP_VIEWS",
    "REFUSED_PRIMITIVES",
    "SLOT",
    "STEPS",
    "capacity",
    "counter_capacity",
    "counter_receiver",
    "counter_sender",
    "exit_wake_receiver",
    "exit_wake_sender",
    "futex_receiver",
    "futex_sender",
    "inode_capacity",
    "inode_receiver",
    "inode_sender",
    "joined",
    "mapcount_capacity",
    "mapcount_receiver",
    "mapcount_sender",
    "message",
    "not_refused",
    "rate",
]

#: The bits a sender sends, at most (the futex channel).
BITS = 20_000
#: How long a sender keeps sending once its first bit got through, in seconds.
WINDOW = 1.0
#: How long either side waits for the other to start, in seconds.
RENDEZVOUS = 20.0
SEED = 31

_COMMON = textwrap.dedent(
    r"""
    import ctypes, errno, os, time, _thread

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    FUTEX, SET_TID_ADDRESS = 202, 218
    WAIT, WAKE = 0, 1

    class Timespec(ctypes.Structure):
        _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]

    def name(code):
        return errno.errorcode.get(code, str(code))

    def futex(addr, op, val, timeout=None):
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(FUTEX), ctypes.c_void_p(addr), ctypes.c_long(op),
                         ctypes.c_long(val), ctypes.byref(timeout) if timeout is not None else None,
                         None, ctypes.c_long(0))
        return r if r >= 0 else -ctypes.get_errno()

    def shared_page(path):
        fd = os.open(path or protocol.__file__, os.O_RDONLY)  # default: the worker's protocol.py
        addr = libc.mmap(None, 4096, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        os.close(fd)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        return addr

    def word(addr):
        return ctypes.c_uint32.from_address(addr).value

    def message(bits, seed):  # a linear congruential generator's top bits
        out, x = [], seed
        for _ in range(bits):
            x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            out.append(x >> 63)
        return out
    """
)

_FUTEX_SENDER = textwrap.dedent(
    r"""
    page = shared_page(PATH)
    words = (page, page + 64)
    ack = page + 128
    refused, acked, first, last = None, 0, None, None
    start = time.monotonic()
    for bit in message(BITS, SEED):
        while True:  # wake the waiter of this bit's word; a count of 1 says it took the bit
            r = futex(words[bit], WAKE, 1)
            if r == 1:
                break
            if r < 0:
                refused = name(-r)
                break
            now = time.monotonic()
            if (first is None and now - start > RENDEZVOUS) or (first is not None and now - first > WINDOW):
                break
        if r != 1:
            break
        while True:  # the receiver's acknowledgement
            r = futex(ack, WAIT, word(ack), Timespec(0, 200_000_000))
            if r == 0 or r < 0 and -r != errno.ETIMEDOUT:
                break
            if time.monotonic() - start > RENDEZVOUS + WINDOW:
                break
        if r != 0:
            refused = refused or name(-r)
            break
        acked += 1
        last = time.monotonic()
        if first is None:
            first = last
        if last - first > WINDOW:
            break
    final({"acked": acked, "seconds": (last - first) if first is not None else 0.0, "refused": refused})
    """
)

_FUTEX_RECEIVER = textwrap.dedent(
    r"""
    page = shared_page(PATH)
    ack = page + 128
    got, errors, running = [], [], [2]
    state = {"done": False, "last": None}

    def listen(bit):
        addr = page + 64 * bit
        val = word(addr)
        try:
            while not state["done"]:
                r = futex(addr, WAIT, val, Timespec(0, 200_000_000))
                if r == -errno.ETIMEDOUT:
                    continue
                if r < 0:
                    errors.append(name(-r))
                    return
                got.append(bit)
                state["last"] = time.monotonic()
                while not state["done"]:  # acknowledge: wake the sender waiting on word 2
                    r = futex(ack, WAKE, 1)
                    if r == 1:
                        break
                    if r < 0:
                        errors.append(name(-r))
                        return
        finally:
            running[0] -= 1

    for bit in (0, 1):
        _thread.start_new_thread(listen, (bit,))
    start = time.monotonic()
    while running[0] and not errors:
        time.sleep(0.05)
        now = time.monotonic()
        if state["last"] is None and now - start > RENDEZVOUS:
            break
        if state["last"] is not None and now - state["last"] > 1.0:
            break
    state["done"] = True
    while running[0]:
        time.sleep(0.05)
    final({"bits": "".join(map(str, got)), "refused": sorted(set(errors))})
    """
)

_EXIT_WAKE_SENDER = textwrap.dedent(
    r"""
    page = shared_page(PATH)
    ended = [0]

    def end_on(addr):
        # the kernel wakes this word (a shared wake) when the thread ends
        libc.syscall(ctypes.c_long(SET_TID_ADDRESS), ctypes.c_void_p(addr))
        ended[0] += 1

    # A thread whose end clears no tid word keeps its stack (glibc reuses only cleared ones): small
    # stacks, and a bounded number of them.
    _thread.stack_size(1 << 16)
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < DURATION and sent < 100:
        _thread.start_new_thread(end_on, (page + 192,))
        sent += 1
        while ended[0] < sent:
            time.sleep(0.001)
        time.sleep(0.01)
    final({"threads": sent})
    """
)

_EXIT_WAKE_RECEIVER = textwrap.dedent(
    r"""
    page = shared_page(PATH)
    addr = page + 192
    val = word(addr)
    woken, outcome = 0, None
    start = time.monotonic()
    while time.monotonic() - start < DURATION:
        r = futex(addr, WAIT, val, Timespec(0, 100_000_000))
        if r == 0:
            woken += 1
        elif r != -errno.ETIMEDOUT:
            outcome = name(-r)
            break
    final({"woken": woken, "refused": outcome})
    """
)


def _program(body: str, **values: object) -> str:
    head = "".join(f"{key} = {value!r}\n" for key, value in values.items())
    return head + _COMMON + body


def futex_sender(path: str | None = None) -> str:
    """The futex channel's sending worker (see the module's docstring)."""
    return _program(_FUTEX_SENDER, PATH=path, BITS=BITS, SEED=SEED, WINDOW=WINDOW, RENDEZVOUS=RENDEZVOUS)


def futex_receiver(path: str | None = None) -> str:
    """The futex channel's receiving worker."""
    return _program(_FUTEX_RECEIVER, PATH=path, RENDEZVOUS=RENDEZVOUS)


def exit_wake_sender(duration: float, path: str | None = None) -> str:
    """A sender that wakes only through its threads' ends (no ``futex`` call)."""
    return _program(_EXIT_WAKE_SENDER, PATH=path, DURATION=duration)


def exit_wake_receiver(duration: float, path: str | None = None) -> str:
    """The receiver of ``exit_wake_sender``: how many wakes reached it."""
    return _program(_EXIT_WAKE_RECEIVER, PATH=path, DURATION=duration)


def message(bits: int = BITS, seed: int = SEED) -> str:
    """What a sender sends (its first ``bits`` bits): the top bits of a linear congruential generator
    (the worker may not be able to import ``random`` once confined)."""
    out, x = [], seed
    for _ in range(bits):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(str(x >> 63))
    return "".join(out)


def rate(received: str, seconds: float) -> float:
    """Bits per second that got through: the received bits that match what was sent, over the time
    the sender took (0 when nothing matched)."""
    sent = message(len(received))
    right = sum(a == b for a, b in zip(received, sent, strict=True))
    if not received or not right:
        return 0.0
    return right / max(seconds, 1e-3)


# ------------------------------------------------------------------------------- pthread_join

#: glibc's ``pthread_join`` of a thread that still runs waits on the thread's tid word with a
#: *shared* futex (the kernel clears the word with a shared wake when the thread ends). Under the
#: filter that wait gets EAGAIN and glibc waits again until the word is clear; ENOSYS or EPERM
#: there would abort the process. The probe joins a native thread that sleeps ``JOIN_SLEEP``
#: seconds (the join waits) and one that returns at once, and reports what they returned.
JOIN_PROBE = textwrap.dedent(
    r"""
    import ctypes, time

    libc = ctypes.CDLL(None, use_errno=True)
    START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)

    def body(arg):
        if arg:
            libc.usleep(ctypes.c_uint(int(arg)))
        return 7 + (arg or 0)

    start = START(body)
    results = []
    for sleep_us in (JOIN_SLEEP_US, 0):
        thread, out = ctypes.c_ulong(), ctypes.c_void_p()
        t = time.monotonic()
        created = libc.pthread_create(ctypes.byref(thread), None, start, ctypes.c_void_p(sleep_us or None))
        joined = libc.pthread_join(thread, ctypes.byref(out))
        results.append({"created": created, "joined": joined, "value": out.value,
                        "seconds": round(time.monotonic() - t, 3)})
    final(results)
    """
)
JOIN_SLEEP_US = 200_000
JOIN_PROBE = JOIN_PROBE.replace("JOIN_SLEEP_US", str(JOIN_SLEEP_US))


def joined(results: list[dict[str, object]]) -> bool:
    """Whether ``JOIN_PROBE``'s two threads were created, joined and returned their values (the first
    one after its sleep)."""
    slow, quick = results
    return (
        slow["created"] == slow["joined"] == quick["created"] == quick["joined"] == 0
        and slow["value"] == 7 + JOIN_SLEEP_US
        and quick["value"] == 7
        and isinstance(slow["seconds"], float)
        and slow["seconds"] >= JOIN_SLEEP_US / 1e6
    )


# ------------------------------------------------------------------------ refused primitives

REFUSED_PRIMITIVES = textwrap.dedent(
    r"""
    import ctypes, errno, os, struct

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]

    def name(code):
        return errno.errorcode.get(code, str(code))

    def sc(nr, *args):
        ctypes.set_errno(0)
        args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
        r = libc.syscall(ctypes.c_long(nr), *args)
        return "allowed" if r >= 0 else name(ctypes.get_errno())

    fd = os.open(protocol.__file__, os.O_RDONLY)
    page = libc.mmap(None, 4096, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    val = ctypes.c_uint32.from_address(page).value
    anon = libc.mmap(None, 4096, 3, 0x22, -1, 0)  # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
    zero = ctypes.create_string_buffer(16)  # a timespec of 0: a wait that would time out at once
    flock = ctypes.create_string_buffer(struct.pack("hhqqi", 0, 0, 0, 1, 0) + bytes(4))  # F_RDLCK
    vec = ctypes.create_string_buffer(1)
    # struct futex_waitv: val, uaddr, flags (FUTEX2_SIZE_U32 | FUTEX2_PRIVATE), reserved
    waitv = ctypes.create_string_buffer(struct.pack("QQII", val, page, 2 | 128, 0))
    FUTEX, PRIVATE = 202, 128
    report = {
        "flock_sh": sc(73, fd, 1 | 4),  # LOCK_SH | LOCK_NB
        "fcntl_setlk": sc(72, fd, 6, flock),  # F_SETLK, F_RDLCK
        "fcntl_getlk": sc(72, fd, 5, flock),  # F_GETLK: whose lock is there (another tenant's)
        "fcntl_ofd_setlk": sc(72, fd, 37, flock),  # F_OFD_SETLK
        "fcntl_ofd_getlk": sc(72, fd, 36, flock),
        "fcntl_setlease": sc(72, fd, 1024, 0),  # F_SETLEASE F_RDLCK
        "fcntl_getlease": sc(72, fd, 1025),
        "fcntl_notify": sc(72, fd, 1026, 0),  # F_NOTIFY (dnotify)
        "inotify_init": sc(253),
        "inotify_init1": sc(294, 0),
        "fanotify_init": sc(300, 0, 0),
        "mincore": sc(27, page, 4096, vec),
        "preadv2_nowait": sc(327, fd, ctypes.byref(ctypes.c_void_p(0)), 0, 0, 0, 8),  # RWF_NOWAIT
        "cachestat": sc(451, fd, ctypes.create_string_buffer(16), ctypes.create_string_buffer(40), 0),
        "futex_waitv": sc(449, waitv, 1, 0, zero, 1),  # CLOCK_MONOTONIC
        "futex2_wake": sc(454, page, 0xFFFFFFFF, 1, 2),  # FUTEX2_SIZE_U32, shared
        "futex2_wake_private": sc(454, page, 0xFFFFFFFF, 1, 2 | 128),
        "futex2_wait": sc(455, page, val, 0xFFFFFFFF, 2, zero, 1),
        "futex2_requeue": sc(456, waitv, 0, 1, 0),
        "madvise_mergeable": sc(28, anon, 4096, 12),  # KSM: merged with another tenant's page
        "madvise_unmergeable": sc(28, anon, 4096, 13),
        "futex_wake_shared": sc(FUTEX, page, 1, 1),
        "futex_wait_shared": sc(FUTEX, page, 0, val, zero),
        "futex_wait_bitset_shared": sc(FUTEX, page, 9, val, zero, 0, 0xFFFFFFFF),
        "futex_wake_bitset_shared": sc(FUTEX, page, 10, 1, 0, 0, 0xFFFFFFFF),
        "futex_requeue_shared": sc(FUTEX, page, 3, 1, 1, page + 64),
        "futex_cmp_requeue_shared": sc(FUTEX, page, 4, 1, 1, page + 64, val),
        "futex_wake_op_shared": sc(FUTEX, page, 5, 1, 1, page + 64, 0),
        "futex_lock_pi_shared": sc(FUTEX, page, 6, 0, zero),
        "futex_trylock_pi_shared": sc(FUTEX, page, 8),
        "futex_unlock_pi_shared": sc(FUTEX, page, 7),
        "futex_wait_requeue_pi_shared": sc(FUTEX, page, 11, val, zero, page + 64),
        "futex_lock_pi2_shared": sc(FUTEX, page, 13, 0, zero),
        "futex_wait_realtime_shared": sc(FUTEX, page, 256, val, zero),  # FUTEX_CLOCK_REALTIME
    }
    os.close(fd)
    final(report)
    """
)
"""Each outcome is ``"allowed"`` or the errno's name."""

#: The shared futex waits of ``REFUSED_PRIMITIVES``: the filter answers them with EAGAIN (a wake
#: that came too late, which every waiter takes as a reason to look at its word again).
SHARED_WAITS = frozenset({"futex_wait_shared", "futex_wait_bitset_shared", "futex_wait_realtime_shared"})


def not_refused(report: dict[str, str]) -> dict[str, str]:
    """The outcomes of ``REFUSED_PRIMITIVES`` that are not the filter's refusal: EAGAIN for a shared
    wait, EPERM (denied) or ENOSYS (unlisted) for everything else."""
    return {
        call: outcome
        for call, outcome in report.items()
        if outcome not in ({"EAGAIN"} if call in SHARED_WAITS else {"EPERM", "ENOSYS"})
    }


# --------------------------------------------------------------------------- host-wide counters

#: One bit per slot of this many seconds (the counter channels).
SLOT = 0.02
#: Bits a counter sender sends.
COUNTER_BITS = 100
#: Threads a counter sender starts in a 1-slot.
THREADS_PER_ONE = 8

COUNTERS = ("sysinfo_procs", "proc_stat_processes", "proc_loadavg_threads", "new_thread_id")
#: Counters read as their step from one sample to the next (the others as their value).
STEPS = frozenset({"proc_stat_processes", "new_thread_id"})

_COUNTER_READ = textwrap.dedent(
    r"""
    import ctypes, os, time, _thread

    libc = ctypes.CDLL(None, use_errno=True)

    def sysinfo_procs():
        info = ctypes.create_string_buffer(128)
        if libc.sysinfo(info) != 0:
            raise OSError(ctypes.get_errno(), "sysinfo")
        return int.from_bytes(info.raw[80:82], "little")  # struct sysinfo's procs (u16)

    def proc_stat_processes():
        with open("/proc/stat", "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"processes "):
                    return int(line.split()[1])
        raise OSError(0, "no processes line")

    def proc_loadavg_threads():
        with open("/proc/loadavg", "rb") as f:
            fields = f.read().split()
        if len(fields) < 4:
            raise OSError(0, "no thread count")
        return int(fields[3].split(b"/")[1])

    def new_thread_id():  # the pid namespace's next id: every thread of the namespace takes one
        got, done = [], _thread.allocate_lock()
        done.acquire()

        def note():
            got.append(libc.syscall(186))  # gettid
            done.release()

        _thread.start_new_thread(note, ())
        done.acquire()
        return got[0]

    READ = {"sysinfo_procs": sysinfo_procs, "proc_stat_processes": proc_stat_processes,
            "proc_loadavg_threads": proc_loadavg_threads, "new_thread_id": new_thread_id}[WHAT]
    """
)

_COUNTER_SENDER = textwrap.dedent(
    r"""
    bits = message(COUNTER_BITS, SEED)
    held = {"hold": False, "up": 0}

    def hold():
        held["up"] += 1
        while held["hold"]:
            time.sleep(SLOT / 10)
        held["up"] -= 1

    begin = BEGIN  # both sides' slots start at this wall-clock time
    while time.time() < begin:
        time.sleep(0.005)
    # Manchester code: a 1 is (threads, none), a 0 is (none, threads); the receiver compares the
    # two slots of each bit, so the counter's drift (everything else on the machine) cancels out.
    for i, slot in enumerate(s for bit in bits for s in ((1, 0) if bit else (0, 1))):
        end = begin + (i + 1) * SLOT
        if slot:
            held["hold"] = True
            for _ in range(THREADS_PER_ONE):
                try:
                    _thread.start_new_thread(hold, ())
                except RuntimeError:  # the last slot's threads have not all ended (RLIMIT_NPROC)
                    break
        while time.time() < end - SLOT / 4:
            time.sleep(SLOT / 20)
        held["hold"] = False
        while held["up"]:
            time.sleep(0.0005)
        while time.time() < end:
            time.sleep(SLOT / 20)
    final({"sent": "".join(map(str, bits))})
    """
)

_COUNTER_RECEIVER = textwrap.dedent(
    r"""
    try:
        READ()
    except OSError as exc:
        final({"refused": str(exc), "samples": []})
    else:
        begin = BEGIN
        samples = []
        while time.time() < begin:
            time.sleep(0.005)
        for i in range(2 * COUNTER_BITS):
            mid = begin + (i + 0.5) * SLOT
            while time.time() < mid:
                time.sleep(SLOT / 20)
            samples.append(READ())
        final({"refused": None, "samples": samples})
    """
)


def counter_sender(what: str, begin: float) -> str:
    """A sender on host-wide counter ``what`` (one of ``COUNTERS``): threads in its 1-slots, the
    first slot starting at wall-clock time ``begin``."""
    return _program(
        _COUNTER_READ + _COUNTER_SENDER,
        WHAT=what,
        BEGIN=begin,
        SEED=SEED,
        SLOT=SLOT,
        COUNTER_BITS=COUNTER_BITS,
        THREADS_PER_ONE=THREADS_PER_ONE,
    )


def counter_receiver(what: str, begin: float) -> str:
    """The receiver of ``counter_sender(what, begin)``: the counter sampled in the middle of each
    slot."""
    return _program(
        _COUNTER_READ + _COUNTER_RECEIVER, WHAT=what, BEGIN=begin, SLOT=SLOT, COUNTER_BITS=COUNTER_BITS
    )


def counter_capacity(sent: str, samples: list[int], what: str) -> float:
    """Bits per second a counter channel carried: each bit decoded from its two slots (the first
    one higher: a 1; for the counters of ``STEPS``, the first one's step larger; a tie is half an error),
    and the capacity of a
    binary symmetric channel with the decoding's error rate, over the two slots a bit takes."""
    if not samples or len(samples) != 2 * len(sent):
        return 0.0
    if what in STEPS:
        # the first slot has no step of its own (no sample before it): its bit is a tie
        steps = [b - a for a, b in itertools.pairwise(samples)]
        values = [steps[0], *steps]
    else:
        values = list(samples)
    # a tie says nothing: half an error
    pairs = [(values[2 * i], values[2 * i + 1]) for i in range(len(sent))]
    wrong = [
        0.5 if a == b else float((a > b) != (bit == "1")) for (a, b), bit in zip(pairs, sent, strict=True)
    ]
    errors = sum(wrong) / len(sent)
    errors = min(errors, 1 - errors)
    if errors <= 0:
        return 1 / (2 * SLOT)
    return (1 + errors * math.log2(errors) + (1 - errors) * math.log2(1 - errors)) / (2 * SLOT)


# ------------------------------------------------------------------ mapping counts of shared pages

#: Pages of the shared file a mapping-count sender sets or leaves each slot (one bit each), slots,
#: and each slot's seconds.
MAP_PAGES = 48
MAP_SLOTS = 50
MAP_SLOT = 0.04
#: The files through which a worker's own mappings show how many processes map each page (the
#: mapping count of a page-cache page is the whole machine's): ``numa_maps``' ``mapmax``, the
#: ``Shared_*`` lines of ``smaps`` and ``smaps_rollup``.
MAP_VIEWS = ("/proc/self/numa_maps", "/proc/self/smaps", "/proc/self/smaps_rollup")

_MAP_COMMON = textwrap.dedent(
    r"""
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    # A file of Python's library that no process maps (CPython reads .py files): the same inode for
    # every worker of one image on a node, or of one host (the first of these a worker can open).
    for name in (os.path.dirname(os.__file__), "/usr/lib/python3.11", "/usr/lib/python3"):
        try:
            fd = os.open(os.path.join(name, "_pydecimal.py"), os.O_RDONLY)
            break
        except OSError:
            continue

    def map_page(i):  # one page, a mapping of its own (increasing offsets: no two mappings merge)
        addr = libc.mmap(None, 4096, 1, 1, fd, 4096 * i)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        ctypes.c_char.from_address(addr).value  # fault it in: the page is mapped here now
        return addr
    """
)

_MAP_SENDER = textwrap.dedent(
    r"""
    bits = message(MAP_PAGES * MAP_SLOTS, SEED)
    while time.time() < BEGIN:
        time.sleep(0.005)
    for s in range(MAP_SLOTS):  # a 1: the page is mapped here for the slot (its count is 2)
        end = BEGIN + (s + 1) * MAP_SLOT
        held = [map_page(i) for i in range(MAP_PAGES) if bits[s * MAP_PAGES + i]]
        while time.time() < end - MAP_SLOT / 5:
            time.sleep(MAP_SLOT / 40)
        for addr in held:
            libc.munmap(addr, 4096)
        while time.time() < end:
            time.sleep(MAP_SLOT / 40)
    final({"sent": "".join(map(str, bits))})
    """
)

_MAP_RECEIVER = textwrap.dedent(
    r"""
    refused = {}
    for view in MAP_VIEWS:
        try:
            with open(view, "rb") as f:
                f.read(1)
        except OSError as exc:
            refused[view] = errno.errorcode.get(exc.errno, str(exc.errno))
    got = []
    if MAP_VIEWS[0] not in refused:
        mine = {map_page(i): i for i in range(MAP_PAGES)}
        while time.time() < BEGIN:
            time.sleep(0.005)
        for s in range(MAP_SLOTS):
            mid = BEGIN + (s + 0.5) * MAP_SLOT
            while time.time() < mid:
                time.sleep(MAP_SLOT / 40)
            seen = [0] * MAP_PAGES
            with open(MAP_VIEWS[0], "rb") as f:
                for line in f:
                    page = mine.get(int(line.split(b" ", 1)[0], 16))
                    if page is not None:
                        seen[page] = int(b" mapmax=" in line)  # another process maps it too
            got.extend(seen)
    final({"bits": "".join(map(str, got)), "refused": refused})
    """
)


def mapcount_sender(begin: float, slots: int = MAP_SLOTS, slot: float = MAP_SLOT) -> str:
    """A sender through a page's mapping count: in each of ``slots`` slots of ``slot`` seconds (the
    first one at wall-clock time ``begin``) it maps the pages of the shared file whose bits are 1."""
    return _program(
        _MAP_COMMON + _MAP_SENDER, BEGIN=begin, SEED=SEED, MAP_PAGES=MAP_PAGES, MAP_SLOTS=slots, MAP_SLOT=slot
    )


def mapcount_receiver(begin: float, slots: int = MAP_SLOTS, slot: float = MAP_SLOT) -> str:
    """The receiver of ``mapcount_sender(begin, slots, slot)``: it maps every page itself and reads in
    the middle of each slot which of them another process maps too (``numa_maps``' ``mapmax``); it
    reports which of ``MAP_VIEWS`` it could not read (the errno's name)."""
    return _program(
        _MAP_COMMON + _MAP_RECEIVER,
        BEGIN=begin,
        MAP_PAGES=MAP_PAGES,
        MAP_SLOTS=slots,
        MAP_SLOT=slot,
        MAP_VIEWS=MAP_VIEWS,
    )


def capacity(sent: str, received: str, seconds: float) -> float:
    """Bits per second through a binary symmetric channel with the errors of ``received`` against
    ``sent`` (0 when nothing was received)."""
    if not received or len(received) != len(sent):
        return 0.0
    errors = sum(a != b for a, b in zip(sent, received, strict=True)) / len(sent)
    errors = min(errors, 1 - errors)
    if errors <= 0:
        return len(sent) / seconds
    return (1 + errors * math.log2(errors) + (1 - errors) * math.log2(1 - errors)) * len(sent) / seconds


def mapcount_capacity(sent: dict[str, str], got: dict[str, object], slot: float = MAP_SLOT) -> float:
    """Bits per second the mapping-count channel carried, from the sender's and receiver's reports
    (slots of ``slot`` seconds)."""
    received = got["bits"]
    assert isinstance(received, str)
    return capacity(sent["sent"], received, len(sent["sent"]) // MAP_PAGES * slot)


# ------------------------------------------------------------------------------ inode numbers

#: One bit per two slots of this many seconds (the inode-number channel), and the bits sent.
INODE_SLOT = 0.1
INODE_BITS = 40

_INODE_COMMON = textwrap.dedent(
    r"""
    def new_inode():
        # A /proc entry looked up afresh gets a new inode number from the kernel's one counter for
        # procfs, pipes, sockets ... (get_next_ino: per CPU, in batches of 1024 from one shared
        # count): open a file, look up its /proc/self/fd entry, close it, look the entry up again
        # (gone: the next lookup makes a new one).
        fd = os.open("/", os.O_RDONLY)
        try:
            return os.lstat("/proc/self/fd/%d" % fd).st_ino
        finally:
            os.close(fd)
            try:
                os.lstat("/proc/self/fd/%d" % fd)
            except OSError:
                pass
    """
)

_INODE_SENDER = textwrap.dedent(
    r"""
    bits = message(INODE_BITS, SEED)
    while time.time() < BEGIN:
        time.sleep(0.005)
    # Manchester code, like the counters: new inodes in the first or the second slot of a bit.
    for i, busy in enumerate(s for bit in bits for s in ((1, 0) if bit else (0, 1))):
        end = BEGIN + (i + 1) * INODE_SLOT
        while busy and time.time() < end - INODE_SLOT / 10:
            new_inode()
        while time.time() < end:
            time.sleep(INODE_SLOT / 20)
    final({"sent": "".join(map(str, bits))})
    """
)

_INODE_RECEIVER = textwrap.dedent(
    r"""
    while time.time() < BEGIN:
        time.sleep(0.005)
    gaps, last = [], new_inode()
    for i in range(2 * INODE_BITS):  # how many numbers others took in each slot
        end = BEGIN + (i + 1) * INODE_SLOT
        gap = 0
        while time.time() < end:
            now = new_inode()
            gap += max(now - last - 1, 0)
            last = now
        gaps.append(gap)
    final({"gaps": gaps})
    """
)


def inode_sender(begin: float) -> str:
    """A sender through the kernel's inode-number counter: it makes new ``/proc`` inodes in the first
    or the second ``INODE_SLOT`` of each bit (the first slot at wall-clock time ``begin``)."""
    return _program(
        _INODE_COMMON + _INODE_SENDER, BEGIN=begin, SEED=SEED, INODE_BITS=INODE_BITS, INODE_SLOT=INODE_SLOT
    )


def inode_receiver(begin: float) -> str:
    """The receiver of ``inode_sender(begin)``: it makes new inodes all the time and counts, slot by
    slot, the numbers others took in between."""
    return _program(
        _INODE_COMMON + _INODE_RECEIVER, BEGIN=begin, INODE_BITS=INODE_BITS, INODE_SLOT=INODE_SLOT
    )


def inode_capacity(sent: str, gaps: list[int]) -> float:
    """Bits per second the inode-number channel carried: each bit decoded from its two slots (more
    numbers taken in the first: a 1; a tie is half an error), as ``counter_capacity``."""
    if len(gaps) != 2 * len(sent):
        return 0.0
    wrong = [
        0.5 if a == b else float((a > b) != (bit == "1"))
        for (a, b), bit in zip(zip(gaps[::2], gaps[1::2], strict=True), sent, strict=True)
    ]
    errors = min(sum(wrong) / len(sent), 1 - sum(wrong) / len(sent))
    seconds = 2 * INODE_SLOT * len(sent)
    if errors <= 0:
        return len(sent) / seconds
    return (1 + errors * math.log2(errors) + (1 - errors) * math.log2(1 - errors)) * len(sent) / seconds
