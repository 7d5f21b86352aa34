"""Durable records the host keeps between requests: suspended executes and the state pack's keys
(docs/reference/authorization.md#asking-the-user; SECURITY.md, "What the host stores").

One interface, :class:`Store`, with two facets:

- **suspensions** (:class:`Suspension`): an execute that waits for a person holds no worker, no
  sandbox and no slot, only this record. A resume claims it atomically (:meth:`Store.claim`: one
  winner across replicas), then replays the program against its call log.
- **state** (:class:`StateEntry`): the ``state`` pack's per-subject keys, with versions for
  compare-and-set and an optional expiry.

Every text a record holds (the source, the limits, each call's arguments and result) is stored as the
exact JSON text the host produced, never re-encoded by the database (PostgreSQL ``jsonb`` reorders
keys, and a replayed program that loops over a result would diverge).

Implementations: :class:`codemode.store.memory.MemoryStore` (library use with no data dir),
:class:`codemode.store.sqlite.SqliteStore` (one host: a file in the data dir, mode 0600) and
:class:`codemode.store.postgres.PostgresStore` (replicas that share suspensions and state).

A store that cannot answer raises :class:`StoreUnavailable`: an "ask" then declines (fail closed),
a state call fails as ``internal failure``, and ``/readyz`` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "StateConflict",
    "StateEntry",
    "Store",
    "StoreFull",
    "StoreUnavailable",
    "Suspension",
]


# A text no backend can keep exactly (U+0000, a lone surrogate) is refused with ValueError when
# written (suspend, state_put) and found absent when looked up (codemode.store.rules).


class StoreUnavailable(Exception):
    """The store could not answer (unreachable, refused, too slow); the message is for the host log
    only."""


class StoreFull(Exception):
    """A per-subject bound of the store was reached.

    Attributes:
        kind: the limit's kind, as docs/reference/limits.md names it (e.g. ``suspensions``,
            ``suspension bytes``, ``state keys``, ``state bytes``).
    """

    def __init__(self, kind: str) -> None:
        """The bound ``kind`` was reached.

        Args:
            kind: the limit's kind.
        """
        super().__init__(kind)
        self.kind = kind


class StateConflict(Exception):
    """A compare-and-set ``put`` or ``delete`` found another version than the one expected."""


@dataclass(frozen=True)
class Suspension:
    """One suspended execute: everything a resume needs to replay it, and nothing else.

    Attributes:
        id: the record's id (random, at least 128 bits; the ``request_state`` names it, signed).
        subject_id: the trusted subject the execute ran for; only that subject can resume it.
        created: when it was suspended (seconds since the epoch).
        expires: when it ends as declined if nobody answered (seconds since the epoch).
        source: the program's text, exactly as sent.
        body: the rest, as one JSON text the suspension module writes and reads (limits, budgets
            spent so far, the catalog fingerprint and versions, the call log, the pending call).
    """

    id: str
    subject_id: str
    created: float
    expires: float
    source: str
    body: str

    @property
    def size(self) -> int:
        """UTF-8 bytes of the record's texts (what the per-subject byte bound counts)."""
        return len(self.source.encode("utf-8")) + len(self.body.encode("utf-8"))


@dataclass(frozen=True)
class StateEntry:
    """One key of the state pack.

    Attributes:
        key: the key (the namespace is the subject, never part of the key).
        value: the value's exact JSON text.
        version: the subject's puts never give one twice: every put of the key gives a higher one,
            and a key deleted or expired and made again gets a new one, never an earlier one back,
            so a compare-and-set by a reader that saw the old key fails (ABA). 1 for the
            subject's first put; the subject's puts of other keys take numbers in between.
        expires: when the key goes (seconds since the epoch), or None.
    """

    key: str
    value: str
    version: int
    expires: float | None = None


@runtime_checkable
class Store(Protocol):
    """Suspensions and state, per subject, with per-subject bounds."""

    #: Names the store in log lines and ``/readyz`` (``memory``, ``sqlite``, ``postgres``).
    name: str

    # -- suspensions -------------------------------------------------------------------------
    async def suspend(self, record: Suspension, *, max_records: int, max_bytes: int) -> None:
        """Keep ``record`` as pending.

        Args:
            record: the suspension (its id is new).
            max_records: pending suspensions its subject may have (this one included).
            max_bytes: bytes (:attr:`Suspension.size`) its subject's pending suspensions may hold.

        Raises:
            StoreFull: a bound was reached (kind ``suspensions`` or ``suspension bytes``).
            StoreUnavailable: the store could not answer.
            ValueError: the id is taken, or a text holds U+0000 or a lone surrogate
                (:mod:`codemode.store.rules`).
        """
        ...

    async def claim(self, record_id: str, subject_id: str, now: float) -> Suspension | None:
        """Take a pending suspension to resume it: atomically, so one caller wins across replicas.

        Args:
            record_id: the id the ``request_state`` named.
            subject_id: the subject asking; a record of another subject is not found.
            now: the time; an expired record is not found.

        Returns:
            The record, no longer pending (a second claim finds nothing), or None.

        Raises:
            StoreUnavailable: the store could not answer.
        """
        ...

    async def drop(self, record_id: str) -> None:
        """Forget a suspension (declined, finished, expired); nothing of it stays.

        Args:
            record_id: the record's id (an unknown id is ignored).

        Raises:
            StoreUnavailable: the store could not answer.
        """
        ...

    async def expire(self, now: float) -> int:
        """Forget every suspension and state key whose time has passed.

        Args:
            now: the time.

        Returns:
            How many records went.

        Raises:
            StoreUnavailable: the store could not answer.
        """
        ...

    async def pending(self, subject_id: str | None = None) -> int:
        """Pending suspensions, of one subject or of all.

        Args:
            subject_id: the subject, or None: every subject.

        Returns:
            How many (claimed records are not pending).

        Raises:
            StoreUnavailable: the store could not answer.
        """
        ...

    # -- state -------------------------------------------------------------------------------
    async def state_get(self, subject_id: str, key: str, now: float) -> StateEntry | None:
        """The subject's key, or None (absent or expired).

        Args:
            subject_id: the subject (the namespace).
            key: the key.
            now: the time; a key whose ``expires`` is not after it is absent.

        Returns:
            The entry, or None.

        Raises:
            StoreUnavailable: the store could not answer.
        """
        ...

    async def state_put(
        self,
        subject_id: str,
        key: str,
        value: str,
        *,
        expect: int | None,
        expires: float | None,
        now: float,
        max_keys: int,
        max_bytes: int,
    ) -> StateEntry:
        """Set the subject's key; with ``expect``, only if its version is that (0: absent).

        Args:
            subject_id: the subject (the namespace).
            key: the key.
            value: the value's exact JSON text.
            expect: the version the key must have (0: absent or expired; None: any).
            expires: when the key goes (seconds since the epoch; None: never).
            now: the time (expired keys are absent and count for no bound).
            max_keys: keys the subject may have (this one included).
            max_bytes: UTF-8 bytes of keys and values the subject's keys may hold (this one's new
                value included, its old one not).

        Returns:
            The new entry (its version: the subject's next, never given before).

        Raises:
            StateConflict: ``expect`` did not match.
            StoreFull: a bound was reached (kind ``state keys`` or ``state bytes``).
            StoreUnavailable: the store could not answer.
            ValueError: a text holds U+0000 or a lone surrogate (:mod:`codemode.store.rules`).
        """
        ...

    async def state_delete(self, subject_id: str, key: str, *, expect: int | None, now: float) -> bool:
        """Remove the subject's key; True if it was there.

        Args:
            subject_id: the subject (the namespace).
            key: the key.
            expect: the version the key must have (0: absent; None: any).
            now: the time.

        Returns:
            True if the key was there (and not expired).

        Raises:
            StateConflict: ``expect`` did not match.
            StoreUnavailable: the store could not answer.
        """
        ...

    async def state_list(
        self, subject_id: str, prefix: str, *, after: str | None, limit: int, now: float
    ) -> list[StateEntry]:
        """The subject's keys starting with ``prefix``, in key order, after ``after``, at most
        ``limit``.

        Args:
            subject_id: the subject (the namespace).
            prefix: the keys' common start (plain text, not a pattern).
            after: only keys after this one (the last key of the previous page; None: from the first).
            limit: at most this many entries.
            now: the time (expired keys are left out).

        Returns:
            The entries, in code point order of their keys.

        Raises:
            StoreUnavailable: the store could not answer.
        """
        ...

    # -- life --------------------------------------------------------------------------------
    async def check(self) -> None:
        """Readiness: answers, or raises :class:`StoreUnavailable`."""
        ...

    async def aclose(self) -> None:
        """Release connections and files."""
        ...
