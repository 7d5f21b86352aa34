"""The writable-paths probe of a compromised worker, for the Kubernetes and Docker
escape tests (no tests here).

``PROBE`` is Python for the TEST-ONLY worker entry. It tries to store data everywhere a worker could:
every mount point of ``/proc/self/mountinfo`` and every directory under ``/`` (``/proc`` and ``/sys``
left out: nothing there stores data), appending ``CHUNK`` bytes to each file mount point (such as
Kubernetes' ``/dev/termination-log``) and to each regular file it finds writable, creating a file in
each directory. It reports ``"stored"``: ``{path: bytes stored}`` for every path that took an open
for writing (0 when the writes then failed), ``"mounts"``: ``{mount point: what opening it for
writing gave}`` for the read-write mounts, ``"fsize"`` (the worker's ``RLIMIT_FSIZE``) and
``"checked"`` (directories walked). Character devices (``/dev/null`` ...) store nothing and are left
out.
"""

from __future__ import annotations

import textwrap

__all__ = ["CHUNK", "PROBE"]

#: Bytes the probe tries to store in each place (the bound it must not get past is 0).
CHUNK = 1 << 20

PROBE = textwrap.dedent(
    r"""
    import errno, os, resource, stat

    CHUNK = CHUNK_BYTES
    stored = {}

    def name(exc):
        return errno.errorcode.get(exc.errno, str(exc.errno))

    def fill(path, fd):
        block, total = b"x" * 65536, 0
        try:
            while total < CHUNK:
                total += os.write(fd, block)
        except OSError:
            pass
        finally:
            os.close(fd)
        stored[path] = total
        return "opened"

    def append(path):
        try:
            st = os.stat(path)
        except OSError:
            return
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            return name(exc)
        return fill(path, fd)

    def create(directory):
        path = os.path.join(directory, ".codemode-write-probe")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except OSError as exc:
            return name(exc)
        outcome = fill(directory, fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        return outcome

    mounts = {}
    for line in proc_text("/proc/self/mountinfo").splitlines():
        fields = line.split()
        point, options = fields[4], fields[5].split(",")
        if "rw" in options and not point.startswith(("/proc", "/sys")):
            mounts[point] = create(point) if os.path.isdir(point) else append(point)
    checked = 0
    for root, dirs, files in os.walk("/"):
        if root.startswith(("/proc", "/sys")):
            dirs[:] = []
            continue
        checked += 1
        create(root)
        for f in files:
            append(os.path.join(root, f))
    final({"stored": stored, "mounts": mounts, "checked": checked,
           "fsize": list(resource.getrlimit(resource.RLIMIT_FSIZE))})
    """
).replace("CHUNK_BYTES", str(CHUNK))
