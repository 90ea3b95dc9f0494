"""Queue settings: creating a queue, changing it, pausing and resuming it.

Deleting and purging a queue act on its tasks: `tasks.services` has them.
Each action writes its audit entry in its own transaction (`taskforge.audit`).
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from queues import push
from queues.exceptions import QueueExists, UnknownQueue
from queues.models import Queue
from queues.notify import wake_dispatchers
from taskforge.audit.log import Actor, record
from taskforge.audit.models import Action


def create_queue(name: str, *, actor: Actor, **fields: Any) -> Queue:
    """Create a queue; its audit entry's details are the settings given.

    Raises:
        QueueExists: the name is taken.
    """
    try:
        with transaction.atomic():
            queue = Queue.objects.create(name=name, **fields)
            record(actor, Action.QUEUE_CREATE, queue=name, target=name, details=_audited(fields))
            return queue
    except IntegrityError as exc:
        raise QueueExists(f"A queue named {name!r} exists already.") from exc


def update_queue(queue: Queue, *, actor: Actor, **fields: Any) -> Queue:
    """Change a queue's settings; resuming it wakes the dispatchers at once.

    Audit: a change of `paused` is `queue.pause` or `queue.resume`, a change of
    any other field one `queue.update` with `{"changed": {field: [old, new]}}`;
    a field set to the value it has is no change.  `push` is recorded redacted
    (old and new), and recorded whenever it changed, a header value alone too.

    Raises:
        UnknownQueue: the queue was deleted meanwhile.
    """
    if not fields:
        return queue
    with transaction.atomic():
        # The old values as stored (the caller's row may come from a cache);
        # the lock keeps two updates from recording the same old value.
        current = Queue.objects.select_for_update(no_key=True).filter(pk=queue.pk).first()
        if current is None:
            raise UnknownQueue()
        changed = {
            name: [getattr(current, name), value]
            for name, value in fields.items()
            if getattr(current, name) != value
        }
        for name, value in fields.items():
            setattr(queue, name, value)
        queue.save(update_fields=list(fields))
        if "paused" in changed:
            _record_paused(actor, queue)
        others = {name: values for name, values in changed.items() if name != "paused"}
        if others:
            record(
                actor,
                Action.QUEUE_UPDATE,
                queue=queue.name,
                target=queue.name,
                details={"changed": _audited(others)},
            )
        if fields.get("paused") is False:
            wake_dispatchers([queue.id])
    return queue


def set_paused(queue: Queue, *, paused: bool, actor: Actor) -> Queue:
    """Pause or resume a queue (the explicit action: audited even when it was so already).

    Raises:
        UnknownQueue: the queue was deleted meanwhile.
    """
    with transaction.atomic():
        if not Queue.objects.filter(pk=queue.pk).update(paused=paused):
            raise UnknownQueue()
        queue.paused = paused
        _record_paused(actor, queue)
        if not paused:
            wake_dispatchers([queue.id])
    return queue


def _audited(fields: dict[str, Any]) -> dict[str, Any]:
    """Settings, or `{field: [old, new]}`, as the audit log keeps them: `push`
    redacted (API.md v1.2 "Secrets in push settings"), the rest as given."""
    audited = dict(fields)
    if "push" in fields:
        value = fields["push"]
        if isinstance(value, list):  # [old, new]; a push value itself is an object or null
            audited["push"] = [push.redacted(v) for v in value]
        else:
            audited["push"] = push.redacted(value)
    return audited


def _record_paused(actor: Actor, queue: Queue) -> None:
    action = Action.QUEUE_PAUSE if queue.paused else Action.QUEUE_RESUME
    record(actor, action, queue=queue.name, target=queue.name)
