"""Wire protocol: framing, strict decoding, per-kind validation."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import pytest

from codemode_worker import PROTOCOL_VERSION, WORKER_ENV_MARKER
from codemode_worker.protocol import (
    ALL_KINDS,
    HOST_KINDS,
    WORKER_KINDS,
    FrameDecoder,
    ProtocolError,
    TruncatedFrame,
    decode_body,
    encode_frame,
    encode_native_call,
    read_exact,
    read_frame,
    validate_frame,
    validate_manifest,
)

LIMITS = {
    "max_steps": 1_000_000,
    "max_value_depth": 32,
    "max_value_bytes": 1 << 20,
    "max_native_calls": 100,
    "max_callstack": 200,
}
RECORD = {"t": "record", "fields": [{"name": "key", "shape": {"t": "str"}}]}

VALID: list[dict[str, Any]] = [
    {"k": "probe", "v": 1},
    {"k": "probe_ack", "v": 1},
    {
        "k": "exec",
        "v": 1,
        "source": "def main():\n  return 1\n",
        "manifest": [{"name": "records.lookup", "input": RECORD}],
        "limits": LIMITS,
    },
    {"k": "native_call", "seq": 1, "name": "records.lookup", "args": {"key": "a"}},
    {"k": "native_result", "seq": 1, "value": {"n": [1, 2.5, None, True, "é"]}},
    {"k": "native_abort", "seq": 3},
    {"k": "final", "value": None},
    {"k": "final_error", "error": "invalid_program", "message": "<codemode>:1:1: boom"},
    {"k": "native_attempt", "seq": 2, "name": "records.lookup", "args": {}},
    {"k": "native_invalid", "seq": 4, "name": "records.lookup", "message": "m", "attempt": True},
    {"k": "native_error", "seq": 2, "error": "permission denied"},
    {"k": "print", "text": "hello\n", "cut": False},
    {
        "k": "exec",
        "v": 1,
        "source": "",
        "manifest": [],
        "limits": {**LIMITS, "max_print_bytes": 1},
    },
]


def frame_bytes(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_constants() -> None:
    assert PROTOCOL_VERSION == 1
    assert WORKER_ENV_MARKER == "CODEMODE_WORKER"
    assert HOST_KINDS | WORKER_KINDS == ALL_KINDS
    assert not HOST_KINDS & WORKER_KINDS


@pytest.mark.parametrize("frame", VALID, ids=lambda f: f["k"])
def test_round_trip(frame: dict[str, Any]) -> None:
    data = encode_frame(frame)
    assert struct.unpack(">I", data[:4])[0] == len(data) - 4
    assert FrameDecoder(1 << 20).feed(data) == [frame]
    assert read_frame(io.BytesIO(data), 1 << 20, ALL_KINDS) == frame


def test_encoding_is_compact_utf8() -> None:
    data = encode_frame({"k": "final", "value": "é"})
    assert data[4:] == '{"k":"final","value":"é"}'.encode()


def test_decoder_handles_byte_by_byte_and_batches() -> None:
    stream = b"".join(encode_frame(f) for f in VALID)
    decoder = FrameDecoder(1 << 20)
    got: list[dict[str, Any]] = []
    for i in range(len(stream)):
        got.extend(decoder.feed(stream[i : i + 1]))
    assert got == VALID
    assert decoder.buffered == 0
    decoder.close()
    assert FrameDecoder(1 << 20).feed(stream) == VALID


def test_decoder_gives_the_same_frames_for_every_two_chunk_split() -> None:
    # Whole frames at the front of a chunk are decoded in place, a trailing partial one is held over:
    # every split point of a stream must give the same frames.
    stream = b"".join(encode_frame(f) for f in VALID)
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder(1 << 20)
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert got == VALID, cut
        assert decoder.buffered == 0
        decoder.close()


def test_oversize_rejected_behind_whole_frames_in_the_same_chunk() -> None:
    ok = encode_frame({"k": "probe", "v": 1})
    decoder = FrameDecoder(len(ok) - 4)
    with pytest.raises(ProtocolError, match="exceeds"):
        decoder.feed(ok + struct.pack(">I", len(ok)) + b"{")  # the cap is checked on the header
    assert decoder.buffered == 0


def test_native_call_fast_encoding_matches_the_checked_encoder() -> None:
    for args in ({}, {"value": 'é\u2028"x'}, {"n": [1, 2.5, None, True], "m": {"k": {"z": []}}}):
        frame = {"k": "native_call", "seq": 7, "name": "util.echo", "args": args}
        assert encode_native_call(7, "util.echo", args) == encode_frame(frame)
        attempt = {**frame, "k": "native_attempt"}
        assert encode_native_call(7, "util.echo", args, attempt=True) == encode_frame(attempt)
    with pytest.raises(ProtocolError):
        encode_native_call(1, "a.b", {"x": float("nan")})
    with pytest.raises(ProtocolError):
        encode_native_call(1, "a.b", {"x": "\ud800"})


def test_oversize_rejected_before_body_is_buffered() -> None:
    decoder = FrameDecoder(10)
    with pytest.raises(ProtocolError, match="exceeds"):
        decoder.feed(struct.pack(">I", 11))  # header alone is enough
    assert decoder.buffered == 0
    with pytest.raises(ProtocolError):  # a failed decoder stays failed
        decoder.feed(encode_frame({"k": "probe", "v": 1}))


def test_size_cap_exactly_at_limit_passes() -> None:
    data = encode_frame({"k": "final", "value": "x"})
    body_len = len(data) - 4
    assert FrameDecoder(body_len).feed(data) == [{"k": "final", "value": "x"}]
    with pytest.raises(ProtocolError):
        FrameDecoder(body_len - 1).feed(data)
    with pytest.raises(ProtocolError):
        read_frame(io.BytesIO(data), body_len - 1, ALL_KINDS)


def test_huge_declared_length_is_not_allocated() -> None:
    with pytest.raises(ProtocolError):
        read_frame(io.BytesIO(b"\xff\xff\xff\xff" + b"{}"), 1 << 26, ALL_KINDS)


def test_truncated_frames() -> None:
    data = encode_frame({"k": "probe", "v": 1})
    decoder = FrameDecoder(1 << 20)
    assert decoder.feed(data[:-1]) == []
    with pytest.raises(TruncatedFrame):
        decoder.close()
    header_only = FrameDecoder(1 << 20)
    header_only.feed(data[:2])
    with pytest.raises(TruncatedFrame):
        header_only.close()
    with pytest.raises(TruncatedFrame):
        read_frame(io.BytesIO(data[:-1]), 1 << 20, ALL_KINDS)
    with pytest.raises(TruncatedFrame):
        read_frame(io.BytesIO(data[:3]), 1 << 20, ALL_KINDS)
    assert read_frame(io.BytesIO(b""), 1 << 20, ALL_KINDS) is None


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xff\xfe",
        b'{"k":"probe","v":1',
        b"[1, 2]",
        b'"probe"',
        b'{"k":"probe","v":NaN}',
        b'{"k":"final","value":Infinity}',
        b'{"k":"final","value":-Infinity}',
        b'{"k":"final","value":1e400}',
        b'{"k":"final","value":"\\ud800"}',
        b'{"k":"probe","v":1,"v":1}',
        b'{"k":"probe","v":1} x',
        b'{"k":"final","value":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
    ids=[
        "empty",
        "bad-utf8",
        "truncated-json",
        "array",
        "string",
        "nan",
        "infinity",
        "neg-infinity",
        "overflowing-float",
        "lone-surrogate",
        "duplicate-key",
        "trailing-garbage",
        "deep-json",
    ],
)
def test_bad_bodies(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_body(body, ALL_KINDS)
    with pytest.raises(ProtocolError):
        FrameDecoder(1 << 30).feed(frame_bytes(body))


def test_surrogate_pairs_are_fine() -> None:
    body = b'{"k":"final","value":"\\ud83d\\ude00"}'
    assert decode_body(body, ALL_KINDS) == {"k": "final", "value": "😀"}


@pytest.mark.parametrize(
    "obj",
    [
        {"v": 1},
        {"k": "nope"},
        {"k": 1},
        {"k": "probe"},
        {"k": "probe", "v": 1, "extra": 0},
        {"k": "probe", "v": 2},
        {"k": "probe", "v": True},
        {"k": "probe", "v": "1"},
        {"k": "native_call", "seq": 0, "name": "a.b", "args": {}},
        {"k": "native_call", "seq": 1.0, "name": "a.b", "args": {}},
        {"k": "native_call", "seq": True, "name": "a.b", "args": {}},
        {"k": "native_call", "seq": 2**63, "name": "a.b", "args": {}},
        {"k": "native_call", "seq": 1, "name": "", "args": {}},
        {"k": "native_call", "seq": 1, "name": "a.b", "args": []},
        {"k": "native_call", "seq": 1, "name": 5, "args": {}},
        {"k": "native_result", "seq": 1},
        {"k": "native_abort", "seq": -1},
        {"k": "final"},
        {"k": "final_error", "error": "boom", "message": ""},
        {"k": "final_error", "error": ["internal"], "message": ""},
        {"k": "final_error", "error": "internal", "message": None},
        {"k": "exec", "v": 1, "source": 1, "manifest": [], "limits": LIMITS},
        {"k": "exec", "v": 1, "source": "", "manifest": {}, "limits": LIMITS},
        {"k": "exec", "v": 1, "source": "", "manifest": [], "limits": {}},
        {"k": "exec", "v": 1, "source": "", "manifest": [], "limits": {**LIMITS, "extra": 1}},
        {"k": "exec", "v": 1, "source": "", "manifest": [], "limits": {**LIMITS, "max_steps": -1}},
        {"k": "exec", "v": 1, "source": "", "manifest": [], "limits": {**LIMITS, "max_callstack": 0}},
        {"k": "exec", "v": 1, "source": "", "manifest": [], "limits": {**LIMITS, "max_steps": 1.5}},
        {"k": "exec", "v": 1, "source": "", "manifest": [], "limits": {**LIMITS, "max_steps": False}},
        {"k": "exec", "v": 1, "source": "", "manifest": [], "limits": {**LIMITS, "max_print_bytes": 0}},
        {"k": "exec", "v": 1, "source": "", "manifest": [], "limits": {**LIMITS, "max_print_bytes": "9"}},
        {"k": "native_attempt", "seq": 1, "name": "", "args": {}},
        {"k": "native_attempt", "seq": 1, "name": "a.b", "args": [1]},
        {"k": "native_attempt", "seq": 0, "name": "a.b", "args": {}},
        {"k": "native_invalid", "seq": 1, "name": "a.b", "message": "m"},
        {"k": "native_invalid", "seq": 1, "name": "a.b", "message": "m", "attempt": 1},
        {"k": "native_invalid", "seq": 1, "name": "a.b", "message": None, "attempt": False},
        {"k": "native_invalid", "seq": 1, "name": "", "message": "m", "attempt": False},
        {"k": "native_error", "seq": 1, "error": ""},
        {"k": "native_error", "seq": 1, "error": ["permission denied"]},
        {"k": "native_error", "seq": 1, "error": "x", "value": 1},
        {"k": "print", "text": "x"},
        {"k": "print", "text": 1, "cut": False},
        {"k": "print", "text": "x", "cut": 0},
    ],
)
def test_invalid_frames(obj: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        validate_frame(obj, ALL_KINDS)
    with pytest.raises(ProtocolError):
        decode_body(json.dumps(obj).encode(), ALL_KINDS)


def test_kind_must_be_allowed_in_direction() -> None:
    call = {"k": "native_call", "seq": 1, "name": "a.b", "args": {}}
    with pytest.raises(ProtocolError, match="not allowed"):
        validate_frame(call, HOST_KINDS)
    assert validate_frame(call, WORKER_KINDS) is call
    data = encode_frame({"k": "native_result", "seq": 1, "value": 1})
    with pytest.raises(ProtocolError):
        FrameDecoder(1 << 20, WORKER_KINDS).feed(data)


def test_encode_rejects_invalid_frames() -> None:
    with pytest.raises(ProtocolError):
        encode_frame({"k": "final", "value": float("nan")})
    with pytest.raises(ProtocolError):
        encode_frame({"k": "final", "value": object()})
    with pytest.raises(ProtocolError):
        encode_frame({"k": "final", "value": "\ud800"})
    with pytest.raises(ProtocolError):
        encode_frame({"k": "unknown"})


@pytest.mark.parametrize(
    "manifest",
    [
        [{"name": "records", "input": RECORD}],
        [{"name": "records.", "input": RECORD}],
        [{"name": "records.look-up", "input": RECORD}],
        [{"name": "records.while", "input": RECORD}],
        [{"name": "json.lookup", "input": RECORD}],
        [{"name": "sum.lookup", "input": RECORD}],
        [{"name": "print.x", "input": RECORD}],
        [{"name": "a.b", "input": RECORD}, {"name": "a.b", "input": RECORD}],
        [{"name": "a.b", "input": RECORD}, {"name": "a.b.c", "input": RECORD}],
        [{"name": "a.b.c", "input": RECORD}, {"name": "a.b", "input": RECORD}],
        [{"name": "a.b", "input": {"t": "str"}}],
        [{"name": "a.b", "input": {"t": "record"}}],
        [{"name": "a.b"}],
        [{"name": "a.b", "input": RECORD, "id": "x"}],
        ["a.b"],
    ],
)
def test_invalid_manifests(manifest: list[Any]) -> None:
    with pytest.raises(ProtocolError):
        validate_manifest(manifest)


def test_valid_manifest() -> None:
    validate_manifest(
        [
            {"name": "records.lookup", "input": RECORD},
            {"name": "records.entry.delete", "input": {"t": "record", "fields": []}},
            {"name": "_x.y_2", "input": RECORD},
        ]
    )


class Chunky(io.RawIOBase):
    """Returns at most 3 bytes per read, like a pipe under load."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        chunk, self._data = self._data[: min(size, 3)], self._data[min(size, 3) :]
        return chunk


def test_read_exact_and_read_frame_loop_over_short_reads() -> None:
    frames = [VALID[0], VALID[3], VALID[6]]
    stream = Chunky(b"".join(encode_frame(f) for f in frames))
    assert [read_frame(stream, 1 << 20, ALL_KINDS) for _ in frames] == frames
    assert read_frame(stream, 1 << 20, ALL_KINDS) is None
    assert read_exact(Chunky(b"abcdefgh"), 7) == b"abcdefg"
    assert read_exact(Chunky(b"ab"), 7) == b"ab"
    assert read_exact(Chunky(b"ab"), 0) == b""
