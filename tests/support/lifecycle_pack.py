"""A test pack that writes every step of its lifecycle to a log file, one line each
(``<name> capabilities|open|close``), so a test in this process or in a child process (``serve
--stdio``, ``serve --http``) can count them.

Pack options (``--pack-option`` / ``PackSettings.options``): ``LIFECYCLE_LOG`` the log file (required);
``LIFECYCLE_FAIL_OPEN`` / ``LIFECYCLE_FAIL_LOAD`` the name of the pack whose ``open()`` /
``capabilities()`` raises. Load it as ``tests.support.lifecycle_pack:first`` or
``./tests/support/lifecycle_pack.py:first``
(``first``, ``second``, ``third``; ``factory`` builds a fourth, ``made``, from a factory).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import codemode
from codemode import authz
from codemode.packs import PackSettings


@dataclass
class PingIn:
    text: str


@dataclass
class PingOut:
    text: str


class CountingPack:
    """A pack with both lifecycle steps, each logged."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.log: Path | None = None
        self.fail_open = False

    def _write(self, step: str) -> None:
        assert self.log is not None, f"{self.name}: {step} before capabilities()"
        with self.log.open("a", encoding="utf-8") as f:
            f.write(f"{self.name} {step}\n")

    def capabilities(self, settings: PackSettings) -> list[codemode.Capability]:
        log = settings.get("LIFECYCLE_LOG")
        assert log, "set the pack option LIFECYCLE_LOG"
        self.log = Path(log)
        self.fail_open = settings.get("LIFECYCLE_FAIL_OPEN") == self.name
        self._write("capabilities")
        if settings.get("LIFECYCLE_FAIL_LOAD") == self.name:
            raise RuntimeError(f"{self.name} cannot list its capabilities")

        async def ping(ctx: codemode.CallContext, subject: authz.Subject, args: PingIn) -> PingOut:
            return PingOut(f"{self.name}: {args.text}")

        return [codemode.Capability(name=f"{self.name}.ping", summary=f"Ping {self.name}.", handler=ping)]

    async def open(self) -> None:
        self._write("open")
        if self.fail_open:
            raise ConnectionError(f"{self.name} database is unreachable")

    async def aclose(self) -> None:
        self._write("close")


first = CountingPack("first")
second = CountingPack("second")
third = CountingPack("third")


def factory() -> CountingPack:
    return CountingPack("made")


def steps(log: Path) -> list[str]:
    """The log's lines (none when the file was never written)."""
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []
