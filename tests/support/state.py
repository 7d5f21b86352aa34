"""What the state pack's tests share: a server with the pack on a given store, and a program from
the body of its ``main``."""

from __future__ import annotations

from typing import Any

import codemode
from codemode import authz
from codemode.store.memory import MemoryStore
from codemode_capabilities.state import capabilities


def build(store: Any = None, *, authorizer: Any = None, **limits: int) -> codemode.Server:
    """A server with the state pack on ``store`` (None: a new MemoryStore), allowing every call
    unless ``authorizer`` says otherwise."""
    builder = codemode.Builder(
        authorizer=authorizer if authorizer is not None else authz.allow_all(),
        store=store if store is not None else MemoryStore(),
        limits=codemode.Limits(**limits),
    )
    builder.register(*capabilities())
    return builder.build()


def main(body: str) -> str:
    """The program whose ``main`` runs ``body`` (its lines indented once)."""
    return "def main():\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())
