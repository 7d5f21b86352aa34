"""Pack support, and the pack-author API: everything a pack imports from codemode beyond the
top-level ``codemode`` names and ``codemode.authz``.

Re-exported here: the pack protocol and loading (``loading``), a pack's lifecycle (``lifecycle``),
JSON Schema to shapes (``jsonschema``), credential redaction (``redaction``), the naming, text and
error rules upstream packs share (``upstream``), the one "did you mean" of a misspelt table key
(``codemode.common.did_you_mean``), what a pack reports about its upstreams' health
(``health``), the catalog bounds a pack builds against, and the store's interface a handler reaches
as ``ctx.store`` (``codemode.store``: the state pack). The
packs that ship (``codemode_capabilities``) import only these. The decorator form is ``registry``.
See docs/packs.md."""

from ..catalog.answers import AnswerBounds
from ..catalog.capability import MAX_CAPABILITIES, MAX_ID_BYTES
from ..common.did_you_mean import did_you_mean
from ..store import StateConflict, StateEntry, Store, StoreFull, StoreUnavailable
from .health import upstream_restarted
from .jsonschema import Dialect, Unsupported, compile_schema, record_of
from .lifecycle import Lifecycle, LoadedPack, PackOpenError
from .loading import Pack, PackError, PackSettings, load_pack, load_packs, pack_capabilities, split_specs
from .redaction import Redactor
from .upstream import (
    SkipReport,
    UpstreamBuildError,
    answer_problem,
    argument_names,
    capability_names,
    check_namespace,
    check_unique_names,
    compile_each,
    description_of,
    search_terms_of,
    snake_case,
    summary_of,
    unique_by_name,
    upstream_error_text,
    upstream_result,
)

__all__ = [
    "MAX_CAPABILITIES",
    "MAX_ID_BYTES",
    "AnswerBounds",
    "Dialect",
    "Lifecycle",
    "LoadedPack",
    "Pack",
    "PackError",
    "PackOpenError",
    "PackSettings",
    "Redactor",
    "SkipReport",
    "StateConflict",
    "StateEntry",
    "Store",
    "StoreFull",
    "StoreUnavailable",
    "Unsupported",
    "UpstreamBuildError",
    "answer_problem",
    "argument_names",
    "capability_names",
    "check_namespace",
    "check_unique_names",
    "compile_each",
    "compile_schema",
    "description_of",
    "did_you_mean",
    "load_pack",
    "load_packs",
    "pack_capabilities",
    "record_of",
    "search_terms_of",
    "snake_case",
    "split_specs",
    "summary_of",
    "unique_by_name",
    "upstream_error_text",
    "upstream_restarted",
    "upstream_result",
]
