"""The process runtime: one fresh local worker process per execute (docs/reference/runtimes.md).

``runtime`` (``ProcessRuntime``, ``ProcessSandbox``: a worker started as a command), ``options``
(``ProcessOptions``: everything the runtime takes, checked), ``template`` and ``forked`` (the worker
template that forks each worker, and a forked worker), ``ipc_cleanup`` and ``posix_ipc_cleanup``
(what a worker uid left behind), ``host_memory`` (the host made non-dumpable).
"""

from .options import SPAWN_MODES, ProcessOptions, Spawn
from .runtime import (
    CLOSE_INPUT_GRACE,
    CONFINEMENT_CHECK,
    DEFAULT_UID_BASE,
    ORPHAN_PIPE_GRACE,
    UID_LOCK_DIR,
    ZOMBIE_GRACE,
    ProcessRuntime,
    ProcessSandbox,
    kill_uid,
)

__all__ = [
    "CLOSE_INPUT_GRACE",
    "CONFINEMENT_CHECK",
    "DEFAULT_UID_BASE",
    "ORPHAN_PIPE_GRACE",
    "SPAWN_MODES",
    "UID_LOCK_DIR",
    "ZOMBIE_GRACE",
    "ProcessOptions",
    "ProcessRuntime",
    "ProcessSandbox",
    "Spawn",
    "kill_uid",
]
