"""Capability packs that ship with codemode.

Each module exposes a ``pack`` object usable as ``--pack codemode.capabilities.<module>:pack``
(see ``codemode.packs`` for the pack protocol):

- ``records``: a SQLite-backed records store (create, get, search, update, delete), each record owned
  by the subject that created it.
"""
