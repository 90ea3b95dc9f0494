"""One push request (API.md "Push delivery"): what is sent, and what the answer means.

`deliver` sends a `Job` (a task handed out to a push process, and its
target) with the session `workers.pusher.Sender` keeps, and turns whatever
happens into an `Outcome` for the finisher to record: delivered (with the
answer's JSON as the result), or a failed attempt whose `error` becomes the
task's `last_error`.
"""

from __future__ import annotations

import email.utils
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from multidict import CIMultiDict

from queues import push
from taskforge import tracing
from taskforge.conf import conf
from taskforge.lib import jsonutil
from workers import destinations, httptasks

logger = logging.getLogger("taskforge.pusher")

# The most a failed attempt waits when the target says Retry-After (API.md).
MAX_RETRY_AFTER_SECONDS = 86400
USER_AGENT = "TaskForge-Push/1.1"
# Characters of a failed answer's body kept in `last_error` (API.md).
ERROR_EXCERPT_CHARS = 500


@dataclass(frozen=True, slots=True)
class Job:
    """One request to send: a task handed out to this push process."""

    task_id: str
    queue: str
    attempt: int
    body: bytes
    target: push.PushTarget
    # A task with an HTTP target (the Cloud Tasks API's): sent as it says
    # (workers.httptasks), not as a push queue's JSON POST.
    http: httptasks.HttpRequest | None = None
    dispatched_at: datetime | None = None
    # The request's W3C Trace Context headers (taskforge.tracing.push_context,
    # which name the attempt's dispatch span), and when it was handed out (the
    # span's start; exporting only, 0 otherwise).
    traceparent: str | None = None
    tracestate: str | None = None
    handed_ns: int = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended.  `error` None: delivered (`result`: JSON text or None)."""

    job: Job
    kind: str  # the metric's outcome label
    seconds: float
    error: str | None = None
    result: str | None = None
    retry_after: float | None = None
    status: int | None = None
    ended_ns: int = 0  # when it ended, for its dispatch span (exporting only)


def request_headers(job: Job, *, secret: str, now: float) -> CIMultiDict[str]:
    """The headers of a job's request: the queue's own, then TaskForge's, which win."""
    headers: CIMultiDict[str] = CIMultiDict(job.target.headers)
    headers.setdefault("User-Agent", USER_AGENT)
    headers["Content-Type"] = "application/json"
    headers[push.TASK_ID_HEADER] = job.task_id
    headers[push.QUEUE_HEADER] = job.queue
    headers[push.ATTEMPT_HEADER] = str(job.attempt)
    if secret:
        headers[push.SIGNATURE_HEADER] = push.signature(secret, job.body, int(now))
    else:
        headers.popall(push.SIGNATURE_HEADER, None)
    return headers


def retry_after_seconds(value: str | None, *, now: datetime) -> float | None:
    """A Retry-After header's delay (seconds or an HTTP date), capped; None if unusable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(min(int(value), MAX_RETRY_AFTER_SECONDS))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max((when - now).total_seconds(), 0.0), float(MAX_RETRY_AFTER_SECONDS))


def result_of(body: bytes, *, limit: int) -> str | None:
    """A 2xx answer's body as the task's result (JSON text), or None when it is not JSON."""
    if not body or len(body) > limit:
        return None
    try:
        value = jsonutil.loads(body)
    except ValueError:
        return None
    return jsonutil.dumps(value).decode()


def excerpt(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")[:ERROR_EXCERPT_CHARS]


async def _read(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """Up to `limit` + 1 bytes of the body: enough to tell that it is too long."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await response.content.read(limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def deliver(session: aiohttp.ClientSession, job: Job, *, secret: str) -> Outcome:
    """Send one job and say how it ended; never raises."""
    started = time.monotonic()
    timeout: float = job.target.timeout_seconds if job.http is None else job.http.deadline
    limit = conf.MAX_PAYLOAD_BYTES
    status: int | None = None
    body = b""

    def ended(kind: str, error: str | None = None, **fields: Any) -> Outcome:
        # The error goes to `last_error` and the log: never the target's secrets
        # (aiohttp names the URL, query included, in some errors; a target may echo a header).
        if error is not None:
            error = push.scrubbed(error, job.target)
        return Outcome(
            job,
            kind,
            time.monotonic() - started,
            error=error,
            status=status,
            ended_ns=tracing.now_ns(),
            **fields,
        )

    try:
        async with session.request(
            *_method_and_url(job),
            data=job.body or None,
            headers=_headers(job, secret=secret, now=time.time()),
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout),
            # A task with an HTTP target gets Content-Type only from its own headers.
            skip_auto_headers=("Content-Type",) if job.http is not None else (),
        ) as response:
            status = response.status
            try:
                body = await _read(
                    response, limit if 200 <= status < 300 else 4 * ERROR_EXCERPT_CHARS
                )
            except (TimeoutError, aiohttp.ClientError) as exc:
                if not 200 <= status < 300:
                    raise
                # The target said 2xx in time; the body broke off or came too slowly:
                # delivered, without a result.
                logger.info(
                    "push.result_unread",
                    extra={
                        "task_id": job.task_id,
                        "queue": job.queue,
                        "error": push.scrubbed(repr(exc), job.target),
                    },
                )
                return ended("success")
            if 200 <= status < 300:
                return ended("success", result=result_of(body, limit=limit))
            delay = None
            if status in (429, 503):
                delay = retry_after_seconds(
                    response.headers.get("Retry-After"), now=datetime.now(UTC)
                )
            text = excerpt(body)
            if 300 <= status < 400 and not text.strip():
                where = response.headers.get("Location", "")
                text = f"redirect to {where[:ERROR_EXCERPT_CHARS]} not followed"
            return ended("http_error", f"HTTP {status}: {text}", retry_after=delay)
    except TimeoutError:
        return ended("timeout", f"timeout after {timeout} s")
    except (aiohttp.ClientSSLError, aiohttp.ClientConnectorCertificateError) as exc:
        return ended("tls_error", f"TLS error: {_reason(exc)}")
    except aiohttp.ClientConnectorError as exc:
        refused = destinations.refused_destination(exc)
        if refused is not None:
            return ended("connection_error", str(refused))
        return ended("connection_error", f"connection failed: {_reason(exc)}")
    except aiohttp.ServerDisconnectedError:
        return ended("connection_error", "connection closed by the target before it answered")
    except aiohttp.ClientError as exc:
        return ended("connection_error", f"request failed: {_reason(exc)}")
    except Exception as exc:  # a bug must not lose the slot or the task
        logger.exception("push.send_failed", extra={"task_id": job.task_id, "queue": job.queue})
        return ended("connection_error", f"request failed: {exc!r}")


def _method_and_url(job: Job) -> tuple[str, str]:
    if job.http is not None:
        return job.http.method, job.http.url
    return "POST", job.target.url


def _headers(job: Job, *, secret: str, now: float) -> CIMultiDict[str]:
    if job.http is None:
        headers = request_headers(job, secret=secret, now=now)
    else:
        headers = httptasks.headers_of(
            job.http,
            task_id=job.task_id,
            queue=job.queue,
            attempt=job.attempt,
            secret=secret,
            now=now,
            token=job.http.token,
        )
    if job.traceparent is not None:
        # TaskForge's context wins over any of the queue's or the task's own headers.
        headers["traceparent"] = job.traceparent
        headers.popall("tracestate", None)
        if job.tracestate is not None:
            headers["tracestate"] = job.tracestate
    return headers


def _reason(exc: BaseException) -> str:
    text = str(exc) or exc.__class__.__name__
    return text[:ERROR_EXCERPT_CHARS]
