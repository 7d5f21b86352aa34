"""The values the host hands a capability function that asks for them by annotation: the call's
context (``codemode.CallContext``) and the trusted caller (``codemode.Subject``).

The classes live in layers the catalog may not import (execution, authz); each marks itself here
with :func:`passed_as`, and the catalog (``codemode.catalog.functions``) asks :func:`passed_kind`.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

__all__ = ["PassedKind", "passed_as", "passed_kind"]

#: ``ctx``: the call's ``CallContext``; ``subject``: the trusted ``Subject``.
PassedKind = Literal["ctx", "subject"]

_KINDS: dict[type, PassedKind] = {}
T = TypeVar("T", bound=type)


def passed_as(kind: PassedKind) -> Any:
    """Class decorator: a parameter annotated with this class receives the value ``kind``.

    Args:
        kind: ``"ctx"`` or ``"subject"``.

    Returns:
        A decorator that records the class and returns it unchanged.
    """

    def mark(cls: T) -> T:
        _KINDS[cls] = kind
        return cls

    return mark


def passed_kind(annotation: object) -> PassedKind | None:
    """Which passed value an annotation asks for (the class itself, not a subclass).

    Args:
        annotation: a resolved parameter annotation.

    Returns:
        ``"ctx"``, ``"subject"``, or None for any other annotation.
    """
    try:
        kind: PassedKind | None = _KINDS.get(annotation)  # type: ignore[call-overload]
    except TypeError:  # an unhashable annotation
        return None
    return kind
