"""Tests of ``codemode.ops``."""
