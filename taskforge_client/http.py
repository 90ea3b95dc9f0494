"""The SDK's HTTP plumbing: one API call, retried when that is safe, and pages of a list.

Connections are pooled by one `urllib3.PoolManager` per client. Idempotent calls (GET,
DELETE, PATCH, pause/resume, heartbeat, ack, and enqueue with an `idempotency_key`) are
retried on network errors and 503 with exponential backoff and full jitter; the others
(enqueue without a key, create queue, claim, nack, replay) are sent exactly once, since
repeating them after a lost answer could act twice.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self, TypeVar

import urllib3

from taskforge_client.errors import ConnectionFailed, error_from_response
from taskforge_client.models import format_time

log = logging.getLogger("taskforge_client")

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits rand(0, min(cap, base * 2**n))."""

    retries: int = 3
    backoff_base: float = 0.2
    backoff_max: float = 5.0

    def delay(self, attempt: int) -> float:
        """Seconds to sleep before retry number `attempt` (0-based)."""
        return random.uniform(  # nosec B311
            0, min(self.backoff_max, self.backoff_base * (2**attempt))
        )


class Http:
    """A connection pool to one TaskForge server and the API calls over it (`TaskForge`'s base)."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff_base: float = 0.2,
        backoff_max: float = 5.0,
        maxsize: int = 10,
    ) -> None:
        if not url:
            raise ValueError("url is required")
        _warn_if_plain_http(url)
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.retry_policy = RetryPolicy(retries, backoff_base, backoff_max)
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=maxsize,
            block=False,
            retries=False,  # our own policy, per call, below
        )
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json",
            "User-Agent": "taskforge-client/0.1",
        }
        self.requests_sent = 0  # attempts on the wire, retries included (for tests, metrics)

    # -- plumbing --

    def close(self) -> None:
        """Close pooled connections."""
        self._pool.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        idempotent: bool | None = None,
        timeout: float | None = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """One API call; returns the decoded JSON answer (None for 204).

        `idempotent` defaults to True for GET, PUT, PATCH and DELETE; only idempotent calls
        are retried (network errors and 503).  `data`: the body already encoded as JSON
        (instead of `body`).  `headers` are sent besides the client's own.
        """
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS")
        url = self.url + path
        if params:
            query = {k: _param(v) for k, v in params.items() if v is not None}
            if query:
                url += "?" + urllib.parse.urlencode(query)
        sent = dict(self._headers)  # per-request headers replace the pool's, so all here
        if headers:
            sent.update(headers)
        if body is not None:
            data = encode(body)
        if data is not None:
            sent["Content-Type"] = "application/json"
        read_timeout = self.timeout if timeout is None else timeout
        attempts = self.retry_policy.retries + 1 if idempotent else 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                self.requests_sent += 1
                response = self._pool.request(
                    method,
                    url,
                    body=data,
                    headers=sent,
                    timeout=urllib3.Timeout(connect=self.timeout, read=read_timeout),
                    redirect=False,
                )
            except urllib3.exceptions.HTTPError as exc:
                if last:
                    raise ConnectionFailed(
                        f"{method} {path}: {exc}", code="connection_error"
                    ) from exc
                self._sleep_before_retry(attempt, method, path, str(exc))
                continue
            status = response.status
            parsed = _decode(response.data)
            if 200 <= status < 300:
                return parsed
            error = error_from_response(status, parsed)
            if status == 503 and not last:
                self._sleep_before_retry(attempt, method, path, str(error))
                continue
            raise error
        raise AssertionError("unreachable")  # pragma: no cover

    def _sleep_before_retry(self, attempt: int, method: str, path: str, why: str) -> None:
        delay = self.retry_policy.delay(attempt)
        log.warning(
            "taskforge %s %s failed (%s); retry %d in %.2fs", method, path, why, attempt + 1, delay
        )
        time.sleep(delay)

    def _paginate(
        self,
        path: str,
        params: Mapping[str, Any],
        parse: Callable[[dict[str, Any]], T],
        limit: int | None,
    ) -> Iterator[T]:
        count = 0
        page_size = min(limit, 500) if limit else 100
        answer = self.request("GET", path, params={**params, "limit": page_size})
        while True:
            for item in answer.get("results", []):
                yield parse(item)
                count += 1
                if limit is not None and count >= limit:
                    return
            following = answer.get("next")
            if not following:
                return
            parts = urllib.parse.urlsplit(following)
            query = dict(urllib.parse.parse_qsl(parts.query))
            answer = self.request("GET", parts.path, params=query)

    # -- queues --


_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


def _warn_if_plain_http(url: str) -> None:
    """The API key travels in every request: say so when it would cross a network in clear."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "http" and (parts.hostname or "") not in _LOCAL_HOSTS:
        log.warning(
            "TaskForge at %s over plain http: the API key is sent unencrypted; use https", url
        )


def key_in_argv_warning(argv: list[str] | None) -> str | None:
    """A warning when the API key was given as `--api-key` on a command line."""
    args = sys.argv[1:] if argv is None else argv
    if any(arg == "--api-key" or arg.startswith("--api-key=") for arg in args):
        return (
            "--api-key on the command line is visible to every user of this machine (ps); "
            "set TASKFORGE_API_KEY instead"
        )
    return None


def encode(body: Any) -> bytes:
    """A request body as compact JSON."""
    return json.dumps(body, separators=(",", ":")).encode()


def segment(segment: str) -> str:
    return urllib.parse.quote(str(segment), safe="")


def _param(value: Any) -> str:
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
