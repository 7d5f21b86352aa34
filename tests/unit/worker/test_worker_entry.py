"""``python -m codemode_worker`` end to end, spoken to over its stdin/stdout like a host."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from codemode_worker.protocol import WORKER_KINDS, encode_frame, read_frame

LIMITS = {
    "max_steps": 1_000_000,
    "max_value_depth": 32,
    "max_value_bytes": 1 << 20,
    "max_native_calls": 100,
    "max_callstack": 200,
}
MANIFEST = [
    {
        "name": "records.lookup",
        "input": {
            "t": "record",
            "fields": [
                {"name": "key", "shape": {"t": "str"}},
                {"name": "limit", "shape": {"t": "opt", "of": {"t": "int"}}},
            ],
        },
    }
]
TIMEOUT = 60.0


def raw(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


class Worker:
    """Test driver: one worker subprocess, frames in and out, a watchdog against hangs."""

    def __init__(
        self,
        module: str = "codemode_worker",
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.proc = subprocess.Popen(
            command or [sys.executable, "-I", "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env if env is not None else {"CODEMODE_WORKER": "1"},
        )
        self._watchdog = threading.Timer(TIMEOUT, self.proc.kill)
        self._watchdog.start()

    def send(self, frame: dict[str, Any]) -> None:
        self.write(encode_frame(frame))

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        return read_frame(self.proc.stdout, 1 << 26, WORKER_KINDS)

    def exec(self, source: str, manifest: list[dict[str, Any]] | None = None, **limits: int) -> None:
        self.send(
            {
                "k": "exec",
                "v": 1,
                "source": source,
                "manifest": MANIFEST if manifest is None else manifest,
                "limits": {**LIMITS, **limits},
            }
        )

    def finish(self) -> tuple[int, bytes, bytes]:
        """Close stdin; return (exit code, remaining stdout, stderr)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        rest = self.proc.stdout.read()
        err = self.proc.stderr.read()
        code = self.proc.wait()
        self.close()
        return code, rest, err

    def close(self) -> None:
        """Kill the worker if it still runs, reap it, and close every pipe (idempotent)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._watchdog.cancel()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()


@pytest.fixture
def worker() -> Any:
    w = Worker()
    yield w
    w.close()


def test_probe_then_trivial_program(worker: Worker) -> None:
    worker.send({"k": "probe", "v": 1})
    assert worker.recv() == {"k": "probe_ack", "v": 1}
    worker.send({"k": "probe", "v": 1})
    assert worker.recv() == {"k": "probe_ack", "v": 1}
    worker.exec('def main():\n    print("not on stdout")\n    return {"ok": [1, 2.5, None]}\n', manifest=[])
    assert worker.recv() == {"k": "final", "value": {"ok": [1, 2.5, None]}}
    code, rest, err = worker.finish()
    assert (code, rest) == (0, b"")
    assert b"not on stdout" not in err


def test_native_call_round_trip(worker: Worker) -> None:
    source = (
        "def main():\n"
        "    a = records.lookup(key = 'alpha', limit = None)\n"
        "    b = records.lookup(key = 'beta', limit = 2)\n"
        "    return [a, b]\n"
    )
    worker.exec(source)
    first = worker.recv()
    assert first == {"k": "native_call", "seq": 1, "name": "records.lookup", "args": {"key": "alpha"}}
    worker.send({"k": "native_result", "seq": 1, "value": {"n": -1}})
    second = worker.recv()
    assert second == {
        "k": "native_call",
        "seq": 2,
        "name": "records.lookup",
        "args": {"key": "beta", "limit": 2},
    }
    worker.send({"k": "native_result", "seq": 2, "value": [1.5, "é"]})
    assert worker.recv() == {"k": "final", "value": [{"n": -1}, [1.5, "é"]]}
    assert worker.finish()[:2] == (0, b"")


def test_final_error(worker: Worker) -> None:
    worker.exec("def main():\n    return 1 // 0\n")
    assert worker.recv() == {
        "k": "final_error",
        "error": "invalid_program",
        "message": "<codemode>:2:12: Floor division by zero: 1 // 0",
    }
    assert worker.finish()[:2] == (0, b"")


def test_invalid_arguments_are_reported_never_called(worker: Worker) -> None:
    # The host decides what a rejected call means; it ends the program by ending the worker.
    worker.exec("def main():\n    return records.lookup(key = 1)\n")
    assert worker.recv() == {
        "k": "native_invalid",
        "seq": 1,
        "name": "records.lookup",
        "message": 'argument "key" must be str, got int',
        "attempt": False,
    }
    assert worker.finish()[:2] == (1, b"")


def test_an_attempt_gets_the_hosts_error_as_a_value(worker: Worker) -> None:
    source = (
        "def main():\n"
        "    a = attempt(records.lookup, key = 'a')\n"
        "    b = attempt(records.lookup, key = 2)\n"
        "    c = attempt(records.lookup, key = 'c')\n"
        "    return [a, b, c]\n"
    )
    worker.exec(source)
    assert worker.recv() == {"k": "native_attempt", "seq": 1, "name": "records.lookup", "args": {"key": "a"}}
    worker.send({"k": "native_error", "seq": 1, "error": "permission denied"})
    assert worker.recv() == {
        "k": "native_invalid",
        "seq": 2,
        "name": "records.lookup",
        "message": 'argument "key" must be str, got int',
        "attempt": True,
    }
    worker.send({"k": "native_error", "seq": 2, "error": "invalid capability arguments: from the host"})
    assert worker.recv() == {"k": "native_attempt", "seq": 3, "name": "records.lookup", "args": {"key": "c"}}
    worker.send({"k": "native_result", "seq": 3, "value": 7})
    assert worker.recv() == {
        "k": "final",
        "value": [
            {"ok": False, "error": "permission denied"},
            {"ok": False, "error": "invalid capability arguments: from the host"},
            {"ok": True, "value": 7},
        ],
    }
    assert worker.finish()[:2] == (0, b"")


@pytest.mark.parametrize(
    "source",
    ["records.lookup(key = 'a')", "records.lookup(key = 1)"],
    ids=["call", "invalid"],
)
def test_an_error_reply_to_a_call_without_attempt_is_a_violation(worker: Worker, source: str) -> None:
    worker.exec(f"def main():\n    return {source}\n")
    assert worker.recv() is not None
    worker.send({"k": "native_error", "seq": 1, "error": "permission denied"})
    assert worker.finish()[:2] == (2, b"")


def test_prints_travel_only_when_the_host_asks(worker: Worker) -> None:
    source = (
        "def main():\n    print('one', 2)\n    records.lookup(key = 'a')\n    print('x' * 40)\n    return 1\n"
    )
    worker.exec(source, max_print_bytes=20)
    assert worker.recv() == {"k": "print", "text": "one 2\n", "cut": False}
    assert worker.recv() == {"k": "native_call", "seq": 1, "name": "records.lookup", "args": {"key": "a"}}
    worker.send({"k": "native_result", "seq": 1, "value": None})
    assert worker.recv() == {"k": "print", "text": "x" * 14, "cut": True}
    assert worker.recv() == {"k": "final", "value": 1}
    assert worker.finish()[:2] == (0, b"")


def test_long_prints_travel_in_chunks(worker: Worker) -> None:
    worker.exec(
        "def main():\n    print('\\x01' * 20000)\n    return 1\n", manifest=[], max_print_bytes=1 << 20
    )
    texts = []
    for _ in range(3):
        frame = worker.recv()
        assert frame is not None and frame["k"] == "print" and frame["cut"] is False
        texts.append(frame["text"])
    assert [len(t) for t in texts] == [8192, 8192, 20001 - 2 * 8192]
    assert "".join(texts) == "\x01" * 20000 + "\n"
    assert worker.recv() == {"k": "final", "value": 1}
    assert worker.finish()[:2] == (0, b"")


def test_native_abort_stops_without_output(worker: Worker) -> None:
    worker.exec("def main():\n    records.lookup(key = 'a')\n    records.lookup(key = 'b')\n    return 1\n")
    assert worker.recv() == {"k": "native_call", "seq": 1, "name": "records.lookup", "args": {"key": "a"}}
    worker.send({"k": "native_abort", "seq": 1})
    code, rest, _ = worker.finish()
    assert (code, rest) == (1, b"")


def test_host_closing_mid_call_stops_without_output(worker: Worker) -> None:
    worker.exec("def main():\n    return records.lookup(key = 'a')\n")
    assert worker.recv() is not None
    code, rest, _ = worker.finish()
    assert (code, rest) == (1, b"")


@pytest.mark.parametrize(
    "reply",
    [
        {"k": "native_result", "seq": 2, "value": 1},
        {"k": "native_abort", "seq": 7},
        {"k": "probe", "v": 1},
        {"k": "exec", "v": 1, "source": "", "manifest": [], "limits": LIMITS},
        {"k": "native_result", "seq": 1, "value": 2**70},
        {"k": "final", "value": 1},
        {"k": "native_error", "seq": 1, "error": ""},
        {"k": "native_error", "seq": 2, "error": "permission denied"},
    ],
    ids=[
        "wrong-seq",
        "abort-wrong-seq",
        "probe",
        "exec",
        "not-plain",
        "worker-kind",
        "empty-error",
        "error-seq",
    ],
)
@pytest.mark.parametrize("call", ["records.lookup(key = 'a')", "attempt(records.lookup, key = 'a')"])
def test_bad_replies_during_a_call(worker: Worker, reply: dict[str, Any], call: str) -> None:
    worker.exec(f"def main():\n    return {call}\n")
    assert worker.recv() is not None
    worker.write(raw(json.dumps(reply).encode()))  # not through encode_frame: it would refuse some
    code, rest, _ = worker.finish()
    assert (code, rest) == (2, b"")


@pytest.mark.parametrize(
    "data",
    [
        b"garbage!",
        struct.pack(">I", 5) + b"hello",
        struct.pack(">I", 0xFFFFFFFF),
        encode_frame({"k": "native_result", "seq": 1, "value": 1}),
        raw(b'{"k":"probe","v":2}'),
        raw(b'{"k":"probe","v":NaN}'),
        raw(b'{"k":"probe","v":1,"x":0}'),
        encode_frame({"k": "probe", "v": 1})[:-2],
    ],
    ids=[
        "garbage",
        "not-json",
        "oversize",
        "result-before-exec",
        "wrong-version",
        "nan",
        "extra-key",
        "truncated",
    ],
)
def test_protocol_violation_exits_2_without_output(worker: Worker, data: bytes) -> None:
    worker.write(data)
    code, rest, _ = worker.finish()
    assert (code, rest) == (2, b"")


def test_probe_ack_then_violation(worker: Worker) -> None:
    worker.send({"k": "probe", "v": 1})
    assert worker.recv() == {"k": "probe_ack", "v": 1}
    worker.write(b"\x00\x00\x00\x02{}")
    assert worker.finish()[:2] == (2, b"")


def test_closed_before_exec_exits_quietly(worker: Worker) -> None:
    assert worker.finish()[:2] == (0, b"")


def test_serves_exactly_one_program(worker: Worker) -> None:
    worker.exec("def main():\n    return 1\n", manifest=[])
    assert worker.recv() == {"k": "final", "value": 1}
    # The worker may already have exited: a second program then meets a closed pipe.
    with contextlib.suppress(BrokenPipeError):
        worker.exec("def main():\n    return 2\n", manifest=[])
    code, rest, _ = worker.finish()
    assert (code, rest) == (0, b"")


def test_resource_limit_from_steps(worker: Worker) -> None:
    worker.exec("def main():\n    for i in range(10000000):\n        pass\n", manifest=[], max_steps=10_000)
    assert worker.recv() == {"k": "final_error", "error": "resource_limit", "message": "steps"}
    assert worker.finish()[0] == 0


def test_rust_panic_is_internal() -> None:
    # A worker whose json.decode guard is disabled, so that json.decode('1e309') panics in Rust.
    unguarded = (
        "import codemode_worker.environment as e\n"
        "e.json_check = lambda *args, **kwargs: ''\n"
        "from codemode_worker.entry import run\n"
        "run()\n"
    )
    w = Worker(command=[sys.executable, "-I", "-c", unguarded])
    w.exec("def main():\n    return json.decode('1e309')\n", manifest=[])
    assert w.recv() == {"k": "final_error", "error": "internal", "message": ""}
    code, rest, err = w.finish()
    assert (code, rest) == (0, b"")
    assert b"Unrepresentable" in err  # the panic text went to stderr only


def test_many_native_calls(worker: Worker) -> None:
    worker.send({"k": "probe", "v": 1})
    assert worker.recv() is not None
    worker.exec(
        "def main():\n    t = 0\n    for i in range(200):\n"
        "        t += records.lookup(key = str(i))['n']\n    return t\n",
        max_native_calls=200,
    )
    rounds = []
    while True:
        start = time.perf_counter()
        frame = worker.recv()
        assert frame is not None
        if frame["k"] != "native_call":
            break
        worker.send({"k": "native_result", "seq": frame["seq"], "value": {"n": int(frame["args"]["key"])}})
        rounds.append(time.perf_counter() - start)
    assert frame == {"k": "final", "value": sum(range(200))}
    assert len(rounds) == 200
    assert worker.finish()[0] == 0


# ----------------------------------------------------------------------------- testing entry


def test_testing_entry_refuses_without_opt_in() -> None:
    w = Worker("codemode_worker.testing_entry", env={"CODEMODE_WORKER": "1"})
    code, rest, _ = w.finish()
    assert (code, rest) == (3, b"")


def test_testing_entry_runs_python() -> None:
    env = {"CODEMODE_WORKER": "1", "CODEMODE_WORKER_TESTING": "1"}
    w = Worker("codemode_worker.testing_entry", env=env)
    w.send({"k": "probe", "v": 1})
    assert w.recv() == {"k": "probe_ack", "v": 1}
    source = (
        "import os\n"
        "print('stray stdout write')\n"
        "os.write(1, b'raw fd 1 write')\n"
        "final({'pid': os.getpid() > 0, 'kind': frame['k'], 'env': sorted(os.environ)})\n"
    )
    w.exec(source, manifest=[])
    frame = w.recv()
    assert frame is not None and frame["k"] == "final"
    assert frame["value"]["kind"] == "exec"
    assert "CODEMODE_WORKER_TESTING" in frame["value"]["env"]
    code, rest, err = w.finish()
    assert (code, rest) == (0, b"")
    assert b"stray stdout write" in err and b"raw fd 1 write" in err


def test_worker_module_imports_nothing_from_codemode() -> None:
    code = (
        "import sys, codemode_worker.entry, codemode_worker.testing_entry\n"
        "bad = [m for m in sys.modules if m == 'codemode' or m.startswith('codemode.')]\n"
        "print(bad)\n"
    )
    command = [sys.executable, "-I", "-c", code]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env={})
    assert out.stdout.strip() == "[]"


def test_host_side_modules_do_not_import_starlark() -> None:
    code = (
        "import sys, codemode_worker.protocol, codemode_worker.shapes, codemode_worker.values\n"
        "import codemode_worker.diagnostics, codemode_worker.pybuiltins\n"
        "print('starlark' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True, env={}
    )
    assert out.stdout.strip() == "False"


def test_testing_switch_is_not_set_here() -> None:
    assert "CODEMODE_WORKER_TESTING" not in os.environ
