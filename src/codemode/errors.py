"""Moved to :mod:`codemode.common.errors`; this import path keeps working."""

from codemode.common.errors import *  # noqa: F403
