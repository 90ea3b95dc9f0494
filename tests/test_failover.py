"""Failovers mid-run (issue 35): a Redis master behind Sentinels killed, a Postgres
primary killed and its synchronous standby promoted; and a Postgres crash.

API.md, "Durability, crashes and failover": every TaskForge process finds the
new master or primary by itself, with no restart, and hands out tasks (serves
writes) again within 30 s of it taking over; meanwhile every answer is as usual
or 503 `unavailable` (never a 500, none later than 10 s past `wait_seconds`);
nothing answered 2xx is lost.  A Redis failover loses no hand-out; in a Postgres
failover or crash only a hand-out may be lost (the task is then handed out
again with the same attempt number, and the first holder's ack answers 409).

The whole service (run_api, run_dispatcher, run_scheduler, run_watchdog,
run_pusher) runs against servers of the test's own: a Redis master, a replica
and three Sentinels (tests/redisservers.py), and a Postgres primary with a
streaming synchronous standby made by `pg_basebackup -R`
(tests/pgservers.py), or that primary alone, crashed and started again.  A
producer enqueues throughout and workers claim and ack (tests/workload.py).
Each test prints what the failure cost: seconds of 503s, tasks handed out
twice, and how /readyz read.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import pgservers
from tests.pgservers import PgServer
from tests.redisservers import RedisServer, SentinelGroup
from tests.service import API, Api, Service
from tests.workload import FINISHED, Readiness, Run, check_tasks, count, manage, wait_finished

pytestmark = [pytest.mark.postgres]

DB = "taskforge_failover"
TAKE_OVER_WITHIN = 30.0  # API.md
NO_PRIMARY_SECONDS = 5.0
LOOPS = ("dispatcher", "scheduler", "watchdog", "pusher")


@pytest.fixture
def pg_root() -> Iterator[Path]:
    root = pgservers.workdir()
    try:
        yield root
    finally:
        for name in ("primary", "standby", "pg"):
            server = root / name
            if (server / "postmaster.pid").exists():
                pg = PgServer(root, name)
                pg.stop("immediate")
            log = root / f"{name}.log"
            if log.exists():
                print(f"----- {name}.log -----\n{log.read_text(errors='replace')[-2000:]}")
        pgservers.remove(root)


def _run_through(
    tmp_path: Path, env: dict[str, str], libpq: str, key: str, fail_over: Callable[[], float]
) -> tuple[Run, float, Readiness]:
    """The service under load, `fail_over()` mid-run (it returns the moment the new
    master or primary took over); every task finished afterwards, every process the
    one started.  Returns the run, the failure's moment and what /readyz said."""
    service = Service(tmp_path, env, extra_loops=("pusher",))
    queue = "failover"
    producing = threading.Event()
    run = None
    try:
        service.start()
        pids = {name: proc.popen.pid for name, proc in service.procs.items() if proc.popen}
        Api(service.base_url, key).ok("POST", "/queues", {"name": queue, "max_retries": 5})
        run = Run(service.base_url, key, queue)
        readiness = Readiness(service.base_url)
        producer = threading.Thread(target=run.produce_until, args=(producing,), daemon=True)
        workers = [
            threading.Thread(target=run.work, args=(f"w-{i}@failover",), daemon=True)
            for i in range(3)
        ]
        producer.start()
        for thread in workers:
            thread.start()
        deadline = time.monotonic() + 60
        while count(libpq, FINISHED) < 100:
            assert time.monotonic() < deadline, f"no work done: {dict(run.answers)}"
            time.sleep(0.1)

        failed_at = time.monotonic()
        took_over = fail_over()
        deadline = took_over + TAKE_OVER_WITHIN + 5
        while (resumed := run.first_handout_after(took_over)) is None:
            assert time.monotonic() < deadline, f"no hand-out {TAKE_OVER_WITHIN}s after take-over"
            time.sleep(0.1)
        assert resumed < TAKE_OVER_WITHIN, resumed
        enqueued = run.produced
        while run.produced < enqueued + 50:  # enqueues go on after the take-over too
            assert time.monotonic() < deadline, f"no enqueue after take-over: {dict(run.answers)}"
            time.sleep(0.1)

        producing.set()
        producer.join(timeout=60)
        assert not producer.is_alive()
        wait_finished(libpq, run.produced, 120, run)
        run.stopping.set()
        for thread in workers:
            thread.join(timeout=40)
        readiness.stop()
        service.assert_running()
        now = {name: proc.popen.pid for name, proc in service.procs.items() if proc.popen}
        assert now == pids and all(p.starts == 1 for p in service.procs.values()), now
        assert set(pids) == {API, *LOOPS}
        failures, last = run.unavailable_after(failed_at)
        seen = readiness.between(failed_at, time.monotonic())
        ready = [status for status, _ in seen]
        reasons = [body["checks"] for status, body in seen if status != 200][:3]
        print(
            f"took over {took_over - failed_at:.1f}s after the failure; first hand-out "
            f"{resumed:.1f}s after that; {failures} 503s, the last {last:.1f}s after the "
            f"failure; handed out twice: {len(run.duplicates)}; /readyz: "
            f"{ready.count(503)} of {len(ready)} 503 {reasons}"
        )
        print(f"answers: {dict(sorted(run.answers.items()))}; produced {run.produced}")
    finally:
        producing.set()
        if run is not None:
            run.stopping.set()
        service.stop()
        print(service.tails())
    run.check_answers()
    return run, failed_at, readiness


@pytest.mark.timeout(300)
def test_redis_sentinel_failover__master_killed_mid_run_no_task_lost_no_restart(
    tmp_path: Path, pg_root: Path
) -> None:
    pg = PgServer(pg_root, "pg")
    pg.initdb()
    pg.start()
    pg.create_database(DB)
    group = SentinelGroup(tmp_path / "sentinel")
    try:
        group.start()
        env = {
            **os.environ,
            "DATABASE_URL": pg.url(DB),
            "REDIS_URL": group.url(3),
            "SECRET_KEY": "failover-secret-key",
        }
        manage(env, "migrate", "--noinput", "-v", "0")
        key = manage(env, "createapikey", "failover-admin", "--role", "admin")
        libpq = pg.url(DB).replace("postgres://", "postgresql://", 1)

        def fail_over() -> float:
            group.master.kill()
            deadline = time.monotonic() + TAKE_OVER_WITHIN
            while group.master_port() != group.replica.port:
                assert time.monotonic() < deadline, "the Sentinels named no new master"
                time.sleep(0.05)
            return time.monotonic()

        service_env = {k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
        run, _, _ = _run_through(tmp_path, service_env, libpq, key, fail_over)
    finally:
        group.stop()
    # A Redis failover loses no hand-out: each attempt was handed out once.
    assert not run.duplicates, f"handed out twice: {run.duplicates[:10]}"
    check_tasks(libpq, "failover", run, run.produced, same_handouts=True)


@pytest.mark.timeout(300)
def test_postgres_failover__primary_killed_standby_promoted_nothing_answered_2xx_lost(
    tmp_path: Path, pg_root: Path
) -> None:
    primary, standby = PgServer(pg_root, "primary"), PgServer(pg_root, "standby")
    primary.initdb()
    primary.start()
    primary.create_database(DB)
    cache = RedisServer(tmp_path / "redis")
    try:
        cache.start()
        env = {
            **os.environ,
            "DATABASE_URL": primary.url(DB),
            "REDIS_URL": cache.url(3),
            "SECRET_KEY": "failover-secret-key",
        }
        manage(env, "migrate", "--noinput", "-v", "0")
        key = manage(env, "createapikey", "failover-admin", "--role", "admin")
        # The standby is copied before the primary names it synchronous: promoted, it
        # has no synchronous_standby_names of its own (nothing would commit).
        standby.basebackup_of(primary)
        standby.start()
        primary.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        primary.execute("SELECT pg_reload_conf()")
        primary.wait_sync_standby()
        hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        env["DATABASE_URL"] = f"postgres://postgres@{hosts}/{DB}?target_session_attrs=read-write"
        # The loops LISTEN on a connection of their own; without target_session_attrs,
        # which TaskForge then sets for several hosts itself.
        env["DATABASE_LISTEN_URL"] = f"postgres://postgres@{hosts}/{DB}"
        libpq = env["DATABASE_URL"].replace("postgres://", "postgresql://", 1)

        def fail_over() -> float:
            primary.stop("immediate")  # every server process killed: a crash
            # No primary while the failover tool decides (Patroni waits its TTL).
            time.sleep(NO_PRIMARY_SECONDS)
            standby.promote()
            return time.monotonic()

        names = ("DATABASE_URL", "DATABASE_LISTEN_URL", "REDIS_URL", "SECRET_KEY")
        run, _, _ = _run_through(tmp_path, {k: env[k] for k in names}, libpq, key, fail_over)
        # A management command finds the new primary through the same URL.
        manage(env, "createapikey", "after-failover", "--role", "producer")
    finally:
        cache.stop()
    # Nothing answered 2xx lost: every enqueue's task, every ack (check_tasks).
    check_tasks(libpq, "failover", run, run.produced, same_handouts=False)


@pytest.mark.timeout(300)
def test_postgres_crash__every_server_process_killed_nothing_answered_2xx_lost(
    tmp_path: Path, pg_root: Path
) -> None:
    """The crash of the primary alone: every server process killed mid-run, crash
    recovery at the next start; a 2xx answer is a promise that survives it."""
    pg = PgServer(pg_root, "pg")
    pg.initdb()
    pg.start()
    pg.create_database(DB)
    cache = RedisServer(tmp_path / "redis")
    try:
        cache.start()
        env = {
            **os.environ,
            "DATABASE_URL": pg.url(DB),
            "REDIS_URL": cache.url(3),
            "SECRET_KEY": "failover-secret-key",
        }
        manage(env, "migrate", "--noinput", "-v", "0")
        key = manage(env, "createapikey", "crash-admin", "--role", "admin")
        libpq = pg.url(DB).replace("postgres://", "postgresql://", 1)

        def crash() -> float:
            pg.stop("immediate")
            pg.start()  # crash recovery
            return time.monotonic()

        names = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")
        run, _, _ = _run_through(tmp_path, {k: env[k] for k in names}, libpq, key, crash)
    finally:
        cache.stop()
    check_tasks(libpq, "failover", run, run.produced, same_handouts=False)
