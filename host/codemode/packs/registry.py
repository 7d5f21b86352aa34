"""Declaring capabilities at the function: ``@capability(...)`` and :class:`CapabilityPack`.

::

    pack = CapabilityPack()

    @pack.capability("notes.add", search_terms=["new note"])
    async def add(text: str, owner: Subject, pinned: bool = False) -> Note:
        \"\"\"Add a note and return it.

        The note belongs to the caller.\"\"\"

The function is a plain typed function (its parameters are the inputs; one annotated ``Subject``
receives the trusted caller, one annotated ``CallContext`` the call's context) or the
``(ctx, subject, args)`` handler form (``codemode.catalog.functions``).

The decorator leaves the function as it is (still callable, still testable) and records a
:class:`~codemode.Capability` on it: ``summary`` defaults to the docstring's first paragraph (as one
line), ``description`` to the whole docstring, ``id`` to the name. :func:`capability` alone marks
a function; :func:`capability_of` reads the mark. A :class:`CapabilityPack` collects capabilities
(decorated functions or ``Capability`` objects) and is a pack (``--pack ./mypack.py:pack``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..catalog.capability import Capability
from .loading import PackSettings

__all__ = ["CapabilityPack", "capability", "capability_of"]

F = TypeVar("F", bound=Callable[..., Any])
_MARK = "__codemode_capability__"


def _docstring_parts(fn: Callable[..., Any]) -> tuple[str | None, str | None]:
    doc = inspect.getdoc(fn)
    if not doc or not doc.strip():
        return None, None
    first = doc.strip().split("\n\n", 1)[0]
    return " ".join(first.split()), doc.strip()


def capability(
    name: str,
    *,
    id: str | None = None,
    summary: str | None = None,
    description: str | None = None,
    search_terms: Sequence[str] = (),
) -> Callable[[F], F]:
    """Mark a handler as the capability ``name``.

    Args:
        name: the dotted name programs call (``notes.add``).
        id: the stable id for policies and ``disabled`` (default: the name).
        summary: one line for search (default: the docstring's first paragraph).
        description: the ``describe_api`` text (default: the whole docstring).
        search_terms: extra words search matches.

    Returns:
        A decorator that records the :class:`~codemode.Capability` on the function and returns the
        function unchanged.
    """

    def mark(fn: F) -> F:
        doc_summary, doc_description = _docstring_parts(fn)
        chosen = summary if summary is not None else doc_summary
        cap = Capability(
            name=name,
            # an undocumented handler is a registration problem that Builder.build() names
            summary=chosen if chosen is not None else "",
            handler=fn,
            id=id,
            description=description if description is not None else doc_description,
            search_terms=list(search_terms),
        )
        setattr(fn, _MARK, cap)
        return fn

    return mark


def capability_of(fn: Callable[..., Any]) -> Capability:
    """The :class:`Capability` recorded on a function by :func:`capability`.

    Args:
        fn: the marked function.

    Returns:
        Its capability.

    Raises:
        TypeError: ``fn`` is not marked.
    """
    cap = getattr(fn, _MARK, None)
    if not isinstance(cap, Capability):
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} is not marked with @codemode.capability(...)")
    return cap


class CapabilityPack:
    """An ordered collection of capabilities; a pack in the sense of ``codemode.packs``.

    Args (of the constructor):
        items: capabilities or marked functions, added in order.
    """

    def __init__(self, *items: Capability | Callable[..., Any]) -> None:
        self._caps: list[Capability] = []
        for item in items:
            self.add(item)

    def add(self, item: Capability | Callable[..., Any]) -> None:
        """Add one capability at the end.

        Args:
            item: a ``Capability`` or a function marked with :func:`capability`.

        Raises:
            TypeError: a function that is not marked.
        """
        self._caps.append(item if isinstance(item, Capability) else capability_of(item))

    def capability(
        self,
        name: str,
        *,
        id: str | None = None,
        summary: str | None = None,
        description: str | None = None,
        search_terms: Sequence[str] = (),
    ) -> Callable[[F], F]:
        """:func:`capability`, also adding the result to this pack.

        Args:
            name, id, summary, description, search_terms: as for :func:`capability`.

        Returns:
            A decorator that marks the function, adds it and returns it unchanged.
        """
        mark = capability(name, id=id, summary=summary, description=description, search_terms=search_terms)

        def register(fn: F) -> F:
            marked = mark(fn)
            self.add(marked)
            return marked

        return register

    def capabilities(self, settings: PackSettings | None = None) -> list[Capability]:
        """The pack protocol (codemode.packs): every capability added, in order.

        Args:
            settings: ignored (a pack of fixed capabilities needs no configuration).

        Returns:
            A new list of the pack's :class:`~codemode.Capability` objects.
        """
        return list(self._caps)

    def __iter__(self) -> Any:
        return iter(list(self._caps))

    def __len__(self) -> int:
        return len(self._caps)
