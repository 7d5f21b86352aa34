"""Reading the Kubernetes API's errors: the HTTP status of a failed call, the API server's own
message (from its Status body), whether the call failed to connect or may have reached the server,
and which statuses are worth retrying. Host logs and operator errors only: none of this text
reaches a client."""

from __future__ import annotations

import contextlib
import json

from kubernetes import client as k8s

#: Statuses a call is retried on (conflict, throttling, server errors).
_RETRY_STATUSES = (409, 429, 500, 502, 503, 504)


def _status(exc: BaseException) -> int | None:
    """The HTTP status of a failed call (None when it has none)."""
    code = getattr(exc, "status", None)
    return code if isinstance(code, int) else None


def _api_error_text(exc: BaseException) -> str:
    """The API server's own message (from a Status body) when there is one."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes | str) and body:
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(body).get("message")
            if isinstance(message, str) and message:
                return f"{message} ({_status(exc)})"
    reason = getattr(exc, "reason", None)
    if isinstance(exc, k8s.ApiException):
        return f"{reason} ({exc.status})" if exc.status else str(reason)
    return f"{type(exc).__name__}: {exc}"


def _is_connection_error(exc: BaseException) -> bool:
    """Whether the call failed on the connection (refused, reset, timed out), not with a status."""
    import urllib3.exceptions

    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def _maybe_sent(exc: BaseException) -> bool:
    """Might the request have reached the API server? (No if the connection was never made.)"""
    import urllib3.exceptions as u

    reason = exc.reason if isinstance(exc, u.MaxRetryError) else exc
    return not isinstance(reason, u.NewConnectionError | u.ConnectTimeoutError | u.SSLError)


def _status_message(text: str) -> str:
    """The ``message`` of the Status object in an API error's text (the text itself without one),
    at most 400 characters, for host logs."""
    start = text.find("{")
    if start >= 0:
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(text[start:].rstrip("'")).get("message")
            if isinstance(message, str) and message:
                text = message
    return text[:400]
