"""OpenAPI 3.x documents as typed capabilities, one per operation: the pack is
:mod:`codemode_capabilities.openapi.pack`, re-exported here; its parts are the other modules of this
package. See docs/packs.md, "OpenAPI documents"."""

from .pack import (
    MAX_DOCUMENT_BYTES,
    OpenAPIConfig,
    OpenAPIPack,
    Operation,
    compile_document,
    load_document,
    openapi_pack,
)

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "OpenAPIConfig",
    "OpenAPIPack",
    "Operation",
    "compile_document",
    "load_document",
    "openapi_pack",
]
