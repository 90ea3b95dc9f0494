"""OTLP trace requests written straight from span rows (protobuf wire format by hand).

`taskforge.tracing` exports a span per task for each enqueue, hand-out and
outcome: thousands a second on the batched path.  The OpenTelemetry SDK's own
route (a `ReadableSpan` per span, then its encoder building protobuf message
objects field by field) cost ~200 us of CPU per span on the loaded development
VM (bench/run.py's `tracing` rows: the batched path fell to ~0.7x); making the
span and writing the same `ExportTraceServiceRequest` bytes here costs ~5 us
there (docs/operations.md, Performance).  What
is written is checked by decoding it with `opentelemetry-proto`
(tests/test_tracing.py's receiver and tests/test_tracing_context.py).

Only what TaskForge's spans use is written: ids, parent, name, kind, times,
string and integer attributes, status, flags; the resource's string, integer
and boolean attributes; one instrumentation scope.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Span kinds (opentelemetry.proto.trace.v1.Span.SpanKind).
INTERNAL = 1
SERVER = 2
CLIENT = 3
PRODUCER = 4
CONSUMER = 5

# Status codes (opentelemetry.proto.trace.v1.Status.StatusCode).
STATUS_ERROR = 2

# Span.flags: the W3C trace flags in the low byte, and whether the parent is remote.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200

_PACK_Q = struct.Struct("<Q").pack
_PACK_I = struct.Struct("<I").pack


def varint(value: int) -> bytes:
    """An unsigned protobuf varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _any_value(value: str | bool | int) -> bytes:
    if isinstance(value, bool):
        return varint(2 << 3) + varint(int(value))
    if isinstance(value, int):
        return varint(3 << 3) + varint(value & 0xFFFFFFFFFFFFFFFF)
    return field(1, str(value).encode())


def attribute(key: str, value: str | bool | int) -> bytes:
    """One KeyValue as a Span's (or a Resource's) attributes field (number 9 / 1)."""
    return field(1, key.encode()) + field(2, _any_value(value))


def span_attribute(key: str, value: str | bool | int) -> bytes:
    return field(9, attribute(key, value))


@dataclass(frozen=True, slots=True)
class Head:
    """What spans of one name share, written once: name, kind and fixed attributes."""

    data: bytes

    @classmethod
    def of(cls, name: str, kind: int, attributes: Mapping[str, str | int]) -> Head:
        parts = [field(5, name.encode()), varint(6 << 3) + varint(kind)]
        parts += [span_attribute(key, value) for key, value in attributes.items()]
        return cls(b"".join(parts))


@functools.lru_cache(maxsize=256)
def _attempt(number: int) -> bytes:
    return span_attribute("taskforge.attempt", number)


# A task id attribute: the key and the length of a 36-character UUID, written once.
_MESSAGE_ID = span_attribute("messaging.message.id", "0" * 36)[:-36]


def span(
    head: Head,
    trace_id: bytes,
    span_id: bytes,
    parent_id: bytes | None,
    start_ns: int,
    end_ns: int,
    *,
    message_id: str | None = None,
    attempt: int | None = None,
    error: str | None = None,
    remote_parent: bool = False,
    extra: bytes = b"",
) -> bytes:
    """One Span message as a ScopeSpans' `spans` field (16- and 8-byte ids, sampled);
    `extra`: more attributes, each from `span_attribute`."""
    parts = [b"\x0a\x10", trace_id, b"\x12\x08", span_id]
    if parent_id is not None:
        parts += (b"\x22\x08", parent_id)
    parts += (head.data, b"\x39", _PACK_Q(start_ns), b"\x41", _PACK_Q(end_ns))
    if message_id is not None and len(message_id) == 36:
        parts += (_MESSAGE_ID, message_id.encode())
    elif message_id is not None:
        parts.append(span_attribute("messaging.message.id", message_id))
    if extra:
        parts.append(extra)
    if attempt is not None:
        parts.append(_attempt(attempt))
    if error is not None:
        parts.append(field(15, field(2, error.encode()) + varint(3 << 3) + varint(STATUS_ERROR)))
    flags = 0x01 | _HAS_IS_REMOTE | (_IS_REMOTE if remote_parent else 0)
    parts += (b"\x85\x01", _PACK_I(flags))
    body = b"".join(parts)
    return b"\x12" + varint(len(body)) + body


def request(resource: bytes, scope: bytes, spans: Iterable[bytes]) -> bytes:
    """An ExportTraceServiceRequest of one resource and one scope holding `spans`
    (each from `span`); `resource` and `scope` from `resource_of` and `scope_of`."""
    scope_spans = field(1, scope) + b"".join(spans)
    return field(1, field(1, resource) + field(2, scope_spans))


def resource_of(attributes: Mapping[str, object]) -> bytes:
    """A Resource message of the string, integer and boolean attributes."""
    return b"".join(
        field(1, attribute(key, value))
        for key, value in attributes.items()
        if isinstance(value, str | int | bool)
    )


def scope_of(name: str, version: str = "") -> bytes:
    """An InstrumentationScope message."""
    return field(1, name.encode()) + (field(2, version.encode()) if version else b"")
