"""The lexical scanner behind RegoAuthorizer's construction checks (codemode.authz.rego._scan)."""

from __future__ import annotations

import pytest

from codemode.authz.rego import InvalidPolicy, RegoAuthorizer
from codemode.authz.rego._scan import (
    IDENT,
    PUNCT,
    STRING,
    ScanError,
    check_modules,
    forbidden_reason,
    parse_decision,
    refs,
    tokenize,
)


def known(name: str) -> bool:
    return name in {"count", "sprintf", "time.parse_rfc3339_ns", "upper", "concat", "startswith"}


def names(source: str) -> list[str]:
    tokens, _ = tokenize(source)
    return [r.name for r in refs(tokens)]


def test_strings_raw_strings_and_comments_hide_names() -> None:
    src = 'x := "http.send(1) \\" print(2)" # time.now_ns()\ny := `opa.runtime() "` z'
    assert names(src) == ["x", "y", "z"]
    tokens, comments = tokenize(src)
    assert [t.value for t in tokens if t.kind == STRING] == ['http.send(1) " print(2)', 'opa.runtime() "']
    assert [c.text for c in comments] == [" time.now_ns()"]


def test_escaped_backslash_ends_string() -> None:
    assert names('x := "a\\\\" + time.now_ns()') == ["x", "time.now_ns"]


def test_unicode_escape_decoded() -> None:
    tokens, _ = tokenize('"\\u0041\\n"')
    assert tokens[0].value == "A\n"


def test_references_across_whitespace_newlines_comments_and_brackets() -> None:
    assert names("a := time . now_ns()") == ["a", "time.now_ns"]
    assert names("a := time\n.now_ns()") == ["a", "time.now_ns"]
    assert names("a := time. # c\n now_ns()") == ["a", "time.now_ns"]
    assert names('a := time["now_ns"]()') == ["a", "time.now_ns"]
    assert names("a := time[`now_ns`]()") == ["a", "time.now_ns"]


def test_reference_stops_at_variable_bracket() -> None:
    tokens, _ = tokenize("a := x[k].y")
    found = list(refs(tokens))
    assert [(r.name, r.dynamic) for r in found] == [("a", False), ("x", True), ("k", False)]


def test_template_string_code_is_scanned() -> None:
    assert names('x := $"hi {input.name} {time.now_ns()}"') == ["x", "input.name", "time.now_ns"]
    assert names('x := $"lit \\{time.now_ns()}"') == ["x"]
    assert names('x := $"{"}"} {a.b}"') == ["x", "a.b"]
    assert names('x := $"{$"{inner.ref}"}"') == ["x", "inner.ref"]
    assert names("x := $`raw {c.d}`") == ["x", "c.d"]


def test_template_expression_is_parenthesized() -> None:
    tokens, _ = tokenize('$"{a}"')
    assert [(t.kind, t.value) for t in tokens[1:]] == [(PUNCT, "("), (IDENT, "a"), (PUNCT, ")")]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ('x := "abc', "unterminated string"),
        ('x := "ab\nc"', "unterminated string"),
        ("x := `abc", "unterminated raw string"),
        ('x := $"abc', "unterminated template"),
        ('x := $"{abc', "unterminated template"),
        ("x := $`a\\{b}`", "ambiguous"),
        ('x := "\\q"', "escape"),
        ("x := $y", "unexpected '\\$'"),
        ("x :=\u00a01", "non-ASCII"),
        ("x := 1\x00", "control"),
        ("x := 1 # c\x0b y := 2", "control"),
        ("x := 1 # \u2028", "control"),
        ("x := 1 @", "unexpected character"),
    ],
)
def test_ambiguous_source_refused(source: str, message: str) -> None:
    with pytest.raises(ScanError, match=message):
        tokenize(source, "f.rego")


def test_error_position() -> None:
    with pytest.raises(ScanError) as info:
        tokenize('package a\nx := "abc', "f.rego")
    assert str(info.value).startswith("f.rego:2:6: ")


def test_comment_ends_at_carriage_return() -> None:
    # rego-cpp does not treat \r as part of a comment; neither does the scanner (it sees more code).
    assert names("# c\rtime.now_ns()") == ["time.now_ns"]


@pytest.mark.parametrize(
    ("name", "forbidden"),
    [
        ("http.send", True),
        ("net.cidr_contains", True),
        ("rand.intn", True),
        ("uuid.rfc4122", True),
        ("opa.runtime", True),
        ("time.now_ns", True),
        ("time.date", True),
        ("time", True),
        ("time.parse_rfc3339_ns", False),
        ("time.parse_duration_ns", False),
        ("print", True),
        ("internal.print", True),
        ("trace", True),
        ("io.jwt.decode_verify", True),
        ("io.jwt.decode", False),
        ("crypto.x509.parse_and_verify_certificates", True),
        ("crypto.x509.parse_certificates", False),
        ("count", False),
        ("input.time", False),
    ],
)
def test_forbidden_reason(name: str, forbidden: bool) -> None:
    assert (forbidden_reason(name) is not None) is forbidden


def check(source: str, **modules: str) -> None:
    check_modules({"main.rego": source, **modules}, known)


def test_check_accepts_builtins_and_user_functions() -> None:
    check(
        "package app\nimport data.lib\nimport data.other.fn as g\n"
        "f(x) := x\nns.h(x) := x\n"
        "allow if { f(1); ns.h(1); lib.k(1); g(1); data.lib.k(1); count([]) == 0 }\n",
        **{"lib.rego": "package lib\nk(x) := x\n"},
    )


def test_check_functions_are_per_package() -> None:
    with pytest.raises(ScanError, match="unknown builtin helper"):
        check("package app\nallow if helper(1)\n", **{"lib.rego": "package lib\nhelper(x) := x\n"})
    check("package app\nallow if helper(1)\n", **{"more.rego": "package app\nhelper(x) := x\n"})


def test_check_continuation_line_is_not_a_rule_head() -> None:
    # `foo.bar` on the continuation line must not count as a defined function.
    with pytest.raises(ScanError, match=r"unknown builtin foo\.bar"):
        check("package app\nallow if\n  foo.bar(1)\n")


def test_check_package_path_is_not_a_reference() -> None:
    check("package time.net.rand\nallow := true\n")


def test_check_requires_package() -> None:
    with pytest.raises(ScanError, match="package"):
        check("allow := true\n")
    with pytest.raises(ScanError, match="package"):
        check("")


@pytest.mark.parametrize(
    "source",
    [
        "allow if { true }",
        "allow if true",
        "allow := true if { true }\nelse := false",
        "allow := {1, 2}",
        'allow contains {"a": 1} if true',
        "default allow := {}",
        "allow if { every x in [1] { x > 0 } }",
        "allow := {x | some x in [1]}",
        "allow if x in {1, 2}",
        "allow if {\n  true\n}",
        "allow := 1 if {\n  true\n} else := 2 if {\n  false\n}",
        "allow[x] := 1 if { some x in [1] }",
        "allow if not {1} == {2}",
        "a.b.c := 1",
        "a.b[c] := 1 if { c := 1 }",
        'allow := $"{ {1} }"',
    ],
)
def test_v1_forms_accepted(source: str) -> None:
    check(f"package app\n{source}\n")


@pytest.mark.parametrize(
    "source",
    [
        "allow { true }",
        "allow[x] { x := 1 }",
        "allow = true { true }",
        "f(x) { true }",
        "allow if { true } else { false }",
        "allow := {} { true }",
        "deny[1]",
        "a.b",
        "a[b]",
    ],
)
def test_v0_forms_refused(source: str) -> None:
    with pytest.raises(ScanError, match="Rego v1"):
        check(f"package app\n{source}\n")


@pytest.mark.parametrize(
    ("decision", "segments"),
    [
        ("data.app.allow", ("app", "allow")),
        ('data.app["allow"]', ("app", "allow")),
        ('data["a b"].c', ("a b", "c")),
        ("data.app.list[0]", ("app", "list", 0)),
        (" data.x ", ("x",)),
    ],
)
def test_parse_decision(decision: str, segments: tuple[str | int, ...]) -> None:
    assert parse_decision(decision) == segments


@pytest.mark.parametrize(
    "decision",
    ["data", "input.x", "data.x[y]", "data.x[-1]", "data.x with input as 1", "data.x.", "data..x", "x.data"],
)
def test_parse_decision_refuses(decision: str) -> None:
    with pytest.raises(ScanError, match="decision"):
        parse_decision(decision)


NOT_IN_EVERY = [
    "package t\nallow if {\n    every x in input.arguments.xs { not x == 2 }\n}\n",
    "package t\nbad(x) if x == 2\nallow if {\n    every x in input.arguments.xs { not bad(x) }\n}\n",
    'package t\nallow if {\n    every k, v in input.arguments.m {\n        k != ""\n'
    "        not v\n    }\n}\n",
    "package t\nallow if {\n    every x in input.arguments.xs { every y in x { not y } }\n}\n",
]


@pytest.mark.parametrize("policy", NOT_IN_EVERY)
def test_not_inside_every_is_refused(policy: str) -> None:
    # regopy evaluates such an `every` as true for every input: a policy would fail open.
    with pytest.raises(InvalidPolicy, match="`not` inside `every` is refused"):
        RegoAuthorizer("data.t.allow", {"t.rego": policy})


def test_the_engine_really_gets_not_inside_every_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the rule exists: with the scan off, the engine allows xs = [1, 2] for 'no element is 2'."""
    from codemode.authz import AuthorizationInput, Subject
    from codemode.authz.rego import _authorizer as rego_module

    monkeypatch.setattr(rego_module, "check_modules", lambda modules, is_builtin: None)
    a = RegoAuthorizer("data.t.allow", {"t.rego": NOT_IN_EVERY[0]})
    inp = AuthorizationInput(Subject("a"), "c", "c.c", {"xs": [1, 2]})
    assert a.decide(inp) is True  # wrong, and the reason the scanner refuses it


def test_every_without_not_and_not_outside_every_are_accepted() -> None:
    policy = (
        "package t\nallow if {\n    not input.arguments.deny\n"
        "    every x in input.arguments.xs { x != 2 }\n}\n"
    )
    RegoAuthorizer("data.t.allow", {"t.rego": policy})
