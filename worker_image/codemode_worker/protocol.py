"""The private wire protocol between the host and a worker.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of UTF-8 JSON holding
one object. Every object has ``"k"`` (its kind); the keys of each kind are fixed (see
``docs/ARCHITECTURE.md``). Decoding is strict: the length is checked against a cap before the
body is buffered, the body must be valid UTF-8 and valid JSON without ``NaN``/``Infinity``
(or numbers that overflow to them), without duplicate object keys and without lone surrogate
escapes; the object must be of a known kind, allowed in the reader's direction, with exactly the
kind's keys and the right types.

This module is pure Python (no ``starlark`` import): the host imports it too.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Collection, Mapping
from typing import Any, Protocol

from . import PROTOCOL_VERSION
from .shapes import ShapeError, validate_shape

__all__ = [
    "ALL_KINDS",
    "ERROR_CODES",
    "HEADER_BYTES",
    "HOST_KINDS",
    "LIMIT_KEYS",
    "MAX_HOST_FRAME_BYTES",
    "OPTIONAL_LIMIT_KEYS",
    "PRINT_CHUNK_CHARS",
    "RESERVED_ROOTS",
    "STARLARK_KEYWORDS",
    "STEPS_PER_CHECK",
    "WORKER_KINDS",
    "FrameDecoder",
    "ProtocolError",
    "TruncatedFrame",
    "decode_body",
    "encode_frame",
    "encode_native_call",
    "encode_print",
    "max_print_frames",
    "read_exact",
    "read_frame",
    "validate_frame",
    "validate_manifest",
    "write_frame",
]

HEADER_BYTES = 4
MAX_FRAME_LENGTH = 0xFFFFFFFF
MAX_HOST_FRAME_BYTES = 64 * 1024 * 1024
"""Fixed cap the worker applies to every frame the host sends."""

_HEADER = struct.Struct(">I")
_INT64_MAX = 2**63 - 1

HOST_KINDS: frozenset[str] = frozenset(
    {"probe", "exec", "native_result", "native_error", "native_abort", "native_batch_result"}
)
"""Kinds the host sends (the worker reads only these)."""
WORKER_KINDS: frozenset[str] = frozenset(
    {
        "probe_ack",
        "native_call",
        "native_attempt",
        "native_invalid",
        "native_batch",
        "print",
        "final",
        "final_error",
    }
)
"""Kinds the worker sends (the host reads only these)."""
ALL_KINDS: frozenset[str] = HOST_KINDS | WORKER_KINDS

ERROR_CODES: frozenset[str] = frozenset(
    {"invalid_program", "invalid_arguments", "resource_limit", "internal"}
)
LIMIT_KEYS: tuple[str, ...] = (
    "max_steps",
    "max_value_depth",
    "max_value_bytes",
    "max_native_calls",
    "max_callstack",
)
OPTIONAL_LIMIT_KEYS: tuple[str, ...] = ("max_print_bytes",)
"""Limits an exec frame carries only when they are in force (``max_print_bytes``: the host keeps
``print()`` output); a worker that predates them gets an exec frame without them."""
_POSITIVE_LIMITS = frozenset({"max_value_depth", "max_value_bytes", "max_callstack", "max_print_bytes"})
PRINT_CHUNK_CHARS = 8192
"""Characters of ``print()`` output per ``print`` frame: even escaped as ``\\uXXXX`` (6 bytes per
character) a frame stays far below the host's smallest frame cap (64 KiB + ``max_value_bytes``)."""
STEPS_PER_CHECK = 1000
"""Interpreter ticks between two step checks (fixed inside starlark-rust; see ``interpreter``)."""


def max_print_frames(max_native_calls: int, max_steps: int, max_print_bytes: int) -> int:
    """The most ``print`` frames an honest worker sends in one exchange, which the host enforces:
    the worker sends its pending prints before each call frame and before its final frame, at the
    step checks numbered by a power of two (1, 2, 4, ...: at most ``bit_length`` of the last
    check's number), and splits them into one more frame per :data:`PRINT_CHUNK_CHARS` characters
    of its whole output. Without such a bound every frame would be free work for the host."""
    checks = max_steps // STEPS_PER_CHECK + 1
    return max_native_calls + 1 + checks.bit_length() + max_print_bytes // PRINT_CHUNK_CHARS


_KEYS: dict[str, frozenset[str]] = {
    "probe": frozenset({"k", "v"}),
    "probe_ack": frozenset({"k", "v"}),
    "exec": frozenset({"k", "v", "source", "manifest", "limits"}),
    "native_call": frozenset({"k", "seq", "name", "args"}),
    "native_attempt": frozenset({"k", "seq", "name", "args"}),
    "native_invalid": frozenset({"k", "seq", "name", "message", "attempt"}),
    "native_result": frozenset({"k", "seq", "value"}),
    "native_error": frozenset({"k", "seq", "error"}),
    "native_abort": frozenset({"k", "seq"}),
    "native_batch": frozenset({"k", "seq", "calls"}),
    "native_batch_result": frozenset({"k", "seq", "results"}),
    "print": frozenset({"k", "text", "cut"}),
    "final": frozenset({"k", "value"}),
    "final_error": frozenset({"k", "error", "message"}),
}

# Starlark keywords and reserved words: none of them can be a name segment.
STARLARK_KEYWORDS: frozenset[str] = frozenset(
    [
        "and",
        "as",
        "assert",
        "async",
        "await",
        "break",
        "class",
        "continue",
        "def",
        "del",
        "elif",
        "else",
        "except",
        "finally",
        "for",
        "from",
        "global",
        "if",
        "import",
        "in",
        "is",
        "lambda",
        "load",
        "nonlocal",
        "not",
        "or",
        "pass",
        "raise",
        "return",
        "try",
        "while",
        "with",
        "yield",
    ]
)
RESERVED_ROOTS: frozenset[str] = frozenset(
    [
        "False",
        "None",
        "True",
        "abs",
        "all",
        "any",
        "attempt",
        "bool",
        "chr",
        "dict",
        "dir",
        "enumerate",
        "fail",
        "float",
        "getattr",
        "hasattr",
        "hash",
        "int",
        "json",
        "len",
        "list",
        "math",
        "max",
        "min",
        "ord",
        "parallel",
        "print",
        "range",
        "repr",
        "reversed",
        "sorted",
        "str",
        "sum",
        "tuple",
        "type",
        "zip",
    ]
)
"""Names of the language surface; a capability name may not start with one of them."""

_SEGMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class ProtocolError(Exception):
    """A frame (or the byte stream carrying it) violates the protocol."""


class TruncatedFrame(ProtocolError):
    """The stream ended inside a frame."""


class _Reader(Protocol):
    def read(self, size: int, /) -> bytes | None: ...


class _Writer(Protocol):
    def write(self, data: bytes, /) -> object: ...

    def flush(self) -> object: ...


# --------------------------------------------------------------------------------------- encode


#: The one JSON writer of frames: compact, UTF-8 kept as is, no NaN or Infinity.
_FRAME_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_ENCODE_ERRORS = (TypeError, ValueError, RecursionError)  # UnicodeEncodeError is a ValueError


def _framed(body: bytes) -> bytes:
    if len(body) > MAX_FRAME_LENGTH:
        raise ProtocolError("frame too large to encode")
    return _HEADER.pack(len(body)) + body


def encode_frame(obj: Mapping[str, Any]) -> bytes:
    """Validate ``obj`` as a frame of any kind and return its length-prefixed encoding."""
    validate_frame(obj, ALL_KINDS)
    try:
        body = _FRAME_ENCODER.encode(obj).encode("utf-8")
    except _ENCODE_ERRORS as exc:
        raise ProtocolError(f"frame is not encodable: {type(exc).__name__}") from None
    return _framed(body)


def encode_native_call(seq: int, name: str, args: Mapping[str, Any], attempt: bool = False) -> bytes:
    """The ``native_call`` frame (``native_attempt`` when ``attempt``) for arguments the worker has
    already checked as a plain, bounded value (``values.check_value``) and a capability name from
    its manifest: the same bytes as ``encode_frame`` without re-validating them (the host validates
    every frame it reads)."""
    kind = "native_attempt" if attempt else "native_call"
    try:
        encode = _FRAME_ENCODER.encode
        text = f'{{"k":"{kind}","seq":{int(seq)},"name":{encode(name)},"args":{encode(args)}}}'
        body = text.encode("utf-8")
    except _ENCODE_ERRORS as exc:
        raise ProtocolError(f"frame is not encodable: {type(exc).__name__}") from None
    return _framed(body)


def encode_print(text: str, cut: bool) -> bytes:
    """One ``print`` frame (``text`` at most :data:`PRINT_CHUNK_CHARS` characters)."""
    if len(text) > PRINT_CHUNK_CHARS:
        raise ProtocolError("print frame text is longer than a chunk")
    return encode_frame({"k": "print", "text": text, "cut": bool(cut)})


def write_frame(stream: _Writer, obj: Mapping[str, Any]) -> None:
    """Encode ``obj``, write it to a binary stream and flush."""
    stream.write(encode_frame(obj))
    stream.flush()


# --------------------------------------------------------------------------------------- decode


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)  # built in C; a repeated key shows as a shorter dict
    if len(out) != len(pairs):
        raise ValueError("duplicate object key")
    return out


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return False


#: The one strict JSON reader of frames (built once: ``json.loads`` with hooks builds one per call).
_FRAME_JSON = json.JSONDecoder(
    parse_constant=_reject_constant,
    parse_float=_finite_float,
    object_pairs_hook=_object_without_duplicates,
)


def decode_body(body: bytes, allowed_kinds: Collection[str] = ALL_KINDS) -> dict[str, Any]:
    """Decode and validate one frame body (the bytes after the length prefix)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("frame is not valid UTF-8") from None
    try:
        obj = _FRAME_JSON.decode(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {type(exc).__name__}") from None
    if _SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(obj):
        raise ProtocolError("frame contains a lone surrogate")
    return validate_frame(obj, allowed_kinds)


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole validated frames back.

    ``max_frame_bytes`` caps a body's length; the cap is enforced as soon as the 4-byte header
    is complete, before any of the body is buffered. After a ``ProtocolError`` the decoder is
    unusable (every later call raises again).
    """

    def __init__(self, max_frame_bytes: int, allowed_kinds: Collection[str] = ALL_KINDS) -> None:
        if max_frame_bytes < 0:
            raise ValueError("max_frame_bytes must be >= 0")
        self._max = max_frame_bytes
        self._allowed = frozenset(allowed_kinds)
        self._buffer = bytearray()
        self._need: int | None = None  # body length once the header is known
        self._failed: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a whole frame."""
        return len(self._buffer)

    def _decode(self, body: bytes) -> dict[str, Any]:
        """One whole body to a validated frame (a reader with more checks overrides this)."""
        return decode_body(body, self._allowed)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        if self._failed is not None:
            raise self._failed
        try:
            return self._feed(data)
        except ProtocolError as exc:
            self._failed = exc
            self._buffer.clear()
            raise

    def _feed(self, data: bytes) -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = []
        if not self._buffer and self._need is None:
            # Fast path, nothing held over: whole frames are decoded straight from ``data``; only a
            # trailing partial frame is copied into the buffer (below). Same cap, checked first.
            pos, end = 0, len(data)
            while end - pos >= HEADER_BYTES:
                (length,) = _HEADER.unpack_from(data, pos)
                if length > self._max:
                    raise ProtocolError(f"frame length {length} exceeds {self._max}")
                stop = pos + HEADER_BYTES + length
                if stop > end:
                    break
                frames.append(self._decode(bytes(data[pos + HEADER_BYTES : stop])))
                pos = stop
            if pos == end:
                return frames
            data = data[pos:]
        view = memoryview(data)
        while True:
            if self._need is None:
                take = min(HEADER_BYTES - len(self._buffer), len(view))
                self._buffer += view[:take]
                view = view[take:]
                if len(self._buffer) < HEADER_BYTES:
                    return frames
                (length,) = _HEADER.unpack(self._buffer)
                self._buffer.clear()
                if length > self._max:
                    raise ProtocolError(f"frame length {length} exceeds {self._max}")
                self._need = length
            take = min(self._need - len(self._buffer), len(view))
            self._buffer += view[:take]
            view = view[take:]
            if len(self._buffer) < self._need:
                return frames
            body = bytes(self._buffer)
            self._buffer.clear()
            self._need = None
            frames.append(self._decode(body))

    def close(self) -> None:
        """Declare end of stream; raises ``TruncatedFrame`` if a partial frame is buffered."""
        if self._failed is not None:
            raise self._failed
        if self._buffer or self._need is not None:
            self._failed = TruncatedFrame("stream ended inside a frame")
            raise self._failed


def read_exact(stream: _Reader, n: int) -> bytes:
    """Read exactly ``n`` bytes from a blocking binary stream.

    Returns fewer bytes only when the stream ends first (the caller decides what that means).
    """
    if n <= 0:
        return b""
    chunks: list[bytes] = []
    got = 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(
    stream: _Reader,
    max_frame_bytes: int = MAX_HOST_FRAME_BYTES,
    allowed_kinds: Collection[str] = HOST_KINDS,
) -> dict[str, Any] | None:
    """Blocking read of one validated frame; ``None`` on a clean end of stream."""
    header = read_exact(stream, HEADER_BYTES)
    if not header:
        return None
    if len(header) < HEADER_BYTES:
        raise TruncatedFrame("stream ended inside a frame header")
    (length,) = _HEADER.unpack(header)
    if length > max_frame_bytes:
        raise ProtocolError(f"frame length {length} exceeds {max_frame_bytes}")
    body = read_exact(stream, length)
    if len(body) < length:
        raise TruncatedFrame("stream ended inside a frame body")
    return decode_body(body, allowed_kinds)


# ------------------------------------------------------------------------------------- validate


def _is_int(value: object) -> bool:
    return type(value) is int


def _check_int(frame_kind: str, key: str, value: object, minimum: int) -> None:
    if not _is_int(value):
        raise ProtocolError(f"{frame_kind}.{key} must be an integer")
    assert isinstance(value, int)
    if value < minimum or value > _INT64_MAX:
        raise ProtocolError(f"{frame_kind}.{key} out of range")


def validate_manifest(manifest: object) -> None:
    """Check an exec manifest: a list of ``{name, input}`` with dotted names and record shapes.

    Names are dotted Starlark identifiers with at least two segments, none a keyword, the root
    not a language-surface name; names are unique and no name is also another's namespace.
    """
    if not isinstance(manifest, list):
        raise ProtocolError("exec.manifest must be a list")
    names: set[str] = set()
    prefixes: set[str] = set()
    for entry in manifest:
        if not isinstance(entry, dict) or set(entry) != {"name", "input"}:
            raise ProtocolError("manifest entries must be {name, input}")
        name = entry["name"]
        if not isinstance(name, str):
            raise ProtocolError("manifest name must be a string")
        segments = name.split(".")
        if len(segments) < 2 or not all(_SEGMENT.match(s) and s not in STARLARK_KEYWORDS for s in segments):
            raise ProtocolError("manifest name is not a dotted identifier")
        if segments[0] in RESERVED_ROOTS:
            raise ProtocolError("manifest name uses a reserved root")
        if name in names or name in prefixes:
            raise ProtocolError("manifest names collide")
        for i in range(1, len(segments)):
            prefix = ".".join(segments[:i])
            if prefix in names:
                raise ProtocolError("manifest names collide")
            prefixes.add(prefix)
        names.add(name)
        try:
            validate_shape(entry["input"])
        except ShapeError as exc:
            raise ProtocolError(f"manifest input shape: {exc}") from None
        if entry["input"]["t"] != "record":
            raise ProtocolError("manifest input shape must be a record")


def _validate_limits(limits: object) -> None:
    if (
        not isinstance(limits, dict)
        or not set(LIMIT_KEYS) <= set(limits)
        or not set(limits) <= set(LIMIT_KEYS) | set(OPTIONAL_LIMIT_KEYS)
    ):
        raise ProtocolError(
            "exec.limits must have exactly "
            + ", ".join(LIMIT_KEYS)
            + " (and optionally "
            + ", ".join(OPTIONAL_LIMIT_KEYS)
            + ")"
        )
    for key, value in limits.items():
        _check_int("limits", key, value, 1 if key in _POSITIVE_LIMITS else 0)


_BATCH_CALL_KEYS = frozenset({"name", "args"})
_BATCH_INVALID_KEYS = frozenset({"name", "invalid"})


def _validate_batch(calls: object) -> None:
    """A ``native_batch``'s ``calls``: a non-empty list of ``{name, args}`` (a call that bound) or
    ``{name, invalid}`` (one the worker's binding rejected, with its diagnostic)."""
    if not isinstance(calls, list) or not calls:
        raise ProtocolError("native_batch.calls must be a non-empty list")
    for call in calls:
        if not isinstance(call, dict) or set(call) not in (_BATCH_CALL_KEYS, _BATCH_INVALID_KEYS):
            raise ProtocolError("native_batch.calls items must be {name, args} or {name, invalid}")
        if not isinstance(call["name"], str) or not call["name"]:
            raise ProtocolError("native_batch call name must be a non-empty string")
        if "args" in call:
            args = call["args"]
            if not isinstance(args, dict) or not all(isinstance(key, str) for key in args):
                raise ProtocolError("native_batch call args must be an object")
        elif not isinstance(call["invalid"], str):
            raise ProtocolError("native_batch call invalid must be a string")


def _validate_batch_results(results: object) -> None:
    """A ``native_batch_result``'s ``results``: a non-empty list of ``{ok: true, value}`` or
    ``{ok: false, error}`` (``error`` a non-empty string), one per call of the batch."""
    if not isinstance(results, list) or not results:
        raise ProtocolError("native_batch_result.results must be a non-empty list")
    for result in results:
        if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
            raise ProtocolError("native_batch_result items must be {ok, value} or {ok, error}")
        if result["ok"] is True:
            if set(result) != {"ok", "value"}:
                raise ProtocolError("native_batch_result items must be {ok, value} or {ok, error}")
        elif set(result) != {"ok", "error"} or not isinstance(result["error"], str) or not result["error"]:
            raise ProtocolError("native_batch_result error must be a non-empty string")


def validate_frame(obj: object, allowed_kinds: Collection[str] = ALL_KINDS) -> dict[str, Any]:
    """Check that ``obj`` is a well-formed frame of one of ``allowed_kinds``; return it."""
    if not isinstance(obj, dict):
        raise ProtocolError("frame is not a JSON object")
    kind = obj.get("k")
    if not isinstance(kind, str) or kind not in _KEYS:
        raise ProtocolError("unknown frame kind")
    if kind not in allowed_kinds:
        raise ProtocolError(f"frame kind {kind} not allowed here")
    if set(obj) != _KEYS[kind]:
        raise ProtocolError(f"{kind} frame has wrong keys")
    if "v" in obj and (not _is_int(obj["v"]) or obj["v"] != PROTOCOL_VERSION):
        raise ProtocolError(f"{kind}.v must be protocol version {PROTOCOL_VERSION}")
    if "seq" in obj:
        _check_int(kind, "seq", obj["seq"], 1)
    if kind == "exec":
        if not isinstance(obj["source"], str):
            raise ProtocolError("exec.source must be a string")
        validate_manifest(obj["manifest"])
        _validate_limits(obj["limits"])
    elif kind in ("native_call", "native_attempt"):
        if not isinstance(obj["name"], str) or not obj["name"]:
            raise ProtocolError(f"{kind}.name must be a non-empty string")
        args = obj["args"]
        if not isinstance(args, dict) or not all(isinstance(key, str) for key in args):
            raise ProtocolError(f"{kind}.args must be an object")
    elif kind == "native_invalid":
        if not isinstance(obj["name"], str) or not obj["name"]:
            raise ProtocolError("native_invalid.name must be a non-empty string")
        if not isinstance(obj["message"], str):
            raise ProtocolError("native_invalid.message must be a string")
        if not isinstance(obj["attempt"], bool):
            raise ProtocolError("native_invalid.attempt must be a boolean")
    elif kind == "native_error":
        if not isinstance(obj["error"], str) or not obj["error"]:
            raise ProtocolError("native_error.error must be a non-empty string")
    elif kind == "native_batch":
        _validate_batch(obj["calls"])
    elif kind == "native_batch_result":
        _validate_batch_results(obj["results"])
    elif kind == "print":
        if not isinstance(obj["text"], str):
            raise ProtocolError("print.text must be a string")
        if not isinstance(obj["cut"], bool):
            raise ProtocolError("print.cut must be a boolean")
    elif kind == "final_error":
        if not isinstance(obj["error"], str) or obj["error"] not in ERROR_CODES:
            raise ProtocolError("final_error.error is not a known code")
        if not isinstance(obj["message"], str):
            raise ProtocolError("final_error.message must be a string")
    return obj
