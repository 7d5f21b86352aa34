"""What to write instead: starlark-rust's texts for the mistakes programs commonly make, replaced
by texts that say what this dialect offers (docs/reference/program.md). No ``starlark`` import."""

from __future__ import annotations

import re
from typing import Final

from .protocol import RESERVED_ROOTS

__all__ = ["explain"]

_KEYWORD = re.compile(r"^Parse error: cannot use reserved keyword `(\w+)`$")
_NO_ATTRIBUTE = re.compile(r"^Object of type `struct` has no attribute `(\w+)`(, did you mean `(\w+)`\?)?$")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*")

_ATTEMPT: Final = (
    "to handle a failing capability call, make it with `attempt(records.get, id=7)`,"
    ' which returns {"ok": False, "error": ...} instead of ending the program'
)
_INSTEAD: Final = {
    "while": "`while` is not available: loop over a bounded range instead (`for i in range(n):`)",
    "try": "`try` is not available: " + _ATTEMPT,
    "except": "`except` is not available: " + _ATTEMPT,
    "finally": "`finally` is not available: " + _ATTEMPT,
    "raise": '`raise` is not available: call `fail("message")` to end the program with an error',
    "class": "`class` is not available: use dicts and functions",
    "import": "`import` is not available: capabilities are in scope by their names (e.g. `records.get(...)`)"
    " and `json` and `math` are builtins",
    "from": "`from` is not available: capabilities are in scope by their names (e.g. `records.get(...)`)",
    "global": "`global` is not available: pass values as arguments and return results",
    "nonlocal": "`nonlocal` is not available: pass values as arguments and return results",
    "is": "`is` is not available: compare with `==` (and `!=`)",
    "with": "`with` is not available here",
    "yield": "`yield` is not available: build and return a list",
    "async": "`async` is not available: capability calls already return their results",
    "await": "`await` is not available: capability calls already return their results",
    "del": "`del` is not available: build a new list or dict without the item (`d.pop(key)` removes one)",
    "assert": '`assert` is not available: `if not ok: fail("message")`',
}
# A Python builtin the dialect lacks: starlark-rust's "did you mean" names the nearest spelling
# (`set` -> `s`, `map` -> `max`), which misleads; the execute tool's text says what to use.
_NOT_FOUND = re.compile(r"^Variable `(\w+)` not found(?:, did you mean `\w+`\?)?$")
_COMPREHENSION: Final = "use a list comprehension"
_MISSING: Final = {
    "set": "use dict keys (`seen = {x: True for x in items}`, then `x in seen`)",
    "frozenset": "use dict keys (`seen = {x: True for x in items}`, then `x in seen`)",
    "map": _COMPREHENSION + " (`[f(x) for x in items]`)",
    "filter": _COMPREHENSION + " (`[x for x in items if ok(x)]`)",
    "isinstance": 'compare the type name (`type(x) == "int"`)',
    "round": "use `math.round(x)`",
    "next": "loop with `for x in items:` or index (`items[0]`)",
    "iter": "loop with `for x in items:`",
    "open": "there is no file access; capabilities are the only way to reach the host",
    "input": "there is no input; capabilities are the only way to reach the host",
    "eval": "write the code itself",
    "exec": "write the code itself",
    "Exception": '`fail("message")` ends the program with an error; `attempt(...)` handles a failing call',
    "ValueError": '`fail("message")` ends the program with an error; `attempt(...)` handles a failing call',
}
F_STRINGS: Final = "Your Starlark dialect must enable f-strings to use them"
_F_STRINGS_INSTEAD: Final = 'f-strings are not available: use "{} of {}".format(a, b) or "%s" % value'


def explain(message: str, source: str, location: str | None) -> str:
    """``message`` (the first line of a program error at ``location``, ``LINE:COL``), or the text
    that says what to write instead."""
    if message == F_STRINGS:
        return _F_STRINGS_INSTEAD
    not_found = _NOT_FOUND.match(message)
    if not_found and not_found.group(1) in _MISSING:
        return f"`{not_found.group(1)}` is not available: {_MISSING[not_found.group(1)]}"
    keyword = _KEYWORD.match(message)
    if keyword and keyword.group(1) in _INSTEAD:
        return _INSTEAD[keyword.group(1)]
    missing = _NO_ATTRIBUTE.match(message)
    if missing and location is not None:
        owner = _owner(source, location, missing.group(1))
        if owner is not None:
            root = owner.split(".", 1)[0]
            if root in RESERVED_ROOTS:  # a builtin module: json, math
                close = f" (did you mean `{missing.group(3)}`?)" if missing.group(3) else ""
                return f"{owner} has no function `{missing.group(1)}`{close}"
            return (
                f"{owner} has no capability `{missing.group(1)}`: search_api finds capabilities by what "
                "they do, describe_api shows one's exact signature"
            )
    return message


def _owner(source: str, location: str, attribute: str) -> str | None:
    """The dotted name before ``.attribute`` in the expression starting at ``location``."""
    line_text, _, col_text = location.partition(":")
    lines = source.split("\n")
    try:
        line, col = int(line_text), int(col_text)
    except ValueError:
        return None
    if not 0 < line <= len(lines):
        return None
    found = _DOTTED.match(lines[line - 1], max(0, col - 1))
    if found is None:
        return None
    parts = [p.strip() for p in found.group(0).split(".")]
    if attribute not in parts[1:]:
        return None
    return ".".join(parts[: parts.index(attribute, 1)])
