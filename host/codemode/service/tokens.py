"""The bearer-token file of the service's ``token_file`` auth mode: its format, and the edits that
``codemode token new|list|revoke`` make.

The file never holds a token, only its SHA-256 hex digest. Two formats are read:

- JSON: ``{"<sha256 hex>": "subject"}`` or ``{"<sha256 hex>": {"subject": "...", "created": "<ISO 8601>"}}``;
- lines: ``<sha256 hex> <subject>`` (``#`` starts a comment line).

New files are written as JSON with the creation time. Writes go to a temporary file with mode 0600
that replaces the original, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..startup.config import ConfigError, names

__all__ = [
    "TokenEntry",
    "add_token",
    "hash_token",
    "load_token_file",
    "read_entries",
    "revoke_subject",
    "valid_subject",
]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_WHERE = names("token_file")


@dataclass(frozen=True)
class TokenEntry:
    """One line (or JSON entry) of a token file.

    Attributes:
        digest: the token's SHA-256 hex digest (lower case).
        subject: the subject id it authenticates.
        created: when it was made (ISO 8601), if the file says.
    """

    digest: str
    subject: str
    created: str | None = None


def hash_token(token: str) -> str:
    """The digest stored in the token file for ``token``.

    Args:
        token: the bearer token.

    Returns:
        The SHA-256 hex digest of its UTF-8 bytes.
    """
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def valid_subject(subject: Any) -> bool:
    """A usable subject id: a non-empty printable string (no control or format characters) of at
    most 256 characters without surrounding spaces. Token files and JWT ``sub`` claims both obey it.

    Args:
        subject: the candidate.

    Returns:
        Whether it is one.
    """
    return (
        isinstance(subject, str)
        and bool(subject)
        and subject == subject.strip()
        and subject.isprintable()
        and len(subject) <= 256
    )


def read_entries(path: Path) -> list[TokenEntry]:
    """Parse a token file (JSON or lines: the module text).

    Args:
        path: the file.

    Returns:
        Its entries, in file order.

    Raises:
        ConfigError: it cannot be read, is not UTF-8, is malformed, or holds a bad entry (every
            problem listed; content is never echoed beyond line or entry numbers).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{_WHERE}: cannot read {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{_WHERE}: {str(path)!r} is not UTF-8 text") from None
    entries: list[TokenEntry] = []
    seen: set[str] = set()
    problems: list[str] = []

    def add(where: str, digest: Any, subject: Any, created: Any = None) -> None:
        if not isinstance(digest, str) or not _HEX64.match(digest.lower()):
            problems.append(f"{where}: not a SHA-256 hex digest (store hashes, never tokens)")
            return
        if not valid_subject(subject):
            problems.append(f"{where}: subject id must be printable, non-empty, without surrounding spaces")
            return
        if created is not None and not isinstance(created, str):
            problems.append(f"{where}: created must be a string")
            return
        digest = digest.lower()
        if digest in seen:
            problems.append(f"{where}: duplicate token hash")
            return
        seen.add(digest)
        entries.append(TokenEntry(digest, subject, created))

    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(
                f"{_WHERE}: {str(path)!r} is not valid JSON (line {getattr(exc, 'lineno', '?')})"
            ) from None
        if not isinstance(data, dict):
            raise ConfigError(f"{_WHERE}: {str(path)!r} must be a JSON object")
        for n, (digest, value) in enumerate(data.items(), 1):
            if isinstance(value, dict):
                add(f"entry {n}", digest, value.get("subject"), value.get("created"))
            else:
                add(f"entry {n}", digest, value)
    else:
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 1)
            if len(parts) != 2:
                problems.append(f"line {n}: expected '<sha256 hex> <subject>'")
                continue
            add(f"line {n}", parts[0], parts[1].strip())
    if problems:
        raise ConfigError(f"{_WHERE}: {str(path)!r}: " + "; ".join(problems))
    return entries


def load_token_file(path: Path) -> dict[str, str]:
    """The digests of a token file and their subjects.

    Args:
        path: the file.

    Returns:
        ``{sha256 hex: subject id}``.

    Raises:
        ConfigError: as :func:`read_entries`.
    """
    return {e.digest: e.subject for e in read_entries(path)}


def _write(path: Path, entries: list[TokenEntry]) -> None:
    data: dict[str, Any] = {}
    for e in entries:
        data[e.digest] = {"subject": e.subject, "created": e.created} if e.created else e.subject
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def add_token(path: Path, subject: str) -> str:
    """Create a random token for ``subject`` and store its hash (and creation time) in ``path``
    (created mode 0600 if missing, replaced whole).

    Args:
        path: the token file.
        subject: the subject id.

    Returns:
        The token (the only time it exists in clear).

    Raises:
        ConfigError: the subject is not a valid one (or the file cannot be read).
    """
    if not valid_subject(subject):
        raise ConfigError("subject must be printable, non-empty, without surrounding spaces")
    entries = read_entries(path) if path.exists() else []
    token = secrets.token_urlsafe(32)
    created = datetime.now(UTC).replace(microsecond=0).isoformat()
    _write(path, [*entries, TokenEntry(hash_token(token), subject, created)])
    return token


def revoke_subject(path: Path, subject: str) -> int:
    """Remove every token of ``subject``.

    Args:
        path: the token file.
        subject: the subject id.

    Returns:
        How many were removed (the file is rewritten only when some were).

    Raises:
        ConfigError: as :func:`read_entries`.
    """
    entries = read_entries(path)
    kept = [e for e in entries if e.subject != subject]
    if len(kept) != len(entries):
        _write(path, kept)
    return len(entries) - len(kept)
