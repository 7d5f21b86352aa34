"""What the reuse-mode suites share (tests/integration/runtimes/test_docker_reuse.py,
tests/adversarial/test_docker_reuse.py, tests/e2e_kubernetes/test_reuse.py): an observer that records
which sandbox (container or pod) served each execute, and a server over a ``ReusePool``."""

from __future__ import annotations

from typing import Any

import codemode
from codemode import authz
from codemode.execution.observe import ExecuteEvent, NullObserver
from codemode.runtimes.reuse import ReusePool, SupervisingRuntime


class Sandboxes(NullObserver):
    """Every execute's event; a lease's worker id is ``<sandbox>.<epoch>``."""

    def __init__(self) -> None:
        self.events: list[ExecuteEvent] = []

    def execute_outcome(self, event: ExecuteEvent) -> None:
        self.events.append(event)

    def workers(self) -> list[str]:
        return [e.worker_id for e in self.events]

    def sandbox(self, index: int) -> str:
        return self.events[index].worker_id.rpartition(".")[0]

    def sandboxes(self, subject: str | None = None) -> list[str]:
        """The sandbox of each execute (of ``subject`` only, when given), in order."""
        return [e.worker_id.rpartition(".")[0] for e in self.events if subject in (None, e.subject_id)]

    def owners(self) -> dict[str, set[str]]:
        """The subjects each sandbox served (one each, or a lease crossed subjects)."""
        owner: dict[str, set[str]] = {}
        for event in self.events:
            owner.setdefault(event.worker_id.rpartition(".")[0], set()).add(event.subject_id)
        return owner


async def reuse_server(
    runtime: SupervisingRuntime[Any], size: int = 1, limits: codemode.Limits | None = None, **pool: Any
) -> tuple[codemode.Server, ReusePool, Sandboxes]:
    """A started allow-all server over ``ReusePool(runtime, size, **pool)`` (``max_executes`` 50
    unless given) and the observer of its executes."""
    reuse = ReusePool(runtime, size, **{"max_executes": 50, **pool})
    seen = Sandboxes()
    server = codemode.Builder(
        authorizer=authz.allow_all(),
        runtime=reuse,
        observer=seen,
        limits=limits or codemode.Limits(max_execution_time=30.0),
    ).build()
    await server.start()
    return server, reuse, seen
