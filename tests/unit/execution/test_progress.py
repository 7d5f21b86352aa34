"""The progress of one execute (codemode.execution.progress): coalesced, rate-bounded, rising, the
final state always sent, silent while a replayed prefix runs. No timing is asserted: the events
here all happen before the sender first runs, or are awaited one by one."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from codemode.common.outcomes import PRINTS_CUT_MARKER
from codemode.execution.progress import (
    NO_PROGRESS,
    PRINT_PREFIX,
    PROGRESS_INTERVAL,
    Progress,
    current_progress,
    reporting,
)
from codemode.execution.report import Report


class Sink:
    def __init__(self) -> None:
        self.notes: list[tuple[float, str]] = []
        self.arrived = asyncio.Event()

    async def __call__(self, progress: float, message: str) -> None:
        self.notes.append((progress, message))
        self.arrived.set()


def rising(notes: list[tuple[float, str]]) -> bool:
    return all(a[0] < b[0] for a, b in itertools.pairwise(notes))


async def test_ten_thousand_calls_in_a_burst_are_a_handful_of_notifications() -> None:
    sink = Sink()
    progress = Progress(sink)
    for _ in range(10_000):
        progress.call_started("records.get")
        progress.call_finished("records.get", "ok")
    await progress.aclose()
    # The sender ran once the burst was over: one notification with the latest state, nothing else.
    assert sink.notes == [(20_000.0, "records.get finished (10000): ok")]


async def test_the_final_state_is_sent_when_the_execute_ends() -> None:
    sink = Sink()
    progress = Progress(sink, interval=3600)  # nothing but the end can cut the wait short
    progress.call_started("records.get")
    await sink.arrived.wait()  # the first notification goes at once
    progress.call_finished("records.get", "ok")
    progress.printed("done\n")
    progress.call_started("records.create")
    progress.call_finished("records.create", "denied")
    await progress.aclose()
    assert sink.notes == [
        (1.0, "records.get started (1)"),
        (3.0, PRINT_PREFIX + "done\n"),  # older than the last call event: sent first
        (5.0, "records.create finished (2): denied"),
    ]
    assert rising(sink.notes) and progress.sent == 3


async def test_prints_and_calls_alternate_and_progress_rises() -> None:
    sink = Sink()
    progress = Progress(sink, interval=0)
    texts: list[str] = []
    for i in range(50):
        progress.call_started("records.get")
        text = f"line {i}\n"
        texts.append(text)
        progress.printed(text)
        progress.call_finished("records.get", "ok")
        await asyncio.sleep(0)  # let the sender run now and then
    await progress.aclose()
    assert rising(sink.notes)
    printed = "".join(m.removeprefix(PRINT_PREFIX) for _, m in sink.notes if m.startswith(PRINT_PREFIX))
    assert printed == "".join(texts)
    assert sink.notes[-1][1] == "records.get finished (50): ok"


async def test_nothing_goes_out_while_a_prefix_is_replayed() -> None:
    sink = Sink()
    progress = Progress(sink)
    progress.replaying = True
    for _ in range(3):
        progress.call_started("records.get")
        progress.printed("replayed\n")
        progress.call_finished("records.get", "ok")
    progress.call_finished("records.get", "ok")  # replayed calls are answered, never started
    progress.replaying = False
    progress.call_started("records.delete")
    await progress.aclose()
    # The counts went on: the first live event says how far the program is.
    assert [m for _, m in sink.notes] == ["records.delete started (5)"]


async def test_a_client_that_went_away_stops_its_notifications_not_the_execute() -> None:
    calls = 0

    async def broken(progress: float, message: str) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionResetError("gone")

    progress = Progress(broken, interval=0)
    for _ in range(5):
        progress.call_started("records.get")
        await asyncio.sleep(0)
    await progress.aclose()
    assert calls == 1 and progress.sent == 0


async def test_events_after_the_end_are_dropped() -> None:
    sink = Sink()
    progress = Progress(sink)
    await progress.aclose()
    progress.call_started("records.get")
    progress.printed("late\n")
    await asyncio.sleep(0)
    assert sink.notes == []


async def test_cancelled_while_closing_the_sender_stops() -> None:
    started = asyncio.Event()

    async def stuck(progress: float, message: str) -> None:
        started.set()
        await asyncio.Event().wait()  # a client that never reads

    progress = Progress(stuck)
    progress.call_started("records.get")
    closing = asyncio.ensure_future(progress.aclose())
    await started.wait()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert progress._task is not None and progress._task.done()


async def test_the_report_feeds_the_progress_the_call_asked_for() -> None:
    sink = Sink()
    assert current_progress() is NO_PROGRESS
    async with reporting(sink) as progress:
        report = Report(max_print_bytes=8, max_print_frames=4)
        assert report.progress is progress
        report.record("records.get", "allow", "ok")
        report.add_print("abcdefgh", cut=True)
    assert current_progress() is NO_PROGRESS
    assert Report(0).progress is NO_PROGRESS
    # The ledger word and the prints exactly as the result carries them (cut with its marker).
    assert sink.notes == [
        (1.0, "records.get finished (1): ok"),
        (2.0, PRINT_PREFIX + "abcdefgh" + PRINTS_CUT_MARKER),
    ]


def test_the_reference_states_the_bound_and_the_prefix() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "reference" / "tools.md").read_text("utf-8")
    text = " ".join(page.split())
    assert f"at most one notification every {PROGRESS_INTERVAL:g} seconds" in text
    assert f"`{PRINT_PREFIX}` followed by the text" in text
