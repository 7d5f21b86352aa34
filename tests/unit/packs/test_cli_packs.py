"""Pack loading (``codemode.packs``): every accepted form, and clear errors for the rest."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import codemode
from codemode import authz
from codemode.packs import (
    Pack,
    PackError,
    PackSettings,
    load_pack,
    load_packs,
    pack_capabilities,
    split_specs,
)


@dataclass
class In:
    x: int


@dataclass
class Out:
    y: int


def handler(ctx: codemode.CallContext, subject: authz.Subject, args: In) -> Out:
    return Out(args.x)


def cap(name: str) -> codemode.Capability:
    return codemode.Capability(name=name, summary=f"Summary of {name}.", handler=handler)


class ObjectPack:
    def __init__(self) -> None:
        self.seen: list[PackSettings] = []

    def capabilities(self, settings: PackSettings) -> list[codemode.Capability]:
        self.seen.append(settings)
        return [cap("obj.one"), cap("obj.two")]


class ClassPack:
    def capabilities(self, settings: PackSettings) -> list[codemode.Capability]:
        return [cap("cls.one")]


@pytest.fixture
def module() -> Iterator[Any]:
    mod: Any = types.ModuleType("packs_fixture_mod")
    mod.object_pack = ObjectPack()
    mod.list_pack = [cap("lst.one")]
    mod.tuple_pack = (cap("tup.one"),)
    mod.single = cap("single.one")
    mod.factory0 = lambda: [cap("fac.zero")]
    mod.factory1 = lambda settings: [cap("fac." + settings.get("SUFFIX", "none"))]
    mod.ClassPack = ClassPack
    mod.holder = types.SimpleNamespace(pack=[cap("nested.one")])
    mod.not_a_pack = 42
    mod.bad_items = [cap("ok.one"), "nope"]
    mod.factory2 = lambda a, b: []
    mod.raising = lambda: (_ for _ in ()).throw(RuntimeError("boom"))
    mod.returns_str = lambda: "records"
    sys.modules["packs_fixture_mod"] = mod
    yield mod
    del sys.modules["packs_fixture_mod"]


def names(caps: list[codemode.Capability]) -> list[str]:
    return [c.name for c in caps]


def test_forms(module: Any) -> None:
    settings = PackSettings(environ={}, options={"SUFFIX": "opt"})
    assert names(load_pack("packs_fixture_mod:object_pack", settings)) == ["obj.one", "obj.two"]
    assert module.object_pack.seen == [settings]
    assert names(load_pack("packs_fixture_mod:list_pack", settings)) == ["lst.one"]
    assert names(load_pack("packs_fixture_mod:tuple_pack", settings)) == ["tup.one"]
    assert names(load_pack("packs_fixture_mod:single", settings)) == ["single.one"]
    assert names(load_pack("packs_fixture_mod:factory0", settings)) == ["fac.zero"]
    assert names(load_pack("packs_fixture_mod:factory1", settings)) == ["fac.opt"]
    assert names(load_pack("packs_fixture_mod:ClassPack", settings)) == ["cls.one"]
    assert names(load_pack("packs_fixture_mod:holder.pack", settings)) == ["nested.one"]


def test_pack_protocol() -> None:
    assert isinstance(ObjectPack(), Pack)
    assert not isinstance([cap("a.b")], Pack)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("packs_fixture_mod", "expected module:object"),
        (":pack", "expected module:object"),
        ("packs_fixture_mod:", "expected module:object"),
        ("no_such_module_for_packs:pack", "no module 'no_such_module_for_packs' on the Python path or in"),
        ("./no_such_file_for_packs.py:pack", "does not exist"),
        ("packs_fixture_mod:missing", "has no attribute 'missing'"),
        ("packs_fixture_mod:not_a_pack", "expected a Pack"),
        ("packs_fixture_mod:bad_items", "item #2 is str"),
        ("packs_fixture_mod:factory2", "takes no argument or one"),
        ("packs_fixture_mod:raising", "building its capabilities failed: RuntimeError: boom"),
        ("packs_fixture_mod:returns_str", "did not produce a list of Capability"),
    ],
)
def test_errors_name_the_pack(module: Any, spec: str, message: str) -> None:
    with pytest.raises(PackError) as info:
        load_pack(spec, PackSettings(environ={}))
    assert message in str(info.value)
    assert str(info.value).startswith(f"pack {spec!r}")


def test_load_packs_dedupes_and_splits(module: Any) -> None:
    caps = load_packs(
        ["packs_fixture_mod:list_pack, packs_fixture_mod:single", "packs_fixture_mod:list_pack"],
        PackSettings(environ={}),
    )
    assert names(caps) == ["lst.one", "single.one"]


def test_split_specs() -> None:
    assert split_specs(["a:b, c:d", "", " ,a:b", "e:f"]) == ["a:b", "c:d", "e:f"]


def test_settings_lookup() -> None:
    s = PackSettings(environ={"A": "env", "B": "env"}, options={"A": "opt"})
    assert (s.get("A"), s.get("B"), s.get("C"), s.get("C", "d")) == ("opt", "env", None, "d")
    assert "PATH" in PackSettings().environ or PackSettings().environ == {}


def test_pack_capabilities_direct() -> None:
    assert names(pack_capabilities([cap("d.one")])) == ["d.one"]
    with pytest.raises(PackError, match="custom label"):
        pack_capabilities(object(), label="custom label")


PACK_FILE = """
from dataclasses import dataclass
from codemode import Capability


@dataclass
class Out:
    value: str


def hello(ctx, subject) -> Out:
    return Out("hi")


pack = [Capability(name="{ns}.hello", summary="Say hello.", handler=hello)]
"""


def test_pack_from_a_file_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "weather_file_pack.py").write_text(PACK_FILE.replace("{ns}", "weather"))
    monkeypatch.chdir(tmp_path)
    assert names(load_pack("./weather_file_pack.py:pack", PackSettings(environ={}))) == ["weather.hello"]
    assert names(load_pack(f"{tmp_path}/weather_file_pack.py:pack", PackSettings(environ={}))) == [
        "weather.hello"
    ]


def test_pack_module_found_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cwd_only_pack_mod.py").write_text(PACK_FILE.replace("{ns}", "cwdpack"))
    monkeypatch.chdir(tmp_path)
    assert names(load_pack("cwd_only_pack_mod:pack", PackSettings(environ={}))) == ["cwdpack.hello"]


def test_pack_import_failure_names_module_folder_and_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_pack_mod.py").write_text("raise ValueError('kaput')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PackError) as info:
        load_pack("broken_pack_mod:pack", PackSettings(environ={}))
    text = str(info.value)
    assert "'broken_pack_mod'" in text and str(tmp_path) in text and "ValueError: kaput" in text
    with pytest.raises(PackError) as info:
        load_pack("./broken_pack_mod.py:pack", PackSettings(environ={}))
    assert "ValueError: kaput" in str(info.value)


def test_a_missing_pack_file_names_the_folder_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PackError) as info:
        load_pack("./weather.py:pack", PackSettings(environ={}))
    expected = f"file 'weather.py' does not exist (looked for {str(tmp_path / 'weather.py')!r}, relative"
    assert expected in str(info.value)
    (tmp_path / "folder.py").mkdir()
    with pytest.raises(PackError, match=r"'folder\.py' is not a file"):
        load_pack("./folder.py:pack", PackSettings(environ={}))
