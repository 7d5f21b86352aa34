"""An httpx2 transport that stops reading a response body past a byte limit.

The MCP client's streamable HTTP transport reads a JSON response whole (``aread()``) before it
parses it: an upstream, or a tenant steering an upstream tool's output, could make the host buffer
any amount. Wrapped in :class:`BoundedBodies`, every non-SSE body is counted as it streams in and
fails with :class:`BodyTooLarge` (an ``httpx2.StreamError``, which the client turns into an error
for that one request) once it passes the limit. Only the event streams the client reads event by
event pass through (a 2xx ``text/event-stream`` answer to a GET or a POST; the client bounds each
event, ``max_sse_event_size``); every other body is counted, whatever it claims to be (a redirect
or a DELETE answer is read whole by the client). Bodies are asked for uncompressed, and a
compressed one is refused, so the count is the decoded size.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2

__all__ = ["ACCEPT_IDENTITY", "BodyTooLarge", "BoundedBodies"]

#: Request header asking for an uncompressed body (what is counted is what is parsed).
ACCEPT_IDENTITY = {"Accept-Encoding": "identity"}


class BodyTooLarge(httpx2.StreamError):
    """A response body passed the limit (or came compressed); reading stopped there."""


class _Capped(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, refuse: str | None) -> None:
        self._inner = inner
        self._limit = limit
        self._refuse = refuse

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._refuse is not None:
            raise BodyTooLarge(self._refuse)
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise BodyTooLarge(f"response body over {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        """Close the inner stream."""
        await self._inner.aclose()


class BoundedBodies(httpx2.AsyncBaseTransport):
    """Wraps ``inner``; see the module text.

    Args:
        limit: bytes of one response body, positive.
        inner: the transport wrapped (default: a plain ``httpx2.AsyncHTTPTransport``).

    Raises:
        ValueError: ``limit`` is not positive.
    """

    def __init__(self, limit: int, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        if limit <= 0:
            raise ValueError("limit must be positive")
        self.limit = limit
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send ``request`` through the inner transport and cap its response body.

        Args:
            request: the request.

        Returns:
            The response: an event stream as it is, any other body counted (and refused when
            compressed).
        """
        response = await self._inner.handle_async_request(request)
        sse = response.headers.get("content-type", "").lower().startswith("text/event-stream")
        if sse and 200 <= response.status_code < 300 and request.method in ("GET", "POST"):
            return response  # the client reads it event by event, each bounded

        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        refuse = None if encoding in ("", "identity") else f"compressed response body ({encoding})"
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_Capped(response.stream, self.limit, refuse),
            request=request,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._inner.aclose()
