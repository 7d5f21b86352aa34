"""Reading the Docker Engine's errors (the SDK's and requests'): the text to log, the HTTP status,
"not found" and "the daemon cannot be reached"."""

from __future__ import annotations

__all__ = ["api_error_text", "is_connection_error", "is_not_found", "status"]


def api_error_text(exc: BaseException) -> str:
    """The engine's explanation of an error, else the error's own text."""
    explanation = getattr(exc, "explanation", None)
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return str(explanation or exc)


def status(exc: BaseException) -> int | None:
    """The HTTP status of an engine error, if it has one."""
    code = getattr(exc, "status_code", None)
    if isinstance(code, int):
        return code
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def is_not_found(exc: BaseException) -> bool:
    """The engine answered 404: no such container or image."""
    import docker.errors

    return isinstance(exc, docker.errors.NotFound) or status(exc) == 404


def is_connection_error(exc: BaseException) -> bool:
    """The daemon could not be reached (or did not answer in time)."""
    import docker.errors
    import requests.exceptions

    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return True
    # APIClient(version="auto") wraps connection failures in a plain DockerException.
    return type(exc) is docker.errors.DockerException
