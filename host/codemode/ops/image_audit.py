"""``codemode image audit IMAGE``: check a worker image against the hardening rules (docs/operators.md).

The audit reads the image three ways, all through the Docker Engine API:

1. its configuration (``inspect``): user, entrypoint, labels, environment, exposed ports, volumes,
   healthcheck, size;
2. its flattened filesystem, by exporting a container that is *created but never started*: the tar
   stream is read header by header (file data is skipped), so every file is seen whatever its
   permissions, no code from the image runs, and the image does not have to be honest about itself;
3. the protocol probe, by spawning one worker with :class:`~codemode.runtimes.docker.DockerRuntime`
   (the runtime's full hardening: network none, read-only root, cap-drop ALL, no-new-privileges, user
   65532:65532, limits); while it runs, a process of the worker's user beside it (``docker exec``:
   the container's confinement only, not the worker's own) tries to create a file in every
   directory it could store data in (``WRITABLE_PROBE``); then the worker is destroyed.

The rules themselves are pure functions in :mod:`codemode.ops.image_rules`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from codemode_worker import PROTOCOL_VERSION

from ..common.command import CommandError
from .image_rules import (
    ALLOWABLE,
    ROLE_LABEL,
    TABLE_FINDINGS,
    AuditError,
    AuditReport,
    Check,
    FsEntry,
    audit_config,
    audit_filesystem,
    fs_entry,
)

__all__ = [
    "AuditError",
    "AuditReport",
    "Check",
    "add_arguments",
    "audit_image",
    "export_entries",
    "format_report",
    "probe_checks",
    "run",
]

log = logging.getLogger("codemode.image_audit")


class _ChunkReader(io.RawIOBase):
    """A file object over an iterator of byte chunks (the SDK's export stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""
        self._off = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self._off >= len(self._buf):
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
            self._off = 0
        n = min(len(b), len(self._buf) - self._off)
        b[:n] = memoryview(self._buf)[self._off : self._off + n]
        self._off += n
        return n


def export_entries(api: Any, image: str) -> list[FsEntry]:
    """The flattened file system of ``image``: export a created (never started) container, then
    remove it.

    Args:
        api: the Engine API client.
        image: the image.

    Returns:
        One entry per tar member of the export.
    """
    cid = api.create_container(
        image,
        entrypoint=["/codemode-audit-never-started"],
        command=[],
        network_disabled=True,
        labels={ROLE_LABEL: "audit"},
        host_config=api.create_host_config(network_mode="none"),
    )["Id"]
    try:
        stream = api.export(cid, chunk_size=1024 * 1024)
        with tarfile.open(fileobj=_ChunkReader(iter(stream)), mode="r|", bufsize=64 * 1024) as tf:
            return [fs_entry(m) for m in tf]
    finally:
        try:
            api.remove_container(cid, force=True, v=True)  # v: the image's VOLUMEs made anonymous ones
        except Exception as exc:
            log.warning("could not remove audit container %s: %s", cid[:12], _shown(str(exc)))


# --------------------------------------------------------------------------------------------------
# Probe
# --------------------------------------------------------------------------------------------------


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.messages.append(record.getMessage())


#: Python run with ``docker exec`` as the worker's user beside the probed worker (``-I -S``: no
#: environment, no site directory). It tries to create a file (a random name) in every directory of
#: ``argv[1]`` (the runtime's masked paths), every read-write mount point (mountinfo's escapes
#: undone) and every directory of the image (``/proc`` and ``/sys`` not walked); a read-write mount
#: point that is a file is opened for appending (nothing written). It prints
#: ``{"writable": [...], "undecided": [...], "tried": N}``: ``EROFS``, ``EACCES`` and ``ENOENT``
#: (``/proc`` takes no new file) count as not writable, any other refusal leaves the place
#: undecided. The files it made stay: the container is removed after.
WRITABLE_PROBE = r"""
import errno, json, os, re, sys
name = ".codemode-audit-" + os.urandom(8).hex()
seen, writable, undecided = set(), [], []
def try_create(place):
    if place in seen:
        return
    seen.add(place)
    try:
        if os.path.isdir(place):
            os.close(os.open(os.path.join(place, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        elif os.path.isfile(place):
            os.close(os.open(place, os.O_WRONLY | os.O_APPEND))
        else:
            return
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.ENOENT):
            undecided.append(place + " (" + errno.errorcode.get(exc.errno, str(exc.errno)) + ")")
        return
    writable.append(place)
for place in json.loads(sys.argv[1]):
    try_create(place)
with open("/proc/self/mountinfo") as mounts:
    for line in mounts:
        fields = line.split()
        if "rw" in fields[5].split(","):
            try_create(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
for root, dirs, _ in os.walk("/"):
    if root in ("/proc", "/sys") or root.startswith(("/proc/", "/sys/")):
        dirs[:] = []
    else:
        try_create(root)
print(json.dumps({"writable": writable, "undecided": undecided, "tried": len(seen)}))
"""

#: How long the probe may run, and how much of its output is read (the image is untrusted).
WRITABLE_PROBE_SECONDS = 30.0
_PROBE_OUTPUT_BYTES = 256 * 1024


def _run_probe(api: Any, container_id: str) -> tuple[int | None, bytes, bytes, bool]:
    """Exit code, stdout, stderr (each at most ``_PROBE_OUTPUT_BYTES``) and whether the output was
    cut, of ``WRITABLE_PROBE`` run in the container as the worker's user."""
    from docker.utils.socket import STDOUT, frames_iter

    from ..runtimes.docker import WORKER_USER
    from ..runtimes.docker.attach import close_attach
    from ..runtimes.docker.masked_paths import MASKED_PATHS

    command = ["python3", "-I", "-S", "-c", WRITABLE_PROBE, json.dumps(list(MASKED_PATHS))]
    run = api.exec_create(container_id, command, user=WORKER_USER)
    out, err = bytearray(), bytearray()
    sock = api.exec_start(run["Id"], socket=True)
    try:
        for stream, data in frames_iter(sock, tty=False):
            (out if stream == STDOUT else err).extend(data)
            if len(out) > _PROBE_OUTPUT_BYTES or len(err) > _PROBE_OUTPUT_BYTES:
                return None, bytes(out[:_PROBE_OUTPUT_BYTES]), bytes(err[-4096:]), True
    finally:
        close_attach(sock)
    code = api.exec_inspect(run["Id"]).get("ExitCode")
    return code, bytes(out), bytes(err[-4096:]), False


async def writable_check(api: Any, container_id: str, *, seconds: float = WRITABLE_PROBE_SECONDS) -> Check:
    """Whether the worker's user can store data anywhere in a running worker container, with the
    container's confinement only (``WRITABLE_PROBE`` through ``docker exec``).

    The probe runs the image's own ``python3``: an image can make it lie, so this checks the OCI
    runtime's mounts under an image you trust (the other checks vet the image itself).

    Args:
        api: a ``docker.APIClient``.
        container_id: the running worker's container (the caller removes it after; that also ends
            a probe still running past ``seconds``).
        seconds: how long the probe may run.

    Returns:
        The ``writable mounts`` check: PASS with how many places were tried, FAIL with the writable
        ones (a mount the OCI runtime left writable, such as crun 1.8.1's masked directories), the
        undecided ones, or why the check could not run.
    """
    name = "writable mounts"
    err = b""
    try:
        code, out, err, cut = await asyncio.wait_for(
            asyncio.to_thread(_run_probe, api, container_id), seconds
        )
        if cut:
            raise ValueError(f"the probe wrote more than {_PROBE_OUTPUT_BYTES} bytes")
        if code != 0:
            raise ValueError(f"the probe exited with {code}")
        found = json.loads(out)
        writable = [str(w) for w in found["writable"]]
        undecided = [str(u) for u in found["undecided"]]
        tried = int(found["tried"])
    except TimeoutError:
        return Check(name, "FAIL", f"could not run the check: the probe ran longer than {seconds:.0f} s")
    except Exception as exc:
        tail = err.decode(errors="replace").strip()[-300:]
        return Check(
            name, "FAIL", f"could not run the check: {type(exc).__name__}: {exc}", [tail] if tail else []
        )
    if writable:
        return Check(
            name,
            "FAIL",
            f"the worker's user can write in {len(writable)} of {tried} places "
            "(the OCI runtime left them writable)",
            writable[:20],
        )
    if undecided:
        return Check(
            name,
            "FAIL",
            f"{len(undecided)} of {tried} places refused with an unexpected error",
            undecided[:20],
        )
    return Check(name, "PASS", f"none of {tried} places writable by the worker's user (container alone)")


async def probe_checks(
    image: str, *, api: Any, base_url: str | None, oci_runtime: str | None, timeout: float
) -> list[Check]:
    """Spawn one worker under the Docker runtime's hardening, wait for ``probe_ack``, check what its
    user could write (``writable_check``), destroy it.

    Args:
        image: the image.
        api: a ``docker.APIClient`` for the same daemon (the writable check's ``exec``).
        base_url: the Docker daemon (None: the environment's).
        oci_runtime: the OCI runtime to use (None: the daemon's default).
        timeout: seconds the spawn may take.

    Returns:
        The ``protocol probe`` check (PASS with the time taken, or FAIL with why) and, when the
        worker answered, the ``writable mounts`` check.
    """
    from ..runtimes.docker import WORKER_USER, DockerOptions, DockerRuntime

    name = "protocol probe"
    runtime_log = logging.getLogger("codemode.runtimes.docker")
    capture = _Capture()
    runtime_log.addHandler(capture)  # keeps runtime warnings out of the report's stderr
    try:
        options = DockerOptions(
            image=image,
            base_url=base_url,
            oci_runtime=oci_runtime,
            cleanup_orphans="none",
            spawn_timeout=timeout,
        )
        runtime = DockerRuntime(options)
        try:
            t0 = time.perf_counter()
            sandbox = await runtime.spawn()
            elapsed = time.perf_counter() - t0
            try:
                writable = await writable_check(api, sandbox.container_id)
            finally:
                await sandbox.destroy()
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            extra = [m for m in capture.messages if "failed to start" in m]
            return [
                Check(
                    name,
                    "FAIL",
                    f"no probe_ack under the runtime's hardening: {why}",
                    [m[:1000] for m in extra[-1:]],
                )
            ]
        finally:
            await runtime.aclose()
    finally:
        runtime_log.removeHandler(capture)
    hardening = f"network none, read-only root, cap-drop ALL, no-new-privileges, user {WORKER_USER}"
    if oci_runtime:
        hardening += f", OCI runtime {oci_runtime}"
    return [Check(name, "PASS", f"probe_ack after {elapsed:.2f} s ({hardening})"), writable]


# --------------------------------------------------------------------------------------------------
# The audit
# --------------------------------------------------------------------------------------------------


def _client(base_url: str | None) -> Any:
    import docker

    try:
        kwargs: dict[str, Any] = (
            {"base_url": base_url} if base_url is not None else docker.utils.kwargs_from_env()
        )
        kwargs.setdefault("base_url", "unix:///var/run/docker.sock")
        api = docker.APIClient(version="auto", timeout=120, **kwargs)
        try:
            api.ping()
        except Exception:
            api.close()
            raise
    except Exception as exc:
        where = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        raise AuditError(f"Docker daemon unreachable at {where}: {exc}") from exc
    return api


def _image_uid(user: str) -> int | None:
    uid = user.partition(":")[0]
    return int(uid) if uid.isdigit() else None


async def audit_image(
    image: str,
    *,
    base_url: str | None = None,
    oci_runtime: str | None = None,
    probe: bool = True,
    probe_timeout: float = 10.0,
    allow: Sequence[str] = (),
) -> AuditReport:
    """Audit ``image`` (which must exist on the daemon: it is never pulled).

    Args:
        image: the image.
        base_url: the Docker daemon (None: the environment's).
        oci_runtime: the OCI runtime of the probe.
        probe: whether to spawn a worker (the protocol probe and the writable mounts check).
        probe_timeout: seconds the probe's spawn may take.
        allow: the shells, package managers or test entries accepted on purpose (they warn
            instead of failing).

    Returns:
        The report (a file system that cannot be read is a failed check).

    Raises:
        AuditError: the daemon is unreachable, or the image is missing or cannot be inspected.
    """
    import docker.errors

    api = await asyncio.to_thread(_client, base_url)
    try:
        try:
            info = await asyncio.to_thread(api.inspect_image, image)
        except docker.errors.ImageNotFound as exc:
            raise AuditError(f"image {image!r} not found on the daemon (the audit never pulls)") from exc
        except Exception as exc:
            raise AuditError(f"cannot inspect image {image!r}: {exc}") from exc
        config = info.get("Config") or {}
        checks = audit_config(config)
        try:
            entries = await asyncio.to_thread(export_entries, api, image)
        except Exception as exc:
            checks.append(
                Check(
                    "file system",
                    "FAIL",
                    f"could not read the image's file system: {type(exc).__name__}: {exc}",
                )
            )
        else:
            checks.extend(audit_filesystem(entries, _image_uid(str(config.get("User") or "")), allow))
        if probe:
            checks.extend(
                await probe_checks(
                    image, api=api, base_url=base_url, oci_runtime=oci_runtime, timeout=probe_timeout
                )
            )
        return AuditReport(
            image=image,
            image_id=str(info.get("Id") or ""),
            size_bytes=int(info.get("Size") or 0),
            platform=f"{info.get('Os', '?')}/{info.get('Architecture', '?')}",
            checks=checks,
        )
    finally:
        api.close()


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB ({n / 2**20:.1f} MiB)"


#: The longest detail or finding the table prints (the JSON report has each whole).
SHOWN_CHARS = 300


def _shown(text: str) -> str:
    """``text`` for a terminal: printable ASCII as it is; a backslash and every other character
    (control characters such as ESC and newlines, bidirectional overrides, invisible or combining
    characters, letters a terminal may reorder) as its escape, e.g. ``\\x1b``, so a file name or
    the probe's output in an image cannot move the cursor, recolour, hide or reorder the report, or
    pass for an escape it is not. At most ``SHOWN_CHARS`` characters of it.

    Args:
        text: a detail or finding (from the image, the probe or the daemon).

    Returns:
        The escaped text, cut with a note of what was left out.
    """
    cut = text[:SHOWN_CHARS]
    out = "".join(ch if " " <= ch <= "~" and ch != "\\" else ascii(ch)[1:-1] for ch in cut)
    if len(text) > SHOWN_CHARS:
        out += f" ... ({len(text) - SHOWN_CHARS} more characters, --json)"
    return out


def format_report(report: AuditReport) -> str:
    """The report as a table: one line per check, the findings of those that did not pass (and of
    the shell check), then the verdict. Details and findings come from the image: they are shown
    in printable ASCII, each cut at ``SHOWN_CHARS`` characters (``_shown``).

    Args:
        report: the audit.

    Returns:
        The text.
    """
    lines = [
        f"codemode image audit: {_shown(report.image)}",
        f"id {report.image_id[:19]}  {_shown(report.platform)}  size {_size(report.size_bytes)}  "
        f"host protocol {PROTOCOL_VERSION}",
        "",
    ]
    width = max(len(c.name) for c in report.checks) if report.checks else 10
    lines.append(f"{'CHECK':<{width}}  STATUS  DETAIL")
    for c in report.checks:
        lines.append(f"{c.name:<{width}}  {c.status:<6}  {_shown(c.detail)}")
        if c.status != "PASS" or c.name == "shell":
            for finding in c.findings[:TABLE_FINDINGS]:
                lines.append(f"{'':<{width}}          - {_shown(finding)}")
            if len(c.findings) > TABLE_FINDINGS:
                lines.append(
                    f"{'':<{width}}          ... and {len(c.findings) - TABLE_FINDINGS} more (--json)"
                )
    counts = report.counts()
    verdict = "PASS" if report.ok else "FAIL"
    lines.append("")
    lines.append(
        f"result: {verdict} ({counts['PASS']} passed, {counts['WARN']} warning(s), {counts['FAIL']} failed)"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``codemode image audit``'s flags.

    Args:
        p: the subcommand's parser.
    """
    p.add_argument("image", metavar="IMAGE", help="image reference on the daemon (never pulled)")
    p.add_argument("--json", action="store_true", help="print a machine-readable JSON report")
    p.add_argument("--docker-base-url", metavar="URL", help="Docker Engine endpoint (default: DOCKER_HOST)")
    p.add_argument(
        "--docker-oci-runtime", metavar="NAME", help="OCI runtime for the protocol probe, e.g. runsc"
    )
    p.add_argument("--no-probe", action="store_true", help="skip the protocol probe (runs no container)")
    p.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="NAME",
        help="accept one shell, package manager or test entry on purpose (warns instead of failing): "
        + ", ".join(ALLOWABLE),
    )
    p.add_argument(
        "--probe-timeout", type=float, default=10.0, metavar="SECONDS", help="probe timeout (default 10)"
    )


def run(args: argparse.Namespace) -> int:
    """``codemode image audit``.

    Args:
        args: the parsed flags.

    Returns:
        The exit status: 0 when no check fails, 1 when one does.

    Raises:
        CommandError: status 2, the audit could not be carried out (daemon unreachable, image
            missing, bad arguments).
    """
    if not args.probe_timeout > 0:
        raise CommandError("--probe-timeout must be positive")
    unknown = sorted(set(args.allow) - set(ALLOWABLE))
    if unknown:
        raise CommandError(f"--allow {', '.join(unknown)}: not one of {', '.join(ALLOWABLE)}")
    try:
        report = asyncio.run(
            audit_image(
                args.image,
                base_url=args.docker_base_url,
                oci_runtime=args.docker_oci_runtime,
                probe=not args.no_probe,
                probe_timeout=args.probe_timeout,
                allow=args.allow,
            )
        )
    except AuditError as exc:
        if args.json:
            json.dump({"image": args.image, "ok": False, "error": str(exc)}, sys.stdout, indent=2)
            print()
        raise CommandError(_shown(str(exc))) from None
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        print()
    else:
        print(format_report(report))
    return 0 if report.ok else 1
