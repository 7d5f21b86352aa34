"""``codemode bench``'s sustained series deadline: ``--deadline`` or a measured choice.

With the default 5 s deadline, 20 clients over pods that start at about 1.2 per second ended 188 of
200 executes in ``concurrency``: the bench now chooses the deadline from the measured rate of cold
starts, says which in its output, and ``--deadline`` sets it.
"""

from __future__ import annotations

import argparse

import pytest

from codemode.common.command import CommandError
from codemode.ops import bench


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_deadline_that_is_not_positive_is_refused(value: str) -> None:
    with pytest.raises(CommandError, match="--deadline must be positive"):
        bench.run(_args("--deadline", value))


async def test_the_given_deadline_is_used_and_said(capsys: pytest.CaptureFixture[str]) -> None:
    assert await bench._load_deadline(_args("--deadline", "12.5"), quiet=False) == 12.5
    assert "sustained series deadline              12.5 s  (--deadline)" in capsys.readouterr().out


async def test_the_chosen_deadline_comes_from_the_measured_start_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The process runtime starts 8 workers at once in well under a second: 2 x 1 client / rate is
    # below the default, which stays.
    assert await bench._load_deadline(_args("--clients", "1"), quiet=False) == 5.0
    out = capsys.readouterr().out
    assert "max(default 5 s, 2 x 1 clients / " in out and "starts+removals/s with 8 at once)" in out
