"""The MCP adapter: exactly three tools over a built :class:`codemode.Server` (docs/reference/tools.md).

``create_server(server, resolver)`` returns an official MCP SDK low-level server
(``mcp.server.Server``) publishing ``search_api {query}``, ``describe_api {name}`` and
``execute {source}``. Every ``tools/call`` goes through the same pipeline:

1. the tool name must be one of the three (else a JSON-RPC ``invalid params`` error);
2. the arguments are checked against the tool's input schema: exactly one key, the declared one, with
   a string value. The low-level SDK server does not validate arguments, so this adapter does it,
   **before** the resolver runs; a violation is an ``isError`` result with a fixed text that names
   the expected argument and never echoes what was sent;
3. the invocation resolver turns the request into a trusted :class:`~codemode.authz.Subject`; a
   resolver exception, a non-``Subject`` value or an empty id is ``unauthenticated`` and no
   discovery or execution work happens;
4. the call runs; success is ``structuredContent`` plus exactly one ``TextContent`` holding the
   compact JSON of the same object; failure is an ``isError`` result with exactly one
   ``TextContent`` whose text is :func:`codemode.common.errors.client_text` of a ``CodeModeError``, or
   ``internal failure`` for anything else (the detail is logged host-side, never sent).
   ``execute`` differs: every result of it, success or error, has ``structuredContent`` with the
   call ledger (``calls``) and, when the server keeps them, the prints; its first text block is
   the compact JSON of ``{"result": ...}`` or the error text, the second the compact JSON of
   ``{"calls": [...]}``, a third (only for non-empty prints) that of ``{"prints": "..."}``.

Request cancellation is not caught: it cancels the running execute, which kills and reaps its worker.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import mcp_types as types
from mcp.server import Server as MCPLowLevelServer
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .. import authz
from ..common.errors import CodeModeError, Internal, Unauthenticated, client_text
from ..common.outcomes import LEDGER_OUTCOMES, ExecuteResult
from ..execution.server import Server
from .approval import ElicitingApprover, can_elicit
from .progress import execute_progress
from .retries import RetryingExecutes

__all__ = [
    "DESCRIBE_DESCRIPTION",
    "DESCRIBE_OUTPUT_SCHEMA",
    "EXECUTE_DESCRIPTION",
    "EXECUTE_OUTPUT_SCHEMA",
    "SEARCH_DESCRIPTION",
    "SEARCH_OUTPUT_SCHEMA",
    "SERVER_INSTRUCTIONS",
    "TOOL_NAMES",
    "ContextSubject",
    "JSONObject",
    "Resolver",
    "StaticSubject",
    "create_server",
    "tool_definitions",
]

log = logging.getLogger("codemode.mcp")

#: A JSON object (a tool's structured output).
JSONObject = dict[str, Any]


class Resolver(Protocol):
    """Turns one MCP request into the trusted subject. ``resolve`` may be sync or async.

    ``request`` is the SDK's request context (``mcp.server.context.ServerRequestContext``) or
    ``None`` when there is none. Raise (anything) or return an empty id to refuse the request.
    """

    def resolve(self, request: Any) -> authz.Subject | Awaitable[authz.Subject]:
        """The trusted subject of one MCP request.

        Args:
            request: the SDK's request context, or None.

        Returns:
            The subject (or an awaitable of it); an empty id refuses the request.
        """
        ...


class StaticSubject:
    """Always the same subject: for a single-user stdio deployment only."""

    def __init__(self, id: str) -> None:
        """Serve every request as one subject.

        Args:
            id: the subject id (non-empty).

        Raises:
            ValueError: an empty or non-string id.
        """
        if not isinstance(id, str) or not id:
            raise ValueError("StaticSubject needs a non-empty subject id")
        self.id = id

    def resolve(self, request: Any) -> authz.Subject:
        """The configured subject, whatever the request.

        Args:
            request: ignored.

        Returns:
            ``Subject(id)``.
        """
        return authz.Subject(self.id)

    def __repr__(self) -> str:
        return f"StaticSubject({self.id!r})"


class ContextSubject:
    """The subject that authentication middleware stored with ``codemode.authz.with_subject``.

    Nothing in the MCP request (arguments, ``_meta``, client info) can set or replace it.
    """

    def resolve(self, request: Any) -> authz.Subject:
        """The subject authentication stored for this request.

        Args:
            request: ignored (nothing in it can choose the subject).

        Returns:
            The authenticated subject.

        Raises:
            Unauthenticated: no subject was stored (``unauthenticated``).
        """
        subject = authz.current_subject()
        if subject is None:
            raise Unauthenticated()
        return subject

    def __repr__(self) -> str:
        return "ContextSubject()"


# --------------------------------------------------------------------------------------------------
# Tool definitions
# --------------------------------------------------------------------------------------------------

#: The three tools' descriptions, as ``tools/list`` gives them (docs/reference/tools.md).
SEARCH_DESCRIPTION = """\
Find the host capabilities (functions your execute program can call) that fit a task.

How to query: use the words of the task, e.g. "create record", "search records by tag", "delete \
entry", or paste an exact dotted name such as "records.create" (an exact name always ranks first). \
Matching is by whole word, another form of the same English word (entity/entities, \
create/created/creating) or word prefix (3+ letters); there are no synonyms or spelling fixes, so \
if nothing comes back, try other words for the same thing, fewer words, or a broader noun. Words \
such as a/the/for/with are ignored. At most 16 distinct words.

Returns {"results": [{"name", "signature", "summary"}], "truncated"}. truncated=true means more \
capabilities matched than were returned: narrow the query. An empty result list means no match.

Next step: call describe_api with the exact name of the capability you want, then use it in \
execute exactly as its signature shows.

Errors: "resource limit exceeded: query" - the query is too long or has too many words: shorten it. \
"unauthenticated" - the host did not accept your identity: do not retry, tell the user. \
"internal failure" - a host-side problem: retry once later."""

DESCRIBE_DESCRIPTION = """\
Get the exact contract of one capability before calling it: its signature, every input field \
(name, type, required) and every output field.

Pass the exact dotted name from search_api, e.g. "records.create": case-sensitive, no spaces, no \
parentheses. Types use Python-like notation: str, int, bool, float, list[T], dict[str, T], \
json (any JSON value: None, bool, int, float, str, or a list or dict of those), \
{a: T, b: U} for a nested object (pass a dict with exactly those keys), and "T | None" for an \
optional input (required=false: omit it or pass None). Output fields with required=false may be \
absent from the returned dict, and nested optional output fields are written "name?: T".

Call a capability inside execute with keyword arguments only, exactly as the signature shows: \
the signature records.get(*, id: int) means records.get(id=7). The call returns plain values: \
a record output is a dict, so read fields with r["id"].

Errors: "capability not found" - the name is not exact or the capability is not available on this \
host: run search_api again and copy the name ("did you mean <name>?" after it names the closest \
one). "unauthenticated" - do not retry, tell the user."""

EXECUTE_DESCRIPTION = """\
Run one Starlark program (a small, deterministic Python dialect) that calls capabilities and \
returns a value. Every call runs in a fresh, isolated sandbox: nothing survives between execute \
calls except what capabilities themselves store. Use search_api and describe_api first; do as much \
of the task as is sensible in one program (loops, conditions, several calls), and return only what \
you need.

Program rules:
- Define `def main():` at top level, with no parameters of any kind. Its return value is the \
result: None, bool, int, float, str, list (tuples become lists) or dict with str keys, nested. \
Anything else (functions, ranges, ...) is an invalid program.
- Call capabilities by dotted name, with keyword arguments only: records.create(title="x", \
tags=["a", "b"]). Positional arguments are rejected. Calls are accepted only while main() runs \
(directly or through functions it calls); top-level code may define constants and functions but \
must not call capabilities.
- A call returns plain values: dicts, lists, str, int, float, bool, None. Read fields as r["id"].
- Builtins available, nothing else: abs all any attempt bool chr dict dir enumerate fail float getattr \
hasattr hash int len list max min ord parallel print range repr reversed sorted str sum tuple type zip, \
json.encode/json.decode/json.indent and math.* (sqrt, floor, ceil, pow, log, exp, fabs, round, pi, \
e, sin, cos, ...). Strings support "%s" % x and "{}".format(x).
- Not available: load, import, while (use `for i in range(n):`), f-strings (use "%s" % x or str()), \
filter and map (use list comprehensions), set (use dict keys), try/except (use attempt, below), \
classes, the << operator (multiply instead). There is no time, file, network, environment or \
process access.
- A failing capability call ends the whole program. To handle the failure inside the program \
instead, wrap the call: r = attempt(records.get, id=7) makes the call records.get(id=7) and \
returns {"ok": True, "value": <its result>} or {"ok": False, "error": "<error text>"}; branch on \
r["ok"]. Only "permission denied", "capability failed..." and "invalid capability arguments..." \
come back this way; every other error (limits, policy failure, internal failure) still ends the \
program. An attempt counts as a call like any other.
- Independent calls can run at once: rs = parallel([(records.get, {"id": 1}), (records.get, {"id": 2})]) \
makes both calls together and returns one attempt-style record per call, in order ({"ok": True, \
"value": ...} or {"ok": False, "error": ...}). Each call counts as a call; limits, policy failures and \
internal failures still end the program.
- print() output is returned as "prints" (for debugging your program) only if this host keeps it; \
otherwise it is discarded. Never use it for results: return data instead.
- Programs have budgets (interpreter steps, wall time, number of capability calls, size and \
nesting of values).

Example:
def main():
    r = records.create(title="Buy milk", tags=["shopping"])
    found = records.search(text="milk")
    return {"created": r["id"], "matches": [x["title"] for x in found["records"]]}

Returns {"result": <main()'s return value>, "calls": [...]}. Every result, also an error, \
carries "calls" (a second text block {"calls": [...]}): the capability calls the program made, in \
order, each {"capability": "records.create", "outcome": ...}. Outcomes: "ok" (it ran and its result \
reached the program), "denied", "policy failure", "invalid arguments" and "not run" (it did not \
run), "declined" (the host asked the user to approve the call and it was not approved; it did not \
run: do not retry it, tell the user what you wanted to do), "failed" (it ran and failed; it may \
have had an effect), "limit exceeded" (it ran, but a budget stopped it, e.g. its result was too \
large), "interrupted" (the time ran out while it ran; it may have had an effect), "replay diverged" \
(after the user's answer the program made another call than before; it did not run). After an \
error, read "calls" before you retry: the calls with outcome "ok" (and maybe "failed", "limit \
exceeded", "interrupted") have already happened; do not repeat their effects (for example, do not \
create the same record twice), continue from the failed call. Calls never reached because a \
limit stopped the program first are not listed.

Errors and how to recover:
- "invalid program: <codemode>:LINE:COL: message" (or just "invalid program") - syntax error, \
unknown name, runtime error (e.g. fail(), index out of range, calling an unknown capability), \
missing or wrong `def main():`, a capability call outside main, or an unsupported return value. \
Fix the program at that position and run it again.
- "invalid capability arguments: <diagnostic>" - a call had positional, unknown, missing, \
wrong-typed or out-of-range arguments; the diagnostic names the argument path (e.g. "filter.owner", \
"tags[1]", "labels['env']"). Check describe_api and fix that call.
- "capability failed: <message>" - the capability reported a problem, e.g. "record 7 not found": \
act on the message. Plain "capability failed" - it failed without details: retry once or try \
another way.
- "permission denied" - the host's policy refused that call for you, or (outcome "declined") the \
user did not approve it when asked: do not repeat it; choose another approach (attempt() lets the \
program do so itself) or tell the user.
- "authorization policy failure" - the host could not evaluate its policy: retrying will not help; \
tell the user.
- "resource limit exceeded: <kind>" - a budget ran out; the kind says which. "time", "steps" \
(loop iterations, function calls, call depth), "native calls", "memory", "value size" (an argument, \
a result or the return value too large or too deeply nested), "intermediate bytes" (all capability \
results together): do less per program (fewer loop iterations, fewer or narrower calls, smaller \
results and strings) or split the work over several execute calls. "source size": shorten the \
program. "concurrency" (the host is busy) or "quota" (you already run as many programs as allowed): \
wait for your other calls to finish, then retry. "approval wait" (the user did not answer the \
program's questions in time): do not ask again; tell the user.
- "unauthenticated" - do not retry, tell the user. "internal failure" - a host-side problem: retry \
once later."""

#: The server's ``instructions`` in its ``initialize`` answer.
SERVER_INSTRUCTIONS = """\
This server uses "code mode": instead of one tool per operation it offers three tools. \
1) search_api: find capabilities with the words of your task. 2) describe_api: read the exact \
signature of the one you want. 3) execute: run a short Starlark program whose main() calls \
capabilities with keyword arguments (e.g. records.get(id=7)) and returns plain data."""


def _input_schema(arg: str, description: str) -> JSONObject:
    return {
        "type": "object",
        "properties": {arg: {"type": "string", "description": description}},
        "required": [arg],
        "additionalProperties": False,
    }


def _object(properties: JSONObject, description: str | None = None) -> JSONObject:
    schema: JSONObject = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    if description:
        schema["description"] = description
    return schema


_STRING: JSONObject = {"type": "string"}
_FIELD_ITEM = _object({"name": _STRING, "type": _STRING, "required": {"type": "boolean"}})
# An input with a default carries it: optional, any JSON value, said as such (a bare {} constrains
# nothing, which the MCP Inspector's strict check flags).
_FIELD_ITEM["properties"]["default"] = {
    "anyOf": [
        {"type": kind} for kind in ("string", "number", "integer", "boolean", "array", "object", "null")
    ]
}
_FIELD_LIST: JSONObject = {"type": "array", "items": _FIELD_ITEM}

#: The three tools' output schemas (their ``structuredContent``).
SEARCH_OUTPUT_SCHEMA = _object(
    {
        "results": {
            "type": "array",
            "items": _object({"name": _STRING, "signature": _STRING, "summary": _STRING}),
        },
        "truncated": {"type": "boolean"},
    }
)
DESCRIBE_OUTPUT_SCHEMA = _object(
    {
        "name": _STRING,
        "signature": _STRING,
        "summary": _STRING,
        "description": _STRING,
        "input": _FIELD_LIST,
        "output": _FIELD_LIST,
    }
)
# A result that is not an object (a function returning str) has no output fields: its type instead.
DESCRIBE_OUTPUT_SCHEMA["properties"]["returns"] = _STRING
_CALL_ITEM = _object({"capability": _STRING, "outcome": {"type": "string", "enum": list(LEDGER_OUTCOMES)}})
EXECUTE_OUTPUT_SCHEMA: JSONObject = {
    "type": "object",
    "properties": {
        "result": {
            "anyOf": [
                {"type": kind}
                for kind in ("null", "boolean", "integer", "number", "string", "array", "object")
            ],
            "description": "main()'s return value: null, boolean, number, string, array or object, nested. "
            "Present on every success.",
        },
        "error": {
            "type": "string",
            "description": "The error text (the same as the first text block): on every error result.",
        },
        "calls": {
            "type": "array",
            "items": _CALL_ITEM,
            "description": "The capability calls the program made, in order, with what became of each.",
        },
        "prints": {
            "type": "string",
            "description": "The program's print() output (bounded, cut with a marker), if the host keeps it.",
        },
    },
    "required": ["calls"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class _Request:
    """What a tool may use of its MCP request besides the argument: the request's ``_meta`` (where
    a client may send W3C trace context: ``traceparent``, ``tracestate``) and the SDK's request
    context (through which the user can be asked, when the client and transport allow it)."""

    meta: Mapping[str, Any] | None = None
    context: Any = None


#: A tool's work: the server, the trusted subject, the tool's one argument and its request.
_Runner = Callable[[Server, authz.Subject, str, _Request], Awaitable[JSONObject]]


async def _run_search(server: Server, subject: authz.Subject, query: str, request: _Request) -> JSONObject:
    return server.search(query).to_dict()


async def _run_describe(server: Server, subject: authz.Subject, name: str, request: _Request) -> JSONObject:
    return server.describe(name).to_dict()


async def _run_execute(server: Server, subject: authz.Subject, source: str, request: _Request) -> JSONObject:
    approver = (
        ElicitingApprover(request.context) if isinstance(request.context, ServerRequestContext) else None
    )
    run = await server.run(source, subject=subject, trace_context=request.meta, approver=approver)
    return _execute_output(server, run)


def _execute_output(server: Server, run: ExecuteResult) -> JSONObject:
    out: JSONObject = {"result": run.value, "calls": [c.to_dict() for c in run.calls]}
    if server.limits.max_print_bytes > 0:
        out["prints"] = run.prints or ""
    return out


@dataclass(frozen=True)
class _ToolSpec:
    name: str
    title: str
    arg: str
    arg_description: str
    description: str
    output_schema: JSONObject
    read_only: bool
    run: _Runner

    @property
    def input_schema(self) -> JSONObject:
        return _input_schema(self.arg, self.arg_description)

    @property
    def schema_error(self) -> str:
        return f'invalid tool arguments: {self.name} takes exactly one argument, "{self.arg}", a string'

    def to_tool(self) -> types.Tool:
        if self.read_only:
            annotations = types.ToolAnnotations(
                title=self.title, read_only_hint=True, idempotent_hint=True, open_world_hint=False
            )
        else:
            annotations = types.ToolAnnotations(title=self.title, read_only_hint=False)
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            annotations=annotations,
        )


_TOOLS: dict[str, _ToolSpec] = {
    spec.name: spec
    for spec in (
        _ToolSpec(
            name="search_api",
            title="Search capabilities",
            arg="query",
            arg_description='Task words, e.g. "create record", or an exact dotted capability name.',
            description=SEARCH_DESCRIPTION,
            output_schema=SEARCH_OUTPUT_SCHEMA,
            read_only=True,
            run=_run_search,
        ),
        _ToolSpec(
            name="describe_api",
            title="Describe one capability",
            arg="name",
            arg_description='The exact dotted capability name from search_api, e.g. "records.create".',
            description=DESCRIBE_DESCRIPTION,
            output_schema=DESCRIBE_OUTPUT_SCHEMA,
            read_only=True,
            run=_run_describe,
        ),
        _ToolSpec(
            name="execute",
            title="Run a Starlark program",
            arg="source",
            arg_description="Starlark source that defines def main(): and returns plain data.",
            description=EXECUTE_DESCRIPTION,
            output_schema=EXECUTE_OUTPUT_SCHEMA,
            read_only=False,
            run=_run_execute,
        ),
    )
}

TOOL_NAMES: tuple[str, ...] = tuple(_TOOLS)


def tool_definitions() -> list[types.Tool]:
    """The three tool definitions.

    Returns:
        ``search_api``, ``describe_api`` and ``execute``, as ``tools/list`` returns them.
    """
    return [spec.to_tool() for spec in _TOOLS.values()]


# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _success_result(value: JSONObject) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_compact_json(value))],
        structured_content=value,
    )


def _error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _report_blocks(out: JSONObject) -> list[types.TextContent]:
    """The ledger block, and the prints block when there are prints."""
    blocks = [_text(_compact_json({"calls": out["calls"]}))]
    if out.get("prints"):
        blocks.append(_text(_compact_json({"prints": out["prints"]})))
    return blocks


def _execute_success(out: JSONObject) -> types.CallToolResult:
    """``execute``'s success: the whole output as ``structuredContent``; as text, ``{"result"}``
    first (the same block as before the ledger existed), then the ledger (and the prints)."""
    return types.CallToolResult(
        content=[_text(_compact_json({"result": out["result"]})), *_report_blocks(out)],
        structured_content=out,
    )


def _execute_error(server: Server, text: str, err: CodeModeError | None) -> types.CallToolResult:
    """``execute``'s error: the approved ``text`` alone in the first block; the ledger and prints of
    what ran before the failure in ``structuredContent`` and the blocks after it."""
    out: JSONObject = {"error": text, "calls": [c.to_dict() for c in (err.calls if err else ())]}
    if server.limits.max_print_bytes > 0:
        out["prints"] = (err.prints if err else None) or ""
    return types.CallToolResult(
        content=[_text(text), *_report_blocks(out)], structured_content=out, is_error=True
    )


def _arguments_ok(spec: _ToolSpec, arguments: Mapping[str, Any] | None) -> bool:
    return (
        isinstance(arguments, Mapping)
        and len(arguments) == 1
        and spec.arg in arguments
        and isinstance(arguments[spec.arg], str)
    )


async def _resolve(resolver: Resolver, request: Any) -> authz.Subject:
    """Run the resolver; anything but a Subject with a non-empty str id is ``Unauthenticated``."""
    try:
        subject = resolver.resolve(request)
        if inspect.isawaitable(subject):
            subject = await subject
    except Exception as exc:
        log.info("resolver refused the request: %s", type(exc).__name__)
        raise Unauthenticated() from None
    if not isinstance(subject, authz.Subject) or not isinstance(subject.id, str) or not subject.id:
        log.info("resolver returned no usable subject")
        raise Unauthenticated()
    return subject


def _per_request_protocol(request: Any) -> bool:
    """The request speaks the 2026-07-28 per-request protocol (no server requests: a question to
    the user is an ``InputRequiredResult`` and its answer comes with the client's retry)."""
    return isinstance(request, ServerRequestContext) and request.protocol_version in MODERN_PROTOCOL_VERSIONS


class _Handlers:
    """The ``tools/list`` and ``tools/call`` handlers bound to one server and resolver."""

    def __init__(self, server: Server, resolver: Resolver) -> None:
        self.server = server
        self.resolver = resolver
        self.tools = tool_definitions()
        self.retries = RetryingExecutes()

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.model_copy(deep=True) for tool in self.tools])

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        spec = _TOOLS.get(params.name)
        if spec is None:
            raise MCPError(code=types.INVALID_PARAMS, message="unknown tool")
        arguments = params.arguments
        if not _arguments_ok(spec, arguments):
            return self.failure(spec, spec.schema_error, None)
        assert arguments is not None
        meta = params.meta if isinstance(params.meta, Mapping) else None
        if spec.name != "execute":
            return await self.run(spec, ctx, arguments[spec.arg], meta)
        async with execute_progress(ctx):  # notifications/progress when the call asked (mcp.progress)
            if _per_request_protocol(ctx):
                return await self.run_retrying(ctx, arguments[spec.arg], meta, params)
            return await self.run(spec, ctx, arguments[spec.arg], meta)

    async def run(
        self, spec: _ToolSpec, request: Any, value: str, meta: Mapping[str, Any] | None = None
    ) -> types.CallToolResult:
        try:
            subject = await _resolve(self.resolver, request)
            out = await spec.run(self.server, subject, value, _Request(meta, request))
            return _execute_success(out) if spec.name == "execute" else _success_result(out)
        except CodeModeError as err:
            return self.failure(spec, client_text(err), err)
        except Exception as exc:  # CancelledError is a BaseException and propagates
            log.exception("%s failed in the host: %s", spec.name, type(exc).__name__)
            return self.failure(spec, Internal.text, None)

    async def run_retrying(
        self,
        ctx: ServerRequestContext[Any],
        source: str,
        meta: Mapping[str, Any] | None,
        params: types.CallToolRequestParams,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """``execute`` on the 2026-07-28 protocol: a question to the user answers the call with an
        ``InputRequiredResult``; the client's retry (``request_state``) resumes the same execute
        (codemode.mcp.retries). An unknown state is a JSON-RPC error, raised as it is."""
        spec = _TOOLS["execute"]
        try:
            subject = await _resolve(self.resolver, ctx)
            if params.request_state is not None:
                outcome = await self.retries.resume(
                    self.server, subject, source, params.request_state, params.input_responses, meta
                )
            else:
                outcome = await self.retries.start(
                    self.server, subject, source, meta, can_elicit(ctx.session)
                )
            if isinstance(outcome, types.InputRequiredResult):
                return outcome
            return _execute_success(_execute_output(self.server, outcome))
        except CodeModeError as err:
            return self.failure(spec, client_text(err), err)
        except MCPError:
            raise
        except Exception as exc:  # CancelledError is a BaseException and propagates
            log.exception("execute failed in the host: %s", type(exc).__name__)
            return self.failure(spec, Internal.text, None)

    def failure(self, spec: _ToolSpec, text: str, err: CodeModeError | None) -> types.CallToolResult:
        return _execute_error(self.server, text, err) if spec.name == "execute" else _error_result(text)


def create_server(
    server: Server,
    resolver: Resolver,
    name: str = "codemode",
    version: str | None = None,
    *,
    instructions: str | None = SERVER_INSTRUCTIONS,
) -> MCPLowLevelServer[Any]:
    """An official MCP SDK low-level server publishing exactly the three code-mode tools.

    The caller owns ``server``'s lifecycle (``await server.aclose()`` when done).

    Args:
        server: the built :class:`~codemode.Server`.
        resolver: any object with ``resolve(request) -> Subject`` (sync or async).
        name: the server name the MCP handshake reports.
        version: its version (default: codemode's).
        instructions: the handshake's instructions for the model (None: none).

    Returns:
        The MCP server (run it on a transport: stdio, streamable HTTP).

    Raises:
        TypeError: ``server`` is not a built Server, or ``resolver`` has no ``resolve``.
    """
    if not isinstance(server, Server):
        raise TypeError("create_server needs a built codemode.Server")
    if not callable(getattr(resolver, "resolve", None)):
        raise TypeError("resolver must have a resolve(request) method")
    if version is None:
        from .. import __version__

        version = __version__
    handlers = _Handlers(server, resolver)
    server.attach(handlers.retries)  # executes waiting for a retry end with the server
    schemas = {spec.name: spec.input_schema for spec in _TOOLS.values()}
    return MCPLowLevelServer(
        name,
        version=version,
        instructions=instructions,
        get_tool_input_schema=schemas.get,
        on_list_tools=handlers.list_tools,
        on_call_tool=handlers.call_tool,
    )
