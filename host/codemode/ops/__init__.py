"""Operator tools: ``codemode image audit`` (:mod:`.image_audit` over the pure rules of
:mod:`.image_rules`), ``codemode quotas tune`` (:mod:`.quotas`) and ``codemode bench`` (:mod:`.bench`).
They build through :mod:`codemode.startup.bootstrap` like the servers do; the core never imports them."""
