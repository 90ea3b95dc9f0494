"""REDIS_URL: one server, a Redis Cluster or Sentinels (taskforge.lib.redisconn)."""

from __future__ import annotations

import time

import pytest
import redis
from django.conf import settings

from taskforge.lib.redisconn import (
    BlockingSentinelPool,
    channel,
    cluster_seeds,
    connect,
    is_cluster,
    is_sentinel,
    sentinel_target,
)


def test_is_cluster__by_scheme() -> None:
    assert is_cluster("redis+cluster://10.0.0.1:7000")
    assert is_cluster("rediss+cluster://10.0.0.1:7000")
    assert not is_cluster("redis://10.0.0.1:6379/3")
    assert not is_cluster("unix:///run/redis.sock?db=2")


def test_cluster_seeds__first_seed_as_a_plain_url_and_every_seed() -> None:
    first, seeds = cluster_seeds("redis+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001,h3")
    assert first == "redis://u:p%40ss@10.0.0.1:7000/0"
    assert seeds == [("10.0.0.1", 7000), ("10.0.0.2", 7001), ("h3", 6379)]


def test_cluster_seeds__tls_query_and_ipv6() -> None:
    first, seeds = cluster_seeds("rediss+cluster://[::1]:7000/0?ssl_cert_reqs=none")
    assert first == "rediss://[::1]:7000/0?ssl_cert_reqs=none"
    assert seeds == [("::1", 7000)]


def test_cluster_seeds__refuses_a_db_other_than_0() -> None:
    with pytest.raises(ValueError, match="only db 0"):
        cluster_seeds("redis+cluster://10.0.0.1:7000/3")


def test_connect__a_server_url_gives_a_plain_client_on_a_blocking_pool() -> None:
    client = connect("redis://127.0.0.1:1/4", max_connections=3, blocking_timeout=0.5)
    assert isinstance(client, redis.Redis)
    pool = client.connection_pool
    assert isinstance(pool, redis.BlockingConnectionPool)
    assert pool.max_connections == 3
    assert pool.connection_kwargs["db"] == 4


def test_connect__close_hangs_up(redis_client: redis.Redis) -> None:
    """A client per readiness check: closing it must close its connection."""

    def named() -> int:
        return sum(1 for c in redis_client.client_list() if c["name"] == "tf-close-test")

    client = connect(settings.REDIS_URL, client_name="tf-close-test")
    assert client.ping()
    assert named() == 1
    client.close()
    deadline = time.monotonic() + 2
    while named() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert named() == 0


def test_sentinel_target__sentinels_master_db_and_the_masters_password() -> None:
    target = sentinel_target("redis+sentinel://u:p%40ss@10.0.0.1:26380,s2,[::1]:26381/main/5")
    assert target.sentinels == [("10.0.0.1", 26380), ("s2", 26379), ("::1", 26381)]
    assert (target.master, target.db, target.username, target.password) == ("main", 5, "u", "p@ss")
    assert not target.ssl
    assert sentinel_target("rediss+sentinel://s1/main").db == 0
    assert sentinel_target("rediss+sentinel://s1/main").ssl
    assert is_sentinel("redis+sentinel://s1/main") and not is_sentinel("redis://s1/0")
    assert channel("tf:wake", "redis+sentinel://s1:26379/main/7") == "tf:wake:7"


@pytest.mark.parametrize(
    "url", ["redis+sentinel://s1:26379", "redis+sentinel://s1/main/x", "redis+sentinel://s1/a/1/2"]
)
def test_sentinel_target__refuses_a_url_without_master_or_with_a_bad_db(url: str) -> None:
    with pytest.raises(ValueError):
        sentinel_target(url)


def test_connect__a_sentinel_url_gives_a_client_of_the_named_master() -> None:
    client = connect(
        "redis+sentinel://:secret@127.0.0.1:1,127.0.0.1:2/main/4",
        max_connections=3,
        blocking_timeout=0.5,
        socket_connect_timeout=0.2,
    )
    assert isinstance(client, redis.Redis)
    pool = client.connection_pool
    assert isinstance(pool, BlockingSentinelPool)
    assert (pool.service_name, pool.max_connections) == ("main", 3)
    assert pool.connection_kwargs["db"] == 4
    assert pool.connection_kwargs["password"] == "secret"
    # No Sentinel answers: an outage (a ConnectionError), as a master that is down.
    with pytest.raises(redis.ConnectionError):
        client.ping()
    client.close()
