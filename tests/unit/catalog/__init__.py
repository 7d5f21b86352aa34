"""Tests of ``codemode.catalog``."""
