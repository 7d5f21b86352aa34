"""Moved to :mod:`codemode.packs.jsonschema`; this import path keeps working."""

from codemode.packs.jsonschema import *  # noqa: F403
