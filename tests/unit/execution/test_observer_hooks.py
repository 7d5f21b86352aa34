"""The observer's hooks have names that say what they report: an execute's outcome is
``execute_outcome(ExecuteEvent)``, not a hook called ``execute`` beside ``Server.execute``; and an
observer missing a hook is refused when the server is built, not when the first execute ends."""

from __future__ import annotations

import pytest

import codemode
from codemode import authz
from codemode.common.errors import InvalidRegistration
from codemode.runtimes.process import ProcessRuntime


class Seen(codemode.NullObserver):
    def __init__(self) -> None:
        self.outcomes: list[codemode.ExecuteEvent] = []

    def execute_outcome(self, event: codemode.ExecuteEvent) -> None:
        self.outcomes.append(event)


class OnlyTheOldHook:
    """An observer written for the hook's old name."""

    def native_call(self, event: codemode.CallEvent) -> None:
        return None

    def execute(self, event: codemode.ExecuteEvent) -> None:
        return None

    def execute_started(self, subject_id: str) -> None:
        return None

    def execute_finished(self, subject_id: str) -> None:
        return None


def test_the_hooks_are_named_for_what_they_report() -> None:
    hooks = {name for name in vars(codemode.Observer) if not name.startswith("_")}
    assert hooks == {"native_call", "execute_outcome", "execute_started", "execute_finished"}
    assert not hasattr(codemode.NullObserver, "execute")


def test_an_observer_without_a_hook_is_refused_at_build() -> None:
    builder = codemode.Builder(authorizer=authz.allow_all(), observer=OnlyTheOldHook())  # type: ignore[arg-type]
    with pytest.raises(InvalidRegistration) as info:
        builder.build()
    assert info.value.problems == [
        "observer: must have native_call, execute_outcome, execute_started and execute_finished"
    ]


async def test_an_execute_reports_its_outcome_to_execute_outcome() -> None:
    seen = Seen()
    runtime = ProcessRuntime()
    server = codemode.Builder(authorizer=authz.allow_all(), observer=seen, runtime=runtime).build()
    try:
        assert await server.execute("def main():\n    return 1\n", subject=authz.Subject("alice")) == 1
        with pytest.raises(codemode.InvalidProgram):
            await server.execute("def main(:\n", subject=authz.Subject("alice"))
    finally:
        await server.aclose()
    assert [e.outcome for e in seen.outcomes] == ["ok", "invalid_program"]
