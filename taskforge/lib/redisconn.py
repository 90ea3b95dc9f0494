"""Opening Redis from REDIS_URL: one server, a Redis Cluster, or a master behind Sentinels.

`redis://host:port/db` (or `rediss://`, `unix://`) names one server and gives
a plain `redis.Redis`.  `redis+cluster://host:port` (or `rediss+cluster://`)
names a Redis Cluster and gives redis-py's `RedisCluster`, which learns the
slot map from the node it first reaches, sends each command to the node that
owns its key's slot, and follows MOVED/ASK redirects and failovers.  Several
seed nodes may be listed, comma-separated, so a process starts while one of
them is down: `redis+cluster://user:pass@10.0.0.1:6379,10.0.0.2:6379`.

A cluster has only db 0: a cluster URL names none (or `/0`), and TaskForge
keeps to its own key names there (`tf:*` for the dispatch buffer,
`taskforge:*` for Django's cache).

`redis+sentinel://s1:26379,s2:26379/<master name>/<db>` (or
`rediss+sentinel://`, TLS to the master) names Redis Sentinels and the master
they watch, through redis-py's Sentinel support: each new connection asks the
Sentinels which server is the master now, a connection still open to a master
that became a replica is dropped at its first READONLY answer, and idle ones
when the Sentinels name another master, so a failover needs no restart.  A
password in the URL is the master's (and its replicas'); Sentinels that need
one of their own get TASKFORGE_REDIS_SENTINEL_PASSWORD.

Every place that connects to REDIS_URL goes through `connect()`, so the three
kinds of deployment differ in this module only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, TypeAlias, cast
from urllib.parse import unquote, urlsplit

import redis
from redis.client import PubSub
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterError, RedisClusterException, RedisError
from redis.sentinel import Sentinel, SentinelConnectionPool

from taskforge.conf import conf

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
SENTINEL_PORT = 26379

# Either client: both speak the same commands, pipelines and scripts.
Client: TypeAlias = "redis.Redis | RedisCluster"

# What a command may raise when a cluster cannot serve it (a node down and
# its slots not yet failed over, no node reachable at start): an outage like
# a ConnectionError, answered 503 by the API.
CLUSTER_OUTAGES: tuple[type[Exception], ...] = (ClusterError, RedisClusterException)

# Anything a Redis call may raise for Redis's sake: RedisError, and the
# cluster client's own errors, which do not derive from it.
REDIS_FAILURES: tuple[type[Exception], ...] = (RedisError, RedisClusterException)


def is_cluster(url: str) -> bool:
    """Whether `url` names a Redis Cluster (`redis+cluster://`, `rediss+cluster://`)."""
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def is_sentinel(url: str) -> bool:
    """Whether `url` names Redis Sentinels (`redis+sentinel://`, `rediss+sentinel://`)."""
    return urlsplit(url).scheme in SENTINEL_SCHEMES


def is_single_server(url: str) -> bool:
    """Whether `url` names one server (`redis://`, `rediss://`, `unix://`)."""
    return not (is_cluster(url) or is_sentinel(url))


@functools.lru_cache(maxsize=16)
def channel(base: str, url: str) -> str:
    """`base` named after `url`'s logical db: `tf:wake:9` for redis://host/9.

    Pub/sub channels are server-wide, not per db: two deployments (or test
    runs) on one Redis server in different dbs would otherwise hear each
    other's messages.  A cluster has only db 0.
    """
    if is_cluster(url):
        db = 0
    elif is_sentinel(url):
        db = sentinel_target(url).db
    else:
        db = redis.connection.parse_url(url).get("db", 0)
    return f"{base}:{db}"


def _host_ports(hosts: str, default_port: int) -> list[tuple[str, int]]:
    """`h1:p1,h2,[::1]:p3` as (host, port) pairs.

    Raises:
        ValueError: no host, or a port that is not a number.
    """
    found: list[tuple[str, int]] = []
    for hostport in hosts.split(","):
        host, _, port = hostport.strip().rpartition(":")
        if not host or (host.startswith("[") and not host.endswith("]")):
            host, port = hostport.strip(), str(default_port)  # no port given
        host = unquote(host.strip("[]"))
        if not host:
            raise ValueError("the URL needs at least one host:port")
        found.append((host, int(port)))
    return found


def cluster_seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """Split a cluster URL into a plain URL for its first seed and all seeds.

    Raises:
        ValueError: not a cluster URL, no host, or a db other than 0.
    """
    parts = urlsplit(url)
    scheme = CLUSTER_SCHEMES.get(parts.scheme)
    if scheme is None:
        raise ValueError(f"not a Redis Cluster URL: {parts.scheme}://")
    auth, _, hosts = parts.netloc.rpartition("@")
    db = parts.path.strip("/")
    if db not in ("", "0"):
        raise ValueError("a Redis Cluster has only db 0: drop the path from REDIS_URL")
    seeds = _host_ports(hosts, 6379)
    first_host, first_port = seeds[0]
    if ":" in first_host:
        first_host = f"[{first_host}]"
    netloc = f"{auth}@{first_host}:{first_port}" if auth else f"{first_host}:{first_port}"
    query = f"?{parts.query}" if parts.query else ""
    return f"{scheme}://{netloc}/0{query}", seeds


@dataclass(frozen=True)
class SentinelTarget:
    """What a Sentinel URL names: the Sentinels, the master's name, and how to
    connect to the master (db, its user and password, TLS)."""

    sentinels: list[tuple[str, int]]
    master: str
    db: int
    username: str | None
    password: str | None
    ssl: bool


def sentinel_target(url: str) -> SentinelTarget:
    """Read `redis+sentinel://[user:pass@]s1:26379,s2:26379/<master name>/<db>`.

    Raises:
        ValueError: not a Sentinel URL, no Sentinel, no master name, or a bad db.
    """
    parts = urlsplit(url)
    scheme = SENTINEL_SCHEMES.get(parts.scheme)
    if scheme is None:
        raise ValueError(f"not a Redis Sentinel URL: {parts.scheme}://")
    auth, _, hosts = parts.netloc.rpartition("@")
    path = [unquote(part) for part in parts.path.split("/") if part]
    if not path or len(path) > 2:
        raise ValueError(
            "a Redis Sentinel URL names the master: redis+sentinel://host:port/<master name>/<db>"
        )
    if len(path) == 2 and not path[1].isdigit():
        raise ValueError(f"not a Redis db number: {path[1]!r}")
    username, _, password = auth.partition(":") if auth else ("", "", "")
    return SentinelTarget(
        sentinels=_host_ports(hosts, SENTINEL_PORT),
        master=path[0],
        db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(username) or None,
        password=unquote(password) or None,
        ssl=scheme == "rediss",
    )


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """Connections to the master the Sentinels name, and a wait for one when all are
    in use (BlockingConnectionPool's `timeout`) rather than an error at once."""


class SentinelRedis(redis.Redis):
    """A client of the master behind Sentinels; `close()` also closes its
    connections to the Sentinels."""

    def close(self) -> None:
        pool = self.connection_pool
        super().close()
        manager = getattr(pool, "sentinel_manager", None)
        if manager is not None:
            manager.close()


def _sentinel_client(url: str, *, blocking: bool, options: dict[str, Any]) -> redis.Redis:
    target = sentinel_target(url)
    # The Sentinels get the same socket timeouts, and a password of their own if any.
    sentinel_options: dict[str, Any] = {
        k: v for k, v in options.items() if k in ("socket_timeout", "socket_connect_timeout")
    }
    if conf.REDIS_SENTINEL_PASSWORD:
        sentinel_options["password"] = conf.REDIS_SENTINEL_PASSWORD
    manager = Sentinel(target.sentinels, sentinel_kwargs=sentinel_options)
    pool_class = BlockingSentinelPool if blocking else SentinelConnectionPool
    # redis-py types its Sentinel pool loosely.
    pool = pool_class(  # type: ignore[no-untyped-call]
        target.master,
        manager,
        db=target.db,
        username=target.username,
        password=target.password,
        ssl=target.ssl,
        **options,
    )
    return SentinelRedis.from_pool(pool)


def connect(
    url: str,
    *,
    max_connections: int | None = None,
    blocking_timeout: float | None = None,
    **options: Any,
) -> Client:
    """A client for `url`: `redis.Redis` for a server or the master behind
    Sentinels, `RedisCluster` for a cluster.

    `max_connections` caps the pool (per node in a cluster); with
    `blocking_timeout`, a thread that finds the pool exhausted waits that long
    for a connection instead of failing at once.  `options` are connection
    options (`socket_timeout`, `socket_connect_timeout`, ...).

    A cluster client reads the slot map at construction, so this connects at
    once for a cluster (a plain client connects on first use).

    Raises:
        ValueError: a malformed cluster or Sentinel URL.
        redis.exceptions.RedisClusterException: no seed node of the cluster answers.
    """
    pool_class: type[redis.ConnectionPool] = redis.ConnectionPool
    if blocking_timeout is not None:
        pool_class = redis.BlockingConnectionPool
        options["timeout"] = blocking_timeout
    if max_connections is not None:
        options["max_connections"] = max_connections
    if is_sentinel(url):
        return _sentinel_client(url, blocking=blocking_timeout is not None, options=options)
    if not is_cluster(url):
        # The client owns its pool: close() disconnects it (a readiness check
        # builds a client per check).
        return redis.Redis.from_pool(pool_class.from_url(url, **options))
    first, seeds = cluster_seeds(url)
    # Retries on timeouts are the cluster client's (it re-reads the slot map
    # between attempts), so the per-node connections never retry on their own.
    options.pop("retry_on_timeout", None)
    return RedisCluster(
        url=first,
        startup_nodes=[ClusterNode(host, port) for host, port in seeds[1:]],
        connection_pool_class=pool_class,
        # Start while part of the slots are unserved (a node is failing over);
        # commands for those slots fail until it is back, the rest work.
        require_full_coverage=False,
        **options,
    )


def subscriber(client: Client) -> PubSub:
    """A pub/sub connection of `client` that skips subscribe confirmations.

    On a cluster it connects to the node that owns the first channel's slot;
    a classic PUBLISH sent to any node reaches the subscribers of all nodes.
    """
    if isinstance(client, RedisCluster):
        return cast(PubSub, client.pubsub(ignore_subscribe_messages=True))
    return client.pubsub(ignore_subscribe_messages=True)
