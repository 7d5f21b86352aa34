"""Hostile review of ``parallel(...)``: reaching another subject's data through a
batch, as a tenant's program (the records pack, subject-scoped) and as a compromised worker (a batch
that names another subject anywhere it can). Every call of a batch is authorized and run as the
execute's trusted subject, and nothing else. And a resumed execute's worker whose batches are not the
call log's: each is a divergence, and a user's answer inside a batch answers that
batch only."""

from __future__ import annotations

import json
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.execution.replay import Entry, Journal, Pending, ReplayDiverged
from codemode_capabilities.records import RecordStore
from codemode_capabilities.records import capabilities as record_caps
from tests.adversarial.test_hostile_batch import outcome
from tests.support.recorder import ALICE, Recorder

BOB = authz.Subject("bob")


async def test_a_hostile_batch_runs_every_call_as_the_executes_subject() -> None:
    calls = [{"name": "util.whoami", "args": {}} for _ in range(4)]
    text, rec, run = await outcome("reply", json.dumps(calls))
    assert [r["value"] for r in run.value["results"]] == [{"value": ALICE.id}] * 4, text
    assert [i.subject for i in rec.authz_inputs] == [ALICE] * 4


@pytest.mark.parametrize(
    "calls",
    [
        [{"name": "util.whoami", "args": {}, "subject": "bob"}],  # a key of its own on the element
        [{"name": "util.whoami", "args": {"subject": "bob"}}],  # an argument the capability lacks
        [{"name": "util.whoami", "args": {}}, {"name": "util.whoami", "args": {"subject": {"id": "bob"}}}],
    ],
)
async def test_a_batch_that_names_another_subject_runs_nothing(calls: list[dict[str, Any]]) -> None:
    text, rec, _ = await outcome("reply", json.dumps(calls))
    assert text == "internal failure"
    assert rec.authz_inputs == [] and rec.handler_calls == []


async def test_a_batch_reaches_only_its_own_subjects_records() -> None:
    """Bob's batch asks for Alice's record ids (and guesses around them): each is not found, as one
    call by Bob would be, and Alice's records are unchanged."""
    records = RecordStore()
    builder = codemode.Builder(authorizer=Recorder(), runtime=codemode.ProcessRuntime())
    builder.register(*record_caps(records))
    server = builder.build()
    try:
        made = await server.run(
            'def main():\n    return [records.create(title="secret " + str(i))["id"] for i in range(3)]\n',
            subject=ALICE,
        )
        ids = made.value
        tried = [*ids, max(ids) + 1, max(ids) + 2]
        probe = (
            "def main():\n"
            f"    ids = {tried}\n"
            "    gets = parallel([(records.get, {'id': i}) for i in ids])\n"
            "    dels = parallel([(records.delete, {'id': i}) for i in ids])\n"
            "    ups = parallel([(records.update, {'id': i, 'title': 'mine'}) for i in ids])\n"
            "    return [gets, dels, ups, records.search()]\n"
        )
        got = await server.run(probe, subject=BOB)
        single = await server.run(f"def main():\n    return attempt(records.get, id={ids[0]})\n", subject=BOB)
    finally:
        await server.aclose()
    gets, dels, ups, mine = got.value
    # Alice's ids read exactly as ids nobody has: no existence oracle either.
    unseen = [{"ok": False, "error": f"capability failed: record {i} not found"} for i in tried]
    assert gets == dels == ups == unseen
    assert single.value == unseen[0]  # as one call by Bob
    assert mine["records"] == []
    assert [records.get(ALICE.id, i).title for i in ids] == ["secret 0", "secret 1", "secret 2"]


# A compromised worker on a resumed execute: its batches must be the log's calls, else nothing runs.

A, B, C = ("util.echo", '{"value":"a"}'), ("util.echo", '{"value":"b"}'), ("util.echo", '{"value":"c"}')


def logged(*calls: tuple[str, str]) -> list[Entry]:
    return [Entry(cap, args, True, '{"value":"x"}', None, 13, cap, "allow", "ok") for cap, args in calls]


@pytest.mark.parametrize(
    "sent",
    [
        [B, A],  # the log's calls in another order
        [A, C],  # another argument
        [A, B, C],  # past the recorded prefix, the rest not the pending call
        [A],  # then a batch of the rest (the next test): a batch is whole
    ],
)
def test_a_replayed_batch_must_be_the_logs_calls_in_order(sent: list[tuple[str, str]]) -> None:
    journal = Journal(logged(A, B), Pending(*C, True))
    if sent == [A]:
        assert journal.replay_batch(sent) == logged(A)  # a prefix of the log is its calls
        with pytest.raises(ReplayDiverged):
            journal.replay_batch([B, C])
        return
    with pytest.raises(ReplayDiverged):
        journal.replay_batch(sent)


@pytest.mark.parametrize("sent", [[B, A], [A], [B], [A, B, C], [A, C]])
def test_the_resumed_batch_must_be_the_pending_batch_itself(sent: list[tuple[str, str]]) -> None:
    pending = Pending(*B, True, (A, B), 1, {0: "accept"})
    with pytest.raises(ReplayDiverged):
        Journal([], pending, "accept").replay_batch(sent)


def test_a_single_call_cannot_take_the_answer_of_another_call_of_the_pending_batch() -> None:
    pending = Pending(*B, True, (A, B), 1, {0: "accept"})
    with pytest.raises(ReplayDiverged):
        Journal([], pending, "accept").replay(*A, True)


def test_an_answer_inside_a_batch_is_for_that_batch_only() -> None:
    """The answers of a resumed batch are gone once it is logged: a later batch asking at the same
    places is asked again, not answered by them."""
    journal = Journal([], Pending(*B, True, (A, B), 1, {0: "accept"}), "accept")
    assert journal.replay_batch([A, B]) is None  # the pending batch: it runs live
    first = Pending(*A, True, (A, B), 0)
    assert journal.has_answer(first) and journal.answer_for(first) == "accept"
    for entry in logged(A, B):
        journal.record(entry)
    later = Pending(*C, True, (C, A), 0)
    assert not journal.has_answer(later) and journal.answer_for(later) is None
