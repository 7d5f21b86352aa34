"""What an upstream MCP server's successful answer may carry to a program: every whole spelling of
a credential the host gave that server cut out.

A server may answer with its own environment or the headers it received (a debugging tool, a
``printEnv``): the ``env_from_host``, ``headers_from_env``, ``headers_from_file`` and subject header
values are the operator's, not the tenant's. So a result, its text or every string of its
structured content (keys too), passes through :class:`codemode.packs.Redactor`, as an OpenAPI
result does: whole spellings only (never a part, which would answer a program "is this part of
the credential?"), plain forms shorter than :data:`MIN_SECRET` characters left out, as in error
texts. When anything was cut, the host logs one warning naming the upstream, never the text.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

from .error_text import MIN_SECRET
from .redaction import Redactor

__all__ = ["upstream_result"]

log = logging.getLogger("codemode.upstream")


@functools.lru_cache(maxsize=256)
def _redactor(secrets: tuple[str, ...]) -> Redactor:
    return Redactor(secrets, shortest=MIN_SECRET)


def upstream_result(upstream: str, value: dict[str, Any], *, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """A successful answer of an upstream with every whole spelling of its credentials cut out.

    Args:
        upstream: the upstream's name (for the warning).
        value: the answer as the program gets it (``{"text": ...}`` or the structured content).
        secrets: the credential values the host gave that upstream's session.

    Returns:
        The answer, each whole spelling ``[redacted]``.
    """
    redactor = _redactor(tuple(secrets))
    if not redactor:
        return value
    shown, changed = redactor.value(value)
    if changed:
        log.warning("upstream %r: its answer carried a configured credential: redacted", upstream)
    return dict(shown)
