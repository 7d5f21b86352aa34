"""Build step of worker_image/Dockerfile: install the worker's dependencies and the worker package.

libseccomp's Python binding (module ``seccomp``, one ELF file with libseccomp linked in) is Debian's
``python3-seccomp``, not a wheel: it must be installed in the base image (scripts/provision-docker.sh
debootstraps it in; on another Debian base with apt, e.g. python:3.11-slim-bookworm, this step
installs it from Debian when it is missing). It is copied into the site directory, where the
root file system staging sees it as one more ELF file to stage with its libraries.

Runs in the build stage as ``python3 -I /build/ctx/install_deps.py``. The build context was copied to
/build/ctx: requirements.txt, an optional pre-fetched ``site/`` (the offline build of
scripts/provision-docker.sh) and ``codemode_worker/``. Everything lands in /opt/codemode/site; the
test-only entry (``testing_entry.py``) is left out of the production worker. ``DEPS`` is ``auto``
(``site/`` when the context has one, else PyPI), ``pypi`` or ``offline``.
"""

import importlib
import os
import shutil
import subprocess
import sys

CTX = "/build/ctx"
DST = "/opt/codemode/site"


def seccomp_binding(offline: bool) -> str:
    """The file of libseccomp's binding for this Python (installed from Debian if need be)."""
    try:
        seccomp = importlib.import_module("seccomp")
    except ImportError:
        if offline or shutil.which("apt-get") is None:
            sys.exit("the base image needs Debian's python3-seccomp (libseccomp's Python binding)")
        apt = ["apt-get", "-qq", "-o", "Dpkg::Use-Pty=0"]
        subprocess.run([*apt, "update"], check=True)
        subprocess.run([*apt, "install", "-y", "--no-install-recommends", "python3-seccomp"], check=True)
        sys.path.append("/usr/lib/python3/dist-packages")
        seccomp = importlib.import_module("seccomp")
    path = getattr(seccomp, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".so"):
        sys.exit(f"libseccomp's binding is not an extension module: {path}")
    return path


def main() -> None:
    deps = os.environ.get("DEPS") or "auto"
    pre = os.path.join(CTX, "site")
    have = os.path.isdir(pre) and any(n not in (".keep", ".complete") for n in os.listdir(pre))
    if deps not in ("auto", "pypi", "offline"):
        sys.exit(f"DEPS must be auto, pypi or offline, got {deps!r}")
    if deps == "offline" and not have:
        sys.exit("DEPS=offline needs a pre-fetched site/ directory in the build context")
    offline = deps == "offline" or (deps == "auto" and have)
    if offline:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "bin", ".keep", ".complete")
        shutil.copytree(pre, DST, ignore=ignore)
    else:
        pip = [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-compile"]
        pip += ["--disable-pip-version-check", "--only-binary=:all:", "--target", DST]
        subprocess.run([*pip, "-r", os.path.join(CTX, "requirements.txt")], check=True)
        shutil.rmtree(os.path.join(DST, "bin"), ignore_errors=True)
    shutil.copytree(
        os.path.join(CTX, "codemode_worker"),
        os.path.join(DST, "codemode_worker"),
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "testing_entry.py"),
    )
    shutil.copy2(seccomp_binding(offline), DST)
    sys.path.insert(0, DST)
    import starlark  # noqa: F401  (the interpreter's library must import from the staged site)

    print("worker deps from", "the build context (offline)" if offline else "PyPI")


if __name__ == "__main__":
    main()
