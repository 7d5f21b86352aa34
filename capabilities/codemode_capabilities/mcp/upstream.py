"""Upstream MCP servers as capabilities: codemode in front of tools you already have.

What the pack does for operators (ids and names, inputs and outputs, tenancy, per-subject bounds,
error text, credentials) is docs/packs.md, "Upstream MCP servers". Here: :func:`upstream_mcp_pack`
builds the :class:`UpstreamMCPPack` from ``[[upstream_mcp]]`` tables (:class:`UpstreamMCPConfig`,
from ``config``); its discovery lists each upstream's tools and compiles them
(``codemode.packs.compile_each``, ``jsonschema`` and the naming and text rules of
``codemode.packs.upstream``); each tool's handler (``_Tool``) applies the subject's budget and
directory bounds, then calls through the upstream's session pool.

The parts, beside this module in ``codemode_capabilities.mcp``: sessions (``session``) pooled per
subject or shared (``pool``, which also stops stuck sessions and charges restarts), all on the
pack's own event loop (``loop``), so the session that listed the tools can serve the calls;
per-subject configuration, the fixed-path rule and call budgets (``tenancy``, ``disk``); bounded reads
of what an upstream sends (``stdio_relay`` for stdio, ``bounded_http`` for HTTP).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from codemode import AgentError, CallContext, Capability, ResourceLimit
from codemode.authz import Subject
from codemode.packs import (
    AnswerBounds,
    PackSettings,
    Redactor,
    SkipReport,
    Unsupported,
    UpstreamBuildError,
    argument_names,
    capability_names,
    check_unique_names,
    compile_each,
    description_of,
    record_of,
    search_terms_of,
    summary_of,
    unique_by_name,
    upstream_error_text,
    upstream_result,
)

from . import stdio_relay
from ._commands import resolve_command
from ._loop import BackgroundLoop
from .config import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_TOOLS, UpstreamMCPConfig
from .disk import measure, remove_tree
from .pool import SessionPool
from .session import (
    Launch,
    UpstreamCallFailed,
    UpstreamSession,
    brief,
    check_command,
)
from .stdio_relay import VIEW_DIR
from .tenancy import (
    CallBudget,
    SubjectDirs,
    expand,
    subject_key,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_TOOLS",
    "TEXT_OUTPUT",
    "UpstreamCallFailed",
    "UpstreamMCPConfig",
    "UpstreamMCPPack",
    "UpstreamSession",
    "upstream_mcp_pack",
]

log = logging.getLogger("codemode.capabilities.mcp_upstream")

TEXT_OUTPUT: dict[str, Any] = {"t": "record", "fields": [{"name": "text", "shape": {"t": "str"}}]}
"""The output of a tool without ``outputSchema``: ``{text: str}``."""

_TOOL_NAME = re.compile(r"[\x21-\x7e]{1,128}\Z")
#: Plain forms of a credential shorter than this are not redacted from the tool list (as in the
#: upstream's answers and error texts: codemode.packs.upstream_result, upstream_error_text).
_MIN_SECRET = 4
# Kept importable under the old private name (tests, embedders).
_check_command = check_command


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
    """The handler of one upstream tool (runs on the serving loop; the call itself on the pack's)."""

    def __init__(
        self,
        pack: UpstreamMCPPack,
        config: UpstreamMCPConfig,
        tool: str,
        cap_id: str,
        to_upstream: Mapping[str, str],
        structured: bool,
    ) -> None:
        self.pack = pack
        self.config = config
        self.tool = tool
        self.cap_id = cap_id
        self.to_upstream = dict(to_upstream)  # keyword -> upstream argument name
        self.structured = structured

    async def __call__(self, ctx: CallContext, subject: Subject, args: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        arguments = {self.to_upstream.get(k, k): v for k, v in args.items()}
        budget = self.pack.budgets[cfg.name]
        budget.spend(subject.id, len(json.dumps(arguments, ensure_ascii=False).encode("utf-8")))
        if cfg.max_subject_dir_bytes or cfg.max_subject_dir_entries:
            await self.pack.check_disk(cfg, subject.id)
        pool = self.pack.pools[cfg.name]
        deadline = time.monotonic() + ctx.remaining()
        call = pool.call(subject.id, self.tool, arguments, deadline, self.cap_id)
        result, secrets = await self.pack.loop.run(call)
        if result.is_error:
            text = _text_of(result.content)
            budget.returned(subject.id, len(text.encode("utf-8")))
            shown = await Redactor.off_loop(subject.id, len(text), _error_text, cfg.name, text, secrets)
            if not shown:
                log.warning("upstream %r: %s returned isError without text", cfg.name, self.cap_id)
                raise UpstreamCallFailed(self.cap_id)
            raise AgentError(shown)
        if self.structured:
            value = result.structured_content
            if not isinstance(value, dict):
                log.warning("upstream %r: %s returned no structuredContent object", cfg.name, self.cap_id)
                raise UpstreamCallFailed(self.cap_id)
            size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
            budget.returned(subject.id, size)
            return await Redactor.off_loop(subject.id, size, _answer, cfg.name, value, secrets)
        text = _text_of(result.content)
        budget.returned(subject.id, len(text.encode("utf-8")))
        return await Redactor.off_loop(subject.id, len(text), _answer, cfg.name, {"text": text}, secrets)


# A large answer or error text is redacted off the serving loop (codemode.packs.off_loop).
def _error_text(upstream: str, text: str, secrets: list[str]) -> str:
    return upstream_error_text(upstream, text, secrets=secrets)


def _answer(upstream: str, value: dict[str, Any], secrets: list[str]) -> dict[str, Any]:
    return upstream_result(upstream, value, secrets=secrets)


def _compile_tools(
    pack: UpstreamMCPPack,
    config: UpstreamMCPConfig,
    tools: Sequence[Any],
    bounds: AnswerBounds | None = None,
) -> tuple[list[Capability], SkipReport]:
    report = SkipReport(config.name, config.on_unsupported)
    # The tool list reaches every client (search_api, describe_api): a whole spelling of a
    # credential the host gave the server is cut out of its texts, and a tool whose name or
    # schemas carry one (an enum of them, a property named so) is skipped (found by a review).
    redactor = Redactor(config.secret_values(None), shortest=_MIN_SECRET)
    carried = 0
    wanted = []
    for t in tools:
        if not config.wanted(t.name):
            continue
        if not _TOOL_NAME.match(t.name):  # before naming: a skipped tool takes no name
            report.skip(repr(t.name)[:80], "tool name is not 1-128 printable ASCII characters without spaces")
            continue
        if redactor:
            listed, found = redactor.value([t.name, t.input_schema, t.output_schema])
            if found:
                carried += 1
                report.skip(listed[0], "its name or schemas carry a configured credential")
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

    def build(tool: Any, omissions: list[Unsupported]) -> Capability:
        nonlocal carried
        in_shape = record_of(tool.input_schema, direction="input")
        out_shape = (
            record_of(tool.output_schema, direction="output", pointer="(output)", omissions=omissions)
            if tool.output_schema is not None
            else TEXT_OUTPUT
        )
        keywords = argument_names([f["name"] for f in in_shape["fields"]])
        in_shape = {
            "t": "record",
            "fields": [{"name": keywords[f["name"]], "shape": f["shape"]} for f in in_shape["fields"]],
        }
        title = tool.title or (tool.annotations.title if tool.annotations is not None else None)
        said, found = redactor.value([title, tool.description])  # as they are when none is configured
        title, said_description = said
        carried += bool(found)
        cap_id = f"mcp:{config.name}:{tool.name}"
        handler = _Tool(
            pack,
            config,
            tool.name,
            cap_id,
            {kw: orig for orig, kw in keywords.items()},
            tool.output_schema is not None,
        )
        return Capability(
            id=cap_id,
            name=names[tool.name],
            summary=summary_of(said_description, title or f"Upstream tool {tool.name}."),
            description=description_of(said_description),
            search_terms=search_terms_of(tool.name, title, tool.name.replace("_", " ")),
            handler=handler,
            input_shape=in_shape,
            output_shape=out_shape,
            third_party=True,
        )

    ordered = sorted(wanted, key=lambda t: names[t.name])
    caps = compile_each(ordered, lambda t: str(t.name), build, report, bounds)
    if carried:
        log.warning("upstream %r: its tool list carried a configured credential: redacted", config.name)
    return caps, report


class UpstreamMCPPack:
    """A pack over several upstream MCP servers (docs/packs.md).

    Args:
        configs: the upstreams (names must be unique).
        data_dir: where per-subject directories live (``<data_dir>/upstreams/<name>/<subject
            key>``); ``capabilities(settings)`` takes the host's (``--data-dir``) when none is
            given, and without either a private temporary directory is used and removed by
            :meth:`aclose`.

    Raises:
        UpstreamBuildError: two configs have the same name.
    """

    def __init__(self, configs: Sequence[UpstreamMCPConfig], *, data_dir: Path | None = None) -> None:
        check_unique_names((cfg.name for cfg in configs), "upstream")
        self.configs = list(configs)
        self.data_dir = data_dir
        self._temp_dir: Path | None = None
        self.loop = BackgroundLoop("codemode-upstreams")
        self.pools = {
            cfg.name: SessionPool(
                cfg.name,
                cfg.tenancy,
                self._launcher(cfg),
                adoptable=not cfg.subject_specific,
                max_sessions=cfg.max_sessions,
                idle_timeout=cfg.idle_timeout,
                max_session_seconds=cfg.max_session_seconds,
                max_restarts=cfg.max_restarts_per_minute,
                timeout=cfg.timeout,
                stuck_grace=cfg.stuck_grace,
            )
            for cfg in self.configs
        }
        self.budgets = {
            cfg.name: CallBudget(
                cfg.max_calls_per_minute, cfg.max_sent_bytes_per_minute, cfg.max_returned_bytes_per_minute
            )
            for cfg in self.configs
        }
        self.reports: dict[str, SkipReport] = {}
        self._view_refused: str | None = None  # why a mount view cannot be made ("": it can)
        #: The server's answer bounds (``PackSettings.answer_bounds``): a tool whose search result or
        #: describe answer would not fit is skipped.
        self.answer_bounds: AnswerBounds | None = None

    def _root(self) -> Path:
        if self.data_dir is not None:
            return self.data_dir
        if self._temp_dir is None:
            self._temp_dir = Path(tempfile.mkdtemp(prefix="codemode-upstreams-"))
        return self._temp_dir

    def launch(self, cfg: UpstreamMCPConfig, subject_id: str | None) -> Launch:
        """What to start for a session.

        Args:
            cfg: the upstream.
            subject_id: the session's subject (None: the host's own session, for discovery).

        Returns:
            The command, arguments, environment and process limits (stdio) or URL and headers (HTTP),
            with the subject's placeholders and headers filled in.
        """
        common = {
            "upstream": cfg.name,
            "owner": "host" if subject_id is None else subject_key(subject_id),
            "max_message_bytes": cfg.max_message_bytes,
            "connect_timeout": cfg.connect_timeout,
            "secrets": cfg.secret_values(subject_id),
        }
        if cfg.command is None:
            headers = cfg.secret_headers()
            if subject_id is not None:  # a subject's header replaces a fixed one of that name
                subject = cfg.subject_header_values(subject_id)
                lower = {h.lower() for h in subject}
                headers = {h: v for h, v in headers.items() if h.lower() not in lower} | subject
            return Launch(**common, url=cfg.url, headers=headers)  # type: ignore[arg-type]
        values: dict[str, str] = {}
        view: str | None = None
        if cfg.placeholders:
            dirs = SubjectDirs(self._root(), cfg.name)
            where = dirs.host() if subject_id is None else dirs.of(subject_id)
            view = str(where) if cfg.uses_view else None
            values = {"{subject_dir}": VIEW_DIR if view else str(where), "{subject_key}": where.name}
        env = {k: expand(v, values) for k, v in cfg.child_env().items()}
        return Launch(
            **common,  # type: ignore[arg-type]
            command=resolve_command(cfg.command),
            args=tuple(expand(a, values) for a in cfg.args),
            env=env or None,
            cwd=expand(cfg.cwd, values) if cfg.cwd else None,
            view=view,
            memory_bytes=cfg.process_memory_bytes,
            file_bytes=cfg.process_file_bytes,
            cpu_seconds=cfg.process_cpu_seconds,
            tree_memory_bytes=cfg.process_tree_memory_bytes,
        )

    async def check_disk(self, cfg: UpstreamMCPConfig, subject_id: str) -> None:
        """Refuse a call when the subject's directory holds too much (walked in a thread, stopping
        past the bound).

        Args:
            cfg: the upstream.
            subject_id: the subject.

        Raises:
            ResourceLimit: ``quota``: more than ``max_subject_dir_bytes`` or
                ``max_subject_dir_entries``.
        """
        where = SubjectDirs(self._root(), cfg.name).path_of(subject_id)
        usage = await asyncio.to_thread(
            measure, where, cfg.max_subject_dir_entries, cfg.max_subject_dir_bytes
        )
        if usage.over:
            log.warning(
                "upstream %r: subject %s: its directory holds more than max_subject_dir_entries (%d) "
                "or max_subject_dir_bytes (%d): call refused",
                cfg.name,
                subject_key(subject_id),
                cfg.max_subject_dir_entries,
                cfg.max_subject_dir_bytes,
            )
            raise ResourceLimit("quota")

    def _launcher(self, cfg: UpstreamMCPConfig) -> Any:
        return lambda subject_id: self.launch(cfg, subject_id)

    async def _check_view(self, cfg: UpstreamMCPConfig) -> None:
        """Refuse an upstream whose server needs a mount view this system cannot make (checked once
        per pack, by the relay itself, on the upstream's host directory)."""
        if self._view_refused is None:
            where = SubjectDirs(self._root(), cfg.name).host()
            relay = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                stdio_relay.__file__,
                f"--check-view={where}",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, said = await relay.communicate()
            reason = said.decode("utf-8", "replace").strip()[-300:]
            found = re.search(r"\((.*)\)$", reason)
            self._view_refused = "" if relay.returncode == 0 else (found.group(1) if found else reason)
        if self._view_refused:
            raise UpstreamBuildError(
                f"upstream {cfg.name!r}: {{subject_dir}} needs a mount view of its own for the server, which "
                f"this system refuses (user namespaces: {self._view_refused}): allow unprivileged user "
                'namespaces (docs/packs.md), or set subject_dir_view = "host"'
            )

    async def _discover(self, keep_open: bool) -> list[Capability]:
        caps: list[Capability] = []
        try:
            for cfg in self.configs:
                if cfg.uses_view:
                    await self._check_view(cfg)
                try:
                    async with asyncio.timeout(cfg.connect_timeout):
                        tools = await self.pools[cfg.name].discover(keep_open=keep_open)
                except UpstreamBuildError:
                    raise
                except Exception as exc:
                    raise UpstreamBuildError(
                        f"upstream {cfg.name!r}: cannot connect and list tools: {brief(exc)}"
                    ) from None
                one, report = _compile_tools(self, cfg, tools, self.answer_bounds)
                self.reports[cfg.name] = report
                caps += one
        except BaseException:
            for pool in self.pools.values():  # no upstream left running for a pack that failed
                await pool.aclose()
            raise
        return caps

    async def acapabilities(self, *, keep_open: bool = True) -> list[Capability]:
        """Connect to every upstream, list and compile its tools.

        Args:
            keep_open: the host's sessions stay up for the calls (shared: the one session;
                per_subject: taken over by the first subject when nothing in the configuration is
                subject-specific).

        Returns:
            The capabilities (the skip reports are in ``reports``).
        """
        return await self.loop.run(self._discover(keep_open))

    def capabilities(self, settings: PackSettings | None = None) -> list[Capability]:
        """The pack protocol (works from synchronous code): discovery on the pack's own loop, whose
        sessions then serve the calls. Warns about shared upstreams when the host serves many
        subjects (``settings.multi_tenant``).

        Args:
            settings: the host's pack settings (data dir, answer bounds, multi-tenancy), if any.

        Returns:
            The capabilities.
        """
        if settings is not None and self.data_dir is None:
            self.data_dir = settings.data_dir
        if settings is not None:
            self.answer_bounds = settings.answer_bounds
        if settings is not None and settings.multi_tenant:
            self._refuse_shared_state()
        caps = self.loop.run_sync(self._discover(True))
        if settings is not None and settings.multi_tenant:
            self._warn_multi_tenant()
        return caps

    def _refuse_shared_state(self) -> None:
        """Many subjects: refuse a per-subject stdio table that gives every subject's server the same
        fixed path (before anything is started)."""
        for cfg in self.configs:
            shared = cfg.shared_state()
            if shared:
                named = ", ".join(f"{where} names {path!r}" for where, path in shared)
                raise UpstreamBuildError(
                    f"upstream {cfg.name!r}: every subject's server would be given the same path: {named}; "
                    "put per-subject state under {subject_dir}, list what may be shared in shared_paths, "
                    'or set tenancy = "shared"'
                )

    def _warn_multi_tenant(self) -> None:
        for cfg in self.configs:
            if cfg.tenancy == "shared":
                log.warning(
                    'upstream %r is shared by every subject (tenancy = "shared"): one session%s for all '
                    "tenants, so what one tenant leaves there another can read or change",
                    cfg.name,
                    " and one server process" if cfg.command else "",
                )
            elif cfg.command is not None and "{subject_dir}" in cfg.placeholders and not cfg.uses_view:
                log.warning(
                    'upstream %r: subject_dir_view = "host": each server is given its host path under '
                    "the data dir, which a tenant can learn through it (docs/packs.md)",
                    cfg.name,
                )
            elif cfg.command is not None and not cfg.placeholders:
                log.warning(
                    "upstream %r: each subject gets its own server process, but env/args/cwd use no "
                    "{subject_dir} or {subject_key}: whatever the server keeps on disk is shared "
                    "(ignore this for servers that keep no state)",
                    cfg.name,
                )

    async def open(self) -> None:
        """The pack's open step (the server awaits it at start): open the shared upstream sessions
        that discovery did not leave open, so the first call does not pay for starting the upstream.
        Failures are logged, never raised (an upstream that went away after discovery is not a
        start-up problem; calls retry). Per-subject sessions start on each subject's first call."""

        async def connect_all() -> None:
            for cfg in self.configs:
                try:
                    async with asyncio.timeout(cfg.connect_timeout):
                        await self.pools[cfg.name].connect()
                except Exception as exc:
                    log.warning("upstream %r: cannot connect yet: %s", cfg.name, brief(exc))

        await self.loop.run(connect_all())

    async def aclose(self) -> None:
        """Close every upstream session (and stop the pack's loop); a later call starts again."""

        async def close_all() -> None:
            for pool in self.pools.values():
                await pool.aclose()

        await self.loop.aclose(close_all())
        if self._temp_dir is not None:
            # Iterative: a tenant's tree may be far deeper than the recursion limit.
            await asyncio.to_thread(remove_tree, self._temp_dir)
            self._temp_dir = None


def upstream_mcp_pack(
    configs: Sequence[UpstreamMCPConfig | Mapping[str, Any]], *, data_dir: Path | None = None
) -> UpstreamMCPPack:
    """Build the pack from configs.

    Args:
        configs: models or plain mappings (``[[upstream_mcp]]`` tables).
        data_dir: see :class:`UpstreamMCPPack`.

    Returns:
        The pack.
    """
    return UpstreamMCPPack(
        [c if isinstance(c, UpstreamMCPConfig) else UpstreamMCPConfig.model_validate(c) for c in configs],
        data_dir=data_dir,
    )
