"""Manage the bearer-token hash file of the service's ``token_file`` auth mode.

    python -m codemode.service.tokens new SUBJECT [--file FILE]   # print a new token once, store its hash
    printf %s "$TOKEN" | python -m codemode.service.tokens hash [--subject SUBJECT]

The token is printed to stdout exactly once and never stored; the file gets only its SHA-256 hex
digest (JSON object if FILE ends in ``.json`` or already holds JSON, else ``<hash> <subject>`` lines).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

from .auth import hash_token, load_token_file

__all__ = ["main"]


# --------------------------------------------------------------------------------------------------
# python -m codemode.service.tokens new SUBJECT --file FILE
# --------------------------------------------------------------------------------------------------


def _add_to_file(path: Path, digest: str, subject: str) -> None:
    existing = load_token_file(path) if path.exists() and path.stat().st_size else {}
    if path.suffix == ".json" or (
        path.exists() and path.read_text(encoding="utf-8").lstrip().startswith("{")
    ):
        existing[digest] = subject
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(f"{digest} {subject}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codemode.service.tokens", description="Manage the bearer-token hash file."
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    new = sub.add_parser("new", help="create a random token for SUBJECT; print it once, store its hash")
    new.add_argument("subject")
    new.add_argument("--file", type=Path, help="token file to add the hash to (JSON if *.json, else lines)")
    hsh = sub.add_parser("hash", help="print the SHA-256 hex of a token read from stdin")
    hsh.add_argument("--subject", help="print a token-file line for this subject")
    args = parser.parse_args(argv)
    if args.cmd == "new":
        if not args.subject or args.subject != args.subject.strip():
            parser.error("subject must be non-empty without surrounding spaces")
        token = secrets.token_urlsafe(32)
        digest = hash_token(token)
        if args.file is not None:
            _add_to_file(args.file, digest, args.subject)
            print(f"added {args.subject!r} to {args.file}", file=sys.stderr)
        else:
            print(f"{digest} {args.subject}", file=sys.stderr)
        print(token)
        return 0
    token = sys.stdin.read().strip()
    if not token:
        parser.error("no token on stdin")
    digest = hash_token(token)
    print(f"{digest} {args.subject}" if args.subject else digest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
