"""The public surface is documented where people read it: the public modules are the ones
docs/reference/python-api.md names (the contract: its inline ``codemode...`` names and code paths,
plus the few it names in words, NAMED_INDIRECTLY), and every exported callable of theirs has a
docstring of its own, with Google-style sections where it has something to
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

Every other module is internal: a private ``_name`` module (as httpx has them), or one whose
``__all__`` lists what its package uses, each callable with a docstring (a line will do). A name the
page spells that no module has fails, and so does a named module that exports no callable.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import logging
import pathlib
import re
import textwrap
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

import codemode

#: The contract (found from wherever this test file lives in tests/).
API_PAGE = next(
    p / "docs" / "reference" / "python-api.md"
    for p in pathlib.Path(__file__).resolve().parents
    if (p / "pyproject.toml").is_file()
)

#: What the page names in words rather than by module path (each with why). The runtimes' packages:
#: the page documents ``ProcessRuntime(options)``, ``DockerRuntime(options)``, ``KubernetesRuntime``,
#: ``WarmPool`` and their options by the ``codemode`` names, and runtimes.md by these packages. The
#: shipped packs: the page names them as "the packs that ship (``codemode_capabilities``)", and their
#: ``module:pack`` specs are what an operator writes.
NAMED_INDIRECTLY = (
    "codemode.runtimes.docker",
    "codemode.runtimes.kubernetes",
    "codemode.runtimes.process",
    "codemode.runtimes.reuse",
    "codemode_capabilities.mcp",
    "codemode_capabilities.openapi",
)
#: Dotted names the page spells that are not modules of the API: the packs' old import path, which
#: the page names only to say that it fails with a hint.
NOT_MODULES = ("codemode.capabilities",)
#: Named modules that are namespaces only (no callable of their own): the shipped packs' package and
#: the runtimes' (``codemode`` exports the runtimes).
NAMESPACES = ("codemode_capabilities", "codemode.runtimes")


def named_on_the_page(text: str) -> set[str]:
    """The dotted ``codemode...`` names in the page's inline code (``codemode.store.memory.MemoryStore``,
    ``codemode_capabilities.records:pack``), and the modules of its ``host/codemode/...`` code paths."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # the examples import, they name nothing
    names: set[str] = set()
    for span in re.findall(r"`([^`]+)`", prose):
        for path in re.findall(r"host/(codemode/[\w/]*\w)(?:\.py|/)", span):
            names.add(path.replace("/", ".").removesuffix(".__init__"))
        names.update(re.findall(r"(?<![\w./])(codemode(?:_capabilities)?(?:\.[A-Za-z_]\w*)*)", span))
    return {n for n in names if not any(n == x or n.startswith(x + ".") for x in NOT_MODULES)}


def module_of(name: str) -> tuple[str, list[str]]:
    """The longest prefix of a dotted name that imports as a module, and the attributes after it."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is not None and not module.startswith(err.name):
                raise  # the module exists and something it imports does not: not the page's fault
            continue
        return module, parts[cut:]
    return "", parts


def public_modules() -> list[str]:
    """The modules docs/reference/python-api.md names (the contract), and those it names indirectly."""
    named = {module_of(n)[0] for n in named_on_the_page(API_PAGE.read_text(encoding="utf-8"))}
    return sorted((named | set(NAMED_INDIRECTLY)) - {""} - set(NAMESPACES))


def modules_with_all() -> set[str]:
    """Every module of the host and the shipped packs that declares ``__all__`` (private modules,
    ``_name``, and their packages' contents left out)."""
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
    return declared


def internal_modules() -> list[str]:
    """Modules that declare ``__all__`` (what their package uses) without being on the page."""
    return sorted(modules_with_all() - set(public_modules()))


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
                    for item in part:
                        walk_one(item, caught)
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


def test_the_page_names_only_modules_and_names_that_exist() -> None:
    """Every dotted name the page spells is a module, or a module and names it has
    (``codemode.store.memory.MemoryStore``): a module renamed or gone fails here, not in a reader's
    import."""
    missing = []
    for name in sorted(named_on_the_page(API_PAGE.read_text(encoding="utf-8"))):
        module, attributes = module_of(name)
        if not module:
            missing.append(f"{name}: no such module")
            continue
        obj: Any = importlib.import_module(module)
        for attribute in attributes:
            if not hasattr(obj, attribute):
                missing.append(f"{name}: {module} has no {'.'.join(attributes)}")
                break
            obj = getattr(obj, attribute)
    assert missing == [], "\n".join(missing)


@pytest.mark.parametrize("module_name", public_modules())
def test_a_public_module_exports_documented_callables(module_name: str) -> None:
    """A module the page names is API: its ``__all__`` holds at least one callable (a class or a
    function), and the rule above holds for each (test_every_exported_callable_is_documented)."""
    callables = [name for name, obj in exported(module_name) if isinstance(obj, type | types.FunctionType)]
    assert callables, f"{module_name} is named by python-api.md but exports no callable"


@pytest.mark.parametrize("module_name", internal_modules())
def test_an_internal_modules_exports_have_a_docstring(module_name: str) -> None:
    """A module the page does not name is internal: what its ``__all__`` lists for its package needs
    a docstring (one line will do), not the sections of the API."""
    found = [
        f"{where}: no docstring"
        for where, obj in exported(module_name)
        if isinstance(obj, type | types.FunctionType) and not own_doc(obj)
    ]
    assert found == [], "\n".join(found)


def test_the_page_is_read() -> None:
    """The parse itself: the page's sections and code paths give the modules they name."""
    assert {"codemode", "codemode.authz.rego", "codemode.packs", "codemode.store.sqlite"} <= set(
        public_modules()
    )
    assert {"codemode.mcp.adapter", "codemode.startup.bootstrap", "codemode.cli"} <= set(public_modules())
    assert "codemode.capabilities" not in public_modules()
    text = "`codemode.store.memory.MemoryStore()`, `host/codemode/cli/` and `x.py:pack`\n"
    text += "```\n`codemode.nope`\n```\n"
    assert named_on_the_page(text) == {"codemode.store.memory.MemoryStore", "codemode.cli"}
    assert module_of("codemode.nope.Thing") == ("codemode", ["nope", "Thing"])  # then: no such name


def is_module(parts: list[str]) -> bool:
    try:
        return importlib.util.find_spec(".".join(parts)) is not None
    except (ImportError, ValueError):
        return False  # a name in a module (a function), not a module


def private_modules_reached(package: tuple[str, ...], source: str) -> list[str]:
    """The private modules (``a._b``) a module of ``package`` imports from outside their own package:
    ``from ..service._hosts import x`` from ``codemode.cli`` is one, ``from ._hosts import x`` from
    ``codemode.service`` is not. Private functions (``from m import _f``) are not modules: left out."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            targets = [module] + [[*module, a.name] for a in node.names if is_module([*module, a.name])]
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names]
        else:
            continue
        for target in targets:
            private = [
                i for i, part in enumerate(target) if part.startswith("_") and not part.startswith("__")
            ]
            if private and tuple(target[: private[0]]) != package[: private[0]]:
                out.append(".".join(target))
    return out


def test_a_private_module_is_its_packages_own() -> None:
    """A ``_name`` module (internal, as httpx has them) is imported only by the modules of its own
    package and their sub-packages, so making a module private is a promise the code keeps."""
    import codemode_capabilities

    found = []
    for top in (pathlib.Path(codemode.__file__).parent, pathlib.Path(codemode_capabilities.__file__).parent):
        for path in top.rglob("*.py"):
            parts = path.relative_to(top.parent).with_suffix("").parts
            package = parts[:-1]
            found += [
                f"{path}: {m}" for m in private_modules_reached(package, path.read_text(encoding="utf-8"))
            ]
    assert found == [], "\n".join(found)
    # the check itself: a neighbour's private module is refused, one's own package's is not
    assert private_modules_reached(("codemode", "cli"), "from ..service._hosts import x\n") == [
        "codemode.service._hosts"
    ]
    assert (
        private_modules_reached(("codemode", "service"), "from ._hosts import x\nfrom . import _jsonrpc\n")
        == []
    )
    assert private_modules_reached(("codemode", "cli"), "from ..service import _jsonrpc\n") == [
        "codemode.service._jsonrpc"
    ]


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
