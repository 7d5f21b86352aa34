"""Shared helpers for the Docker test modules (no tests here; pytest does not collect this module).

The engine itself comes from the ``docker_api`` fixture in tests/conftest.py, which skips locally
without an engine or the worker image and fails under ``CI=true``.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
import uuid
from typing import Any

ROLE_LABEL = "io.codemode.role=worker"


def worker_containers(api: Any, *extra_labels: str) -> list[dict[str, Any]]:
    """All containers (any state) labelled as codemode workers (optionally more label filters)."""
    return list(api.containers(all=True, filters={"label": [ROLE_LABEL, *extra_labels]}))


def build_image(api: Any, name: str, dockerfile: str) -> str:
    """Build ``dockerfile`` (no other context, nothing pulled) as ``name:<random tag>``; the tag.
    The caller removes the image."""
    tag = f"{name}:{uuid.uuid4().hex[:12]}"
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tf:
        data = dockerfile.encode()
        member = tarfile.TarInfo("Dockerfile")
        member.size = len(data)
        tf.addfile(member, io.BytesIO(data))
    context.seek(0)
    for chunk in api.build(
        fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True, decode=True, pull=False
    ):
        if "error" in chunk:
            raise AssertionError(f"building {name} failed: {chunk['error']}")
    return tag


# A minimal stand-alone probe answerer for fake workers started with an entrypoint override.
# (4-byte big-endian length + UTF-8 JSON: the codemode frame format.)
_PROBE_PRELUDE = r"""
import json, os, struct, sys, time
_i, _o = sys.stdin.buffer, sys.stdout.buffer
def _read_frame():
    h = _i.read(4)
    if len(h) < 4:
        raise SystemExit(3)
    return json.loads(_i.read(struct.unpack('>I', h)[0]))
def _send(obj):
    b = json.dumps(obj).encode()
    _o.write(struct.pack('>I', len(b)) + b)
    _o.flush()
_p = _read_frame()
assert _p == {'k': 'probe', 'v': 1}, _p
_send({'k': 'probe_ack', 'v': 1})
"""


def fake_worker(body: str, *, answer_probe: bool = True) -> list[str]:
    """Entrypoint for a fake worker: answers the probe (unless told not to), then runs ``body``.

    ``body`` may use ``_read_frame()``, ``_send(obj)``, ``_i`` (stdin) and ``_o`` (stdout).
    """
    code = (_PROBE_PRELUDE if answer_probe else "import os, sys, time\n") + body
    return ["python3", "-I", "-c", code]


def encode(obj: Any) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


async def read_frame(sandbox: Any, limit: int = 64 * 1024 * 1024) -> dict[str, Any] | None:
    """Read exactly one frame from a sandbox (None at EOF before a header)."""
    header = await read_exact(sandbox, 4)
    if header is None:
        return None
    (n,) = struct.unpack(">I", header)
    assert n <= limit, f"frame of {n} bytes"
    body = await read_exact(sandbox, n)
    assert body is not None, "EOF inside a frame"
    value = json.loads(body)
    assert isinstance(value, dict)
    return value


async def read_exact(sandbox: Any, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = await sandbox.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
