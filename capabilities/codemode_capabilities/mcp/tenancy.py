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
* :func:`fixed_paths`: the values of a stdio table's ``env``, ``args`` and ``cwd`` that name a path
  every subject's server would share (the rule below), so that a per-subject table that shares
  state by accident is refused at start.
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

from codemode import ResourceLimit

__all__ = [
    "ARG_PLACEHOLDERS",
    "HEADER_PLACEHOLDERS",
    "HOST_DIR",
    "CallBudget",
    "SubjectDirs",
    "expand",
    "fixed_paths",
    "names_path",
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
_ARG_PLACEHOLDER = re.compile(r"\{subject_(?:dir|key)\}")
_NETWORK_URL = re.compile(r"(?:https?|wss?)://", re.IGNORECASE)


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


def _path_pieces(value: str) -> list[str]:
    """The parts of a configuration value that are checked as paths (see :func:`fixed_paths`)."""
    pieces: list[str] = []
    for part in re.split(r"[=,]", value):
        if _NETWORK_URL.match(part):
            continue
        pieces.extend(part.split(":"))
    return pieces


def names_path(piece: str) -> bool:
    """Whether a piece of a value names a path: it holds a ``/``, is ``.`` or ``..``, or starts with
    ``~``.

    Args:
        piece: a part of a configuration value.

    Returns:
        True for a path.
    """
    return "/" in piece or piece in (".", "..") or piece.startswith("~")


def _own(piece: str) -> bool:
    """A path in the subject's own place: it uses a placeholder and never goes up."""
    return bool(_ARG_PLACEHOLDER.search(piece)) and ".." not in piece.split("/")


def _under(piece: str, entries: Iterable[str]) -> bool:
    path = os.path.normpath(piece)
    for entry in entries:
        top = os.path.normpath(entry)
        if path == top or path.startswith(top.rstrip("/") + "/"):
            return True
    return False


def fixed_paths(
    env: Mapping[str, str], args: Iterable[str], cwd: str | None, shared: Iterable[str]
) -> list[tuple[str, str]]:
    """The fixed paths a table gives every subject's server: pieces of ``env`` values, ``args`` and
    ``cwd`` that name a path (:func:`names_path`; a value is cut into pieces at ``=``, ``,`` and
    ``:``, and an ``http``, ``https``, ``ws`` or ``wss`` URL between them is not a path), are not
    the subject's own (a placeholder in it, and no ``..`` segment) and are not ``shared`` (equal to
    an entry or under it, after ``os.path.normpath``). ``cwd`` is a path whatever its text.

    Args:
        env: the literal ``env`` values by name (``env_from_host`` is not looked at: secrets).
        args: the arguments.
        cwd: the working directory, if set.
        shared: the ``shared_paths`` entries.

    Returns:
        ``(where, piece)`` for each, in the order env (by name), args, cwd; ``where`` is
        ``env NAME``, ``args[i]`` or ``cwd``.
    """
    entries = list(shared)
    values = [(f"env {name}", env[name]) for name in sorted(env)]
    values += [(f"args[{i}]", arg) for i, arg in enumerate(args)]
    found = []
    for where, value in values:
        for piece in _path_pieces(value):
            if names_path(piece) and not _own(piece) and not _under(piece, entries):
                found.append((where, piece))
    if cwd is not None and not _own(cwd) and not _under(cwd, entries):
        found.append(("cwd", cwd))
    return found


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
