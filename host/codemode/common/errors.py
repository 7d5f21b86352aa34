"""The error classes a client may see (docs/reference/errors.md).

``str(err)`` is always exactly the coarse client-facing text. An approved suffix (a binding
diagnostic, a program position, a disclosed ``AgentError`` message, the kind of an exceeded limit)
lives in ``err.detail`` and is rendered only through :func:`client_text`. Host-only detail goes to
logs, never into these objects.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from .outcomes import ExecuteOutcome, LedgerEntry

__all__ = [
    "LIMIT_KINDS",
    "MAX_DISCLOSED_BYTES",
    "AgentError",
    "CapabilityFailure",
    "CodeModeError",
    "ExecutionTimeout",
    "Internal",
    "InvalidArguments",
    "InvalidProgram",
    "InvalidRegistration",
    "NotFound",
    "PermissionDenied",
    "PolicyFailure",
    "ResourceLimit",
    "Unauthenticated",
    "client_text",
    "sanitize_disclosure",
]

#: UTF-8 bytes of a disclosed ``AgentError`` message a client may see.
MAX_DISCLOSED_BYTES = 256


class CodeModeError(Exception):
    """Root of every error a client may see. ``str()`` is the coarse text only.

    An error raised by ``Server.execute``/``Server.run`` also carries what the execute did before
    it failed: ``calls``, the call ledger (``codemode.common.outcomes.LedgerEntry`` items, in
    order; empty when no call was made), and ``prints`` (``None`` when the server keeps none).

    Args:
        detail: the approved suffix of the client text (see :func:`client_text`), or None.
    """

    text = "internal failure"
    #: What an execute this error ends records (``ExecuteEvent.outcome``): its text in snake case.
    outcome: ClassVar[ExecuteOutcome] = "internal"

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(self.text)
        self.detail = detail or None
        self.calls: tuple[LedgerEntry, ...] = ()
        self.prints: str | None = None

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.text!r})"


class InvalidRegistration(CodeModeError):
    """``Builder.build()`` found problems; ``problems`` lists every one, each naming its capability.

    Args:
        problems: one line per problem.
    """

    text = "invalid registration"
    outcome: ClassVar[Literal["internal"]] = "internal"  # a host problem

    def __init__(self, problems: list[str]) -> None:
        super().__init__(None)
        self.problems = list(problems)

    def __str__(self) -> str:
        return self.text + ":\n" + "\n".join(f"- {p}" for p in self.problems)


class Unauthenticated(CodeModeError):
    """No trusted subject: the request's credentials or the resolver failed (``unauthenticated``)."""

    text = "unauthenticated"
    outcome: ClassVar[Literal["unauthenticated"]] = "unauthenticated"


class NotFound(CodeModeError):
    """``describe_api`` named no enabled capability (``capability not found``)."""

    text = "capability not found"
    outcome: ClassVar[Literal["not_found"]] = "not_found"


class InvalidProgram(CodeModeError):
    """The program cannot run: a syntax or runtime error, no ``def main():``, a bad value
    (``invalid program``; the approved suffix is ``<codemode>:LINE:COL: message``)."""

    text = "invalid program"
    outcome: ClassVar[Literal["invalid_program"]] = "invalid_program"


class InvalidArguments(CodeModeError):
    """A capability call's arguments did not bind, or its handler refused a value
    (``invalid capability arguments``; the suffix is a binding diagnostic naming the argument)."""

    text = "invalid capability arguments"
    outcome: ClassVar[Literal["invalid_arguments"]] = "invalid_arguments"


class PermissionDenied(CodeModeError):
    """The authorizer denied the call (``permission denied``)."""

    text = "permission denied"
    outcome: ClassVar[Literal["permission_denied"]] = "permission_denied"


class PolicyFailure(CodeModeError):
    """The authorizer could not decide: an error, a non-boolean or undefined decision
    (``authorization policy failure``)."""

    text = "authorization policy failure"
    outcome: ClassVar[Literal["policy_failure"]] = "policy_failure"


#: The limits a client may learn were exceeded (``resource limit exceeded: <kind>``). Fixed: no
#: numbers and no host detail, only which budget ran out.
LIMIT_KINDS: tuple[str, ...] = (
    "time",
    "steps",
    "memory",
    "native calls",
    "value size",
    "intermediate bytes",
    "source size",
    "query",
    "concurrency",
    "quota",
    "approval wait",
    "suspension bytes",
    "state keys",
    "state bytes",
)


class ResourceLimit(CodeModeError):
    """A budget ran out; ``kind`` names it and is the approved suffix of the client text. Only a
    kind of :data:`LIMIT_KINDS` is kept: anything else (a number, host detail) is dropped, and the
    client sees the bare ``resource limit exceeded``.

    Args:
        kind: one of :data:`LIMIT_KINDS`, e.g. ``"memory"``; anything else is dropped.
    """

    text = "resource limit exceeded"
    outcome: ClassVar[Literal["resource_limit"]] = "resource_limit"

    def __init__(self, kind: str | None = None) -> None:
        known = kind if kind in LIMIT_KINDS else None
        super().__init__(known)
        self.kind = known


class ExecutionTimeout(ResourceLimit, TimeoutError):
    """The execution deadline passed: a ``ResourceLimit`` (kind ``time``) that is also a
    ``TimeoutError``.

    Args:
        kind: the limit kind (``time``; ``concurrency`` when the wait for a slot ran out).
    """

    def __init__(self, kind: str | None = "time") -> None:
        super().__init__(kind)

    def __str__(self) -> str:
        return ResourceLimit.text


class CapabilityFailure(CodeModeError):
    """The handler failed (``capability failed``; an ``AgentError`` message is its approved
    suffix)."""

    text = "capability failed"
    outcome: ClassVar[Literal["capability_failed"]] = "capability_failed"


class Internal(CodeModeError):
    """The host failed (``internal failure``); the detail is in the host log only."""

    text = "internal failure"
    outcome: ClassVar[Literal["internal"]] = "internal"


class AgentError(Exception):
    """Raised by a handler to disclose ``message`` to the model: the client sees ``capability failed:
    <message>`` (non-printables become spaces, at most 256 bytes). Any other exception of a handler
    is ``capability failed`` alone.

    Args:
        message: what the model may read; never a secret or a host path.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def sanitize_disclosure(message: str, limit: int = MAX_DISCLOSED_BYTES) -> str:
    """A message as it may be disclosed: non-printables become spaces; at most ``limit`` UTF-8 bytes,
    cut on a character boundary with ``...`` (the dots count toward the limit).

    Args:
        message: the text to disclose.
        limit: the most UTF-8 bytes of the result.

    Returns:
        The bounded, printable text.
    """
    cleaned = "".join(ch if ch.isprintable() else " " for ch in message)
    encoded = cleaned.encode("utf-8")
    if len(encoded) <= limit:
        return cleaned
    cut = encoded[: limit - 3].decode("utf-8", errors="ignore")
    return cut + "..."


def client_text(err: CodeModeError) -> str:
    """The exact text a client may see (docs/reference/errors.md).

    Args:
        err: any error of this module.

    Returns:
        The coarse text, plus the approved suffix if any (``resource limit exceeded: memory``);
        ``internal failure`` for an :class:`InvalidRegistration` (a host problem).
    """
    if isinstance(err, InvalidRegistration):
        return Internal.text
    if isinstance(err, ResourceLimit):
        return f"{err.text}: {err.kind}" if err.kind in LIMIT_KINDS else err.text
    if err.detail and isinstance(err, InvalidProgram | InvalidArguments | CapabilityFailure | NotFound):
        return f"{err.text}: {err.detail}"
    return err.text
