"""The worker-image hardening rules, as pure functions over what an audit read from an image.

``audit_config`` judges the image configuration (``docker image inspect``'s ``Config``) and
``audit_filesystem`` the flattened file system (one :class:`FsEntry` per tar member of an export).
Nothing here talks to Docker: ``codemode.ops.image_audit`` gathers the inputs and runs the probe.

Every check is PASS, WARN or FAIL; the audit passes when no check fails. A check that could not be
carried out fails (the audit fails closed).
"""

from __future__ import annotations

import json
import posixpath
import re
import stat
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from codemode_worker import PROTOCOL_VERSION

__all__ = [
    "ALLOWABLE",
    "HARMLESS_ENV",
    "HARMLESS_ENV_PREFIXES",
    "MAX_FINDINGS",
    "PACKAGE_MANAGERS",
    "PROTOCOL_LABEL",
    "ROLE_LABEL",
    "RUNTIME_MOUNTS",
    "RUNTIME_UID",
    "SECRET_NAME",
    "SHELLS",
    "SHELL_DIRS",
    "TABLE_FINDINGS",
    "TEST_ENTRIES",
    "TMP_LIKE",
    "AuditError",
    "AuditReport",
    "Check",
    "FsEntry",
    "Status",
    "audit_config",
    "audit_filesystem",
    "fs_entry",
]

#: A check's verdict: the audit passes when none is ``FAIL``.
Status = Literal["PASS", "WARN", "FAIL"]

#: The image labels the audit reads: the worker protocol version, and the image's role.
PROTOCOL_LABEL = "io.codemode.protocol-version"
ROLE_LABEL = "io.codemode.role"
#: The uid the Docker runtime runs every worker as (``WORKER_USER``).
RUNTIME_UID = 65532
#: Environment variables an image may set: harmless for the worker (``-I`` ignores ``PYTHON*``).
HARMLESS_ENV = frozenset({"PATH", "LANG", "LANGUAGE", "TZ"})
HARMLESS_ENV_PREFIXES = ("PYTHON", "LC_")
#: A variable name that looks like a secret's.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE", re.IGNORECASE)
#: Places where a world-writable (sticky) directory is expected; the root file system is read-only
#: at run time anyway.
TMP_LIKE = ("/tmp", "/var/tmp", "/run/lock", "/var/lock", "/dev/shm")
#: Replaced by the container runtime at run time (Docker mounts /dev, /proc, /sys over them).
RUNTIME_MOUNTS = ("/dev", "/proc", "/sys")
#: Shells, by name, looked for in SHELL_DIRS.
SHELLS = ("sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "busybox")
SHELL_DIRS = ("/bin", "/usr/bin", "/sbin", "/usr/sbin", "/usr/local/bin")
#: Package managers, by the name ``--allow`` takes: their programs (in SHELL_DIRS) and their state.
PACKAGE_MANAGERS: dict[str, tuple[re.Pattern[str], ...]] = {
    "dpkg": (re.compile(r"^/(?:usr/)?s?bin/dpkg(?:-[\w-]+)?$"), re.compile(r"^/var/lib/dpkg$")),
    "apt": (re.compile(r"^/(?:usr/)?s?bin/apt(?:-[\w-]+|itude)?$"), re.compile(r"^/var/lib/apt$")),
    "pip": (
        re.compile(r"^/(?:usr/(?:local/)?)?bin/pip(?:3(?:\.\d+)?)?$"),
        re.compile(r"^/.*/(?:site|dist)-packages/pip$"),
        re.compile(r"^/.*/python3(?:\.\d+)?/ensurepip$"),
    ),
}
#: Test-only worker entries (``worker_image/Dockerfile --target testing``), by ``--allow`` name.
TEST_ENTRIES: dict[str, re.Pattern[str]] = {
    "testing_entry": re.compile(
        r"/codemode_worker/(?:testing_entry\.py|__pycache__/testing_entry\.[\w.-]+\.pyc)$"
    ),
}
_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
_SHORT_FLAGS = set("bBdEhIOPqsSuv")  # flags without a value (no -c, -m handled apart)
#: Findings listed per check in the JSON report, and in the table.
MAX_FINDINGS = 200
TABLE_FINDINGS = 8


class AuditError(Exception):
    """The audit could not be carried out at all (daemon unreachable, image missing)."""


@dataclass
class Check:
    """One check's verdict.

    Attributes:
        name: the check.
        status: ``PASS``, ``WARN`` or ``FAIL``.
        detail: one line saying why.
        findings: the paths or names found.
    """

    name: str
    status: Status
    detail: str
    findings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The check in the JSON report.

        Returns:
            Its fields, at most :data:`MAX_FINDINGS` findings and their total.
        """
        return {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "findings": self.findings[:MAX_FINDINGS],
            "findings_total": len(self.findings),
        }


@dataclass
class AuditReport:
    """The audit of one image.

    Attributes:
        image: the image as named.
        image_id: its id.
        size_bytes: its size.
        platform: its OS and architecture.
        checks: every check's verdict.
    """

    image: str
    image_id: str
    size_bytes: int
    platform: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        """Whether no check failed."""
        return not any(c.status == "FAIL" for c in self.checks)

    def counts(self) -> dict[str, int]:
        """How many checks have each verdict.

        Returns:
            ``{"PASS": n, "WARN": n, "FAIL": n}``.
        """
        return {s: sum(1 for c in self.checks if c.status == s) for s in ("PASS", "WARN", "FAIL")}

    def to_dict(self) -> dict[str, Any]:
        """The JSON report.

        Returns:
            The image, the protocol version, ``ok``, the counts and every check.
        """
        return {
            "image": self.image,
            "image_id": self.image_id,
            "size_bytes": self.size_bytes,
            "platform": self.platform,
            "protocol_version": PROTOCOL_VERSION,
            "ok": self.ok,
            "summary": {k.lower(): v for k, v in self.counts().items()},
            "checks": [c.to_dict() for c in self.checks],
        }


# --------------------------------------------------------------------------------------------------
# Configuration checks (pure: the ``Config`` section of ``docker image inspect``)
# --------------------------------------------------------------------------------------------------


def _check_user(user: str) -> Check:
    name = "user"
    if not user:
        return Check(name, "FAIL", "no USER: the image runs as root (uid 0) by default")
    uid, sep, gid = user.partition(":")
    if uid == "root":
        return Check(name, "FAIL", f"USER {user!r} is root (uid 0)")
    if not uid.isdigit():
        return Check(
            name,
            "FAIL",
            f"USER {user!r} is a name: it needs /etc/passwd and can't be verified as non-root; "
            "use a numeric uid:gid such as 65532:65532",
        )
    if int(uid) == 0:
        return Check(name, "FAIL", f"USER {user!r} is root (uid 0)")
    if sep and not gid.isdigit():
        return Check(name, "FAIL", f"USER {user!r}: the group {gid!r} is a name; use a numeric gid")
    if not sep:
        return Check(
            name,
            "WARN",
            f"USER {user!r} gives no group: without a passwd entry the process gets gid 0 (root group)",
        )
    if int(gid) == 0:
        return Check(name, "WARN", f"USER {user!r}: primary group is root (gid 0)")
    return Check(name, "PASS", f"{user} (numeric, non-root)")


def _python_argv_problem(argv: Sequence[str]) -> str | None:
    """Why ``argv`` is not ``python3 -I [flags] -m codemode_worker``, or None."""
    if not argv:
        return "no ENTRYPOINT or CMD"
    exe = posixpath.basename(argv[0])
    if exe in SHELLS or exe.endswith("sh"):
        return f"starts a shell ({argv[0]}); exec form `python3 -I -m codemode_worker` needs none"
    if not _PYTHON.match(exe):
        return f"runs {argv[0]!r}, not python3"
    isolated = False
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            module = argv[i + 1] if i + 1 < len(argv) else ""
            rest = list(argv[i + 2 :])
            if module == "codemode_worker.testing_entry":
                return "runs the TEST-ONLY worker entry (codemode_worker.testing_entry: arbitrary Python)"
            if module != "codemode_worker":
                return f"runs module {module!r}, not codemode_worker"
            if rest:
                return f"passes extra arguments to the worker: {rest!r}"
            if not isolated:
                return "python3 runs without -I (isolated mode: no environment-driven imports, no user site)"
            return None
        if arg in ("-X", "-W"):
            i += 2
            continue
        if arg.startswith(("-X", "-W")) and len(arg) > 2:
            i += 1
            continue
        if re.fullmatch(r"-[A-Za-z]+", arg) and set(arg[1:]) <= _SHORT_FLAGS:
            isolated = isolated or "I" in arg
            i += 1
            continue
        return f"unexpected interpreter argument {arg!r} (expected -I ... -m codemode_worker)"
    return "does not run `-m codemode_worker`"


def _check_entrypoint(entrypoint: Sequence[str] | None, cmd: Sequence[str] | None) -> Check:
    name = "entrypoint"
    ep = list(entrypoint or [])
    argv = ep + list(cmd or [])
    shown = json.dumps(argv)
    problem = _python_argv_problem(argv)
    if problem is not None:
        return Check(name, "FAIL", f"{shown}: {problem}")
    if not ep:
        return Check(
            name,
            "WARN",
            f"{shown} comes from CMD, not ENTRYPOINT: a command given at run time would replace it",
        )
    return Check(name, "PASS", shown)


def _check_labels(labels: Mapping[str, str]) -> list[Check]:
    version = labels.get(PROTOCOL_LABEL)
    role = labels.get(ROLE_LABEL)
    out = []
    if version == str(PROTOCOL_VERSION):
        out.append(Check("protocol label", "PASS", f"{PROTOCOL_LABEL}={version}"))
    else:
        out.append(
            Check(
                "protocol label",
                "FAIL",
                f"{PROTOCOL_LABEL}={version!r}; this host speaks protocol {PROTOCOL_VERSION}"
                if version is not None
                else f"no {PROTOCOL_LABEL} label (this host speaks protocol {PROTOCOL_VERSION})",
            )
        )
    if role == "worker":
        out.append(Check("role label", "PASS", f"{ROLE_LABEL}=worker"))
    else:
        out.append(
            Check(
                "role label",
                "FAIL",
                f"{ROLE_LABEL}={role!r}, expected 'worker'" if role is not None else f"no {ROLE_LABEL} label",
            )
        )
    return out


def _check_env(env: Sequence[str]) -> Check:
    name = "environment"
    names = [item.partition("=")[0] for item in env]
    secret = [n for n in names if SECRET_NAME.search(n)]
    other = [
        n
        for n in names
        if n not in secret and n not in HARMLESS_ENV and not n.startswith(HARMLESS_ENV_PREFIXES)
    ]
    if secret:
        # Never print the values: they may be real credentials.
        return Check(
            name,
            "FAIL",
            f"{len(secret)} variable(s) look like secrets (values not shown); image ENV is readable by "
            "anyone who can pull the image and by every worker",
            [f"{n} (looks like a secret)" for n in secret] + [f"{n} (unexpected)" for n in other],
        )
    if other:
        return Check(
            name,
            "WARN",
            f"unexpected variable(s) beyond PATH/LANG/LC_*/PYTHON*: {', '.join(other)}",
            [f"{n} (unexpected)" for n in other],
        )
    return Check(name, "PASS", f"only harmless variables ({', '.join(names) or 'none'})")


def audit_config(config: Mapping[str, Any]) -> list[Check]:
    """The checks that need only the image's configuration.

    Args:
        config: the ``Config`` of ``docker image inspect``.

    Returns:
        The user, entrypoint, labels, environment, exposed ports, volumes and healthcheck checks.
    """
    checks = [
        _check_user(str(config.get("User") or "")),
        _check_entrypoint(config.get("Entrypoint"), config.get("Cmd")),
        *_check_labels(config.get("Labels") or {}),
        _check_env(list(config.get("Env") or [])),
    ]
    ports = sorted(config.get("ExposedPorts") or {})
    checks.append(
        Check("exposed ports", "FAIL", f"EXPOSE {' '.join(ports)}: a worker listens on nothing", ports)
        if ports
        else Check("exposed ports", "PASS", "none")
    )
    volumes = sorted(config.get("Volumes") or {})
    checks.append(
        Check(
            "volumes",
            "FAIL",
            f"VOLUME {' '.join(volumes)}: each becomes a writable anonymous volume, defeating the "
            "read-only root file system",
            volumes,
        )
        if volumes
        else Check("volumes", "PASS", "none")
    )
    health = config.get("Healthcheck") or {}
    test = list(health.get("Test") or [])
    if test and test != ["NONE"]:
        checks.append(
            Check(
                "healthcheck",
                "WARN",
                f"HEALTHCHECK {json.dumps(test)}: dockerd would run it inside every worker container",
            )
        )
    else:
        checks.append(Check("healthcheck", "PASS", "none"))
    return checks


# --------------------------------------------------------------------------------------------------
# File system checks (pure: a list of entries)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FsEntry:
    """One entry of the image's flattened file system.

    Attributes:
        path: absolute, normalized: ``/usr/bin/python3``.
        kind: file, dir, symlink, hardlink, char, block, fifo or other.
        mode: permission bits including setuid/setgid/sticky.
        uid: the owner.
        gid: the group.
        linkname: a link's target.
        file_caps: whether it carries a ``security.capability`` xattr.
    """

    path: str
    kind: Literal["file", "dir", "symlink", "hardlink", "char", "block", "fifo", "other"]
    mode: int
    uid: int = 0
    gid: int = 0
    linkname: str = ""
    file_caps: bool = False


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def _resolve(path: str, links: Mapping[str, str], limit: int = 40) -> str | None:
    """Resolve symlinks inside the image (as the kernel would for an absolute path)."""
    parts = [p for p in path.split("/") if p]
    current = ""
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            current = posixpath.dirname(current) if current else ""
            continue
        candidate = f"{current}/{part}"
        target = links.get(candidate)
        if target is None:
            current = candidate
            continue
        hops += 1
        if hops > limit:
            return None
        base = "" if target.startswith("/") else current
        parts = [p for p in f"{base}/{target}".split("/") if p] + parts
        current = ""
    return current or "/"


def _fmt_mode(entry: FsEntry) -> str:
    return f"{entry.path} ({entry.kind}, mode {entry.mode:04o}, uid {entry.uid})"


#: What ``codemode image audit --allow NAME`` accepts.
ALLOWABLE: tuple[str, ...] = (*SHELLS, *PACKAGE_MANAGERS, *TEST_ENTRIES)


def _allowable(check: str, found: Mapping[str, list[str]], allow: frozenset[str], what: str) -> Check:
    """FAIL listing what ``found`` holds (findings by ``--allow`` name); what ``allow`` names only
    warns."""
    refused = {name: paths for name, paths in found.items() if name not in allow}
    allowed = {name: paths for name, paths in found.items() if name in allow}
    findings = list(
        dict.fromkeys(
            [p for paths in refused.values() for p in paths]
            + [f"{p} (allowed: --allow {name})" for name, paths in allowed.items() for p in paths]
        )
    )
    if refused:
        names = ", ".join(sorted(refused))
        return Check(
            check, "FAIL", f"{what}: {names} (the worker needs none; --allow NAME to accept)", findings
        )
    if allowed:
        return Check(check, "WARN", f"{what}, allowed by --allow: {', '.join(sorted(allowed))}", findings)
    return Check(check, "PASS", f"no {what}")


def audit_filesystem(
    entries: Iterable[FsEntry], image_uid: int | None = None, allow: Iterable[str] = ()
) -> list[Check]:
    """setuid/setgid files, file capabilities, world-writable paths, device files, files owned by
    the worker user, and whether a shell, a package manager or a test entry exists (each FAILs
    unless ``allow`` names it: a shell's name, ``dpkg``/``apt``/``pip``, ``testing_entry``).

    Args:
        entries: the flattened file system.
        image_uid: the image's USER uid, counted as a worker user besides :data:`RUNTIME_UID`.
        allow: names from :data:`ALLOWABLE` whose presence passes.

    Returns:
        The file system checks.
    """
    accepted = frozenset(allow)
    suid: list[str] = []
    caps: list[str] = []
    writable: list[str] = []
    tmp_like: list[str] = []
    devices: list[str] = []
    owned: list[str] = []
    links: dict[str, str] = {}
    present: set[str] = set()
    count = 0
    worker_uids = {RUNTIME_UID} | ({image_uid} if image_uid else set())
    for e in entries:
        count += 1
        present.add(e.path)
        if e.kind == "symlink":
            links[e.path] = e.linkname
            continue
        if e.kind in ("file", "hardlink") and e.mode & (stat.S_ISUID | stat.S_ISGID):
            bits = "+".join(b for b, m in (("setuid", stat.S_ISUID), ("setgid", stat.S_ISGID)) if e.mode & m)
            suid.append(f"{_fmt_mode(e)} {bits}")
        if e.file_caps:
            caps.append(_fmt_mode(e))
        if e.kind in ("char", "block") and not _under(e.path, RUNTIME_MOUNTS):
            devices.append(_fmt_mode(e))
        if e.uid in worker_uids and not _under(e.path, RUNTIME_MOUNTS):
            owned.append(_fmt_mode(e))
        if e.mode & stat.S_IWOTH and not _under(e.path, RUNTIME_MOUNTS):
            if _under(e.path, TMP_LIKE):
                tmp_like.append(e.path)
            else:
                writable.append(_fmt_mode(e))
    checks = []
    checks.append(
        Check(
            "setuid/setgid files",
            "FAIL",
            f"{len(suid)} file(s) with setuid/setgid bits (strip them: chmod u-s,g-s)",
            suid,
        )
        if suid
        else Check("setuid/setgid files", "PASS", f"none among {count} entries")
    )
    checks.append(
        Check("file capabilities", "FAIL", f"{len(caps)} file(s) carry security.capability xattrs", caps)
        if caps
        else Check("file capabilities", "PASS", "none")
    )
    allowed = f" (allowed, tmp-like: {', '.join(sorted(tmp_like))})" if tmp_like else ""
    checks.append(
        Check(
            "world-writable paths",
            "FAIL",
            f"{len(writable)} world-writable file(s)/dir(s) outside tmp-like paths{allowed}",
            writable,
        )
        if writable
        else Check("world-writable paths", "PASS", f"none outside tmp-like paths{allowed}")
    )
    checks.append(
        Check("device files", "FAIL", f"{len(devices)} device node(s) outside /dev", devices)
        if devices
        else Check("device files", "PASS", "none outside /dev")
    )
    who = ", ".join(str(u) for u in sorted(worker_uids))
    checks.append(
        Check(
            "owned by the worker user",
            "WARN",
            f"{len(owned)} path(s) owned by uid {who}: the worker could change them if the root file "
            "system were ever writable",
            owned,
        )
        if owned
        else Check("owned by the worker user", "PASS", f"nothing owned by uid {who}")
    )
    # Unique real files (with usrmerge /bin is a link to /usr/bin: don't list each shell twice),
    # by the name the image calls them (sh -> dash counts as "sh" and as "dash").
    shells: dict[str, list[str]] = {}
    for d in SHELL_DIRS:
        for name in SHELLS:
            real = _resolve(f"{d}/{name}", links)
            if real is not None and real in present and real not in shells.get(name, []):
                shells.setdefault(name, []).append(real)
    checks.append(_allowable("shell", shells, accepted, "shells"))
    managers: dict[str, list[str]] = {}
    tests: dict[str, list[str]] = {}
    for path in sorted(present | set(links)):
        for name, patterns in PACKAGE_MANAGERS.items():
            if any(p.match(path) for p in patterns):
                managers.setdefault(name, []).append(path)
        for name, pattern in TEST_ENTRIES.items():
            if pattern.search(path):
                tests.setdefault(name, []).append(path)
    checks.append(_allowable("package managers", managers, accepted, "package managers"))
    checks.append(_allowable("test entries", tests, accepted, "test-only worker entries"))
    return checks


def fs_entry(member: tarfile.TarInfo) -> FsEntry:
    """One tar member of an image export as an entry.

    Args:
        member: the member.

    Returns:
        The entry (path made absolute and normalized).
    """
    kind: Any
    if member.isreg():
        kind = "file"
    elif member.isdir():
        kind = "dir"
    elif member.issym():
        kind = "symlink"
    elif member.islnk():
        kind = "hardlink"
    elif member.ischr():
        kind = "char"
    elif member.isblk():
        kind = "block"
    elif member.isfifo():
        kind = "fifo"
    else:
        kind = "other"
    name = member.name
    while name.startswith("./"):
        name = name[2:]
    path = "/" + name.strip("/")
    xattrs = member.pax_headers or {}
    return FsEntry(
        path=path,
        kind=kind,
        mode=stat.S_IMODE(member.mode),
        uid=member.uid,
        gid=member.gid,
        linkname=member.linkname,
        file_caps=any(k.endswith("security.capability") for k in xattrs),
    )
