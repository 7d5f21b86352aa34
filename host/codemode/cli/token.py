"""``codemode token new|list|revoke``: manage the bearer-token file of ``serve --http``.

``new`` prints a fresh token once on stdout and stores only its SHA-256 hash with the creation time;
``list`` shows subjects and creation times (never hashes); ``revoke`` removes every token of a
subject. The file is ``--token-file`` / ``CODEMODE_TOKEN_FILE``, by default
``~/.config/codemode/codemode.tokens`` (outside any checkout).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..common.command import FAILED, USAGE, CommandError
from ..startup.config import ConfigError, default_token_file, env_var

__all__ = ["add_token", "run_token"]


def add_token(sub: Any) -> argparse.ArgumentParser:
    """Add ``codemode token`` (``new``, ``list``, ``revoke``) and its flags.

    Args:
        sub: the top-level parser's subparsers.

    Returns:
        The ``token`` parser.
    """
    p: argparse.ArgumentParser = sub.add_parser(
        "token",
        help="manage bearer tokens for serve --http",
        description="Manage the bearer-token file of serve --http (hashes only; tokens are printed once).",
    )
    p.set_defaults(group_help=p.format_help)
    tsub = p.add_subparsers(dest="token_command", metavar="COMMAND")
    for name, text in (
        ("new", "create a token for SUBJECT, print it once, store its hash"),
        ("list", "list subjects and creation times (never hashes)"),
        ("revoke", "remove every token of SUBJECT"),
    ):
        cmd = tsub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        if name != "list":
            cmd.add_argument("subject", metavar="SUBJECT")
        cmd.add_argument(
            "--token-file",
            metavar="FILE",
            help=f"token file (default: ~/.config/codemode/codemode.tokens; {env_var('token_file')})",
        )
    return p


def _path(args: argparse.Namespace) -> Path:
    if args.token_file:
        return Path(args.token_file)
    from_env = os.environ.get(env_var("token_file"), "").strip()
    return Path(from_env) if from_env else default_token_file()


def run_token(args: argparse.Namespace) -> int:
    """``codemode token``: add a token (printed once), list the subjects, or revoke a subject's.

    Args:
        args: the parsed flags.

    Returns:
        The exit status: 0 on success.

    Raises:
        CommandError: status 1 when ``revoke`` found no token of the subject, 2 on a usage,
            configuration or file error.
    """
    from ..service.tokens import add_token as add
    from ..service.tokens import read_entries, revoke_subject

    if args.token_command is None:
        print(args.group_help(), file=sys.stderr)
        return USAGE
    path = _path(args)
    try:
        if args.token_command == "new":
            token = add(path, args.subject)
            print(f"codemode: added a token for {args.subject!r} to {path}", file=sys.stderr)
            print(token)
            return 0
        if not path.exists():
            raise ConfigError(
                f"--token-file / {env_var('token_file')}: token file {str(path)!r} does not exist"
            )
        if args.token_command == "list":
            for entry in read_entries(path):
                print(f"{entry.subject}\t{entry.created or '-'}")
            return 0
        removed = revoke_subject(path, args.subject)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"token file {str(path)!r}: {exc.strerror or exc}") from None
    if removed == 0:
        raise CommandError(f"no token of {args.subject!r} in {path}", FAILED)
    print(f"codemode: revoked {removed} token(s) of {args.subject!r}", file=sys.stderr)
    return 0
