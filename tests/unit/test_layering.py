"""The import structure of docs/ARCHITECTURE.md, checked on the source and read off the three roots
(host/, worker_image/, capabilities/) and their folders: the worker imports nothing from the host,
the core imports no front end, no operator tool, no configuration layer; front ends never import
each other; and no module takes part in an import cycle."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The import packages, each the folder of its name in its root.
PACKAGES = {
    "codemode": ROOT / "host" / "codemode",
    "codemode_worker": ROOT / "worker_image" / "codemode_worker",
    "codemode_capabilities": ROOT / "capabilities" / "codemode_capabilities",
}
HOST = PACKAGES["codemode"]

#: A module's layer is read off its root and folder: ``codemode_worker`` is the worker,
#: ``codemode_capabilities`` the shipped packs, ``codemode/<folder>/`` is the layer named in FOLDERS,
#: the package's own ``__init__`` is its public API. Inside ``startup/``, ``config`` sits below
#: ``bootstrap``.
FOLDERS = {
    "common": "common",
    "catalog": "catalog",
    "authz": "authz",
    "store": "store",
    "runtimes": "runtimes",
    "packs": "pack support",
    "execution": "execution",
    "startup": "bootstrap",
    "mcp": "mcp",
    "service": "service",
    "ops": "ops",
    "cli": "cli",
}
CORE = {"common", "catalog", "authz", "store", "runtimes", "pack support", "execution", "api"}


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "codemode_worker":
        return "worker"
    if parts[0] == "codemode_capabilities":
        return "packs"
    if module == "codemode":
        return "api"
    if module == "codemode.startup.config" or module.startswith("codemode.startup.config."):
        return "config"
    return FOLDERS.get(parts[1], "unknown")


#: Layers from the bottom up. A module may import its own layer and the layers listed as allowed.
ALLOWED: dict[str, set[str]] = {
    "worker": {"worker"},
    "common": {"common"},
    "catalog": {"catalog", "common", "worker"},
    "authz": {"authz", "common"},
    "store": {"store", "common"},
    "runtimes": {"runtimes", "common", "worker"},
    "pack support": {"pack support", "store", "catalog", "common", "worker"},
    "execution": {
        "execution",
        "pack support",
        "store",
        "catalog",
        "authz",
        "runtimes",
        "common",
        "worker",
    },
    "api": CORE | {"worker"},
    "packs": {"packs", *CORE, "worker"},
    "config": {"config", *CORE},
    "bootstrap": {"bootstrap", "config", *CORE, "worker"},
    "mcp": {"mcp", *CORE},
    "service": {"service", "mcp", "bootstrap", "config", *CORE},
    "ops": {"ops", "bootstrap", "config", *CORE, "worker"},
    "cli": {"cli", "mcp", "service", "ops", "bootstrap", "config", *CORE},
    "unknown": set(),
}


def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts]) if parts else package
            out[name] = path
    return out


def _resolve(module: str, path: Path, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """Every project module ``module`` imports (anywhere in the file), with the line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name:
                    yield name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node.level, node.module)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    yield full, node.lineno
                else:
                    name = base
                    while name and name not in known:
                        name = name.rpartition(".")[0]
                    if name:
                        yield name, node.lineno


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: {t for t, _ in imports(m, p, known) if t != m} for m, p in known.items()}


def test_the_walk_sees_the_project() -> None:
    g = graph()
    assert {
        "codemode.execution.server",
        "codemode.cli.main",
        "codemode.ops.bench",
        "codemode_worker.entry",
    } <= set(g)
    assert "codemode.startup.config" in g["codemode.startup.bootstrap"]
    assert "codemode.startup.bootstrap" in g["codemode.service.app"]


def test_layers() -> None:
    known = modules()
    problems = []
    for module, path in sorted(known.items()):
        for target, line in imports(module, path, known):
            if target == module:
                continue
            if layer(target) not in ALLOWED[layer(module)]:
                rel = path.relative_to(ROOT)
                problems.append(
                    f"{rel}:{line}: {module} ({layer(module)}) imports {target} ({layer(target)})"
                )
    assert problems == []


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    g = graph()
    # A package's __init__ that only re-exports its submodules is not a cycle with them.
    for package in [m for m, p in modules().items() if p.name == "__init__.py"]:
        for child in list(g):
            if child.startswith(package + ".") and package in g[child]:
                g[child] = g[child] - {package}
    assert _cycles(g) == []


@pytest.mark.parametrize(
    ("module", "target", "ok"),
    [
        ("codemode.execution.server", "codemode.cli.main", False),
        ("codemode.execution.executor", "codemode.ops.bench", False),
        ("codemode.execution.session", "codemode.startup.config", False),
        ("codemode.service.app", "codemode.cli.main", False),
        ("codemode.ops.quotas", "codemode.service.app", False),
        ("codemode_worker.entry", "codemode.execution.server", False),
        ("codemode.common.errors", "codemode.execution.executor", False),
        ("codemode.catalog.capability", "codemode.execution.server", False),
        ("codemode.runtimes.base", "codemode.authz", False),
        ("codemode.startup.config", "codemode.startup.bootstrap", False),
        ("codemode.mcp.adapter", "codemode.service.app", False),
        ("codemode.service.app", "codemode.startup.bootstrap", True),
        ("codemode.cli.serve", "codemode.service", True),
        ("codemode.startup.bootstrap", "codemode_capabilities.upstreams", False),
        ("codemode_capabilities.records", "codemode.packs", True),
    ],
)
def test_the_rules_can_fail(module: str, target: str, ok: bool) -> None:
    assert (layer(target) in ALLOWED[layer(module)]) is ok


def test_every_folder_is_a_layer() -> None:
    """A new folder must be given its layer here; ``codemode`` has no root module besides its API."""
    folders = {p.name for p in HOST.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(FOLDERS)
    assert [p.stem for p in HOST.glob("*.py")] == ["__init__"]


def test_the_roots_are_the_design_cards() -> None:
    """The top level holds the three package roots and nothing else of Python: no ``src/`` beside them."""
    assert not (ROOT / "src").exists()
    for package, folder in PACKAGES.items():
        assert (folder / "__init__.py").is_file(), package
        assert importlib.import_module(package).__file__ == str(folder / "__init__.py")


#: What a shipped pack may import from the host: the pack-author API (docs/reference/python-api.md).
PACK_AUTHOR_API = {"codemode", "codemode.packs", "codemode.authz"}


def test_shipped_packs_import_only_the_pack_author_api() -> None:
    """``codemode_capabilities`` is written as any pack author writes a pack: from ``codemode``,
    ``codemode.packs`` and ``codemode.authz``, never a core module's internals (so the core can move
    its modules without breaking a pack), and nothing of the host imports a shipped pack by name."""
    known = modules()
    problems = []
    for module, path in sorted(known.items()):
        for target, line in imports(module, path, known):
            shipped, reaches = module.startswith("codemode_capabilities"), target.split(".")[0]
            if shipped and reaches == "codemode" and target not in PACK_AUTHOR_API:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target}")
            if reaches == "codemode_capabilities" and not shipped:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {module} imports the shipped {target}")
    assert problems == []


def test_a_cycle_is_found() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
