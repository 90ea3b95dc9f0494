"""A small, realistic world for browser tests and screenshots.

Every task is made the way TaskForge makes them (created, then walked through
`tasks.transitions` by the factory), so events, DLQ entries and stats are real.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from queues.models import Queue
from queues.tests.factories import QueueFactory
from tasks import transitions
from tasks.models import Task
from tasks.tests.factories import TaskFactory
from workers import heartbeats, protocol
from workers.models import Worker


def _executing(queue: Queue, worker_id: str, payload: Any, *, seconds_ago: float = 0) -> Task:
    """A task running on `worker_id` since `seconds_ago`, heartbeating every 10 s."""
    now = timezone.now()
    start = now - timedelta(seconds=seconds_ago)
    enqueued = start - timedelta(seconds=2.5)
    new = transitions.NewTask(queue, payload, 5, enqueued, queue.max_retries)
    with transaction.atomic():
        [task] = transitions.create([new], now=enqueued, buffer=True)
        [task] = transitions.hand_out([str(task.pk)], worker_id=worker_id, now=start)
    beat = start + timedelta(seconds=10.2)
    while beat < now:
        heartbeats.record([task.pk], beat)
        beat += timedelta(seconds=10.05)
    if seconds_ago:
        protocol.heartbeat(worker_id, [protocol.Item(str(task.pk))])
        task.refresh_from_db()
    return task


def _dead(queue: Queue, error: str, payload: Any) -> Task:
    task = TaskFactory(queue=queue, status="executing", payload=payload, worker_id="img-worker-2")
    with transaction.atomic():
        transitions.fail(task, error=error, retry=False)
    return task


def build() -> dict[str, Any]:
    now = timezone.now()
    emails = QueueFactory(name="emails", max_retries=5)
    payments = QueueFactory(name="payments", max_retries=3)
    thumbnails = QueueFactory(name="thumbnails")
    webhooks = QueueFactory(name="webhooks", paused=True)
    QueueFactory(name="reports")

    # emails: healthy and busy.
    for n in range(48):
        TaskFactory(queue=emails, status="done", payload={"to": f"user{n}@example.com"})
    for n in range(6):
        TaskFactory(queue=emails, payload={"to": f"new{n}@example.com", "template": "welcome"})
    # payments: most attempts fail right now, and some tasks died.
    for n in range(7):
        TaskFactory(queue=payments, status="retry", payload={"invoice": 9000 + n})
    for n in range(3):
        TaskFactory(queue=payments, status="done", payload={"invoice": 8000 + n})
    error = (
        "stripe.error.APIConnectionError: Could not connect to Stripe (api.stripe.com). "
        "Connection timed out after 10000 ms.\n"
        'Traceback (most recent call last):\n  File "billing/tasks.py", line 88, in charge\n'
        "    stripe.PaymentIntent.confirm(intent_id)\n"
    )
    dead = [
        _dead(payments, error, {"invoice": 7001 + n, "customer": f"cus_{n:04d}", "amount": 4900})
        for n in range(3)
    ]
    # thumbnails: work waits for minutes.
    for n in range(12):
        TaskFactory(
            queue=thumbnails,
            payload={"image": f"s3://uploads/{n}.jpg", "sizes": [64, 256, 1024]},
            scheduled_at=now - timedelta(minutes=7, seconds=n),
        )
    # webhooks: paused with a backlog.
    for n in range(4):
        TaskFactory(queue=webhooks, payload={"url": f"https://hooks.example.com/{n}"})

    running = [
        _executing(
            emails,
            "mail-worker-1",
            {"to": "ada@example.com", "template": "receipt", "order": {"id": 5521, "total": 42.5}},
            seconds_ago=57,
        ),
        _executing(emails, "mail-worker-1", {"to": "alan@example.com", "template": "receipt"}),
        _executing(payments, "billing-worker-1", {"invoice": 9100, "amount": 1299}),
        _executing(thumbnails, "img-worker-7", {"image": "s3://uploads/big.png"}),
    ]
    for worker_id, seen_ago in [
        ("mail-worker-1", 3),
        ("billing-worker-1", 6),
        ("img-worker-7", 240),
        ("mail-worker-2", 1),
    ]:
        Worker.objects.update_or_create(
            worker_id=worker_id, defaults={"last_seen_at": now - timedelta(seconds=seen_ago)}
        )
    return {"dead": dead, "running": running, "queues": [emails, payments, thumbnails, webhooks]}
