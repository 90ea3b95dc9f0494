"""Tasks and their event history.

Models hold data, constraints and read queries.  Status is written only by
`tasks.transitions`; see that module for the lifecycle.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models
from django.db.models import Q

from queues.models import MAX_RETRIES_LIMIT, Queue
from taskforge.conf import conf
from taskforge.lib import cron
from taskforge.lib.ids import uuid7
from tasks import lifecycle
from tasks.lifecycle import TaskStatus

__all__ = [
    "Schedule",
    "Task",
    "TaskEvent",
    "TaskName",
    "TaskStatus",
    "lease_ends_at",
    "lease_timeout",
]


def lease_timeout() -> timedelta:
    """How long a lease lasts after the claim or the last heartbeat."""
    return timedelta(seconds=conf.HEARTBEAT_TIMEOUT_SECONDS)


def lease_ends_at(heartbeat_at: datetime) -> datetime:
    """When a lease last extended at `heartbeat_at` runs out."""
    return heartbeat_at + lease_timeout()


class TaskQuerySet(models.QuerySet["Task"]):
    def live(self) -> TaskQuerySet:
        """Tasks not finished for good (lifecycle.LIVE)."""
        return self.filter(status__in=lifecycle.LIVE)

    def cancellable(self) -> TaskQuerySet:
        return self.filter(status__in=lifecycle.CANCELLABLE)

    def lease_expired(self, now: datetime) -> TaskQuerySet:
        """Executing tasks whose worker stopped heartbeating.

        Through task_executing_since_idx: only a task handed out before the
        cutoff can have a heartbeat before it.
        """
        cutoff = now - lease_timeout()
        return self.filter(
            status=TaskStatus.EXECUTING, claimed_at__lt=cutoff, heartbeat_at__lt=cutoff
        )


class Task(models.Model):
    Status = TaskStatus

    # Time-ordered: ties in (priority, scheduled_at) dispatch in creation order.
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="tasks", db_index=False)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=TaskStatus.choices, editable=False)
    priority = models.PositiveSmallIntegerField(default=5)
    scheduled_at = models.DateTimeField()
    claimed_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=200, null=True, blank=True)
    # The API key (ApiKey.pk) that claimed the task: with `claimed_by`, the lease
    # holder (API.md v1.1).  Keys are revoked, never deleted, so no foreign key.
    claimed_key_id = models.BigIntegerField(null=True, blank=True, editable=False)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    max_retries = models.PositiveSmallIntegerField()
    last_error = models.TextField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # When the task entered its current status: the `duration_ms` of the next
    # transition's log line is measured from here.
    status_changed_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # A task of the Cloud Tasks API (API-cloudtasks.md, "Native view"): the task
    # ID given at its creation (tasks.names keeps it unique while taken), its
    # HTTP target ({"url", "http_method", "headers", "body" (base64 or null),
    # "oidc_token", "dispatch_deadline_seconds"}), its own retry policy
    # (queues.retrypolicy's form plus "max_attempts"), and what its attempts
    # got (tasks.httpattempts).  All NULL for a native task.
    name = models.CharField(max_length=500, null=True, blank=True)
    http_request = models.JSONField(null=True, blank=True)
    retry_config = models.JSONField(null=True, blank=True)
    http_attempts = models.JSONField(null=True, blank=True)
    # When attempt 1 was handed out (Cloud Tasks' firstAttempt.dispatchTime, which
    # maxRetryDuration counts from); cleared by a replay.
    first_claimed_at = models.DateTimeField(null=True, blank=True)
    # The W3C Trace Context the enqueue carried (API.md "Tracing (v1.2)"), as
    # `taskforge.tracing.context_of` kept it; NULL without a valid traceparent.
    traceparent = models.TextField(null=True, blank=True)
    tracestate = models.TextField(null=True, blank=True)
    # The task's fairness key (API.md "Fairness keys (v1.2)"): NULL for the
    # anonymous key.  Its queue hands out by key (tasks.buffer).
    fairness_key = models.CharField(max_length=200, null=True, blank=True)

    objects = TaskQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=TaskStatus.values), name="task_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=1, priority__lte=10), name="task_priority_range"
            ),
            models.CheckConstraint(
                condition=Q(max_retries__gte=0, max_retries__lte=MAX_RETRIES_LIMIT),
                name="task_max_retries_range",
            ),
            models.UniqueConstraint(
                fields=["queue", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="task_idempotency_key_per_queue",
            ),
        ]
        indexes = [
            # Used by the dispatcher's SKIP LOCKED select of due pending tasks;
            # keep in sync with its ORDER BY (priority, scheduled_at, id).  Tasks
            # without a fairness key only: a keyed backlog never lies in the way.
            models.Index(
                fields=["queue", "priority", "scheduled_at", "id"],
                name="task_pending_due_idx",
                condition=Q(status="pending", fairness_key__isnull=True),
            ),
            # The same for tasks with a fairness key, per key (tasks.sql.BUFFER_DUE_KEYS),
            # and the keys with pending tasks (tasks.sql.PENDING_KEYS, a skip scan).
            # Anonymous tasks get no entry: they pay nothing for it.
            models.Index(
                fields=["queue", "fairness_key", "priority", "scheduled_at", "id"],
                name="task_pending_key_idx",
                condition=Q(status="pending", fairness_key__isnull=False),
            ),
            # Used by the scheduler to find delayed pending tasks that came due.
            models.Index(
                fields=["scheduled_at"],
                name="task_pending_sched_idx",
                condition=Q(status="pending"),
            ),
            # Used by the scheduler to find retry tasks whose time has come.
            models.Index(
                fields=["scheduled_at"], name="task_retry_due_idx", condition=Q(status="retry")
            ),
            # Used by the watchdog to find expired leases: a lease can have run
            # out only for a task handed out longer ago than the lease timeout
            # (heartbeat_at starts at claimed_at or later and only grows), so
            # the watchdog reads those through this index and checks their
            # heartbeat_at in the row.  Not an index on heartbeat_at itself: a
            # heartbeat, the most frequent write of a running task, then
            # changes no indexed column and Postgres writes it as a HOT update
            # (no new entry in any of the table's indexes).  `claimed_at IS NOT
            # NULL` (true of every executing task) keeps this index to queries
            # that compare claimed_at: under statistics that say few tasks
            # execute, the planner would otherwise read it whole, filtering on
            # the worker, for "what does this worker hold" (task_executing_by_idx).
            models.Index(
                fields=["claimed_at"],
                name="task_executing_since_idx",
                condition=Q(status="executing", claimed_at__isnull=False),
            ),
            # Who holds what now (workers.models: GET /workers, the dashboard's
            # worker states): a worker's executing tasks in one probe.  Through
            # task_claimed_by_idx that walked the worker's whole history, and
            # through an index of all executing tasks, every task of every worker.
            models.Index(
                fields=["claimed_by"],
                name="task_executing_by_idx",
                condition=Q(status="executing"),
            ),
            # Used by the watchdog's retention (tasks.retention): finished tasks by age.
            models.Index(
                fields=["status", "finished_at"],
                name="task_finished_idx",
                condition=Q(status__in=["done", "cancelled", "dead"]),
            ),
            # The DLQ depth of each queue (tasks.stats, the dashboard): dead tasks
            # stay for the DLQ retention, so there can be many; counted from this
            # narrow index, not from task_not_done_idx's wide entries.  Written
            # only when a task dies.
            models.Index(fields=["queue"], name="task_dead_idx", condition=Q(status="dead")),
            # Used by the watchdog's buffer reconcile (claimed for too long).
            models.Index(
                fields=["status_changed_at"],
                name="task_claimed_since_idx",
                condition=Q(status="claimed"),
            ),
            # The task list: newest first, keyset-paginated on (created_at, id).
            # Ascending, read backwards: entries then go in at the index's right
            # end, where a full page splits 90/10, not 50/50 (half the size).
            models.Index(fields=["queue", "created_at", "id"], name="task_queue_created_idx"),
            # Every status but done, by queue: the task list with a status filter
            # (a `done` filter walks task_queue_created_idx, where nearly every
            # row is done) and the live depth of the stats (tasks.stats; with
            # scheduled_at included, counted from the index).  Done rows, the
            # bulk of history, get no entry: an ack writes one entry fewer.
            models.Index(
                fields=["queue", "status", "-created_at", "-id"],
                name="task_not_done_idx",
                include=["scheduled_at"],
                condition=~Q(status="done"),
            ),
            models.Index(
                fields=["claimed_by", "-created_at"],
                name="task_claimed_by_idx",
                condition=Q(claimed_by__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return str(self.id)

    @property
    def lease_expires_at(self) -> datetime | None:
        """When the current lease runs out; None unless the task is executing."""
        if self.status != TaskStatus.EXECUTING or self.heartbeat_at is None:
            return None
        return lease_ends_at(self.heartbeat_at)

    @property
    def is_cancellable(self) -> bool:
        return self.status in lifecycle.CANCELLABLE


class TaskName(models.Model):
    """A named task's ID, taken in its queue (API-cloudtasks.md "Names and de-duplication").

    One row per (queue, name), written in the transaction that creates the task
    (tasks.names), so that any number of API processes create at most one task
    per name: the unique constraint decides.  The row outlives its task: once
    the task finished, the name stays taken for TASKFORGE_CLOUDTASKS_DEDUP_SECONDS
    from its `finished_at`, copied here (`released_at`) when the task row is
    deleted (retention, a DLQ discard), so the memory does not depend on
    retention.  Deleting the queue deletes its names.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.CharField(max_length=500)
    # The task holding the name; not a foreign key: the name outlives it.
    task_id = models.UUIDField()
    # When the task finished, once its row is gone (else read from the task).
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "name"], name="taskname_per_queue"),
        ]
        indexes = [
            # tasks.names.forget: the rows of tasks being deleted.
            models.Index(fields=["task_id"], name="taskname_task_idx"),
        ]

    def __str__(self) -> str:
        return self.name


class TaskEvent(models.Model):
    """One row per status transition of a task, but those other rows record.

    The creation (`from_status` NULL), and for a task its enqueue put into the
    dispatch buffer that move too, are the task row's own record, not rows here.
    An attempt's claim (`claimed` to `executing`) is recorded by the row of its
    outcome (`claimed_at`), and until then by the task row.  tasks.events builds
    the chain from them; tasks moved by earlier versions have these stored.
    """

    id = models.BigAutoField(primary_key=True)
    # No constraints in the database: events are written only by the statement
    # that moves their task (tasks.transitions), with the task's own ids, and
    # a constraint would check (and share-lock) the task and the queue row for
    # every event, four times a task.  Deletes still cascade (Django's).
    task = models.ForeignKey(
        Task,
        on_delete=models.CASCADE,
        related_name="events",
        db_index=False,
        db_constraint=False,
    )
    # Set on the outcomes of attempts only (events from `executing`), so that
    # per-queue throughput and error rate (taskevent_outcome_idx) need no
    # join; every other event finds its queue through its task.  NULL saves
    # 16 bytes on three events of a task's four (docs/operations.md, "Storage").
    queue = models.ForeignKey(
        Queue,
        on_delete=models.CASCADE,
        related_name="+",
        null=True,
        db_index=False,
        db_constraint=False,
    )
    at = models.DateTimeField()
    from_status = models.CharField(max_length=16, null=True, choices=TaskStatus.choices)
    to_status = models.CharField(max_length=16, choices=TaskStatus.choices)
    worker_id = models.CharField(max_length=200, null=True)
    attempt = models.PositiveIntegerField()
    error = models.TextField(null=True)
    # On an attempt's outcome (an event from `executing`): when the attempt was
    # handed out, so that this row is the record of that claim as well (same
    # worker, same attempt): a row, its index entries and an insert fewer per
    # attempt (docs/operations.md, "Storage").  NULL on rows of earlier versions.
    claimed_at = models.DateTimeField(null=True)

    # The event's place in its task's chain, (row id, 0 for the claim half of an
    # outcome row, 1 otherwise): set by tasks.events, the events list's cursor.
    key: tuple[int, int] = (0, 1)

    class Meta:
        indexes = [
            # /tasks/:id/events (a task's few events, sorted after the scan). On the
            # task alone so that B-tree deduplication keeps one entry per task for
            # its events: a third of the size of (task, id) (docs/operations.md).
            models.Index(fields=["task"], name="taskevent_by_task_idx"),
            # Stats: acks and failed attempts per queue over the last minute;
            # only the outcomes of attempts (one event of a task's four).
            models.Index(
                fields=["queue", "at"],
                name="taskevent_outcome_idx",
                condition=Q(from_status="executing"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_id}: {self.from_status} -> {self.to_status}"


class Schedule(models.Model):
    """A cron schedule: enqueues a task into its queue at each fire time.

    `next_run_at` is the next fire time the scheduler has not handled yet; it
    stays put while the schedule is paused or no scheduler runs, so the most
    recent missed time can be enqueued once on resume (`tasks.schedules`).
    What the API shows as the next run is `upcoming_run_at()`.
    """

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # Indexed by schedule_name_per_queue, which starts with it.
    queue = models.ForeignKey(
        Queue, on_delete=models.CASCADE, related_name="schedules", db_index=False
    )
    name = models.CharField(max_length=100)
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64, default="UTC")
    payload = models.JSONField()
    priority = models.PositiveSmallIntegerField(default=5)
    # NULL: the queue's max_retries at each fire.
    max_retries = models.PositiveSmallIntegerField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    next_run_at = models.DateTimeField()
    # The fire time of the last task this schedule enqueued.
    last_run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "name"], name="schedule_name_per_queue"),
            models.CheckConstraint(
                condition=Q(priority__gte=1, priority__lte=10), name="schedule_priority_range"
            ),
            models.CheckConstraint(
                condition=Q(max_retries__isnull=True)
                | Q(max_retries__gte=0, max_retries__lte=MAX_RETRIES_LIMIT),
                name="schedule_max_retries_range",
            ),
        ]
        indexes = [
            # Used by the scheduler (tasks.schedules.fire_due and
            # sql.NEXT_DUE): running schedules by their next fire time.
            models.Index(
                fields=["next_run_at"], name="schedule_due_idx", condition=Q(paused=False)
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def upcoming_run_at(self, now: datetime) -> datetime:
        """The next fire time after `now` as a person reads it, paused or not.

        The stored pointer while it is in the future; once it has passed (the
        schedule is paused, or the scheduler has not run yet), the next time
        the expression names after `now`.
        """
        if self.next_run_at > now:
            return self.next_run_at
        try:
            return cron.next_after(self.cron, cron.parse_timezone(self.timezone), now)
        except cron.CronError:
            # The zone left the system's tz database: show where the pointer
            # is (the scheduler logs why it cannot fire).
            return self.next_run_at
