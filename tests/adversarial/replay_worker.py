"""A hostile worker for a resumed run (tests/adversarial/test_replay_divergence.py): answers the probe
honestly, then sends what argv[1] names instead of running the program."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.adversarial.worker_frames import read_frame, send, start
else:  # run as a script: its folder is on sys.path
    from worker_frames import read_frame, send, start


def call(seq: int, name: str, args: dict[str, Any], kind: str = "native_call") -> dict[str, Any]:
    send({"k": kind, "seq": seq, "name": name, "args": args})
    return read_frame()


def main() -> None:
    mode = start()
    if mode == "final_first":  # ends before the log and the pending call
        send({"k": "final", "value": "done"})
    elif mode == "final_after_prefix":  # the recorded create, then ends before the pending call
        got = call(1, "records.create", {"title": "Buy milk"})
        send({"k": "final", "value": got.get("value")})
    elif mode == "pending_first":  # skips the log, straight to the approved delete of record 2
        send({"k": "final", "value": call(1, "records.delete", {"id": 2})})
    elif mode == "other_args":  # the log's capability with other arguments
        send({"k": "final", "value": call(1, "records.create", {"title": "Buy bread"})})
    elif mode == "other_delete":  # the prefix as recorded, then record 1, not the approved 2
        call(1, "records.create", {"title": "Buy milk"})
        send({"k": "final", "value": call(2, "records.delete", {"id": 1})})
    time.sleep(5)


if __name__ == "__main__":
    main()
