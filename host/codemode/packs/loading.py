"""Capability packs: Python objects a deployment names in its configuration as ``module:object``.

A pack is any of

* an object with a method ``capabilities(settings: PackSettings) -> Sequence[Capability]``
  (the :class:`Pack` protocol; preferred: the pack can read its configuration from ``settings``),
* a list or tuple of :class:`~codemode.Capability`,
* a single :class:`~codemode.Capability`,
* a callable returning a sequence of capabilities, called with ``settings`` when it takes one
  parameter and with nothing when it takes none.

``object`` may be a dotted attribute path inside the module (``pkg.mod:Holder.pack``). The module is
looked up on ``sys.path`` and then in the current working directory; a spec whose module part is a
file path (``./weather.py:pack``, ``/opt/packs/weather.py:pack``) loads that file. Packs are
trusted code: importing one runs it in the host. Loading problems raise :class:`PackError` with a
message naming the pack; capability problems are left to ``Builder.build()``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..catalog.answers import AnswerBounds
from ..catalog.capability import Capability

__all__ = [
    "Pack",
    "PackError",
    "PackSettings",
    "build_capabilities",
    "has_lifecycle",
    "load_pack",
    "load_packs",
    "pack_capabilities",
    "resolve_spec",
    "spec_label",
    "split_specs",
]

log = logging.getLogger("codemode.packs")


@dataclass(frozen=True)
class PackSettings:
    """What the host hands a pack when asking for its capabilities.

    ``environ`` is a snapshot of the host's environment (packs read their own ``CODEMODE_<PACK>_*``
    variables from it); ``options`` holds ``KEY=VALUE`` pairs from ``--pack-option`` /
    ``CODEMODE_PACK_OPTIONS``. Both are trusted operator configuration, never client input.
    ``data_dir`` is where packs keep state on disk (``--data-dir``; None: keep it in memory);
    ``multi_tenant`` whether the host serves many subjects (``serve --http``) rather than one;
    ``answer_bounds`` the server's search and describe response bounds (a pack converting someone
    else's tools skips one whose answers would not fit).
    """

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    options: Mapping[str, str] = field(default_factory=dict)
    #: Where packs keep state on disk (``--data-dir``), or None: keep it in memory.
    data_dir: Path | None = None
    #: Whether the host serves many subjects (``serve --http``) rather than one (``serve --stdio``).
    multi_tenant: bool = False
    #: The server's search and describe response bounds: a pack converting someone else's tools
    #: skips one whose answers would not fit (``codemode.packs.upstream.answer_problem``).
    answer_bounds: AnswerBounds = field(default_factory=AnswerBounds)

    def get(self, key: str, default: str | None = None) -> str | None:
        """One setting of the pack.

        Args:
            key: the option's (and environment variable's) name.
            default: what to return when neither is set.

        Returns:
            The option if set, else the environment variable of that name, else ``default``.
        """
        if key in self.options:
            return self.options[key]
        return self.environ.get(key, default)


@runtime_checkable
class Pack(Protocol):
    """A pack object: builds its capabilities from the host's settings."""

    def capabilities(self, settings: PackSettings) -> Sequence[Capability]:
        """The pack's capabilities, taken once while the server is built.

        Args:
            settings: the host's environment, ``--pack-option`` values, data dir and answer bounds.

        Returns:
            The capabilities, in the pack's order.
        """
        ...


class PackError(Exception):
    """A pack could not be imported or did not produce capabilities."""


def split_specs(values: Iterable[str]) -> list[str]:
    """Flatten comma-separated pack specs, dropping blanks and duplicates (first one wins).

    Args:
        values: specs, each possibly a comma-separated list.

    Returns:
        The specs, in order.
    """
    out: list[str] = []
    for value in values:
        for part in value.split(","):
            spec = part.strip()
            if spec and spec not in out:
                out.append(spec)
    return out


def _is_path(module_name: str) -> bool:
    return module_name.endswith(".py") or "/" in module_name or os.sep in module_name


def _import_file(spec: str, path: Path) -> Any:
    """Import a pack file under a private module name (so it cannot shadow an installed module)."""
    if not path.is_file():
        where = (
            f" (looked for {str(path.absolute())!r}, relative to the current folder)"
            if not path.is_absolute()
            else ""
        )
        what = "is not a file" if path.exists() else "does not exist"
        raise PackError(f"pack {spec!r}: file {str(path)!r} {what}{where}")
    name = "codemode_pack_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise PackError(f"pack {spec!r}: {str(path)!r} is not a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise PackError(
            f"pack {spec!r}: importing {str(path)!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _import_module(spec: str, module_name: str) -> Any:
    """Import from ``sys.path``, then from the working directory."""
    cwd = os.getcwd()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and module_name != missing and not module_name.startswith(missing + "."):
            raise PackError(
                f"pack {spec!r}: importing {module_name!r} failed: ModuleNotFoundError: {exc}"
            ) from exc
        if cwd in sys.path:
            raise PackError(
                f"pack {spec!r}: no module {module_name!r} on the Python path or in {cwd!r}"
            ) from exc
    except Exception as exc:
        raise PackError(
            f"pack {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    sys.path.append(cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise PackError(
            f"pack {spec!r}: no module {module_name!r} on the Python path or in {cwd!r} ({exc})"
        ) from exc
    except Exception as exc:
        raise PackError(
            f"pack {spec!r}: importing {module_name!r} from {cwd!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        if cwd in sys.path:
            sys.path.remove(cwd)


#: The shipped packs' modules before they became the package ``codemode_capabilities``.
_OLD_PACKS = "codemode.capabilities"
_MOVED = {"mcp_upstream": "mcp", "openapi": "openapi", "records": "records", "upstreams": "upstreams"}


def _moved(module_name: str) -> str | None:
    """The new module of an old shipped-pack module name (``codemode.capabilities.records``), else None."""
    if module_name != _OLD_PACKS and not module_name.startswith(_OLD_PACKS + "."):
        return None
    leaf = module_name[len(_OLD_PACKS) + 1 :].partition(".")[0]
    return "codemode_capabilities" + (f".{_MOVED[leaf]}" if leaf in _MOVED else "")


def resolve_spec(spec: str) -> Any:
    """Import the object a pack spec names.

    Args:
        spec: ``module:object`` (``object`` may be a dotted path) or ``path/to/file.py:object``.

    Returns:
        The object.

    Raises:
        PackError: a malformed spec, a module or file that cannot be imported, a missing attribute.
    """
    module_name, sep, attr_path = spec.rpartition(":")
    if not sep or not module_name or not attr_path:
        raise PackError(
            f"pack {spec!r}: expected module:object or path/to/file.py:object, "
            "e.g. codemode_capabilities.records:pack"
        )
    moved = _moved(module_name)
    if moved:
        raise PackError(
            f"pack {spec!r}: the packs that ship moved to codemode_capabilities: use {moved}:{attr_path}"
        )
    obj: Any
    if _is_path(module_name):
        obj = _import_file(spec, Path(module_name))
    else:
        obj = _import_module(spec, module_name)
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise PackError(f"pack {spec!r}: {module_name!r} has no attribute {attr_path!r}") from None
    return obj


def _call_factory(factory: Callable[..., Any], settings: PackSettings, label: str) -> Any:
    try:
        params = [
            p
            for p in inspect.signature(factory).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    if len(params) > 1:
        raise PackError(f"{label}: a pack factory takes no argument or one (settings)")
    return factory(settings) if params else factory()


def pack_capabilities(
    obj: Any, settings: PackSettings | None = None, label: str = "pack"
) -> list[Capability]:
    """The capabilities of one pack object (see the module docstring for the accepted forms).

    Args:
        obj: the pack: a :class:`Pack`, a list or tuple of capabilities, one capability, or a
            factory returning one of those.
        settings: what the host hands the pack (default: the process environment, no options).
        label: how error messages name the pack.

    Returns:
        The capabilities, in the pack's order.

    Raises:
        PackError: ``obj`` is none of the accepted forms, or did not produce capabilities.
    """
    return _produce(obj, settings, label, [])


def _produce(obj: Any, settings: PackSettings | None, label: str, owners: list[Any]) -> list[Capability]:
    """:func:`pack_capabilities`, appending to ``owners`` the object whose ``capabilities()`` runs
    (the pack, or a factory's product; nothing for a list or a capability) before it runs: the one
    whose lifecycle (``open``, ``aclose``) is the pack's, even when ``capabilities()`` raises."""
    settings = settings if settings is not None else PackSettings()
    if isinstance(obj, Capability):
        return [obj]
    method = getattr(obj, "capabilities", None)
    if callable(method) and not isinstance(obj, type):
        owners.append(obj)
        produced = method(settings)
    elif isinstance(obj, list | tuple):
        produced = obj
    elif callable(obj):
        produced = _call_factory(obj, settings, label)
        inner = getattr(produced, "capabilities", None)
        if callable(inner) and not isinstance(produced, type):
            owners.append(produced)  # a factory (or class) that built a Pack
            produced = inner(settings)
    else:
        raise PackError(
            f"{label}: expected a Pack (with capabilities(settings)), a list of Capability or a callable "
            f"returning one; got {type(obj).__name__}"
        )
    if isinstance(produced, Capability):
        produced = [produced]
    if isinstance(produced, str | bytes) or not isinstance(produced, Iterable):
        raise PackError(f"{label}: did not produce a list of Capability (got {type(produced).__name__})")
    caps = list(produced)
    for i, cap in enumerate(caps):
        if not isinstance(cap, Capability):
            raise PackError(f"{label}: item #{i + 1} is {type(cap).__name__}, not a codemode.Capability")
    return caps


def load_pack(spec: str, settings: PackSettings | None = None) -> list[Capability]:
    """Import ``module:object`` and return its capabilities, without its lifecycle.

    A pack with ``open()`` or ``aclose()`` (docs/packs.md, "A pack's lifecycle") is neither opened
    nor closed this way (a warning says so): give it to ``Builder.add_pack`` instead.

    Args:
        spec: ``module:object`` or ``path/to/file.py:object``.
        settings: what the host hands the pack (default: the process environment, no options).

    Returns:
        The pack's capabilities.

    Raises:
        PackError: one line naming the pack: it cannot be imported, or building its capabilities failed.
    """
    owners: list[Any] = []
    caps = build_capabilities(resolve_spec(spec), settings, spec_label(spec), owners)
    if any(has_lifecycle(owner) for owner in owners):
        log.warning(
            "pack %r has open()/aclose(): load_pack neither opens nor closes it; use Builder.add_pack", spec
        )
    return caps


def spec_label(spec: str) -> str:
    """How messages name the pack of a spec.

    Args:
        spec: the spec.

    Returns:
        ``pack 'module:object'``.
    """
    return f"pack {spec!r}"


def has_lifecycle(obj: Any) -> bool:
    """Whether a pack object has a lifecycle step.

    Args:
        obj: the pack object.

    Returns:
        True when it has an ``open()`` or ``aclose()``.
    """
    return any(callable(getattr(obj, step, None)) for step in ("open", "aclose"))


def build_capabilities(
    obj: Any, settings: PackSettings | None, label: str, owners: list[Any], *, wrap: bool = True
) -> list[Capability]:
    """:func:`pack_capabilities`, noting in ``owners`` the object whose lifecycle is the pack's.

    Args:
        obj: the pack (any accepted form).
        settings: what the host hands the pack.
        label: how messages name it.
        owners: receives the object whose ``capabilities()`` runs, before it runs.
        wrap: turn any failure into ``<label>: building its capabilities failed: <type>: <text>``.

    Returns:
        The capabilities.

    Raises:
        PackError: the pack did not produce capabilities (with ``wrap`` False, whatever it raised).
    """
    try:
        return _produce(obj, settings, label, owners)
    except PackError:
        raise
    except Exception as exc:
        if not wrap:
            raise
        problem = f"{type(exc).__name__}: {exc}"
        raise PackError(f"{label}: building its capabilities failed: {problem}") from exc


def load_packs(specs: Iterable[str], settings: PackSettings | None = None) -> list[Capability]:
    """:func:`load_pack` of several specs, in order (duplicates and comma lists are handled by
    :func:`split_specs`).

    Args:
        specs: the specs.
        settings: what the host hands the packs.

    Returns:
        Their capabilities, pack after pack.
    """
    settings = settings if settings is not None else PackSettings()
    caps: list[Capability] = []
    for spec in split_specs(specs):
        caps.extend(load_pack(spec, settings))
    return caps
