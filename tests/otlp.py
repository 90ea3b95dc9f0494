"""An OTLP/HTTP trace receiver the tests run: what a collector is to TaskForge.

`Receiver` serves `POST /v1/traces` on a free loopback port, decodes each
`ExportTraceServiceRequest` (protobuf, gzip or not) with `opentelemetry-proto`
and keeps every span as a `Span`: names, ids in hex, parent, kind, status,
attributes and the `service.name` of the process that sent it.  `tree()` draws
one trace as text (docs/tracing-tree.txt is such a drawing).  No TaskForge
imports: it only sees what went over the wire.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_STATUS = {0: "unset", 1: "ok", 2: "error"}


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str
    status: str
    service: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(any_value: Any) -> Any:
    which = any_value.WhichOneof("value")
    if which is None:
        return None
    value = getattr(any_value, which)
    if which == "array_value":
        return [_value(v) for v in value.values]
    return value


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._keep(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL for OTEL_EXPORTER_OTLP_ENDPOINT (the exporter adds /v1/traces)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        Span(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex() or None,
                            kind=_KINDS.get(span.kind, str(span.kind)),
                            status=_STATUS.get(span.status.code, str(span.status.code)),
                            service=str(resource.get("service.name")),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._lock:
            self.spans.extend(spans)
            self.posts += 1

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def wait_for(
        self, trace_id: str, check: Callable[[list[Span]], bool], timeout: float = 20.0
    ) -> list[Span]:
        """The trace's spans once `check` holds for them (AssertionError at the deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.trace(trace_id)
            if check(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted(span.name for span in spans)
                raise AssertionError(f"trace {trace_id}: timed out with spans {names}")
            time.sleep(0.05)


def names(spans: list[Span]) -> list[str]:
    return sorted(span.name for span in spans)


def tree(spans: list[Span]) -> str:
    """One trace as an indented tree: each span under its parent, by start time."""
    by_parent: dict[str | None, list[Span]] = {}
    ids = {span.span_id for span in spans}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids else None
        by_parent.setdefault(parent, []).append(span)
    origin = min((span.start_ns for span in spans), default=0)
    lines: list[str] = []

    def draw(parent: str | None, depth: int) -> None:
        for span in sorted(by_parent.get(parent, []), key=lambda s: (s.start_ns, s.name)):
            start_ms = (span.start_ns - origin) / 1e6
            took_ms = (span.end_ns - span.start_ns) / 1e6
            attempt = span.attributes.get("taskforge.attempt")
            extra = f" attempt={attempt}" if attempt is not None else ""
            status = " ERROR" if span.status == "error" else ""
            lines.append(
                f"{'  ' * depth}{span.name} [{span.service}, {span.kind}]{extra}{status}"
                f"  +{start_ms:.1f} ms, {took_ms:.1f} ms"
            )
            draw(span.span_id, depth + 1)

    draw(None, 0)
    return "\n".join(lines)
