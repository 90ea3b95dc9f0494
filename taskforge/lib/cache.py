"""Django's cache on a Redis Cluster, or behind Redis Sentinels.

On a single Redis, Django's cache is django-redis.  django-redis has no
cluster client (its connection factory builds a plain `redis.Redis`, which
answers MOVED for keys on other nodes), so for a `redis+cluster://` REDIS_URL
the settings use this backend instead: the same behaviour TaskForge relies on,
over redis-py's `RedisCluster` (taskforge.lib.redisconn).  Behind Sentinels
(`redis+sentinel://`) it is the same backend (`SentinelCache`) over the client
of the master the Sentinels name.

- Keys read `<KEY_PREFIX>:<version>:<key>`; integers are stored as their
  digits (so `incr` is one atomic INCRBY), other values pickled.
- A cache is an optimisation: when the cluster cannot answer, a read misses
  and a write is dropped, logged on `taskforge.cache` (django-redis's
  IGNORE_EXCEPTIONS), and the request goes on.
- Commands of several keys (get_many, set_many, delete_many) are split per
  slot; `clear()` deletes the prefix's keys on every primary rather than
  flushing the nodes.
- One client per process, shared by the threads (RedisCluster is
  thread-safe), built on first use with OPTIONS' SOCKET_TIMEOUT and
  SOCKET_CONNECT_TIMEOUT.
"""

from __future__ import annotations

import logging
import os
import pickle  # nosec B403 - see _decode
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from taskforge.lib.redisconn import REDIS_FAILURES, Client, connect

logger = logging.getLogger("taskforge.cache")

T = TypeVar("T")


class RedisClusterCache(BaseCache):
    """A Django cache backend for a `redis+cluster://` LOCATION."""

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(params)
        self._url = server[0] if isinstance(server, list) else server
        options: dict[str, Any] = params.get("OPTIONS", {})
        self._options: dict[str, Any] = {
            "socket_timeout": options.get("SOCKET_TIMEOUT", 0.5),
            "socket_connect_timeout": options.get("SOCKET_CONNECT_TIMEOUT", 0.5),
        }
        self._client: Client | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def _get_client(self) -> Client:
        if self._client is None or self._pid != os.getpid():
            with self._lock:
                if self._client is None or self._pid != os.getpid():
                    self._client = connect(self._url, **self._options)
                    self._pid = os.getpid()
        return self._client

    def _guard(self, action: Callable[[Client], T], fallback: T) -> T:
        try:
            return action(self._get_client())
        except REDIS_FAILURES:
            logger.error("cache.unavailable", exc_info=True)
            return fallback

    def _ttl(self, timeout: float | object | None) -> float | None:
        """Seconds to keep a value: None forever, <= 0 already expired."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        return None if timeout is None else float(timeout)  # type: ignore[arg-type]

    def get(self, key: str, default: Any = None, version: int | None = None) -> Any:
        name = self.make_and_validate_key(key, version=version)
        raw: Any = self._guard(lambda c: c.get(name), None)
        return default if raw is None else _decode(raw)

    def set(
        self,
        key: str,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> None:
        self._store(key, value, timeout, version, only_new=False)

    def add(
        self,
        key: str,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        return self._store(key, value, timeout, version, only_new=True)

    def _store(
        self,
        key: str,
        value: Any,
        timeout: float | object | None,
        version: int | None,
        *,
        only_new: bool,
    ) -> bool:
        name = self.make_and_validate_key(key, version=version)
        ttl = self._ttl(timeout)
        if ttl is not None and ttl <= 0:
            if not only_new:
                self.delete(key, version=version)
            return False
        px = None if ttl is None else max(1, int(ttl * 1000))
        data = _encode(value)
        return self._guard(lambda c: bool(c.set(name, data, px=px, nx=only_new)), False)

    def touch(
        self,
        key: str,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        name = self.make_and_validate_key(key, version=version)
        ttl = self._ttl(timeout)
        if ttl is None:
            return bool(self._guard(lambda c: c.persist(name), False))
        return bool(self._guard(lambda c: c.pexpire(name, max(1, int(ttl * 1000))), False))

    def incr(self, key: str, delta: int = 1, version: int | None = None) -> int:
        """Add `delta` in one atomic step (INCRBY); ValueError when the key is missing.

        A cluster that cannot answer is a miss here too: ValueError.
        """
        name = self.make_and_validate_key(key, version=version)
        value: Any = self._guard(lambda c: c.eval(_INCR_IF_EXISTS, 1, name, delta), None)
        if value is None:
            raise ValueError(f"Key '{key}' not found")
        return int(value)

    def decr(self, key: str, delta: int = 1, version: int | None = None) -> int:
        return self.incr(key, -delta, version=version)

    def delete(self, key: str, version: int | None = None) -> bool:
        name = self.make_and_validate_key(key, version=version)
        return bool(self._guard(lambda c: c.delete(name), 0))

    def has_key(self, key: str, version: int | None = None) -> bool:
        name = self.make_and_validate_key(key, version=version)
        return bool(self._guard(lambda c: c.exists(name), 0))

    def get_many(self, keys: Iterable[str], version: int | None = None) -> dict[str, Any]:
        by_name = {self.make_and_validate_key(k, version=version): k for k in keys}
        if not by_name:
            return {}
        names = list(by_name)
        # MGET split per slot: keys of different slots cannot share one.
        values: list[Any] = self._guard(lambda c: _mget(c, names), [None] * len(names))
        return {
            by_name[name]: _decode(raw)
            for name, raw in zip(names, values, strict=True)
            if raw is not None
        }

    def set_many(
        self,
        data: Mapping[str, Any],
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[str]:
        failed = []
        for key, value in data.items():
            if not self._store(key, value, timeout, version, only_new=False):
                failed.append(key)
        return failed

    def delete_many(self, keys: Iterable[str], version: int | None = None) -> None:
        names = [self.make_and_validate_key(k, version=version) for k in keys]
        if names:
            self._guard(lambda c: c.delete(*names), 0)

    def clear(self) -> None:
        """Delete this cache's keys on every primary (never other keys)."""

        def drop(client: Client) -> None:
            for name in client.scan_iter(match=f"{self.key_prefix}:*", count=500):
                client.delete(name)

        self._guard(drop, None)

    def close(self, **kwargs: Any) -> None:
        """Keep the process's client: it serves every request of every thread."""


class SentinelCache(RedisClusterCache):
    """A Django cache backend for a `redis+sentinel://` LOCATION: the same keys,
    timeouts and misses-when-down, over the client of the master the Sentinels
    name (taskforge.lib.redisconn), which follows a failover by itself."""


# One key: runs on the node of its slot.  Missing key: nil (ValueError above).
_INCR_IF_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('INCRBY', KEYS[1], ARGV[1])
end
return false
"""


def _encode(value: Any) -> bytes:
    # Integers are stored as their digits so that INCRBY works on them
    # (django-redis does the same); everything else is pickled.
    if type(value) is int:
        return str(value).encode()
    return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


def _decode(raw: bytes) -> Any:
    # A pickle starts with the PROTO opcode (0x80), never with a digit or '-'.
    if raw[:1].isdigit() or raw[:1] == b"-":
        return int(raw)
    # Only TaskForge writes these keys, in its own Redis db, as Django's cache
    # (and django-redis) always has: the store is trusted like the database.
    return pickle.loads(raw)  # nosec B301


def _mget(client: Client, names: list[str]) -> list[Any]:
    mget_nonatomic = getattr(client, "mget_nonatomic", None)  # RedisCluster only
    if mget_nonatomic is not None:
        return list(mget_nonatomic(names))
    return list(client.mget(names))
