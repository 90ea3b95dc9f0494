"""The API's serving model: Django's WSGI handler behind granian's RSGI interface.

granian (Rust, tokio, hyper) owns the sockets: it accepts connections, reads
and parses request heads, keeps idle keep-alive connections, and closes a
connection whose head has not arrived within its header timeout.  None of that
costs a Python thread, so slow or idle clients cost no request capacity.

This bridge is the RSGI application.  On the event loop it:

- refuses a body larger than TASKFORGE_MAX_REQUEST_BYTES from its
  Content-Length before reading it, and counts a chunked body while reading it,
  so the memory of a refused body stays bounded (413 `payload_too_large`);
- reads the body within `body_timeout` seconds (a client trickling its body is
  answered 408 `request_timeout` and its connection closed);
- for a request that may wait (a long-polling claim, the dashboard's event
  stream) watches for the client hanging up and exposes it to the view as
  `environ["taskforge.disconnected"]` (see taskforge.api.peer);

and then runs Django's ordinary WSGI handler on a thread pool.  A waiting long
poll holds one pool thread (idle: no CPU, no database connection, ~100 KB);
the pool is sized for the fleet (TASKFORGE_WEB_THREADS).  Everything else in
the request (middleware, authentication, views, logging, metrics) is the same
Django code that `gunicorn taskforge.wsgi` serves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from io import BytesIO
from typing import Any, Protocol

from taskforge.api.responses import error_body

logger = logging.getLogger(__name__)

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# Paths whose requests may wait for a long time; only these pay for watching the
# client (an extra task on the event loop per request).
_WAITING_PATHS = ("/workers/claim", "/admin/dashboard/stream")


class _Headers(Protocol):
    def get(self, key: str, default: Any = None) -> Any: ...
    def items(self) -> list[tuple[str, str]]: ...


class _Scope(Protocol):
    proto: str
    http_version: str
    server: str
    client: str
    scheme: str
    method: str
    path: str
    query_string: str
    authority: str | None

    @property
    def headers(self) -> _Headers: ...


class _Transport(Protocol):
    async def send_bytes(self, data: bytes) -> None: ...


class _Protocol(Protocol):
    async def __call__(self) -> bytes: ...
    def __aiter__(self) -> Any: ...
    async def client_disconnect(self) -> None: ...
    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None: ...
    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> _Transport: ...


class BodyTooLarge(Exception):
    pass


def _error(status: int, code: str, message: str) -> tuple[int, list[tuple[str, str]], bytes]:
    body = json.dumps(error_body(code, message)).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    if status in (408, 413):
        headers.append(("connection", "close"))
    return status, headers, body


class DjangoBridge:
    """An RSGI application serving a WSGI application (Django's) on a thread pool."""

    def __init__(
        self,
        app: WSGIApp,
        *,
        threads: int,
        max_body: int,
        body_timeout: float,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.on_stop = on_stop
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="taskforge-api")
        self.loop: asyncio.AbstractEventLoop | None = None

    # RSGI hooks ---------------------------------------------------------------

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.on_stop is not None:
            self.on_stop()

    async def __rsgi__(self, scope: _Scope, protocol: _Protocol) -> None:
        if scope.proto != "http":  # websockets: not part of the API
            return
        loop = self.loop or asyncio.get_running_loop()
        refused = self._refuse_declared(scope)
        if refused is not None:
            protocol.response_bytes(*refused)
            return
        try:
            async with asyncio.timeout(self.body_timeout):
                body = await self._read(scope, protocol)
        except BodyTooLarge:
            protocol.response_bytes(*self._too_large())
            return
        except TimeoutError:
            protocol.response_bytes(
                *_error(
                    408,
                    "request_timeout",
                    f"The request body did not arrive within {self.body_timeout:g} s.",
                )
            )
            return
        environ = self._environ(scope, body)
        watcher: asyncio.Task[None] | None = None
        if scope.path in _WAITING_PATHS:
            gone = threading.Event()
            environ["taskforge.disconnected"] = gone.is_set
            watcher = loop.create_task(self._watch(protocol, gone))
        try:
            answer = await loop.run_in_executor(self.pool, self._call, environ)
            if isinstance(answer, tuple):
                protocol.response_bytes(*answer)
            else:
                await loop.run_in_executor(self.pool, self._stream, answer, protocol, loop)
        finally:
            if watcher is not None:
                watcher.cancel()

    # The event loop's side ----------------------------------------------------

    def _refuse_declared(self, scope: _Scope) -> tuple[int, list[tuple[str, str]], bytes] | None:
        length = scope.headers.get("content-length")
        if length is None:
            return None
        if not length.isdigit():
            return _error(400, "parse_error", "Content-Length is not a number.")
        if int(length) > self.max_body:
            return self._too_large()
        return None

    def _too_large(self) -> tuple[int, list[tuple[str, str]], bytes]:
        return _error(
            413, "payload_too_large", f"The request body is larger than {self.max_body} bytes."
        )

    async def _read(self, scope: _Scope, protocol: _Protocol) -> bytes:
        headers = scope.headers
        length = headers.get("content-length")
        if length is not None:  # checked against the limit already
            return await protocol() if length != "0" else b""
        if headers.get("transfer-encoding") is None and scope.http_version.startswith("1"):
            return b""  # HTTP/1: no length, not chunked, no body
        chunks: list[bytes] = []
        size = 0
        async for chunk in protocol:
            size += len(chunk)
            if size > self.max_body:
                raise BodyTooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    async def _watch(protocol: _Protocol, gone: threading.Event) -> None:
        await protocol.client_disconnect()
        gone.set()

    def _environ(self, scope: _Scope, body: bytes) -> dict[str, Any]:
        server_host, _, server_port = scope.server.rpartition(":")
        client_host, _, client_port = scope.client.rpartition(":")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": scope.method,
            "SCRIPT_NAME": "",
            # PEP 3333: the decoded path's bytes, as latin-1.
            "PATH_INFO": scope.path.encode("utf-8").decode("latin-1"),
            "QUERY_STRING": scope.query_string,
            "SERVER_NAME": server_host.strip("[]"),
            "SERVER_PORT": server_port,
            "SERVER_PROTOCOL": f"HTTP/{scope.http_version}",
            "REMOTE_ADDR": client_host.strip("[]"),
            "REMOTE_PORT": client_port,
            "CONTENT_LENGTH": str(len(body)) if body else "",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": scope.scheme,
            "wsgi.input": BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
        for name, value in scope.headers.items():
            if name == "content-length":
                continue
            if name == "content-type":
                environ["CONTENT_TYPE"] = value
                continue
            key = "HTTP_" + name.upper().replace("-", "_")
            if key in environ:
                environ[key] += "," + value
            else:
                environ[key] = value
        if scope.authority and "HTTP_HOST" not in environ:
            environ["HTTP_HOST"] = scope.authority
        return environ

    # The thread's side --------------------------------------------------------

    def _call(self, environ: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes] | Any:
        """Run the WSGI application; a whole answer, or the started stream to send."""
        started: list[Any] = []

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Any:
            started[:] = [status, headers]
            return _no_write

        result = self.app(environ, start_response)
        code = int(started[0].split(" ", 1)[0])  # "200 OK"
        if getattr(result, "streaming", False):
            return _Stream(code, started[1], result)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return code, started[1], body

    @staticmethod
    def _stream(stream: _Stream, protocol: _Protocol, loop: asyncio.AbstractEventLoop) -> None:
        """Send a streaming answer chunk by chunk, in the thread that made it.

        Django closes the request's database connections in the thread that
        closes the response, so the whole stream stays on one thread.
        """

        async def start() -> _Transport:
            return protocol.response_stream(stream.code, stream.headers)

        try:
            transport = asyncio.run_coroutine_threadsafe(start(), loop).result()
            for chunk in stream.body:
                if chunk:
                    asyncio.run_coroutine_threadsafe(transport.send_bytes(chunk), loop).result()
        except Exception as exc:  # the client went away mid-stream
            logger.debug("bridge.stream_ended", extra={"error": repr(exc)})
        finally:
            close = getattr(stream.body, "close", None)
            if close is not None:
                close()


class _Stream:
    __slots__ = ("body", "code", "headers")

    def __init__(self, code: int, headers: list[tuple[str, str]], body: Iterable[bytes]) -> None:
        self.code = code
        self.headers = headers
        self.body = body


def _no_write(data: bytes) -> None:
    raise NotImplementedError("TaskForge's views return their bodies; write() is not supported")
