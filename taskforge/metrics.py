"""The Prometheus metrics of API.md ("Operations"), true across every process.

Counters and the histogram count committed transitions: `tasks.transitions`
calls `on_transitions()` from its on-commit log hook, in whichever process
made the move (a gunicorn worker, the watchdog, the dispatcher...).  Gauges
(queue depth, DLQ depth, heartbeat age) are not counted anywhere: a scrape
reads them from Postgres (`dashboard.metrics.DatabaseGauges`).

Across processes (prometheus_client's multiprocess mode)
---------------------------------------------------------
Every process writes its counters to its own mmap file in one directory per
host and deployment, and a scrape of `/metrics`, in any API process, sums all
the files: those of every API process and every loop, live or dead (so a
total does not drop when a server process is recycled).  django-prometheus's
request metrics are plain counters and histograms, summed the same way.

- The directory needs no setting: by default it is
  `<tmp>/taskforge-metrics-<uid>-<digest>`, the digest naming the deployment
  (its Postgres database and Redis db), so every process of a deployment on a
  host meets there and two deployments on one host do not mix.
  `PROMETHEUS_MULTIPROC_DIR` names another (containers of one host share a
  volume: docker-compose.yml); set but empty, each process counts alone in
  memory (tests, one-process tools).
- Each process holds a shared lock on `<dir>/.lock` while it lives.  The first
  process to start when none holds it (a fresh start: everything was stopped)
  empties the directory first, so totals restart from zero with the service
  and the directory does not grow across restarts.  Counts of processes that
  ended during a run stay in the totals.
- Files are named by host and pid (`counter_<host>-<pid>.db`), not by pid
  alone, so containers that share the directory through a volume (each with
  its own pid 1) never write to the same file.
- A server process that exits drops its live gauges (`process_exited`).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import logging
import operator
import os
import re
import socket
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram, multiprocess
from prometheus_client.registry import Collector

from taskforge.lib import internals

logger = logging.getLogger("taskforge.metrics")

# --- process identity and mode --------------------------------------------------

# The underscore separates parts of prometheus_client's file names; keep it out.
_HOST = re.sub(r"[^A-Za-z0-9.-]+", "-", socket.gethostname()) or "host"


def process_identifier(pid: int | None = None) -> str:
    """This process's (or `pid`'s) name in the multiprocess directory."""
    if pid is not None:
        return f"{_HOST}-{pid}"
    return _named


def _forked() -> None:
    global _named
    _named = process_identifier(os.getpid())


# prometheus_client asks on every write (about 25 a request), to notice a fork;
# the name changes only in a forked child, so none of those asks a syscall.
_named = process_identifier(os.getpid())
os.register_at_fork(after_in_child=_forked)


def default_directory() -> str:
    """This deployment's metrics directory on this host (no setting needed).

    Read from the environment, not Django's settings: gunicorn's master
    imports this module before Django is set up.
    """
    env = os.environ
    database = env.get("DATABASE_URL") or env.get("DATABASE_URL_FILE", "")
    redis_url = env.get("REDIS_URL") or env.get("REDIS_URL_FILE", "")
    digest = hashlib.sha256(f"{database}\0{redis_url}".encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"taskforge-metrics-{os.getuid()}-{digest}")


def join_directory(directory: str) -> int:
    """Create `directory` if need be and take a shared lock on it.

    The first process of a fresh start (no process holds the lock) empties it.
    Returns the descriptor that holds the lock: kept open for the process's
    life (forked children share the lock with their parent).
    """
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # others are running: their counts stay
    else:
        for name in os.listdir(directory):
            if name.endswith(".db"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


_setting = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
MULTIPROC_DIR: str | None = _setting or (None if _setting == "" else default_directory())

_lock_fd: int | None = None
if MULTIPROC_DIR:
    _lock_fd = join_directory(MULTIPROC_DIR)
    # prometheus_client reads the variable when it opens a file; child
    # processes (server workers) inherit it.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = MULTIPROC_DIR
    # Must happen before any metric value exists in this process:
    # taskforge.api's AppConfig.ready() imports this module, which runs before
    # Django builds its middleware (django-prometheus's metrics) and before
    # any transition.
    internals.count_in_files(process_identifier)
else:
    # Set but empty: count in memory (prometheus_client would write files
    # into the working directory).
    internals.count_in_memory()

# --- counted metrics -------------------------------------------------------------

# Claim (hand-out to a worker) to ack: from a few ms to the longest a task may run.
DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)

TASKS_ENQUEUED = Counter(
    "taskforge_tasks_enqueued_total", "Tasks created (enqueued), by queue.", ["queue"]
)
TASKS_COMPLETED = Counter(
    "taskforge_tasks_completed_total",
    "Tasks that finished as done (acked) or dead (out of attempts), by queue.",
    ["queue", "status"],
)
TASKS_DISPATCHED = Counter(
    "taskforge_tasks_dispatched_total",
    "Attempts handed out (to a worker's claim or a push process), by queue.",
    ["queue"],
)
EXECUTION_DURATION = Histogram(
    "taskforge_task_execution_duration_seconds",
    "Time from claim to ack of acked attempts, by queue.",
    ["queue"],
    buckets=DURATION_BUCKETS,
)


PUSH_REQUESTS = Counter(
    "taskforge_push_requests_total",
    "Push delivery requests (run_pusher), by queue and outcome: success (2xx), "
    "http_error (another status), timeout, connection_error, tls_error.",
    ["queue", "outcome"],
)
PUSH_DURATION = Histogram(
    "taskforge_push_request_duration_seconds",
    "Time from sending a push request to its answer (or failure), by queue.",
    ["queue"],
    buckets=DURATION_BUCKETS,
)


def on_push(queue: str, outcome: str, seconds: float) -> None:
    """Count one push request that ended (workers.pusher); never raises."""
    try:
        PUSH_REQUESTS.labels(queue=queue, outcome=outcome).inc()
        PUSH_DURATION.labels(queue=queue).observe(seconds)
    except Exception:
        logger.exception("metrics.count_failed", extra={"transition": "push"})


class _Children(dict[str, Any]):
    """queue name -> the metric's child for that queue, resolved once per process.

    `.labels()` takes a lock and builds a key on every call; the hot path
    (acks, batch enqueues) looks the child up in a plain dict instead.
    """

    def __init__(self, metric: Any, **labels: str) -> None:
        super().__init__()
        self._metric = metric
        self._labels = labels

    def __missing__(self, queue: str) -> Any:
        # Two threads may race here; both get the same child from `.labels()`.
        child = self[queue] = self._metric.labels(queue=queue, **self._labels)
        return child


_enqueued = _Children(TASKS_ENQUEUED)
_dispatched = _Children(TASKS_DISPATCHED)
_done = _Children(TASKS_COMPLETED, status="done")
_dead = _Children(TASKS_COMPLETED, status="dead")
_duration = _Children(EXECUTION_DURATION)


def on_transitions(event: str, lines: Sequence[Mapping[str, Any]]) -> None:
    """Count the transitions of one committed call of `tasks.transitions`.

    `lines` are its log lines (API.md fields), all with the same `to_status`:
    a creation (`task.created`, from null) counts as enqueued, a hand-out (to
    executing) as dispatched, a move to done (`task.acked`) as completed/done
    with its `duration_ms` (claim to ack) in the histogram, a move to dead
    (`task.dead_lettered`) as completed/dead.  Every other move costs two
    lookups.

    Runs in an on-commit callback: it logs instead of raising, since an error
    here would turn a committed ack into a failed request.
    """
    if not lines:
        return
    first = lines[0]
    to_status = first["to_status"]
    try:
        if first["from_status"] is None:
            _inc_by_queue(_enqueued, lines)
        elif to_status == "executing":
            _inc_by_queue(_dispatched, lines)
        elif to_status == "done":
            _inc_by_queue(_done, lines)
            _observe_durations(lines)
        elif to_status == "dead":
            _inc_by_queue(_dead, lines)
    except Exception:
        logger.exception("metrics.count_failed", extra={"transition": event})


def _observe_durations(lines: Sequence[Mapping[str, Any]]) -> None:
    by_queue: dict[str, list[float]] = collections.defaultdict(list)
    for line in lines:
        if line["duration_ms"] is not None:
            by_queue[line["queue"]].append(line["duration_ms"] / 1000)
    for queue, seconds in by_queue.items():
        internals.observe_many(_duration[queue], seconds)


_queue_of = operator.itemgetter("queue")


def _inc_by_queue(children: _Children, lines: Sequence[Mapping[str, Any]]) -> None:
    # One write per queue, not per task: a batch enqueue has up to 1000 lines.
    if len(lines) == 1:
        children[lines[0]["queue"]].inc()
        return
    for queue, count in collections.Counter(map(_queue_of, lines)).items():
        children[queue].inc(count)


def process_exited(pid: int) -> None:
    """Drop the live-gauge files of a server process that exited.

    Counter and histogram files stay: their counts are part of the totals.
    """
    if MULTIPROC_DIR:
        multiprocess.mark_process_dead(process_identifier(pid), MULTIPROC_DIR)


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook (gunicorn.conf.py): a worker exited."""
    process_exited(worker.pid)


def counted_collector() -> Collector:
    """The counters and histograms a `/metrics` answer shows.

    Multiprocess mode reads every process's files (and not this process's
    default registry, which would count this worker twice); otherwise this
    process's default registry (with the process_* and python_* metrics).
    The gauges read from the database at scrape time are the dashboard's
    (`dashboard.metrics`).
    """
    if MULTIPROC_DIR:
        return multiprocess.MultiProcessCollector(None, path=MULTIPROC_DIR)
    return REGISTRY
