"""The scheduler: makes tasks whose time has come dispatchable, on time.

Each tick
- promotes due `retry` tasks to `pending` (through `transitions.promote`,
  which notifies the dispatchers), in SKIP LOCKED batches;
- notifies the dispatchers of queues whose delayed `pending` tasks came due
  since its last tick, so they are buffered at once;
- fires the cron schedules that are due (`tasks.schedules.fire_due`).

Between ticks it sleeps until the earliest time it knows something comes due
(`sql.NEXT_DUE`: one query of three index probes), woken earlier by
`NOTIFY taskforge_scheduler` from whatever makes an earlier time due (a
delayed enqueue, a failed attempt, a new or resumed schedule), so a task is
dispatchable within milliseconds of its time.  With nothing due it looks
again every TASKFORGE_SCHEDULER_TICK_SECONDS with that one query, which also
covers a wake-up lost to a broken connection.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from django.db import connection, transaction
from django.utils import timezone

from queues.notify import SCHEDULER_CHANNEL, wake_dispatchers
from taskforge.conf import conf
from taskforge.lib.listen import Listener
from taskforge.lib.loop import SLEEP_SLICE, Loop
from tasks import schedules, sql, transitions
from tasks.models import Task, TaskStatus

S = TaskStatus
BATCH = 500
# Something due that this tick could not take (another scheduler holds it):
# look again this soon rather than at once.
RECHECK = 0.02


class SchedulerLoop(Loop):
    name = "scheduler"

    def __init__(self) -> None:
        super().__init__()
        self._checked_until: datetime | None = None
        # The earliest known time something comes due; None: look at the tick.
        self._next_due: datetime | None = None
        self._listener = Listener(SCHEDULER_CHANNEL, f"taskforge-{self.name}")
        # The earliest time a NOTIFY named that had already passed when it came.
        self._late_since: datetime | None = None

    @property
    def interval(self) -> float:
        return conf.SCHEDULER_TICK_SECONDS

    def tick(self) -> bool:
        """Do whatever is due; True when a batch was full (go again at once)."""
        self._listener.ensure()  # before looking, so a NOTIFY sent meanwhile is not missed
        now = timezone.now()
        due = self.next_due(now)
        retry_at, delayed_at, schedule_at = due
        busy = worked = False
        if retry_at is not None and retry_at <= now:
            busy = self.promote_due_retries(now)
            worked = True
        if self._late_since is not None:
            # A delayed task committed after its own time had passed here.
            # (A millisecond earlier: the NOTIFY's time went through a float.)
            since = self._late_since - timedelta(milliseconds=1)
            self._checked_until = min(self._checked_until or now, since)
            self._late_since = None
            self.announce_due_delayed(now)
        elif delayed_at is not None and delayed_at <= now:
            self.announce_due_delayed(now)
            worked = True
        else:
            self._checked_until = now
        if schedule_at is not None and schedule_at <= now:
            busy = schedules.fire_due(now) == schedules.FIRE_BATCH or busy
            worked = True
        if busy:
            self._next_due = None
            return True
        if worked:
            due = self.next_due(timezone.now())  # what is left after the work
        later = [t for t in due if t is not None]
        self._next_due = min(later) if later else None
        return False

    def next_due(self, now: datetime) -> tuple[datetime | None, datetime | None, datetime | None]:
        """(earliest retry, earliest delayed task not yet announced, earliest schedule)."""
        since = self._checked_until or now - timedelta(seconds=max(self.interval, 1.0) * 2)
        with connection.cursor() as cursor:
            cursor.execute(sql.NEXT_DUE, {"since": since})
            row = cursor.fetchone()
        assert row is not None
        return row[0], row[1], row[2]

    def promote_due_retries(self, now: datetime | None = None) -> bool:
        """retry -> pending for one batch of due tasks; True if the batch was full."""
        now = now or timezone.now()
        with transaction.atomic():
            # Uses task_retry_due_idx.
            tasks = list(
                Task.objects.select_for_update(skip_locked=True, no_key=True, of=("self",))
                .select_related("queue")
                .filter(status=S.RETRY, scheduled_at__lte=now)
                .order_by("scheduled_at")[:BATCH]
            )
            transitions.promote(tasks, now=now)
        return len(tasks) == BATCH

    def announce_due_delayed(self, now: datetime | None = None) -> None:
        """NOTIFY for queues whose delayed pending tasks came due since the last check."""
        now = now or timezone.now()
        since = self._checked_until or now - timedelta(seconds=max(self.interval, 1.0) * 2)
        # Uses task_pending_sched_idx.
        queue_ids = (
            Task.objects.filter(status=S.PENDING, scheduled_at__gt=since, scheduled_at__lte=now)
            .values_list("queue_id", flat=True)
            .distinct()
        )
        wake_dispatchers(queue_ids)
        self._checked_until = now

    def wait(self, seconds: float) -> None:
        """Sleep until the next due time, a NOTIFY of an earlier one, the tick, or a stop."""
        deadline = time.monotonic() + seconds
        if self._next_due is not None:
            left = (self._next_due - timezone.now()).total_seconds()
            deadline = min(deadline, time.monotonic() + max(left, RECHECK))
        try:
            pg = self._listen()
            while not self.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                woken = False
                for notice in pg.notifies(timeout=min(SLEEP_SLICE, left), stop_after=1):
                    deadline = min(deadline, self._on_notice(notice.payload))
                    woken = True
                if woken:
                    # Take whatever else already arrived, without waiting.
                    for notice in pg.notifies(timeout=0.0):
                        deadline = min(deadline, self._on_notice(notice.payload))
        except Exception:
            # The connection broke; the next tick reconnects. Sleep the rest.
            self._listener.reset()
            super().wait(max(0.0, deadline - time.monotonic()))

    def _on_notice(self, payload: str) -> float:
        """The monotonic time to wake for a NOTIFY's due time (Unix seconds)."""
        try:
            at = float(payload)
        except ValueError:
            return time.monotonic()  # not a time: look now
        left = at - time.time()
        if left <= 0:
            due = datetime.fromtimestamp(at, tz=UTC)
            if self._late_since is None or due < self._late_since:
                self._late_since = due
        return time.monotonic() + max(0.0, left)

    def _listen(self) -> psycopg.Connection[Any]:
        return self._listener.connection()
