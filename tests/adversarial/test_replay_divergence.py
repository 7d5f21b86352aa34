"""Hostile review of replay: what a malicious worker sends on a resumed run, checked
against the call log (codemode.execution.replay) the host matches every call with.

The worker of a resumed run is the tenant's own code: it may send any call it likes. The log decides
what it gets without a dispatch; anything but the log's next call, or then the pending call exactly
as it was asked about, is a divergence, and nothing is dispatched.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

import codemode
from codemode.execution.replay import Entry, Journal, Pending, ReplayDiverged
from codemode.runtimes.process import ProcessOptions
from codemode_capabilities.records import RecordStore
from codemode_capabilities.records import capabilities as record_caps
from tests.integration.execution.test_suspension import ask, mcp, retry, share, store_of
from tests.support.approval import AskDeletes, create_then_delete
from tests.support.mcp_client import error_text, ledger

CREATE = ("cap-create", '{"title":"a"}')
DELETE_1 = ("cap-delete", '{"id":1}')
DELETE_2 = ("cap-delete", '{"id":2}')


def _entry(cap: str, args: str, attempt: bool = False) -> Entry:
    return Entry(cap, args, attempt, '{"id":1}', None, 8, "records.x", "allow", "ok")


def _batch_pending() -> Pending:
    """The second call of a batch [delete 1, delete 2] is asked about; delete 1 was accepted."""
    return Pending(DELETE_2[0], DELETE_2[1], True, (DELETE_1, DELETE_2), 1, {0: "accept"})


def test_a_single_call_cannot_stand_for_the_pending_call_of_a_batch() -> None:
    """The user was asked about the second call of a batch; a resumed worker that sends that call on
    its own (under attempt, same arguments) instead of the batch has diverged: it must not get the
    answer (before: it matched, took the accept and ran live, the batch's first call never ran)."""
    journal = Journal([_entry(*CREATE)], _batch_pending(), "accept")
    assert journal.replay(*CREATE, False) is not None
    with pytest.raises(ReplayDiverged):
        journal.replay(DELETE_2[0], DELETE_2[1], True)
    assert journal.take_answer() is None, "no answer reached the call"


def test_a_batch_cannot_stand_for_a_pending_single_call() -> None:
    journal = Journal([], Pending(DELETE_1[0], DELETE_1[1], True), "accept")
    with pytest.raises(ReplayDiverged):
        journal.replay_batch([DELETE_1])


def test_a_batch_sent_in_another_order_diverges() -> None:
    """A batch of the recorded prefix, or the pending batch, with its calls in another order gets
    no recorded results and no answer."""
    prefix = [_entry(*DELETE_1, True), _entry(*DELETE_2, True)]
    journal = Journal(prefix, Pending(CREATE[0], CREATE[1], False), "accept")
    with pytest.raises(ReplayDiverged):
        journal.replay_batch([DELETE_2, DELETE_1])
    pending = Journal([], _batch_pending(), "accept")
    with pytest.raises(ReplayDiverged):
        pending.replay_batch([DELETE_2, DELETE_1])
    assert pending.batch_answers == {}


@pytest.mark.parametrize(
    "sent",
    [
        (DELETE_1[0], '{"id":1 }', False),  # the same arguments, another text
        (DELETE_1[0], DELETE_2[1], False),  # another record
        ("cap-other", DELETE_1[1], False),  # another capability with the same arguments
        (DELETE_1[0], DELETE_1[1], True),  # under attempt where the program was not
    ],
)
def test_the_pending_call_is_only_the_call_asked_about(sent: tuple[str, str, bool]) -> None:
    journal = Journal([_entry(*CREATE)], Pending(DELETE_1[0], DELETE_1[1], False), "accept")
    journal.replay(*CREATE, False)
    with pytest.raises(ReplayDiverged):
        journal.replay(*sent)
    assert journal.take_answer() is None


def test_a_recorded_result_is_only_for_the_call_that_made_it() -> None:
    """A worker that skips the first call of the log, or asks for the second first, gets nothing."""
    journal = Journal(
        [_entry(*CREATE), _entry(*DELETE_1)], Pending(DELETE_2[0], DELETE_2[1], False), "accept"
    )
    with pytest.raises(ReplayDiverged):
        journal.replay(*DELETE_1, False)


# ------------------------------------------------------------------------------------------------
# End to end: the question asked on an honest server, the retry resumed (through the official MCP
# client) on a server sharing its store whose worker is hostile.
# ------------------------------------------------------------------------------------------------

HOSTILE = str(Path(__file__).with_name("replay_worker.py"))


def _server(records: RecordStore, runtime: Any = None) -> codemode.Server:
    builder = codemode.Builder(authorizer=AskDeletes(), runtime=runtime)
    builder.register(*record_caps(records))
    return builder.build()


async def _resumed_by(mode: str) -> tuple[types.CallToolResult, RecordStore]:
    records = RecordStore()
    records.create("alice", "other", None, None)  # record 1; the program's create makes record 2
    honest = _server(records)
    hostile = _server(records, codemode.ProcessRuntime(ProcessOptions(argv=[sys.executable, HOSTILE, mode])))
    share(honest, hostile)
    src = create_then_delete()
    try:
        async with mcp(honest) as a, mcp(hostile) as b:
            first = await ask(a, src)
            done = await retry(b, src, first.request_state or "")
        assert isinstance(done, types.CallToolResult)
        assert await store_of(honest).pending() == 0
        return done, records
    finally:
        await honest.aclose()
        await hostile.aclose()


@pytest.mark.parametrize("mode", ["pending_first", "other_args", "other_delete"])
async def test_a_hostile_resumed_worker_dispatches_nothing(mode: str) -> None:
    done, records = await _resumed_by(mode)
    assert error_text(done) == "internal failure"
    assert ledger(done)[-1][1] == "replay diverged"
    assert len(records.search("alice", None, None, None).records) == 2, "nothing was deleted or made"


@pytest.mark.parametrize("mode", ["final_first", "final_after_prefix"])
async def test_a_resumed_worker_that_ends_before_the_pending_call_fails_closed(mode: str) -> None:
    """An honest resumed program reaches the pending call; a worker that ends first (before or after
    the recorded prefix) has diverged (before: its final value was the execute's result)."""
    done, records = await _resumed_by(mode)
    assert len(records.search("alice", None, None, None).records) == 2, "nothing was deleted"
    assert error_text(done) == "internal failure"
