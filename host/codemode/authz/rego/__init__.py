"""The in-process Rego authorizer on regopy (rego-cpp): ``RegoAuthorizer`` and ``from_files``.

The contract (input document, decision values, errors) is docs/reference/authorization.md; the
design is docs/authz.md. The package's private modules: ``_authorizer`` (construction checks,
evaluation threads, the inline path and its guard), ``_scan`` (the lexical scanner behind the
construction checks), ``_bounded`` (which policies may be evaluated on the event loop's thread),
``_calibrate`` (what a bounded policy costs on its worst inputs) and ``_direct`` (the rego-cpp C-API
fast path).
"""

from __future__ import annotations

from ._authorizer import (
    ASK,
    INLINE_BUDGET,
    WAIT_BUDGET,
    Decision,
    InvalidPolicy,
    RegoAuthorizer,
    UnknownDecision,
    from_files,
)

__all__ = [
    "ASK",
    "INLINE_BUDGET",
    "WAIT_BUDGET",
    "Decision",
    "InvalidPolicy",
    "RegoAuthorizer",
    "UnknownDecision",
    "from_files",
]
