"""The OpenTelemetry pipeline the ``trace_*`` settings describe (docs/tracing.md): an SDK tracer
provider naming the service, a batching span processor and the OTLP/HTTP exporter.

Imported only when ``trace_endpoint`` is set, so a host without tracing never loads the SDK or the
exporter. The provider is flushed and shut down when the server closes (``Server.attach``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..common.extras import MissingExtra, require
from ..execution.tracing import Tracing
from .config import ConfigError, Settings, names

__all__ = ["TraceExport", "build_tracing"]

log = logging.getLogger("codemode.traces")

#: The OTLP/HTTP span exporter's module (the ``tracing`` extra installs it).
_OTLP_HTTP = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


class TraceExport:
    """The SDK provider of one server: :meth:`aclose` exports what is queued and stops it.

    Args:
        provider: the OpenTelemetry SDK ``TracerProvider``.
    """

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    async def open(self) -> None:
        """Nothing to open (the server's lifecycle step, ``codemode.packs.Lifecycle``)."""

    async def aclose(self) -> None:
        """Flush and shut down the provider (in a thread: the exporter's last send blocks)."""
        await asyncio.to_thread(self.provider.shutdown)


def build_tracing(settings: Settings) -> tuple[Tracing, TraceExport]:
    """The :class:`Tracing` for ``Builder(tracing=...)`` and the export to close with the server.

    Args:
        settings: the settings (``trace_endpoint`` set, ``trace_service_name``, ``trace_subject``).

    Returns:
        The tracing (OTLP/HTTP through a batch processor) and its export.

    Raises:
        ConfigError: the OpenTelemetry SDK or its OTLP exporter is not installed (the ``tracing``
            extra).
    """
    assert settings.trace_endpoint is not None
    try:
        for module in ("opentelemetry.trace", "opentelemetry.sdk.trace", _OTLP_HTTP):
            require(module, "tracing", "tracing")
    except MissingExtra as exc:
        raise ConfigError(f"{names('trace_endpoint')}: {exc}") from None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: settings.trace_service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.trace_endpoint)))
    log.info("tracing: OTLP/HTTP to %s as service %r", settings.trace_endpoint, settings.trace_service_name)
    return Tracing(provider, subject=settings.trace_subject), TraceExport(provider)
