"""A conservative lexical scanner for Rego policy source (no regopy import).

It exists because regopy offers no switch to disable builtins. The scanner tokenizes the source the way
the Rego lexer does (``"..."`` strings with escapes, raw `` `...` `` strings, ``$"..."`` / `` $`...` ``
template strings whose ``{...}`` parts are code, ``#`` comments to the end of the line), so that a
forbidden name inside a string or a comment is ignored while any *reference* to it is found, wherever
it appears: a call, a bare reference, ``time["now_ns"]`` bracket syntax, a reference split by
whitespace, newlines or comments (``time . now_ns``), or code inside a template string.

When the source is ambiguous (a control character, a non-ASCII character outside strings and comments,
an unterminated string, an escape the Rego lexer would read differently) the scanner refuses it rather
than guess: a policy it cannot read exactly is not accepted.

The same token stream also drives the Rego v1 syntax checks (rule bodies need ``if``; a bare reference
is not a rule) and collects rule names, import aliases and METADATA comment blocks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "ALLOWED_TIME_BUILTINS",
    "FORBIDDEN_BUILTINS",
    "FORBIDDEN_NAMESPACES",
    "Ref",
    "ScanError",
    "Token",
    "check_modules",
    "defined_rules",
    "forbidden_reason",
    "module_body",
    "parse_decision",
    "tokenize",
]


# -- the forbidden list --------------------------------------------------------------------------------

#: Every builtin under these roots is rejected (``net.cidr_contains``, ``rand.intn``, ``uuid.parse``, …).
FORBIDDEN_NAMESPACES: Mapping[str, str] = {
    "http": "makes network requests",
    "net": "the net namespace performs network lookups (all of it is rejected)",
    "rand": "is nondeterministic",
    "uuid": "the uuid namespace generates random values (all of it is rejected)",
    "opa": "exposes the process (opa.runtime returns the environment variables)",
    "time": "reads the clock or the host's timezone database",
}

#: Pure ``time`` builtins: their result depends only on their arguments.
ALLOWED_TIME_BUILTINS: frozenset[str] = frozenset({"time.parse_duration_ns", "time.parse_rfc3339_ns"})

#: Individually forbidden builtins (outside the forbidden namespaces).
FORBIDDEN_BUILTINS: Mapping[str, str] = {
    "print": "writes output outside the policy",
    "internal.print": "writes output outside the policy",
    "trace": "writes output outside the policy",
    "io.jwt.decode_verify": "reads the clock (token expiry is checked against the current time)",
    "io.jwt.encode_sign": "can be nondeterministic (randomized signature algorithms)",
    "io.jwt.encode_sign_raw": "can be nondeterministic (randomized signature algorithms)",
    "crypto.x509.parse_and_verify_certificates": "reads the clock (certificate validity period)",
    "crypto.x509.parse_and_verify_certificates_with_options": "reads the clock (certificate validity period)",
    "json.match_schema": "may load remote $ref schemas",
    "json.verify_schema": "may load remote $ref schemas",
}


def forbidden_reason(name: str) -> str | None:
    """Why the builtin (or reference) ``name`` is forbidden, or None if it is not.

    ``name`` is a dotted reference such as ``time.now_ns``. A bare namespace root (``time``, ``http``)
    is forbidden too: it can only be a reference into the namespace (or a variable shadowing it, which
    is refused to stay unambiguous).
    """
    reason = FORBIDDEN_BUILTINS.get(name)
    if reason is not None:
        return reason
    root = name.split(".", 1)[0]
    reason = FORBIDDEN_NAMESPACES.get(root)
    if reason is None:
        return None
    if name in ALLOWED_TIME_BUILTINS:
        return None
    return reason


# -- tokens ----------------------------------------------------------------------------------------------


class ScanError(ValueError):
    """The source cannot be accepted; ``str()`` names the file, line and column."""

    def __init__(self, message: str, filename: str = "", line: int = 0, col: int = 0) -> None:
        where = f"{filename}:{line}:{col}: " if filename and line else (f"{filename}: " if filename else "")
        super().__init__(where + message)
        self.filename = filename
        self.line = line
        self.col = col
        self.reason = message


IDENT = "ident"
NUMBER = "number"
STRING = "string"  # "..." and `...`; ``value`` is the decoded text
TEMPLATE = "template"  # $"..." and $`...`; the code inside is emitted as separate tokens
PUNCT = "punct"

KEYWORDS: frozenset[str] = frozenset(
    {
        "package",
        "import",
        "as",
        "default",
        "else",
        "if",
        "contains",
        "in",
        "every",
        "some",
        "not",
        "with",
        "true",
        "false",
        "null",
    }
)

# Tokens after which a `{` at the top level opens a term (object/set), never a rule body.
_TERM_CONTEXT: frozenset[str] = frozenset(
    {
        ":=",
        "=",
        "==",
        "!=",
        "<",
        ">",
        "<=",
        ">=",
        "+",
        "-",
        "*",
        "/",
        "%",
        "&",
        "|",
        ",",
        ";",
        ":",
        "if",
        "contains",
        "in",
        "not",
        "with",
        "as",
    }
)

_TWO_CHAR = (":=", "==", "!=", "<=", ">=")
_ONE_CHAR = frozenset(".,;:[](){}=<>+-*/%&|!")
_IDENT_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT_CHAR = _IDENT_START | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_NUMBER_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    value: str  # identifier/punctuation text, decoded string value, number text
    line: int
    col: int
    line_start: bool  # first token on its source line


@dataclass(frozen=True, slots=True)
class Comment:
    line: int
    text: str  # without the leading '#'


@dataclass(slots=True)
class _Lexer:
    src: str
    filename: str
    pos: int = 0
    line: int = 1
    line_pos: int = 0  # offset of the current line's first character
    last_line: int = 0  # line of the last emitted token
    tokens: list[Token] = field(default_factory=list)
    comments: list[Comment] = field(default_factory=list)

    def error(self, message: str, pos: int | None = None) -> ScanError:
        p = self.pos if pos is None else pos
        line = self.src.count("\n", 0, p) + 1
        col = p - (self.src.rfind("\n", 0, p) + 1) + 1
        return ScanError(message, self.filename, line, col)

    def emit(self, kind: str, value: str, start: int) -> None:
        line = self.src.count("\n", 0, start) + 1
        col = start - (self.src.rfind("\n", 0, start) + 1) + 1
        self.tokens.append(Token(kind, value, line, col, line != self.last_line))
        self.last_line = line

    # The main loop. ``stop_at_brace`` lexes the code of a template-string expression and returns at
    # the `}` that closes it.
    def run(self, stop_at_brace: bool = False) -> None:
        src = self.src
        n = len(src)
        depth = 0
        while self.pos < n:
            c = src[self.pos]
            if c in " \t\n\r":
                self.pos += 1
                continue
            if c == "#":
                end = self.pos + 1
                while end < n and src[end] not in "\n\r":
                    end += 1
                line = src.count("\n", 0, self.pos) + 1
                self.comments.append(Comment(line, src[self.pos + 1 : end]))
                self.pos = end
                continue
            start = self.pos
            if c in _IDENT_START:
                end = start + 1
                while end < n and src[end] in _IDENT_CHAR:
                    end += 1
                self.pos = end
                self.emit(IDENT, src[start:end], start)
                continue
            if c in _DIGITS:
                m = _NUMBER_RE.match(src, start)
                assert m is not None
                self.pos = m.end()
                self.emit(NUMBER, m.group(0), start)
                continue
            if c == '"':
                self.emit(STRING, self.string(), start)
                continue
            if c == "`":
                self.emit(STRING, self.raw_string(), start)
                continue
            if c == "$":
                nxt = src[start + 1] if start + 1 < n else ""
                if nxt not in ('"', "`"):
                    raise self.error("unexpected '$' outside a template string")
                self.emit(TEMPLATE, "", start)
                self.template(raw=nxt == "`")
                continue
            two = src[start : start + 2]
            if two in _TWO_CHAR:
                self.pos += 2
                self.emit(PUNCT, two, start)
                continue
            if c in _ONE_CHAR:
                if stop_at_brace:
                    if c == "{":
                        depth += 1
                    elif c == "}":
                        if depth == 0:
                            return  # the caller consumes the closing brace
                        depth -= 1
                self.pos += 1
                self.emit(PUNCT, c, start)
                continue
            if ord(c) > 127:
                raise self.error(f"non-ASCII character {c!r} outside strings and comments")
            raise self.error(f"unexpected character {c!r}")
        if stop_at_brace:
            raise self.error("unterminated template string expression")

    def string(self) -> str:
        """A ``"..."`` string: JSON escapes; no raw newline. Returns the decoded value."""
        src = self.src
        start = self.pos
        i = start + 1
        n = len(src)
        while i < n:
            c = src[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                break
            if c in "\n\r":
                raise self.error("unterminated string", start)
            i += 1
        else:
            raise self.error("unterminated string", start)
        text = src[start : i + 1]
        self.pos = i + 1
        try:
            value = json.loads(text, strict=False)  # a literal tab inside a string is fine
        except ValueError:
            raise self.error(
                "string with an escape sequence the scanner cannot read exactly", start
            ) from None
        assert isinstance(value, str)
        return value

    def raw_string(self) -> str:
        src = self.src
        start = self.pos
        end = src.find("`", start + 1)
        if end < 0:
            raise self.error("unterminated raw string", start)
        self.pos = end + 1
        return src[start + 1 : end]

    def template(self, raw: bool) -> None:
        """``$"..."`` or `` $`...` ``: literal text with ``{expr}`` parts that are code.

        The code is lexed with the normal rules and emitted between synthetic ``(`` ``)`` tokens, so
        every reference inside it is checked. In ``$"..."`` a backslash escapes the next character
        (``\\{`` is a literal brace). In `` $`...` `` a backslash directly before ``{`` is refused: it is
        the one place where two plausible readings differ.
        """
        src = self.src
        start = self.pos
        quote = "`" if raw else '"'
        i = start + 2
        n = len(src)
        while True:
            if i >= n:
                raise self.error("unterminated template string", start)
            c = src[i]
            if c == quote:
                self.pos = i + 1
                return
            if not raw and c in "\n\r":
                raise self.error("unterminated template string", start)
            if c == "\\":
                if raw:
                    if i + 1 < n and src[i + 1] == "{":
                        raise self.error("'\\{' in a raw template string is ambiguous", i)
                    i += 1
                    continue
                i += 2
                continue
            if c == "{":
                self.emit(PUNCT, "(", i)
                self.pos = i + 1
                self.run(stop_at_brace=True)
                # self.pos is at the closing brace
                self.emit(PUNCT, ")", self.pos)
                i = self.pos + 1
                continue
            i += 1


_DISALLOWED_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x85\u2028\u2029]")


def tokenize(source: str, filename: str = "") -> tuple[list[Token], list[Comment]]:
    """Tokens and comments of ``source``; raises :class:`ScanError` on anything ambiguous."""
    m = _DISALLOWED_CONTROL.search(source)
    if m is not None:
        lexer = _Lexer(source, filename)
        raise lexer.error(f"disallowed control character {m.group(0)!r}", m.start())
    lexer = _Lexer(source, filename)
    lexer.run()
    return lexer.tokens, lexer.comments


# -- references ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference that starts with an identifier: ``a.b["c"]`` → segments ``("a", "b", "c")``.

    Segments stop at the first bracket that does not hold a string literal (a variable, a number, …).
    ``dynamic`` is True when the reference continues past that point with a bracket.
    """

    segments: tuple[str, ...]
    start: int  # token index of the first identifier
    end: int  # token index just after the last consumed token
    is_call: bool  # directly followed by "("
    dynamic: bool

    @property
    def name(self) -> str:
        return ".".join(self.segments)


def _is(tok: Token | None, kind: str, value: str | None = None) -> bool:
    return tok is not None and tok.kind == kind and (value is None or tok.value == value)


def _at(tokens: Sequence[Token], i: int) -> Token | None:
    return tokens[i] if 0 <= i < len(tokens) else None


def read_ref(tokens: Sequence[Token], i: int) -> Ref:
    segments = [tokens[i].value]
    j = i + 1
    dynamic = False
    while True:
        t = _at(tokens, j)
        if _is(t, PUNCT, ".") and _is(_at(tokens, j + 1), IDENT):
            segments.append(tokens[j + 1].value)
            j += 2
            continue
        if _is(t, PUNCT, "["):
            inner = _at(tokens, j + 1)
            if _is(inner, STRING) and _is(_at(tokens, j + 2), PUNCT, "]"):
                assert inner is not None
                segments.append(inner.value)
                j += 3
                continue
            dynamic = True
        break
    return Ref(tuple(segments), i, j, _is(_at(tokens, j), PUNCT, "("), dynamic)


def refs(tokens: Sequence[Token]) -> Iterable[Ref]:
    """Every reference that starts with an identifier (not a keyword) and is not itself a segment of
    an enclosing reference (``x.y``: ``y`` is not reported separately)."""
    for i, tok in enumerate(tokens):
        if tok.kind != IDENT or tok.value in KEYWORDS:
            continue
        if _is(_at(tokens, i - 1), PUNCT, "."):
            continue
        yield read_ref(tokens, i)


# -- per-module structure ----------------------------------------------------------------------------------


@dataclass(slots=True)
class ModuleInfo:
    filename: str
    tokens: list[Token]
    comments: list[Comment]
    package: str = ""
    package_end: int = 0  # token index after the package statement
    aliases: set[str] = field(default_factory=set)  # names bound by imports
    heads: set[str] = field(default_factory=set)  # dotted rule/function names defined at top level


def _line_end(tokens: Sequence[Token], i: int) -> int:
    """Index of the first token after ``i`` that starts a new line."""
    j = i + 1
    while j < len(tokens) and not tokens[j].line_start:
        j += 1
    return j


def _structure(info: ModuleInfo) -> None:
    tokens = info.tokens
    if not tokens or not _is(tokens[0], IDENT, "package"):
        where = (tokens[0].line, tokens[0].col) if tokens else (1, 1)
        raise ScanError("a module must start with a package declaration", info.filename, *where)
    end = _line_end(tokens, 0)
    pkg = tokens[1:end]
    ref_ok = bool(pkg) and pkg[0].kind == IDENT
    if ref_ok:
        ref = read_ref(pkg, 0)
        ref_ok = ref.end == len(pkg) and not ref.dynamic
        info.package = ref.name
    if not ref_ok:
        raise ScanError("package must be a plain reference", info.filename, tokens[0].line, tokens[0].col)
    info.package_end = end

    for i in _statement_starts(tokens, end):
        tok = tokens[i]
        if tok.kind != IDENT:
            continue
        if tok.value == "import":
            stop = _line_end(tokens, i)
            stmt = tokens[i + 1 : stop]
            if stmt and stmt[0].kind == IDENT:
                ref = read_ref(stmt, 0)
                alias = ref.segments[-1]
                if _is(_at(stmt, ref.end), IDENT, "as") and _is(_at(stmt, ref.end + 1), IDENT):
                    alias = stmt[ref.end + 1].value
                info.aliases.add(alias)
            continue
        j = i + 1 if tok.value == "default" else i
        head = _at(tokens, j)
        if head is not None and head.kind == IDENT and head.value not in KEYWORDS:
            info.heads.add(read_ref(tokens, j).name)


# -- checks --------------------------------------------------------------------------------------------------

_REF_RE = re.compile(r"""\$ref["']?\s*:\s*["']?([^"'\s,}\]]*)""")


def _check_metadata(info: ModuleInfo) -> None:
    """Reject ``$ref`` schema references in METADATA blocks unless they are local (``#/...``)."""
    comments = info.comments
    i = 0
    while i < len(comments):
        j = i + 1
        while j < len(comments) and comments[j].line == comments[j - 1].line + 1:
            j += 1
        block = comments[i:j]
        if block[0].text.strip() == "METADATA":
            for c in block[1:]:
                if "$ref" not in c.text:
                    continue
                for m in _REF_RE.finditer(c.text):
                    if not m.group(1).startswith("#"):
                        raise ScanError(
                            f"METADATA $ref to a remote schema ({m.group(1)!r}) is not allowed",
                            info.filename,
                            c.line,
                            c.text.find("$ref") + 2,
                        )
                if not _REF_RE.search(c.text):
                    raise ScanError(
                        "METADATA $ref that cannot be read is not allowed", info.filename, c.line, 1
                    )
        i = j


def _check_references(info: ModuleInfo, is_builtin: Callable[[str], bool], heads: set[str]) -> None:
    tokens = info.tokens
    for ref in refs(tokens):
        if ref.start < info.package_end:
            continue  # the package path lives under data. and names no builtin
        tok = tokens[ref.start]
        name = ref.name
        root = ref.segments[0]
        # Any reference to a forbidden name, called or not (``with f as time.now_ns`` is a reference),
        # and anything below a forbidden name (``trace.x``).
        reason = forbidden_reason(name)
        for k in range(1, len(ref.segments)):
            reason = reason or FORBIDDEN_BUILTINS.get(".".join(ref.segments[:k]))
        if reason is not None:
            raise ScanError(f"forbidden builtin {name}: {reason}", info.filename, tok.line, tok.col)
        if ref.dynamic and root in FORBIDDEN_NAMESPACES:
            raise ScanError(
                f"dynamic reference into the forbidden namespace {root}", info.filename, tok.line, tok.col
            )
        if not ref.is_call:
            continue
        if root in ("data", "input") or root in info.aliases:
            continue  # a user-defined function by path (an unknown one fails at evaluation, closed)
        if name in heads:
            continue  # a function defined in this package
        if ref.dynamic or not is_builtin(name):
            raise ScanError(
                f"unknown builtin {name}: not provided by the evaluator and not defined by the policy",
                info.filename,
                tok.line,
                tok.col,
            )


def _check_v1(info: ModuleInfo) -> None:
    """The Rego v1 rule forms rego-cpp would otherwise accept in their v0 reading.

    - a rule body needs ``if`` (v1: "`if` keyword is required before rule body"), including ``else``;
    - a bare reference is not a rule (v1: "`contains` keyword is required for partial set rules");
    - rules and variables may not be named ``input`` or ``data``.
    """
    tokens = info.tokens
    for i in _statement_starts(tokens, info.package_end):
        tok = tokens[i]
        if tok.kind != IDENT or tok.value in ("import", "else"):
            continue
        j = i + 1 if tok.value == "default" else i
        head = _at(tokens, j)
        if head is None or head.kind != IDENT:
            continue
        if head.value in ("input", "data"):
            raise ScanError(f"a rule cannot be named {head.value}", info.filename, head.line, head.col)
        if head.value in KEYWORDS:
            continue
        end, plain = _ref_extent(tokens, j)
        nxt = _at(tokens, end)
        bare = nxt is None or (nxt.line_start and nxt.value not in _HEAD_CONTINUATIONS)
        if bare and not plain:
            raise ScanError(
                "`contains` keyword is required for partial set rules (Rego v1)",
                info.filename,
                head.line,
                head.col,
            )

    depth = 0
    last_top_brace_was_body = False
    pending_every = 0
    for i in range(info.package_end, len(tokens)):
        tok = tokens[i]
        prev = _at(tokens, i - 1)
        if tok.kind == IDENT and tok.value in ("input", "data") and _is(_at(tokens, i + 1), PUNCT, ":="):
            raise ScanError(f"a variable cannot be named {tok.value}", info.filename, tok.line, tok.col)
        if depth == 0 and _is(tok, IDENT, "every"):
            pending_every += 1
        if tok.kind == PUNCT and tok.value in "([{":
            if depth == 0 and tok.value == "{":
                if prev is not None and prev.kind in (PUNCT, IDENT) and prev.value in _TERM_CONTEXT:
                    is_body = prev.value == "if"
                elif pending_every > 0:
                    pending_every -= 1  # the body of `every x in xs { ... }`
                    is_body = False
                elif _is(prev, PUNCT, "}") and last_top_brace_was_body:
                    is_body = True  # a further body after `if { ... }`
                else:
                    raise ScanError(
                        "`if` keyword is required before rule body (Rego v1)",
                        info.filename,
                        tok.line,
                        tok.col,
                    )
                last_top_brace_was_body = is_body
            depth += 1
        elif tok.kind == PUNCT and tok.value in ")]}":
            depth -= 1


def _check_every(info: ModuleInfo) -> None:
    """``not`` inside the body of ``every`` is refused: regopy 1.5.2 (rego-cpp) evaluates such an
    ``every`` as true whatever the input, so a policy written that way would allow every call.
    Measured: ``every x in xs { not x == 2 }`` is true for ``xs = [1, 2]``, also through a helper
    rule (``not bad(x)``)."""
    tokens = info.tokens
    for i, tok in enumerate(tokens):
        if not _is(tok, IDENT, "every") or _is(_at(tokens, i - 1), PUNCT, "."):
            continue
        j, depth = i + 1, 0
        while j < len(tokens) and not (depth == 0 and _is(tokens[j], PUNCT, "{")):
            if tokens[j].kind == PUNCT and tokens[j].value in "([":
                depth += 1
            elif tokens[j].kind == PUNCT and tokens[j].value in ")]":
                depth -= 1
            j += 1
        depth = 0
        for k in range(j, len(tokens)):
            t = tokens[k]
            if t.kind == PUNCT and t.value in "([{":
                depth += 1
            elif t.kind == PUNCT and t.value in ")]}":
                depth -= 1
                if depth == 0:
                    break
            elif _is(t, IDENT, "not") and not _is(_at(tokens, k - 1), PUNCT, "."):
                raise ScanError(
                    "`not` inside `every` is refused: this Rego engine evaluates it as true for every "
                    "input; write `count([x | some x in xs; cond(x)]) == 0` instead",
                    info.filename,
                    t.line,
                    t.col,
                )


_HEAD_CONTINUATIONS = frozenset({"if", ":=", "=", "contains", "{", "else", "(", "[", "."})


def _ref_extent(tokens: Sequence[Token], i: int) -> tuple[int, bool]:
    """End of the reference starting at identifier ``i`` (``.name`` and balanced ``[...]`` parts), and
    whether it is a single plain name."""
    j = i + 1
    while True:
        if _is(_at(tokens, j), PUNCT, ".") and _is(_at(tokens, j + 1), IDENT):
            j += 2
            continue
        if _is(_at(tokens, j), PUNCT, "["):
            depth = 0
            while j < len(tokens):
                t = tokens[j]
                if t.kind == PUNCT and t.value in "([{":
                    depth += 1
                elif t.kind == PUNCT and t.value in ")]}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            j += 1
            continue
        return j, j == i + 1


def _continues(tok: Token | None) -> bool:
    """Whether a statement goes on after ``tok`` (so the next line is not a new rule)."""
    if tok is None or tok.kind not in (PUNCT, IDENT):
        return False
    return tok.value in _TERM_CONTEXT or tok.value in ("else", "(", "[", "{", ".", "default")


def _statement_starts(tokens: Sequence[Token], start: int) -> Iterable[int]:
    """Indices of the tokens that begin a top-level statement (a rule or an import): the first token on
    a line, outside any bracket, when the previous line did not leave the statement open."""
    depth = 0
    for i in range(start, len(tokens)):
        tok = tokens[i]
        if depth == 0 and tok.line_start and not _continues(_at(tokens, i - 1)):
            yield i
        if tok.kind == PUNCT and tok.value in "([{":
            depth += 1
        elif tok.kind == PUNCT and tok.value in ")]}":
            depth -= 1


def module_body(source: str, filename: str) -> list[Token]:
    """The module's tokens after its package statement; raises :class:`ScanError` like the scan."""
    info = ModuleInfo(filename, *tokenize(source, filename))
    _structure(info)
    return info.tokens[info.package_end :]


def defined_rules(modules: Mapping[str, str]) -> dict[str, set[str]]:
    """The rules the modules define at top level, by package (``{"codemode.records": {"allow"}}``);
    raises :class:`ScanError` for a module without a package."""
    out: dict[str, set[str]] = {}
    for filename, source in modules.items():
        info = ModuleInfo(filename, *tokenize(source, filename))
        _structure(info)
        out.setdefault(info.package, set()).update(info.heads)
    return out


def check_modules(modules: Mapping[str, str], is_builtin: Callable[[str], bool]) -> None:
    """Scan every module; raise :class:`ScanError` for the first problem found."""
    infos: list[ModuleInfo] = []
    for filename, source in modules.items():
        tokens, comments = tokenize(source, filename)
        info = ModuleInfo(filename, tokens, comments)
        _structure(info)
        infos.append(info)
    heads_by_package: dict[str, set[str]] = {}
    for info in infos:
        heads_by_package.setdefault(info.package, set()).update(info.heads)
    for info in infos:
        _check_metadata(info)
        _check_references(info, is_builtin, heads_by_package[info.package])
        _check_v1(info)
        _check_every(info)


# -- the decision ---------------------------------------------------------------------------------

_SEGMENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_decision(decision: str) -> tuple[str | int, ...]:
    """``data.app.allow`` / ``data.app["allow"]`` → ``("app", "allow")``.

    The decision must be exactly one ground reference into ``data`` with at least one segment: dotted
    identifiers, or brackets holding a string or a non-negative integer literal. Anything else
    (variables, ``with``, operators, comments, other roots) is refused.
    """
    if not isinstance(decision, str):
        raise ScanError("decision must be a string")
    try:
        tokens, comments = tokenize(decision)
    except ScanError as exc:
        raise ScanError(f"decision {decision!r} is not a reference: {exc.reason}") from None
    if comments:
        raise ScanError(f"decision {decision!r} must not contain a comment")
    if not tokens or not _is(tokens[0], IDENT, "data"):
        raise ScanError(f"decision {decision!r} must be a reference into data (data.<package>.<rule>)")
    segments: list[str | int] = []
    i = 1
    while i < len(tokens):
        t = tokens[i]
        if _is(t, PUNCT, ".") and _is(_at(tokens, i + 1), IDENT):
            segments.append(tokens[i + 1].value)
            i += 2
            continue
        if _is(t, PUNCT, "[") and _is(_at(tokens, i + 2), PUNCT, "]"):
            inner = tokens[i + 1]
            if inner.kind == STRING:
                segments.append(inner.value)
                i += 3
                continue
            if inner.kind == NUMBER and inner.value.isdigit():
                segments.append(int(inner.value))
                i += 3
                continue
        raise ScanError(
            f"decision {decision!r} must be one ground reference (no variables, no with, no operators)"
        )
    if not segments:
        raise ScanError(f"decision {decision!r} must name a document under data, e.g. data.app.allow")
    return tuple(segments)


def is_identifier(segment: str | int) -> bool:
    return isinstance(segment, str) and bool(_SEGMENT_RE.match(segment)) and segment not in KEYWORDS
