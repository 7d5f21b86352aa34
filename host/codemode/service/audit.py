"""The audit log: one JSON line per native call decision and per execute; refused requests are
summarised per client address (:mod:`codemode.service.refusals`).

Logger ``codemode.audit``, level INFO; each record's message is one compact JSON object. Fields are
ids, names, decisions, outcomes and durations only: never argument values, results, program source,
tokens or any other credential. Subject ids are the non-secret ids authentication resolved. The
``native_call`` lines of one execute are, in order, its call ledger
(``codemode.common.outcomes.AUDIT_OUTCOMES`` maps their ``decision``/``outcome`` to its words).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from ..execution.observe import CallEvent, ExecuteEvent

__all__ = ["AUDIT_LOGGER", "AuditLog", "configure_audit_logger"]

AUDIT_LOGGER = "codemode.audit"

_HANDLER_MARK = "_codemode_service_audit"


def _ts() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ms(seconds: float) -> float:
    return round(max(0.0, seconds) * 1000.0, 3)


class AuditLog:
    """Writes audit lines to the ``codemode.audit`` logger (or the one given); it is the
    :class:`~codemode.execution.observe.Observer` of the service.

    Args:
        logger: the logger (default: ``codemode.audit``).
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger(AUDIT_LOGGER)

    def emit(self, event: str, **fields: Any) -> None:
        """Write one JSON line (when the logger is enabled for INFO).

        Args:
            event: the line's ``event``.
            fields: the line's other fields (``ts`` is added).
        """
        if not self.logger.isEnabledFor(logging.INFO):
            return
        record = {"ts": _ts(), "event": event, **fields}
        self.logger.info(json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False))

    # ------------------------------------------------------------------ observer hooks
    def native_call(self, event: CallEvent) -> None:
        asked = (
            {"approval": event.approval, "approval_ms": _ms(event.approval_seconds)} if event.approval else {}
        )
        self.emit(
            "native_call",
            subject=event.subject_id,
            capability_id=event.capability_id,
            capability=event.capability or None,
            decision=event.decision,
            outcome=event.outcome,
            authz_ms=_ms(event.authz_seconds),
            handler_ms=_ms(event.handler_seconds),
            worker_id=event.worker_id or None,
            **asked,
        )

    def execute_outcome(self, event: ExecuteEvent) -> None:
        self.emit(
            "execute",
            subject=event.subject_id,
            outcome=event.outcome,
            duration_ms=_ms(event.seconds),
            native_calls=event.native_calls,
            worker_id=event.worker_id or None,
            oom_killed=event.oom_killed,
        )

    def execute_started(self, subject_id: str) -> None:
        return None

    def execute_finished(self, subject_id: str) -> None:
        return None


class _JSONLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return record.getMessage()


def configure_audit_logger(destination: str) -> logging.Logger:
    """Point ``codemode.audit`` at ``destination`` (``stderr``, ``stdout``, a file path, or ``none``).

    Replaces a handler installed by an earlier call (so building several apps in one process does
    not duplicate lines) and leaves handlers installed by anybody else alone. With a destination of
    its own the logger stops propagating, so lines are not written twice.

    Args:
        destination: ``stderr``, ``stdout``, a file path, or ``none``.

    Returns:
        The ``codemode.audit`` logger.
    """
    logger = logging.getLogger(AUDIT_LOGGER)
    for handler in list(logger.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(logging.INFO)
    if destination == "none":
        logger.propagate = True
        return logger
    new: logging.Handler
    if destination == "stderr":
        new = logging.StreamHandler(sys.stderr)
    elif destination == "stdout":
        new = logging.StreamHandler(sys.stdout)
    else:
        new = logging.FileHandler(destination, encoding="utf-8")
    new.setFormatter(_JSONLineFormatter())
    setattr(new, _HANDLER_MARK, True)
    logger.addHandler(new)
    logger.propagate = False
    return logger
