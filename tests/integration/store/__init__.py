"""Tests of ``codemode.store``."""
