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

and then runs Django's ordinary WSGI handler on a thread pool, whose thread
sends the answer (a call of the hot lane, `hot`, without WSGI's wrapping:
taskforge.api.lane).  A waiting long poll holds one pool thread (idle: no CPU, no
database connection, ~100 KB); the pool is sized for the fleet
(TASKFORGE_WEB_THREADS).  Everything else in the request (middleware,
authentication, views, logging, metrics) is the same Django code that
`gunicorn taskforge.wsgi` serves.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from io import BytesIO
from typing import Any, Protocol

from granian._granian import RSGIProtocolClosed

from taskforge.api.responses import error_body

logger = logging.getLogger(__name__)

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# An answer made whole: status, headers, body.
Answer = tuple[int, list[tuple[str, str]], bytes]

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
    # An awaitable, not always a coroutine: granian 2.8's is a future-like object.
    def send_bytes(self, data: bytes) -> Awaitable[None]: ...


class _Protocol(Protocol):
    async def __call__(self) -> bytes: ...
    def __aiter__(self) -> Any: ...
    async def client_disconnect(self) -> None: ...
    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None: ...
    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> _Transport: ...


# Header names (as granian gives them, lower case) -> their WSGI environ keys; ""
# for one the environ leaves out.  Names first seen are added, up to a bound.
# A name with "_" is left out (API.md, Security v1.2; as nginx and gunicorn do):
# in the environ it would take the dashed name's key, so `X_Forwarded_Proto`
# could stand in for `X-Forwarded-Proto`.
_ENVIRON_KEYS: dict[str, str] = {"content-length": "", "content-type": "CONTENT_TYPE"}
_ENVIRON_KEYS_MAX = 512


class BodyTooLarge(Exception):
    pass


# A job for the pool: the loop, its future for the answer, the function and its arguments.
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class _Pool:
    """The threads that run Django, handing each answer back to the event loop.

    What `loop.run_in_executor` on a ThreadPoolExecutor does, for a fraction
    of its CPU (measured with py-spy under `make bench`: the executor's
    concurrent Future, the asyncio Future chained to it and the executor's
    idle-thread semaphore were a tenth of a single-task request's API CPU).  A
    job is a plain tuple; its thread settles the loop's future with one
    `call_soon_threadsafe`.  Threads start as needed, up to `size`, and stay.

    The idle threads are a stack: a job goes to the thread that finished
    last, whose stack, caches and kept database connection (taskforge.api.lane's
    `Parking`) are warm, not round the whole pool in turn.  Each idle thread
    waits on a lock of its own, released to hand it a job.  With every thread
    busy, jobs wait in a queue for the first to finish.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._waiting: collections.deque[_Job] = collections.deque()
        self._threads = 0
        self._stopped = False

    def run(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """`fn(*args)` on a pool thread; its result (or exception) as a future of `loop`."""
        future = loop.create_future()
        job: _Job = (loop, future, fn, args)
        with self._lock:
            if self._idle:
                worker = self._idle.pop()
                worker.job = job
                worker.ready.release()
                return future
            if self._threads >= self.size:
                self._waiting.append(job)
                return future
            self._threads += 1
        threading.Thread(target=self._work, args=(job,), name="taskforge-api", daemon=True).start()
        return future

    def _work(self, job: _Job | None) -> None:
        me = _Worker()
        while job is not None:
            loop, future, fn, args = job
            settle: Callable[[asyncio.Future[Any], Any], None] = _settle
            try:
                outcome = fn(*args)
            except BaseException as exc:
                outcome, settle = exc, _settle_error
            # Idle (or on to a queued job) before the answer goes back, so the
            # caller's next job, sent as soon as it has the answer, finds this
            # thread on top of the stack.
            with self._lock:
                if self._waiting:
                    following: _Job | None = self._waiting.popleft()
                    idle = False
                else:
                    following = None
                    idle = not self._stopped
                    if idle:
                        self._idle.append(me)
            _call_soon(loop, settle, future, outcome)
            # Nothing of a request outlives it in an idle thread.
            del job, loop, future, fn, args, outcome
            if idle:
                me.ready.acquire()
                following, me.job = me.job, None
            job = following

    def shutdown(self) -> None:
        """Stop the threads once the jobs queued before have run."""
        with self._lock:
            self._stopped = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.job = None
            worker.ready.release()


class _Worker:
    """An idle pool thread's mailbox: its next job, and the lock it waits on."""

    __slots__ = ("job", "ready")

    def __init__(self) -> None:
        self.job: _Job | None = None
        self.ready = threading.Lock()
        self.ready.acquire()  # held: the thread blocks on it until handed a job


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop closed meanwhile (the process is stopping)
        pass


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if not future.cancelled():
        future.set_result(result)


def _settle_error(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.cancelled():
        future.set_exception(exc)


def _error(status: int, code: str, message: str) -> Answer:
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
        hot: Callable[[dict[str, Any]], Answer | None] | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.hot = hot
        self.on_stop = on_stop
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.pool = _Pool(threads)
        self.loop: asyncio.AbstractEventLoop | None = None
        # Requests reading their bodies, with their deadlines.  One timer sweeps
        # them (`_sweep`) instead of a timeout context per request: that was a
        # twentieth of a single-task request's API CPU (py-spy, `make bench`).
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweeping = False
        self._sweep_every = min(1.0, body_timeout / 4)

    # RSGI hooks ---------------------------------------------------------------

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pool.shutdown()
        if self.on_stop is not None:
            self.on_stop()

    async def __rsgi__(self, scope: _Scope, protocol: _Protocol) -> None:
        if scope.proto != "http":  # websockets: not part of the API
            return
        loop = self.loop or asyncio.get_running_loop()
        length: str | None = scope.headers.get("content-length")
        refused = self._refuse_declared(length)
        if refused is not None:
            protocol.response_bytes(*refused)
            return
        if self._bodiless(scope, length):
            body = b""
        else:
            task = asyncio.current_task()
            assert task is not None
            self._reading[task] = loop.time() + self.body_timeout
            if not self._sweeping:
                self._sweeping = True
                loop.call_later(self._sweep_every, self._sweep, loop)
            try:
                body = await self._read(length, protocol)
            except BodyTooLarge:
                protocol.response_bytes(*self._too_large())
                return
            except asyncio.CancelledError:
                if task not in self._expired:
                    raise
                self._expired.discard(task)
                task.uncancel()
                protocol.response_bytes(
                    *_error(
                        408,
                        "request_timeout",
                        f"The request body did not arrive within {self.body_timeout:g} s.",
                    )
                )
                return
            finally:
                del self._reading[task]
        environ = self._environ(scope, body)
        watcher: asyncio.Task[None] | None = None
        if scope.path in _WAITING_PATHS:
            gone = threading.Event()
            environ["taskforge.disconnected"] = gone.is_set
            watcher = loop.create_task(self._watch(protocol, gone))
        try:
            stream = await self.pool.run(loop, self._respond, environ, protocol)
            if stream is not None:
                await self.pool.run(loop, self._stream, stream, protocol, loop)
        finally:
            if watcher is not None:
                watcher.cancel()

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """End the body reads past their deadlines (answered 408 in `__rsgi__`)."""
        now = loop.time()
        for task, deadline in list(self._reading.items()):
            if deadline <= now and task not in self._expired:
                self._expired.add(task)
                task.cancel()
        if self._reading:
            loop.call_later(self._sweep_every, self._sweep, loop)
        else:
            self._sweeping = False

    # The event loop's side ----------------------------------------------------

    def _refuse_declared(self, length: str | None) -> Answer | None:
        """The answer refusing a request by its Content-Length, if it must be."""
        if length is None:
            return None
        if not length.isdigit():
            return _error(400, "parse_error", "Content-Length is not a number.")
        if int(length) > self.max_body:
            return self._too_large()
        return None

    def _too_large(self) -> Answer:
        return _error(
            413, "payload_too_large", f"The request body is larger than {self.max_body} bytes."
        )

    @staticmethod
    def _bodiless(scope: _Scope, length: str | None) -> bool:
        if length is not None:
            return length == "0"
        # HTTP/1: no length, not chunked, no body
        chunked: object = scope.headers.get("transfer-encoding")
        return chunked is None and scope.http_version.startswith("1")

    async def _read(self, length: str | None, protocol: _Protocol) -> bytes:
        if length is not None:  # checked against the limit already
            return await protocol()
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
            key = _ENVIRON_KEYS.get(name)
            if key is None:
                key = "" if "_" in name else "HTTP_" + name.upper().replace("-", "_")
                if len(_ENVIRON_KEYS) < _ENVIRON_KEYS_MAX:
                    _ENVIRON_KEYS[name] = key
            if not key:
                continue
            if key in environ and key != "CONTENT_TYPE":
                environ[key] += "," + value
            else:
                environ[key] = value
        if scope.authority and "HTTP_HOST" not in environ:
            environ["HTTP_HOST"] = scope.authority
        return environ

    # The thread's side --------------------------------------------------------

    def _respond(self, environ: dict[str, Any], protocol: _Protocol) -> _Stream | None:
        """Run the WSGI application and send its whole answer from this thread; a
        streaming answer is returned instead, for `_stream`.

        granian takes an answer from any thread (its protocol object hands it to
        Rust under a lock of its own).  Sent from here, an answer leaves as soon as
        it is made; sent from the event loop, it first waited for the loop's thread
        to get the GIL back from the threads running other requests' Python.
        """
        answer: Answer | _Stream | None = self.hot(environ) if self.hot is not None else None
        if answer is None:
            answer = self._call(environ)
        if isinstance(answer, _Stream):
            return answer
        protocol.response_bytes(*answer)
        return None

    def _call(self, environ: dict[str, Any]) -> Answer | _Stream:
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

        # `send_bytes` is called and awaited on the event loop, inside a coroutine
        # of our own: `run_coroutine_threadsafe` takes coroutines only, and refused
        # granian's awaitable after its first chunk had gone (a cut answer).
        async def send(chunk: bytes) -> None:
            await transport.send_bytes(chunk)

        try:
            transport = asyncio.run_coroutine_threadsafe(start(), loop).result()
            for chunk in stream.body:
                if chunk:
                    asyncio.run_coroutine_threadsafe(send(chunk), loop).result()
        except RSGIProtocolClosed as exc:  # the client went away mid-stream
            logger.debug("bridge.stream_ended", extra={"error": repr(exc)})
        except Exception:  # the body's own failure, or the bridge's: the answer is cut
            logger.exception("bridge.stream_failed")
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
