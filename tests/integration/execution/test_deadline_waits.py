"""A deadline that passes before the program began: while the execute waited for a
worker slot, or while its worker started. The client is told ``resource limit exceeded:
concurrency`` either way; the operator is told which wait it was, in the host log and in the
service's metric, and is sent to ``--max-concurrent-executions`` only for the slot: a deadline
shorter than a worker start is the deadline's fault. Real process workers (the classic spawn starts
an interpreter, which never takes 20 ms) and the service's own metrics as the observer."""

from __future__ import annotations

import logging

import pytest

import codemode
from codemode import authz
from codemode.common.errors import ExecutionTimeout, client_text
from codemode.runtimes.process import ProcessOptions
from codemode.service.metrics import Metrics

pytestmark = [pytest.mark.timeout(120)]

TRIVIAL = "def main():\n    return 1\n"


def _server(metrics: Metrics, deadline: float) -> codemode.Server:
    return codemode.Builder(
        authorizer=authz.allow_all(),
        limits=codemode.Limits(max_execution_time=deadline, max_concurrent_executions=1),
        runtime=codemode.ProcessRuntime(ProcessOptions(spawn="classic")),
        observer=metrics,
    ).build()


def _limits(metrics: Metrics, kind: str) -> float:
    return metrics.registry.get_sample_value("codemode_execute_limits_total", {"kind": kind}) or 0.0


async def test_a_deadline_passing_while_the_worker_starts_names_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    async with _server(metrics, 0.02) as server:
        await server.start()
        with (
            caplog.at_level(logging.WARNING, logger="codemode.execution"),
            pytest.raises(ExecutionTimeout) as err,
        ):
            await server.execute(TRIVIAL, subject=authz.Subject("alice"))
    assert client_text(err.value) == "resource limit exceeded: concurrency"  # the client's text stays
    assert _limits(metrics, "deadline_waiting_for_worker") == 1
    assert _limits(metrics, "deadline_waiting_for_slot") == _limits(metrics, "concurrency") == 0
    (line,) = [r.getMessage() for r in caplog.records if "deadline" in r.getMessage()]
    assert "while its worker was starting" in line and "--max-execution-time" in line, line
    assert "The deadline is what is short, not the slots" in line and "--pool" in line, line


async def test_a_deadline_passing_in_the_slot_queue_names_the_slots_and_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    async with _server(metrics, 0.05) as server:
        await server.start()
        slots = server._executor.slots  # the server's own slots: bob holds the one there is
        await slots.acquire("bob")
        try:
            with (
                caplog.at_level(logging.WARNING, logger="codemode.execution"),
                pytest.raises(ExecutionTimeout),
            ):
                await server.execute(TRIVIAL, subject=authz.Subject("alice"))
        finally:
            slots.release("bob")
    assert _limits(metrics, "deadline_waiting_for_slot") == 1
    assert _limits(metrics, "deadline_waiting_for_worker") == 0
    (line,) = [r.getMessage() for r in caplog.records if "deadline" in r.getMessage()]
    assert "while it waited for a worker slot: 1 of 1 slots" in line, line
    assert "--max-concurrent-executions" in line and "--max-execution-time" in line, line


async def test_a_refusal_at_the_quota_is_counted_as_its_kind() -> None:
    """The quota's refusal ends the execute before it waits for anything: kind ``quota``."""
    metrics = Metrics()
    server = codemode.Builder(
        authorizer=authz.allow_all(),
        limits=codemode.Limits(max_concurrent_executions=2),
        runtime=codemode.ProcessRuntime(),
        observer=metrics,
        subject_quota=1,
        reserved_slots=0,
    ).build()
    async with server:
        await server.start()
        quota = server._executor.quota  # alice's one execute in flight, as the quota counts it
        hold = await quota.acquire("alice", 1)
        assert hold is not None
        try:
            with pytest.raises(codemode.ResourceLimit) as err:
                await server.execute(TRIVIAL, subject=authz.Subject("alice"))
        finally:
            quota.release(hold)
    assert client_text(err.value) == "resource limit exceeded: quota"
    assert _limits(metrics, "quota") == 1 and _limits(metrics, "unknown") == 0
