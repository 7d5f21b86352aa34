"""Tests of ``codemode.packs``."""
