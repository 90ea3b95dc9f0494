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
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from devservices.postgres import Postgres
from tasks.lifecycle import moves_of_row
from tests.service import ROOT, Api, Service

pytestmark = [pytest.mark.postgres]

DB = "taskforge_restart"
LIFECYCLE: dict[str | None, set[str]] = {
    None: {"pending"},
    "pending": {"claimed", "cancelled"},
    "claimed": {"executing", "pending", "cancelled"},
    "executing": {"done", "retry", "dead"},
    "retry": {"pending", "cancelled"},
    "dead": {"pending"},
    "done": set(),
    "cancelled": set(),
}
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


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


class Run:
    """Producers and workers over HTTP that retry through an outage, and what they saw."""

    def __init__(self, base_url: str, key: str, queue: str) -> None:
        self.api = Api(base_url, key)
        self.queue = queue
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.outage = threading.Event()
        self.handouts: dict[tuple[str, int], str] = {}
        self.duplicates: list[tuple[str, int]] = []
        self.acked: dict[tuple[str, int], str] = {}
        self.answers: Counter[str] = Counter()
        self.outage_bodies: list[Any] = []
        self.errors: list[str] = []

    def call(self, what: str, method: str, path: str, body: Any, timeout: float = 30) -> Any:
        """One call, repeated through 503s and refused connections until it is answered."""
        while True:
            try:
                status, answer = self.api.call(method, path, body, timeout=timeout)
            except OSError as exc:
                with self.lock:
                    self.answers[f"{what} {type(exc).__name__}"] += 1
                time.sleep(0.1)
                continue
            with self.lock:
                self.answers[f"{what} {status}"] += 1
                if status == 503:
                    self.outage_bodies.append(answer)
            if status == 503:
                time.sleep(0.1)
                continue
            return status, answer

    def produce(self, first: int, count: int) -> None:
        """Half of its tasks at once, the other half from the start of the outage on."""
        for start in range(first, first + count, 20):
            if start >= first + count // 2:
                self.outage.wait(60)
            tasks = [
                {"payload": {"n": n}, "idempotency_key": f"task-{n}"}
                for n in range(start, min(start + 20, first + count))
            ]
            status, answer = self.call(
                "enqueue", "POST", f"/queues/{self.queue}/tasks/batch", {"tasks": tasks}
            )
            if status not in (200, 201):
                self.errors.append(f"enqueue {start}: {status} {answer}")

    def work(self, worker_id: str) -> None:
        while not self.stopping.is_set():
            body = {
                "worker_id": worker_id,
                "queues": [self.queue],
                "max_tasks": 2,
                "wait_seconds": 0.5,
            }
            status, answer = self.call("claim", "POST", "/workers/claim", body, timeout=30)
            if status != 200:
                self.errors.append(f"claim {worker_id}: {status} {answer}")
                continue
            for task in answer["tasks"]:
                key = (task["id"], task["attempts"])
                with self.lock:
                    if key in self.handouts:
                        self.duplicates.append(key)
                    self.handouts[key] = worker_id
                time.sleep(0.01)
                ack = {"worker_id": worker_id, "task_id": task["id"], "attempt": task["attempts"]}
                status, answer = self.call("ack", "POST", "/workers/ack", ack)
                if status == 200:
                    with self.lock:
                        self.acked[key] = worker_id
                elif status != 409:
                    self.errors.append(f"ack {key} by {worker_id}: {status} {answer}")


def _count(url: str, sql: str) -> int:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


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
    _manage(env, "migrate", "--noinput", "-v", "0")
    key = _manage(env, "createapikey", "restart-admin", "--role", "admin")
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

        finished = "SELECT count(*) FROM tasks_task WHERE status IN ('done', 'dead')"
        deadline = time.monotonic() + 60
        while _count(libpq, finished) < TOTAL // 4:
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
        while _count(libpq, finished) < TOTAL:
            assert time.monotonic() < deadline, (
                f"not all tasks finished: {_count(libpq, finished)} of {TOTAL}; "
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
    with psycopg.connect(libpq, connect_timeout=5) as conn:
        statuses: dict[str, int] = dict(
            conn.execute(
                "SELECT status, count(*) FROM tasks_task t JOIN queues_queue q ON q.id = t.queue_id"
                " WHERE q.name = %s GROUP BY status",
                [queue],
            ).fetchall()
        )
        events = conn.execute(
            "SELECT e.task_id::text, e.from_status, e.to_status, e.worker_id, e.attempt,"
            " e.claimed_at IS NOT NULL FROM tasks_taskevent e ORDER BY e.task_id, e.id"
        ).fetchall()
    assert sum(statuses.values()) == TOTAL, statuses  # none lost, none made twice
    assert set(statuses) <= {"done", "dead"}, statuses
    stored: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for task_id, frm, to, worker, attempt, records_claim in events:
        if records_claim:  # an attempt's outcome records its hand-out (tasks.events)
            stored[task_id].append(("claimed", "executing", worker, attempt))
        stored[task_id].append((frm, to, worker, attempt))
    chains = {  # with the moves the task row records (tasks.events)
        task_id: [(*move, None, 0) for move in moves_of_row("done", rows[0][:2])] + rows
        for task_id, rows in stored.items()
    }
    executing: dict[tuple[str, int], str] = {}
    done: dict[tuple[str, int], str] = {}
    for task_id, chain in chains.items():
        assert chain[0][:2] == (None, "pending"), (task_id, chain)
        for (_, previous, *_), (frm, to, worker, attempt) in itertools.pairwise(chain):
            assert frm == previous and to in LIFECYCLE[frm], (task_id, chain)
            if to == "executing":
                executing[(task_id, attempt)] = worker
            if to == "done":
                done[(task_id, attempt)] = worker
    assert executing == run.handouts
    assert done == run.acked
