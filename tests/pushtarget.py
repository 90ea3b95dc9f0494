"""A push target the tests script: a real local HTTP server answering as it is told.

`Target` runs a threading HTTP/1.1 server on a free loopback port and keeps
every request it got (`requests`): path, headers, body, arrival time.  What it
answers comes from `script(request) -> Answer`, settable at any time:

- `Answer(status, body, headers)`, optionally after `delay` seconds;
- `Answer(..., trickle=s)`: the status line and headers at once, then the body
  one byte every `s` seconds (a slow body);
- `Answer(hang_up=True)`: close the connection without answering;
- `Answer(hang=s)`: say nothing for `s` seconds, then close.

It also counts how many requests it was answering at once (`max_concurrent`).
No TaskForge imports: it is what a user's receiver is.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() when the body had arrived
    method: str = "POST"

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    trickle: float = 0.0
    hang_up: bool = False
    hang: float = 0.0


def ok(request: Request) -> Answer:
    return Answer(200, b'{"ok": true}', {"Content-Type": "application/json"})


class Target:
    def __init__(self, script: Callable[[Request], Answer] = ok) -> None:
        self.script = script
        self.requests: list[Request] = []
        self.max_concurrent = 0
        self._concurrent = 0
        self._lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                request = Request(
                    self.path, dict(self.headers.items()), body, time.time(), self.command
                )
                with target._lock:
                    target.requests.append(request)
                    target._concurrent += 1
                    target.max_concurrent = max(target.max_concurrent, target._concurrent)
                try:
                    self._answer(target.script(request))
                finally:
                    with target._lock:
                        target._concurrent -= 1

            # Every method a Cloud Tasks task may use is recorded the same way.
            do_GET = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_POST

            def _answer(self, answer: Answer) -> None:
                if answer.hang_up or answer.hang:
                    time.sleep(answer.hang)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                time.sleep(answer.delay)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                if answer.trickle:
                    for byte in answer.body:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(answer.trickle)
                else:
                    self.wfile.write(answer.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 1024  # the listen backlog: hundreds connect at once

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
