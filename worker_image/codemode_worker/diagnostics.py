"""Source checks and error texts for programs: the ``def main():`` rule and
``<codemode>:LINE:COL: message`` formatting of starlark-rust errors. No ``starlark`` import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from .hints import explain

__all__ = [
    "FALLBACK_LOCATION",
    "FILENAME",
    "MAX_MESSAGE_BYTES",
    "bounded",
    "describe_error",
    "find_operator",
    "has_valid_main",
    "located_tokens",
    "main_error",
    "program_error",
]

FILENAME: Final = "<codemode>"
#: Where a program error without a position of its own is reported (every program message has one).
FALLBACK_LOCATION: Final = "1:1"
MAX_MESSAGE_BYTES: Final = 1024

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING_PREFIXES: Final = frozenset({"r", "R", "b", "B", "rb", "rB", "Rb", "RB", "br", "bR", "Br", "BR"})


def _skip_string(source: str, i: int) -> int:
    quote = source[i]
    n = len(source)
    triple = source.startswith(quote * 3, i)
    i += 3 if triple else 1
    while i < n:
        ch = source[i]
        if ch == "\\":
            i += 2
        elif triple and source.startswith(quote * 3, i):
            return i + 3
        elif not triple and ch == quote:
            return i + 1
        elif not triple and ch == "\n":
            return i
        else:
            i += 1
    return n


def tokens(source: str) -> list[tuple[str, int]]:
    """Names and punctuation of a Starlark source with their 0-based columns; strings,
    numbers and comments are skipped. Meant for sources that already parsed."""
    return [(text, column) for text, _line, column in located_tokens(source)]


def located_tokens(source: str) -> list[tuple[str, int, int]]:
    """Like :func:`tokens`, with the 1-based line: ``(text, line, 0-based column)``."""
    out: list[tuple[str, int, int]] = []
    i = 0
    n = len(source)
    line_start = 0
    line = 1
    while i < n:
        ch = source[i]
        if ch == "\n":
            i += 1
            line_start = i
            line += 1
        elif ch in " \t\r\f" or (ch == "\\" and i + 1 < n and source[i + 1] in "\r\n"):
            i += 1
        elif ch == "#":
            while i < n and source[i] != "\n":
                i += 1
        elif ch in "'\"":
            i = _skip_string(source, i)
        elif ch.isalpha() or ch == "_":
            match = _WORD.match(source, i)
            end = match.end() if match else i + 1
            word = source[i:end]
            if word in _STRING_PREFIXES and end < n and source[end] in "'\"":
                i = _skip_string(source, end)
                continue
            out.append((word, line, i - line_start))
            i = end
        elif ch.isdigit():
            while i < n and (source[i].isalnum() or source[i] in "._"):
                i += 1
        else:
            out.append((ch, line, i - line_start))
            i += 1
    return out


def find_operator(source: str, operator: str) -> tuple[int, int] | None:
    """1-based ``(line, column)`` of the first use of a punctuation ``operator`` (outside strings
    and comments), or None."""
    toks = located_tokens(source)
    width = len(operator)
    for index in range(len(toks) - width + 1):
        text, line, column = toks[index]
        if text != operator[0]:
            continue
        run = toks[index : index + width]
        if all(
            t[0] == ch and t[1] == line and t[2] == column + k
            for k, (t, ch) in enumerate(zip(run, operator, strict=True))
        ):
            return line, column + 1
    return None


def main_error(source: str, message: str) -> str:
    """``<codemode>:LINE:COL: message`` at the first ``def main`` (else at 1:1), bounded."""
    location = FALLBACK_LOCATION
    toks = located_tokens(source)
    for index in range(len(toks) - 1):
        if toks[index][0] == "def" and toks[index + 1][0] == "main":
            location = f"{toks[index][1]}:{toks[index][2] + 1}"
            break
    return bounded(f"{FILENAME}:{location}: {message}")


def has_valid_main(source: str) -> bool:
    """Exactly one ``def main`` in the whole source, at column 0, with ``()`` as parameters.

    Together with the run-time check that ``repr(main) == "<codemode>.main"`` this proves that
    ``main`` is a top-level function without parameters of any kind.
    """
    toks = tokens(source)
    found: list[tuple[int, bool]] = []
    for index in range(len(toks) - 1):
        if toks[index][0] == "def" and toks[index + 1][0] == "main":
            params = [text for text, _ in toks[index + 2 : index + 4]]
            found.append((toks[index][1], params == ["(", ")"]))
    return len(found) == 1 and found[0] == (0, True)


# ---------------------------------------------------------------------------------------- errors

_FRAME_LINE = re.compile(r"^  \* (?P<file>.*):(?P<line>\d+), in (?P<func>.*)$")
_ARROW_LINE = re.compile(r"^ *--> (?P<file>.*):(?P<line>\d+):(?P<col>\d+)$")
_PREFIX = re.compile(r"^(?:StarlarkError|CallError): ")


def clean(text: str) -> str:
    """Non-printable characters become spaces."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def bounded(text: str) -> str:
    """Printable text of at most ``MAX_MESSAGE_BYTES`` UTF-8 bytes (``...`` when cut)."""
    text = clean(text)
    data = text.encode("utf-8")
    if len(data) <= MAX_MESSAGE_BYTES:
        return text
    return data[: MAX_MESSAGE_BYTES - 3].decode("utf-8", "ignore") + "..."


_DEF_LINE = re.compile(r"^\s*def (?P<name>[A-Za-z_][A-Za-z0-9_]*)\(")
_REFERENCE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")


def _enclosing_def(source: str, line: int) -> str:
    lines = source.split("\n")
    for index in range(min(line, len(lines)) - 1, -1, -1):
        match = _DEF_LINE.match(lines[index])
        if match:
            return match["name"]
    return ""


def _call_column(code: str, name: str) -> int:
    """1-based column of the dotted reference calling ``name`` on ``code`` (0 if absent)."""
    match = re.search(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"\s*\(", code)
    if not match:
        return 0
    start = match.start()
    while start > 0 and code[start - 1] in _REFERENCE_CHARS:
        start -= 1
    return start + 1


def describe_error(
    text: str, source: str, callee: str = "", helpers: Mapping[str, str] | None = None
) -> tuple[str | None, str]:
    """``(LINE:COL or None, first line of the message)`` of a starlark-pyo3 error text.

    The location is the error's span when it lies in the program. When the error was raised
    inside a builtin written in Starlark (``sum``, ``json.decode``, a capability wrapper; their
    sources are ``helpers``, by file name) it is the program's call site: the line of the
    deepest program frame of the traceback and the column of the call of ``callee`` (or of the
    function the next frame runs, or of the helper function the error happened in) on that
    line, else of the line's first non-blank character.
    """
    lines = text.split("\n")
    frames: list[tuple[str, int, str]] = []
    i = 0
    if lines and lines[0].startswith("Traceback"):
        i = 1
        while i < len(lines) and not lines[i].startswith("error: "):
            match = _FRAME_LINE.match(lines[i])
            if match:
                frames.append((match["file"], int(match["line"]), match["func"]))
            i += 1
    if i >= len(lines) or not lines[i].startswith("error: "):
        first = next((line for line in lines if line.strip()), "")
        return None, _PREFIX.sub("", first.strip())
    message = _PREFIX.sub("", lines[i][len("error: ") :])
    innermost = ""
    for later in lines[i + 1 :]:
        arrow = _ARROW_LINE.match(later)
        if arrow:
            if arrow["file"] == FILENAME:
                return f"{arrow['line']}:{arrow['col']}", message
            helper_source = (helpers or {}).get(arrow["file"], "")
            innermost = _enclosing_def(helper_source, int(arrow["line"]))
            break
    source_lines = source.split("\n")
    for index in range(len(frames) - 1, -1, -1):
        file, line, _func = frames[index]
        if file != FILENAME:
            continue
        code = source_lines[line - 1] if 0 < line <= len(source_lines) else ""
        candidates = [callee, frames[index + 1][2] if index + 1 < len(frames) else innermost]
        column = 0
        for candidate in candidates:
            if candidate and not column:
                column = _call_column(code, candidate)
        if not column:
            column = len(code) - len(code.lstrip()) + 1
        return f"{line}:{column}", message
    return None, message


def program_error(text: str, source: str, helpers: Mapping[str, str] | None = None) -> str:
    """``<codemode>:LINE:COL: message`` for an error of the program (bounded, printable)."""
    location, message = describe_error(text, source, helpers=helpers)
    message = explain(message, source, location)
    return bounded(f"{FILENAME}:{location or FALLBACK_LOCATION}: {message}")
