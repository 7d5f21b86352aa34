"""Small plain-JSON HTTP answers the service's ASGI middleware sends itself (401, 429, 503, 405)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.types import Send

__all__ = ["plain_json"]


async def plain_json(
    send: Send, status: int, body: Mapping[str, object], headers: list[tuple[bytes, bytes]]
) -> None:
    """Send a complete JSON response with ``no-store`` caching and the extra ``headers``.

    Args:
        send: the ASGI send.
        status: the HTTP status.
        body: the JSON body.
        headers: extra headers.
    """
    payload = json.dumps(body).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode("ascii")),
                (b"cache-control", b"no-store"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
