"""Where the per-subject quota is counted (docs/service.md, "Several replicas: a shared quota").

``subject_quota`` bounds the executes one subject has in flight. :class:`LocalQuota` counts them
in this process (each replica on its own: two replicas admit twice the quota); a shared store
(:class:`codemode.execution.quota_kubernetes.KubernetesQuota`) counts them for the service as a
whole. Either hands out a :class:`Hold` per admitted execute, given back with
:meth:`QuotaStore.release` when the execute ends.

A store that cannot answer raises :class:`QuotaUnavailable`: the execute fails closed (``internal
failure``, docs/reference/errors.md) and the host logs why, naming the setting. A store may also have
``async check()`` (raising :class:`QuotaUnavailable`); the HTTP service's ``/readyz`` calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Hold", "LocalQuota", "QuotaStore", "QuotaUnavailable"]


class QuotaUnavailable(Exception):
    """The quota store could not answer in time (unreachable, refused, too slow); the message is
    for the host log only."""


@dataclass(frozen=True, eq=False)
class Hold:
    """One admitted execute, counted against its subject until released.

    Attributes:
        subject_id: the subject it counts for.
        elsewhere: the subject's executes in flight on other replicas when it was admitted (0 for
            a local store): fair slots treat a subject busy elsewhere as one that holds slots.
        key: the store's own handle of the hold.
    """

    subject_id: str
    elsewhere: int = 0
    key: object = None


@runtime_checkable
class QuotaStore(Protocol):
    """Counts each subject's executes in flight against ``subject_quota``."""

    #: Names the store in log lines (``local``, ``kubernetes``).
    name: str

    async def acquire(self, subject_id: str, quota: int) -> Hold | None:
        """Count one more execute of ``subject_id``, unless it already has ``quota`` in flight.

        Args:
            subject_id: the subject.
            quota: the executes it may have in flight (at least 1).

        Returns:
            The hold, or None: the subject is at its quota.

        Raises:
            QuotaUnavailable: the store could not answer (fail closed).
        """
        ...

    def release(self, hold: Hold) -> None:
        """Give ``hold`` back (at once for the caller; a shared store writes in the background and,
        should that fail, the hold expires on its own).

        Args:
            hold: a hold :meth:`acquire` returned, released once.
        """
        ...


class LocalQuota:
    """The quota counted in this process alone (the default; each replica counts its own)."""

    name = "local"

    def __init__(self) -> None:
        self.active: dict[str, int] = {}

    async def acquire(self, subject_id: str, quota: int) -> Hold | None:
        """Count one more execute of ``subject_id``, unless it already has ``quota`` in flight.

        Args:
            subject_id: the subject.
            quota: the executes it may have in flight (at least 1).

        Returns:
            The hold, or None: the subject is at its quota.
        """
        held = self.active.get(subject_id, 0)
        if held >= quota:
            return None
        self.active[subject_id] = held + 1
        return Hold(subject_id)

    async def check(self) -> None:
        """Readiness: counted in this process, it always answers."""

    def release(self, hold: Hold) -> None:
        """Give ``hold`` back.

        Args:
            hold: a hold :meth:`acquire` returned, released once.
        """
        left = self.active[hold.subject_id] - 1
        if left:
            self.active[hold.subject_id] = left
        else:
            del self.active[hold.subject_id]
