"""The workload of the outage and failover tests: producers and workers over HTTP
that ride out an outage, what they saw, and the checks against Postgres afterwards.

Producers enqueue in batches, each task with an idempotency key, so a batch
repeated after a 503 (or a connection refused mid-answer) makes no duplicate.
Workers claim and ack.  Every call is repeated through 503s and refused
connections until it is answered; each answer is counted, every 503's body
kept, and anything else than a 2xx, a 409 `lease_lost` or a 503 `unavailable`
is an error.  The service runs against a Postgres of the test's own
(`libpq`), which the checks read directly.
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import psycopg

from tasks.lifecycle import moves_of_row
from tests.service import ROOT, Api

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
# API.md: a 503 at most this long past the request's wait_seconds.
ANSWER_WITHIN = 10.0


def manage(env: dict[str, str], *args: str) -> str:
    """`manage.py <args>` in a process of its own; its stdout."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return done.stdout.strip()


def count(url: str, sql: str) -> int:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


FINISHED = "SELECT count(*) FROM tasks_task WHERE status IN ('done', 'dead')"


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
        self.handout_times: list[float] = []  # monotonic, per claim that got tasks
        self.enqueue_times: list[float] = []  # monotonic, per enqueue answered 2xx
        self.produced = 0  # tasks whose enqueue was answered 2xx (produce_until)
        self.slowest = 0.0  # the longest answer past its wait_seconds
        self.unavailable_times: list[float] = []  # monotonic, per 503

    def call(
        self, what: str, method: str, path: str, body: Any, timeout: float = 30, wait: float = 0
    ) -> tuple[int, Any]:
        """One call, repeated through 503s and refused connections until it is answered."""
        while True:
            sent = time.monotonic()
            try:
                status, answer = self.api.call(method, path, body, timeout=timeout)
            except OSError as exc:
                with self.lock:
                    self.answers[f"{what} {type(exc).__name__}"] += 1
                time.sleep(0.1)
                continue
            with self.lock:
                self.slowest = max(self.slowest, time.monotonic() - sent - wait)
                self.answers[f"{what} {status}"] += 1
                if status == 503:
                    self.outage_bodies.append(answer)
                    self.unavailable_times.append(time.monotonic())
                elif status >= 500 or not isinstance(answer, dict):
                    self.errors.append(f"{what}: {status} {str(answer)[:300]}")
            if status == 503:
                time.sleep(0.1)
                continue
            return status, answer

    def _enqueue(self, numbers: range) -> None:
        tasks = [{"payload": {"n": n}, "idempotency_key": f"task-{n}"} for n in numbers]
        status, answer = self.call(
            "enqueue", "POST", f"/queues/{self.queue}/tasks/batch", {"tasks": tasks}
        )
        if status not in (200, 201):
            self.errors.append(f"enqueue {numbers}: {status} {answer}")
            return
        with self.lock:
            self.enqueue_times.append(time.monotonic())

    def produce(self, first: int, count: int) -> None:
        """Half of its tasks at once, the other half from the start of the outage on."""
        for start in range(first, first + count, 20):
            if start >= first + count // 2:
                self.outage.wait(60)
            self._enqueue(range(start, min(start + 20, first + count)))

    def produce_until(self, done: threading.Event, batch: int = 10, pause: float = 0.2) -> None:
        """Batches of `batch` tasks every `pause` seconds, until `done` (the batch then
        in flight is repeated until answered): `produced` counts them."""
        while not done.is_set():
            self._enqueue(range(self.produced, self.produced + batch))
            self.produced += batch
            time.sleep(pause)

    def work(self, worker_id: str, wait_seconds: float = 0.5) -> None:
        while not self.stopping.is_set():
            body = {
                "worker_id": worker_id,
                "queues": [self.queue],
                "max_tasks": 2,
                "wait_seconds": wait_seconds,
            }
            status, answer = self.call(
                "claim", "POST", "/workers/claim", body, timeout=30, wait=wait_seconds
            )
            if status != 200:
                self.errors.append(f"claim {worker_id}: {status} {answer}")
                continue
            if answer["tasks"]:
                with self.lock:
                    self.handout_times.append(time.monotonic())
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

    def first_handout_after(self, moment: float) -> float | None:
        """Seconds from `moment` (monotonic) to the first claim that got tasks after it."""
        with self.lock:
            later = [t for t in self.handout_times if t > moment]
        return min(later) - moment if later else None

    def unavailable_after(self, moment: float) -> tuple[int, float]:
        """503s answered after `moment`: how many, and the seconds from it to the last."""
        with self.lock:
            later = [t for t in self.unavailable_times if t > moment]
        return len(later), (max(later) - moment if later else 0.0)

    def check_answers(self) -> None:
        """Only 2xx, 409 `lease_lost` and 503 `unavailable`, each JSON; every 503 in time."""
        assert not self.errors, self.errors[:10]
        bad = [b for b in self.outage_bodies if not _is_error(b, "unavailable")]
        assert not bad, bad[:5]
        assert self.slowest < ANSWER_WITHIN, f"an answer {self.slowest:.1f}s past wait_seconds"


class Readiness:
    """GET /readyz once a second, in a thread: what it answered, and when."""

    def __init__(self, base_url: str) -> None:
        self.api = Api(base_url)
        self.seen: list[tuple[float, int, Any]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(1.0):
            with contextlib.suppress(OSError):
                status, body = self.api.call("GET", "/readyz", timeout=10)
                self.seen.append((time.monotonic(), status, body))

    def between(self, start: float, end: float) -> list[tuple[int, Any]]:
        return [(status, body) for at, status, body in self.seen if start <= at <= end]

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=15)


def _is_error(body: Any, code: str) -> bool:
    return isinstance(body, dict) and body.get("error", {}).get("code") == code


def wait_finished(libpq: str, total: int, timeout: float, run: Run) -> None:
    deadline = time.monotonic() + timeout
    while (done := count(libpq, FINISHED)) < total:
        assert time.monotonic() < deadline, (
            f"not all tasks finished: {done} of {total}; answers {dict(run.answers)}"
        )
        time.sleep(0.2)


def check_tasks(libpq: str, queue: str, run: Run, total: int, *, same_handouts: bool) -> None:
    """Every task made once and finished (done or dead), every event chain along the
    lifecycle, no task done twice; with `same_handouts`, the hand-outs and acks in
    the events are exactly the ones the workers received."""
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
    assert sum(statuses.values()) == total, statuses  # none lost, none made twice
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
    # No ack answered 200 that Postgres does not hold.
    missing = {key: w for key, w in run.acked.items() if done.get(key) != w}
    assert not missing, f"acked but not done in Postgres: {list(missing.items())[:10]}"
    if same_handouts:
        assert executing == run.handouts
        assert done == run.acked
