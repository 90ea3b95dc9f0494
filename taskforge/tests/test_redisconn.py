"""REDIS_URL: one server or a Redis Cluster (taskforge.lib.redisconn)."""

from __future__ import annotations

import time

import pytest
import redis
from django.conf import settings

from taskforge.lib.redisconn import cluster_seeds, connect, is_cluster


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
