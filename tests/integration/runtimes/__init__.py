"""Tests of ``codemode.runtimes``."""
