"""The ``codemode`` argument parser and dispatch."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ..common.command import CommandError
from ..common.did_you_mean import closest
from .serve import add_serve, run_serve
from .token import add_token, run_token

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """No silent abbreviations (``--allow-al`` is not ``--allow-all``), and an error names the
    problem and a close flag first, then one short usage line instead of every flag."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(
            2, f"{self.prog}: error: {message}\nusage: {self.prog} ... ({self.prog} --help lists them)\n"
        )

    def unknown(self, flags: Sequence[str]) -> NoReturn:
        known = [o for o in self._option_string_actions if o.startswith("--")]
        hints = []
        for given in flags:
            close = closest(given.split("=", 1)[0], known)
            if close is not None:
                hints.append(f"{given}: did you mean {close}?")
        detail = f" ({'; '.join(hints)})" if hints else ""
        self.error(f"unrecognized arguments: {' '.join(flags)}{detail}")


def _add_operator_tools(sub: Any) -> dict[str, argparse.ArgumentParser]:
    """``image audit``, ``quotas tune`` and ``bench`` (docs/operators.md)."""
    from ..ops import bench, image_audit, quotas

    image = sub.add_parser("image", help="worker image tools", description="Worker image tools.")
    image.set_defaults(group_help=image.format_help)
    image_sub = image.add_subparsers(dest="image_command", metavar="COMMAND")
    audit = image_sub.add_parser(
        "audit",
        help="audit a worker image against the hardening rules",
        description=(
            "Audit a worker image against the hardening rules (docs/operators.md). Exit 0 when no "
            "check fails, 1 when one does, 2 when the audit could not run."
        ),
    )
    image_audit.add_arguments(audit)
    quotas_group = sub.add_parser("quotas", help="cgroup quota tools", description="cgroup quota tools.")
    quotas_group.set_defaults(group_help=quotas_group.format_help)
    quotas_sub = quotas_group.add_subparsers(dest="quotas_command", metavar="COMMAND")
    tune = quotas_sub.add_parser(
        "tune",
        help="measure a workload to size the workers of a runtime",
        description=(
            "Run one program N times in fresh workers of a runtime (docker, kubernetes or process) "
            "with generous limits, read each worker's peak memory, CPU time and what else the runtime "
            "limits, and recommend that runtime's serve flags and --max-execution-time "
            "(docs/operators.md)."
        ),
    )
    quotas.add_arguments(tune)
    bench_parser = sub.add_parser(
        "bench",
        help="measure execute latency on this machine",
        description=(
            "Measure execute latency: trivial execute cold (no pool) and warm (warm pool), and "
            "native calls (warm); prints p50/p99 per series."
        ),
    )
    bench.add_arguments(bench_parser)
    return {"image audit": audit, "quotas tune": tune, "bench": bench_parser}


def build_parser() -> argparse.ArgumentParser:
    """The ``codemode`` command's parser, every subcommand included.

    Returns:
        The parser.
    """
    parser, _ = _parsers()
    return parser


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from .. import __version__

    parser = _Parser(
        prog="codemode",
        description="Code-mode MCP server: search_api, describe_api and execute over a typed "
        "capability catalog; programs run in single-use sandboxed workers.",
    )
    parser.add_argument("--version", action="version", version=f"codemode {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    leaves = {"serve": add_serve(sub), "token": add_token(sub)}
    leaves.update(_add_operator_tools(sub))
    return parser, leaves


def _leaf(args: argparse.Namespace) -> str:
    command = getattr(args, "command", None) or ""
    for group in ("image", "quotas"):
        if command == group:
            inner = getattr(args, f"{group}_command", None)
            return f"{group} {inner}" if inner else group
    return command


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``codemode`` command.

    Args:
        argv: the arguments (None: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 success, 1 a run-time failure, 2 a configuration or usage error (a
        command's :class:`~codemode.common.command.CommandError` carries which, printed here as
        one line), 130 when interrupted, 141 when the reader of standard output went away
        (``codemode image audit --json | head``).
    """
    try:
        status = _dispatch(argv)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at interpreter exit
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt:
        return _INTERRUPTED_STATUS
    return status


#: The status a command ends with when interrupted (128 + SIGINT).
_INTERRUPTED_STATUS = 130


#: The status a command ends with when its output's reader went away (128 + SIGPIPE, as ``cat``).
_SIGPIPE_STATUS = 141


def _reader_gone() -> int:
    """Standard output's reader closed the pipe early: stop without a traceback. Python's own
    flush at exit would fail again, so standard output now points at /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real descriptor (a test's capture): nothing left to flush
        pass
    finally:
        os.close(devnull)
    return _SIGPIPE_STATUS


def _dispatch(argv: Sequence[str] | None) -> int:
    parser, leaves = _parsers()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # The usage of the subcommand the unknown flag was given to, not the top-level one.
        target = leaves.get(_leaf(args), parser)
        assert isinstance(target, _Parser)
        target.unknown(unknown)
    try:
        return _run(parser, args)
    except CommandError as exc:
        print(f"codemode {_leaf(args)}: {exc}", file=sys.stderr)
        return exc.status


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "serve":
        return run_serve(args)
    if args.command == "token":
        return run_token(args)
    if args.command == "image":
        if args.image_command != "audit":
            print(args.group_help(), file=sys.stderr)
            return 2
        from ..ops import image_audit

        return image_audit.run(args)
    if args.command == "quotas":
        if args.quotas_command != "tune":
            print(args.group_help(), file=sys.stderr)
            return 2
        from ..ops import quotas

        return quotas.run(args)
    if args.command == "bench":
        from ..ops import bench

        return bench.run(args)
    parser.print_help(sys.stderr)
    return 2
