"""Optional OpenTelemetry tracing: spans for deliveries, job attempts and steps, ``traceparent`` downstream.

Installed with the ``otel`` extra (``pip install 'effectgate[otel]'``) and switched on by a ``[tracing]``
table in the configuration. Until ``configure`` or ``install`` runs, nothing of OpenTelemetry is imported
and ``span`` hands back one shared object whose methods do nothing, so a deployment without tracing pays
a global lookup per span site and nothing else.

The spans (names and the attributes they carry):

    POST /webhooks/{source}   an HTTP SERVER span: http.request.method, http.route, url.path, url.scheme,
                              network.protocol.version, client.address, user_agent.original,
                              http.response.status_code, source   (gateway, one per delivery request;
                              status ERROR on a 5xx answer)
      effectgate.verify  source, scheme; a signature error is recorded on it
      effectgate.claim   effect keys, outcomes                      (pool wait + the claim transaction)
    effectgate.job       job id, kind, tenant, effect key, attempt, outcome   (worker, one per slice)
      effectgate.step    effect key, step name, whether replayed from the ledger
        → downstream HTTP requests carry ``traceparent`` (W3C trace context) naming the step span

A job's trace is its own, but LINKED to the delivery that claimed it: the claim stores the delivery span's
``traceparent`` on the job row (``jobs.trace_parent``), and every attempt's ``effectgate.job`` span carries
a link to it, so a trace UI goes from a job to the request that created it. While tracing is on, log
lines written inside a span carry its ``trace_id`` and ``span_id`` (``gateway.logs``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float] | Sequence[bool]

DEFAULT_SERVICE_NAME = "effectgate"
DEFAULT_SAMPLE_RATIO = 1.0
DEFAULT_EXPORT_TIMEOUT = 10.0
# What the otel extra installs; checked at configuration time so a [tracing] table without them is a
# configuration error naming the extra, not an ImportError at the first delivery.
REQUIRED_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")


class TracingUnavailable(Exception):
    """Tracing is configured but the ``otel`` extra is not installed."""


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """``[tracing]``: where spans are exported (OTLP over HTTP/protobuf) and how many are kept."""

    endpoint: str
    service_name: str = DEFAULT_SERVICE_NAME
    # The fraction of new traces kept (parent-based: a sampled parent keeps its children).
    sample_ratio: float = DEFAULT_SAMPLE_RATIO
    timeout: float = DEFAULT_EXPORT_TIMEOUT

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http(s) URL, got {self.endpoint!r}")
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio must be between 0 and 1, got {self.sample_ratio!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout!r}")


class Span(Protocol):
    """What a span site may do with the span it opened."""

    def set_attribute(self, key: str, value: AttributeValue) -> None: ...


class _NoSpan:
    """The span when tracing is off: a context manager (sync and async) whose methods do nothing."""

    __slots__ = ()

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        return None

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> _NoSpan:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


NO_SPAN = _NoSpan()


class _Span:
    """A current span, usable in ``with`` and in ``async with`` (beside a connection, say)."""

    __slots__ = ("_manager",)

    def __init__(
        self,
        tracer: Tracer,
        name: str,
        attributes: Mapping[str, AttributeValue] | None,
        *,
        server: bool = False,
        links: Sequence[str] = (),
    ) -> None:
        from opentelemetry.trace import Link, SpanKind

        linked = [Link(context) for context in map(_span_context, links) if context is not None]
        self._manager = tracer.start_as_current_span(
            name,
            kind=SpanKind.SERVER if server else SpanKind.INTERNAL,
            attributes=attributes,
            links=linked,
        )

    def __enter__(self) -> Span:
        span: Span = self._manager.__enter__()
        return span

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The span records an exception passing through it and marks itself an error; it never
        # swallows one.
        self._manager.__exit__(kind, exc, tb)

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(kind, exc, tb)


_tracer: Tracer | None = None
_inject: Any = None
_provider: TracerProvider | None = None


def span(
    name: str, attributes: Mapping[str, AttributeValue] | None = None, *, links: Sequence[str] = ()
) -> _Span | _NoSpan:
    """A span named ``name`` made current for the block, or ``NO_SPAN`` while tracing is off. ``links`` are
    ``traceparent`` values of spans this one follows from without being their child (a job's attempt and
    the delivery that claimed it); one that does not parse is left out."""
    if _tracer is None:
        return NO_SPAN
    return _Span(_tracer, name, attributes, links=links)


def server_span(name: str, attributes: Mapping[str, AttributeValue] | None = None) -> _Span | _NoSpan:
    """An HTTP SERVER span (OpenTelemetry's kind for a request this process answers), made current for the
    block; ``NO_SPAN`` while tracing is off. It starts a trace of its own: a ``traceparent`` the sender
    presents is not followed, since anyone can send one (and with it decide what is sampled)."""
    if _tracer is None:
        return NO_SPAN
    return _Span(_tracer, name, attributes, server=True)


def set_error(span: Span, description: str) -> None:
    """Mark ``span`` failed (an HTTP server span answering 5xx, say); nothing while tracing is off."""
    if _tracer is not None and not isinstance(span, _NoSpan):
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, description))  # type: ignore[attr-defined]


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, kept with what it creates (a claimed job) so later work
    can link back to it; ``None`` while tracing is off or when no span is recording."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of the current span in hex, for log lines; ``None`` while tracing is off or
    outside any span."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def _span_context(traceparent: str) -> Any:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": traceparent}))
    span_context = context.get_span_context()
    return span_context if span_context.is_valid else None


def inject(headers: MutableMapping[str, str]) -> None:
    """Add ``traceparent`` (and ``tracestate``) for the current span to outgoing request ``headers``."""
    if _inject is not None:
        _inject(headers)


def enabled() -> bool:
    """Whether spans are being recorded in this process."""
    return _tracer is not None


def check_available() -> None:
    """Raise ``TracingUnavailable`` unless the ``otel`` extra is installed."""
    for module in REQUIRED_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise TracingUnavailable(
                f"the otel extra is not installed (no {module}): pip install 'effectgate[otel]'"
            )


def install(provider: TracerProvider) -> None:
    """Record spans through ``provider`` from now on (``configure`` builds one; tests pass their own)."""
    global _tracer, _inject, _provider
    from opentelemetry import propagate

    _tracer = provider.get_tracer("effectgate")
    _inject = propagate.inject
    _provider = provider


def uninstall() -> None:
    """Stop recording spans in this process (tests)."""
    global _tracer, _inject, _provider
    _tracer = None
    _inject = None
    _provider = None


def flush(timeout: float = 5.0) -> None:
    """Export the spans still buffered, waiting at most ``timeout`` seconds (blocking: call it in a thread).

    Process exit would flush too, but ``serve`` ends by re-raising the SIGTERM it handled, which skips
    exit handlers: its lifespan calls this instead, so the last seconds of spans are not lost.
    """
    if _provider is not None:
        _provider.force_flush(int(timeout * 1000))


def configure(config: TracingConfig | None, *, role: str) -> None:
    """Export this process's spans over OTLP as ``config`` says; nothing at all when it is ``None``.

    ``role`` (``gateway``, ``worker``) becomes a resource attribute beside the service name. The
    provider becomes OpenTelemetry's global one too, so spans a handler opens itself join the same
    traces; it flushes what it holds when the process exits.
    """
    if config is None:
        return
    check_available()
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": config.service_name, "effectgate.role": role}),
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
    )
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint, timeout=config.timeout))
    )
    trace.set_tracer_provider(provider)
    install(provider)
