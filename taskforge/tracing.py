"""Tracing (API.md "Tracing (v1.2)"): W3C Trace Context kept per task, spans over OTLP.

Two parts, the first always on, the second only when configured:

- **Context.** An enqueue's `traceparent` and `tracestate` (its headers, or a
  batch item's own fields) are checked by `context_of` and kept on the task
  (`Task.traceparent`, `Task.tracestate`): a malformed `traceparent` is dropped
  together with its `tracestate`, never refused.  A claim hands them back as
  they came; a push request carries `push_context`'s (the task's trace, whose
  parent is the attempt's dispatch span); a schedule's task starts a trace of
  its own (`scheduled`).
- **Spans.** With `OTEL_EXPORTER_OTLP_ENDPOINT` or `..._TRACES_ENDPOINT` set
  (and neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`), every
  process exports its spans with the OpenTelemetry SDK's resource, sampler and
  OTLP/HTTP exporter, which read the other standard variables themselves.
  `ENABLED` is read once, at import; each call site checks it first, so with
  the variables unset the SDK is never imported and no connection is opened.

Spans are made from the rows a statement returned, after it ran: the request
thread hands the batch's tasks over in one step, and a thread of the process
(`_Pipeline`) writes a span per task straight into an OTLP request
(`taskforge.lib.otlp`; the SDK's span objects and encoder cost too much per
task: `taskforge.lib.internals`).  A task's spans live in several processes
(enqueue, hand-out, ack, a push process, the watchdog) and each names its
parent, so every process derives the span ids from what it knows:

- the trace: the `traceparent`'s trace id, or without one a hash of the task
  id (a task enqueued without context starts its own trace);
- `taskforge.enqueue <queue>`: a hash of the task id, child of the span the
  `traceparent` names;
- `taskforge.dispatch <queue>` of attempt n: a hash of the task id, n and the
  first hand-out's time (a replayed task counts from 1 again), child of the
  enqueue span;
- `taskforge.ack` / `taskforge.nack` / `taskforge.lease_expired`: random ids,
  children of that attempt's dispatch span.

Sampling (`OTEL_TRACES_SAMPLER`, default parentbased_always_on) is decided per
task as for its enqueue span; the standard samplers decide from the parent's
flag and the trace id alone, so every process decides the same for one task
and its spans are exported all or none.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import random
import re
import secrets
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.db import transaction

from taskforge.lib import internals, otlp

logger = logging.getLogger(__name__)


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
    first_claimed_at: Any  # a datetime, or None before the first hand-out

    queue: Any  # its `.name`


def _raw(task_id: Any) -> bytes:
    """A task id's 16 bytes, what its span ids are derived from."""
    return task_id.bytes if isinstance(task_id, uuid.UUID) else uuid.UUID(str(task_id)).bytes


def _digest(raw: bytes, label: bytes, size: int) -> bytes:
    value = hashlib.blake2b(raw + label, digest_size=size).digest()
    return value if any(value) else b"\x01".rjust(size, b"\x00")  # all zeros is invalid


_ids = random.Random()  # nosec B311 - outcome spans' ids: nothing names them, nothing guesses them


def _random_id() -> bytes:
    return (_ids.getrandbits(64) or 1).to_bytes(8, "big")  # nosec B311 - an id, not a secret


def _trace_of(raw: bytes, traceparent: str | None) -> bytes:
    if traceparent is not None:
        return bytes.fromhex(traceparent[3:35])
    return _digest(raw, b"trace", 16)


def _enqueue_span(raw: bytes) -> bytes:
    return _digest(raw, b"enqueue", 8)


def _dispatch_span(raw: bytes, attempt: int, since: Any) -> bytes:
    """Attempt n's dispatch span; `since` (the first hand-out's time) tells a replayed
    task's attempts, whose count starts again, from its first life's."""
    stamp = b"" if since is None else struct.pack("<d", since.timestamp())
    return _digest(raw, b"dispatch" + attempt.to_bytes(4, "big") + stamp, 8)


def push_context(task: Traced, tracestate: str | None) -> tuple[str | None, str | None]:
    """The `traceparent` and `tracestate` headers of a push request for this attempt.

    Exporting: the task's trace, whose parent is TaskForge's dispatch span of
    the attempt, with the task's sampling decision.  Not exporting: the
    enqueue's own values (no TaskForge span exists to name), None without them.
    """
    traceparent = task.traceparent
    if not ENABLED:
        return traceparent, tracestate
    raw = _raw(task.pk)
    trace_id = _trace_of(raw, traceparent)
    sampled = _pipeline().sampled(trace_id, traceparent)
    span_id = _dispatch_span(raw, task.attempts, task.first_claimed_at)
    return f"00-{trace_id.hex()}-{span_id.hex()}-{'01' if sampled else '00'}", tracestate


def scheduled(queue: str, schedule: str) -> str:
    """A `traceparent` for the task a schedule fires now: a trace of its own.

    Exporting, its parent is a `taskforge.schedule <queue>` span (the trace's
    root), exported when sampled; otherwise a parent no process exports.
    """
    trace_id, span_id = secrets.token_bytes(16), secrets.token_bytes(8)
    sampled = True
    if ENABLED:
        pipeline = _pipeline()
        sampled = pipeline.sampled(trace_id, None)
        if sampled:
            now = time.time_ns()
            pipeline.add(_schedule_spans, [(trace_id, span_id, queue, schedule)], now, now, {})
    return f"00-{trace_id.hex()}-{span_id.hex()}-{'01' if sampled else '00'}"


def after_commit(
    record: Callable[..., None], tasks: Sequence[Any], start_ns: int, **options: Any
) -> None:
    """`record(tasks, start_ns, <commit time>, **options)` once the caller's transaction
    commits (at once in autocommit): the spans of moves that stood.  Nothing while not
    exporting."""
    if not ENABLED:
        return
    transaction.on_commit(lambda: record(tasks, start_ns, time.time_ns(), **options))


def now_ns() -> int:
    """The time a span starts or ends (0 while not exporting: the call sites need none)."""
    return time.time_ns() if ENABLED else 0


# -- spans (ENABLED only): each call hands its tasks over as one record, in O(1) --


def enqueued(tasks: Sequence[Traced], start_ns: int, end_ns: int) -> None:
    """One `taskforge.enqueue <queue>` per new task, child of its enqueue's `traceparent`."""
    _pipeline().add(_task_spans, tasks, start_ns, end_ns, {"stage": "enqueue"})


def dispatched(tasks: Sequence[Traced], start_ns: int, end_ns: int) -> None:
    """One `taskforge.dispatch <queue>` per task a claim handed out (this attempt)."""
    _pipeline().add(_task_spans, tasks, start_ns, end_ns, {"stage": "dispatch"})


# The outcome spans' names (API.md).
ACK = "ack"
NACK = "nack"
LEASE_EXPIRED = "lease_expired"


def settled(
    tasks: Sequence[Traced], start_ns: int, end_ns: int, *, outcome: str, error: str | None = None
) -> None:
    """One `taskforge.<outcome>` per task, child of its attempt's dispatch span."""
    _pipeline().add(_task_spans, tasks, start_ns, end_ns, {"stage": outcome, "error": error})


@dataclass(frozen=True, slots=True)
class Push:
    """One push request as its dispatch span shows it (`sent`: the `traceparent` header
    it carried, `push_context`'s, which names the span)."""

    task_id: Any
    queue: str
    sent: str | None
    attempt: int
    start_ns: int
    end_ns: int
    error: str | None = None


def pushed(pushes: Iterable[Push]) -> None:
    """One `taskforge.dispatch <queue>` per push request, from hand-out to answer."""
    _pipeline().add(_push_spans, list(pushes), 0, 0, {})


_ERROR_CHARS = 500
# Each kind of span: its name (followed by the queue's, or not), kind and operation type.
_STAGES = {
    "enqueue": ("taskforge.enqueue", True, otlp.PRODUCER, "create"),
    "dispatch": ("taskforge.dispatch", True, otlp.INTERNAL, "receive"),
    "push": ("taskforge.dispatch", True, otlp.CLIENT, "send"),
    ACK: ("taskforge.ack", False, otlp.INTERNAL, "settle"),
    NACK: ("taskforge.nack", False, otlp.INTERNAL, "settle"),
    LEASE_EXPIRED: ("taskforge.lease_expired", False, otlp.INTERNAL, "settle"),
    "schedule": ("taskforge.schedule", True, otlp.INTERNAL, "create"),
}


def _task_spans(
    p: _Pipeline,
    tasks: Sequence[Traced],
    start: int,
    end: int,
    *,
    stage: str,
    error: str | None = None,
) -> list[bytes]:
    """The spans of one stage (the enqueue, a hand-out, an outcome) of these tasks."""
    spans = []
    error = None if error is None else error[:_ERROR_CHARS]
    for task in tasks:
        traceparent = task.traceparent
        attempt: int | None = task.attempts
        raw = _raw(task.pk)
        trace_id = _trace_of(raw, traceparent)
        if not p.sampled(trace_id, traceparent):
            continue
        remote = False
        if stage == "enqueue":
            span_id, attempt = _enqueue_span(raw), None
            parent = None if traceparent is None else bytes.fromhex(traceparent[36:52])
            remote = parent is not None
        elif stage == "dispatch":
            span_id = _dispatch_span(raw, task.attempts, task.first_claimed_at)
            parent = _enqueue_span(raw)
        else:
            span_id = _random_id()
            parent = _dispatch_span(raw, task.attempts, task.first_claimed_at)
        ids = (trace_id, span_id, parent, start, end)
        spans.append(otlp.span(p.head(stage, task.queue.name), *ids, message_id=str(task.pk),
                               attempt=attempt, error=error, remote_parent=remote))  # fmt: skip
    return spans


def _push_spans(p: _Pipeline, pushes: Sequence[Push], start: int, end: int) -> list[bytes]:
    spans = []
    for push in pushes:
        if push.sent is None or not int(push.sent[53:55], 16) & 1:
            continue  # sent while not exporting, or not sampled
        trace_id, span_id = bytes.fromhex(push.sent[3:35]), bytes.fromhex(push.sent[36:52])
        error = None if push.error is None else push.error[:_ERROR_CHARS]
        ids = (trace_id, span_id, _enqueue_span(_raw(push.task_id)), push.start_ns, push.end_ns)
        spans.append(otlp.span(p.head("push", push.queue), *ids, message_id=str(push.task_id),
                               attempt=push.attempt, error=error))  # fmt: skip
    return spans


def _schedule_spans(
    p: _Pipeline, items: Sequence[tuple[bytes, bytes, str, str]], start: int, end: int
) -> list[bytes]:
    return [
        otlp.span(
            p.head("schedule", queue),
            trace_id,
            span_id,
            None,
            start,
            end,
            extra=otlp.span_attribute("taskforge.schedule", schedule),
        )
        for trace_id, span_id, queue, schedule in items
    ]


class _Pipeline:
    """This process's spans, made from queued records and sent by a thread of its own with
    the SDK's resource, sampler and OTLP/HTTP exporter, as the SDK's batch processor reads
    OTEL_BSP_*: every SCHEDULE_DELAY ms or once MAX_EXPORT_BATCH_SIZE spans wait; more
    than MAX_QUEUE_SIZE waiting are dropped."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

        self.pid = os.getpid()
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default name.
        resource = Resource.create({"service.name": DEFAULT_SERVICE_NAME})
        self.resource = otlp.resource_of(resource.attributes)
        self.scope = otlp.scope_of("taskforge")
        self.sampler = TracerProvider(resource=resource, shutdown_on_exit=False).sampler
        self.default_sampler = (
            self.sampler.get_description() == ParentBased(ALWAYS_ON).get_description()  # type: ignore[no-untyped-call]
        )
        self.exporter = OTLPSpanExporter()
        self.delay = _env_int("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.max_queue = _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self.batch = max(1, _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512))
        self.dropped = 0
        self._heads: dict[tuple[str, str], otlp.Head] = {}
        self._records: list[tuple[Any, ...]] = []
        self._count = 0
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="taskforge-spans", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def add(
        self,
        build: Callable[..., list[bytes]],
        items: Sequence[Any],
        start_ns: int,
        end_ns: int,
        options: dict[str, Any],
    ) -> None:
        """Queue the spans of `items` (made later by `build`); dropped when full."""
        count = len(items)
        with self._cond:
            if self._count + count > self.max_queue:
                self.dropped += count
                return
            self._records.append((build, items, start_ns, end_ns, options))
            self._count += count
            if self._count >= self.batch:
                self._cond.notify()

    def sampled(self, trace_id: bytes, traceparent: str | None) -> bool:
        """The task's decision, as for its enqueue span (the module's docstring)."""
        if self.default_sampler:
            return traceparent is None or bool(int(traceparent[53:55], 16) & 1)
        from opentelemetry import trace

        context = None
        if traceparent is not None:
            parent = trace.SpanContext(
                int(traceparent[3:35], 16),
                int(traceparent[36:52], 16),
                is_remote=True,
                trace_flags=trace.TraceFlags(int(traceparent[53:55], 16) & 1),
            )
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        number = int.from_bytes(trace_id, "big")
        result = self.sampler.should_sample(context, number, "taskforge.enqueue")
        return bool(result.decision.is_sampled())  # type: ignore[no-untyped-call]

    def head(self, stage: str, queue: str) -> otlp.Head:
        """The name, kind and fixed attributes of a stage's spans in a queue, written once."""
        head = self._heads.get((stage, queue))
        if head is None:
            name, with_queue, kind, operation = _STAGES[stage]
            attributes = {
                "messaging.system": SYSTEM,
                "messaging.destination.name": queue,
                "messaging.operation.type": operation,
            }
            head = otlp.Head.of(f"{name} {queue}" if with_queue else name, kind, attributes)
            self._heads[(stage, queue)] = head
        return head

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._closing and self._count < self.batch:
                    self._cond.wait(self.delay)
                records, self._records, self._count = self._records, [], 0
                closing = self._closing
            if records:
                self._export(records)
            if closing:
                return

    def _export(self, records: list[tuple[Any, ...]]) -> None:
        try:
            spans: list[bytes] = []
            for build, items, start_ns, end_ns, options in records:
                spans += build(self, items, start_ns, end_ns, **options)
            for at in range(0, len(spans), self.batch):
                data = otlp.request(self.resource, self.scope, spans[at : at + self.batch])
                internals.otlp_export(self.exporter, data)
        except Exception:
            logger.warning("tracing.export_failed", exc_info=True)

    def close(self) -> None:
        """Send what is queued (at exit), then stop the thread: for at most a second, so a
        loop still exits in time (API.md) when the collector does not answer."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout=min(1.0, _env_int("OTEL_BSP_EXPORT_TIMEOUT", 30000) / 1000))


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "").strip() or default)
    except ValueError:
        return default


_state: _Pipeline | None = None
_state_lock = threading.Lock()


def _pipeline() -> _Pipeline:
    """This process's pipeline, made on first use (a forked process makes its own)."""
    global _state
    state = _state
    if state is not None and state.pid == os.getpid():
        return state
    with _state_lock:
        if _state is None or _state.pid != os.getpid():
            _state = _Pipeline()
        return _state
