"""A pack's lifecycle: loaded (``capabilities(settings)``), opened before serving (``open()``),
closed at shutdown (``aclose()``), each once; both steps optional. The rules are in docs/packs.md,
"A pack's lifecycle"; every loading path (``Builder.add_pack``, ``--pack``, ``--config`` tables,
``serve --stdio``, ``serve --http``) goes through :func:`load`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..catalog.capability import Capability
from .loading import PackError, PackSettings, build_capabilities, resolve_spec, spec_label

__all__ = ["Lifecycle", "LoadedPack", "PackOpenError", "close_now", "close_reversed", "load", "load_spec"]

log = logging.getLogger("codemode.packs")


@runtime_checkable
class Lifecycle(Protocol):
    """What ``Server.attach`` takes: opened once before serving, closed once at shutdown."""

    async def open(self) -> None:
        """Acquire what serving needs (connections, files); raise to stop the start."""

    async def aclose(self) -> None:
        """Release everything; called also when :meth:`open` failed or never ran."""


class PackOpenError(PackError):
    """A pack's ``open()`` failed, so the server did not start.

    The message is one line naming the pack: ``pack 'db.py:pack': open failed: <type>: <text>``.
    ``component`` and ``setting`` name the start-up unit and its setting when the pack came from the
    host's configuration (None for a library pack).
    """

    def __init__(self, message: str, component: str | None = None, setting: str | None = None) -> None:
        """The error of one pack.

        Args:
            message: the one line.
            component: the start-up unit (``pack <spec>``, ``upstream_mcp <name>``), or None.
            setting: the flag and variable that configured it, or None.
        """
        super().__init__(message)
        self.component = component
        self.setting = setting


class LoadedPack:
    """One loaded pack: its capabilities and the object whose ``open()`` / ``aclose()`` (each
    optional, sync or async) this runs, once each."""

    def __init__(
        self,
        label: str,
        owner: Any,
        capabilities: Sequence[Capability],
        *,
        component: str | None = None,
        setting: str | None = None,
    ) -> None:
        """A pack whose capabilities were taken.

        Args:
            label: how messages name the pack (``pack 'records:pack'``).
            owner: the object whose ``capabilities()`` ran (None for a plain list: no lifecycle).
            capabilities: what it produced.
            component: the start-up unit it is, when it came from the host's configuration.
            setting: the flag and variable that configured it.
        """
        self.label = label
        self.owner = owner
        self.capabilities = list(capabilities)
        self.component = component
        self.setting = setting
        self._opened = False
        self._closed = False

    async def open(self) -> None:
        """Await the pack's ``open()`` (once; nothing when it has none or is closed).

        Raises:
            PackOpenError: it raised; one line naming the pack.
        """
        if self._opened or self._closed:
            return
        self._opened = True
        try:
            await _step(self.owner, "open")
        except Exception as exc:
            text = " ".join(str(exc).split()) or "(no message)"
            message = f"{self.label}: open failed: {type(exc).__name__}: {text}"
            raise PackOpenError(message, self.component, self.setting) from exc

    async def aclose(self) -> None:
        """Await the pack's ``aclose()`` (once, opened or not)."""
        if self._closed:
            return
        self._closed = True
        await _step(self.owner, "aclose")


async def _step(owner: Any, name: str) -> None:
    method = getattr(owner, name, None) if owner is not None else None
    if not callable(method):
        return
    result = method()
    if inspect.isawaitable(result):
        await result


def load(
    pack: Any,
    settings: PackSettings | None = None,
    *,
    label: str | None = None,
    component: str | None = None,
    setting: str | None = None,
    wrap: bool = True,
) -> LoadedPack:
    """Take a pack's capabilities; a pack whose ``capabilities()`` raises is closed at once.

    Args:
        pack: any pack form (``codemode.packs``: a Pack, a list, a capability, a factory).
        settings: what the host hands the pack (default: the process environment, no options).
        label: how messages name it (default: ``pack '<its name attribute or type>'``).
        component: the start-up unit, for the host's start-up problems.
        setting: the flag and variable that configured it.
        wrap: turn any failure into a :class:`PackError` naming the pack (False: re-raise as is).

    Returns:
        The :class:`LoadedPack` (not opened).

    Raises:
        PackError: the pack did not produce capabilities (any exception with ``wrap`` False).
    """
    label = label if label is not None else f"pack {_name_of(pack)!r}"
    owners: list[Any] = []
    try:
        caps = build_capabilities(pack, settings, label, owners, wrap=wrap)
    except BaseException:
        close_now([LoadedPack(label, owner, []) for owner in owners])
        raise
    return LoadedPack(label, owners[0] if owners else None, caps, component=component, setting=setting)


def load_spec(spec: str, settings: PackSettings | None = None, *, setting: str | None = None) -> LoadedPack:
    """:func:`load` of the object a ``module:object`` / ``path/to/file.py:object`` spec names.

    Args:
        spec: the spec.
        settings: what the host hands the pack.
        setting: the flag and variable that named it (``--pack / CODEMODE_PACKS``).

    Returns:
        The :class:`LoadedPack` (not opened), its component ``pack <spec>``.

    Raises:
        PackError: one line naming the pack (import or capabilities).
    """
    return load(
        resolve_spec(spec), settings, label=spec_label(spec), component=f"pack {spec}", setting=setting
    )


def _name_of(pack: Any) -> str:
    name = getattr(pack, "name", None)
    return name if isinstance(name, str) and name else type(pack).__name__


def close_now(resources: Sequence[Lifecycle]) -> None:
    """Close resources in reverse order from synchronous code (a build that failed after packs were
    loaded): on a loop of its own, in a thread when this thread runs one. A failure is logged.

    Args:
        resources: what to close, in the order it was loaded.
    """
    if not resources:
        return

    async def close_all() -> None:
        await close_reversed(resources)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(close_all())
        return
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="codemode-close") as pool:
        pool.submit(asyncio.run, close_all()).result()


async def close_reversed(resources: Sequence[Lifecycle]) -> None:
    """Await each one's ``aclose()``, last first; a failure is logged (one line) and the rest still
    close.

    Args:
        resources: what to close, in the order it was loaded or attached.
    """
    for resource in reversed(resources):
        try:
            await resource.aclose()
        except Exception as exc:
            name = getattr(resource, "label", type(resource).__name__)
            log.warning("%s: closing failed: %s: %s", name, type(exc).__name__, exc)
