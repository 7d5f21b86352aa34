"""Tests of ``codemode_capabilities``."""
