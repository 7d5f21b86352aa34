"""What ``search_api`` and ``describe_api`` answer for one capability, and the bound on each
(docs/reference/describe.md and search.md).

Both answers are measured the same way: compact JSON (``,`` and ``:`` separators, non-ASCII kept),
in UTF-8 bytes. A search response is cut to fit its bound; a describe answer is one capability's
exact contract and is never cut (a truncated signature or field list would lie), so a capability
whose answer cannot fit is refused when it is registered (:meth:`AnswerBounds.problems`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from codemode_worker.shapes import render

from .capability import CompiledCapability
from .search import DEFAULT_MAX_RESPONSE_BYTES, SearchEntry, oversized_entries
from .types import describe_fields

__all__ = [
    "DEFAULT_MAX_DESCRIBE_RESPONSE_BYTES",
    "MIN_DESCRIBE_RESPONSE_BYTES",
    "AnswerBounds",
    "answer_bytes",
    "describe_document",
    "search_entry",
]

DEFAULT_MAX_DESCRIBE_RESPONSE_BYTES = 64 * 1024
MIN_DESCRIBE_RESPONSE_BYTES = 1024


def answer_bytes(value: object) -> int:
    """UTF-8 bytes of ``value`` as compact JSON (the measure of both bounds).

    Args:
        value: a JSON-serializable answer.

    Returns:
        The length in bytes of its compact UTF-8 JSON text.
    """
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8", "surrogatepass"))


def describe_document(c: CompiledCapability) -> dict[str, Any]:
    """``describe_api``'s answer for ``c`` (docs/reference/describe.md). The id is never in it.

    Args:
        c: the compiled capability.

    Returns:
        The document: name, signature, summary, description, input and output fields.
    """
    return {
        "name": c.name,
        "signature": c.signature,
        "summary": c.summary,
        "description": c.description,
        "input": [f.to_dict() for f in describe_fields(c.input_shape, output=False)],
        **_output(c.output_shape),
    }


def _output(shape: dict[str, Any]) -> dict[str, Any]:
    """``output``: the fields of a record result; a result of another type (a function returning
    ``str`` or ``list[T]``) has no fields, and ``returns`` gives its type instead."""
    if shape["t"] == "record":
        return {"output": [f.to_dict() for f in describe_fields(shape, output=True)]}
    return {"output": [], "returns": render(shape, output=True)}


def search_entry(c: CompiledCapability) -> SearchEntry:
    """``c`` as the search index sees it.

    Args:
        c: the compiled capability.

    Returns:
        Its search entry (name, signature, summary, description, search terms, third_party).
    """
    return SearchEntry(
        name=c.name,
        signature=c.signature,
        summary=c.summary,
        description=c.description,
        search_terms=list(c.search_terms),
        third_party=c.third_party,
    )


@dataclass(frozen=True)
class AnswerBounds:
    """The two response bounds a capability's answers must fit (``Limits`` of the same names).

    Attributes:
        max_search_response_bytes: the bound on a ``search_api`` response, in bytes.
        max_describe_response_bytes: the bound on one ``describe_api`` answer, in bytes.
    """

    max_search_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    max_describe_response_bytes: int = DEFAULT_MAX_DESCRIBE_RESPONSE_BYTES

    def describe_overflow(self, c: CompiledCapability) -> int | None:
        """The size of ``c``'s describe answer when it exceeds the bound, else None.

        Args:
            c: the compiled capability.

        Returns:
            The answer's size in bytes when over ``max_describe_response_bytes``, else None.
        """
        size = answer_bytes(describe_document(c))
        return size if size > self.max_describe_response_bytes else None

    def search_overflows(self, c: CompiledCapability) -> bool:
        """True when ``c``'s single search result cannot fit a search response.

        Args:
            c: the compiled capability.

        Returns:
            Whether its search entry alone exceeds ``max_search_response_bytes``.
        """
        return bool(oversized_entries([search_entry(c)], self.max_search_response_bytes))

    def problems(self, c: CompiledCapability) -> list[str]:
        """Registration problems of ``c`` (empty when both of its answers fit).

        Args:
            c: the compiled capability.

        Returns:
            One message per answer that cannot fit its bound.
        """
        out = []
        if self.search_overflows(c):
            out.append(f"capability {c.name!r}: its search result alone exceeds the response bound")
        if self.describe_overflow(c) is not None:
            out.append(
                f"capability {c.name!r}: its describe_api answer alone exceeds the response bound "
                "(max_describe_response_bytes)"
            )
        return out
