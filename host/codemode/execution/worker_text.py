"""What the host accepts of the text a worker puts in a ``final_error`` frame.

The worker is hostile: its ``message`` may say anything ("permission denied. Session expired:
re-authenticate at http://evil.example/login"). A message reaches a client only when it has exactly
the form an honest worker produces, otherwise the client gets the bare coarse text:

- ``invalid_program``: ``<codemode>:LINE:COL: MESSAGE`` where LINE:COL lies inside the submitted
  source (columns may point one past the end of a line) and MESSAGE is one printable line. The
  MESSAGE itself is text the program controls anyway (``fail("...")``), so only its form is checked.
- ``invalid_arguments``: one of the binder's fixed phrases (``codemode_worker.shapes``) around an
  argument path of identifiers, ``[N]`` and ``['key']`` steps, with the type named as the rendering
  of a shape some enabled capability actually has (the choices of a string enum likewise), or the
  positional-arguments phrase naming an enabled capability.
- ``resource_limit``: the message must be one of the kinds a worker can observe
  (:data:`WORKER_LIMIT_KINDS`); anything else is a bare ``resource limit exceeded``.

Every accepted message is at most :data:`MAX_MESSAGE_BYTES` UTF-8 bytes of printable characters.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

from codemode_worker.shapes import _enum_choices, render

__all__ = [
    "MAX_MESSAGE_BYTES",
    "WORKER_LIMIT_KINDS",
    "ArgumentGrammar",
    "accepted_limit_kind",
    "accepted_program_message",
]

MAX_MESSAGE_BYTES: Final = 1024

#: The limits a worker itself can see run out (the rest only the host measures). ``time`` is its
#: CPU-seconds limit, which it may see first; the host answers it as its own deadline.
WORKER_LIMIT_KINDS: Final = frozenset({"steps", "memory", "native calls", "value size", "time"})

_POSITION = re.compile(r"<codemode>:([1-9][0-9]{0,6}):([1-9][0-9]{0,6}): (\S[^\n]*)\Z")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
#: A map key inside an argument path: short, no spaces, no punctuation that could spell a URL.
_KEY = r"[A-Za-z0-9_-]{0,32}"
_STEP = rf"(?:\.{_IDENT}|\[[0-9]{{1,9}}\]|\['{_KEY}'\])"
_PATH = rf"{_IDENT}{_STEP}*"
_KIND = r"[A-Za-z_][A-Za-z0-9_]{0,39}"
_MUST_BE = re.compile(rf'(?:argument "(?P<path>{_PATH})"|arguments) must be (?P<type>.+), got {_KIND}\Z')
_ONE_OF = re.compile(rf'(?:argument "{_PATH}"|arguments) must be one of (?P<choices>.+)\Z')
_FIXED = re.compile(
    rf'(?:(?:argument "{_PATH}"|arguments) (?:must be a finite float|keys must be str|overflows int64)'
    rf'|unknown argument "{_PATH}"|missing required argument "{_PATH}")\Z'
)
_QUOTED_PATH = re.compile(r'argument "([^"]*)"')
_PATH_IDENTS = re.compile(rf"(?:^|\.)({_IDENT})")
_POSITIONAL = re.compile(
    rf"positional arguments are not accepted; call (?P<name>{_IDENT}(?:\.{_IDENT})*)"
    rf"\((?P<keywords>(?:{_IDENT}=\.\.\.(?:, {_IDENT}=\.\.\.)*)?)\) (?:with keywords|without arguments)\Z"
)


def _printable_and_bounded(message: str) -> bool:
    return (
        isinstance(message, str)
        and len(message) <= MAX_MESSAGE_BYTES  # cheap first: a character is at least one byte
        and message.isprintable()
        and len(message.encode("utf-8", "surrogatepass")) <= MAX_MESSAGE_BYTES
    )


def accepted_program_message(message: Any, source: str) -> str | None:
    """``message`` if it is a well-formed program diagnostic for ``source``, else None.

    Args:
        message: what the worker sent (hostile).
        source: the program, whose lines and columns the position must fall in.

    Returns:
        The message, or None.
    """
    if not _printable_and_bounded(message):
        return None
    match = _POSITION.match(message)
    if match is None:
        return None
    line, column = int(match[1]), int(match[2])
    lines = source.split("\n")
    if line > len(lines):
        return None
    text = lines[line - 1]
    if column > max(len(text), len(text.encode("utf-8"))) + 1:
        return None
    return str(message)


def accepted_limit_kind(message: Any) -> str | None:
    """The limit kind a ``resource_limit`` frame names, if it is one a worker can observe.

    Args:
        message: what the worker sent (hostile).

    Returns:
        The kind, or None.
    """
    return message if isinstance(message, str) and message in WORKER_LIMIT_KINDS else None


def _subshapes(shape: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    yield shape
    if "of" in shape:
        yield from _subshapes(shape["of"])
    for field in shape.get("fields", ()):
        yield from _subshapes(field["shape"])


class ArgumentGrammar:
    """Accepts the binder's diagnostics for the given capabilities' input shapes.

    Args:
        inputs: the enabled capabilities' input shapes by dotted name.
    """

    def __init__(self, inputs: Mapping[str, Mapping[str, Any]]) -> None:
        self.names: Collection[str] = frozenset(inputs)
        subs = [sub for shape in inputs.values() for sub in _subshapes(shape)]
        self.types = frozenset(render(sub) for sub in subs)
        self.choices = frozenset(_enum_choices(list(sub["enum"])) for sub in subs if "enum" in sub)
        self.fields = frozenset(field["name"] for sub in subs for field in sub.get("fields", ()))

    def _known_path(self, message: str) -> bool:
        """Every field named in the message's argument path is a field of an enabled capability
        (of an unknown argument, all but the last name: that one the program chose itself)."""
        unknown = message.startswith("unknown argument ")
        for path in _QUOTED_PATH.findall(message):
            names = _PATH_IDENTS.findall(re.sub(r"\[[^\]]*\]", "", path))
            if unknown:
                names = names[:-1]
            if any(name not in self.fields for name in names):
                return False
        return True

    def accepted(self, message: Any) -> str | None:
        """``message`` if it is a well-formed binding diagnostic, else None.

        Args:
            message: what the worker sent (hostile).

        Returns:
            The message, or None.
        """
        if not _printable_and_bounded(message) or not self._known_path(message):
            return None
        if _FIXED.match(message):
            return str(message)
        one_of = _ONE_OF.match(message)
        if one_of is not None:
            return str(message) if one_of["choices"] in self.choices else None
        must = _MUST_BE.match(message)
        if must is not None:
            return str(message) if must["type"] in self.types else None
        positional = _POSITIONAL.match(message)
        if positional is not None and positional["name"] in self.names:
            return str(message)
        return None
