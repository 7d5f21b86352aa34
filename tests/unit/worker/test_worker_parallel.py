"""The worker's side of ``parallel(...)``: the frames, the channel, and the builtin
against a scripted host (and, end to end, ``python -m codemode_worker`` spoken to like a host)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from codemode_worker.channel import HostChannel
from codemode_worker.interpreter import (
    ExecLimits,
    HostProtocolError,
    NativeAborted,
    Outcome,
    Reply,
    run_program,
)
from codemode_worker.protocol import (
    HOST_KINDS,
    WORKER_KINDS,
    ProtocolError,
    decode_body,
    encode_frame,
    read_frame,
    validate_frame,
)
from tests.unit.worker.test_worker_entry import Worker

LIMITS = ExecLimits(
    max_steps=1_000_000, max_value_depth=32, max_value_bytes=1 << 20, max_native_calls=100, max_callstack=200
)
STR = {"t": "str"}
MANIFEST = [
    {"name": "records.lookup", "input": {"t": "record", "fields": [{"name": "key", "shape": STR}]}},
    {"name": "records.status", "input": {"t": "record", "fields": []}},
]


class BatchHost:
    """Answers each call of a batch from ``answer`` (default: echoes the call), remembers the batches
    and the single calls."""

    def __init__(self, answer: Any = None) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answer = answer

    def call(self, name: str, args: dict[str, Any], attempt: bool) -> Reply:
        self.calls.append((name, args))
        return Reply.succeeded({"single": name})

    def invalid(self, name: str, message: str, attempt: bool) -> Reply:
        raise NativeAborted("invalid")

    def batch(self, calls: list[dict[str, Any]]) -> list[Reply]:
        self.batches.append(calls)
        if self.answer is not None:
            return list(self.answer(calls))
        return [
            Reply.succeeded({"echo": c["args"]}) if "args" in c else Reply.failed("invalid: " + c["invalid"])
            for c in calls
        ]

    def prints(self, text: str, cut: bool) -> None:
        return None


def run(source: str, host: BatchHost | None = None, limits: ExecLimits = LIMITS) -> Outcome:
    return run_program(source, MANIFEST, limits, host or BatchHost())


def main(body: str) -> str:
    return "def main():\n    return " + body + "\n"


# ------------------------------------------------------------------------------------------- frames

GOOD_FRAMES = [
    {
        "k": "native_batch",
        "seq": 3,
        "calls": [{"name": "a.b", "args": {"x": 1}}, {"name": "a.b", "invalid": "m"}],
    },
    {
        "k": "native_batch_result",
        "seq": 3,
        "results": [{"ok": True, "value": None}, {"ok": False, "error": "e"}],
    },
]
BAD_FRAMES = [
    {"k": "native_batch", "seq": 1, "calls": []},
    {"k": "native_batch", "seq": 1, "calls": {}},
    {"k": "native_batch", "seq": 0, "calls": [{"name": "a.b", "args": {}}]},
    {"k": "native_batch", "seq": 1, "calls": [{"name": "a.b", "args": {}, "invalid": "m"}]},
    {"k": "native_batch", "seq": 1, "calls": [{"name": "", "args": {}}]},
    {"k": "native_batch", "seq": 1, "calls": [{"name": "a.b", "args": []}]},
    {"k": "native_batch", "seq": 1, "calls": [{"name": "a.b", "invalid": 1}]},
    {"k": "native_batch", "seq": 1, "calls": ["a.b"]},
    {"k": "native_batch", "seq": 1, "calls": [{"name": "a.b", "args": {}}], "extra": 1},
    {"k": "native_batch_result", "seq": 1, "results": []},
    {"k": "native_batch_result", "seq": 1, "results": [{"ok": 1, "value": 1}]},
    {"k": "native_batch_result", "seq": 1, "results": [{"ok": True, "value": 1, "error": "e"}]},
    {"k": "native_batch_result", "seq": 1, "results": [{"ok": False, "error": ""}]},
    {"k": "native_batch_result", "seq": 1, "results": [{"ok": False, "value": 1}]},
    {"k": "native_batch_result", "seq": 1, "results": [{"value": 1}]},
]


@pytest.mark.parametrize("frame", GOOD_FRAMES)
def test_batch_frames_are_valid(frame: dict[str, Any]) -> None:
    assert decode_body(encode_frame(frame)[4:]) == frame


@pytest.mark.parametrize("frame", BAD_FRAMES)
def test_malformed_batch_frames_are_violations(frame: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        validate_frame(frame)


def test_each_side_reads_only_its_own_batch_kind() -> None:
    assert "native_batch" in WORKER_KINDS and "native_batch" not in HOST_KINDS
    assert "native_batch_result" in HOST_KINDS and "native_batch_result" not in WORKER_KINDS


# ------------------------------------------------------------------------------------------ channel


def channel(*replies: dict[str, Any], seq: int = 0) -> tuple[HostChannel, io.BytesIO]:
    out = io.BytesIO()
    chan = HostChannel(io.BytesIO(b"".join(encode_frame(r) for r in replies)), out)
    chan.seq = seq
    return chan, out


def test_a_batch_takes_its_first_calls_seq_and_uses_one_per_call() -> None:
    results = [{"ok": True, "value": 1}, {"ok": False, "error": "permission denied"}]
    chan, out = channel({"k": "native_batch_result", "seq": 5, "results": results}, seq=4)
    calls: list[dict[str, Any]] = [{"name": "a.b", "args": {}}, {"name": "a.b", "invalid": "m"}]
    assert chan.batch(calls) == [Reply.succeeded(1), Reply.failed("permission denied")]
    assert chan.seq == 6
    out.seek(0)
    assert read_frame(out, 1 << 20, WORKER_KINDS) == {"k": "native_batch", "seq": 5, "calls": calls}


@pytest.mark.parametrize(
    "reply",
    [
        {"k": "native_batch_result", "seq": 2, "results": [{"ok": True, "value": 1}] * 2},
        {"k": "native_batch_result", "seq": 1, "results": [{"ok": True, "value": 1}]},
        {"k": "native_batch_result", "seq": 1, "results": [{"ok": True, "value": 1}] * 3},
        {"k": "native_result", "seq": 1, "value": 1},
    ],
)
def test_a_batch_reply_for_another_batch_or_count_is_a_violation(reply: dict[str, Any]) -> None:
    chan, _ = channel(reply)
    with pytest.raises(HostProtocolError):
        chan.batch([{"name": "a.b", "args": {}}] * 2)


def test_native_abort_ends_a_batch() -> None:
    chan, _ = channel({"k": "native_abort", "seq": 1})
    with pytest.raises(NativeAborted):
        chan.batch([{"name": "a.b", "args": {}}])


# ------------------------------------------------------------------------------------------ builtin


def test_calls_are_collected_into_one_batch_in_order_with_invalid_ones_as_diagnostics() -> None:
    host = BatchHost()
    outcome = run(
        main(
            'parallel([(records.lookup, {"key": "a"}), (records.status, {}), [records.lookup, {"key": 1}]])'
        ),
        host,
    )
    assert host.batches == [
        [
            {"name": "records.lookup", "args": {"key": "a"}},
            {"name": "records.status", "args": {}},
            {"name": "records.lookup", "invalid": 'argument "key" must be str, got int'},
        ]
    ]
    assert host.calls == []
    assert outcome == Outcome.final(
        [
            {"ok": True, "value": {"echo": {"key": "a"}}},
            {"ok": True, "value": {"echo": {}}},
            {"ok": False, "error": 'invalid: argument "key" must be str, got int'},
        ]
    )


def test_a_program_without_parallel_sends_no_batch() -> None:
    host = BatchHost()
    assert run(main('records.lookup(key="a")'), host) == Outcome.final({"single": "records.lookup"})
    assert host.batches == [] and host.calls == [("records.lookup", {"key": "a"})]


def test_the_batch_counts_against_the_calls_left_before_any_call() -> None:
    host = BatchHost()
    limits = LIMITS._replace(max_native_calls=4)
    source = (
        "def main():\n    records.status()\n    records.status()\n"
        "    return parallel([(records.status, {})] * 3)\n"
    )
    assert run(source, host, limits) == Outcome.failed("resource_limit", "native calls")
    assert host.batches == [] and len(host.calls) == 2
    exact = "def main():\n    records.status()\n    return parallel([(records.status, {})] * 3)\n"
    assert run(exact, BatchHost(), limits).kind == "final"


def test_the_batch_arguments_together_are_bounded() -> None:
    limits = LIMITS._replace(max_value_bytes=100)
    host = BatchHost(answer=lambda calls: [Reply.succeeded(1) for _ in calls])
    assert run(main('parallel([(records.lookup, {"key": "x" * 30})] * 2)'), host, limits).kind == "final"
    over = run(main('parallel([(records.lookup, {"key": "x" * 30})] * 4)'), BatchHost(), limits)
    assert over == Outcome.failed("resource_limit", "value size")


def test_the_batch_results_together_are_bounded() -> None:
    limits = LIMITS._replace(max_value_bytes=100)
    host = BatchHost(answer=lambda calls: [Reply.succeeded("y" * 20) for _ in calls])
    assert run(main("len(parallel([(records.status, {})] * 2))"), host, limits) == Outcome.final(2)
    over = run(main("parallel([(records.status, {})] * 3)"), host, limits)
    assert over == Outcome.failed("resource_limit", "value size")


@pytest.mark.parametrize(
    "answer",
    [
        lambda calls: [Reply.succeeded(1) for _ in calls],  # a result for a call that did not bind
        lambda calls: [Reply.failed("") for _ in calls],
        lambda calls: [Reply.succeeded(float("nan")) for _ in calls],
    ],
)
def test_a_host_answer_that_does_not_fit_its_call_stops_the_program(answer: Any) -> None:
    host = BatchHost(answer=answer)
    with pytest.raises(HostProtocolError):
        run(main('parallel([(records.lookup, {"key": 1})])'), host)


def test_deep_results_cross_too() -> None:
    limits = LIMITS._replace(max_value_depth=300)
    deep: Any = 1
    for _ in range(250):
        deep = [deep]
    host = BatchHost(answer=lambda calls: [Reply.succeeded(deep) for _ in calls])
    outcome = run(main("parallel([(records.status, {})])[0]['value']"), host, limits)
    assert outcome == Outcome.final(deep)


def test_parallel_end_to_end_over_the_workers_streams() -> None:
    worker = Worker()
    try:
        worker.exec(
            "def main():\n    a = records.lookup(key='a')\n"
            "    return [a, parallel([(records.lookup, {'key': 'b'}), (records.lookup, {'key': 2})])]\n"
        )
        assert worker.recv() == {"k": "native_call", "seq": 1, "name": "records.lookup", "args": {"key": "a"}}
        worker.send({"k": "native_result", "seq": 1, "value": "A"})
        assert worker.recv() == {
            "k": "native_batch",
            "seq": 2,
            "calls": [
                {"name": "records.lookup", "args": {"key": "b"}},
                {"name": "records.lookup", "invalid": 'argument "key" must be str, got int'},
            ],
        }
        results = [{"ok": True, "value": "B"}, {"ok": False, "error": "invalid capability arguments"}]
        worker.send({"k": "native_batch_result", "seq": 2, "results": results})
        assert worker.recv() == {"k": "final", "value": ["A", results]}
    finally:
        worker.close()
