"""Authorization (docs/reference/authorization.md): who is calling, and may this bound call run.

Every native call is authorized on the host, for the trusted subject, after the host has rebound the
arguments itself, and before the handler runs. An authorizer *returns normally to allow*; it raises
:class:`Denied` (or a subclass) for a recognized denial (the client sees ``permission denied``); any
other exception is an authorization policy failure (the client sees ``authorization policy
failure``). The handler runs in neither case. It raises :class:`AskUser` to let the user decide.

The subject is trusted: the host resolves it through authentication, and multi-user hosts pass it
through :func:`with_subject` / :func:`current_subject` (a :mod:`contextvars` variable, so every
asyncio task and thread sees the subject of its own request). Nothing the client or the worker sends
can set or replace it.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..common.passed import passed_as

__all__ = [
    "AskUser",
    "AuthorizationInput",
    "Authorizer",
    "Denied",
    "PolicyError",
    "Subject",
    "allow_all",
    "current_subject",
    "run_authorizer",
    "with_subject",
]


@passed_as("subject")  # a capability function's parameter annotated Subject receives the caller
@dataclass(frozen=True, slots=True)
class Subject:
    """The caller, as resolved by the host's authentication: a stable, non-secret ``id``.

    Never put a credential here: the subject is passed to handlers and to the authorizer, and may be
    logged. An empty id is representable, but resolvers treat it as ``unauthenticated``.
    """

    id: str

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise TypeError(f"Subject.id must be str, got {type(self.id).__name__}")


@dataclass(frozen=True, slots=True)
class AuthorizationInput:
    """What an authorizer decides on: ``subject`` (the trusted caller), ``capability_id`` (the stable
    id) and ``capability_name`` (the dotted name), and ``arguments`` (the host's canonical,
    JSON-shaped argument map, a fresh copy for every call)."""

    subject: Subject
    capability_id: str
    capability_name: str
    arguments: dict[str, Any]


class Denied(Exception):
    """A recognized denial. Subclass it for richer denials; the message is for host logs only."""


class AskUser(Exception):
    """The policy lets the user decide: the host asks the user through the client (an MCP
    elicitation) and runs the call only on an explicit accept. Declining, cancelling, not answering
    in time, or a client that cannot be asked all deny it (docs/reference/authorization.md,
    "Asking the user"). The message is for host logs only."""


class PolicyError(Exception):
    """The policy could not produce a decision (undefined, non-boolean, evaluation error, deadline).

    The host maps it, like any non-:class:`Denied` exception, to ``authorization policy failure``; the
    message is for host logs only.
    """


@runtime_checkable
class Authorizer(Protocol):
    """One method, sync or async. Return normally (``None``) to allow; raise :class:`Denied` to deny.

    ``ctx`` is the host's call context (it has ``deadline``, a :func:`time.monotonic` timestamp in
    seconds, and ``cancelled``, an event). Sync authorizers run directly on the event loop and must be
    fast; slow ones should be async (or offload their work, as the Rego adapter does).
    """

    def authorize(self, ctx: Any, input: AuthorizationInput) -> Awaitable[None] | None:
        """Decide one bound call: return to allow, raise to deny.

        Args:
            ctx: the host's call context (``deadline``, ``cancelled``).
            input: the subject, the capability's id and name, and the bound arguments.

        Returns:
            None (or an awaitable of None, for an async authorizer): the call is allowed.

        Raises:
            Denied: the call is not allowed (``permission denied``).
            AskUser: the user decides (docs/reference/authorization.md, "Asking the user").
            PolicyError: the policy could not decide (``authorization policy failure``).
        """
        ...


class _AllowAll:
    __slots__ = ()

    def authorize(self, ctx: Any, input: AuthorizationInput) -> None:
        return None

    def __repr__(self) -> str:
        return "allow_all()"


_ALLOW_ALL = _AllowAll()


def allow_all() -> Authorizer:
    """The explicit choice to allow every bound call of every resolved subject (there is no implicit
    allow: a server without an authorizer does not build).

    Returns:
        An authorizer that allows everything.
    """
    return _ALLOW_ALL


async def run_authorizer(authorizer: Authorizer, ctx: Any, input: AuthorizationInput) -> None:
    """Call ``authorizer.authorize(ctx, input)`` and await the result if it is awaitable.

    A sync authorizer runs directly, on the calling thread (the event loop): it is expected to be fast.
    Whatever it raises propagates unchanged (:class:`Denied` → denial; anything else → policy failure).

    Fail-closed: the only allowing outcome is a normal return of ``None``. An authorizer that returns
    a value (``False``, ``True``, a string, …) is a programming error that could otherwise read as an
    allow, so it raises :class:`PolicyError`.

    Args:
        authorizer: the authorizer.
        ctx: the host's call context.
        input: what it decides on.

    Raises:
        PolicyError: it returned something other than None.
    """
    result: object = authorizer.authorize(ctx, input)
    if inspect.isawaitable(result):
        result = await result
    if result is not None:
        raise PolicyError(
            f"authorizer returned {type(result).__name__}; return None to allow or raise Denied to deny"
        )


_current_subject: contextvars.ContextVar[Subject | None] = contextvars.ContextVar(
    "codemode_authz_subject", default=None
)


@contextmanager
def with_subject(subject: Subject) -> Iterator[Subject]:
    """Make ``subject`` the current subject for the enclosed block (and every task or context copied
    from it). Nesting restores the outer subject on exit. For authentication middleware only.

    Args:
        subject: the authenticated subject.

    Yields:
        ``subject``, current inside the block.

    Raises:
        TypeError: ``subject`` is not a :class:`Subject`.
    """
    if not isinstance(subject, Subject):
        raise TypeError(f"with_subject needs a Subject, got {type(subject).__name__}")
    token = _current_subject.set(subject)
    try:
        yield subject
    finally:
        _current_subject.reset(token)


def current_subject() -> Subject | None:
    """The subject of the innermost enclosing :func:`with_subject`.

    Returns:
        That subject, or None outside every such block.
    """
    return _current_subject.get()
