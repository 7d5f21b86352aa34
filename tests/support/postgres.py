"""A real PostgreSQL server for the tests (no tests here).

:func:`throwaway_database` gives a DSN of a database made for this test session and dropped after
it: with ``CODEMODE_TEST_POSTGRES_DSN`` set, a database created through that server (or the DSN
itself when its role may not create databases); otherwise through the local Debian cluster
(``pg_ctlcluster 15 main start``, which ``.ci/run`` does), as its superuser ``postgres`` with
``runuser``: a login role with a random password and a UTF8 database it owns, reached over TCP on
loopback. Missing either, the test is skipped locally and fails with ``CI=true``
(tests/support/environment.py).

:class:`Relay` stands between a store and the server: cut, the server is gone (refused, connections
closed); frozen, it is a black hole (connections stay open, nothing answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.environment import unavailable

ENV = "CODEMODE_TEST_POSTGRES_DSN"
_LOCAL = ("127.0.0.1", 5432)


def found() -> str:
    """One line: the PostgreSQL server this run uses, or why there is none."""
    if os.environ.get(ENV):
        return f"using {ENV}"
    problem = _local_problem()
    return "using the local cluster (127.0.0.1:5432)" if problem is None else f"none: {problem}"


def _local_problem() -> str | None:
    if shutil.which("runuser") is None or shutil.which("psql") is None:
        return "runuser or psql not installed (Debian package postgresql)"
    if os.geteuid() != 0:
        return f"the local cluster is set up as root (runuser -u postgres); or set {ENV}"
    done = _psql("SELECT 1")
    if done.returncode != 0:
        return f"the local cluster does not answer (pg_ctlcluster 15 main start): {done.stderr.strip()[:200]}"
    return None


def _psql(*commands: str) -> subprocess.CompletedProcess[str]:
    argv = ["runuser", "-u", "postgres", "--", "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", "postgres"]
    for command in commands:
        argv += ["-c", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd="/")


@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    """A database for this session: its DSN (dropped afterwards)."""
    name = f"codemode_test_{secrets.token_hex(6)}"
    given = os.environ.get(ENV)
    if given:
        yield from _through(given, name)
        return
    problem = _local_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    password = secrets.token_hex(16)
    done = _psql(
        f"CREATE ROLE {name} LOGIN PASSWORD '{password}'",
        f"CREATE DATABASE {name} OWNER {name} ENCODING 'UTF8' TEMPLATE template0",
    )
    if done.returncode != 0:
        unavailable("PostgreSQL", f"creating a test database failed: {done.stderr.strip()[:200]}")
    try:
        yield f"postgresql://{name}:{quote(password)}@{_LOCAL[0]}:{_LOCAL[1]}/{name}"
    finally:
        _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"DROP ROLE IF EXISTS {name}")


def _through(dsn: str, name: str) -> Iterator[str]:
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"CREATE DATABASE {name} ENCODING 'UTF8' TEMPLATE template0")
    except psycopg.errors.InsufficientPrivilege:
        reset(dsn)
        yield dsn  # no CREATEDB: the given database itself, emptied
        return
    except psycopg.Error as exc:
        unavailable("PostgreSQL", f"{ENV} does not answer: {type(exc).__name__}")
    try:
        yield make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def reset(dsn: str) -> None:
    """Empty the store's tables in ``dsn`` (each test starts from nothing)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS codemode_suspensions, codemode_state, codemode_state_versions, "
            "codemode_schema"
        )


def query(dsn: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    """Rows of one query, on a connection of its own (what is really in the tables)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        return list(conn.execute(sql, params).fetchall())


def via(dsn: str, host: str, port: int) -> str:
    """``dsn`` as a ``postgresql://`` URI reaching its server at ``host:port`` instead (through a
    :class:`Relay`)."""
    info = conninfo_to_dict(dsn)
    user, password = quote(str(info.get("user", "")), safe=""), quote(str(info.get("password", "")), safe="")
    return f"postgresql://{user}:{password}@{host}:{port}/{info.get('dbname', '')}"


class Relay:
    """A TCP relay on loopback to the server of ``dsn``: :meth:`cut` stops it (connections closed,
    new ones refused), :meth:`freeze` makes it a black hole (connections accepted and kept, nothing
    forwarded)."""

    def __init__(self, dsn: str) -> None:
        info = conninfo_to_dict(dsn)
        self.target = (str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
        self.dsn = dsn
        self.frozen = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, port: int = 0) -> str:
        """Listen (on ``port``, 0: any free one); the DSN through the relay."""
        self.frozen = False
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return via(self.dsn, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        for a, b in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(a, b))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while self.frozen:
                    await asyncio.sleep(3600)  # a black hole: held until cut
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def freeze(self) -> None:
        """Forward nothing more; keep every connection open."""
        self.frozen = True

    async def cut(self) -> None:
        """Stop listening and close every connection (the server is gone)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self._writers.clear()
