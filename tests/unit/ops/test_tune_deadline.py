"""``codemode quotas tune``'s deadline: served as recommended, a single execute on a
pool that was not warm yet failed (``resource limit exceeded: concurrency``), and bursts of 8 lost 7.
The deadline counts a worker start whether or not the server has a pool, the queueing of a burst,
and has a floor; the report says what the number assumes."""

from __future__ import annotations

from codemode.ops import quotas
from codemode.ops.quotas import Burst, RunSample, format_report, recommend

#: Five quiet Docker runs as in the issue: 0.6 s an execute, nearly all of it the container start.
QUIET = [RunSample("ok", execute_s=0.60 + i / 100, spawn_s=0.55 + i / 100, cpu_s=0.2) for i in range(5)]


def _deadlines(rec: quotas.Recommendation) -> list[float]:
    """Every deadline the recommendation offers (the old one offered a second, for --pool)."""
    return [rec.max_execution_time, *([v] if (v := getattr(rec, "max_execution_time_warm", None)) else [])]


def test_a_pool_does_not_shorten_the_deadline_below_a_worker_start() -> None:
    """A pool that is not warm yet (just started, or emptied by a burst) starts workers while the
    execute waits: no deadline offered may be shorter than a cold execute, times the factor."""
    rec = recommend(QUIET, "docker")
    assert rec is not None
    slowest = max(s.execute_s for s in QUIET)
    for deadline in _deadlines(rec):
        assert deadline >= slowest * quotas.TIME_FACTOR, _deadlines(rec)


def test_the_deadline_has_a_floor() -> None:
    fast = [RunSample("ok", execute_s=0.012, spawn_s=0.010, cpu_s=0.01) for _ in range(5)]
    rec = recommend(fast, "process")
    assert rec is not None
    assert min(_deadlines(rec)) >= quotas.DEADLINE_FLOOR >= 1.0


def test_the_burst_and_its_queueing_are_counted() -> None:
    """Eight executes at once on four slots: the second four waited for a slot, every one started
    a worker; the slowest of the burst sets the deadline, not a quiet run."""
    burst = Burst(executes=8, slots=4, seconds=[0.7, 0.7, 0.8, 0.8, 1.4, 1.5, 1.5, 1.6], outcomes={"ok": 8})
    rec = recommend(QUIET, "docker", burst)
    assert rec is not None
    assert rec.max_execution_time == 3.2  # slowest of the burst 1.6 s x 2
    assert rec.basis["burst_slowest_s"] == 1.6
    assert rec.serve_flags()[-4:] == ["--max-concurrent-executions", "4", "--max-execution-time", "3.2"]


def test_the_report_says_what_the_number_assumes() -> None:
    burst = Burst(executes=8, slots=8, seconds=[0.9] * 8, outcomes={"ok": 8})
    rec = recommend(QUIET, "docker", burst)
    assert rec is not None
    assumes = " ".join(rec.assumes)
    assert "8 executes at once" in assumes and "8 slots" in assumes
    assert "no warm worker" in assumes and f"at least {quotas.DEADLINE_FLOOR:g} s" in assumes
    report = {
        "program": "job.star",
        "runtime": "docker",
        "image": "codemode-worker:1",
        "runs": 5,
        "warmup": 1,
        "measurement_limits": {"docker_memory": "1g", "max_execution_time": 60.0},
        "samples": [],
        "burst": {"executes": 8, "slots": 8, "seconds": [0.9] * 8, "outcomes": {"ok": 8}},
        "recommendation": {
            "settings": rec.settings,
            "max_execution_time": rec.max_execution_time,
            "serve_flags": rec.serve_flags(),
            "basis": rec.basis,
            "assumes": rec.assumes,
        },
        "method": quotas.METHOD["docker"] | quotas.METHOD["common"],
    }
    text = format_report(report)
    assert "with or without --pool" in text and "assumes:" in text
    assert "pool)" not in text  # no second, shorter deadline "for --pool"
