"""Where a forked worker's CPU goes, step by step (prints numbers; not a test).

    python -m tests.benchmarks.bench_worker_setup [--n 300] [--uid 61000]

One ``python -I`` process plays the process runtime's template (``codemode_worker.template``): it
imports and warms the worker's interpreter and compiles the filter once, then forks ``--n``
children per variant, serially, each doing the template's steps up to a point and then ``_exit``.
The CPU of a variant is the parent's (the fork, the reap) plus the child's (``wait4``'s rusage),
per child; each step's cost is the difference from the variant before it, so the steps add up to
the full worker (the last row) and the fork floor (the first row) is in the same run. Variants run
interleaved, round by round, so load from elsewhere hits them alike:

- ``fork + _exit``: the fork and reap alone;
- ``+ session, stdio, closerange``: ``setsid``, three ``dup2``, ``closerange(3, 2**20)``;
- ``+ rlimits``: the template's ``Limits.apply``;
- ``+ Landlock``: ``confinement.restrict_files``;
- ``+ uid drop, pdeathsig``: ``privileges.drop_privileges`` to ``--uid`` (as root) and the parent
  check;
- ``+ seccomp``: ``confinement.confine`` with the compiled filter (limits, not dumpable, the load,
  the ``memfd_create`` check);
- ``+ trivial program``: ``def main(): return 1`` run as a worker runs it (the interpreter thread),
  without frames;
- ``fork + program`` alone (``load_floors.fork_floor``'s floor).

The frames (a probe, the exec frame, the final frame) and the host's side are not in it: the
service's share is what ``bench_service_load`` prints beside this.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, os, resource, sys, time
from codemode_worker import confinement, entry, interpreter, privileges, template

n, uid = int(sys.argv[1]), int(sys.argv[2])
interpreter.warm_up()
compiled = confinement.compile_filter()
prepared = confinement.prepare_files()
keep = prepared.fd if prepared is not None else None
limits = template.Limits(cpu_seconds=60, address_space=0, open_files=64, max_processes=64)
null = os.open("/dev/null", os.O_RDWR)
parent = os.getpid()
exec_limits = interpreter.ExecLimits(
    max_steps=1_000_000, max_value_depth=32, max_value_bytes=1 << 20,
    max_native_calls=10, max_callstack=200, max_print_bytes=1024,
)

def program():
    outcome = interpreter.run_program("def main():\n    return 1\n", [], exec_limits, interpreter._WarmHost())
    return 0 if outcome.value == 1 else 1

def steps(upto, ruleset=False):
    if upto >= 1:
        os.setsid()
        for target in range(3):
            os.dup2(null, target)
        if keep is None:
            os.closerange(3, 1 << 20)
        else:
            os.closerange(3, keep)
            os.closerange(keep + 1, 1 << 20)
    if upto >= 2:
        limits.apply(own_uid=uid > 0)
    if upto >= 3:
        confinement.restrict_files(prepared if ruleset else None)
    if upto >= 4:
        if uid > 0:
            os.environ[privileges.UID_VARIABLE] = str(uid)
        privileges.drop_privileges()
        template._die_with(parent)
    if upto >= 5:
        confinement.confine(compiled if compiled is not None else confinement.prepare())
    if upto >= 6:
        return interpreter.on_interpreter_thread(program)
    return 0

VARIANTS = {
    "fork + _exit": lambda: steps(0),
    "+ session, stdio, closerange": lambda: steps(1),
    "+ rlimits": lambda: steps(2),
    "+ Landlock": lambda: steps(3),
    "+ Landlock, ruleset of the template": lambda: steps(3, True),
    "+ uid drop, pdeathsig": lambda: steps(4),
    "+ seccomp": lambda: steps(5),
    "+ trivial program": lambda: steps(6),
    "fork + program (the floor)": program,
}
cpu = {name: 0.0 for name in VARIANTS}
rounds = 10
for _ in range(rounds):
    for name, fn in VARIANTS.items():
        c0 = os.times()
        for _ in range(n // rounds):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = fn()
                finally:
                    os._exit(code)
            _, status, usage = os.wait4(pid, 0)
            if status:
                raise SystemExit(f"{name}: a child failed ({status})")
            cpu[name] += usage.ru_utime + usage.ru_stime
        c1 = os.times()
        cpu[name] += (c1.user - c0.user) + (c1.system - c0.system)
print(json.dumps({"n": rounds * (n // rounds), "cpu": cpu, "compiled": compiled is not None}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=300, help="children per variant (default 300)")
    p.add_argument("--uid", type=int, default=61000 if os.geteuid() == 0 else 0, help="uid to drop to")
    args = p.parse_args()
    out = subprocess.run(
        [sys.executable, "-I", "-c", SCRIPT, str(args.n), str(args.uid)],
        env={"CODEMODE_WORKER": "1"},
        capture_output=True,
        text=True,
        cwd="/",
        timeout=1200,
    )
    if out.returncode:
        raise SystemExit(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode)
    result = json.loads(out.stdout)
    n = result["n"]
    print(f"worker set-up, CPU per child (parent + child), n={n} each, filter compiled: {result['compiled']}")
    previous = rlimits = 0.0
    for name, seconds in result["cpu"].items():
        ms = seconds / n * 1e3
        if name.endswith("of the template"):  # beside "+ Landlock", not a step after it
            print(f"{name:<38} {ms:7.3f} ms  (step {ms - rlimits:+.3f} ms)")
            continue
        if name.startswith("+"):
            print(f"{name:<38} {ms:7.3f} ms  (step {ms - previous:+.3f} ms)")
        else:
            print(f"{name:<38} {ms:7.3f} ms")
        if name == "+ rlimits":
            rlimits = ms
        previous = ms


if __name__ == "__main__":
    main()
