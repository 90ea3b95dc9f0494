"""Cron schedules: creating and changing them, and firing them (the scheduler's part).

A schedule's `next_run_at` is the next fire time not yet handled.  The
scheduler (`fire_due`) takes running schedules whose time has come with
`SELECT ... FOR NO KEY UPDATE SKIP LOCKED`, and in the same transaction
enqueues the task through `tasks.services.enqueue` (idempotency key
`schedule:<id>:<fire time>`) and moves `next_run_at` past now.  Any number of
schedulers can run: a row one of them holds is skipped by the others, a row
it has moved no longer matches, and the key is the backstop: one task per
fire time.

Missed fire times (no scheduler ran, or the schedule was paused, created
paused included) are skipped except the most recent, enqueued once when
scheduling resumes: `next_run_at` stays put while nothing fires it, and the
scheduler that finds it in the past fires the latest time at or before now.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from queues.exceptions import UnknownQueue
from queues.models import Queue, is_queue_name
from queues.notify import wake_scheduler
from taskforge import tracing
from taskforge.audit.log import Actor, record
from taskforge.audit.models import Action
from taskforge.lib import cron
from taskforge.lib.timeutil import isoformat
from tasks import services
from tasks.exceptions import ScheduleExists, UnknownSchedule
from tasks.models import Schedule

logger = logging.getLogger(__name__)

FIRE_BATCH = 100
# A schedule whose firing raised is tried again this much later.
RETRY_FAILED = timedelta(minutes=1)
# What the API may change; `name` is fixed at creation.
CHANGEABLE = frozenset({"cron", "timezone", "payload", "priority", "max_retries", "paused"})


def idempotency_key(schedule: Schedule, fire_at: datetime) -> str:
    """The enqueue's key for one fire time (API.md): one task per fire time."""
    return f"schedule:{schedule.pk}:{isoformat(fire_at)}"


def create_schedule(
    queue: Queue,
    *,
    name: str,
    cron: str,
    payload: Any,
    timezone: str = "UTC",
    priority: int = 5,
    max_retries: int | None = None,
    paused: bool = False,
    actor: Actor,
) -> Schedule:
    """Store a schedule; its first fire is the first time after now (audited).

    Caller contract: `cron` and `timezone` were checked (`taskforge.lib.cron`).

    Raises:
        ScheduleExists: the queue has a schedule of that name.
        UnknownQueue: the queue was deleted meanwhile.
    """
    now = _now()
    schedule = Schedule(
        queue=queue,
        name=name,
        cron=cron,
        timezone=timezone,
        payload=payload,
        priority=priority,
        max_retries=max_retries,
        paused=paused,
        created_at=now,
        updated_at=now,
    )
    schedule.next_run_at = _next_after(schedule, now)
    try:
        with transaction.atomic():
            schedule.save(force_insert=True)
            record(
                actor,
                Action.SCHEDULE_CREATE,
                queue=queue.name,
                target=name,
                details={"cron": cron, "timezone": timezone, "paused": paused},
            )
            if not paused:
                wake_scheduler(schedule.next_run_at)
    except IntegrityError as exc:
        if "schedule_name_per_queue" in str(exc):
            raise ScheduleExists(f"Queue {queue.name!r} has a schedule named {name!r}.") from exc
        raise UnknownQueue() from exc
    return schedule


def get_schedule(queue: Queue, name: str, *, lock: bool = False) -> Schedule:
    """The queue's schedule of that name; `lock` takes its row lock (inside atomic()).

    Raises:
        UnknownSchedule: no such schedule in this queue.
    """
    if not is_queue_name(name):
        raise UnknownSchedule()  # a name no schedule can have (NUL, say) is not looked up
    schedules = Schedule.objects.filter(queue=queue, name=name)
    if lock:
        schedules = schedules.select_for_update(no_key=True)
    schedule = schedules.first()
    if schedule is None:
        raise UnknownSchedule()
    schedule.queue = queue
    return schedule


def update_schedule(queue: Queue, name: str, *, actor: Actor, **fields: Any) -> Schedule:
    """Change a schedule's fields (any of CHANGEABLE); audited when something changed.

    A new `cron` or `timezone` starts afresh: the next fire is the first time
    after now under the new rule.  Pausing keeps `next_run_at`, so a resume
    enqueues the most recent time missed meanwhile, once.

    Raises:
        UnknownSchedule: no such schedule in this queue.
    """
    unknown = set(fields) - CHANGEABLE
    if unknown:
        raise ValueError(f"Not changeable: {sorted(unknown)}")
    with transaction.atomic():
        schedule = get_schedule(queue, name, lock=True)
        now = _now()
        changed = [key for key, value in fields.items() if getattr(schedule, key) != value]
        if changed:
            record(
                actor,
                Action.SCHEDULE_UPDATE,
                queue=queue.name,
                target=name,
                details={
                    "changed": {key: [getattr(schedule, key), fields[key]] for key in changed}
                },
            )
        for key in changed:
            setattr(schedule, key, fields[key])
        if "cron" in changed or "timezone" in changed:
            schedule.next_run_at = _next_after(schedule, now)
            changed.append("next_run_at")
        if changed:
            schedule.updated_at = now
            schedule.save(update_fields=[*changed, "updated_at"])
            if not schedule.paused:
                wake_scheduler(schedule.next_run_at)
    return schedule


def delete_schedule(queue: Queue, name: str, *, actor: Actor) -> None:
    """Delete a schedule (audited).  Raises: UnknownSchedule."""
    with transaction.atomic():
        get_schedule(queue, name, lock=True)
        Schedule.objects.filter(queue=queue, name=name).delete()
        record(actor, Action.SCHEDULE_DELETE, queue=queue.name, target=name)


def set_paused(schedule_ids: list[Any], paused: bool, *, actor: Actor) -> int:
    """Pause or resume schedules by id (the dashboard and admin); returns how many changed.

    Each change is audited as a `schedule.update` of `paused`.
    """
    with transaction.atomic():
        schedules = list(
            Schedule.objects.select_for_update(no_key=True)
            .select_related("queue")
            .filter(pk__in=schedule_ids)
            .exclude(paused=paused)
            .order_by("id")
        )
        now = _now()
        for schedule in schedules:
            schedule.paused = paused
            schedule.updated_at = now
            schedule.save(update_fields=["paused", "updated_at"])
            record(
                actor,
                Action.SCHEDULE_UPDATE,
                queue=schedule.queue.name,
                target=schedule.name,
                details={"changed": {"paused": [not paused, paused]}},
            )
        if schedules and not paused:
            wake_scheduler(min(schedule.next_run_at for schedule in schedules))
    return len(schedules)


def fire_due(now: datetime | None = None, *, limit: int = FIRE_BATCH) -> int:
    """Enqueue one task for each running schedule due at `now`; return how many fired.

    One transaction: lock up to `limit` due schedules (SKIP LOCKED, over
    schedule_due_idx), enqueue their tasks and move each `next_run_at` past
    `now`.  The tasks go to Redis after commit, as any enqueue's do.
    Caller contract: not inside atomic() (the loop calls it on its own).
    """
    now = now or _now()
    with transaction.atomic():
        due = list(
            Schedule.objects.select_for_update(skip_locked=True, no_key=True, of=("self",))
            .select_related("queue")
            .filter(paused=False, next_run_at__lte=now)
            .order_by("next_run_at")[:limit]
        )
        for schedule in due:
            try:
                with transaction.atomic():
                    _fire(schedule, now)
            except DatabaseError:
                raise  # the connection or the transaction is gone: the tick fails
            except Exception as exc:
                # A schedule that cannot fire (its time zone left the system's tz
                # database, say) must not stop the others or crash-loop the
                # scheduler: it tries again later.
                logger.exception(
                    "schedule.fire_failed",
                    extra={
                        "schedule": schedule.name,
                        "queue": schedule.queue.name,
                        "error": repr(exc),
                    },
                )
                Schedule.objects.filter(pk=schedule.pk).update(next_run_at=now + RETRY_FAILED)
    return len(due)


def _fire(schedule: Schedule, now: datetime) -> None:
    """Enqueue the task of the latest fire time at or before `now`; move the pointer on."""
    zone = cron.parse_timezone(schedule.timezone)
    fire_at = schedule.next_run_at
    following = cron.next_after(schedule.cron, zone, fire_at)
    if following <= now:
        # Fire times were missed: only the most recent of them is enqueued.
        fire_at = cron.latest_at_or_before(schedule.cron, zone, now)
        following = cron.next_after(schedule.cron, zone, now)
    spec = services.TaskSpec(
        payload=schedule.payload,
        priority=schedule.priority,
        max_retries=schedule.max_retries,
        idempotency_key=idempotency_key(schedule, fire_at),
        # Each fire's task starts a trace of its own (taskforge.tracing.scheduled).
        traceparent=tracing.scheduled(schedule.queue.name, schedule.name),
    )
    try:
        with transaction.atomic():
            services.enqueue(schedule.queue, [spec])
    except UnknownQueue:
        # The queue is being deleted; its schedules go with it.
        logger.info("schedule.queue_gone", extra={"schedule": str(schedule.pk)})
        return
    Schedule.objects.filter(pk=schedule.pk).update(
        next_run_at=following, last_run_at=fire_at, updated_at=now
    )
    line = {
        "schedule": schedule.name,
        "queue": schedule.queue.name,
        "fire_at": isoformat(fire_at),
        "next_run_at": isoformat(following),
    }
    transaction.on_commit(lambda: logger.info("schedule.fired", extra=line))


def _next_after(schedule: Schedule, now: datetime) -> datetime:
    return cron.next_after(schedule.cron, cron.parse_timezone(schedule.timezone), now)


def _now() -> datetime:
    return timezone.now()
