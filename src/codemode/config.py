"""Moved to :mod:`codemode.startup.config`; this import path keeps working."""

from codemode.startup.config import *  # noqa: F403
