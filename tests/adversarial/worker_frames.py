"""The frame channel the hostile worker scripts (fake_worker.py, fake_batch_worker.py,
replay_worker.py) speak to the host on: stdout and stdin, length-prefixed JSON frames. Imported by
the scripts as a sibling module (each runs as ``python SCRIPT``, so its folder is on sys.path)."""

from __future__ import annotations

import json
import struct
import sys
from typing import Any

from codemode_worker.privileges import drop_privileges
from codemode_worker.protocol import encode_frame

out = sys.stdout.buffer
inp = sys.stdin.buffer


def send(obj: dict[str, Any]) -> None:
    out.write(encode_frame(obj))
    out.flush()


def raw(data: bytes) -> None:
    out.write(data)
    out.flush()


def read_frame() -> dict[str, Any]:
    (n,) = struct.unpack(">I", inp.read(4))
    frame: dict[str, Any] = json.loads(inp.read(n))
    return frame


def start() -> str:
    """Drop privileges as the real worker does, answer the probe honestly and read the exec frame.

    Returns:
        The mode argv[1] names.
    """
    drop_privileges()
    assert read_frame()["k"] == "probe"
    send({"k": "probe_ack", "v": 1})
    read_frame()  # exec
    return sys.argv[1]
