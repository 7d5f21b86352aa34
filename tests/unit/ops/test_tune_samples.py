"""``quotas tune``'s measurement fields are declared once: a run's sample is the probe's
``Reading`` plus what the run adds."""

from __future__ import annotations

from dataclasses import asdict, fields

from codemode.ops.quota_probes import Reading
from codemode.ops.quotas import RunSample


def test_a_sample_is_the_reading_plus_the_run() -> None:
    assert issubclass(RunSample, Reading)
    read = {f.name for f in fields(Reading)}
    own = [f.name for f in fields(RunSample) if f.name not in read]
    assert own == ["outcome", "execute_s", "detail", "spawn_s", "oom_killed"]


def test_a_sample_is_built_positionally_or_by_name() -> None:
    sample = RunSample("ok", execute_s=0.5, spawn_s=0.4, memory_peak_bytes=1 << 20, cpu_s=0.1)
    assert sample.outcome == "ok" and sample.memory_peak_bytes == 1 << 20
    assert sample.cpu_utilisation == 0.2
    assert {f.name for f in fields(Reading)} <= set(asdict(sample))
