"""Calls of compiled OpenAPI operations: one HTTP request each, on the fixed ``base_url``.

The handler maps keyword arguments to the request (path values checked by
:mod:`codemode_capabilities.openapi.paths`), sends it with the operator's credential, bounds the
answer and turns it into the operation's output. The credential never comes back: every whole
spelling of it is cut out of error reasons and results (:class:`codemode.packs.Redactor`; never
a part of it, which would answer a program "is this part of the credential?"), and the host logs
one warning for each call that had one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from codemode import AgentError, CallContext
from codemode.authz import Subject
from codemode.packs import Redactor

from .config import OpenAPIConfig
from .operation import Operation
from .paths import encode_path_value

__all__ = ["HTTP", "MAX_REASON", "CallFailed", "Handler", "reason"]

log = logging.getLogger("codemode.capabilities.openapi")

#: Characters of an error answer's reason a client may see (``HTTP <status>: <reason>``).
MAX_REASON = 120
#: Characters of an error body's message read (and redacted) before it is cut to MAX_REASON.
_REASON_WINDOW = 4096


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return repr(value)
    return str(value)


class _RedactHTTPXLog(logging.Filter):
    """httpx logs every request's URL at INFO: a credential sent in the query string (``auth_query``)
    is cut out of those lines before any handler sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.redactors: dict[str, Redactor] = {}  # api name -> its query credential

    def filter(self, record: logging.LogRecord) -> bool:
        if self.redactors and isinstance(record.args, tuple):
            args = []
            for arg in record.args:
                if isinstance(arg, httpx.URL | str):
                    arg = str(arg)
                    for redactor in self.redactors.values():
                        arg = redactor.exact(arg)
                args.append(arg)
            record.args = tuple(args)
        return True


_HTTPX_LOG = _RedactHTTPXLog()
logging.getLogger("httpx").addFilter(_HTTPX_LOG)


class HTTP:
    """One ``httpx.AsyncClient`` per event loop, shared by every operation of an API.

    Args:
        config: the API's configuration.
    """

    def __init__(self, config: OpenAPIConfig) -> None:
        self.config = config
        self.redactor = Redactor([])  # set with the client: the credential is read then
        base = httpx.URL(config.base_url)
        self.origin = (base.scheme, base.host, base.port)
        self.prefix = base.raw_path.rstrip(b"/") + b"/"
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> httpx.AsyncClient:
        """The running loop's client (made now, reading the credential, when the loop changed).

        Returns:
            The client: ``base_url``, the configured headers and credential, no redirects followed.
        """
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self.redactor = Redactor([self.config.credential()])
            if self.config.auth_query is not None:
                _HTTPX_LOG.redactors[self.config.name] = self.redactor
            self._client = httpx.AsyncClient(
                base_url=self.config.base_url.rstrip("/"),
                headers=self.config.request_headers(),
                params=self.config.request_params(),
                timeout=self.config.timeout,
                follow_redirects=False,
            )
            self._loop = loop
        return self._client

    def stays_under_base(self, url: httpx.URL) -> bool:
        """The request goes to base_url's origin, under its path (the last guard of the credential).

        Args:
            url: the request's URL.

        Returns:
            True when it does.
        """
        return (url.scheme, url.host, url.port) == self.origin and url.raw_path.startswith(self.prefix)

    async def aclose(self) -> None:
        """Close the client (when it belongs to the running loop) and forget it."""
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None


class CallFailed(Exception):
    """A call failed for a reason the client must not see (already logged)."""


def reason(response: httpx.Response, body: bytes, redactor: Redactor) -> tuple[str, int]:
    """The short, redacted reason of an error answer: its JSON message or its status phrase.

    Args:
        response: the answer.
        body: its body.
        redactor: cuts the credential out.

    Returns:
        The reason (one line of printable text, at most :data:`MAX_REASON` characters) and how
        many spellings of the credential were cut out of it.
    """
    text = ""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, Mapping):
        for key in ("message", "detail", "error", "title"):
            if isinstance(data.get(key), str) and data[key].strip():
                text = data[key]
                break
    text, found = redactor.head(text or response.reason_phrase or "", _REASON_WINDOW)
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return text[:MAX_REASON], found


def _redacted_json(raw: bytes, redactor: Redactor) -> tuple[Any, int]:
    return redactor.value(json.loads(raw))


def _form(body: Mapping[str, Any]) -> dict[str, str | list[str]]:
    out: dict[str, str | list[str]] = {}
    for name, value in body.items():
        if value is None:
            continue
        out[name] = [_scalar(v) for v in value] if isinstance(value, list) else _scalar(value)
    return out


class Handler:
    """The handler of one compiled operation: one HTTP request per call.

    Args:
        http: the API's client.
        op: the operation.
    """

    def __init__(self, http: HTTP, op: Operation) -> None:
        self.http = http
        self.op = op

    def request(self, args: Mapping[str, Any]) -> httpx.Request:
        """The request for a call (path values checked and encoded: a refused one raises
        ``InvalidArguments`` and nothing is sent).

        Args:
            args: the bound keyword arguments.

        Returns:
            The request, not yet sent.
        """
        op = self.op
        path = op.path
        query: list[tuple[str, str | int | float | bool | None]] = []
        headers: dict[str, str] = {}
        body: Any = None
        body_fields: dict[str, Any] = {}
        for p in op.params:
            if p.keyword not in args:
                continue
            value = args[p.keyword]
            if p.where == "path":
                encoded = encode_path_value(p.keyword, _scalar(value), multi_segment=p.multi_segment)
                path = path.replace("{" + p.name + "}", encoded)
            elif p.where == "query":
                values = value if isinstance(value, list) else [value]
                query += [(p.name, _scalar(v)) for v in values]
            elif p.where == "header":
                headers[p.name] = _scalar(value)
            elif p.where == "body_field":
                body_fields[p.name] = value
            else:
                body = value
        if any(p.where == "body_field" for p in op.params):
            body = body_fields
        send: dict[str, Any] = {}
        if body is not None:
            send = {"data": _form(body)} if op.body_media == "form" else {"json": body}
        return self.http.client().build_request(
            op.method.upper(), path, params=query or None, headers=headers or None, **send
        )

    async def __call__(self, ctx: CallContext, subject: Subject, args: dict[str, Any]) -> dict[str, Any]:
        http, op = self.http, self.op
        cfg = http.config
        try:
            request = self.request(args)  # a refused path value raises InvalidArguments: nothing is sent
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("api %r: %s: cannot build the request: %s", cfg.name, op.cap_id, type(exc).__name__)
            raise CallFailed(op.cap_id) from None
        if not http.stays_under_base(request.url):
            # Never reachable through a compiled path; kept as the last guard of the credential.
            log.warning("openapi %r: %s would leave base_url; refused", cfg.name, op.cap_id)
            raise CallFailed(op.cap_id)
        budget = min(cfg.timeout, ctx.remaining())
        if budget <= 0:
            raise CallFailed(op.cap_id)
        try:
            async with asyncio.timeout(budget):
                response = await http.client().send(request, stream=True)
                try:
                    data = bytearray()
                    async for chunk in response.aiter_bytes():  # decoded: the bound counts real bytes
                        data += chunk
                        if len(data) > cfg.max_response_bytes:
                            log.warning(
                                "api %r: %s response exceeds %d bytes",
                                cfg.name,
                                op.cap_id,
                                cfg.max_response_bytes,
                            )
                            raise CallFailed(op.cap_id)
                finally:
                    await response.aclose()
        except CallFailed:
            raise
        except (TimeoutError, httpx.HTTPError) as exc:
            detail = http.redactor.exact(str(exc)[:300])
            log.warning("api %r: %s failed: %s: %s", cfg.name, op.cap_id, type(exc).__name__, detail)
            raise CallFailed(op.cap_id) from None
        raw = bytes(data)
        if not 200 <= response.status_code < 300:
            # An authentication answer may echo part of the host's credential: status only.
            why, found = (
                ("", 0)
                if response.status_code in (401, 403, 407)
                else await Redactor.off_loop(subject.id, len(raw), reason, response, raw, http.redactor)
            )
            if found:
                log.warning(
                    "api %r: %s echoed the credential in its error reason: redacted", cfg.name, op.cap_id
                )
            raise AgentError(f"HTTP {response.status_code}" + (f": {why}" if why else ""))
        if op.empty_result:
            return {}
        try:
            # A large answer is parsed and redacted off the serving loop (codemode.packs.off_loop).
            value, redacted = await Redactor.off_loop(
                subject.id, len(raw), _redacted_json, raw, http.redactor
            )
        except (ValueError, RecursionError):
            log.warning(
                "api %r: %s returned a body that is not usable JSON (%s)",
                cfg.name,
                op.cap_id,
                response.headers.get("content-type"),
            )
            raise CallFailed(op.cap_id) from None
        if redacted:
            log.warning(
                "api %r: %s echoed the credential in %d result string(s): redacted",
                cfg.name,
                op.cap_id,
                redacted,
            )
        if op.wraps_result:
            return {"result": value}
        if not isinstance(value, dict):
            log.warning("api %r: %s returned %s, not an object", cfg.name, op.cap_id, type(value).__name__)
            raise CallFailed(op.cap_id)
        return value
