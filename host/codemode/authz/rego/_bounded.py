"""Which policies may be evaluated on the event loop's thread: a conservative lexical allow-list.

Part of :mod:`codemode.authz.rego`. rego-cpp cannot be interrupted, so an evaluation may run on
the loop's thread only if its time is bounded whatever the input. A policy is *bounded* here when
nothing in it can iterate or do more than linear work on a value: no ``some``, ``every``, ``with``,
comprehensions, set operators, template strings, user functions, imports other than ``rego.v1`` and
``future.keywords``, no reference with a computed part (``input.xs[_]``, ``input.xs[i]``,
``input.xs[0]``), no reference inside an array, set or object literal (``[r, r]`` of such a rule
doubles a value per rule), no ``*`` or ``/`` (a product of products doubles a number's digits per
rule), and calls only to the linear-time builtins in :data:`LINEAR_BUILTINS`. Each rule body then
runs once per decision (rego-cpp evaluates a rule once per query), and its work is linear in the
input (the caller also caps the input: :func:`small_input`). Anything the list does not name
makes the policy unbounded: being wrong that way costs speed (the decision goes to an evaluation
thread), never the loop.

The forms bound the work per rule, not the number of rules: a bounded policy's cost is measured at
construction (:mod:`codemode.authz.rego._calibrate`, on inputs built from :func:`input_paths`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ._scan import (
    IDENT,
    KEYWORDS,
    PUNCT,
    STRING,
    TEMPLATE,
    Token,
    module_body,
    refs,
)

__all__ = [
    "LINEAR_BUILTINS",
    "MAX_INLINE_CHARS",
    "MAX_INLINE_DEPTH",
    "MAX_INLINE_VALUES",
    "input_paths",
    "small_input",
    "unbounded_reason",
]

#: Builtins whose time is at most linear in their arguments (and whose result is no larger).
#: ``indexof`` is not one: rego-cpp's search is quadratic (two 4,096-character inputs: ~1 ms).
LINEAR_BUILTINS: Final = frozenset(
    {
        "abs",
        "contains",
        "count",
        "endswith",
        "is_array",
        "is_boolean",
        "is_null",
        "is_number",
        "is_object",
        "is_set",
        "is_string",
        "lower",
        "max",
        "min",
        "object.get",
        "startswith",
        "sum",
        "trim_space",
        "type_name",
        "upper",
    }
)

#: Keywords that neither iterate nor rebind the input.
_KEYWORDS_OK: Final = frozenset({"default", "else", "if", "contains", "in", "not", "true", "false", "null"})
#: Punctuation that forms references, literals, rule bodies, comparisons, sums and differences
#: (``|`` and ``&``, comprehensions and set operations, and ``*``, ``/``, ``%`` are left out).
_PUNCT_OK: Final = frozenset(
    {".", ",", ";", ":", "[", "]", "(", ")", "{", "}", "=", ":=", "==", "!=", "<", "<=", ">", ">=", "+", "-"}
)
_IMPORTS_OK: Final = ("rego.v1", "future.keywords")

#: At most this many values (scalars, arrays, objects) in an input evaluated inline.
MAX_INLINE_VALUES: Final = 64
#: At most this many characters of strings (keys included) in an input evaluated inline.
MAX_INLINE_CHARS: Final = 4096
#: At most this many containers around any value of an input evaluated inline (the document is one,
#: its ``arguments`` two): rego-cpp's cost of building a nested input grows with the square of its
#: depth (a chain of 56 objects costs 8-14 times a flat input of as many values; chains at this cap
#: filling the value cap about 2.3 times, about what any objects cost against strings).
MAX_INLINE_DEPTH: Final = 6


def unbounded_reason(modules: Mapping[str, str]) -> str | None:
    """None when every module is bounded (see the module docstring), else why not (for the log).

    Args:
        modules: filename → Rego source, already accepted by ``_scan.check_modules``.

    Returns:
        None, or the first construct that makes the policy unbounded.
    """
    for filename, source in modules.items():
        reason = _module_reason(module_body(source, filename))
        if reason is not None:
            return f"{filename}: {reason}"
    return None


def _module_reason(tokens: list[Token]) -> str | None:
    body = _without_imports(tokens)
    if isinstance(body, str):
        return body
    open_literals: list[bool] = []  # one per open bracket: whether it opened a composite literal
    for i, tok in enumerate(body):
        reason = _token_reason(body, i, tok)
        if reason is None and tok.kind == IDENT and tok.value not in KEYWORDS and any(open_literals):
            # [r, r] of another such rule doubles a value per rule: sizes would grow with the policy.
            reason = "reference inside a composite literal"
        if reason is not None:
            return f"line {tok.line}: {reason}"
        if tok.kind == PUNCT and tok.value in "([{":
            prev = body[i - 1] if i > 0 else None
            open_literals.append(_opens_literal(tok.value, prev))
        elif tok.kind == PUNCT and tok.value in ")]}" and open_literals:
            open_literals.pop()
    for ref in refs(body):
        if ref.dynamic:
            return f"line {body[ref.start].line}: reference with a computed part ({ref.name}[...])"
        if ref.is_call and ref.name not in LINEAR_BUILTINS:
            return f"line {body[ref.start].line}: call to {ref.name}"
    return None


def input_paths(modules: Mapping[str, str]) -> set[tuple[str, ...]]:
    """The static paths under ``input`` that a bounded policy refers to (``input.arguments.key`` →
    ``("arguments", "key")``; a bare ``input`` → ``()``).

    Args:
        modules: filename → Rego source of a policy :func:`unbounded_reason` accepted (so no
            reference to the input has a computed part).

    Returns:
        The paths, without the leading ``input``.
    """
    paths: set[tuple[str, ...]] = set()
    for filename, source in modules.items():
        body = _without_imports(module_body(source, filename))
        if isinstance(body, str):
            continue
        for ref in refs(body):
            if ref.segments[0] == "input" and not ref.is_call:
                paths.add(ref.segments[1:])
    return paths


def _without_imports(tokens: list[Token]) -> list[Token] | str:
    """The tokens without the accepted import statements, or why an import is not accepted."""
    out: list[Token] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.kind == IDENT and tok.value == "import" and tok.line_start:
            j = i + 1
            while j < len(tokens) and not tokens[j].line_start:
                j += 1
            path = []
            for t in tokens[i + 1 : j]:
                if t.kind == IDENT and t.value == "as":
                    break
                if t.kind == IDENT:
                    path.append(t.value)
            name = ".".join(path)
            if not any(name == ok or name.startswith(ok + ".") for ok in _IMPORTS_OK):
                return f"line {tok.line}: import {name}"
            i = j
            continue
        out.append(tok)
        i += 1
    return out


def _token_reason(tokens: list[Token], i: int, tok: Token) -> str | None:
    if tok.kind == TEMPLATE:
        return "template string"
    if tok.kind == IDENT and tok.value in KEYWORDS and tok.value not in _KEYWORDS_OK:
        return f"keyword {tok.value}"
    if tok.kind == PUNCT:
        if tok.value not in _PUNCT_OK:
            return f"operator {tok.value}"
        if tok.value == "[" and i > 0 and _indexes(tokens[i - 1]):
            # An index on a term (``{...}[x]``, ``f(x)[y]``, ``"s"[0]``): only a string key is a lookup.
            closed = i + 2 < len(tokens) and tokens[i + 1].kind == STRING and tokens[i + 2].value == "]"
            if not closed:
                return "index with a computed part"
    return None


def _opens_literal(bracket: str, prev: Token | None) -> bool:
    """Whether ``bracket`` opens an array, set or object literal (not a call, grouping, index or
    rule body)."""
    if bracket == "(" or prev is None:
        return False
    if bracket == "[":
        return not _indexes(prev)
    return not (prev.kind == IDENT and prev.value in ("if", "else"))


def _indexes(prev: Token) -> bool:
    """Whether a ``[`` after ``prev`` indexes a term (rather than opening an array literal)."""
    if prev.kind == PUNCT:
        return prev.value in (")", "]", "}")
    return prev.kind in (IDENT, STRING) and prev.value not in KEYWORDS


def small_input(document: Any, values: int = 0, chars: int = 0, depth: int = 0) -> bool:
    """Whether ``document`` has at most :data:`MAX_INLINE_VALUES` values, :data:`MAX_INLINE_CHARS`
    characters of strings and :data:`MAX_INLINE_DEPTH` containers around any value (stops counting
    as soon as it has more).

    Args:
        document: the input document (plain JSON values), or a part of it.
        values: values already counted (the rest of the document).
        chars: characters already counted.
        depth: containers around ``document`` (0 for the whole document).

    Returns:
        True when it is small enough to evaluate inline.
    """
    stack = [(document, depth)]
    while stack:
        value, level = stack.pop()
        values += 1
        if values > MAX_INLINE_VALUES:
            return False
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, dict | list | tuple):
            if level >= MAX_INLINE_DEPTH and value:
                return False  # its items would be more deeply nested than the cap
            if isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(key, str):
                        chars += len(key)
                    stack.append((item, level + 1))
            else:
                stack.extend((item, level + 1) for item in value)
        if chars > MAX_INLINE_CHARS:
            return False
    return True
