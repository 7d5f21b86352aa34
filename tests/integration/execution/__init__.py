"""Tests of ``codemode.execution``."""
