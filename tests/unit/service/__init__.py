"""Tests of ``codemode.service``."""
