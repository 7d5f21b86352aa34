"""The reuse mode's settings (--reuse-executes, --reuse-idle-seconds): an operator's choice that only
the container runtimes offer and that needs idle sandboxes to keep; each wrong combination is a
configuration error naming the flags and variables, and the mode is off by default."""

from __future__ import annotations

from typing import Any

import pytest

from codemode.runtimes.docker import DockerRuntime
from codemode.runtimes.reuse import ReusePool
from codemode.startup.bootstrap import build_runtime, with_pool
from codemode.startup.config import ConfigError, load_settings


def test_off_by_default() -> None:
    settings = load_settings(allow_all=True, runtime="docker", pool=4)
    assert settings.reuse_executes == 0
    assert not isinstance(with_pool(build_runtime(settings), settings), ReusePool)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (
            {"runtime": "process", "pool": 4, "reuse_executes": 10},
            "--reuse-executes / CODEMODE_REUSE_EXECUTES needs --runtime / CODEMODE_RUNTIME docker or "
            "kubernetes",
        ),
        (
            {"runtime": "docker", "reuse_executes": 10},
            "--reuse-executes / CODEMODE_REUSE_EXECUTES needs --pool / CODEMODE_POOL > 0",
        ),
        (
            {"runtime": "docker", "pool": 4, "reuse_idle_seconds": 5},
            "--reuse-idle-seconds / CODEMODE_REUSE_IDLE_SECONDS applies to the reuse mode only",
        ),
    ],
)
def test_wrong_combinations_name_the_flags(overrides: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(allow_all=True, **overrides)
    assert problem in str(info.value)


def test_the_reuse_mode_wraps_the_runtime() -> None:
    settings = load_settings(
        allow_all=True, runtime="docker", pool=4, reuse_executes=25, reuse_idle_seconds=30
    )
    pool = with_pool(build_runtime(settings), settings)
    assert isinstance(pool, ReusePool) and isinstance(pool.inner, DockerRuntime)
    assert (pool.size, pool.max_executes, pool.idle_seconds) == (4, 25, 30.0)


def test_pool_max_sizes_the_reuse_pool_from_demand() -> None:
    """``--pool-max`` bounds the reuse pool's demand-sized target as it bounds the warm pool's (it
    was refused in the reuse mode before: the reuse pool stayed at ``--pool``)."""
    settings = load_settings(allow_all=True, runtime="docker", pool=2, pool_max=6, reuse_executes=25)
    pool = with_pool(build_runtime(settings), settings)
    assert isinstance(pool, ReusePool)
    assert (pool.minimum, pool.maximum, pool.size) == (2, 6, 2)  # no demand measured yet
    assert not pool.demand.fixed
    fixed = load_settings(allow_all=True, runtime="docker", pool=3, reuse_executes=25)
    fixed_pool = with_pool(build_runtime(fixed), fixed)
    assert isinstance(fixed_pool, ReusePool) and fixed_pool.demand.fixed and fixed_pool.size == 3
