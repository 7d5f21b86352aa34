"""The store in this process's memory: library use with no data dir, and the reference semantics the
other backends are tested against (tests/integration/test_store.py).

Each method runs to its end without awaiting anything, so on one event loop every operation is atomic
(a claim has one winner). Nothing survives the process. A subject's bounds are checked against
running totals (its expired keys are dropped first, in expiry order), so an operation costs the same
however many keys or records the subject holds.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field

from . import StateConflict, StateEntry, StoreFull, Suspension
from .rules import STATE_BYTES, STATE_KEYS, SUSPENSION_BYTES, SUSPENSIONS, check_texts, expired, state_size

__all__ = ["MemoryStore"]


@dataclass
class _Held:
    record: Suspension
    claimed: bool = False


@dataclass
class _Keys:
    """One subject's state: its entries, their total bytes, and a heap of (expires, key) to drop the
    expired ones in order (an entry replaced since leaves a stale heap item, skipped)."""

    entries: dict[str, StateEntry] = field(default_factory=dict)
    used: int = 0
    last: int = 0  # the last version given (kept while the subject's keys come and go)
    expiring: list[tuple[float, str]] = field(default_factory=list)

    def purge(self, now: float) -> int:
        gone = 0
        while self.expiring and self.expiring[0][0] <= now:
            when, key = heapq.heappop(self.expiring)
            entry = self.entries.get(key)
            if entry is not None and entry.expires == when:
                self.remove(key)
                gone += 1
        return gone

    def remove(self, key: str) -> None:
        entry = self.entries.pop(key)
        self.used -= state_size(key, entry.value)

    def set(self, entry: StateEntry) -> None:
        if entry.key in self.entries:
            self.remove(entry.key)
        self.entries[entry.key] = entry
        self.used += state_size(entry.key, entry.value)
        if entry.expires is not None:
            heapq.heappush(self.expiring, (entry.expires, entry.key))


class MemoryStore:
    """Suspensions and state kept in dicts (see the module's text)."""

    name = "memory"

    def __init__(self) -> None:
        self._suspensions: dict[str, _Held] = {}
        self._pending: dict[str, dict[str, Suspension]] = {}  # by subject, then id
        self._state: dict[str, _Keys] = {}

    # -- suspensions ---------------------------------------------------------------------------

    async def suspend(self, record: Suspension, *, max_records: int, max_bytes: int) -> None:
        """Keep ``record`` as pending (:meth:`codemode.store.Store.suspend`)."""
        check_texts(record.id, record.subject_id, record.source, record.body)
        if record.id in self._suspensions:
            raise ValueError("a suspension with this id exists")
        # a subject's pending records are at most its bound: this scan is short
        mine = self._pending.get(record.subject_id, {})
        live = [r for r in mine.values() if not expired(r.expires, record.created)]
        if len(live) + 1 > max_records:
            raise StoreFull(SUSPENSIONS)
        if sum(r.size for r in live) + record.size > max_bytes:
            raise StoreFull(SUSPENSION_BYTES)
        self._suspensions[record.id] = _Held(record)
        self._pending.setdefault(record.subject_id, {})[record.id] = record

    async def claim(self, record_id: str, subject_id: str, now: float) -> Suspension | None:
        """Take a pending suspension (:meth:`codemode.store.Store.claim`)."""
        held = self._suspensions.get(record_id)
        if (
            held is None
            or held.claimed
            or held.record.subject_id != subject_id
            or expired(held.record.expires, now)
        ):
            return None
        held.claimed = True
        self._unpend(held.record)
        return held.record

    def _unpend(self, record: Suspension) -> None:
        mine = self._pending.get(record.subject_id)
        if mine is not None and mine.pop(record.id, None) is not None and not mine:
            del self._pending[record.subject_id]

    async def drop(self, record_id: str) -> None:
        """Forget a suspension (:meth:`codemode.store.Store.drop`)."""
        held = self._suspensions.pop(record_id, None)
        if held is not None:
            self._unpend(held.record)

    async def expire(self, now: float) -> int:
        """Forget every record whose time has passed (:meth:`codemode.store.Store.expire`)."""
        gone = [i for i, h in self._suspensions.items() if expired(h.record.expires, now)]
        for record_id in gone:
            self._unpend(self._suspensions.pop(record_id).record)
        count = len(gone)
        for keys in self._state.values():
            count += keys.purge(now)
        return count

    async def pending(self, subject_id: str | None = None) -> int:
        """Pending suspensions (:meth:`codemode.store.Store.pending`)."""
        if subject_id is not None:
            return len(self._pending.get(subject_id, {}))
        return sum(len(mine) for mine in self._pending.values())

    # -- state ---------------------------------------------------------------------------------

    async def state_get(self, subject_id: str, key: str, now: float) -> StateEntry | None:
        """The subject's key (:meth:`codemode.store.Store.state_get`)."""
        keys = self._state.get(subject_id)
        entry = keys.entries.get(key) if keys is not None else None
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
        """Set the subject's key (:meth:`codemode.store.Store.state_put`)."""
        check_texts(subject_id, key, value)
        keys = self._state.get(subject_id) or _Keys()
        keys.purge(now)  # expired keys are absent and count for no bound
        old = keys.entries.get(key)
        if expect is not None and expect != (old.version if old is not None else 0):
            raise StateConflict()
        if old is None and len(keys.entries) + 1 > max_keys:
            raise StoreFull(STATE_KEYS)
        used = keys.used - (state_size(key, old.value) if old is not None else 0)
        if used + state_size(key, value) > max_bytes:
            raise StoreFull(STATE_BYTES)
        keys.last += 1
        entry = StateEntry(key, value, keys.last, expires)
        keys.set(entry)
        self._state[subject_id] = keys
        return entry

    async def state_delete(self, subject_id: str, key: str, *, expect: int | None, now: float) -> bool:
        """Remove the subject's key (:meth:`codemode.store.Store.state_delete`)."""
        keys = self._state.get(subject_id)
        entry = keys.entries.get(key) if keys is not None else None
        live = entry if entry is not None and not expired(entry.expires, now) else None
        if expect is not None and expect != (live.version if live is not None else 0):
            raise StateConflict()
        if keys is not None and entry is not None:
            keys.remove(key)
        return live is not None

    async def state_list(
        self, subject_id: str, prefix: str, *, after: str | None, limit: int, now: float
    ) -> list[StateEntry]:
        """The subject's keys (:meth:`codemode.store.Store.state_list`)."""
        held = self._state.get(subject_id)
        if held is None or limit <= 0:
            return []
        keys = sorted(
            k
            for k, e in held.entries.items()
            if k.startswith(prefix) and (after is None or k > after) and not expired(e.expires, now)
        )
        return [dataclasses.replace(held.entries[k]) for k in keys[:limit]]

    # -- life ----------------------------------------------------------------------------------

    async def check(self) -> None:
        """Readiness: memory always answers."""

    async def aclose(self) -> None:
        """Nothing to release (the records stay until the object goes)."""
