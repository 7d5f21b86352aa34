"""codemode_capabilities.mcp.stdio_relay: a stdio server's messages pass whole, or not at all.

``Relay`` is fed every way a stream can be cut into reads (its output must not depend on it);
``relay()`` runs over real pipes; the module runs as the upstream pack starts it (the file,
``python -I``) with real servers (small Python programs). End to end with an MCP server:
tests/integration/capabilities/test_mcp_upstream.py.
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

from codemode_capabilities.mcp import stdio_relay
from codemode_capabilities.mcp.stdio_relay import EXIT_USAGE, Relay, StderrGate, relay

#: As the upstream pack starts it: the file, isolated mode.
RELAY = [sys.executable, "-I", str(stdio_relay.__file__)]


def passed(stream: bytes, limit: int, cuts: list[int]) -> bytes:
    """What a relay passes on for ``stream`` read in pieces ending at ``cuts``."""
    state = Relay(limit)
    out = b""
    start = 0
    for end in [*cuts, len(stream)]:
        out += state.feed(stream[start:end])
        start = end
    return out + state.end()


def every_way(stream: bytes, limit: int) -> set[bytes]:
    """The outputs over every single cut and every pair of cuts (one output if the relay is sound)."""
    n = len(stream)
    outs = {passed(stream, limit, [i]) for i in range(n + 1)}
    outs |= {passed(stream, limit, [i, j]) for i in range(n + 1) for j in range(i, n + 1)}
    return outs


def test_messages_within_the_limit_pass_exactly_however_the_stream_is_read() -> None:
    stream = b'{"a":1}\n{"bb":2}\n' + b"x" * 12 + b"\ntail"
    assert every_way(stream, 12) == {stream}


def test_a_message_over_the_limit_is_dropped_whole_and_the_rest_goes_on() -> None:
    stream = b"ok\n" + b"y" * 13 + b"\nafter\n"
    assert every_way(stream, 12) == {b"ok\nafter\n"}
    at_limit = b"ok\n" + b"y" * 12 + b"\nafter\n"
    assert every_way(at_limit, 12) == {at_limit}


def test_a_dropped_response_is_answered_with_an_error_for_its_id() -> None:
    big = b'{"jsonrpc":"2.0","id":7,"result":{"text":"' + b"z" * 100 + b'"}}'
    stream = b'{"jsonrpc":"2.0","method":"ping"}\n' + big + b'\n{"jsonrpc":"2.0","id":8,"result":{}}\n'
    (out,) = every_way(stream, 60)
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line.get("id") for line in lines] == [None, 7, 8]
    assert lines[1]["error"]["code"] == -32603 and "over 60 bytes" in lines[1]["error"]["message"]
    assert "result" not in lines[1]
    # A string id, spaced out, is found too; a message that does not start with its id is only dropped.
    spaced = b'{ "jsonrpc" : "2.0" , "id" : "a\\"b", "result": "' + b"q" * 80 + b'"}\n'
    assert json.loads(passed(spaced, 60, [10]))["id"] == 'a"b'
    result_first = b'{"result":"' + b"q" * 80 + b'","jsonrpc":"2.0","id":9}\n'
    assert every_way(result_first, 60) == {b""}


@pytest.mark.parametrize(
    "head",
    [
        b'{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":"',  # the server's request
        b'{"jsonrpc":"2.0","id":007,"result":"',  # not JSON
        b'{"jsonrpc":"2.0","id":12345678901234567890123,"result":"',  # longer than any id we send
        b'{"jsonrpc":"2.0","id":"a\tb","result":"',  # a control character
        b'{"jsonrpc":"2.0","id":"\\q","result":"',  # not a JSON escape
        b'{"jsonrpc":"2.0","id":"\xff","result":"',  # not UTF-8
        b" " * 240 + b'{"jsonrpc":"2.0","id":12345,"result":"',  # the id cut by the 256-byte head
    ],
)
def test_nothing_but_a_well_formed_response_id_is_answered(head: bytes) -> None:
    """The error line is built only from an id that is valid JSON and UTF-8, of a response: else the
    message is only dropped (no forged or malformed line, no answer to the server's own request)."""
    assert every_way(head + b"q" * 300 + b'"}\n', 100) == {b""}


def test_the_answer_goes_out_when_the_limit_is_passed_not_when_the_message_ends() -> None:
    state = Relay(20)
    out = state.feed(b'{"jsonrpc":"2.0","id":3,"result":"' + b"w" * 40)  # no newline yet
    assert json.loads(out)["id"] == 3
    assert state.feed(b"w" * 1000) == b"" and state.feed(b'"}\nnext\n') == b"next\n"
    assert state.dropped == 1


def test_invalid_utf8_is_replaced_and_valid_text_passes_exactly_however_it_is_read() -> None:
    """The MCP client's reader stops for good at the first invalid byte: the relay passes only
    valid UTF-8 (each invalid sequence U+FFFD), and a character cut between two reads is not one."""
    valid = "ok é 😀\n".encode()
    assert every_way(valid, 100) == {valid}
    hostile = b'{"a":"\xff\xfe"}\n\xc3\n' + valid + b"\xe2\x82"
    expected = '{"a":"\ufffd\ufffd"}\n\ufffd\n'.encode() + valid + "\ufffd".encode()
    assert every_way(hostile, 100) == {expected}
    state = Relay(100)
    state.feed(hostile)
    state.end()
    assert state.replaced == 3


def test_a_message_over_the_limit_once_replaced_is_dropped() -> None:
    """U+FFFD takes three bytes: 10 invalid bytes within a limit of 12 become 30, so the message
    is dropped (answered with an error when it is a response) rather than passed over the limit."""
    head = b'{"jsonrpc":"2.0","id":3,"result":"'
    line = head + b"\xff" * 10 + b'"}\n'
    out = passed(line, len(line) - 1, [])
    assert json.loads(out)["id"] == 3 and "error" in json.loads(out)


def test_relay_over_real_pipes() -> None:
    src_r, src_w = os.pipe()
    out_r, out_w = os.pipe()
    stream = b"one\n" + b"2" * 70000 + b"\nthree\n"

    def write_all() -> None:
        os.write(src_w, stream)
        os.close(src_w)

    writer = threading.Thread(target=write_all)
    copied = bytearray()

    def read_all() -> None:
        while chunk := os.read(out_r, 65536):
            copied.extend(chunk)

    reader = threading.Thread(target=read_all)
    writer.start()
    reader.start()
    try:
        assert relay(src_r, out_w, 1000).dropped == 1
    finally:
        os.close(out_w)
        writer.join()
        reader.join()
        os.close(src_r)
        os.close(out_r)
    assert bytes(copied) == b"one\nthree\n"


def test_main_runs_the_server_and_returns_its_status() -> None:
    server = "import sys; sys.stdout.write(sys.stdin.readline().upper()); sys.exit(5)"
    done = subprocess.run(
        [*RELAY, "100", "--", sys.executable, "-c", server], input=b"hello\n", capture_output=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (5, b"HELLO\n")


def test_main_keeps_the_server_running_past_a_dropped_message() -> None:
    server = "print('x' * 5000); print('still here'); print('x' * 5000); print('and here')"
    done = subprocess.run(
        [*RELAY, "1000", "--", sys.executable, "-c", server], capture_output=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (0, b"still here\nand here\n")
    assert b"dropped 2 message(s) over 1000 bytes" in done.stderr


def test_main_replaces_invalid_utf8_and_says_so() -> None:
    server = "import sys; sys.stdout.buffer.write(b'\\xff\\n\\xc3 ok\\n')"
    done = subprocess.run(
        [*RELAY, "1000", "--", sys.executable, "-c", server], capture_output=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (0, "\ufffd\n\ufffd ok\n".encode())
    assert b"replaced invalid UTF-8 in 2 message(s)" in done.stderr


def test_main_sets_the_server_resource_limits_and_an_oversized_write_fails() -> None:
    """``--rlimit-data`` / ``--rlimit-fsize`` reach the server process (not the relay); a write past
    RLIMIT_FSIZE fails with EFBIG (SIGXFSZ ignored) and the server goes on."""
    server = (
        "import resource, errno, os, sys\n"
        "print(resource.getrlimit(resource.RLIMIT_DATA)[0], resource.getrlimit(resource.RLIMIT_FSIZE)[0],\n"
        "      resource.getrlimit(resource.RLIMIT_CPU)[0], resource.getrlimit(resource.RLIMIT_CORE))\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\n"
        "try:\n    os.write(fd, b'x' * 20000)\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
        "print('alive')\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        argv = [*RELAY, "1000", "--rlimit-data=1073741824", "--rlimit-fsize=4096", "--rlimit-cpu=60", "--"]
        done = subprocess.run(
            [*argv, sys.executable, "-c", server, f"{where}/f"], capture_output=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.decode().split()
        assert lines[:3] == ["1073741824", "4096", "60"]
        assert lines[3:5] == ["(0,", "0)"]  # never a core file, whatever the flags
        # Linux writes up to the limit and fails the next write: a partial write of 4096 bytes is
        # reported as written, so the server sees EFBIG only on a second write or not at all.
        assert lines[-1] == "alive"
        assert os.path.getsize(f"{where}/f") <= 4096


def test_main_gives_the_server_exactly_its_environment() -> None:
    """The MCP client starts it with a minimal environment (no PYTHONPATH, as in the service image,
    where codemode is importable only through PYTHONPATH); that environment reaches the server as
    it was, LC_CTYPE included, which Python's locale coercion changes in the relay's own (the server
    here is env(1), which adds nothing of its own)."""
    for given, flag in (
        ({"ONLY": "1"}, "--unset-lc-ctype"),
        ({"ONLY": "1", "LC_CTYPE": "C"}, "--lc-ctype=C"),
    ):
        argv = [*RELAY, "100", flag, "--", "/usr/bin/env"]
        done = subprocess.run(argv, env=given, capture_output=True, timeout=30)
        assert (done.returncode, done.stderr) == (0, b"")
        assert sorted(done.stdout.splitlines()) == sorted(f"{k}={v}".encode() for k, v in given.items())


def test_main_reports_a_server_killed_by_a_signal_like_a_shell() -> None:
    server = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    done = subprocess.run(
        [*RELAY, "100", "--", sys.executable, "-c", server], capture_output=True, timeout=30
    )
    assert done.returncode == 128 + signal.SIGTERM


def test_main_names_a_command_it_cannot_start_and_refuses_bad_usage() -> None:
    done = subprocess.run([*RELAY, "100", "--", "codemode-no-such-server"], capture_output=True, timeout=30)
    assert done.returncode == 127 and b"codemode-no-such-server" in done.stderr
    bad = (
        ["100"],
        ["x", "--", "true"],
        ["0", "--", "true"],
        ["100", "true"],
        ["100", "--unset-lc-ctype", "true"],
        ["100", "--rlimit-data=x", "--", "true"],
        ["100", "--rlimit-fsize=0", "--", "true"],
        ["100", "--rlimit-cpu=-1", "--", "true"],
        ["100", "--tree-memory=0", "--", "true"],
    )
    for argv in bad:
        assert subprocess.run([*RELAY, *argv], capture_output=True, timeout=30).returncode == EXIT_USAGE


def started(server: str) -> subprocess.Popen[bytes]:
    """The relay (limit 100) running the Python program ``server``; its output piped to us."""
    argv = [*RELAY, "100", "--", sys.executable, "-c", server]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)


def test_the_client_sees_the_end_when_the_server_closes_its_output() -> None:
    """A server that closes stdout and lingers: the relay's own output ends at once."""
    with started("import os, time; print('bye', flush=True); os.close(1); time.sleep(5)") as proc:
        assert proc.stdout is not None
        assert proc.stdout.read() == b"bye\n"  # end of file while the server still sleeps
        assert proc.poll() is None
        proc.kill()


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead; reaping it is its new parent's business)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_the_server_dies_with_the_relay() -> None:
    with started("import os, time; print(os.getpid(), flush=True); time.sleep(60)") as relay_proc:
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


def test_invalid_utf8_that_grows_past_the_limit_is_answered_never_passed_whole() -> None:
    limit = 1024
    head = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"'
    line = head + b"\xff" * (limit - len(head) - 5) + b'"}]}}\n'
    state = Relay(limit)
    out = b"".join(state.feed(line[i : i + 1]) for i in range(len(line)))  # byte by byte
    message = json.loads(out)
    assert message["id"] == 7 and message["error"]["code"] == -32603
    assert state.replaced == 1 and state.dropped == 1


def test_a_split_multibyte_character_at_a_chunk_boundary_is_not_replaced() -> None:
    line = '{"jsonrpc":"2.0","id":1,"result":{"text":"caf\u00e9 \u2603"}}\n'.encode()
    state = Relay(4096)
    out = b"".join(state.feed(line[i : i + 1]) for i in range(len(line)))
    assert out == line and state.replaced == 0


def test_rlimit_cpu_ends_a_server_that_spins() -> None:
    done = subprocess.run(
        [*RELAY, "100", "--rlimit-cpu=1", "--", sys.executable, "-c", "while True: pass"],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 128 + signal.SIGXCPU or done.returncode == 128 + signal.SIGKILL


HOLDER = (
    "import subprocess, sys\n"
    "hold = \"b = bytearray(48 << 20); b[::4096] = b'x' * len(b[::4096]); print('ok', flush=True)\"\n"
    "hold += '; input()'\n"
    "kids = [subprocess.Popen([sys.executable, '-c', hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
    "        for _ in range(int(sys.argv[1]))]\n"
    "print(sum(k.stdout.readline() == b'ok\\n' for k in kids), flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux only")
@pytest.mark.parametrize(("children", "killed"), [(1, False), (4, True)])
def test_tree_memory_bounds_the_server_with_every_process_it_started(children: int, killed: bool) -> None:
    """The server forks children that each hold 48 MiB (each under its own RLIMIT_DATA): with
    ``--tree-memory`` at 160 MiB one child passes, four are killed with the server."""
    argv = [*RELAY, "100", "--tree-memory=167772160", "--", sys.executable, "-c", HOLDER, str(children)]
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        line = proc.stdout.readline()
        if killed:
            assert proc.wait(30) == 128 + signal.SIGKILL
            assert b"over --tree-memory=167772160: killed" in proc.stderr.read()
        else:
            assert line == b"1\n"
            time.sleep(0.5)  # a few rounds of the watch
            assert proc.poll() is None
            proc.stdin.close()
            assert proc.wait(30) == 0


def test_descendants_and_their_resident_memory() -> None:
    server = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print('x', flush=True)\n"
        "time.sleep(30)\n"
    )
    with started(server) as proc:
        assert proc.stdout is not None
        proc.stdout.readline()
        tree = stdio_relay.descendants(proc.pid)
        assert tree[0] == proc.pid
        try:
            assert len(tree) == 3  # the relay, its server, the server's child
            assert stdio_relay.resident_bytes(tree) > stdio_relay.resident_bytes(tree[:1]) > 0
        finally:
            for pid in reversed(tree):  # the grandchild would outlive the relay
                os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- the server's stderr


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_stderr_lines_are_cut_and_their_rate_is_bounded() -> None:
    clock = Clock()
    gate = StderrGate(line_bytes=10, burst=3, rate=2.0, clock=clock)
    out = gate.feed(b"one\ntwo\n" + b"z" * 25 + b"\nfour\nfive\n")
    assert out == b"one\ntwo\nzzzzzzzzzz [15 more bytes cut]\n"  # the burst; four and five dropped
    clock.now = 1.0  # two lines' worth refilled
    out = gate.feed(b"six\nseven\neight\n")
    assert out == (
        b"codemode stdio relay: dropped 2 line(s) (10 bytes) of the server's stderr: over 3 at once "
        b"and 2 a second\nsix\nseven\n"
    )
    assert gate.end() == (
        b"codemode stdio relay: dropped 1 line(s) (6 bytes) of the server's stderr: over 3 at once "
        b"and 2 a second\n"
    )


def test_stderr_passes_the_same_whatever_the_reads() -> None:
    stream = b"a" * 3000 + b"\nshort\n" + b"b" * 70 + b"\nlast without newline"
    outputs = set()
    for cut in range(0, len(stream), 97):
        gate = StderrGate(line_bytes=64, burst=10, rate=1.0, clock=Clock())
        outputs.add(gate.feed(stream[:cut]) + gate.feed(stream[cut:]) + gate.end())
    assert outputs == {
        b"a" * 64 + b" [2936 more bytes cut]\nshort\n" + b"b" * 64 + b" [6 more bytes cut]\n"
        b"last without newline\n"
    }


def test_main_passes_a_bounded_part_of_a_servers_stderr_flood() -> None:
    """20 MB on the server's stderr (lines of 100 bytes, then a line of 2 MiB): the relay's own
    stderr gets the burst, cut lines and the count of what it dropped."""
    server = (
        "import sys\n"
        "for _ in range(200):\n    sys.stderr.buffer.write((b'x' * 99 + b'\\n') * 1000)\n"
        "sys.stderr.buffer.write(b'y' * (2 << 20) + b'\\n')\n"
        "print('done')\n"
    )
    done = subprocess.run(
        [*RELAY, "1000", "--", sys.executable, "-c", server], capture_output=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, b"done\n")
    lines = done.stderr.splitlines()
    print(f"server stderr 20,000,000+ bytes; passed {len(done.stderr)} bytes in {len(lines)} lines")
    assert len(lines) < 2 * stdio_relay.STDERR_BURST and len(done.stderr) < 128 * 1024
    assert any(b"dropped" in line for line in lines)
    assert all(len(line) <= stdio_relay.STDERR_LINE_BYTES + 100 for line in lines)
