"""Each test process of `make test` has a Redis db of its own (tests/workers.py)."""

from __future__ import annotations

import pytest

from tests.workers import worker_redis_url


@pytest.mark.parametrize(
    ("url", "worker", "expected"),
    [
        ("redis://127.0.0.1:6379/9", 0, "redis://127.0.0.1:6379/9"),
        ("redis://127.0.0.1:6379/9", 2, "redis://127.0.0.1:6379/11"),
        ("redis://:secret@127.0.0.1:6379", 1, "redis://:secret@127.0.0.1:6379/1"),
        ("unix:///tmp/redis.sock?db=0", 3, "unix:///tmp/redis.sock?db=3"),
        ("unix:///tmp/redis.sock", 1, "unix:///tmp/redis.sock?db=1"),
    ],
)
def test_worker_redis_url__moves_the_db_by_the_worker_number(
    url: str, worker: int, expected: str
) -> None:
    assert worker_redis_url(url, worker) == expected


def test_worker_redis_url__refuses_a_db_past_the_last() -> None:
    with pytest.raises(RuntimeError, match="past db 15"):
        worker_redis_url("redis://127.0.0.1:6379/14", 2)
