"""Tests of ``codemode.startup``."""
