"""The store in this process's memory: library use with no data dir, and the reference semantics the
other backends are tested against (tests/integration/test_store.py).

Each method runs to its end without awaiting anything, so on one event loop every operation is atomic
(a claim has one winner). Nothing survives the process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from . import StateConflict, StateEntry, StoreFull, Suspension
from .rules import STATE_BYTES, STATE_KEYS, SUSPENSION_BYTES, SUSPENSIONS, check_texts, expired, state_size

__all__ = ["MemoryStore"]


@dataclass
class _Held:
    record: Suspension
    claimed: bool = False


class MemoryStore:
    """Suspensions and state kept in dicts (see the module's text)."""

    name = "memory"

    def __init__(self) -> None:
        self._suspensions: dict[str, _Held] = {}
        self._state: dict[str, dict[str, StateEntry]] = {}

    # -- suspensions ---------------------------------------------------------------------------

    async def suspend(self, record: Suspension, *, max_records: int, max_bytes: int) -> None:
        """Keep ``record`` as pending (:meth:`codemode.store.Store.suspend`).

        Args:
            record: the suspension (its id is new).
            max_records: pending suspensions its subject may have (this one included).
            max_bytes: bytes its subject's pending suspensions may hold.

        Raises:
            StoreFull: kind ``suspensions`` or ``suspension bytes``.
            ValueError: the id is taken, or a text holds U+0000 or a lone surrogate.
        """
        check_texts(record.id, record.subject_id, record.source, record.body)
        if record.id in self._suspensions:
            raise ValueError("a suspension with this id exists")
        live = [
            h.record
            for h in self._suspensions.values()
            if h.record.subject_id == record.subject_id
            and not h.claimed
            and not expired(h.record.expires, record.created)
        ]
        if len(live) + 1 > max_records:
            raise StoreFull(SUSPENSIONS)
        if sum(r.size for r in live) + record.size > max_bytes:
            raise StoreFull(SUSPENSION_BYTES)
        self._suspensions[record.id] = _Held(record)

    async def claim(self, record_id: str, subject_id: str, now: float) -> Suspension | None:
        """Take a pending suspension (:meth:`codemode.store.Store.claim`).

        Args:
            record_id: the id.
            subject_id: the subject asking.
            now: the time.

        Returns:
            The record, or None (absent, another subject's, expired or claimed).
        """
        held = self._suspensions.get(record_id)
        if (
            held is None
            or held.claimed
            or held.record.subject_id != subject_id
            or expired(held.record.expires, now)
        ):
            return None
        held.claimed = True
        return held.record

    async def drop(self, record_id: str) -> None:
        """Forget a suspension (:meth:`codemode.store.Store.drop`).

        Args:
            record_id: the id (unknown ids are ignored).
        """
        self._suspensions.pop(record_id, None)

    async def expire(self, now: float) -> int:
        """Forget every record whose time has passed (:meth:`codemode.store.Store.expire`).

        Args:
            now: the time.

        Returns:
            How many records went.
        """
        gone = [i for i, h in self._suspensions.items() if expired(h.record.expires, now)]
        for record_id in gone:
            del self._suspensions[record_id]
        count = len(gone)
        for subject_id, keys in list(self._state.items()):
            stale = [k for k, e in keys.items() if expired(e.expires, now)]
            for key in stale:
                del keys[key]
            count += len(stale)
            if not keys:
                del self._state[subject_id]
        return count

    async def pending(self, subject_id: str | None = None) -> int:
        """Pending suspensions (:meth:`codemode.store.Store.pending`).

        Args:
            subject_id: one subject's, or None: all.

        Returns:
            How many.
        """
        return sum(
            1
            for h in self._suspensions.values()
            if not h.claimed and (subject_id is None or h.record.subject_id == subject_id)
        )

    # -- state ---------------------------------------------------------------------------------

    def _live(self, subject_id: str, now: float) -> dict[str, StateEntry]:
        return {k: e for k, e in self._state.get(subject_id, {}).items() if not expired(e.expires, now)}

    async def state_get(self, subject_id: str, key: str, now: float) -> StateEntry | None:
        """The subject's key (:meth:`codemode.store.Store.state_get`).

        Args:
            subject_id: the subject.
            key: the key.
            now: the time.

        Returns:
            The entry, or None (absent or expired).
        """
        entry = self._state.get(subject_id, {}).get(key)
        return None if entry is None or expired(entry.expires, now) else entry

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
        """Set the subject's key (:meth:`codemode.store.Store.state_put`).

        Args:
            subject_id: the subject.
            key: the key.
            value: the value's JSON text.
            expect: the version it must have (0: absent; None: any).
            expires: when it goes (None: never).
            now: the time.
            max_keys: keys the subject may have.
            max_bytes: bytes (keys and values) the subject's keys may hold.

        Returns:
            The new entry.

        Raises:
            StateConflict: ``expect`` did not match.
            StoreFull: kind ``state keys`` or ``state bytes``.
            ValueError: a text holds U+0000 or a lone surrogate.
        """
        check_texts(subject_id, key, value)
        live = self._live(subject_id, now)
        old = live.get(key)
        if expect is not None and expect != (old.version if old is not None else 0):
            raise StateConflict()
        if old is None and len(live) + 1 > max_keys:
            raise StoreFull(STATE_KEYS)
        used = sum(state_size(k, e.value) for k, e in live.items() if k != key)
        if used + state_size(key, value) > max_bytes:
            raise StoreFull(STATE_BYTES)
        entry = StateEntry(key, value, old.version + 1 if old is not None else 1, expires)
        self._state.setdefault(subject_id, {})[key] = entry
        return entry

    async def state_delete(self, subject_id: str, key: str, *, expect: int | None, now: float) -> bool:
        """Remove the subject's key (:meth:`codemode.store.Store.state_delete`).

        Args:
            subject_id: the subject.
            key: the key.
            expect: the version it must have (0: absent; None: any).
            now: the time.

        Returns:
            True if it was there.

        Raises:
            StateConflict: ``expect`` did not match.
        """
        keys = self._state.get(subject_id, {})
        entry = keys.get(key)
        live = entry if entry is not None and not expired(entry.expires, now) else None
        if expect is not None and expect != (live.version if live is not None else 0):
            raise StateConflict()
        if entry is not None:
            del keys[key]
            if not keys:
                del self._state[subject_id]
        return live is not None

    async def state_list(
        self, subject_id: str, prefix: str, *, after: str | None, limit: int, now: float
    ) -> list[StateEntry]:
        """The subject's keys (:meth:`codemode.store.Store.state_list`).

        Args:
            subject_id: the subject.
            prefix: the keys' common start.
            after: only keys after this one (None: from the first).
            limit: at most this many.
            now: the time.

        Returns:
            The entries, in key order (code points).
        """
        keys = sorted(
            k for k in self._live(subject_id, now) if k.startswith(prefix) and (after is None or k > after)
        )
        entries = self._state[subject_id] if keys else {}
        return [dataclasses.replace(entries[k]) for k in keys[: max(limit, 0)]]

    # -- life ----------------------------------------------------------------------------------

    async def check(self) -> None:
        """Readiness: memory always answers."""

    async def aclose(self) -> None:
        """Nothing to release (the records stay until the object goes)."""
