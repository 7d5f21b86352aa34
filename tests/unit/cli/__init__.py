"""Tests of ``codemode.cli``."""
