"""The one error of a command (``codemode token``, ``image audit``, ``quotas tune``, ``bench``): its exit
status and one line. The tools raise it; ``codemode.cli.main`` prints it once, as
``codemode <command>: <line>``, and exits with its status."""

from __future__ import annotations

__all__ = ["FAILED", "USAGE", "CommandError"]

#: The exit status of a command that ran and failed (a runtime it could not reach, a failed check).
FAILED = 1
#: The exit status of a command that could not run: bad arguments, configuration or files.
USAGE = 2


class CommandError(Exception):
    """A command stops with ``status`` and one line (``str(error)``, without the command's name).

    Args:
        message: the line.
        status: the exit status (:data:`USAGE` by default, :data:`FAILED`).
    """

    def __init__(self, message: str, status: int = USAGE) -> None:
        super().__init__(message)
        self.status = status
