"""``serve --stdio`` that cannot start tells its MCP client why.

An MCP client starts a stdio server and sends ``server/discover`` or ``initialize`` at once; a
server that exits instead shows the client only "Connection closed" (its stderr goes to a log the
user rarely sees). So before exiting, the server answers each request already waiting on stdin, or
arriving within a few seconds, with a JSON-RPC error whose message is the start-up line stderr got,
which the client shows. Only the client that started the process gets it: it gave the command line
and the environment the line is about. Nothing happens when stdin is a terminal or closed.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from typing import Any

__all__ = ["ANSWER_WAIT", "ERROR_CODE", "refuse_client"]

#: Seconds the server waits for the client's requests before it exits.
ANSWER_WAIT = 5.0
#: The JSON-RPC error code of the answer (internal error: the server could not start).
ERROR_CODE = -32603
#: Requests answered at most (discover, initialize and a retry are what a client sends).
_MAX_ANSWERS = 8
#: Bytes of one request line read at most.
_MAX_LINE = 1 << 20


def _request_id(line: bytes) -> Any:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if isinstance(message, dict) and isinstance(message.get("method"), str) and "id" in message:
        request_id = message["id"]
        if isinstance(request_id, str | int) and not isinstance(request_id, bool):
            return request_id
    return None


def refuse_client(message: str, *, wait: float = ANSWER_WAIT) -> int:
    """Answer the MCP client's requests on stdin with ``message`` as a JSON-RPC error, until stdin
    ends, ``wait`` seconds pass, or a few were answered.

    Args:
        message: the start-up problem, one line (what stderr got).
        wait: seconds to wait for requests.

    Returns:
        How many requests were answered.
    """
    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd):
            return 0
    except (AttributeError, OSError, ValueError):
        return 0
    deadline = time.monotonic() + wait
    pending = b""
    answered = 0
    while answered < _MAX_ANSWERS:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            ready, _, _ = select.select([fd], [], [], left)
            chunk = os.read(fd, 65536) if ready else b""
        except OSError:
            break
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending and answered < _MAX_ANSWERS:
            line, pending = pending.split(b"\n", 1)
            request_id = _request_id(line)
            if request_id is None:
                continue  # a notification, or not a request at all
            answer = {"jsonrpc": "2.0", "id": request_id, "error": {"code": ERROR_CODE, "message": message}}
            try:
                sys.stdout.write(json.dumps(answer) + "\n")
                sys.stdout.flush()
            except (BrokenPipeError, OSError, ValueError):
                return answered
            answered += 1
        if len(pending) > _MAX_LINE:
            break
    return answered
