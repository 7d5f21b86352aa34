"""Parts several benchmarks share: a native function's argument and result types with a handler that
echoes, and a throwaway PostgreSQL database when a server answers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import codemode
from codemode import authz


@dataclass
class In:
    n: int


@dataclass
class Out:
    n: int


async def echo(ctx: codemode.CallContext, subject: authz.Subject, args: In) -> Out:
    """The handler that answers its argument back."""
    return Out(args.n)


@contextlib.contextmanager
def postgres_dsn() -> Iterator[str | None]:
    """A throwaway database's DSN, or None (after printing why) when no server answers."""
    from tests.support import postgres

    try:
        with postgres.throwaway_database() as dsn:
            yield dsn
    except BaseException as exc:  # pytest's skip outside pytest: no server
        if isinstance(exc, KeyboardInterrupt):
            raise
        print(f"postgres: not measured ({exc})")
        yield None
