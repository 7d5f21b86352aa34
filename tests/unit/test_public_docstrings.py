"""The public surface is documented where people read it (issue 24 §4): every exported callable of
the public modules has a docstring of its own, with Google-style sections where it has something to
say (``Args:`` naming every parameter, ``Returns:``/``Yields:`` for a value, ``Raises:`` naming every
exception its body raises), dataclass fields are named in the class docstring, and each module's
``__all__`` is exactly its public names (nothing exported by accident, nothing public left out).

The rule, checked on each exported function and on each public method a class defines itself
(``__init__`` included; its ``Args:`` may be in the class docstring instead), properties excepted
from the sections (they are read, not called):

* a docstring of its own (a dataclass's generated ``Name(field, ...)`` text does not count);
* parameters (not ``self``/``cls``): an ``Args:`` section with a ``name:`` line for each;
* a return annotation other than ``None``: a ``Returns:`` (or ``Yields:``) section;
* a ``raise SomeError(...)`` in its own body: a ``Raises:`` section naming ``SomeError``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import logging
import pkgutil
import re
import textwrap
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

import codemode

#: The public modules: their ``__all__`` is the API (docs/reference/python-api.md). The submodules of
#: PACKAGES are public too.
PACKAGES = (
    "codemode.runtimes",
    "codemode.runtimes.docker",
    "codemode.runtimes.kubernetes",
    "codemode.runtimes.process",
    "codemode.runtimes.reuse",
    "codemode.store",
)
MODULES = (
    "codemode",
    "codemode.authz",
    "codemode.authz.rego",
    "codemode_capabilities.mcp.bounded_http",
    "codemode_capabilities.mcp.pool",
    "codemode_capabilities.mcp.session",
    "codemode_capabilities.mcp.upstream",
    "codemode_capabilities.mcp",
    "codemode_capabilities.openapi",
    "codemode_capabilities.openapi.pack",
    "codemode_capabilities.openapi.calls",
    "codemode_capabilities.openapi.config",
    "codemode_capabilities.openapi.operation",
    "codemode_capabilities.openapi.defaults",
    "codemode_capabilities.openapi.paths",
    "codemode_capabilities.records",
    "codemode_capabilities.state",
    "codemode_capabilities.mcp.stdio_relay",
    "codemode_capabilities.mcp.disk",
    "codemode_capabilities.mcp.loop",
    "codemode_capabilities.mcp.tenancy",
    "codemode_capabilities.mcp.commands",
    "codemode_capabilities.upstreams",
    "codemode.catalog.answers",
    "codemode.catalog.capability",
    "codemode.catalog.functions",
    "codemode.catalog.search",
    "codemode.catalog.stems",
    "codemode.catalog.suggest",
    "codemode.catalog.types",
    "codemode.cli",
    "codemode.cli.flags",
    "codemode.cli.stdio_refusal",
    "codemode.cli.main",
    "codemode.cli.serve",
    "codemode.cli.token",
    "codemode.common.command",
    "codemode.common.errors",
    "codemode.common.handoff",
    "codemode.common.outcomes",
    "codemode.common.passed",
    "codemode.execution.causes",
    "codemode.execution.admission",
    "codemode.execution.approval",
    "codemode.execution.approval_text",
    "codemode.execution.context",
    "codemode.execution.executor",
    "codemode.execution.session",
    "codemode.execution.handlers",
    "codemode.execution.frames",
    "codemode.execution.limits",
    "codemode.execution.observe",
    "codemode.execution.parallel",
    "codemode.execution.plan",
    "codemode.execution.progress",
    "codemode.execution.quota",
    "codemode.execution.quota_kubernetes",
    "codemode.execution.replay",
    "codemode.execution.report",
    "codemode.execution.builder",
    "codemode.execution.server",
    "codemode.execution.suspension",
    "codemode.execution.tracing",
    "codemode.execution.worker_text",
    "codemode.packs",
    "codemode.packs.error_text",
    "codemode.packs.jsonschema",
    "codemode.packs.lifecycle",
    "codemode.packs.loading",
    "codemode.packs.off_loop",
    "codemode.packs.redaction",
    "codemode.packs.health",
    "codemode.packs.registry",
    "codemode.packs.unescaping",
    "codemode.packs.upstream",
    "codemode.packs.upstream_answer",
    "codemode.mcp",
    "codemode.mcp.adapter",
    "codemode.mcp.approval",
    "codemode.mcp.progress",
    "codemode.mcp.retries",
    "codemode.ops.bench",
    "codemode.ops.image_audit",
    "codemode.ops.image_rules",
    "codemode.ops.percentile",
    "codemode.ops.quota_probes",
    "codemode.ops.quota_recommend",
    "codemode.ops.quotas",
    "codemode.service",
    "codemode.service.connection_guard",
    "codemode.service.app",
    "codemode.service.audit",
    "codemode.service.auth",
    "codemode.service.open_requests",
    "codemode.service.edge",
    "codemode.service.hosts",
    "codemode.service.jsonrpc",
    "codemode.service.listeners",
    "codemode.service.logconfig",
    "codemode.service.logfilter",
    "codemode.service.metrics",
    "codemode.service.peers",
    "codemode.service.refusals",
    "codemode.service.responses",
    "codemode.service.sessions",
    "codemode.service.stopping",
    "codemode.service.tokens",
    "codemode.startup.bootstrap",
    "codemode.startup.config",
    "codemode.startup.trace_export",
)


def public_modules() -> list[str]:
    names = list(MODULES)
    for package in PACKAGES:
        names.append(package)
        module = importlib.import_module(package)
        for info in pkgutil.iter_modules(module.__path__):
            if not info.name.startswith("_"):
                names.append(f"{package}.{info.name}")
    return names


def exported(module_name: str) -> Iterator[tuple[str, Any]]:
    module = importlib.import_module(module_name)
    for name in getattr(module, "__all__", []):
        yield f"{module_name}.{name}", getattr(module, name)


def own_doc(obj: Any) -> str:
    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__") or ""
        if dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            return ""  # the text dataclasses generates
        return inspect.cleandoc(doc)
    return inspect.cleandoc(getattr(obj, "__doc__", None) or "")


def section(doc: str, title: str) -> str | None:
    """The body of a Google-style section (``Args:``; also ``Args (of the constructor):``)."""
    match = re.search(rf"^\s*{title}( \([^)]*\))?:\s*$\n((?:^(?:\s+.*)?\n?)*)", doc + "\n", re.M)
    return match.group(2) if match else None


def names_parameter(args: str, name: str) -> bool:
    """Whether an ``Args:`` body has a ``name:`` line (also ``name (type):`` and ``a, name:``)."""
    word = r"\*{0,2}\w+"
    return re.search(rf"^\s+({word}, )*\*{{0,2}}{name}(, {word})*( \([^)]*\))?:", args, re.M) is not None


def raised_names(fn: Callable[..., Any]) -> set[str]:
    """The exception classes a function's own body raises by name (not a bare re-raise, not in a
    nested function, not inside a ``try`` whose own handler catches that name: the function
    answers those itself)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return set()
    tree = ast.parse(source)
    (top,) = tree.body
    out: set[str] = set()

    def name_of(node: ast.expr | None) -> str | None:
        if isinstance(node, ast.Call):
            node = node.func
        if isinstance(node, ast.Name) and node.id[:1].isupper():
            return node.id
        if isinstance(node, ast.Attribute) and node.attr[:1].isupper():
            return node.attr
        return None

    def caught_by(handlers: list[ast.ExceptHandler]) -> set[str]:
        names: set[str] = set()
        for handler in handlers:
            kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            names.update(n for k in kinds if (n := name_of(k)) is not None)
        return names

    def walk(node: ast.AST, caught: frozenset[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                name = name_of(child.exc)
                if name is not None and name not in caught:
                    out.add(name)
            if isinstance(child, ast.Try):
                for statement in child.body:
                    walk_one(statement, caught | caught_by(child.handlers))
                for part in (child.handlers, child.orelse, child.finalbody):
                    for statement in part:
                        walk_one(statement, caught)
                continue
            walk(child, caught)

    def walk_one(node: ast.AST, caught: frozenset[str]) -> None:
        walk(ast.Module(body=[node], type_ignores=[]) if isinstance(node, ast.stmt) else node, caught)

    walk(top, frozenset())
    return out


def parameters(fn: Callable[..., Any]) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters if p not in ("self", "cls")]


def returns_value(fn: Callable[..., Any]) -> bool:
    annotation = inspect.signature(fn).return_annotation
    return annotation not in (inspect.Signature.empty, None, "None", "NoReturn", "Never")


def problems_of_function(where: str, fn: Callable[..., Any], extra_doc: str = "") -> list[str]:
    doc = own_doc(fn)
    if not doc:
        return [f"{where}: no docstring"]
    out = []
    params = parameters(fn)
    if params:
        args = (section(doc, "Args") or "") + (section(extra_doc, "Args") or "")
        missing = [p for p in params if not names_parameter(args, p)]
        if missing:
            out.append(f"{where}: Args: does not name {missing}")
    sections = [section(d, t) for d in (doc, extra_doc) for t in ("Returns", "Yields")]
    if returns_value(fn) and fn.__name__ != "__init__" and all(s is None for s in sections):
        out.append(f"{where}: no Returns: section")
    raised = raised_names(fn)
    if raised:
        body = (section(doc, "Raises") or "") + (section(extra_doc, "Raises") or "")
        missing = sorted(r for r in raised if not re.search(rf"^\s+{r}\b", body, re.M))
        if missing:
            out.append(f"{where}: Raises: does not name {missing}")
    return out


def problems_of_class(where: str, cls: type) -> list[str]:
    doc = own_doc(cls)
    out = [] if doc else [f"{where}: no docstring"]
    if dataclasses.is_dataclass(cls):
        missing = [f.name for f in dataclasses.fields(cls) if not re.search(rf"\b{f.name}\b", doc)]
        if missing:
            out.append(f"{where}: the docstring does not name the fields {missing}")
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, property):
            if not (own_doc(member.fget) or inherited_doc(cls, name)):
                out.append(f"{where}.{name}: no docstring")
            continue
        fn = member.__func__ if isinstance(member, staticmethod | classmethod) else member
        if not isinstance(fn, types.FunctionType) or not fn.__qualname__.startswith(cls.__qualname__ + "."):
            continue  # not written in this class (e.g. the __init__ typing gives a Protocol)
        if name != "__init__" and not own_doc(fn) and inherited_doc(cls, name):
            continue  # implements a documented method of a base class (a runtime's spawn)
        if name == "__init__":
            if dataclasses.is_dataclass(cls) or not parameters(fn):
                continue
            if not own_doc(fn):  # the constructor documented in the class docstring
                params = parameters(fn)
                args = section(doc, "Args") or ""
                missing = [p for p in params if not names_parameter(args, p)]
                if missing:
                    out.append(f"{where}.__init__: Args: does not name {missing}")
                continue
        # the constructor's Args may be in the class docstring; an interface's method documents
        # the sections of its implementations
        out += problems_of_function(
            f"{where}.{name}", fn, doc if name == "__init__" else inherited_doc(cls, name)
        )
    return out


def protocols() -> list[type]:
    """The interfaces the package documents once, for every implementation."""
    from codemode import Observer, Runtime, Sandbox, authz
    from codemode.mcp import Resolver
    from codemode.packs import Lifecycle, Pack
    from codemode.service.auth import Authenticator
    from codemode.store import Store

    return [Runtime, Sandbox, authz.Authorizer, Resolver, Observer, Pack, Lifecycle, Authenticator, Store]


def inherited_doc(cls: type, name: str) -> str:
    """The docstring of ``name`` in the nearest base class that documents it, or in an interface of
    the package that ``cls`` implements (``DockerRuntime.spawn`` is ``Runtime.spawn``)."""
    implemented = [p for p in protocols() if p is not cls and _implements(cls, p)]
    for base in [*cls.__mro__[1:], *implemented]:
        member = base.__dict__.get(name)
        if member is None:
            continue
        fn = member.fget if isinstance(member, property) else member
        doc = own_doc(fn)
        if doc:
            return doc
    return ""


def _implements(cls: type, protocol: type) -> bool:
    members = [
        n
        for n, v in vars(protocol).items()
        if not n.startswith("_") and (callable(v) or isinstance(v, property))
    ]
    return bool(members) and all(hasattr(cls, n) for n in members)


def problems(where: str, obj: Any) -> list[str]:
    if isinstance(obj, type):
        return problems_of_class(where, obj)
    if isinstance(obj, types.FunctionType):
        return problems_of_function(where, obj)
    return []  # constants, modules, type aliases: not callables


@pytest.mark.parametrize("module_name", public_modules())
def test_every_exported_callable_is_documented(module_name: str) -> None:
    found = [p for where, obj in exported(module_name) for p in problems(where, obj)]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("module_name", public_modules())
def test_all_is_the_modules_public_names(module_name: str) -> None:
    """``__all__`` lists every public name the module defines (a class, a function, a constant),
    and only names it has; names it imports from elsewhere are re-exports only when listed."""
    module = importlib.import_module(module_name)
    assert hasattr(module, "__all__"), f"{module_name} has no __all__"
    listed = set(module.__all__)
    assert all(hasattr(module, name) for name in listed), sorted(n for n in listed if not hasattr(module, n))
    defined = {
        name
        for name in top_level_names(module)
        if not name.startswith("_")
        # a module's logger and its type variables are not API
        and not isinstance(getattr(module, name), logging.Logger | TypeVar)
    }
    assert sorted(defined - listed) == [], f"{module_name}: public but not in __all__"


def top_level_names(module: types.ModuleType) -> set[str]:
    """The names a module's own source binds at its top level (definitions and assignments, also
    under ``if``/``try``; not imports)."""
    tree = ast.parse(inspect.getsource(module))
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out.add(node.name)
            elif isinstance(node, ast.Assign):
                out.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.add(node.target.id)
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(node.orelse)

    visit(tree.body)
    out.discard("__all__")
    return out


def test_every_module_with_all_is_checked() -> None:
    """A module of the package that declares ``__all__`` is public and listed above (a new one
    cannot be left out by accident); private modules (``_rego_scan``) are the package's own."""
    import pathlib

    import codemode_capabilities

    declared = set()
    packages = (pathlib.Path(codemode.__file__).parent, pathlib.Path(codemode_capabilities.__file__).parent)
    for package, path in ((top, path) for top in packages for path in top.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        if re.search(r"^__all__\b", path.read_text(encoding="utf-8"), re.M):
            declared.add(".".join(parts))
    assert sorted(declared - set(public_modules())) == []


def test_the_rule_catches_what_it_should() -> None:
    """The check itself: an undocumented function, a missing parameter, return and raise."""

    def bare(x: int) -> int:
        if x:
            raise ValueError("x")
        return x

    def half(x: int, y: int) -> int:
        """Add.

        Args:
            x: one.
        """
        if x < 0:
            raise ValueError("negative")
        return x + y

    def answers_itself(x: int) -> int:
        """Answer.

        Args:
            x: one.

        Returns:
            0 for a negative ``x``.
        """
        try:
            if x < 0:
                raise ValueError("negative")
        except ValueError:
            return 0
        return x

    assert problems_of_function("bare", bare) == ["bare: no docstring"]
    assert problems_of_function("answers_itself", answers_itself) == []
    assert problems_of_function("half", half) == [
        "half: Args: does not name ['y']",
        "half: no Returns: section",
        "half: Raises: does not name ['ValueError']",
    ]
    assert codemode.__all__  # the package under test is importable
