"""The host's reader of worker frames: the protocol's strict decoding plus a bound on the memory a
frame costs the host once decoded.

A frame's byte length does not bound its decoded size: 1 MiB of ``{},{},...`` decodes to ~350,000
Python dicts, about 25 MiB of host memory. Before decoding, the host therefore estimates the cost
from the frame's structure (strings removed, then containers and separators counted) and refuses a
frame whose estimate exceeds its budget. The estimate is generous to scalars and strings (they cost
about what they weigh) and charges containers what CPython charges for them.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection
from typing import Any

from codemode_worker.protocol import HEADER_BYTES, WORKER_KINDS, ProtocolError, decode_body

__all__ = [
    "CONTAINER_COST",
    "ELEMENT_COST",
    "MEMORY_FACTOR",
    "FrameTooCostly",
    "HostFrameDecoder",
    "estimated_cost",
]

#: Estimated host bytes per decoded object/array (a small dict is ~64-200 bytes in CPython).
CONTAINER_COST = 160
#: Estimated host bytes per other element: each ``,`` or ``:`` separates one more value or key.
ELEMENT_COST = 40
#: The budget of one frame: this many times its byte cap (so ~16 MiB per execute by default).
MEMORY_FACTOR = 16

_HEADER = struct.Struct(">I")
# A JSON string (escapes included); the unrolled form keeps Python's regex engine linear.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


class FrameTooCostly(Exception):
    """A frame would cost the host more memory than its budget (a resource limit, not misbehaviour:
    an honest worker checks bytes only)."""


def estimated_cost(body: bytes) -> int:
    """Estimated host bytes of decoding ``body`` (a JSON document)."""
    skeleton = _STRING.sub(b"", body)
    containers = skeleton.count(b"{") + skeleton.count(b"[")
    elements = skeleton.count(b",") + skeleton.count(b":")
    return len(body) + containers * CONTAINER_COST + elements * ELEMENT_COST


class HostFrameDecoder:
    """Incremental reader of worker frames: length cap before buffering, memory budget before
    decoding, then the protocol's strict :func:`decode_body`. Unusable after an error."""

    def __init__(
        self,
        max_frame_bytes: int,
        memory_budget: int | None = None,
        allowed_kinds: Collection[str] = WORKER_KINDS,
    ) -> None:
        self._max = max_frame_bytes
        self._budget = memory_budget if memory_budget is not None else max_frame_bytes * MEMORY_FACTOR
        self._allowed = frozenset(allowed_kinds)
        self._buffer = bytearray()
        self._need: int | None = None
        self._failed: Exception | None = None

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        if self._failed is not None:
            raise self._failed
        try:
            return self._feed(data)
        except (ProtocolError, FrameTooCostly) as exc:
            self._failed = exc
            self._buffer.clear()
            raise

    def _feed(self, data: bytes) -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = []
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
            if estimated_cost(body) > self._budget:
                raise FrameTooCostly("frame would cost the host more memory than its budget")
            frames.append(decode_body(body, self._allowed))
