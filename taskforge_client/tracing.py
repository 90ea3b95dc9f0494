"""The SDK's part of a trace (API.md "Tracing (v1.2)"), when `opentelemetry-api` is installed.

OpenTelemetry is optional: without it `current_context()` is empty and
`process_span` runs the handler as it is.  With it, an enqueue carries the
current span's context (`traceparent`, `tracestate`), and a worker runs each
handler in a `taskforge.process <queue>` span whose parent is the task's
`traceparent` (the claim answer's), so one trace runs from the producer's span
through TaskForge to the handler.  Spans are exported by whatever SDK the
application set up (none: the API's no-op tracer, the context still flows).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised where OpenTelemetry is absent
    _trace = None  # type: ignore[assignment]
    _propagator = None
else:
    _propagator = TraceContextTextMapPropagator()

TRACER_NAME = "taskforge_client"


def available() -> bool:
    """Whether `opentelemetry-api` could be imported."""
    return _propagator is not None


def current_context() -> dict[str, str]:
    """The current span's `traceparent` (and `tracestate`), or {} without a valid span."""
    if _propagator is None:
        return {}
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier


@contextmanager
def process_span(
    queue: str, task_id: str, attempt: int, traceparent: str | None, tracestate: str | None
) -> Iterator[None]:
    """Run the block in a `taskforge.process <queue>` span, child of `traceparent`.

    A handler's exception is recorded on the span (status error) and raised on.
    """
    if _propagator is None or _trace is None:
        yield
        return
    parent: Any = None
    if traceparent:
        carrier = {"traceparent": traceparent}
        if tracestate:
            carrier["tracestate"] = tracestate
        parent = _propagator.extract(carrier)
    tracer = _trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        f"taskforge.process {queue}",
        context=parent,
        kind=_trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "taskforge",
            "messaging.destination.name": queue,
            "messaging.message.id": task_id,
            "messaging.operation.type": "process",
            "taskforge.attempt": attempt,
        },
    ):
        yield
