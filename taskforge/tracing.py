"""Tracing (API.md "Tracing (v1.2)"): W3C Trace Context kept per task, spans over OTLP.

Two parts, the first always on, the second only when configured:

- **Context.** An enqueue's `traceparent` and `tracestate` (its headers, or a
  batch item's own fields) are checked by `context_of` and kept on the task
  (`Task.traceparent`, `Task.tracestate`): a malformed `traceparent` is dropped
  together with its `tracestate`, never refused.  A claim hands them back as
  they came; a push request carries `push_context`'s (the task's trace, whose
  parent is the attempt's dispatch span); a schedule's task starts a trace of
  its own (`scheduled`).
- **Spans.** With `OTEL_EXPORTER_OTLP_ENDPOINT` or
  `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set (and neither `OTEL_SDK_DISABLED=true`
  nor `OTEL_TRACES_EXPORTER=none`), every process exports its spans through
  the OpenTelemetry SDK's batch processor and OTLP/HTTP exporter, which read
  the other standard variables themselves (`OTEL_EXPORTER_OTLP_HEADERS`,
  `OTEL_BSP_SCHEDULE_DELAY`, ...; `OTEL_SERVICE_NAME` defaults to
  `taskforge`; `OTEL_TRACES_SAMPLER`).  `ENABLED` is read once, at import; each
  call site checks it before doing any tracing work, so with the variables
  unset the SDK is never imported and no connection is opened.

Spans are built from the rows a statement returned, after it ran (one
`ReadableSpan` per task handed to the batch processor; no tracer, no context
switch per task).  A task's spans live in several processes (the enqueue in
one API process, the hand-out in another, the ack in a third, a push process,
the watchdog) and each names its parent, so instead of writing span ids to the
task's row every process derives them from what it knows:

- the trace: the `traceparent`'s trace id, or without one a hash of the task
  id (a task enqueued without context starts its own trace);
- `taskforge.enqueue <queue>`: a hash of the task id, child of the span the
  `traceparent` names;
- `taskforge.dispatch <queue>` of attempt n: a hash of the task id and n,
  child of the enqueue span;
- `taskforge.ack` / `taskforge.nack` / `taskforge.lease_expired`: random ids,
  children of that attempt's dispatch span.

Sampling (`OTEL_TRACES_SAMPLER`, default parentbased_always_on) is decided per
task as for its enqueue span; the standard samplers decide from the parent's
flag and the trace id alone, so every process decides the same for one task
and its spans are exported all or none.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from django.db import transaction

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext


def _configured(env: Mapping[str, str]) -> bool:
    """Whether the OTEL_* variables ask for spans over OTLP."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(
        env.get(name, "").strip()
        for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    )


# The one switch: nothing below the context part runs while it is False.
ENABLED: bool = _configured(os.environ)

DEFAULT_SERVICE_NAME = "taskforge"
SYSTEM = "taskforge"

# -- context (always on) --

# version-traceid-parentid-flags, lowercase hex (W3C Trace Context, level 1).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZEROS = re.compile(r"0+")
# W3C: at most 32 list members; 512 characters is what every vendor must pass on.
MAX_TRACESTATE_CHARS = 512
MAX_TRACESTATE_MEMBERS = 32
_TRACESTATE_CHARS = re.compile(r"[\x20-\x7e]*")


def context_of(traceparent: object, tracestate: object) -> tuple[str | None, str | None]:
    """The `(traceparent, tracestate)` a task keeps from what an enqueue carried.

    A `traceparent` that is not a string in the W3C form (version `ff`, an
    all-zero trace or parent id, uppercase hex, a version 00 with more after
    it) gives `(None, None)`: ignored with its `tracestate`.  A later version's
    value keeps its first four fields.  A `tracestate` that is not a plausible
    list (over 512 characters or 32 members, a character outside printable
    ASCII, a member without `=`) is dropped alone.
    """
    if type(traceparent) is not str:
        return None, None
    value = traceparent.strip(" \t")
    match = _TRACEPARENT.match(value)
    if match is None:
        return None, None
    version, trace_id, span_id, _ = match.groups()
    if version == "ff" or _ZEROS.fullmatch(trace_id) or _ZEROS.fullmatch(span_id):
        return None, None
    if len(value) > 55 and (version == "00" or value[55] != "-"):
        return None, None
    return value[:55], _tracestate(tracestate)


def _tracestate(value: object) -> str | None:
    if type(value) is not str:
        return None
    value = value.strip(" \t")
    if not value or len(value) > MAX_TRACESTATE_CHARS or not _TRACESTATE_CHARS.fullmatch(value):
        return None
    members = [member.strip(" \t") for member in value.split(",")]
    members = [member for member in members if member]
    if len(members) > MAX_TRACESTATE_MEMBERS or any(m.find("=") <= 0 for m in members):
        return None
    return ",".join(members)


def from_headers(meta: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """`context_of` the request's `traceparent` and `tracestate` headers (a WSGI environ)."""
    traceparent = meta.get("HTTP_TRACEPARENT")
    if traceparent is None:
        return None, None
    return context_of(traceparent, meta.get("HTTP_TRACESTATE"))


class Traced(Protocol):
    """What the spans read of a task (a `tasks.models.Task` as a statement returned it)."""

    pk: Any
    traceparent: str | None
    attempts: int

    @property
    def queue(self) -> Any: ...  # its `.name`


def _digest(task_id: Any, label: bytes, size: int) -> int:
    raw = task_id.bytes if isinstance(task_id, uuid.UUID) else uuid.UUID(str(task_id)).bytes
    value = int.from_bytes(hashlib.blake2b(raw + label, digest_size=size).digest(), "big")
    return value or 1  # an all-zero id is invalid


def _trace_id(task_id: Any, traceparent: str | None) -> int:
    if traceparent is not None:
        return int(traceparent[3:35], 16)
    return _digest(task_id, b"trace", 16)


def _enqueue_span_id(task_id: Any) -> int:
    return _digest(task_id, b"enqueue", 8)


def _dispatch_span_id(task_id: Any, attempt: int) -> int:
    return _digest(task_id, b"dispatch" + attempt.to_bytes(4, "big"), 8)


def push_context(
    task_id: Any, traceparent: str | None, tracestate: str | None, attempt: int
) -> tuple[str | None, str | None]:
    """The `traceparent` and `tracestate` headers of a push request for this attempt.

    Exporting: the task's trace, whose parent is TaskForge's dispatch span of
    the attempt, with the task's sampling decision.  Not exporting: the
    enqueue's own values (no TaskForge span exists to name), None without them.
    """
    if not ENABLED:
        return traceparent, tracestate
    trace_id = _trace_id(task_id, traceparent)
    sampled = _exporter().sampled(trace_id, _parent_of(traceparent))
    span_id = _dispatch_span_id(task_id, attempt)
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}", tracestate


def scheduled(queue: str, schedule: str) -> str:
    """A `traceparent` for the task a schedule fires now: a trace of its own.

    Exporting, its parent is a `taskforge.schedule <queue>` span (the trace's
    root), exported when sampled; otherwise a parent no process exports.
    """
    trace_id = int.from_bytes(secrets.token_bytes(16), "big") or 1
    span_id = int.from_bytes(secrets.token_bytes(8), "big") or 1
    sampled = True
    if ENABLED:
        exporter = _exporter()
        sampled = exporter.sampled(trace_id, None)
        if sampled:
            now = time.time_ns()
            attributes = {
                "messaging.system": SYSTEM,
                "messaging.destination.name": queue,
                "taskforge.schedule": schedule,
            }
            exporter.emit(
                [
                    exporter.span(
                        f"taskforge.schedule {queue}", trace_id, span_id, None, attributes, now, now
                    )
                ]
            )
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def after_commit(record: Callable[..., None], tasks: Sequence[Traced], start_ns: int,
                 **options: Any) -> None:  # fmt: skip
    """`record(tasks, start_ns, <commit time>, **options)` once the caller's transaction
    commits (at once in autocommit): the spans of moves that stood.  Nothing while not
    exporting."""
    if not ENABLED:
        return
    transaction.on_commit(lambda: record(tasks, start_ns, time.time_ns(), **options))


def now_ns() -> int:
    """The time a span starts or ends (0 while not exporting: the call sites need none)."""
    return time.time_ns() if ENABLED else 0


# -- spans (ENABLED only) --


def enqueued(tasks: Sequence[Traced], start_ns: int, end_ns: int) -> None:
    """One `taskforge.enqueue <queue>` per new task, child of its enqueue's `traceparent`."""
    exporter = _exporter()
    spans = []
    for task in tasks:
        parent = _parent_of(task.traceparent)
        trace_id = _trace_id(task.pk, task.traceparent)
        if not exporter.sampled(trace_id, parent):
            continue
        queue = task.queue.name
        spans.append(
            exporter.span(
                f"taskforge.enqueue {queue}",
                trace_id,
                _enqueue_span_id(task.pk),
                parent,
                {
                    "messaging.system": SYSTEM,
                    "messaging.destination.name": queue,
                    "messaging.message.id": str(task.pk),
                    "messaging.operation.type": "create",
                },
                start_ns,
                end_ns,
                kind="producer",
            )
        )
    exporter.emit(spans)


def dispatched(tasks: Sequence[Traced], start_ns: int, end_ns: int) -> None:
    """One `taskforge.dispatch <queue>` per task a claim handed out (this attempt)."""
    exporter = _exporter()
    exporter.emit(
        [
            span
            for task in tasks
            if (span := exporter.child(task, "dispatch", start_ns, end_ns)) is not None
        ]
    )


@dataclass(frozen=True, slots=True)
class Push:
    """One push request as its dispatch span shows it."""

    task_id: Any
    queue: str
    traceparent: str | None
    attempt: int
    start_ns: int
    end_ns: int
    error: str | None = None


def pushed(pushes: Iterable[Push]) -> None:
    """One `taskforge.dispatch <queue>` per push request, from hand-out to answer."""
    exporter = _exporter()
    spans = []
    for push in pushes:
        parent = _parent_of(push.traceparent)
        trace_id = _trace_id(push.task_id, push.traceparent)
        if not exporter.sampled(trace_id, parent):
            continue
        spans.append(
            exporter.span(
                f"taskforge.dispatch {push.queue}",
                trace_id,
                _dispatch_span_id(push.task_id, push.attempt),
                exporter.local(trace_id, _enqueue_span_id(push.task_id)),
                {
                    "messaging.system": SYSTEM,
                    "messaging.destination.name": push.queue,
                    "messaging.message.id": str(push.task_id),
                    "messaging.operation.type": "send",
                    "taskforge.attempt": push.attempt,
                },
                push.start_ns,
                push.end_ns,
                kind="client",
                error=push.error,
            )
        )
    exporter.emit(spans)


# The outcome spans' names (API.md).
ACK = "ack"
NACK = "nack"
LEASE_EXPIRED = "lease_expired"


def settled(
    tasks: Sequence[Traced], start_ns: int, end_ns: int, *, outcome: str, error: str | None = None
) -> None:
    """One `taskforge.<outcome>` per task, child of its attempt's dispatch span."""
    exporter = _exporter()
    exporter.emit(
        [
            span
            for task in tasks
            if (span := exporter.child(task, outcome, start_ns, end_ns, error=error)) is not None
        ]
    )


def _parent_of(traceparent: str | None) -> SpanContext | None:
    if traceparent is None:
        return None
    from opentelemetry.trace import SpanContext, TraceFlags

    return SpanContext(
        int(traceparent[3:35], 16),
        int(traceparent[36:52], 16),
        is_remote=True,
        trace_flags=TraceFlags(int(traceparent[53:55], 16) & 1),
    )


_ERROR_CHARS = 500


class _Exporter:
    """This process's span pipeline: the SDK's provider, sampler and batch processor."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanKind, TraceFlags
        from opentelemetry.trace.status import Status, StatusCode

        self.pid = os.getpid()
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default name.
        self.resource = Resource.create({"service.name": DEFAULT_SERVICE_NAME})
        # The provider reads OTEL_TRACES_SAMPLER(_ARG) and flushes at exit.
        self.provider = TracerProvider(resource=self.resource)
        self.processor = BatchSpanProcessor(OTLPSpanExporter())
        self.provider.add_span_processor(self.processor)
        self.sampler = self.provider.sampler
        self.default_sampler = (
            self.sampler.get_description() == ParentBased(ALWAYS_ON).get_description()  # type: ignore[no-untyped-call]
        )
        self.scope = InstrumentationScope("taskforge")
        self.kinds = {
            "internal": SpanKind.INTERNAL,
            "producer": SpanKind.PRODUCER,
            "client": SpanKind.CLIENT,
        }
        self.flags = TraceFlags(TraceFlags.SAMPLED)
        self.status_class, self.error_code = Status, StatusCode.ERROR

    def sampled(self, trace_id: int, parent: SpanContext | None) -> bool:
        """The task's decision, as for its enqueue span (the module's docstring)."""
        if self.default_sampler:
            return parent is None or parent.trace_flags.sampled
        from opentelemetry import trace

        context = None
        if parent is not None:
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        result = self.sampler.should_sample(context, trace_id, "taskforge.enqueue")
        return bool(result.decision.is_sampled())  # type: ignore[no-untyped-call]

    def local(self, trace_id: int, span_id: int) -> SpanContext:
        from opentelemetry.trace import SpanContext

        return SpanContext(trace_id, span_id, is_remote=False, trace_flags=self.flags)

    def span(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        parent: SpanContext | None,
        attributes: dict[str, Any],
        start_ns: int,
        end_ns: int,
        *,
        kind: str = "internal",
        error: str | None = None,
    ) -> ReadableSpan:
        from opentelemetry.sdk.trace import ReadableSpan

        extra: dict[str, Any] = {}
        if error is not None:
            extra["status"] = self.status_class(self.error_code, error[:_ERROR_CHARS])
        return ReadableSpan(
            name=name,
            context=self.local(trace_id, span_id),
            parent=parent,
            resource=self.resource,
            attributes=attributes,
            kind=self.kinds[kind],
            instrumentation_scope=self.scope,
            start_time=start_ns,
            end_time=end_ns,
            **extra,
        )

    def child(
        self, task: Traced, what: str, start_ns: int, end_ns: int, *, error: str | None = None
    ) -> ReadableSpan | None:
        """The attempt's dispatch span (`what` "dispatch", a hand-out), or an outcome span."""
        trace_id = _trace_id(task.pk, task.traceparent)
        if not self.sampled(trace_id, _parent_of(task.traceparent)):
            return None
        queue = task.queue.name
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": queue,
            "messaging.message.id": str(task.pk),
            "taskforge.attempt": task.attempts,
        }
        if what == "dispatch":
            attributes["messaging.operation.type"] = "receive"
            span_id = _dispatch_span_id(task.pk, task.attempts)
            parent = self.local(trace_id, _enqueue_span_id(task.pk))
            name = f"taskforge.dispatch {queue}"
        else:
            attributes["messaging.operation.type"] = "settle"
            span_id = random.getrandbits(64) or 1  # nosec B311 - an id, not a secret
            parent = self.local(trace_id, _dispatch_span_id(task.pk, task.attempts))
            name = f"taskforge.{what}"
        return self.span(name, trace_id, span_id, parent, attributes, start_ns, end_ns, error=error)

    def emit(self, spans: Sequence[ReadableSpan]) -> None:
        on_end = self.processor.on_end
        for span in spans:
            on_end(span)

    def flush(self, timeout_millis: int = 5000) -> bool:
        return bool(self.processor.force_flush(timeout_millis))


_state: _Exporter | None = None
_state_lock = threading.Lock()


def _exporter() -> _Exporter:
    """This process's pipeline, made on first use (a forked process makes its own)."""
    global _state
    state = _state
    if state is not None and state.pid == os.getpid():
        return state
    with _state_lock:
        if _state is None or _state.pid != os.getpid():
            _state = _Exporter()
        return _state


def flush(timeout_millis: int = 5000) -> bool:
    """Export the spans this process holds now (a loop's shutdown); True when done."""
    if not ENABLED or _state is None:
        return True
    return _exporter().flush(timeout_millis)
