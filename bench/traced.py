"""The bench's `tracing` phase helpers: a local OTLP/HTTP receiver in its own process.

`make bench` measures the single path and the batched path end to end with spans
exported (OTEL_EXPORTER_OTLP_ENDPOINT naming this receiver) against the same
service with tracing off, in the same run (API.md "Tracing (v1.2)": >= 0.85x).
The receiver answers every `POST /v1/traces` at once and counts the spans it
decoded (opentelemetry-proto), so the report says how many arrived.
"""

from __future__ import annotations

import gzip
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The exporting service's settings: the SDK's batch processor holds up to this many
# spans (its default, 2048, drops spans under the batched path's load) and exports
# every 200 ms or whenever 512 are waiting.
EXPORT_ENV = {
    "OTEL_BSP_MAX_QUEUE_SIZE": "65536",
    "OTEL_BSP_SCHEDULE_DELAY": "200",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "512",
}


def serve_receiver(port_out: Any, spans: Any) -> None:
    """Process target: serve OTLP/HTTP on a free port (sent on `port_out`), counting
    decoded spans into the shared integer `spans`, until killed."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    answer = ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            count = sum(
                len(scope.spans)
                for resource in request.resource_spans
                for scope in resource.scope_spans
            )
            with spans.get_lock():
                spans.value += count
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port_out.send(server.server_address[1])
    server.serve_forever()
