"""A hostile worker for the ``native_batch`` tests: answers the probe honestly, then sends the batch
argv[1] names (and, when the host answers, returns its reply as the program's value)."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.adversarial.worker_frames import raw, read_frame, send, start
else:  # run as a script: its folder is on sys.path
    from worker_frames import raw, read_frame, send, start

from codemode_worker.protocol import encode_frame


def echo(value: object = "x") -> dict[str, Any]:
    return {"name": "util.echo", "args": {"value": value}}


def batch(seq: int, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"k": "native_batch", "seq": seq, "calls": calls}


def main() -> None:
    mode = start()
    if mode == "reply":  # argv: reply JSON-CALLS: one batch, its reply as the value
        send(batch(1, json.loads(sys.argv[2])))
        send({"k": "final", "value": read_frame()})
    elif mode == "wrong_seq":
        send(batch(2, [echo()]))
    elif mode == "seq_after_call":  # one call, then a batch that reuses its seq
        send({"k": "native_call", "seq": 1, "name": "util.echo", "args": {"value": "a"}})
        read_frame()
        send(batch(1, [echo()]))
    elif mode == "over_calls":  # argv: over_calls N
        send(batch(1, [echo(str(i)) for i in range(int(sys.argv[2]))]))
    elif mode == "flood":  # batches of 7 until the host stops answering
        seq = 1
        for _ in range(1000):
            send(batch(seq, [echo(str(i)) for i in range(7)]))
            seq += 7
            if read_frame()["k"] != "native_batch_result":
                return
    elif mode == "unknown":
        send(batch(1, [echo(), {"name": "nope.nothing", "args": {}}]))
    elif mode == "disabled":
        send(batch(1, [echo(), {"name": "util.hidden", "args": {"value": "x"}}]))
    elif mode == "rebind":
        send(batch(1, [echo(), {"name": "records.lookup", "args": {"key": 5}}]))
    elif mode == "empty":
        send(batch(1, []))
    elif mode == "both_keys":
        send(batch(1, [{"name": "util.echo", "args": {"value": "x"}, "invalid": "m"}]))
    elif mode == "not_a_list":
        send({"k": "native_batch", "seq": 1, "calls": {"name": "util.echo", "args": {}}})
    elif mode == "ahead":  # a frame written before the batch's result
        raw(encode_frame(batch(1, [echo()])) + encode_frame({"k": "final", "value": 1}))
    elif mode == "deep":  # one argument map past max_value_depth
        value: object = "x"
        for _ in range(40):
            value = [value]
        send(batch(1, [echo(), {"name": "records.lookup", "args": {"key": "k", "tags": value}}]))
    elif mode == "spread":  # argv: spread N SIZE: N calls whose arguments are each SIZE bytes
        send(batch(1, [echo("x" * int(sys.argv[3])) for _ in range(int(sys.argv[2]))]))
        send({"k": "final", "value": read_frame()["k"]})
    elif mode == "result_from_worker":
        send({"k": "native_batch_result", "seq": 1, "results": [{"ok": True, "value": 1}]})
    time.sleep(5)


if __name__ == "__main__":
    main()
