"""Exhaustion on the process runtime is named, never an internal failure (the worker runs under an
address-space limit; the interpreter panics or aborts when an allocation fails)."""

from __future__ import annotations

from typing import Any

import pytest

import codemode
from codemode.common.errors import client_text
from tests.support.recorder import ALICE, make_server

DOUBLE = "def main():\n    s = 'x'\n    for i in range(40):\n        s = s + s\n    return len(s)\n"
A50 = "a" * 50
REPLACE = (
    f"def main():\n    s = 'a' * 1000000\n    t = s.replace('a', '{A50}')\n"
    f"    return len(t.replace('a', '{A50}'))\n"
)
SHIFT = "the << operator is not supported (its results wrap around); multiply instead"
FORMAT = (
    "def main():\n    s = '{}' * 1000000\n    t = s.format(*(['x' * 100] * 1000000))\n"
    "    return len(t * 50)\n"
)
JOIN = "def main():\n    s = 'y' * 10000000\n    return len(s.join(['x'] * 1000))\n"
BIG_INT = "def main():\n    x = 1\n    for i in range(1000):\n        x = x * 1000000\n    return x\n"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (DOUBLE, "resource limit exceeded: memory"),
        ("def main():\n    return len(sorted(range(1000000000)))\n", "resource limit exceeded: memory"),
        ("def main():\n    return len(list(range(1000000000)))\n", "resource limit exceeded: memory"),
        (REPLACE, "resource limit exceeded: memory"),
        (FORMAT, "resource limit exceeded: memory"),
        (JOIN, "resource limit exceeded: memory"),
        (
            "def main():\n    return len([str(i) for i in range(50000000)])\n",
            "resource limit exceeded: memory",
        ),
        # Integers too long to cross (CPython's int parsing stops at 4300 digits; no CPython text).
        ("def main():\n    return int('9' * 5000)\n", "resource limit exceeded: value size"),
        (BIG_INT, "resource limit exceeded: value size"),
        # `<<` wraps around inside the interpreter (1 << 31 is negative, so 'x' * (1 << 31) is "").
        (
            "def main():\n    return 'x' * (1 << 31)\n",
            f"invalid program: <codemode>:2:21: {SHIFT}",
        ),
        (
            "def main():\n    return 1 << 100000\n",
            f"invalid program: <codemode>:2:14: {SHIFT}",
        ),
        # A repeat count past 32 bits is an error of the interpreter, not a wrapped value.
        (
            "def main():\n    n = 2147483647 + 1\n    return 'x' * n\n",
            "invalid program: <codemode>:3:12: Integer value is too big to fit in i32: 2147483648",
        ),
    ],
)
async def test_exhaustion_is_a_named_limit(source: str, expected: str) -> None:
    srv, _ = make_server(max_execution_time=60.0, max_execution_steps=10**9)
    try:
        with pytest.raises(codemode.CodeModeError) as info:
            await srv.execute(source, subject=ALICE)
    finally:
        await srv.aclose()
    assert client_text(info.value) == expected


DOCKER_CASES = [
    (DOUBLE, "resource limit exceeded: memory"),
    ("def main():\n    return len(sorted(range(1000000000)))\n", "resource limit exceeded: memory"),
    ("def main():\n    return len(list(range(1000000000)))\n", "resource limit exceeded: memory"),
    (JOIN, "resource limit exceeded: memory"),
    ("def main():\n    return int('9' * 5000)\n", "resource limit exceeded: value size"),
]


@pytest.mark.docker
@pytest.mark.slow
async def test_exhaustion_is_a_named_limit_on_docker(docker_api: Any) -> None:
    # The same programs inside the Docker runtime's container (cgroup memory limit, no rlimit).
    import os

    from codemode.runtimes.docker import DEFAULT_IMAGE, DockerOptions, DockerRuntime

    image = os.environ.get("CODEMODE_TEST_WORKER_IMAGE") or DEFAULT_IMAGE
    srv, _ = make_server(
        runtime=DockerRuntime(DockerOptions(image=image)), max_execution_time=60.0, max_execution_steps=10**9
    )
    try:
        for source, expected in DOCKER_CASES:
            with pytest.raises(codemode.CodeModeError) as info:
                await srv.execute(source, subject=ALICE)
            assert client_text(info.value) == expected, source
    finally:
        await srv.aclose()
