"""One percentile: ``codemode.ops.percentile`` is what ``bench``, ``quotas tune`` and
the benchmarks print; nearest rank, so each figure is a measured sample."""

from __future__ import annotations

import pytest

from codemode.ops.percentile import percentile


def test_nearest_rank() -> None:
    samples = [float(n) for n in range(1, 101)]  # 1 .. 100, shuffled below
    shuffled = samples[::2] + samples[1::2]
    assert percentile(shuffled, 0) == 1.0
    assert percentile(shuffled, 100) == 100.0
    assert percentile(shuffled, 50) == 51.0  # round(0.5 * 99) = 50 (banker's rounding), the 51st
    assert percentile(shuffled, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0], 50) == 1.0


@pytest.mark.parametrize(("samples", "p"), [([], 50), ([1.0], -1), ([1.0], 101)])
def test_refuses_what_has_no_percentile(samples: list[float], p: float) -> None:
    with pytest.raises(ValueError):
        percentile(samples, p)


def test_the_tools_print_this_one() -> None:
    from codemode.ops import bench, quotas

    assert vars(bench)["percentile"] is percentile
    assert vars(quotas)["percentile"] is percentile
