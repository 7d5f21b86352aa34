"""Dropping root inside a process-runtime worker, before any program runs.

A process runtime whose host runs as root starts the worker as root (so the interpreter can load
from wherever it is installed, e.g. under a 0700 home) and gives it a uid of its own in
``CODEMODE_WORKER_UID``. The worker switches its real, effective and saved uid and gid to that
value, with no supplementary groups, after warming up and **before it reads the first frame**: no
program text has been seen while it is root. The host checks the result itself (the uids in
``/proc/<pid>/status``) before it hands the worker out; a worker that cannot drop exits.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["EXIT_PRIVILEGES", "UID_VARIABLE", "drop_privileges"]

UID_VARIABLE = "CODEMODE_WORKER_UID"
EXIT_PRIVILEGES = 4


def drop_privileges(environ: Mapping[str, str] | None = None) -> None:
    """Switch to the uid in ``CODEMODE_WORKER_UID`` (nothing when unset); ``SystemExit`` with
    ``EXIT_PRIVILEGES`` when it is invalid or the switch does not hold."""
    env = os.environ if environ is None else environ
    value = env.get(UID_VARIABLE)
    if value is None:
        return
    if not value.isdigit() or int(value) <= 0:
        raise SystemExit(EXIT_PRIVILEGES)
    uid = int(value)
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError:
        raise SystemExit(EXIT_PRIVILEGES) from None
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
        raise SystemExit(EXIT_PRIVILEGES)
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:  # still able to regain root: refuse to run anything
        raise SystemExit(EXIT_PRIVILEGES)
    os.environ.pop(UID_VARIABLE, None)
