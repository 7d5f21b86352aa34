"""The ``state`` pack: keys a subject keeps between executes.

Load it with ``--pack codemode_capabilities.state:pack``. Four capabilities, ``state.get``,
``state.put``, ``state.delete`` and ``state.list`` (their calls, errors and bounds:
docs/packs.md, "The state pack"). The keys live in the server's store (``ctx.store``, the
``store`` setting: SQLite in the data dir, memory without one, PostgreSQL shared by replicas),
namespaced by the trusted subject the host passes each handler, never by an argument: a key is
plain text inside that namespace, so no key, prefix or cursor reaches another subject's keys.

Values are JSON-shaped (the ``json`` type). ``put`` and ``delete`` take an optional ``expect``
version (compare-and-set; 0: the key is absent); a mismatch fails with ``capability failed: version
conflict``, which ``attempt`` catches. The per-subject bounds, the limits ``max_state_keys`` and
``max_state_bytes`` (``ctx.limits``), end the execute with ``resource limit exceeded: state keys``
or ``state bytes``; a store that cannot answer ends it with
``internal failure`` (the host log says why).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from codemode import AgentError, CallContext, Capability, InvalidArguments, Limits, ResourceLimit
from codemode.authz import Subject
from codemode.packs import PackSettings, StateConflict, Store

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "MAX_KEY_BYTES",
    "MAX_LIST_LIMIT",
    "MAX_TTL",
    "VERSION_CONFLICT",
    "DeleteInput",
    "DeleteOutput",
    "Entry",
    "GetInput",
    "GetOutput",
    "ListInput",
    "ListOutput",
    "PutInput",
    "PutOutput",
    "StateHandlers",
    "StatePack",
    "capabilities",
    "pack",
]

#: A key's length in UTF-8 bytes (1 to this).
MAX_KEY_BYTES = 256
#: ``ttl``'s bound in seconds (30 days).
MAX_TTL = 30 * 24 * 3600
#: ``state.list``'s ``limit``: when omitted, and at most.
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 100
#: The ``AgentError`` text of a compare-and-set that found another version.
VERSION_CONFLICT = "version conflict"
#: The most bytes a ``state.get`` result adds around its value's JSON text (the largest version).
_GET_BYTES = len('{"found":true,"value":,"version":9223372036854775807}')


@dataclass
class GetInput:
    """``state.get``'s arguments.

    Attributes:
        key: the key (1 to 256 UTF-8 bytes).
    """

    key: str


@dataclass
class GetOutput:
    """``state.get``'s result.

    Attributes:
        found: whether the key is there (an expired key is not).
        value: its value (None when not found).
        version: its version (0 when not found: ``put(expect=0)`` creates only if absent).
    """

    found: bool
    value: Any
    version: int


@dataclass
class PutInput:
    """``state.put``'s arguments.

    Attributes:
        key: the key (1 to 256 UTF-8 bytes).
        value: any JSON-shaped value (None, bool, int, float, str, lists and dicts of those).
        expect: set only if the key's version is this (0: only if absent); omitted: always.
        ttl: seconds until the key goes (1 to 2,592,000); omitted: it stays.
    """

    key: str
    value: Any
    expect: int | None = None
    ttl: int | None = None


@dataclass
class PutOutput:
    """``state.put``'s result.

    Attributes:
        version: the key's new version.
    """

    version: int


@dataclass
class DeleteInput:
    """``state.delete``'s arguments.

    Attributes:
        key: the key.
        expect: delete only if the key's version is this (0: only if absent); omitted: always.
    """

    key: str
    expect: int | None = None


@dataclass
class DeleteOutput:
    """``state.delete``'s result.

    Attributes:
        deleted: whether the key was there.
    """

    deleted: bool


@dataclass
class ListInput:
    """``state.list``'s arguments.

    Attributes:
        prefix: the keys' common start (plain text; "" lists every key).
        after: the previous page's ``next`` (only keys after it).
        limit: keys per page, 1 to 100 (default 50).
    """

    prefix: str = ""
    after: str | None = None
    limit: int | None = None


@dataclass
class Entry:
    """One key of a ``state.list`` page.

    Attributes:
        key: the key.
        version: its version.
    """

    key: str
    version: int


@dataclass
class ListOutput:
    """``state.list``'s result.

    Attributes:
        keys: the page's keys in code point order, with their versions.
        next: pass as ``after`` for the next page; None when this page is the last.
    """

    keys: list[Entry]
    next: str | None


def _key(name: str, key: str, *, empty: bool = False) -> str:
    """``key`` if it is a key the store can keep exactly, else ``invalid capability arguments``."""
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArguments(f'argument "{name}" must be valid Unicode text') from None
    if "\x00" in key:
        raise InvalidArguments(f'argument "{name}" must not contain U+0000')
    if (size == 0 and not empty) or size > MAX_KEY_BYTES:
        raise InvalidArguments(f'argument "{name}" must be 1 to {MAX_KEY_BYTES} UTF-8 bytes')
    return key


def _store(ctx: CallContext) -> Store:
    if ctx.store is None:
        raise RuntimeError("the state pack runs only inside an execute (ctx.store is None)")
    return ctx.store


def _limits(ctx: CallContext) -> Limits:
    return ctx.limits if ctx.limits is not None else Limits()


def _depth(value: Any) -> int:
    """The nesting depth of a JSON-shaped value as the value limits count it (a scalar: 1)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            todo.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            todo.extend((child, depth + 1) for child in item)
    return deepest


def _readable(value: Any, text: str, limits: Limits) -> None:
    """Refuse a value whose ``state.get`` result would not fit the value limits (that result wraps it
    one level deeper and in more bytes than ``put``'s arguments): stored, it could never be read."""
    if (
        len(text.encode("utf-8")) + _GET_BYTES > limits.max_value_bytes
        or _depth(value) + 1 > limits.max_value_depth
    ):
        raise ResourceLimit("value size")


def _expect(expect: int | None) -> int | None:
    if expect is not None and expect < 0:
        raise InvalidArguments('argument "expect" must be 0 or more')
    return expect


class StateHandlers:
    """The four handlers: the store and the per-subject bounds come with each call's context
    (``ctx.store``, ``ctx.limits.max_state_keys`` and ``max_state_bytes``)."""

    async def get(self, ctx: CallContext, subject: Subject, args: GetInput) -> GetOutput:
        """``state.get``.

        Args:
            ctx: the call's context (its store).
            subject: the trusted subject (the namespace).
            args: the key.

        Returns:
            The value and version, or ``found: False`` with version 0.

        Raises:
            InvalidArguments: a key out of bounds.
        """
        entry = await _store(ctx).state_get(subject.id, _key("key", args.key), time.time())
        if entry is None:
            return GetOutput(found=False, value=None, version=0)
        return GetOutput(found=True, value=json.loads(entry.value), version=entry.version)

    async def put(self, ctx: CallContext, subject: Subject, args: PutInput) -> PutOutput:
        """``state.put``.

        Args:
            ctx: the call's context (its store).
            subject: the trusted subject (the namespace).
            args: the key, value, optional expected version and TTL.

        Returns:
            The new version.

        Raises:
            AgentError: ``version conflict``.
            InvalidArguments: a key, ``ttl`` or ``expect`` out of bounds, or a value no store keeps.
            ResourceLimit: ``value size``: the value's ``state.get`` result would not fit the value
                limits.
        """
        key = _key("key", args.key)
        if args.ttl is not None and not 1 <= args.ttl <= MAX_TTL:
            raise InvalidArguments(f'argument "ttl" must be 1 to {MAX_TTL} seconds')
        text = json.dumps(args.value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        now = time.time()
        limits = _limits(ctx)
        _readable(args.value, text, limits)
        try:
            entry = await _store(ctx).state_put(
                subject.id,
                key,
                text,
                expect=_expect(args.expect),
                expires=None if args.ttl is None else now + args.ttl,
                now=now,
                max_keys=limits.max_state_keys,
                max_bytes=limits.max_state_bytes,
            )
        except StateConflict:
            raise AgentError(VERSION_CONFLICT) from None
        except ValueError:  # a text no backend keeps exactly (a lone surrogate in the value)
            raise InvalidArguments('argument "value" must be valid Unicode text') from None
        return PutOutput(version=entry.version)

    async def delete(self, ctx: CallContext, subject: Subject, args: DeleteInput) -> DeleteOutput:
        """``state.delete``.

        Args:
            ctx: the call's context (its store).
            subject: the trusted subject (the namespace).
            args: the key and optional expected version.

        Returns:
            Whether the key was there.

        Raises:
            AgentError: ``version conflict``.
            InvalidArguments: a key or ``expect`` out of bounds.
        """
        key = _key("key", args.key)
        try:
            gone = await _store(ctx).state_delete(
                subject.id, key, expect=_expect(args.expect), now=time.time()
            )
        except StateConflict:
            raise AgentError(VERSION_CONFLICT) from None
        return DeleteOutput(deleted=gone)

    async def list(self, ctx: CallContext, subject: Subject, args: ListInput) -> ListOutput:
        """``state.list``.

        Args:
            ctx: the call's context (its store).
            subject: the trusted subject (the namespace).
            args: the prefix, cursor and page size.

        Returns:
            One page of keys and versions, and the cursor of the next.

        Raises:
            InvalidArguments: a prefix, cursor or ``limit`` out of bounds.
        """
        prefix = _key("prefix", args.prefix, empty=True)
        after = None if args.after is None else _key("after", args.after)
        limit = DEFAULT_LIST_LIMIT if args.limit is None else args.limit
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidArguments(f'argument "limit" must be 1 to {MAX_LIST_LIMIT}')
        entries = await _store(ctx).state_list(
            subject.id, prefix, after=after, limit=limit + 1, now=time.time()
        )
        page = [Entry(key=e.key, version=e.version) for e in entries[:limit]]
        return ListOutput(keys=page, next=page[-1].key if len(entries) > limit else None)


def capabilities() -> list[Capability]:
    """The four capabilities (what ``pack`` gives; ``Builder.register(*capabilities())``).

    Returns:
        ``state.get``, ``put``, ``delete`` and ``list``.
    """
    h = StateHandlers()
    mine = "Keys are yours alone: no other caller sees them."
    return [
        Capability(
            id="state.key.get",
            name="state.get",
            summary="Read a value you stored in an earlier run, with its version.",
            description=(
                "Returns {found, value, version}. A key that is absent or expired gives found=False, "
                "value=None, version=0. Pass the version to state.put(expect=...) to change the key "
                f"only if nobody changed it since. {mine}"
            ),
            search_terms=["load saved value", "remember", "memory", "kv lookup", "persisted data"],
            handler=h.get,
        ),
        Capability(
            id="state.key.put",
            name="state.put",
            summary="Store a JSON value under a key for later runs; optional compare-and-set and TTL.",
            description=(
                f"key: 1-{MAX_KEY_BYTES} UTF-8 bytes. value: any JSON-shaped value. expect: store only "
                "if the key's version is this (0: only if the key is absent); otherwise the call fails "
                f'with "{VERSION_CONFLICT}" (attempt() catches it: read again and retry). ttl: seconds '
                f"until the key goes (1-{MAX_TTL}). Returns the new version. {mine}"
            ),
            search_terms=["save value", "remember", "persist", "kv store", "compare and set"],
            handler=h.put,
        ),
        Capability(
            id="state.key.delete",
            name="state.delete",
            summary="Remove one of your stored keys; optional compare-and-set.",
            description=(
                "Returns {deleted}: whether the key was there. expect: delete only if the key's "
                f'version is this, otherwise the call fails with "{VERSION_CONFLICT}".'
            ),
            search_terms=["forget value", "remove key", "clear saved"],
            handler=h.delete,
        ),
        Capability(
            id="state.key.list",
            name="state.list",
            summary="List your stored keys starting with a prefix, one page at a time.",
            description=(
                "Returns {keys: [{key, version}], next} in code point order of the keys. prefix: plain "
                f'text ("" lists all). limit: 1-{MAX_LIST_LIMIT}, default {DEFAULT_LIST_LIMIT}. When '
                "next is not None, pass it as after= for the next page."
            ),
            search_terms=["list saved keys", "browse state", "enumerate memory"],
            handler=h.list,
        ),
    ]


class StatePack:
    """The pack object. It takes no options: its keys live in the server's store (the ``store``
    setting) and its bounds are the server's limits ``max_state_keys`` and ``max_state_bytes``."""

    def capabilities(self, settings: PackSettings) -> list[Capability]:
        """The four capabilities.

        Args:
            settings: the host's pack settings (not used: the store and limits are the server's).

        Returns:
            ``state.get``, ``put``, ``delete`` and ``list``.
        """
        return capabilities()


pack = StatePack()
