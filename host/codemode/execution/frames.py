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
from collections.abc import Collection
from typing import Any

from codemode_worker.protocol import WORKER_KINDS, FrameDecoder, ProtocolError

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

# A JSON string (escapes included); the unrolled form keeps Python's regex engine linear.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


class FrameTooCostly(ProtocolError):
    """A frame would cost the host more memory than its budget (a resource limit, not misbehaviour:
    an honest worker checks bytes only; callers catch it before ``ProtocolError``)."""


def estimated_cost(body: bytes) -> int:
    """Estimated host bytes of decoding ``body`` (a JSON document).

    Args:
        body: the frame body.

    Returns:
        Its length plus a fixed cost per container and per element outside strings.
    """
    skeleton = _STRING.sub(b"", body)
    containers = skeleton.count(b"{") + skeleton.count(b"[")
    elements = skeleton.count(b",") + skeleton.count(b":")
    return len(body) + containers * CONTAINER_COST + elements * ELEMENT_COST


class HostFrameDecoder(FrameDecoder):
    """The protocol's incremental reader (length cap before buffering, strict decoding), with the
    memory budget checked before a body is decoded. Unusable after an error.

    Args:
        max_frame_bytes: the length cap of one frame.
        memory_budget: host bytes decoding one body may cost (default: ``MEMORY_FACTOR`` times
            ``max_frame_bytes``).
        allowed_kinds: the frame kinds accepted.
    """

    def __init__(
        self,
        max_frame_bytes: int,
        memory_budget: int | None = None,
        allowed_kinds: Collection[str] = WORKER_KINDS,
    ) -> None:
        super().__init__(max_frame_bytes, allowed_kinds)
        self._budget = memory_budget if memory_budget is not None else max_frame_bytes * MEMORY_FACTOR
        # No byte can cost more than a container plus itself, so a body up to this length is within
        # the budget whatever it holds: the estimate is only computed for longer ones.
        self._always_within = self._budget // (CONTAINER_COST + 1)

    def _decode(self, body: bytes) -> dict[str, Any]:
        if len(body) > self._always_within and estimated_cost(body) > self._budget:
            raise FrameTooCostly("frame would cost the host more memory than its budget")
        return super()._decode(body)
