"""codemode.capabilities.stdio_relay: copies a server's stdout, stops at a message over the limit.

``relay()`` is driven through real pipes; ``main`` runs as the real module in a child process with
real servers (small Python programs). End to end with an MCP server:
tests/integration/test_mcp_upstream.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from codemode.capabilities import stdio_relay
from codemode.capabilities.stdio_relay import EXIT_TOO_LARGE, EXIT_USAGE, relay

#: As the upstream pack starts it: the file, isolated mode.
RELAY = [sys.executable, "-I", str(stdio_relay.__file__)]


def through(chunks: list[bytes], limit: int) -> tuple[bool, bytes]:
    """Feed ``chunks`` (one write each) through ``relay``; return its verdict and what came out."""
    src_r, src_w = os.pipe()
    out_r, out_w = os.pipe()

    def feed() -> None:
        for chunk in chunks:
            os.write(src_w, chunk)
            time.sleep(0.002)  # separate reads where the pipe allows it
        os.close(src_w)

    writer = threading.Thread(target=feed)
    writer.start()
    copied = bytearray()
    reader = threading.Thread(target=lambda: copied.extend(iter_read(out_r)))
    reader.start()
    try:
        whole = relay(src_r, out_w, limit)
    finally:
        os.close(out_w)
        writer.join()
        reader.join()
        os.close(src_r)
        os.close(out_r)
    return whole, bytes(copied)


def iter_read(fd: int) -> bytes:
    data = bytearray()
    while chunk := os.read(fd, 65536):
        data += chunk
    return bytes(data)


def test_messages_within_the_limit_are_copied_exactly() -> None:
    chunks = [b'{"a":1}\n{"b"', b":2}\n", b"x" * 10 + b"\n", b"tail without newline"]
    assert through(chunks, 20) == (True, b"".join(chunks))


def test_a_message_at_the_limit_passes_and_one_byte_more_stops() -> None:
    assert through([b"y" * 16 + b"\n"], 16) == (True, b"y" * 16 + b"\n")
    whole, copied = through([b"ok\n", b"y" * 17 + b"\n", b"never\n"], 16)
    assert not whole and copied == b"ok\n"  # nothing of the long message, nothing after it


def test_a_message_growing_across_reads_stops_at_the_limit() -> None:
    whole, copied = through([b"ok\n" + b"z" * 10, b"z" * 10, b"z" * 10 + b"\n"], 25)
    assert not whole
    assert copied.startswith(b"ok\n") and len(copied) <= 3 + 25  # at most the limit of that message


def test_main_runs_the_server_and_returns_its_status() -> None:
    server = "import sys; sys.stdout.write(sys.stdin.readline().upper()); sys.exit(5)"
    done = subprocess.run(
        [*RELAY, "100", "--", sys.executable, "-c", server], input=b"hello\n", capture_output=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (5, b"HELLO\n")


def test_main_needs_no_environment() -> None:
    """The MCP client starts it with a minimal environment (no PYTHONPATH, as in the service image,
    where codemode is importable only through PYTHONPATH); what it is given reaches the server."""
    server = "import json, os; print(json.dumps(dict(os.environ)))"
    argv = [*RELAY, "100", "--", sys.executable, "-c", server]
    done = subprocess.run(argv, env={"ONLY": "1"}, capture_output=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, b"")
    env = json.loads(done.stdout)
    assert env["ONLY"] == "1" and "PYTHONPATH" not in env


def test_main_ends_a_server_whose_message_is_too_long() -> None:
    server = "import sys, time; sys.stdout.write('x' * 5000); sys.stdout.flush(); time.sleep(60)"
    started = time.monotonic()
    done = subprocess.run(
        [*RELAY, "1000", "--", sys.executable, "-c", server], capture_output=True, timeout=30
    )
    assert done.returncode == EXIT_TOO_LARGE and time.monotonic() - started < 20
    assert len(done.stdout) <= 1000
    assert b"over 1000 bytes" in done.stderr


def test_main_names_a_command_it_cannot_start_and_refuses_bad_usage() -> None:
    done = subprocess.run([*RELAY, "100", "--", "codemode-no-such-server"], capture_output=True, timeout=30)
    assert done.returncode == 127 and b"codemode-no-such-server" in done.stderr
    for argv in (["100"], ["x", "--", "true"], ["0", "--", "true"], ["100", "true"]):
        assert subprocess.run([*RELAY, *argv], capture_output=True, timeout=30).returncode == EXIT_USAGE


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead; reaping it is its new parent's business)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_the_server_dies_with_the_relay() -> None:
    server = "import os, sys, time; print(os.getpid(), flush=True); time.sleep(60)"
    with subprocess.Popen(
        [*RELAY, "100", "--", sys.executable, "-c", server], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    ) as relay_proc:
        assert relay_proc.stdout is not None
        pid = int(relay_proc.stdout.readline())
        assert not gone(pid)
        relay_proc.send_signal(signal.SIGKILL)
        relay_proc.wait(10)
    deadline = time.monotonic() + 10
    while not gone(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the server outlived its relay")
        time.sleep(0.05)
