"""Shared rules for packs that turn someone else's tools into capabilities (MCP servers, OpenAPI).

* :func:`capability_names`: a deterministic, collision-free map from upstream tool/operation names
  to dotted snake_case capability names under one namespace (``github.list_issues``), independent
  of listing order. Originals claim names in this order: those already in snake_case
  (``get_thing`` is ``ns.get_thing``, always), then those in lower case, then the rest, each group
  in code-point order; an original whose snake_case form is taken gets the first free of ``_2``,
  ``_3``... . So a name that is some original's own snake_case form always belongs to that original.
* :func:`unique_by_name`: a tool listed several times is kept once when every copy is the same,
  else skipped (which one an upstream would run is unknown).
* :func:`argument_names`: keyword names for a tool's top-level arguments (kept when already a valid,
  non-reserved identifier; otherwise snake_cased, deduplicated the same way).
* :func:`summary_of`, :func:`description_of`, :func:`search_terms_of`: upstream text made to fit
  the capability rules (bounded, control characters removed).
* :func:`upstream_error_text` (from ``error_text``, re-exported here): the one rule for an
  upstream's own error text that a client may see (``capability failed: <upstream>: <text>``);
  :func:`upstream_result` (from ``_upstream_answer``): a successful answer without the credentials
  the host gave the upstream.
* :func:`answer_problem`: why a converted tool cannot be registered because its ``search_api``
  result or ``describe_api`` answer would not fit the configured bound (it is skipped like a tool
  whose schema cannot be represented, never cut: a cut signature would lie).
* :class:`SkipReport` / :data:`OnUnsupported`: what happens to a tool whose schema cannot be
  represented: ``skip`` (default) leaves it out with one warning listing every reason, ``fail``
  stops the build with all of them.
* :func:`compile_each`: the compile loop of an upstream pack (each item built, skipped, its
  omissions and its answers' size reported, then the report finished).
"""

from __future__ import annotations

import keyword
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from codemode_worker.protocol import STARLARK_KEYWORDS

from ..catalog.answers import AnswerBounds
from ..catalog.capability import (
    MAX_DESCRIPTION_BYTES,
    MAX_SEARCH_TERM_BYTES,
    MAX_SEARCH_TERMS,
    RESERVED_ROOTS,
    Capability,
    validate_catalog,
)
from ._upstream_answer import upstream_result
from .error_text import MAX_UPSTREAM_ERROR, upstream_error_text
from .jsonschema import Unsupported

__all__ = [
    "MAX_LOGGED_SKIPS",
    "MAX_SUMMARY",
    "MAX_UPSTREAM_ERROR",
    "OnUnsupported",
    "SkipReport",
    "UpstreamBuildError",
    "answer_problem",
    "argument_names",
    "capability_names",
    "check_namespace",
    "check_unique_names",
    "clean_text",
    "compile_each",
    "description_of",
    "search_terms_of",
    "snake_case",
    "summary_of",
    "unique_by_name",
    "upstream_error_text",
    "upstream_result",
]

log = logging.getLogger("codemode.upstream")
T = TypeVar("T")

#: What happens to a tool whose schema cannot be represented: left out with a warning, or the build fails.
OnUnsupported = Literal["skip", "fail"]
#: Bytes of an upstream summary: summaries are search-result lines, keep them short.
MAX_SUMMARY = 200
#: Skip-report lines in one log record (a 4,096-tool list must not flood it).
MAX_LOGGED_SKIPS = 50
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAMESPACE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*\Z")


class UpstreamBuildError(Exception):
    """An upstream could not be turned into capabilities (operator configuration or ``fail``)."""


def _reserved(word: str) -> bool:
    return word in STARLARK_KEYWORDS or keyword.iskeyword(word) or keyword.issoftkeyword(word)


def snake_case(text: str) -> str:
    """``getTinyImage`` → ``get_tiny_image``, ``HTTPServer-list`` → ``http_server_list``.

    Args:
        text: an upstream name.

    Returns:
        Its snake_case form: ``op`` when nothing is left, ``op_`` before a leading digit, a
        trailing ``_`` after a reserved word.
    """
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s)
    s = re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")
    if not s:
        s = "op"
    if s[0].isdigit():
        s = "op_" + s
    if _reserved(s):
        s += "_"
    return s


def check_unique_names(names: Iterable[str], what: str) -> None:
    """Each configured upstream name once.

    Args:
        names: the configured names.
        what: which kind of name, for the message (``upstream`` or ``api``).

    Raises:
        UpstreamBuildError: a name is configured twice.
    """
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise UpstreamBuildError(f"{what} name {name!r} is configured twice")
        seen.add(name)


def check_namespace(namespace: str) -> None:
    """A namespace is lower-case dotted snake_case whose root is not reserved.

    Args:
        namespace: the configured namespace.

    Raises:
        UpstreamBuildError: it is not dotted snake_case, a segment is a reserved word, or its
            root is a reserved name.
    """
    if not _NAMESPACE.match(namespace):
        raise UpstreamBuildError(
            f"namespace {namespace!r} must be lower-case dotted snake_case (e.g. github)"
        )
    for seg in namespace.split("."):
        if _reserved(seg):
            raise UpstreamBuildError(f"namespace {namespace!r}: segment {seg!r} is a reserved word")
    if namespace.split(".")[0] in RESERVED_ROOTS:
        raise UpstreamBuildError(f"namespace {namespace!r}: root {namespace.split('.')[0]!r} is reserved")


def _claim_order(original: str, base: str) -> tuple[bool, bool, str]:
    """Already snake_case first, then lower case, then the rest; code-point order within each."""
    return (original != base, original != original.lower(), original)


def _dedupe(bases: Mapping[str, str], taken: Iterable[str] = ()) -> dict[str, str]:
    used = set(taken)
    out: dict[str, str] = {}
    for original in sorted(bases, key=lambda o: _claim_order(o, bases[o])):
        base = bases[original]
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}_{n}"
        used.add(name)
        out[original] = name
    return out


def capability_names(namespace: str, originals: Iterable[str], taken: Iterable[str] = ()) -> dict[str, str]:
    """Capability names for upstream names, collision-free and independent of input order
    (the claim order: docs/packs.md).

    Args:
        namespace: the namespace the names go under (checked by :func:`check_namespace`).
        originals: the upstream tool or operation names.
        taken: short names (without the namespace) already given to others.

    Returns:
        ``{original: "namespace.snake_name"}``.
    """
    check_namespace(namespace)
    short = _dedupe({o: snake_case(o) for o in set(originals)}, taken)
    return {o: f"{namespace}.{s}" for o, s in short.items()}


def unique_by_name(
    items: Iterable[T], name: Callable[[T], str], same: Callable[[T, T], bool], report: SkipReport
) -> list[T]:
    """``items`` with each name once: copies that are all ``same`` are kept once; a name listed
    with different definitions is skipped (every copy), with the reason in ``report``.

    Args:
        items: the upstream's tools or operations.
        name: an item's name.
        same: whether two items are the same definition.
        report: where skipped names go.

    Returns:
        The kept items, in first-seen name order.
    """
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(name(item), []).append(item)
    out: list[T] = []
    for key, group in groups.items():
        if all(same(group[0], other) for other in group[1:]):
            out.append(group[0])
        else:
            report.skip(
                key,
                f"listed {len(group)} times with different definitions "
                "(which one the upstream runs is unknown)",
            )
    return out


def argument_names(originals: Iterable[str], taken: Iterable[str] = ()) -> dict[str, str]:
    """Keyword names for a tool's top-level arguments; valid, non-reserved identifiers are kept
    as they are, the others snake_cased and deduplicated like :func:`capability_names`.

    Args:
        originals: the upstream argument names.
        taken: keywords already in use.

    Returns:
        ``{original: keyword}``.
    """
    keep: dict[str, str] = {}
    rename: dict[str, str] = {}
    for o in originals:
        if _IDENT.match(o) and not _reserved(o):
            keep[o] = o
        else:
            rename[o] = snake_case(o)
    out = dict(keep)
    out.update(_dedupe(rename, [*taken, *keep.values()]))
    return out


def clean_text(text: str, limit: int, *, one_line: bool) -> str:
    """Control characters removed (newlines too when ``one_line``), whitespace runs squeezed,
    at most ``limit`` UTF-8 bytes (cut on a character boundary with ``...``).

    Args:
        text: upstream text.
        limit: the bound in UTF-8 bytes.
        one_line: whether newlines and tabs become spaces too.

    Returns:
        The cleaned text, stripped.
    """
    allowed = "" if one_line else "\n\t"
    cleaned = "".join(ch if ch.isprintable() or ch in allowed else " " for ch in text)
    cleaned = re.sub(r"[ \t]+", " ", cleaned) if one_line else re.sub(r"\n{3,}", "\n\n", cleaned)
    cleaned = "\n".join(line.rstrip() for line in cleaned.split("\n")).strip()
    data = cleaned.encode("utf-8")
    if len(data) <= limit:
        return cleaned
    return data[: limit - 3].decode("utf-8", errors="ignore").rstrip() + "..."


def summary_of(description: str | None, fallback: str) -> str:
    """The first sentence or line of ``description`` (or ``fallback``), one line, ≤ 200 bytes.

    Args:
        description: the upstream's description, if any.
        fallback: the text used when it gives nothing (usually the upstream name).

    Returns:
        The summary (``Upstream operation.`` when both are empty).
    """
    text = (description or "").strip()
    first = re.split(r"(?<=[.!?])\s|\n", text, maxsplit=1)[0] if text else ""
    out = clean_text(first, MAX_SUMMARY, one_line=True)
    return out or clean_text(fallback, MAX_SUMMARY, one_line=True) or "Upstream operation."


def description_of(*parts: str | None) -> str | None:
    """Non-empty parts joined by blank lines, bounded to the description limit.

    Args:
        parts: upstream texts (``None`` and blank ones skipped).

    Returns:
        The description, or None when nothing is left.
    """
    text = "\n\n".join(p.strip() for p in parts if p and p.strip())
    return clean_text(text, MAX_DESCRIPTION_BYTES, one_line=False) or None


def search_terms_of(*terms: str | None) -> list[str]:
    """Distinct non-blank terms, one line each, within the search-term count and byte limits.

    Args:
        terms: candidate terms (each cut to 128 bytes; ``None`` and blank ones skipped).

    Returns:
        The terms kept, in order.
    """
    out: list[str] = []
    total = 0
    for term in terms:
        cleaned = clean_text(term or "", 128, one_line=True)
        size = len(cleaned.encode("utf-8"))
        if not cleaned or cleaned in out or total + size > MAX_SEARCH_TERM_BYTES:
            continue
        out.append(cleaned)
        total += size
        if len(out) == MAX_SEARCH_TERMS:
            break
    return out


def answer_problem(cap: Capability, bounds: AnswerBounds) -> str | None:
    """Why ``cap`` would be refused for the size of its answers, or None (also when it has other
    problems: the builder names those).

    Args:
        cap: a converted capability.
        bounds: the configured answer bounds.

    Returns:
        The reason, or None.
    """
    compiled, problems = validate_catalog([cap], [])
    if problems or not compiled:
        return None
    (one,) = compiled
    if bounds.search_overflows(one):
        return "its search_api result would not fit max_search_response_bytes"
    size = bounds.describe_overflow(one)
    if size is not None:
        return f"its describe_api answer would be {size:,} bytes, over max_describe_response_bytes"
    return None


@dataclass
class SkipReport:
    """Tools/operations left out of one upstream, each with its reason.

    Attributes:
        upstream: the upstream's configured name.
        on_unsupported: ``skip`` (log the reasons) or ``fail`` (raise them) at :meth:`finish`.
        converted: names of the items that became capabilities.
        skipped: ``(item, reason)`` of each item left out.
        omitted: ``(item, reason)`` of each output field left out of a converted item.
    """

    upstream: str
    on_unsupported: OnUnsupported = "skip"
    converted: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    omitted: list[tuple[str, str]] = field(default_factory=list)

    def skip(self, item: str, reason: str) -> None:
        """An item left out (its schema cannot be represented, or it is listed inconsistently).

        Args:
            item: the tool or operation name.
            reason: why.
        """
        self.skipped.append((item, reason))

    def omit(self, item: str, reason: str) -> None:
        """An output field left out of a converted item (its type cannot be represented).

        Args:
            item: the tool or operation name.
            reason: which field, and why.
        """
        self.omitted.append((item, reason))

    def finish(self) -> None:
        """Log what became capabilities (one line at start: ``upstream 'memory': 9 of 9 items ->
        9 capabilities``), and log (``skip``) or raise (``fail``) the collected reasons (at most
        :data:`MAX_LOGGED_SKIPS` of them shown).

        Raises:
            UpstreamBuildError: items were skipped and ``on_unsupported`` is ``fail``.
        """
        total = len(self.converted) + len(self.skipped)
        log.info(
            "upstream %r: %d of %d item(s) -> %d capabilit%s%s",
            self.upstream,
            len(self.converted),
            total,
            len(self.converted),
            "y" if len(self.converted) == 1 else "ies",
            f" ({len(self.skipped)} skipped, reasons below)" if self.skipped else "",
        )
        if self.omitted:
            log.info(
                "upstream %r: %d output field(s) left out of converted items:\n%s",
                self.upstream,
                len(self.omitted),
                "\n".join(f"- {item}: {reason}" for item, reason in self.omitted),
            )
        if not self.skipped:
            return
        shown = self.skipped[:MAX_LOGGED_SKIPS]
        logged = "\n".join(f"- {item}: {reason}" for item, reason in shown)
        if len(self.skipped) > len(shown):
            logged += f"\n- ... and {len(self.skipped) - len(shown)} more (SkipReport.skipped has them all)"
        if self.on_unsupported == "fail":
            raise UpstreamBuildError(
                f"upstream {self.upstream!r}: {len(self.skipped)} tool(s) cannot be represented "
                f'(on_unsupported = "fail"):\n{logged}'
            )
        log.warning(
            "upstream %r: skipped %d of %d tool(s) that cannot be represented:\n%s",
            self.upstream,
            len(self.skipped),
            len(self.skipped) + len(self.converted),
            logged,
        )


def compile_each(
    items: Iterable[T],
    key: Callable[[T], str],
    build: Callable[[T, list[Unsupported]], Capability],
    report: SkipReport,
    bounds: AnswerBounds | None = None,
) -> list[Capability]:
    """The compile loop of an upstream pack (MCP tools, OpenAPI operations), in the order given:
    ``build`` makes each item's capability, appending each output field it leaves out to its
    second argument; an item whose build raises :class:`~codemode.packs.jsonschema.Unsupported`
    is skipped with that reason, and one whose answers would not fit ``bounds``
    (:func:`answer_problem`) is skipped too, never cut (a cut signature would lie). Then the report
    is finished.

    Args:
        items: the upstream's items, in the order their capabilities are listed.
        key: an item's name in the report (the tool name, the operationId or ``METHOD /path``).
        build: ``(item, omissions) -> Capability``.
        report: the upstream's report.
        bounds: the server's answer bounds (default: the default bounds).

    Returns:
        The capabilities.

    Raises:
        UpstreamBuildError: items were skipped and the report's ``on_unsupported`` is ``fail``.
    """
    caps: list[Capability] = []
    for item in items:
        name = key(item)
        omissions: list[Unsupported] = []
        try:
            cap = build(item, omissions)
        except Unsupported as exc:
            report.skip(name, str(exc))
            continue
        for omission in omissions:
            report.omit(name, str(omission))
        too_large = answer_problem(cap, bounds or AnswerBounds())
        if too_large is not None:
            report.skip(name, too_large)
            continue
        caps.append(cap)
        report.converted.append(name)
    report.finish()
    return caps
