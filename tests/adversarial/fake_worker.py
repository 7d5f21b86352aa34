"""A hostile worker for tests: answers the probe honestly, then misbehaves as told by argv[1]."""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.adversarial.worker_frames import raw, read_frame, send
else:  # run as a script: its folder is on sys.path
    from worker_frames import raw, read_frame, send

from codemode_worker.privileges import drop_privileges
from codemode_worker.protocol import encode_frame


def nested(depth: int) -> object:
    v: object = 1
    for _ in range(depth - 1):
        v = [v]
    return v


def main() -> None:
    mode = sys.argv[1]
    drop_privileges()  # as the real worker does when the host runs as root
    assert read_frame()["k"] == "probe"
    send({"k": "probe_ack", "v": 1})
    read_frame()  # exec
    if mode == "oversized":
        raw(struct.pack(">I", 2**31) + b"{")
    elif mode == "truncated":
        raw(struct.pack(">I", 100) + b'{"k": "fi')
        return
    elif mode == "unknown_kind":
        send({"k": "hello"})
    elif mode == "extra_key":
        send({"k": "final", "value": 1, "x": 2})
    elif mode == "garbage_json":
        body = b"{not json"
        raw(struct.pack(">I", len(body)) + body)
    elif mode == "nan":
        body = b'{"k": "final", "value": NaN}'
        raw(struct.pack(">I", len(body)) + body)
    elif mode == "unknown_capability":
        send({"k": "native_call", "seq": 1, "name": "nope.nothing", "args": {}})
    elif mode == "disabled_capability":
        send({"k": "native_call", "seq": 1, "name": "util.hidden", "args": {"value": "x"}})
    elif mode == "bad_args":
        send({"k": "native_call", "seq": 1, "name": "records.lookup", "args": {"key": 5}})
    elif mode == "extra_args":
        send({"k": "native_call", "seq": 1, "name": "records.lookup", "args": {"key": "a", "admin": True}})
    elif mode == "wrong_seq":
        send({"k": "native_call", "seq": 7, "name": "util.echo", "args": {"value": "x"}})
    elif mode == "deep_args":
        send(
            {"k": "native_call", "seq": 1, "name": "records.lookup", "args": {"key": "a", "tags": nested(40)}}
        )
    elif mode == "deep_final":
        send({"k": "final", "value": nested(33)})
    elif mode == "very_deep_final":
        body = b'{"k":"final","value":' + b"[" * 100000 + b"]" * 100000 + b"}"
        raw(struct.pack(">I", len(body)) + body)
    elif mode == "huge_int":
        send({"k": "final", "value": 2**80})
    elif mode == "call_after_final":
        send({"k": "final", "value": "done"})
        send({"k": "native_call", "seq": 1, "name": "util.echo", "args": {"value": "x"}})
    elif mode == "flood_calls":
        for i in range(1, 10_000):
            send({"k": "native_call", "seq": i, "name": "util.echo", "args": {"value": "x"}})
            reply = read_frame()
            if reply["k"] != "native_result":
                return
    elif mode == "batch_calls":  # many calls in one write, without waiting for any result
        raw(
            b"".join(
                encode_frame({"k": "native_call", "seq": i, "name": "util.echo", "args": {"value": "x"}})
                for i in range(1, 51)
            )
        )
        time.sleep(2)
    elif mode == "flood_bytes":
        chunk = encode_frame({"k": "probe_ack", "v": 1}) * 10_000
        for _ in range(1000):
            raw(chunk)
    elif mode == "unsolicited_result":
        send({"k": "native_result", "seq": 1, "value": 1})
    elif mode == "long_error":
        send({"k": "final_error", "error": "invalid_program", "message": "\x1b[31m" + "A" * 5000})
    elif mode == "unknown_error":
        send({"k": "final_error", "error": "root_shell", "message": ""})
    elif mode == "say":  # argv: say ERROR MESSAGE
        send({"k": "final_error", "error": sys.argv[2], "message": sys.argv[3]})
    elif mode == "abort_alloc":  # pretends to be the interpreter's allocation failure
        sys.stderr.write("memory allocation of 4294967296 bytes failed\n")
        sys.stderr.flush()
        os.abort()
    elif mode == "abort_alloc_unseen":
        # Dies of its memory limit, but a child keeps stdout open: the host sees no end of the
        # stream, only the deadline (as when it has not read the death yet on a busy machine).
        if os.fork() == 0:
            time.sleep(1.0)  # past the deadline (the host's kill usually ends it first)
            os._exit(0)
        sys.stderr.write("memory allocation of 4294967296 bytes failed\n")
        sys.stderr.flush()
        os.abort()
    elif mode == "abort_plain":
        os.abort()
    elif mode == "own_cpu_limit":  # its own CPU-time limit ends it (SIGXCPU) long before the host's deadline
        resource.setrlimit(resource.RLIMIT_CPU, (1, 2))
        while True:
            pass
    elif mode == "silent_exit":
        return
    elif mode == "hang":
        time.sleep(60)
    elif mode == "attempt_flood":  # argv: attempt_flood NAME: recoverable failures, as many as it can get
        for i in range(1, 10_000):
            send({"k": "native_attempt", "seq": i, "name": sys.argv[2], "args": {"value": "x"}})
            if read_frame()["k"] != "native_error":
                return
    elif mode == "attempt_reply":  # argv: attempt_reply NAME JSON-ARGS: returns whatever the host answered
        send({"k": "native_attempt", "seq": 1, "name": sys.argv[2], "args": json.loads(sys.argv[3])})
        send({"k": "final", "value": read_frame()})
    elif mode == "invalid_reply":  # argv: invalid_reply NAME MESSAGE ATTEMPT(0/1)
        attempt = sys.argv[4] == "1"
        send(
            {"k": "native_invalid", "seq": 1, "name": sys.argv[2], "message": sys.argv[3], "attempt": attempt}
        )
        send({"k": "final", "value": read_frame()})
    elif mode == "invalid_flood":
        for i in range(1, 10_000):
            message = 'argument "value" must be str, got int'
            send({"k": "native_invalid", "seq": i, "name": "util.echo", "message": message, "attempt": True})
            if read_frame()["k"] != "native_error":
                return
    elif mode == "invalid_wrong_seq":
        send({"k": "native_invalid", "seq": 3, "name": "util.echo", "message": "", "attempt": True})
    elif mode == "attempt_rebind":  # arguments the host's own binding refuses: never recoverable
        send({"k": "native_attempt", "seq": 1, "name": "records.lookup", "args": {"key": 5}})
        send({"k": "final", "value": read_frame()})
    elif mode == "attempt_ahead":
        raw(
            encode_frame({"k": "native_attempt", "seq": 1, "name": "util.echo", "args": {"value": "x"}})
            + encode_frame({"k": "final", "value": 1})
        )
    elif mode == "error_from_worker":
        send({"k": "native_error", "seq": 1, "error": "permission denied"})
    elif mode == "prints":  # argv: prints JSON-LIST-OF-[text, cut]: print frames, then a final value
        for text, cut in json.loads(sys.argv[2]):
            send({"k": "print", "text": text, "cut": cut})
        send({"k": "final", "value": "done"})
    elif mode == "prints_flood":  # argv: prints_flood TEXT: print frames, as fast as it can write them
        chunk = encode_frame({"k": "print", "text": sys.argv[2], "cut": False}) * 10_000
        for _ in range(1000):
            raw(chunk)
    elif mode == "prints_then_hang":
        send({"k": "print", "text": "last words\n", "cut": False})
    elif mode == "honest_echo":
        send({"k": "native_call", "seq": 1, "name": "util.echo", "args": {"value": "hi"}})
        reply = read_frame()
        send({"k": "final", "value": reply["value"]})
    time.sleep(5)


if __name__ == "__main__":
    main()
