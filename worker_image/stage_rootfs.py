"""Build step of worker_image/Dockerfile: stage the worker's whole root file system in /rootfs.

Runs in the build stage as ``python3 -I /build/ctx/stage_rootfs.py``, after install_deps.py. Staged:
the interpreter, its standard library (without test suites, GUI kits, ensurepip/pip, venv), the
dependencies and the worker in /opt/codemode/site, and every shared library those ELF files load (as
the dynamic loader lists them). Paths keep their place; a symlink met on the way (usrmerge:
/lib -> usr/lib) is recreated as a symlink. The site directory becomes importable under
``python3 -I`` (which ignores PYTHONPATH) through a .pth file in the interpreter's own site-packages.
Everything is precompiled (the root file system is read-only at run time, so nothing could be cached
later), and no file keeps a setuid or setgid bit.
"""

import compileall
import glob
import os
import re
import shutil
import site
import stat
import subprocess
import sys
import sysconfig

ROOT = "/rootfs"
SITE = "/opt/codemode/site"
SKIP = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "venv",
    "pydoc_data",
    "unittest",
    "distutils",
    "config-3.11-x86_64-linux-gnu",
}
NOT_COMPILED = re.compile(r"/(test|idlelib|tkinter|turtledemo|ensurepip|lib2to3)/")


def place(path: str) -> str:
    """Recreate the symlinks on the way to ``path`` under ROOT; return the real path."""
    cur = "/"
    for part in path.strip("/").split("/"):
        src = os.path.join(cur, part)
        dst = ROOT + src
        if os.path.islink(src):
            if not os.path.lexists(dst):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.symlink(os.readlink(src), dst)
            cur = os.path.realpath(src)
        else:
            cur = src
    return cur


def copy(path: str) -> None:
    real = place(path)
    dst = ROOT + real
    if os.path.isdir(real) and not os.path.islink(real):
        os.makedirs(dst, exist_ok=True)
    elif not os.path.lexists(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(real, dst)


def stage_python(stdlib: str) -> list[str]:
    """Copy the interpreter, the standard library and the site; return the ELF files among them."""
    exe = sys.executable
    copy(exe)
    copy(os.path.realpath(exe))
    elves = [os.path.realpath(exe)]
    for top in (stdlib, SITE):
        for root, dirs, files in os.walk(top):
            if root == stdlib:
                dirs[:] = [
                    d
                    for d in dirs
                    if d not in SKIP
                    and not d.startswith("site-packages")
                    and not d.startswith("dist-packages")
                ]
            for n in files:
                p = os.path.join(root, n)
                copy(p)
                if n.endswith(".so") or ".so." in n:
                    elves.append(p)
    return elves


def stage_libraries(elves: list[str]) -> set[str]:
    """Copy every shared library the dynamic loader lists for ``elves``; return them."""
    loader = (glob.glob("/lib64/ld-linux*.so.*") + glob.glob("/lib/ld-linux*.so.*"))[0]
    needed = {loader}
    for elf in elves:
        out = subprocess.run([loader, "--list", elf], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"=> (/\S+)", line) or re.match(r"\s*(/\S+)", line)
            if m:
                needed.add(m.group(1))
    for lib in sorted(needed):
        copy(lib)
    for extra in ("/etc/ld.so.cache",):
        if os.path.exists(extra):
            copy(extra)
    return needed


def finish() -> None:
    """The .pth file for the site, a world-writable /tmp, no setuid or setgid bit anywhere."""
    sp = site.getsitepackages()[0]
    os.makedirs(ROOT + sp, exist_ok=True)
    with open(ROOT + sp + "/codemode-worker.pth", "w") as f:
        f.write(SITE + "\n")
    os.makedirs(ROOT + "/tmp", exist_ok=True)
    os.chmod(ROOT + "/tmp", 0o1777)
    for root, _dirs, files in os.walk(ROOT):
        for n in files:
            p = os.path.join(root, n)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))


def main() -> int:
    stdlib = sysconfig.get_paths()["stdlib"]
    ok = compileall.compile_dir(stdlib, quiet=1, workers=1, rx=NOT_COMPILED)
    ok = compileall.compile_dir(SITE, quiet=1, workers=1) and ok
    elves = stage_python(stdlib)
    needed = stage_libraries(elves)
    finish()
    print("staged", len(elves), "ELF files and", len(needed), "shared libraries")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
