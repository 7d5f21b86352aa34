"""The catalog: capabilities and their build-time checks (``capability``), annotations to shapes
(``types``) and the search index (``search``). See docs/reference/capabilities.md and search.md."""
