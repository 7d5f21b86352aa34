"""Logging of ``serve --http``, configured once per process (docs/service.md, "Connections").

uvicorn configures logging in every ``uvicorn.Config`` it builds (``dictConfig`` of its defaults,
levels, and ``access_log=False`` empties the access logger's handlers); the metrics server's
configuration used to run after the main server's, replacing the rate-limited handlers and the
main server's levels and access log. :func:`configure_logging` does it once instead: uvicorn's own
handlers and formats (``uvicorn`` on stderr, ``uvicorn.access`` on stdout), the root handler for
everything else on stderr, the level, and the process-wide repeat filter on every one of those
handlers. Every ``uvicorn.Config`` of the service is then built with ``log_config=None`` and
``log_level=None``, so no server touches logging again; side listeners write no access lines
(their protocol turns the access log off for their own connections only), and uvicorn's lifecycle
lines (started, shutting down, finished) are the MCP listener's alone (:func:`side_listener`).
"""

from __future__ import annotations

import contextvars
import copy
import logging
import logging.config

from uvicorn.config import LOGGING_CONFIG

from ..startup.config import ConfigError, names
from .logfilter import RepeatFilter, install_repeat_filter

__all__ = ["configure_logging", "log_level", "side_listener"]


#: True in a side listener's task: uvicorn's lifecycle lines are the MCP listener's alone.
_SIDE_LISTENER: contextvars.ContextVar[bool] = contextvars.ContextVar("codemode_side_listener", default=False)


def side_listener() -> None:
    """Mark the running task as a side listener's (the metrics or the health port): uvicorn's
    lifecycle lines it logs (``Started server process``, ``Shutting down``, ``Finished server
    process``; info and below) are dropped, since the MCP listener's say the same of the same
    process. Its warnings and errors are kept."""
    _SIDE_LISTENER.set(True)


class _MainListenerLifecycle(logging.Filter):
    """On ``uvicorn.error``: drops the info lines of a side listener's task (:func:`side_listener`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not _SIDE_LISTENER.get()


_LIFECYCLE_FILTER = _MainListenerLifecycle()


def log_level(name: str) -> int:
    """The numeric level of a ``log_level`` setting.

    Args:
        name: a level name (``info``, ``WARNING``, ...).

    Returns:
        Its number.

    Raises:
        ConfigError: it names no level (the message names the setting).
    """
    level = logging.getLevelName(name.upper())
    if not isinstance(level, int):
        raise ConfigError(f"{names('log_level')}: unknown level {name!r}")
    return level


def configure_logging(name: str) -> RepeatFilter:
    """Configure logging once for the process: uvicorn's loggers at ``name``'s level, a root
    handler when there is none, and the repeat filter on them.

    Args:
        name: the ``log_level`` setting.

    Returns:
        The process-wide repeat filter (the service flushes it every window).

    Raises:
        ConfigError: ``name`` names no level.
    """
    level = log_level(name)
    config = copy.deepcopy(LOGGING_CONFIG)
    for logger in config["loggers"].values():
        logger["level"] = level
    logging.config.dictConfig(config)
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("codemode").setLevel(level)
    logging.getLogger("uvicorn.error").addFilter(_LIFECYCLE_FILTER)  # the same object: added once
    return install_repeat_filter()
