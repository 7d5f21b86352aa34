"""The worker's half of one exchange: the frames a running program sends the host, and the replies
it waits for (docs/reference/protocol.md).

A program talks to the host through three requests: a capability call (``native_call``, or
``native_attempt`` when the program asked to recover from its failure), a call the worker's own
binding rejected (``native_invalid``), and its ``print()`` output (``print``, no reply). After a
call the worker blocks for the one reply that call allows:

=================  ===========================================================
request            replies accepted (``seq`` must be the call's)
=================  ===========================================================
``native_call``    ``native_result``, ``native_abort``
``native_attempt`` ``native_result``, ``native_error``, ``native_abort``
``native_invalid`` ``native_error`` (only when ``attempt``), ``native_abort``
``native_batch``   ``native_batch_result`` (one result per call), ``native_abort``
=================  ===========================================================

A ``native_batch`` (``parallel(...)``) takes the ``seq`` of its first call; its calls use that one
and the next ones, and its reply carries the batch's ``seq``.

The host ends an execute by destroying the worker (it does not send ``native_abort`` today): a
closed stream or ``native_abort`` is :class:`NativeAborted`, any other reply
:class:`HostProtocolError`.
"""

from __future__ import annotations

from typing import Any, BinaryIO

from .interpreter import HostProtocolError, NativeAborted, Reply
from .protocol import (
    MAX_HOST_FRAME_BYTES,
    PRINT_CHUNK_CHARS,
    ProtocolError,
    encode_frame,
    encode_native_call,
    encode_print,
    read_frame,
)

__all__ = ["HostChannel"]

_CALL_REPLIES = frozenset({"native_result", "native_abort"})
_ATTEMPT_REPLIES = frozenset({"native_result", "native_error", "native_abort"})
_INVALID_REPLIES = frozenset({"native_error", "native_abort"})
_ABORT_ONLY = frozenset({"native_abort"})
_BATCH_REPLIES = frozenset({"native_batch_result", "native_abort"})


class HostChannel:
    """Frames over the worker's stdin (``inp``) and its private frame stream (``out``)."""

    def __init__(self, inp: BinaryIO, out: BinaryIO) -> None:
        self.inp = inp
        self.out = out
        self.seq = 0

    def _write(self, data: bytes) -> None:
        try:
            self.out.write(data)
            self.out.flush()
        except OSError:
            raise NativeAborted("host closed the stream") from None

    def _reply(self, kinds: frozenset[str], seq: int | None = None) -> dict[str, Any]:
        try:
            reply = read_frame(self.inp, MAX_HOST_FRAME_BYTES, kinds)
        except ProtocolError as exc:
            raise HostProtocolError(str(exc)) from None
        except OSError:
            raise NativeAborted("host closed the stream") from None
        if reply is None:
            raise NativeAborted("host closed the stream")
        if reply["seq"] != (self.seq if seq is None else seq):
            raise HostProtocolError("reply for another call")
        if reply["k"] == "native_abort":
            raise NativeAborted("host aborted the call")
        return reply

    def call(self, name: str, args: dict[str, Any], attempt: bool) -> Reply:
        self.seq += 1
        try:
            frame = encode_native_call(self.seq, name, args, attempt)
        except ProtocolError as exc:
            raise HostProtocolError(str(exc)) from None
        self._write(frame)
        reply = self._reply(_ATTEMPT_REPLIES if attempt else _CALL_REPLIES)
        if reply["k"] == "native_error":
            return Reply.failed(reply["error"])
        return Reply.succeeded(reply["value"])

    def invalid(self, name: str, message: str, attempt: bool) -> Reply:
        self.seq += 1
        frame = {"k": "native_invalid", "seq": self.seq, "name": name, "message": message, "attempt": attempt}
        try:
            data = encode_frame(frame)
        except ProtocolError as exc:
            raise HostProtocolError(str(exc)) from None
        self._write(data)
        reply = self._reply(_INVALID_REPLIES if attempt else _ABORT_ONLY)
        return Reply.failed(reply["error"])

    def batch(self, calls: list[dict[str, Any]]) -> list[Reply]:
        """Send the calls of one ``parallel(...)`` as a ``native_batch`` and wait for their results.

        Args:
            calls: ``{name, args}`` or ``{name, invalid}`` per call, in the program's order.

        Returns:
            One reply per call, in the same order.

        Raises:
            NativeAborted: the host ended the exchange.
            HostProtocolError: the host broke the protocol (a result count that is not the calls').
        """
        first = self.seq + 1
        self.seq += len(calls)
        try:
            data = encode_frame({"k": "native_batch", "seq": first, "calls": calls})
        except ProtocolError as exc:
            raise HostProtocolError(str(exc)) from None
        self._write(data)
        results = self._reply(_BATCH_REPLIES, first)["results"]
        if len(results) != len(calls):
            raise HostProtocolError("a batch result with another number of results")
        return [Reply.succeeded(r["value"]) if r["ok"] else Reply.failed(r["error"]) for r in results]

    def prints(self, text: str, cut: bool) -> None:
        """Send ``text`` in ``print`` frames of at most :data:`PRINT_CHUNK_CHARS` characters; the
        last one carries ``cut``."""
        chunks = [text[i : i + PRINT_CHUNK_CHARS] for i in range(0, len(text), PRINT_CHUNK_CHARS)] or [""]
        try:
            data = b"".join(
                encode_print(chunk, cut and i == len(chunks) - 1) for i, chunk in enumerate(chunks)
            )
        except ProtocolError as exc:
            raise HostProtocolError(str(exc)) from None
        self._write(data)
