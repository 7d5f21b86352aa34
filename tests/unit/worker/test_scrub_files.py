"""The reuse mode's file scrub (codemode_worker.scrub) on a real directory: what a worker adds to a
writable mount is removed, an empty file it wrote is emptied again (what cannot be put back is
reported), an extended attribute it hangs
on a file that was there is removed, and a change it cannot undo is reported. (The whole scrub, as
PID 1 of a sandbox, is proven by the escape suites: tests/adversarial/test_docker_reuse.py and
tests/e2e_kubernetes/test_reuse.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codemode_worker import scrub


def _xattrs_supported(path: Path) -> bool:
    probe = path / "probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.probe", b"1")
    except OSError:
        return False
    finally:
        probe.unlink()
    return True


@pytest.fixture
def mount(tmp_path: Path) -> tuple[Path, list[bytes]]:
    (tmp_path / "log").write_bytes(b"")  # like /dev/termination-log: empty and writable
    (tmp_path / "kept").mkdir()
    return tmp_path, [os.fsencode(tmp_path)]


def test_added_files_are_removed_and_an_empty_file_is_emptied(mount: tuple[Path, list[bytes]]) -> None:
    root, roots = mount
    files = scrub._walk(roots)
    (root / "log").write_bytes(b"left for the next execute")
    (root / "new").write_bytes(b"x")
    (root / "kept" / "deep").mkdir()
    (root / "kept" / "deep" / "file").write_bytes(b"x")
    os.chmod(root / "kept" / "deep", 0)
    scrub._restore_files(files, roots)
    now = scrub._walk(roots)
    assert set(now) == set(files)  # everything added is gone, the mode-0 directory included
    assert (root / "log").read_bytes() == b""
    # What cannot be put back (a directory's times) is an anomaly: the sandbox is recycled.
    assert scrub._same_files(files, now) == f"file {str(root)!r} changed"
    assert scrub._same_files({k: v for k, v in files.items() if k != roots[0]}, now) == (
        f"file {str(root)!r} left behind"
    )


def test_an_added_extended_attribute_is_removed(mount: tuple[Path, list[bytes]]) -> None:
    root, roots = mount
    if not _xattrs_supported(root):
        pytest.skip(f"no user extended attributes on {root}'s file system")
    files = scrub._walk(roots)
    baseline = scrub._attributes(files)
    os.setxattr(root / "log", "user.codemode-leftover", b"a message for the next execute")
    os.setxattr(root / "kept", "user.codemode-leftover", b"x")
    assert scrub._attributes(files) != baseline
    scrub._restore_attributes(baseline, files)
    assert scrub._attributes(files) == baseline
    assert os.listxattr(root / "log") == []


def test_a_changed_attribute_of_the_baseline_is_reported_not_restored(
    mount: tuple[Path, list[bytes]],
) -> None:
    root, roots = mount
    if not _xattrs_supported(root):
        pytest.skip(f"no user extended attributes on {root}'s file system")
    os.setxattr(root / "log", "user.there-before", b"1")
    files = scrub._walk(roots)
    baseline = scrub._attributes(files)
    os.setxattr(root / "log", "user.there-before", b"2")
    scrub._restore_attributes(baseline, files)
    # The scrub compares this with the baseline: a difference is an anomaly (the sandbox is recycled).
    assert scrub._attributes(files) != baseline
