"""The supervisor channel: how the host talks to the PID 1 supervisor of a reusable sandbox.

A reusable container or pod (the reuse mode, docs/reference/runtimes.md) runs
``codemode_worker.supervisor`` as PID 1 instead of one worker. Its stdin and stdout carry this
channel; the worker of each execute ("epoch") gets pipes of its own, which the supervisor relays
byte for byte without reading them (``splice``). Every message is a 9-byte header and a payload:

    kind (1 byte) | epoch (u32, big-endian) | length (u32, big-endian) | payload (length bytes)

Host to supervisor:

``P``  no payload: the host is attached; the supervisor answers ``H`` (it writes nothing before:
       Kubernetes attaches to a running container, and what was written earlier never reaches
       the attach stream)
``D``  payload: bytes for the stdin of epoch's worker (the protocol's frames, unchanged)
``E``  no payload: close that worker's stdin
``K``  no payload: the execute is over: kill that worker, scrub the sandbox, report ``X`` and ``C``
       together, in one write (ignored when that epoch has ended already: its worker ended by
       itself, and the supervisor ended the epoch without waiting for a ``K``)

Supervisor to host:

``H``  payload: JSON ``{"v": PROTOCOL_VERSION, "epoch": first, "ready": true, "ends": true}``,
       the answer to ``P``: the supervisor is up and its baseline is taken; the first epoch's
       worker answered the supervisor's probe (``ready``: the host sends it the execute without a
       probe of its own), and the supervisor ends an epoch by itself when its worker ends
       (``ends``: the host then sends no ``K`` after a worker's own last frame, unless that
       worker has not ended 0.5 s later)
``O``  payload: bytes the epoch's worker wrote to its stdout
``R``  payload: bytes it wrote to its stderr (host logs only)
``X``  payload: JSON ``{"code": int|null, "signal": int|null, "oom": bool}``: that worker is gone
       (always followed by that epoch's ``C`` in the same write)
``C``  payload: JSON ``{"ok": true, "ready": true}`` (scrubbed and verified; the next epoch's
       worker answered its probe) or ``{"ok": false, "anomaly": text}`` (the supervisor exits; the
       sandbox must be recycled)

Pure Python (no starlark, no libseccomp): the host imports it and decodes everything the supervisor
sends as hostile input (``ChannelDecoder``: known kinds only, bounded payloads).
"""

from __future__ import annotations

import json
import struct
from typing import Any, Final

__all__ = [
    "CLEAN",
    "CLOSE_INPUT",
    "CONTROL_LIMIT",
    "DATA",
    "END",
    "EXIT",
    "HEADER",
    "HELLO",
    "HOST_KINDS",
    "MAX_RELAY",
    "PING",
    "STDERR",
    "STDOUT",
    "SUPERVISOR_KINDS",
    "ChannelDecoder",
    "ChannelError",
    "encode",
    "parse_control",
]

HEADER: Final = struct.Struct(">cII")

PING: Final = b"P"
DATA: Final = b"D"
CLOSE_INPUT: Final = b"E"
END: Final = b"K"
HELLO: Final = b"H"
STDOUT: Final = b"O"
STDERR: Final = b"R"
EXIT: Final = b"X"
CLEAN: Final = b"C"

HOST_KINDS: Final = frozenset({PING, DATA, CLOSE_INPUT, END})
SUPERVISOR_KINDS: Final = frozenset({HELLO, STDOUT, STDERR, EXIT, CLEAN})
#: Largest relayed payload the supervisor sends in one message (and the host accepts).
MAX_RELAY: Final = 64 * 1024
#: Largest JSON payload of ``H``, ``X`` and ``C``.
CONTROL_LIMIT: Final = 4096
_CONTROL: Final = frozenset({HELLO, EXIT, CLEAN})


class ChannelError(Exception):
    """The supervisor sent something the channel does not allow (host-log detail only)."""


def encode(kind: bytes, epoch: int, payload: bytes = b"") -> bytes:
    """One message: header and payload."""
    return HEADER.pack(kind, epoch, len(payload)) + payload


def parse_control(payload: bytes) -> dict[str, Any]:
    """The JSON object of an ``H``, ``X`` or ``C`` message (``ChannelError`` otherwise)."""
    try:
        value = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ChannelError("control payload is not JSON") from None
    if not isinstance(value, dict):
        raise ChannelError("control payload is not an object")
    return value


class ChannelDecoder:
    """Incremental decoder of the supervisor's messages: ``feed(bytes)`` returns complete
    ``(kind, epoch, payload)`` messages; relayed payloads come back as they arrive, in pieces
    (``(kind, epoch, piece)``), so nothing is buffered beyond one header and one control payload."""

    def __init__(self) -> None:
        self._header = bytearray()
        self._kind = b""
        self._epoch = 0
        self._left = 0
        self._control = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, int, bytes]]:
        out: list[tuple[bytes, int, bytes]] = []
        view = memoryview(data)
        i, n = 0, len(data)
        while i < n:
            if self._left == 0 and not self._kind:
                take = min(HEADER.size - len(self._header), n - i)
                self._header += view[i : i + take]
                i += take
                if len(self._header) < HEADER.size:
                    break
                kind, epoch, length = HEADER.unpack(self._header)
                self._header.clear()
                if kind not in SUPERVISOR_KINDS:
                    raise ChannelError(f"unknown message kind {kind!r}")
                limit = CONTROL_LIMIT if kind in _CONTROL else MAX_RELAY
                if length > limit:
                    raise ChannelError(f"{kind.decode()} message of {length} bytes")
                if length == 0:
                    if kind in _CONTROL:
                        raise ChannelError(f"empty {kind.decode()} message")
                    continue
                self._kind, self._epoch, self._left = kind, epoch, length
                continue
            take = min(self._left, n - i)
            piece = bytes(view[i : i + take])
            i += take
            self._left -= take
            if self._kind in _CONTROL:
                self._control += piece
                if self._left == 0:
                    out.append((self._kind, self._epoch, bytes(self._control)))
                    self._control.clear()
            else:
                out.append((self._kind, self._epoch, piece))
            if self._left == 0:
                self._kind = b""
        return out
