"""What the host derives from a subject for an upstream (docs/packs.md, "Tenancy").

* :func:`subject_key`: a path-safe, collision-free name for a subject id: the first 32 hex digits
  (128 bits) of its SHA-256. It is lower-case hex whatever the id holds, so it can never carry a
  path component, an option, a separator or a case difference; a Rego policy can compute it
  (``substring(crypto.sha256(input.subject.id), 0, 32)``).
* :class:`SubjectDirs`: ``<root>/<upstream>/<subject key>``, created mode 0700 on first use (and
  ``<root>/<upstream>/host`` for the host's own discovery session); a path that exists as a
  symbolic link or a non-directory is refused, never followed.
* :func:`expand`: the placeholders ``{subject_dir}`` and ``{subject_key}`` in ``env`` values,
  ``args`` and ``cwd``; ``{subject}`` (the id, percent-encoded so it is one safe token) and
  ``{subject_key}`` in HTTP header templates. Any other text, braces included, is kept as written.
* :class:`DirAlias`: the subject's own directory as its programs see it: ``{subject_dir}`` in every
  string of a result where the host path stood, and back in every string of the arguments (so the
  host's data dir never reaches a tenant through an ordinary answer such as
  ``list_allowed_directories``).
* :class:`CallBudget`: per-subject token buckets (calls, bytes sent, bytes returned, each per
  minute) that fail a call with ``resource limit exceeded: quota``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from codemode import ResourceLimit

__all__ = [
    "ARG_PLACEHOLDERS",
    "HEADER_PLACEHOLDERS",
    "HOST_DIR",
    "SHOWN_DIR",
    "CallBudget",
    "DirAlias",
    "SubjectDirs",
    "expand",
    "placeholders_in",
    "subject_key",
    "subject_token",
]

#: Placeholders in ``env`` values, ``args`` and ``cwd`` of a stdio upstream.
ARG_PLACEHOLDERS = ("{subject_dir}", "{subject_key}")
#: Placeholders in HTTP header templates.
HEADER_PLACEHOLDERS = ("{subject}", "{subject_key}")
#: The directory of the host's own discovery session, beside the subjects' ones.
HOST_DIR = "host"
_PLACEHOLDER = re.compile(r"\{subject(?:_dir|_key)?\}")
#: What a program sees where its own directory's host path stood.
SHOWN_DIR = "{subject_dir}"
T = TypeVar("T")


def subject_key(subject_id: str) -> str:
    """A path-safe, collision-free name for a subject id.

    Args:
        subject_id: the subject id.

    Returns:
        32 lower-case hex digits: the start of the SHA-256 of the id's UTF-8 bytes.
    """
    return hashlib.sha256(subject_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def subject_token(subject_id: str) -> str:
    """The id as one header-safe token (``{subject}``).

    Args:
        subject_id: the subject id.

    Returns:
        Its UTF-8 bytes with every byte outside RFC 3986's unreserved set as ``%XX``.
    """
    return urllib.parse.quote(subject_id.encode("utf-8", "surrogatepass"), safe="")


def placeholders_in(texts: Iterable[str]) -> set[str]:
    """The subject placeholders used in some texts.

    Args:
        texts: configuration values (``env`` values, ``args``, ``cwd``).

    Returns:
        The placeholders among ``{subject}``, ``{subject_dir}`` and ``{subject_key}`` they hold.
    """
    return {m.group(0) for text in texts for m in _PLACEHOLDER.finditer(text)}


def expand(text: str, values: Mapping[str, str]) -> str:
    """Each placeholder of ``values`` replaced (one pass: a value is never expanded again).

    Args:
        text: a configuration value.
        values: placeholder → value.

    Returns:
        The text; any other text, braces included, as written.
    """
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(0), m.group(0)), text)


class SubjectDirs:
    """Per-subject directories of one upstream: ``<root>/upstreams/<upstream>/<subject key>``.

    Args:
        root: the data dir.
        upstream: the upstream's name.
    """

    def __init__(self, root: Path, upstream: str) -> None:
        self.base = root / "upstreams" / upstream

    def host(self) -> Path:
        """The host's own directory (:data:`HOST_DIR`), created mode 0700 if needed.

        Returns:
            Its path.

        Raises:
            OSError: a part of the path is a symbolic link or not a directory.
        """
        return self._make(HOST_DIR)

    def of(self, subject_id: str) -> Path:
        """The subject's directory, created mode 0700 if needed.

        Args:
            subject_id: the subject.

        Returns:
            Its path.

        Raises:
            OSError: a part of the path is a symbolic link or not a directory.
        """
        return self._make(subject_key(subject_id))

    def path_of(self, subject_id: str) -> Path:
        """Where :meth:`of` puts the subject's directory (nothing is created).

        Args:
            subject_id: the subject.

        Returns:
            The path.
        """
        return self.base / subject_key(subject_id)

    def _make(self, leaf: str) -> Path:
        path = self.base / leaf
        self.base.parent.parent.mkdir(parents=True, exist_ok=True)  # the data dir: the operator's
        for part in (self.base.parent, self.base, path):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700)
            info = os.lstat(part)
            if not stat.S_ISDIR(info.st_mode):
                raise OSError(f"{part} is not a directory (a symbolic link or a file is never followed)")
        os.chmod(path, 0o700)
        return path


class DirAlias:
    """Replaces the host path of one subject directory by ``{subject_dir}`` on the way out and
    back on the way in (every string of a JSON-like value; ``None``: nothing to replace). Both the
    path as configured and its resolved form (a data dir reached through a link) are replaced.

    Args:
        path: the subject's directory (None: nothing to replace).
    """

    def __init__(self, path: Path | None) -> None:
        forms = {str(path), os.path.realpath(path)} if path is not None else set()
        self.forms = sorted(forms, key=len, reverse=True)
        self.path = str(path) if path is not None else None

    def _map(self, value: T, swap: Any) -> T:
        if isinstance(value, str):
            return swap(value)  # type: ignore[no-any-return]
        if isinstance(value, dict):
            return {k: self._map(v, swap) for k, v in value.items()}  # type: ignore[return-value]
        if isinstance(value, list):
            return [self._map(v, swap) for v in value]  # type: ignore[return-value]
        return value

    def outward(self, value: T) -> T:
        """A result as the program sees it.

        Args:
            value: a JSON-like value from the upstream.

        Returns:
            The value with each form of the host path replaced by :data:`SHOWN_DIR`.
        """
        if not self.forms:
            return value

        def swap(text: str) -> str:
            for form in self.forms:
                text = text.replace(form, SHOWN_DIR)
            return text

        return self._map(value, swap)

    def inward(self, value: T) -> T:
        """Arguments as the upstream gets them.

        Args:
            value: a JSON-like value from the program.

        Returns:
            The value with :data:`SHOWN_DIR` replaced by the host path.
        """
        if self.path is None:
            return value
        path = self.path
        return self._map(value, lambda text: text.replace(SHOWN_DIR, path))


class CallBudget:
    """Token buckets per subject: each holds at most its per-minute amount and refills at that
    rate. A call needs one call token and the bytes it sends; what it returns is charged after it
    (a bucket in debt refuses the next call until it has refilled). 0 means no bound.

    Args:
        calls: calls per subject per minute.
        sent: argument bytes per subject per minute.
        returned: result bytes per subject per minute.
    """

    def __init__(self, calls: int, sent: int, returned: int) -> None:
        self.capacity = (float(calls), float(sent), float(returned))
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, list[float]]] = {}

    def _bucket(self, subject_id: str, now: float) -> list[float]:
        seen, levels = self._buckets.get(subject_id, (now, list(self.capacity)))
        for i, cap in enumerate(self.capacity):
            levels[i] = min(cap, levels[i] + (now - seen) * cap / 60.0)
        self._buckets[subject_id] = (now, levels)
        if len(self._buckets) > 4096:  # full buckets are the same as none: forget them
            for key in [k for k, (_, lv) in self._buckets.items() if lv == list(self.capacity)]:
                del self._buckets[key]
        return levels

    def spend(self, subject_id: str, sent: int) -> None:
        """Before a call: take one call token and the bytes it sends.

        Args:
            subject_id: the caller.
            sent: the bytes of its arguments.

        Raises:
            ResourceLimit: ``quota``: a bucket lacks them (or the returned bucket is in debt).
        """
        with self._lock:
            levels = self._bucket(subject_id, time.monotonic())
            calls, bytes_sent, returned = self.capacity
            if (
                (calls and levels[0] < 1)
                or (bytes_sent and levels[1] < sent)
                or (returned and levels[2] <= 0)
            ):
                raise ResourceLimit("quota")
            levels[0] -= 1 if calls else 0
            levels[1] -= sent if bytes_sent else 0

    def returned(self, subject_id: str, size: int) -> None:
        """After a call: charge what it returned (the bucket may go into debt).

        Args:
            subject_id: the caller.
            size: the bytes returned.
        """
        if not self.capacity[2]:
            return
        with self._lock:
            self._bucket(subject_id, time.monotonic())[2] -= size
