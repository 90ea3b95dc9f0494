"""`Worker`: runs a handler for each task claimed from TaskForge queues.

A worker long-polls `/workers/claim` for as many tasks as it has free slots, runs the
handler for each in a pool of `concurrency` threads, heartbeats the running tasks whose
lease is due for it (one `heartbeat/batch` call for all of them), acks with the handler's
return value (through `ack/batch`) and nacks with the exception's text. `Permanent` skips
the retries; `RetryAfter(seconds)` picks the delay.

On SIGTERM or SIGINT it stops claiming, lets running handlers finish within
`grace_seconds`, nacks (for a retry) those still running after that, and returns. Network
errors and 503s (a TaskForge restart) are logged and retried with backoff.

Run it from a shell::

    python -m taskforge_client.worker mymodule:handle --queue emails --concurrency 4 \\
        --url http://localhost:8080 --api-key $KEY
"""

from __future__ import annotations

import json
import logging
import os
import queue as queue_module
import random
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from taskforge_client.batching import AckBatcher, GaveUp, through_outages
from taskforge_client.client import TaskForge
from taskforge_client.errors import (
    ConnectionFailed,
    LeaseLost,
    NotFound,
    ServerError,
    TaskForgeError,
)
from taskforge_client.models import BatchResult, Task
from taskforge_client.tracing import process_span

log = logging.getLogger("taskforge_client.worker")

Handler = Callable[[Task], Any]


class Permanent(Exception):
    """Raise from a handler to fail the task without retries (it goes to the DLQ)."""


class RetryAfter(Exception):
    """Raise from a handler to retry the task after `seconds` instead of the backoff."""

    def __init__(self, seconds: float, message: str = "") -> None:
        super().__init__(message or f"retry after {seconds}s")
        self.seconds = max(0.0, min(float(seconds), 86400.0))


@dataclass
class _Running:
    task: Task
    started: float
    lost: bool = False  # lease lost or given up: the outcome is not reported
    # The handler has returned: the ack or nack is decided (and being sent).
    finishing: bool = False
    lease_seconds: float | None = None
    # When its lease was last extended (claimed, or a heartbeat sent), time.monotonic().
    beat_at: float = field(default_factory=time.monotonic)


def _default_worker_id() -> str:
    return f"{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _lease_seconds(task: Task) -> float | None:
    start = task.heartbeat_at or task.claimed_at
    if task.lease_expires_at is None or start is None:
        return None
    return max(0.1, (task.lease_expires_at - start).total_seconds())


def _error_text(exc: BaseException) -> str:
    head = f"{type(exc).__name__}: {exc}"
    trace = "".join(traceback.format_exception(exc))
    text = f"{head}\n\n{trace}"
    if len(text) > 10000:
        text = text[:4000] + "\n...\n" + text[-5900:]
    return text


class Worker:
    """Claims tasks from `queues` and runs `handler(task)` for each.

    Args:
        url, api_key: the server and a key of the `worker` (or `admin`) role.
        queues: names of 1..20 queues, claimed from in this order.
        handler: called with the `Task`; its return value (JSON-serializable) is the result.
        concurrency: handlers running at once (threads).
        worker_id: this worker's name (default: host:pid:random).
        grace_seconds: after a stop request, how long running handlers may take.
        heartbeat_interval: seconds between two heartbeats of a task; shortened to a third
            of the lease the server grants when that is shorter.  A task is heartbeated
            only once it is due, in one `heartbeat/batch` call with the others due then.
        wait_seconds: the claim long-poll (0..30).
        ack_linger: how long an ack waits for others to go in the same `ack/batch` call.
            The slot is free meanwhile: the next claim does not wait for the ack.
        claim_linger: when a slot frees while other handlers still run, how long the
            next claim waits for them to return too, so that one claim fills several
            slots (short tasks finish together; a claim costs the server the same
            for one task as for many).
        client: a `TaskForge` to use instead of one built from url and api_key.
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        queues: list[str],
        handler: Handler,
        concurrency: int = 1,
        worker_id: str | None = None,
        grace_seconds: float = 30.0,
        heartbeat_interval: float = 10.0,
        wait_seconds: float = 30.0,
        ack_linger: float = 0.005,
        claim_linger: float = 0.002,
        client: TaskForge | None = None,
    ) -> None:
        if not queues:
            raise ValueError("give at least one queue")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.queues = list(queues)
        self.handler = handler
        self.concurrency = concurrency
        self.worker_id = worker_id or _default_worker_id()
        self.grace_seconds = grace_seconds
        self.heartbeat_interval = heartbeat_interval
        self.wait_seconds = max(0.0, min(30.0, wait_seconds))
        self.ack_linger = ack_linger
        self.claim_linger = max(0.0, claim_linger)
        self.client = client or TaskForge(url, api_key, maxsize=concurrency + 2)
        self._stop = threading.Event()
        self._signalled: int | None = None  # set by the signal handler, read by run()
        self._lock = threading.Lock()
        self._slots = threading.Condition(self._lock)
        # Claimed tasks until their outcome is answered (heartbeats and the drain
        # read it); `_busy` counts those whose handler has not returned yet: the
        # slots.  An ack goes out without holding its slot, so the next claim
        # overlaps it; at most `concurrency` acks are awaited at once.
        self._running: dict[str, _Running] = {}
        self._busy = 0
        self._inbox: queue_module.Queue[_Running | None] = queue_module.Queue()
        self._threads: list[threading.Thread] = []
        self.processed = 0
        self.failed = 0

    # -- public --

    def stop(self) -> None:
        """Ask the worker to stop claiming and drain (what SIGTERM does)."""
        if not self._stop.is_set():
            log.info("worker %s stopping", self.worker_id)
        self._stop.set()
        with self._slots:
            self._slots.notify_all()

    @property
    def running_tasks(self) -> list[str]:
        """Ids of tasks whose handler is running."""
        with self._lock:
            return list(self._running)

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Run until `stop()` or SIGTERM/SIGINT, then drain within the grace period."""
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, self._on_signal)
        log.info(
            "worker %s started: queues=%s concurrency=%d",
            self.worker_id,
            self.queues,
            self.concurrency,
        )
        # Acks of tasks that finish within a few milliseconds go as one ack/batch call.
        self._acks = AckBatcher(self.client, self.worker_id, linger=self.ack_linger)
        for n in range(self.concurrency):
            self._spawn(self._execute_loop, f"taskforge-exec-{n}")
        self._spawn(self._heartbeat_loop, "taskforge-heartbeat")
        claimer = self._spawn(self._claim_loop, "taskforge-claim")
        while not self._stop.is_set():
            if self._signalled is not None:
                log.info("worker %s got %s", self.worker_id, signal.Signals(self._signalled).name)
                self.stop()
                break
            time.sleep(0.1)
        self._drain(claimer)

    # -- loops --

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # A flag only: the main thread acts on it within 0.1 s.  Event.set() or a
        # log call here could wait for a lock the interrupted main thread holds
        # (neither is reentrant), and the process would hang on SIGTERM.
        self._signalled = signum

    def _claim_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            with self._slots:
                while self._free() <= 0 and not self._stop.is_set():
                    self._slots.wait(1.0)
                deadline = time.monotonic() + self.claim_linger
                while self._busy and not self._stop.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._slots.wait(left)
                free = self._free()
            if self._stop.is_set():
                return
            try:
                tasks = self.client.claim(
                    self.worker_id,
                    self.queues,
                    max_tasks=min(free, 100),
                    wait_seconds=self.wait_seconds,
                )
                failures = 0
            except (ConnectionFailed, ServerError) as exc:
                failures += 1
                delay = random.uniform(0.5, 1.0)  # nosec B311
                log.warning("claim failed (%s); retrying in %.1fs", exc, delay)
                self._stop.wait(delay)
                continue
            except NotFound as exc:
                log.error("claim: %s; retrying in 5s (create the queue?)", exc)
                self._stop.wait(5.0)
                continue
            except TaskForgeError as exc:
                log.error("claim refused (%s); retrying in 5s", exc)
                self._stop.wait(5.0)
                continue
            if self._stop.is_set() and tasks:
                for task in tasks:
                    run = _Running(task, time.monotonic())
                    self._nack(run, "worker stopping: task handed back unstarted", retry_after=0)
                return
            if not tasks:
                continue
            runs = [_Running(t, time.monotonic(), lease_seconds=_lease_seconds(t)) for t in tasks]
            with self._lock:
                for run in runs:
                    self._running[run.task.id] = run
                self._busy += len(runs)
            if log.isEnabledFor(logging.INFO):
                log.info(
                    "claimed %d tasks: %s",
                    len(tasks),
                    ", ".join(f"{t.id} ({t.queue}, attempt {t.attempts})" for t in tasks),
                )
            for run in runs:
                self._inbox.put(run)

    def _free(self) -> int:
        """Slots to claim for (caller holds the lock)."""
        return min(self.concurrency - self._busy, 2 * self.concurrency - len(self._running))

    def _execute_loop(self) -> None:
        while True:
            run = self._inbox.get()
            if run is None:
                return
            acking = False
            try:
                acking = self._execute(run)
            finally:
                with self._slots:
                    # The claim loop waits for a free slot, then (claim_linger) for
                    # the other handlers to return: wake it for those only.
                    full = self._free() <= 0
                    self._busy -= 1
                    if full or not self._busy:
                        self._slots.notify_all()
                if not acking:
                    self._finished(run)

    def _finished(self, run: _Running) -> None:
        """The task's outcome is answered (or given up): it leaves the worker."""
        with self._slots:
            full = self._free() <= 0
            self._running.pop(run.task.id, None)
            # Waiting on it: a claim loop out of slots, or the drain.
            if full or self._stop.is_set():
                self._slots.notify_all()

    def _execute(self, run: _Running) -> bool:
        """Run the handler and report its outcome; True when an ack is on its way."""
        task = run.task
        try:
            with process_span(
                task.queue, task.id, task.attempts, task.traceparent, task.tracestate
            ):
                result = self.handler(task)
            if result is not None:
                json.dumps(result)  # refuse a result the API could not store, as a failure
        except Permanent as exc:
            run.finishing = True
            self._nack(run, _error_text(exc), retry=False)
        except RetryAfter as exc:
            run.finishing = True
            self._nack(run, _error_text(exc), retry_after=exc.seconds)
        except Exception as exc:
            run.finishing = True
            log.warning("task %s failed: %s: %s", task.id, type(exc).__name__, exc)
            self._nack(run, _error_text(exc))
        else:
            run.finishing = True
            return self._ack(run, result)
        return False

    def _report(self, run: _Running, what: str, call: Callable[[], Any]) -> bool:
        """Send a nack, retrying network errors for up to a minute (`through_outages`)."""
        task_id = run.task.id
        try:
            through_outages(call, what=f"task {task_id}: {what}", give_up=lambda: run.lost)
            return True
        except GaveUp:
            log.warning("task %s: lease given up; %s not sent", task_id, what)
        except LeaseLost as exc:
            log.warning("task %s: lease lost, %s dropped (%s)", task_id, what, exc.message)
        except (ConnectionFailed, ServerError) as exc:
            log.error("task %s: %s not delivered (%s); giving up", task_id, what, exc)
        except TaskForgeError as exc:
            log.error("task %s: %s refused: %s", task_id, what, exc)
        return False

    def _ack(self, run: _Running, result: Any) -> bool:
        """Hand the ack to the batcher (retried through network trouble for a minute)
        without waiting for it; True when it was handed over (`_acked` finishes it)."""
        task = run.task
        if run.lost:
            log.warning("task %s: lease given up; ack not sent", task.id)
            return False
        try:
            future = self._acks.ack_nowait(task.id, task.attempts, result)
        except RuntimeError:  # the batcher closed: the worker is stopping
            log.error("task %s: ack not sent (worker stopped)", task.id)
            return False
        future.add_done_callback(lambda done: self._acked(run, done))
        return True

    def _acked(self, run: _Running, done: Future[BatchResult]) -> None:
        task = run.task
        try:
            answer = done.result()
        except TaskForgeError as exc:
            log.error("task %s: ack not delivered (%s); giving up", task.id, exc)
            self._finished(run)
            return
        except BaseException:
            log.exception("task %s: ack failed", task.id)
            self._finished(run)
            return
        self._finished(run)
        if answer.ok:
            self.processed += 1
            log.info("task %s done in %.3fs", task.id, time.monotonic() - run.started)
        elif answer.error_code == "lease_lost":
            log.warning("task %s: lease lost, ack dropped (%s)", task.id, answer.error_message)
        else:
            log.error("task %s: ack refused: %s", task.id, answer.error_code)

    def _nack(
        self, run: _Running, error: str, *, retry: bool = True, retry_after: float | None = None
    ) -> None:
        task = run.task
        if self._report(
            run,
            "nack",
            lambda: self.client.nack(
                self.worker_id,
                task.id,
                error,
                attempt=task.attempts,
                retry=retry,
                retry_after_seconds=retry_after,
            ),
        ):
            self.failed += 1
            log.info("task %s nacked (retry=%s)", task.id, retry)

    def _interval(self, run: _Running) -> float:
        """Seconds between two heartbeats of this task: `heartbeat_interval`, or a third
        of its lease when that is shorter."""
        if not run.lease_seconds:
            return self.heartbeat_interval
        return max(0.1, min(self.heartbeat_interval, run.lease_seconds / 3))

    def _heartbeat_loop(self) -> None:
        while True:
            time.sleep(0.1)
            self._heartbeat_round()

    def _heartbeat_round(self) -> None:
        """Extend the leases that are due, 100 a call; nothing when none is.

        A task is due once its interval has passed since its lease was last extended.
        A call that goes out also takes the tasks past half their interval, so that
        tasks claimed together go on being heartbeated together, not one call each.
        A task whose handler has returned is left out: its ack or nack is on its way,
        and a heartbeat that crosses it (answered `lease_lost`, the task being done
        already) says nothing about the outcome.
        """
        now = time.monotonic()
        with self._lock:
            live = [r for r in self._running.values() if not r.lost and not r.finishing]
        ages = [(run, (now - run.beat_at) / self._interval(run)) for run in live]
        if not any(age >= 1 for _, age in ages):
            return
        runs = [run for run, age in ages if age >= 0.5]
        for start in range(0, len(runs), 100):
            chunk = runs[start : start + 100]
            try:
                results = self.client.heartbeat_batch(
                    self.worker_id, [(r.task.id, r.task.attempts) for r in chunk]
                )
            except TaskForgeError as exc:
                log.warning("heartbeat of %d tasks failed: %s", len(chunk), exc)
                continue
            for run, res in zip(chunk, results, strict=False):
                if res.ok:
                    run.beat_at = now
                    continue
                if run.finishing:
                    continue  # the handler returned while this call was out
                if res.error_code == "lease_lost":
                    run.lost = True
                    log.warning(
                        "task %s: lease lost (%s); its outcome will be dropped",
                        run.task.id,
                        res.error_message,
                    )
                else:
                    log.warning("task %s: heartbeat refused: %s", run.task.id, res.error_code)

    # -- shutdown --

    def _drain(self, claimer: threading.Thread) -> None:
        deadline = time.monotonic() + self.grace_seconds
        # A long poll still in flight is not waited for (that could take 30 s): tasks it
        # hands out after the stop are nacked at once by the claim loop when it returns
        # before the process exits, else their leases expire and they are retried.
        with self._slots:
            while self._running and time.monotonic() < deadline:
                self._slots.wait(max(0.01, min(0.5, deadline - time.monotonic())))
            # Handlers still running (an ack already on its way is the batcher's).
            left = [r for r in self._running.values() if not r.finishing]
        for run in left:
            log.warning(
                "task %s still running after %.1fs grace; nacking", run.task.id, self.grace_seconds
            )
            self._nack(run, "worker shut down before the handler finished", retry_after=0)
            run.lost = True
        for _ in range(self.concurrency):
            self._inbox.put(None)
        self._acks.close()
        self.client.close()
        log.info(
            "worker %s stopped: %d done, %d failed, %d abandoned",
            self.worker_id,
            self.processed,
            self.failed,
            len(left),
        )
