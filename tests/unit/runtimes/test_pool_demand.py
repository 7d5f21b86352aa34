"""The warm pool's target from measured demand, and each subject's share (``codemode.runtimes.demand``).

Deterministic: the clock is a variable the test moves; nothing sleeps or times anything.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from codemode.runtimes.demand import Demand, Shares
from codemode.startup.bootstrap import with_pool
from codemode.startup.config import ConfigError, Settings, load_settings
from tests.support.fakes import Clock


def steady(demand: Demand, clock: Clock, rate: float, seconds: float) -> None:
    """Arrivals every 1/rate seconds for ``seconds``."""
    step = 1.0 / rate
    for _ in range(round(seconds * rate)):
        clock.now += step
        demand.arrival()


def test_a_steady_rate_is_measured() -> None:
    clock = Clock(1000.0)
    demand = Demand(0, 100, window=10.0, clock=clock)
    steady(demand, clock, rate=20.0, seconds=100.0)  # ten windows: converged
    assert demand.rate() == pytest.approx(20.0, rel=0.03)


def test_with_no_arrivals_the_rate_decays_with_the_window() -> None:
    clock = Clock(1000.0)
    demand = Demand(0, 100, window=10.0, clock=clock)
    steady(demand, clock, rate=20.0, seconds=100.0)
    before = demand.rate()
    clock.now += 10.0
    assert demand.rate() == pytest.approx(before / math.e)
    clock.now += 1000.0
    assert demand.rate() < 1e-30


def test_the_target_is_rate_times_spawn_time_times_headroom_rounded_up() -> None:
    clock = Clock(1000.0)
    demand = Demand(1, 50, window=10.0, headroom=2.0, clock=clock)
    steady(demand, clock, rate=20.0, seconds=100.0)
    assert demand.target() == 1  # no spawn measured yet: the minimum
    demand.spawned(0.25)
    assert demand.spawn_seconds() == 0.25
    rate = demand.rate()
    assert demand.target() == math.ceil(rate * 0.25 * 2.0 - 1e-9)
    # 20/s x 0.25 s x 2 = 10, and read right after an arrival the decayed count holds that arrival
    # in full: 1 / (1 - e^(-0.05/10)) = 200.5 arrivals over the 10 s window, 20.05/s, so 11.
    assert demand.target() == 11


def test_the_target_stays_within_the_bounds() -> None:
    clock = Clock(1000.0)
    demand = Demand(2, 6, window=1.0, headroom=2.0, clock=clock)
    demand.spawned(1.0)
    assert demand.target() == 2  # no demand: the minimum
    steady(demand, clock, rate=1000.0, seconds=5.0)
    assert demand.target() == 6  # far more demand: the maximum
    clock.now += 100.0
    assert demand.target() == 2  # demand gone: back to the minimum


def test_a_fixed_pool_never_moves() -> None:
    clock = Clock(1000.0)
    demand = Demand(4, 4, clock=clock)
    demand.spawned(5.0)
    steady(demand, clock, rate=1000.0, seconds=5.0)
    assert demand.fixed and demand.target() == 4


def test_the_spawn_time_is_a_moving_average() -> None:
    demand = Demand(0, 10, alpha=0.5, clock=Clock(1000.0))
    demand.spawned(1.0)
    demand.spawned(3.0)
    assert demand.spawn_seconds() == 2.0
    demand.spawned(-1.0)  # a clock step never makes it negative
    assert demand.spawn_seconds() == 1.0


def test_a_burst_raises_the_target_then_it_falls_back() -> None:
    clock = Clock(1000.0)
    demand = Demand(1, 16, window=10.0, headroom=2.0, clock=clock)
    demand.spawned(0.1)
    for _ in range(200):  # 200 executes in one second
        clock.now += 0.005
        demand.arrival()
    peak = demand.target()
    assert peak == math.ceil(demand.rate() * 0.1 * 2.0 - 1e-9) and peak > 1
    clock.now += 30.0
    assert demand.target() < peak
    clock.now += 60.0
    assert demand.target() == 1


def test_the_target_grows_at_once_and_holds_its_peak_before_it_shrinks() -> None:
    clock = Clock(1000.0)
    demand = Demand(1, 16, window=2.0, hold=10.0, headroom=2.0, clock=clock)
    demand.spawned(0.5)
    for _ in range(40):  # a burst: 40 arrivals in 0.4 s
        clock.now += 0.01
        demand.arrival()
    peak = demand.target()
    assert peak == demand.want() == 16  # ~20/s x 0.5 s x 2, clamped: grown during the burst
    clock.now += 5.0  # the rate has decayed (want is small) but the hold keeps the size
    assert demand.want() < peak and demand.target() == peak
    clock.now += 5.0  # ten seconds after the peak was last seen: it may shrink
    assert demand.target() == demand.want() < peak
    clock.now += 60.0
    assert demand.target() == 1


def test_without_a_hold_the_target_follows_the_rate() -> None:
    clock = Clock(1000.0)
    demand = Demand(0, 16, window=2.0, hold=0.0, clock=clock)
    demand.spawned(0.5)
    steady(demand, clock, rate=8.0, seconds=20.0)
    high = demand.target()
    clock.now += 4.0
    assert demand.target() == demand.want() < high


@pytest.mark.parametrize(
    ("minimum", "maximum", "kw"),
    [
        (-1, 0, {}),
        (3, 2, {}),
        (0, 1, {"window": 0}),
        (0, 1, {"hold": -1}),
        (0, 1, {"headroom": 0}),
        (0, 1, {"alpha": 1.5}),
        (0, 1, {"window": math.nan}),  # NaN passed "<= 0": the target then sat at the maximum
        (0, 1, {"headroom": math.nan}),
        (0, 1, {"hold": math.nan}),
        (0, 1, {"alpha": math.nan}),
        (0, 1, {"window": math.inf}),
    ],
)
def test_bad_bounds_are_refused(minimum: int, maximum: int, kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Demand(minimum, maximum, **kw)


def test_a_subject_takes_at_most_its_share_until_the_pool_replaces_them() -> None:
    shares = Shares(0.5)
    assert shares.cap(4) == 2 and shares.cap(1) == 1 and shares.cap(0) == 1
    for _ in range(2):
        assert shares.may_take("flood", 4)
        shares.took("flood")
    assert not shares.may_take("flood", 4)  # its share of a pool of 4 is taken
    assert shares.may_take("victim", 4)  # another subject is not affected
    shares.took("victim")
    shares.replaced()  # the oldest debt (flood's first) is paid
    assert shares.owed("flood") == 1 and shares.may_take("flood", 4)
    shares.took("flood")
    shares.replaced()
    shares.replaced()
    assert shares.owed("flood") == 1 and shares.owed("victim") == 0
    shares.clear()
    assert shares.owed("flood") == 0


def test_a_share_of_one_is_no_cap() -> None:
    shares = Shares(1.0)
    for _ in range(10):
        assert shares.may_take("flood", 2)
        shares.took("flood")
    with pytest.raises(ValueError):
        Shares(0)
    with pytest.raises(ValueError):
        Shares(1.5)


class _Runtime:
    name = "fake"
    concurrent_refill = False


def test_settings_make_a_demand_sized_pool() -> None:
    settings = Settings(
        allow_all=True, pool=2, pool_max=8, pool_refill_concurrency=3, pool_subject_share=0.25
    )
    pool = with_pool(_Runtime(), settings)  # type: ignore[arg-type]
    from codemode.runtimes.pool import WarmPool

    assert isinstance(pool, WarmPool)
    assert (pool.minimum, pool.maximum, pool.refill_concurrency, pool.shares.share) == (2, 8, 3, 0.25)
    assert pool.size == 2  # no demand measured yet: the minimum
    fixed = with_pool(_Runtime(), Settings(allow_all=True, pool=3, transport="http"))  # type: ignore[arg-type]
    assert isinstance(fixed, WarmPool) and fixed.demand.fixed and fixed.size == 3
    assert fixed.shares.share == 0.5  # the service's default: half the pool per subject
    stdio = with_pool(_Runtime(), Settings(allow_all=True, pool=3, transport="stdio"))  # type: ignore[arg-type]
    assert isinstance(stdio, WarmPool) and stdio.shares.share == 1.0  # one subject: no cap
    only_max = with_pool(_Runtime(), Settings(allow_all=True, pool_max=4))  # type: ignore[arg-type]
    assert isinstance(only_max, WarmPool) and (only_max.minimum, only_max.maximum) == (0, 4)
    runtime: Any = _Runtime()
    assert with_pool(runtime, Settings(allow_all=True)) is runtime


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CODEMODE_POOL": "4", "CODEMODE_POOL_MAX": "2"}, "--pool-max / CODEMODE_POOL_MAX must be at least"),
        ({"CODEMODE_POOL_REFILL_CONCURRENCY": "2"}, "needs --pool / CODEMODE_POOL or --pool-max"),
        ({"CODEMODE_POOL_SUBJECT_SHARE": "0"}, "CODEMODE_POOL_SUBJECT_SHARE"),
    ],
)
def test_bad_pool_settings_name_the_flag(
    env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(allow_all=True)
    assert message in str(caught.value)


def test_toml_keys_set_the_pool_bounds(tmp_path: Path) -> None:
    path = tmp_path / "codemode.toml"
    path.write_text("allow_all = true\npool = 1\npool_max = 5\npool_refill_concurrency = 2\n")
    settings = load_settings(path)
    assert (settings.pool, settings.pool_max, settings.pool_refill_concurrency) == (1, 5, 2)


def test_a_start_time_that_is_not_finite_leaves_the_target_computable() -> None:
    # The target is read where a lease ends and in the refill loop: one bad sample must not make it
    # raise (OverflowError from rounding inf) for every tenant after it.
    clock = Clock(1000.0)
    demand = Demand(1, 8, window=1.0, headroom=2.0, clock=clock)
    demand.spawned(0.5)
    demand.spawned(math.inf)
    assert demand.spawn_seconds() == 0.5  # ignored
    demand.spawned(math.nan)
    assert demand.spawn_seconds() is not None and math.isfinite(demand.spawn_seconds() or 0.0)
    steady(demand, clock, rate=10.0, seconds=5.0)
    assert 1 <= demand.target() <= 8
    huge = Demand(1, 8, window=1.0, headroom=1e308, clock=clock)
    huge.spawned(1e308)  # finite, but rate x spawn x headroom overflows to inf
    steady(huge, clock, rate=10.0, seconds=5.0)
    assert huge.target() == 8
    assert huge.target(base=3) == 8
