"""Host memory per execute is bounded by what a value costs once decoded, not only by its bytes."""

from __future__ import annotations

import random
import struct
import tracemalloc

import pytest

import codemode
from codemode.common.errors import client_text
from codemode.execution.frames import CONTAINER_COST, FrameTooCostly, HostFrameDecoder, estimated_cost
from tests.support.recorder import ALICE, make_server

EMPTY_DICTS = "def main():\n    return [{} for _ in range(340000)]\n"  # ~1 MiB of JSON, ~25 MiB decoded


async def test_a_megabyte_of_empty_dicts_is_a_resource_limit_not_25_mib_of_host_memory() -> None:
    srv, _ = make_server()
    try:
        tracemalloc.start()
        try:
            with pytest.raises(codemode.CodeModeError) as info:
                await srv.execute(EMPTY_DICTS, subject=ALICE)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        await srv.aclose()
    assert client_text(info.value).startswith("resource limit exceeded")
    assert peak < 8 * 1024 * 1024, peak


async def test_ordinary_large_values_still_pass() -> None:
    records = (
        "def main():\n"
        "    return [{'id': i, 'title': 'hello world', 'tags': ['x', 'y']} for i in range(15000)]\n"
    )
    ints = "def main():\n    return list(range(100000))\n"
    text = "def main():\n    return 'x' * 1000000\n"
    srv, _ = make_server()
    try:
        assert len(await srv.execute(records, subject=ALICE)) == 15000
        assert len(await srv.execute(ints, subject=ALICE)) == 100000
        assert len(await srv.execute(text, subject=ALICE)) == 1000000
    finally:
        await srv.aclose()


def test_estimate_charges_containers_not_string_contents() -> None:
    assert estimated_cost(b'{"a":"{[{[,,,:::"}') < estimated_cost(b'{"a":[{},{},{}]}')
    assert estimated_cost(b'"' + b"x" * 1000 + b'"') == 1002
    assert estimated_cost(b'"a\\"[[["') == len(b'"a\\"[[["')


def test_no_byte_costs_more_than_a_container_so_short_frames_skip_the_estimate() -> None:
    # HostFrameDecoder computes the estimate only for bodies longer than budget / (CONTAINER_COST + 1):
    # that is sound only if no body ever costs more than that per byte.
    rng = random.Random(7)
    alphabet = b'{}[],:"\\ x1'
    for _ in range(2000):
        body = bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 200)))
        assert estimated_cost(body) <= (CONTAINER_COST + 1) * len(body)
    assert estimated_cost(b"[" * 100) == (CONTAINER_COST + 1) * 100
    # Past the skip length (40 bytes here) the estimate runs: a body within the budget is accepted,
    # a costly one refused.
    decoder = HostFrameDecoder(4096, memory_budget=(CONTAINER_COST + 1) * 40)
    assert decoder.feed(_frame(b'{"k":"final","value":[[[[[[[[[[[[]]]]]]]]]]]]}')) != []
    with pytest.raises(FrameTooCostly):
        HostFrameDecoder(4096, memory_budget=(CONTAINER_COST + 1) * 40).feed(
            _frame(b'{"k":"final","value":[' + b"[]," * 40 + b"[]]}")
        )


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body
