"""Postgres restarted mid-run (issue 12): the service rides it out and loses no task.

The service (API and loops as OS processes, tests/service.py) runs against a
throwaway Postgres cluster of this test's own, made from the embedded binaries
(devservices.postgres), so the test can stop it: producers enqueue (each task
with an idempotency key, so a batch retried after a 503 makes no duplicate),
workers claim and ack, and the server is stopped with a fast shutdown and
started again mid-run.  Requests during the outage answer 503 `unavailable`;
every process keeps running; afterwards every task is done or dead, each
hand-out was received once and every chain of events follows the lifecycle
(no task was leased twice at once), and the hand-outs and acks in the events
are the ones the workers received.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from devservices.postgres import Postgres
from tests.service import Api, Service
from tests.workload import FINISHED, Run, check_tasks, count, manage

pytestmark = [pytest.mark.postgres]

DB = "taskforge_restart"
TOTAL = 600
OUTAGE_SECONDS = 2.0


@pytest.fixture
def cluster() -> Iterator[Postgres]:
    # A short path: the server's unix socket lives in it, and a restart must find the
    # same address (a TCP fallback would pick a new port).
    root = Path(tempfile.mkdtemp(prefix="tfpg-"))
    os.chmod(root, 0o755)
    pg = Postgres(root / "data", root / "postgres.log", durable=False)
    try:
        pg.initialize()
        pg.start()
        pg.ensure_database(DB)
        yield pg
    finally:
        pg.stop()
        print((root / "postgres.log").read_text(errors="replace")[-3000:])
        subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.mark.timeout(240)
def test_postgres_restart__mid_run_every_task_finishes_once(
    cluster: Postgres, tmp_path: Path
) -> None:
    url = cluster.url_for(DB)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": "restart-secret-key",
    }
    manage(env, "migrate", "--noinput", "-v", "0")
    key = manage(env, "createapikey", "restart-admin", "--role", "admin")
    service = Service(tmp_path, {k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")})
    libpq = url.replace("postgres://", "postgresql://", 1)
    queue = f"restart-{os.getpid()}"
    try:
        service.start()
        status, answer = Api(service.base_url, key).call(
            "POST", "/queues", {"name": queue, "max_retries": 5}
        )
        assert status == 201, answer
        run = Run(service.base_url, key, queue)
        producers = [
            threading.Thread(target=run.produce, args=(i * TOTAL // 2, TOTAL // 2), daemon=True)
            for i in range(2)
        ]
        workers = [
            threading.Thread(target=run.work, args=(f"w-{i}@restart",), daemon=True)
            for i in range(4)
        ]
        for thread in itertools.chain(producers, workers):
            thread.start()

        finished = FINISHED
        deadline = time.monotonic() + 60
        while count(libpq, finished) < TOTAL // 4:
            assert time.monotonic() < deadline, "a quarter of the tasks did not finish"
            time.sleep(0.1)
        cluster.stop()  # fast shutdown: sessions are cut, transactions in flight abort
        run.outage.set()
        during: list[tuple[int, Any]] = []
        waits: list[float] = []
        probe = Api(service.base_url, key)
        stopped = time.monotonic()
        # A request that finds the pool without a live connection waits for one up to the
        # pool's timeout (settings.DATABASE_POOL_TIMEOUT) before it answers 503: the outage
        # lasts until one answered.
        while time.monotonic() - stopped < OUTAGE_SECONDS or (
            not during and time.monotonic() - stopped < OUTAGE_SECONDS + 30
        ):
            sent = time.monotonic()
            with contextlib.suppress(OSError):
                during.append(probe.call("GET", f"/queues/{queue}/stats", timeout=30))
                waits.append(time.monotonic() - sent)
            time.sleep(0.2)
        cluster.start()
        assert cluster.url_for(DB) == url

        for thread in producers:
            thread.join(timeout=90)
        deadline = time.monotonic() + 90
        while count(libpq, finished) < TOTAL:
            assert time.monotonic() < deadline, (
                f"not all tasks finished: {count(libpq, finished)} of {TOTAL}; "
                f"answers {dict(run.answers)}"
            )
            time.sleep(0.2)
        run.stopping.set()
        for thread in workers:
            thread.join(timeout=40)
        print(f"answers: {dict(sorted(run.answers.items()))}")
        service.assert_running()
    finally:
        service.stop()
        print(service.tails())

    # The outage answered 503 `unavailable`, and only that, without holding the caller
    # much past the pool's timeout (it held them 10 s before).
    assert during, "no request was answered during the outage"
    assert max(waits) < settings.DATABASE_POOL_TIMEOUT + 5, waits
    assert {code for code, _ in during} == {503}, during
    assert all(body["error"]["code"] == "unavailable" for _, body in during), during
    assert all(body["error"]["code"] == "unavailable" for body in run.outage_bodies)
    assert not run.errors, run.errors[:10]
    # Producers and workers met the outage, and rode it out.
    assert run.answers["enqueue 503"] > 0, run.answers
    assert run.answers["claim 503"] + run.answers["ack 503"] > 0, run.answers
    assert not run.duplicates, f"handed out twice: {run.duplicates[:10]}"
    check_tasks(libpq, queue, run, TOTAL, same_handouts=True)
