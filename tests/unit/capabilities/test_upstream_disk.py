"""codemode_capabilities.mcp.disk: measuring and removing what a tenant's server left in its
directory, whatever shape it has (deeper than the recursion limit and than PATH_MAX, links,
directories it made unreadable)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codemode_capabilities.mcp.disk import measure, remove_tree


def deep_chain(root: Path, levels: int) -> Path:
    """``levels`` nested directories ``a/a/...`` under ``root``, made relative to each one (so the
    chain may be longer than PATH_MAX, as a server that changes directory can make it)."""
    script = (
        "import os, sys\n"
        "os.chdir(sys.argv[1])\n"
        "for _ in range(int(sys.argv[2])):\n"
        "    os.mkdir('a')\n    os.chdir('a')\n"
        "open('leaf', 'w').write('x' * 5000)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(root), str(levels)], check=True)
    return root


def test_shutil_rmtree_of_this_python_cannot_remove_such_a_tree(tmp_path: Path) -> None:
    """Why the module exists: on Python 3.11 this is a RecursionError, which ``ignore_errors``
    does not cover."""
    (tmp_path / "t").mkdir()
    tree = deep_chain(tmp_path / "t", 1500)
    if sys.version_info < (3, 12):
        with pytest.raises(RecursionError):
            shutil.rmtree(tree, ignore_errors=True)
    assert remove_tree(tree) == 0 and not tree.exists()


def test_a_tree_deeper_than_path_max_is_measured_and_removed(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    deep_chain(root, 3000)  # 6,000 bytes of "a/": past PATH_MAX (4096)
    usage = measure(root)
    assert usage.entries == 3001 and not usage.over
    assert usage.bytes >= 3000 * 512  # every directory takes a block
    assert remove_tree(root) == 0 and not root.exists()


def test_measure_stops_past_its_bounds(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    for i in range(50):
        (root / f"f{i}").write_bytes(b"x" * 8192)
    assert measure(root) == measure(root, max_entries=50)
    assert not measure(root).over and measure(root).entries == 50
    over = measure(root, max_entries=10)
    assert over.over and over.entries == 11
    small = measure(root, max_bytes=4 * 8192)
    assert small.over and small.entries < 50
    assert measure(tmp_path / "missing") == measure(tmp_path / "missing", 1, 1)
    assert not measure(tmp_path / "missing").over


def test_links_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    root = tmp_path / "t"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "to-outside").symlink_to(outside, target_is_directory=True)
    (root / "to-file").symlink_to(outside / "keep.txt")
    assert measure(root).entries == 3  # sub, sub/to-outside, to-file: nothing of outside
    assert remove_tree(root) == 0 and not root.exists()
    assert (outside / "keep.txt").read_text() == "keep"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads directories of any mode")
def test_a_directory_made_unreadable_is_removed_all_the_same(tmp_path: Path) -> None:
    root = tmp_path / "t"
    locked = root / "locked" / "inner"
    locked.mkdir(parents=True)
    (locked / "x").write_text("x")
    os.chmod(locked, 0)
    os.chmod(root / "locked", 0)
    assert measure(root).entries == 1  # the locked directory itself; its inside is unreadable
    assert remove_tree(root) == 0 and not root.exists()


def test_removing_a_file_or_nothing(tmp_path: Path) -> None:
    assert remove_tree(tmp_path / "missing") == 0
    (tmp_path / "f").write_text("x")
    assert remove_tree(tmp_path / "f") == 0 and not (tmp_path / "f").exists()
