"""TaskForge behind pgbouncer in transaction mode (docs/operations.md, "pgbouncer").

The module starts a pgbouncer of its own (tests/pgbouncer.py; Debian's 1.18,
which passes no named prepared statements between server connections) in
front of the test Postgres and runs the whole service through it, as an
operator would configure it:

    DATABASE_URL                  the transaction pool
    DATABASE_PREPARED_STATEMENTS  false
    DATABASE_LISTEN_URL           the session pool (the loops' LISTEN)

Then:
- a control: with prepared statements on, two clients of the transaction
  pool break each other (so this setup would catch a named statement), and a
  LISTEN through it hears nothing;
- every process (the API's two, the three loops, the two listeners) reaches
  Postgres through pgbouncer, on no more server connections than the pool;
- the engine tests of test_faults run again unchanged: claim order, a
  delayed task on time, retry backoff, the DLQ and its replay, the long-poll
  wake-up, a backlog beyond the buffer, a vanished worker's task retried by
  another (the watchdog), and the fleet (ack, nack, abandon, zombie, slow
  workers: retries, leases, dead tasks) with no task lost or leased twice;
- the loops' wake-ups arrive through the session pool: with their fallback
  ticks at 30 s, a delayed task is still handed out within a second of its time.

Skipped, with the reason, when pgbouncer is not installed (`make test`
installs it when it runs as root: the Makefile's pgbouncer stamp).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.pgbouncer import POOL_SIZE, PgBouncer, pgbouncer_binary
from tests.service import Service
from tests.test_faults import (  # noqa: F401  (fixtures and tests run here through pgbouncer)
    Clients,
    Services,
    api,
    create_queue,
    enqueue,
    knobs,
    parse_time,
    service,
    shared_service,
    test_claim__priority_order_then_fifo,
    test_dlq__dead_tasks_replayed_to_completion,
    test_fleet__every_task_finishes_once_per_attempt,
    test_lease__vanished_worker_task_retried_by_another,
    test_long_poll__backlog_beyond_the_buffer_answers_without_waiting_for_the_tick,
    test_long_poll__claim_is_woken_by_the_enqueue,
    test_retry__backoff_within_bounds,
    test_schedule__delayed_task_claimable_on_time,
)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        pgbouncer_binary() is None,
        reason="pgbouncer is not installed (apt-get install pgbouncer; make test does it as root)",
    ),
]


@pytest.fixture(scope="module")
def bouncer(django_db_setup: None) -> Iterator[PgBouncer]:
    """pgbouncer in front of the test database (pytest-django has created it by now)."""
    pool = PgBouncer(connection.settings_dict)
    pool.start()
    try:
        yield pool
    finally:
        print(pool.tail())
        pool.stop()


class BouncedServices(Services):
    """test_faults's services, configured to reach Postgres through pgbouncer."""

    def __init__(self, workdir: Path, bouncer: PgBouncer) -> None:
        super().__init__(workdir)
        self.bouncer = bouncer

    def _replace(self, workdir: Path, extra: dict[str, str], *, shared: bool) -> Service:
        through = {
            "DATABASE_URL": self.bouncer.url(),
            "DATABASE_PREPARED_STATEMENTS": "false",
            "DATABASE_LISTEN_URL": self.bouncer.url(session=True),
        }
        return super()._replace(workdir, {**through, **extra}, shared=shared)


@pytest.fixture(scope="module")
def services(
    tmp_path_factory: pytest.TempPathFactory, django_db_setup: None, bouncer: PgBouncer
) -> Iterator[Services]:
    """Overrides test_faults's: every service of this module goes through pgbouncer."""
    pool = BouncedServices(tmp_path_factory.mktemp("services"), bouncer)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def one_server(django_db_setup: None) -> Iterator[PgBouncer]:
    """A pgbouncer of its own with one server connection: its clients take turns on it."""
    pool = PgBouncer(connection.settings_dict, pool_size=1)
    pool.start()
    try:
        yield pool
    finally:
        pool.stop()


def test_control__named_statements_and_listen_break_in_transaction_mode(
    one_server: PgBouncer,
) -> None:
    """What DATABASE_PREPARED_STATEMENTS and DATABASE_LISTEN_URL are for, on this pgbouncer."""
    bouncer = one_server
    with (
        psycopg.connect(bouncer.url(), autocommit=True) as one,
        psycopg.connect(bouncer.url(), autocommit=True) as two,
    ):
        # psycopg names its statements _pg3_0, _pg3_1, ... per connection: the second
        # client's first one meets the first client's on the one server connection.
        one.execute("SELECT %s::int", [1], prepare=True)
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            two.execute("SELECT %s::int", [2], prepare=True)
        # Unnamed statements (what TaskForge sends with the setting off) pass.
        assert two.execute("SELECT %s::int", [2]).fetchone() == (2,)

        one.execute("LISTEN taskforge_bouncer_probe")
        two.execute("SELECT pg_notify('taskforge_bouncer_probe', 'lost')")
        assert list(one.notifies(timeout=0.5, stop_after=1)) == []
    with (
        psycopg.connect(bouncer.url(session=True), autocommit=True) as listener,
        psycopg.connect(bouncer.url(), autocommit=True) as sender,
    ):
        listener.execute("LISTEN taskforge_bouncer_probe")
        sender.execute("SELECT pg_notify('taskforge_bouncer_probe', 'heard')")
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert heard == ["heard"]


@pytest.mark.timeout(60)
def test_service__every_process_goes_through_pgbouncer(
    shared_service: Service,  # noqa: F811  (the fixture imported from test_faults)
    api: Clients,  # noqa: F811
    bouncer: PgBouncer,
) -> None:
    """The loops and the API are pgbouncer's clients, on at most its pool of servers."""
    create_queue(api, "through")
    enqueue(api, "through", [{"payload": n} for n in range(50)])
    worker = api.worker("through")
    while tasks := worker.claim(["through"], max_tasks=10, wait_seconds=0):
        for task in tasks:
            assert worker.ack(task)[0] == 200
    clients = bouncer.show("CLIENTS")
    by_name = {(c["database"], c["application_name"]) for c in clients}
    for loop in ("dispatcher", "scheduler", "watchdog"):
        assert (bouncer.name, f"taskforge-{loop}") in by_name, by_name
    for loop in ("dispatcher", "scheduler"):
        assert (f"{bouncer.name}_session", f"taskforge-{loop}-listen") in by_name, by_name
    # The API's pooled connections (no application name of their own), and the
    # test's: every client of the transaction pool shares its few server connections.
    pool = [p for p in bouncer.show("POOLS") if p["database"] == bouncer.name]
    servers = sum(p["sv_active"] + p["sv_idle"] + p["sv_used"] + p["sv_login"] for p in pool)
    transaction_clients = [c for c in clients if c["database"] == bouncer.name]
    print(f"transaction pool: {len(transaction_clients)} clients on {servers} server connections")
    assert len(transaction_clients) >= 4
    assert servers <= POOL_SIZE
    # Nothing went wrong on the way: pgbouncer closed no client for a protocol error.
    assert "prepared statement" not in shared_service.tails(200)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "knobs",
    [{"TASKFORGE_SCHEDULER_TICK_SECONDS": "30", "TASKFORGE_DISPATCHER_TICK_SECONDS": "30"}],
)
def test_wakeups__arrive_through_the_session_pool(
    service: Service,  # noqa: F811  (the fixture imported from test_faults)
    api: Clients,  # noqa: F811
) -> None:
    """With the fallback ticks at 30 s only NOTIFY (the scheduler's, then the dispatcher's)
    can hand a delayed task out on time; it comes within a second of its time."""
    create_queue(api, "woken")
    worker = api.worker("woken")
    late = []
    for delay in (1.0, 1.5):
        [task] = enqueue(api, "woken", [{"payload": delay, "delay_seconds": delay}])
        due = parse_time(task["scheduled_at"])
        [got] = worker.claim(["woken"], wait_seconds=delay + 5)
        late.append(parse_time(got["claimed_at"]) - due)
        assert worker.ack(got)[0] == 200
    print(f"handed out after scheduled_at by {[round(x, 3) for x in late]}s")
    assert 0 <= min(late) and max(late) < 1.0, late
