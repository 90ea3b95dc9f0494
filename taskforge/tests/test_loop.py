"""The Loop's backoff and crash-loop guard (issue 35): outages are ridden out, bugs are not.

The errors are real ones: Redis and Postgres asked on a port nothing listens on, a
write refused by a read-only transaction of the test database.
"""

from __future__ import annotations

import random
import time

import psycopg
import pytest
import redis
from django.conf import LazySettings
from django.db import connection, transaction

from queues.models import Queue
from taskforge.api.exceptions import error_answer
from taskforge.lib import loop as loop_module
from taskforge.lib import outages
from taskforge.lib.loop import MAX_BACKOFF, Loop, backoff
from tests.service import free_port


def _redis_down() -> Exception:
    client = redis.Redis(port=free_port(), socket_connect_timeout=1)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        return exc
    finally:
        client.close()
    raise AssertionError("a Redis answered on a free port")


def _postgres_down() -> Exception:
    try:
        psycopg.connect(host="127.0.0.1", port=free_port(), connect_timeout=1)
    except psycopg.OperationalError as exc:
        return exc
    raise AssertionError("a Postgres answered on a free port")


def _read_only_write() -> Exception:
    """A write refused by the server, as a standby refuses it (SQLSTATE 25006)."""
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")
            Queue.objects.create(name="refused")
    except Exception as exc:
        return exc
    raise AssertionError("a read-only transaction wrote")


class Ceiling(random.Random):
    """No jitter: the top of each backoff."""

    def uniform(self, a: float, b: float) -> float:
        return b


class Failing(Loop):
    """Its first `count` ticks raise `errors` in turn, the next one stops it; records
    when each tick ran."""

    name = "failing"

    def __init__(self, errors: list[Exception], count: int) -> None:
        super().__init__()
        self.errors = errors
        self.count = count
        self.ticks: list[float] = []

    def tick(self) -> bool:
        self.ticks.append(time.monotonic())
        if len(self.ticks) > self.count:
            self.stopping = True
            return False
        error = self.errors[(len(self.ticks) - 1) % len(self.errors)]
        raise error

    def wait(self, seconds: float) -> None:
        """As a NOTIFY arriving all the time: never sleeps."""


def test_backoff__doubles_then_stays_capped_with_jitter_for_any_count() -> None:
    rng = random.Random(35)
    first = [backoff(1, rng) for _ in range(200)]
    assert 0.25 <= min(first) and max(first) <= 0.5
    for failures in (1025, 1026, 5000, 10**9):  # 2 ** 1024 is no float: it broke here
        waits = [backoff(failures, rng) for _ in range(200)]
        assert MAX_BACKOFF / 2 <= min(waits) and max(waits) <= MAX_BACKOFF, failures
        assert len(set(waits)) > 150  # jittered: copies of a loop do not retry in step
    assert [backoff(n, Ceiling()) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]


@pytest.mark.django_db
def test_outages__real_store_errors_are_outages_and_bugs_are_not() -> None:
    assert outages.is_outage(_redis_down())
    assert outages.is_outage(_postgres_down())
    refused = _read_only_write()
    assert outages.read_only(refused) and outages.is_outage(refused)
    assert not outages.is_outage(ValueError("a bug"))
    assert not outages.is_outage(KeyError("tf:x"))


@pytest.mark.django_db(transaction=True)
def test_error_answer__a_standby_refusing_a_write_is_503_and_its_connection_discarded() -> None:
    refused = _read_only_write()
    raw = connection.connection
    status, body, _headers = error_answer(refused)
    assert status == 503, body
    assert body["error"]["code"] == "unavailable"
    assert raw is not None and raw.closed
    assert Queue.objects.count() == 0  # the next statement runs on a new connection


def test_run__an_outage_of_any_length_is_ridden_out_past_the_guard(
    settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,100 failed ticks in a row (the old backoff broke at 1,025) against a guard of 3:
    outages never end the loop."""
    settings.TASKFORGE_MAX_TICK_FAILURES = 3
    monkeypatch.setattr(loop_module, "MAX_BACKOFF", 0.0005)
    monkeypatch.setattr(loop_module, "BACKOFF_BASE", 0.0005)
    loop = Failing([_redis_down(), _postgres_down()], 1100)
    assert loop.run() == 0
    assert len(loop.ticks) == 1101
    assert loop.failures == 0  # the last tick succeeded


def test_run__a_bug_still_trips_the_crash_loop_guard(
    settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.TASKFORGE_MAX_TICK_FAILURES = 3
    monkeypatch.setattr(loop_module, "BACKOFF_BASE", 0.0005)
    loop = Failing([_redis_down(), ValueError("a bug")], 100)
    assert loop.run() == 1
    # Outages between the bugs do not count: the third bug is the sixth failure.
    assert len(loop.ticks) == 6


def test_run__a_wake_up_does_not_cut_the_backoff_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_module, "BACKOFF_BASE", 0.2)
    loop = Failing([_redis_down()], 3)
    loop.run()
    gaps = [b - a for a, b in zip(loop.ticks, loop.ticks[1:], strict=False)]
    # 0.1-0.2 s, 0.2-0.4 s, 0.4-0.8 s: Failing.wait (a wake-up at once) is not used.
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2 and gaps[2] >= 0.4, gaps
