"""Refused ``/mcp`` requests in the audit log, bounded (docs/service.md, "Audit log").

Anyone can send requests without a valid token, as fast as the network allows; one audit line
each let one client grow the log by about 10 GiB a day. :class:`RefusalSummary` counts refusals per
client in fixed windows of ``window`` seconds. A client is its address's
:func:`~codemode.service.peers.address_key`: an IPv4 address, or an IPv6 address's ``/64`` network
(one host usually holds a whole ``/64``, so keying by the full address let one host take every entry
of a window):

- the first refusal of a client in a window is written at once, as one ``auth_failure`` line with
  the full address (so an operator sees a new source immediately);
- the later ones of that window are counted, by reason, and written as **one** ``auth_failures``
  line per client when the window ends (:meth:`flush`, called by a timer and at shutdown), its
  ``client`` the key (an IPv6 client's ``/64``, e.g. ``2001:db8::/64``);
- at most ``max_clients`` clients are tracked per window; refusals from further clients are
  counted under the client ``"*"``.

Every refusal is in exactly one line: its own ``auth_failure``, or the ``count`` of an
``auth_failures``. Nothing is dropped, and a window writes at most ``2 * (max_clients + 1)`` lines.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from .peers import address_key

__all__ = ["OVERFLOW", "RefusalSummary"]

#: The client of the refusals from addresses past ``max_clients`` in one window.
OVERFLOW = "*"


class RefusalSummary:
    """The counter described in the module docstring.

    Args:
        emit: writes one audit line (``AuditLog.emit``: ``(event, **fields)``).
        window: seconds of one window.
        max_clients: client addresses tracked per window.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        emit: Callable[..., None],
        *,
        window: float,
        max_clients: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.emit = emit  # AuditLog.emit: (event, **fields)
        self.window = window
        self.max_clients = max_clients
        self.clock = clock
        self._started = clock()
        self._seen: dict[str, Counter[str]] = {}  # client -> reasons of its later refusals

    def refused(self, reason: str, client: str | None, path: str) -> None:
        """One refused request: written at once when it is its client's first in the window, else
        counted.

        Args:
            reason: the refusal's reason.
            client: the client address (None: unknown).
            path: the request's path.
        """
        now = self.clock()
        if now - self._started >= self.window:
            self.flush(now)
        key = address_key(client)
        later = self._seen.get(key)
        if later is not None:
            later[reason] += 1
            return
        if len(self._seen) >= self.max_clients:
            self._seen.setdefault(OVERFLOW, Counter())[reason] += 1
            return
        self._seen[key] = Counter()
        self.emit("auth_failure", reason=reason, client=client, path=path)

    def flush(self, now: float | None = None) -> None:
        """Write the summaries of the current window and start a new one.

        Args:
            now: the clock's time (None: now).
        """
        now = self.clock() if now is None else now
        seen, self._seen = self._seen, {}
        seconds = round(max(0.0, now - self._started), 3)
        self._started = now
        for client, reasons in seen.items():
            count = sum(reasons.values())
            if count:
                fields: dict[str, Any] = {"client": client or None, "count": count}
                self.emit("auth_failures", **fields, reasons=dict(sorted(reasons.items())), window_s=seconds)
