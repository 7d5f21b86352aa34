"""Upstream MCP servers as capabilities: codemode in front of tools you already have.

Each :class:`UpstreamMCPConfig` names one server reached over stdio (``command`` + ``args``) or
streamable HTTP (``url``). :func:`upstream_mcp_pack` builds a pack from a list of them; its
``capabilities(settings)`` connects to every upstream with the official MCP client, lists the tools
(all pages), compiles each input schema (``codemode.packs.jsonschema``) and registers one capability per
tool:

* id ``mcp:<upstream name>:<tool name>`` (for policies and ``disabled`` lists), name
  ``<namespace>.<snake_case tool name>`` (``codemode.packs.upstream.capability_names``);
* inputs: the tool's ``inputSchema``; top-level argument names that are not Starlark identifiers
  are snake_cased (``codemode.packs.upstream.argument_names``) and mapped back on the way out;
* output: the tool's ``outputSchema`` when present (its ``structuredContent`` is returned);
  otherwise the record ``{text: str}``: the tool's text content blocks (and embedded text
  resources) joined by newlines, other blocks shown as ``[image image/png]``-style notes.

Tools whose schemas cannot be represented are skipped with one warning listing every reason, or
stop the build with ``on_unsupported = "fail"``.

Calls: the host has already rebound and authorized the arguments (the authorizer sees the id and
the arguments, so a Rego policy can allow one tool and deny another). The handler sends
``tools/call`` bounded by ``timeout`` and by the execute deadline; when the execute ends first the
request is abandoned and the MCP client sends ``notifications/cancelled`` upstream. A result with
``isError`` fails as ``capability failed: <first 256 bytes of its text>``; anything else that goes
wrong (transport, protocol, timeout, an output that does not fit) is a plain ``capability failed``
with the detail in the host log; after a transport failure the next call reconnects.

Answers are bounded: no upstream message over ``max_message_bytes`` is buffered whole (stdio servers
run behind ``stdio_relay``, which drops such a message; HTTP bodies go through ``bounded_http``); a
larger one fails the call it answers.

Credentials (``headers_from_env``, ``headers_from_file``, ``env_from_host``) are read by the host
when it connects and go only to the upstream: never into capability text, errors or workers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import fnmatch
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from codemode import AgentError, CallContext, Capability
from codemode.authz import Subject
from codemode.catalog.answers import AnswerBounds
from codemode.catalog.capability import MAX_CAPABILITIES
from codemode.packs.jsonschema import Unsupported, record_of
from codemode.packs.loading import PackSettings
from codemode.packs.upstream import (
    SkipReport,
    UpstreamBuildError,
    answer_problem,
    argument_names,
    capability_names,
    check_namespace,
    check_unique_names,
    description_of,
    search_terms_of,
    snake_case,
    summary_of,
    unique_by_name,
)

from . import stdio_relay

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_TOOLS",
    "TEXT_OUTPUT",
    "UpstreamMCPConfig",
    "UpstreamMCPPack",
    "UpstreamSession",
    "upstream_mcp_pack",
]

log = logging.getLogger("codemode.capabilities.mcp_upstream")

TEXT_OUTPUT: dict[str, Any] = {"t": "record", "fields": [{"name": "text", "shape": {"t": "str"}}]}
"""The output of a tool without ``outputSchema``: ``{text: str}``."""

MAX_LIST_PAGES = 100
#: Tools taken from one upstream by default: a huge list is cut (with a skip report) rather than
#: filling the catalog (at most 4,096 capabilities in all) and stopping the start.
DEFAULT_MAX_TOOLS = 1024
#: Bytes of one upstream message (a stdio line, an HTTP JSON body or an SSE event); a larger one fails
#: the call it answers.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: The relay runs as a file in isolated mode: it imports only the standard library, so it needs no
#: PYTHONPATH (the MCP client gives it only a minimal environment plus the configured one).
_RELAY = ("-I", stdio_relay.__file__)
_UPSTREAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_TOOL_NAME = re.compile(r"[\x21-\x7e]{1,128}\Z")
T = TypeVar("T")


class UpstreamMCPConfig(BaseModel):
    """One upstream MCP server (a ``[[upstream_mcp]]`` table in the TOML settings)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Upstream id: capability ids are mcp:<name>:<tool>.")
    namespace: str | None = Field(
        default=None, description="Capability name prefix (dotted snake_case); default: name in snake_case."
    )
    command: str | None = Field(default=None, description="stdio transport: the program to start.")
    args: list[str] = Field(default_factory=list, description="stdio transport: its arguments.")
    env: dict[str, str] = Field(default_factory=dict, description="stdio: literal extra environment.")
    env_from_host: dict[str, str] = Field(
        default_factory=dict, description="stdio: child variable -> host variable whose value it gets."
    )
    cwd: str | None = Field(default=None, description="stdio: working directory.")
    url: str | None = Field(default=None, description="streamable HTTP transport: the MCP endpoint URL.")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP: literal (non-secret) headers.")
    headers_from_env: dict[str, str] = Field(
        default_factory=dict, description="HTTP: header -> host environment variable holding its value."
    )
    headers_from_file: dict[str, str] = Field(
        default_factory=dict, description="HTTP: header -> file holding its value (trailing newline dropped)."
    )
    include: list[str] = Field(default_factory=list, description="Tool name globs to keep (empty: all).")
    exclude: list[str] = Field(default_factory=list, description="Tool name globs to drop.")
    timeout: float = Field(default=30.0, gt=0, description="Seconds per call (also bounded by the deadline).")
    connect_timeout: float = Field(default=30.0, gt=0, description="Seconds to connect and list tools.")
    max_message_bytes: int = Field(
        default=DEFAULT_MAX_MESSAGE_BYTES,
        ge=1024,
        description="Largest message read from the upstream: a stdio line, an HTTP JSON body or SSE event.",
    )
    on_unsupported: Literal["skip", "fail"] = Field(
        default="skip", description="A tool whose schema cannot be represented: skip it (warn) or fail."
    )
    max_tools: int = Field(
        default=DEFAULT_MAX_TOOLS,
        ge=1,
        le=MAX_CAPABILITIES,
        description="Most tools taken from this upstream (after include/exclude, in name order); "
        "the rest are skipped.",
    )

    @model_validator(mode="after")
    def _check(self) -> UpstreamMCPConfig:
        if not _UPSTREAM_NAME.match(self.name):
            raise ValueError(
                f"upstream name {self.name!r} must be 1-64 of [A-Za-z0-9_-], not starting with - or _"
            )
        if (self.command is None) == (self.url is None):
            raise ValueError(f"upstream {self.name!r}: set exactly one of command (stdio) or url (HTTP)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"upstream {self.name!r}: url must start with http:// or https://")
        if self.command is None and (self.args or self.env or self.env_from_host or self.cwd):
            raise ValueError(f"upstream {self.name!r}: args/env/env_from_host/cwd are for stdio (command)")
        if self.url is None and (self.headers or self.headers_from_env or self.headers_from_file):
            raise ValueError(f"upstream {self.name!r}: headers are for HTTP (url)")
        try:
            check_namespace(self.resolved_namespace)
        except UpstreamBuildError as exc:
            raise ValueError(f"{exc} (set namespace for upstream {self.name!r})") from None
        return self

    @property
    def resolved_namespace(self) -> str:
        return self.namespace if self.namespace is not None else snake_case(self.name)

    def wanted(self, tool: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(tool, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(tool, p) for p in self.exclude)

    def secret_headers(self) -> dict[str, str]:
        """All HTTP headers with secrets resolved (host side only)."""
        out = dict(self.headers)
        for header, var in self.headers_from_env.items():
            value = os.environ.get(var)
            if value is None:
                raise UpstreamBuildError(
                    f"upstream {self.name!r}: header {header!r} needs environment variable {var} (unset)"
                )
            out[header] = value
        for header, path in self.headers_from_file.items():
            try:
                out[header] = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise UpstreamBuildError(
                    f"upstream {self.name!r}: header {header!r}: cannot read {path}: {exc.strerror}"
                ) from None
        return out

    def child_env(self) -> dict[str, str]:
        env = dict(self.env)
        for child, var in self.env_from_host.items():
            value = os.environ.get(var)
            if value is None:
                raise UpstreamBuildError(
                    f"upstream {self.name!r}: env {child!r} needs host environment variable {var} (unset)"
                )
            env[child] = value
        return env


class UpstreamSession:
    """One live connection to an upstream, owned by a task on the loop that uses it.

    Opened on first use; a transport failure marks it dead and the next call reconnects. A session
    used from another event loop than the one it was opened on reconnects too.
    """

    def __init__(self, config: UpstreamMCPConfig) -> None:
        self.config = config
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self.connects = 0

    def _transport(self, stack: AsyncExitStack) -> Awaitable[Any]:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        cfg = self.config
        if cfg.command is not None:
            env = cfg.child_env() or None
            # Through the bounded relay (codemode.capabilities.stdio_relay): the client's own line
            # reader has no bound. A command that cannot be started fails here, as it would unrelayed.
            # The child's PATH is the configured one if set (even empty), else the host's.
            path = env["PATH"] if env is not None and "PATH" in env else os.environ.get("PATH")
            _check_command(cfg.command, path, cfg.cwd)
            # Python's locale coercion may add or change LC_CTYPE in the relay's own environment.
            lc_ctype = (env or {}).get("LC_CTYPE")
            flags = ["--unset-lc-ctype"] if lc_ctype is None else [f"--lc-ctype={lc_ctype}"]
            params = StdioServerParameters(
                command=sys.executable,
                args=[*_RELAY, str(cfg.max_message_bytes), *flags, "--", cfg.command, *cfg.args],
                env=env,
                cwd=cfg.cwd,
            )
            return stack.enter_async_context(Client(params, mode="legacy"))

        async def http() -> Any:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            from .bounded_http import ACCEPT_IDENTITY, BoundedBodies

            assert cfg.url is not None
            http_client = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers={**ACCEPT_IDENTITY, **cfg.secret_headers()},
                    timeout=httpx2.Timeout(cfg.connect_timeout, read=None),
                    transport=BoundedBodies(cfg.max_message_bytes),
                )
            )
            transport = streamable_http_client(
                cfg.url, http_client=http_client, max_sse_event_size=cfg.max_message_bytes
            )
            return await stack.enter_async_context(Client(transport, mode="legacy"))

        return http()

    async def _run_owner(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        try:
            async with AsyncExitStack() as stack:
                client = await self._transport(stack)
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError("cancelled"))
            elif not isinstance(exc, asyncio.CancelledError):
                log.info("upstream %r: connection ended: %s", self.config.name, _brief(exc))

    async def client(self) -> Any:
        """The connected MCP client (connecting now if needed)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._client, self._owner, self._stop, self._lock = None, None, None, asyncio.Lock()
            self._loop = loop
        assert self._lock is not None
        async with self._lock:
            if self._client is not None and self._owner is not None and not self._owner.done():
                return self._client
            await self._close_owner()
            stop = asyncio.Event()
            ready: asyncio.Future[Any] = loop.create_future()
            ready.add_done_callback(_retrieve)
            owner = loop.create_task(self._run_owner(ready, stop), name=f"mcp-upstream-{self.config.name}")
            try:
                async with asyncio.timeout(self.config.connect_timeout):
                    client = await asyncio.shield(ready)
            except BaseException:
                stop.set()
                owner.cancel()
                raise
            self._client, self._owner, self._stop = client, owner, stop
            self.connects += 1
            return client

    def mark_dead(self) -> None:
        self._client = None
        if self._stop is not None:
            self._stop.set()

    async def _close_owner(self) -> None:
        owner, stop = self._owner, self._stop
        self._client, self._owner, self._stop = None, None, None
        if stop is not None:
            stop.set()
        if owner is not None and not owner.done():
            try:
                async with asyncio.timeout(5):
                    await asyncio.shield(owner)
            except (TimeoutError, Exception):
                owner.cancel()

    async def aclose(self) -> None:
        if self._loop is asyncio.get_running_loop():
            await self._close_owner()

    async def list_tools(self) -> list[Any]:
        """Every tool, following ``nextCursor`` (at most 100 pages)."""
        client = await self.client()
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise UpstreamBuildError(
            f"upstream {self.config.name!r}: tools/list did not end after {MAX_LIST_PAGES} pages"
        )


def _check_command(command: str, path: str | None, cwd: str | None) -> None:
    """Fail as starting ``command`` would: ``FileNotFoundError`` when no file of that name is found
    (on ``path``, whose relative entries are taken from ``cwd`` like the process's own lookup, or
    at ``cwd``/``command`` when it names a path), ``PermissionError`` when none found can run."""
    base = cwd or os.getcwd()
    if os.sep in command:
        candidates = [os.path.join(base, command)]
    else:
        entries = (path if path is not None else os.defpath).split(os.pathsep)
        candidates = [os.path.join(base, entry, command) for entry in entries]
    if any(os.path.isfile(c) and os.access(c, os.X_OK) for c in candidates):
        return
    if any(os.path.exists(c) for c in candidates):  # a directory, or a file that cannot run
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), command)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # the waiter may be gone (cancelled): mark the exception retrieved


def _brief(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]  # the task group's wrapper says nothing: name what failed
    text = str(exc).replace("\n", " ")
    return f"{type(exc).__name__}: {text[:300]}"


def _transport_failure(exc: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(exc, MCPError):
        return bool(exc.code == CONNECTION_CLOSED)
    return not isinstance(exc, TimeoutError | UpstreamBuildError)


def _text_of(content: Sequence[Any]) -> str:
    parts: list[str] = []
    for block in content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and isinstance(getattr(block.resource, "text", None), str):
            parts.append(block.resource.text)
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        else:
            parts.append(f"[{kind} {getattr(block, 'mime_type', '') or ''}]".replace(" ]", "]"))
    return "\n".join(parts)


class _Tool:
    """The handler of one upstream tool."""

    def __init__(
        self,
        session: UpstreamSession,
        tool: str,
        cap_id: str,
        to_upstream: Mapping[str, str],
        structured: bool,
    ) -> None:
        self.session = session
        self.tool = tool
        self.cap_id = cap_id
        self.to_upstream = dict(to_upstream)  # keyword -> upstream argument name
        self.structured = structured

    async def __call__(self, ctx: CallContext, subject: Subject, args: dict[str, Any]) -> dict[str, Any]:
        cfg = self.session.config
        arguments = {self.to_upstream.get(k, k): v for k, v in args.items()}
        try:
            if ctx.remaining() <= 0:
                raise TimeoutError("no time left before the execute deadline")
            async with asyncio.timeout(min(cfg.connect_timeout, ctx.remaining())):
                client = await self.session.client()
            budget = min(cfg.timeout, ctx.remaining())
            # The client's own read timeout fires first and sends notifications/cancelled; the
            # outer bound (a grace second later) is the backstop.
            async with asyncio.timeout(budget + 1.0):
                result = await client.call_tool(self.tool, arguments, read_timeout_seconds=budget)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if _transport_failure(exc):
                self.session.mark_dead()
                log.warning("upstream %r: %s failed (will reconnect): %s", cfg.name, self.cap_id, _brief(exc))
            else:
                log.warning("upstream %r: %s failed: %s", cfg.name, self.cap_id, _brief(exc))
            raise UpstreamCallFailed(self.cap_id) from None
        if result.is_error:
            text = _text_of(result.content).strip()
            if not text:
                log.warning("upstream %r: %s returned isError without text", cfg.name, self.cap_id)
                raise UpstreamCallFailed(self.cap_id)
            raise AgentError(text[:4096])
        if self.structured:
            value = result.structured_content
            if not isinstance(value, dict):
                log.warning("upstream %r: %s returned no structuredContent object", cfg.name, self.cap_id)
                raise UpstreamCallFailed(self.cap_id)
            return value
        return {"text": _text_of(result.content)}


class UpstreamCallFailed(Exception):
    """A call failed for a reason the client must not see (already logged)."""


def _compile_tools(
    config: UpstreamMCPConfig,
    session: UpstreamSession,
    tools: Sequence[Any],
    bounds: AnswerBounds | None = None,
) -> tuple[list[Capability], SkipReport]:
    report = SkipReport(config.name, config.on_unsupported)
    wanted = []
    for t in tools:
        if not config.wanted(t.name):
            continue
        if not _TOOL_NAME.match(t.name):  # before naming: a skipped tool takes no name
            report.skip(repr(t.name)[:80], "tool name is not 1-128 printable ASCII characters without spaces")
            continue
        wanted.append(t)
    wanted = unique_by_name(wanted, lambda t: t.name, lambda a, b: a == b, report)
    wanted = sorted(wanted, key=lambda t: str(t.name))
    for t in wanted[config.max_tools :]:
        report.skip(
            t.name, f"over max_tools ({config.max_tools} of {len(wanted)} tools taken, in name order)"
        )
    wanted = wanted[: config.max_tools]
    names = capability_names(config.resolved_namespace, [t.name for t in wanted])
    caps: list[Capability] = []
    for tool in sorted(wanted, key=lambda t: names[t.name]):
        omissions: list[Unsupported] = []
        try:
            in_shape = record_of(tool.input_schema, direction="input")
            out_shape = (
                record_of(tool.output_schema, direction="output", pointer="(output)", omissions=omissions)
                if tool.output_schema is not None
                else TEXT_OUTPUT
            )
        except Unsupported as exc:
            report.skip(tool.name, str(exc))
            continue
        for omission in omissions:
            report.omit(tool.name, str(omission))
        keywords = argument_names([f["name"] for f in in_shape["fields"]])
        in_shape = {
            "t": "record",
            "fields": [{"name": keywords[f["name"]], "shape": f["shape"]} for f in in_shape["fields"]],
        }
        title = tool.title or (tool.annotations.title if tool.annotations is not None else None)
        cap_id = f"mcp:{config.name}:{tool.name}"
        caps.append(
            Capability(
                id=cap_id,
                name=names[tool.name],
                summary=summary_of(tool.description, title or f"Upstream tool {tool.name}."),
                description=description_of(tool.description),
                search_terms=search_terms_of(tool.name, title, tool.name.replace("_", " ")),
                handler=_Tool(
                    session,
                    tool.name,
                    cap_id,
                    {kw: orig for orig, kw in keywords.items()},
                    tool.output_schema is not None,
                ),
                input_shape=in_shape,
                output_shape=out_shape,
                third_party=True,
            )
        )
        too_large = answer_problem(caps[-1], bounds or AnswerBounds())
        if too_large is not None:  # never cut: a cut signature would lie
            caps.pop()
            report.skip(tool.name, too_large)
            continue
        report.converted.append(tool.name)
    report.finish()
    return caps, report


def _run_in_fresh_loop(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion on a private event loop in another thread (works whether or
    not the calling thread already runs a loop)."""

    async def main() -> T:
        return await factory()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="codemode-upstream") as pool:
        return pool.submit(asyncio.run, main()).result()


class UpstreamMCPPack:
    """A pack over several upstream MCP servers (see the module docstring)."""

    def __init__(self, configs: Sequence[UpstreamMCPConfig]) -> None:
        check_unique_names((cfg.name for cfg in configs), "upstream")
        self.configs = list(configs)
        self.sessions = {cfg.name: UpstreamSession(cfg) for cfg in self.configs}
        self.reports: dict[str, SkipReport] = {}

    async def acapabilities(
        self, *, keep_open: bool = True, bounds: AnswerBounds | None = None
    ) -> list[Capability]:
        """Connect to every upstream, list and compile its tools. With ``keep_open`` the
        connections stay up for the calls made on this event loop ("connect at start"). A tool
        whose answers would not fit ``bounds`` (default: the default limits) is skipped."""
        caps: list[Capability] = []
        for cfg in self.configs:
            session = self.sessions[cfg.name]
            try:
                async with asyncio.timeout(cfg.connect_timeout):
                    tools = await session.list_tools()
            except UpstreamBuildError:
                raise
            except Exception as exc:
                raise UpstreamBuildError(
                    f"upstream {cfg.name!r}: cannot connect and list tools: {_brief(exc)}"
                ) from None
            finally:
                if not keep_open:
                    await session.aclose()
            one, report = _compile_tools(cfg, session, tools, bounds)
            self.reports[cfg.name] = report
            caps += one
        return caps

    def capabilities(self, settings: PackSettings | None = None) -> list[Capability]:
        """The pack protocol: discovery runs on a private loop (so this works from sync code); the
        calls then connect again on the loop that serves them."""
        bounds = settings.answer_bounds if settings is not None else None
        return _run_in_fresh_loop(lambda: self.acapabilities(keep_open=False, bounds=bounds))

    async def connect(self) -> None:
        """Open every upstream connection now, on the running loop (e.g. at server start), so the
        first call does not pay for starting the upstream. Failures are logged; calls retry."""
        for name, session in self.sessions.items():
            try:
                async with asyncio.timeout(session.config.connect_timeout):
                    await session.client()
            except Exception as exc:
                log.warning("upstream %r: cannot connect yet: %s", name, _brief(exc))

    async def aclose(self) -> None:
        """Close the live upstream connections opened on the running loop."""
        for session in self.sessions.values():
            await session.aclose()


def upstream_mcp_pack(configs: Sequence[UpstreamMCPConfig | Mapping[str, Any]]) -> UpstreamMCPPack:
    """Build the pack from configs (models or plain mappings, e.g. ``[[upstream_mcp]]`` tables)."""
    return UpstreamMCPPack(
        [c if isinstance(c, UpstreamMCPConfig) else UpstreamMCPConfig.model_validate(c) for c in configs]
    )
