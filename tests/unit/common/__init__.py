"""Tests of ``codemode.common``."""
