"""The Cloud Tasks methods TaskForge serves (API-cloudtasks.md "Methods").

Each takes a `Call` (the path's names, the query, the parsed body, the actor)
and answers the message as a dict; refusals are `RpcError`s.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from cloudtasks import errors, services, taskbody
from cloudtasks import protojson as pj
from cloudtasks import queues as ct_queues
from cloudtasks import tasks as ct_tasks
from queues import services as queue_services
from queues.exceptions import QueueExists, UnknownQueue
from queues.models import Queue
from taskforge.audit.log import Actor
from taskforge.lib import jsonutil
from tasks.models import Task

MAX_QUEUES_PAGE = 9800
MAX_TASKS_PAGE = 1000
_FILTER = re.compile(r"^\s*state\s*[:=]\s*(RUNNING|PAUSED)\s*$")


@dataclass(frozen=True, slots=True)
class Call:
    project: str
    location: str
    queue_id: str | None
    task_id: str | None
    query: dict[str, str]
    body: dict[str, Any]
    actor: Actor
    out: pj.Output
    # The request's W3C Trace Context (taskforge.tracing.from_headers): a task
    # created by the call keeps it.
    trace: tuple[str | None, str | None] = (None, None)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"

    @property
    def queue_path(self) -> str:
        return f"{self.parent}/queues/{self.queue_id}"

    def queue(self) -> Queue:
        assert self.queue_id is not None
        return services.queue_named(self.queue_id)

    def shown(self, queue: Queue) -> dict[str, Any]:
        return ct_queues.shown(queue, f"{self.parent}/queues/{queue.name}", self.out)


def _no_body(call: Call, *allowed: str) -> dict[str, Any]:
    return pj.fields(call.body, "", allowed)


# -- queues --


def create_queue(call: Call) -> dict[str, Any]:
    name, settings = ct_queues.read(call.body, ct_queues.ALL_LEAVES, ct_queues.defaults())
    if name is None:
        raise errors.invalid("queue.name", "queue.name is required.")
    queue_id = _queue_id_of(name, call.parent)
    fields = ct_queues.native_fields(settings, ct_queues.ALL_LEAVES)
    try:
        queue = queue_services.create_queue(queue_id, actor=call.actor, **fields)
    except QueueExists as exc:
        raise errors.already_exists("Queue already exists.") from exc
    return call.shown(queue)


def _queue_id_of(name: str, parent: str) -> str:
    prefix = f"{parent}/queues/"
    if not name.startswith(prefix):
        raise errors.invalid("queue.name", f"The queue name must start with {prefix!r}.")
    queue_id = name[len(prefix) :]
    if not ct_queues.QUEUE_ID.fullmatch(queue_id):
        raise errors.invalid(
            "queue.name",
            "A queue ID is 1 to 100 of A-Z a-z 0-9 -, starting with a letter or digit.",
        )
    return queue_id


def get_queue(call: Call) -> dict[str, Any]:
    return call.shown(call.queue())


def list_queues(call: Call) -> dict[str, Any]:
    size = _page_size(call, MAX_QUEUES_PAGE)
    queues = Queue.objects.order_by("name")
    state = call.query.get("filter", "")
    if state.strip():
        match = _FILTER.fullmatch(state)
        if match is None:
            raise errors.invalid("filter", "Supported filters: state: RUNNING, state: PAUSED.")
        queues = queues.filter(paused=match.group(1) == "PAUSED")
    after = _token(call)
    if after is not None:
        queues = queues.filter(name__gt=str(after))
    page = list(queues[: size + 1])
    answer: dict[str, Any] = {"queues": [call.shown(q) for q in page[:size]]}
    if len(page) > size:
        answer["nextPageToken"] = _make_token(page[size - 1].name)
    return answer


def update_queue(call: Call) -> dict[str, Any]:
    leaves = ct_queues.mask_leaves(call.query.get("updateMask"))
    assert call.queue_id is not None
    queue = Queue.objects.filter(name=call.queue_id).first()
    base = ct_queues.current(queue) if queue is not None else ct_queues.defaults()
    name, settings = ct_queues.read(call.body, leaves, base)
    if name is not None and name != call.queue_path:
        raise errors.invalid("queue.name", "queue.name differs from the queue in the path.")
    if queue is None:
        _queue_id_of(call.queue_path, call.parent)
        # Created as Cloud Tasks does: every field not named takes its default.
        fields = ct_queues.native_fields(settings, ct_queues.ALL_LEAVES)
        try:
            queue = queue_services.create_queue(call.queue_id, actor=call.actor, **fields)
        except QueueExists as exc:
            raise errors.already_exists("Queue already exists.") from exc
        return call.shown(queue)
    try:
        queue = queue_services.update_queue(
            queue, actor=call.actor, **ct_queues.native_fields(settings, leaves)
        )
    except UnknownQueue as exc:
        raise errors.not_found("Queue does not exist.") from exc
    return call.shown(queue)


def delete_queue(call: Call) -> dict[str, Any]:
    _no_body(call)
    services.delete_queue(call.queue(), actor=call.actor)
    return {}


def purge_queue(call: Call) -> dict[str, Any]:
    _no_body(call, "name")
    return call.shown(services.purge_queue(call.queue(), actor=call.actor))


def pause_queue(call: Call) -> dict[str, Any]:
    _no_body(call, "name")
    return call.shown(queue_services.set_paused(call.queue(), paused=True, actor=call.actor))


def resume_queue(call: Call) -> dict[str, Any]:
    _no_body(call, "name")
    return call.shown(queue_services.set_paused(call.queue(), paused=False, actor=call.actor))


# -- tasks --


def _view(value: Any, field: str) -> str:
    view = pj.enum(value, field, taskbody.VIEWS)
    return "BASIC" if view == taskbody.VIEWS[0] else view


def create_task(call: Call) -> dict[str, Any]:
    body = pj.fields(call.body, "", ("task", "responseView", "parent"))
    if "parent" in body and body["parent"] != call.queue_path:
        raise errors.invalid("parent", "parent differs from the queue in the path.")
    view = _view(body.get("responseView", 0), "responseView")
    if "task" not in body:
        raise errors.invalid("task", "task is required.")
    spec = taskbody.read(body["task"], now=timezone.now(), queue_path=call.queue_path)
    assert call.queue_id is not None
    task = services.create_task(call.queue_id, spec, trace=call.trace)
    return ct_tasks.shown(task, call.queue_path, view=view, out=call.out)


def get_task(call: Call) -> dict[str, Any]:
    view = _view(call.query.get("responseView", "BASIC"), "responseView")
    assert call.task_id is not None
    task = services.find_task(call.queue(), call.task_id)
    return ct_tasks.shown(task, call.queue_path, view=view, out=call.out)


def list_tasks(call: Call) -> dict[str, Any]:
    view = _view(call.query.get("responseView", "BASIC"), "responseView")
    size = _page_size(call, MAX_TASKS_PAGE)
    queue = call.queue()
    tasks = Task.objects.filter(queue=queue, status__in=services.VISIBLE).order_by(
        "scheduled_at", "created_at", "id"
    )
    after = _token(call)
    if after is not None:
        try:
            due, created, last_id = after
            due_at, created_at = _time(due), _time(created)
            # Keyset: (scheduled_at, created_at, id) after the token's.
            tasks = tasks.filter(
                Q(scheduled_at__gt=due_at)
                | Q(scheduled_at=due_at, created_at__gt=created_at)
                | Q(scheduled_at=due_at, created_at=created_at, id__gt=uuid.UUID(str(last_id)))
            )
        except (TypeError, ValueError) as exc:
            raise errors.invalid("pageToken", "The page token is not valid.") from exc
    page = list(tasks[: size + 1])
    for task in page:
        task.queue = queue
    answer: dict[str, Any] = {
        "tasks": [ct_tasks.shown(t, call.queue_path, view=view, out=call.out) for t in page[:size]]
    }
    if len(page) > size:
        last = page[size - 1]
        answer["nextPageToken"] = _make_token(
            [last.scheduled_at.isoformat(), last.created_at.isoformat(), str(last.pk)]
        )
    return answer


def _time(text: Any) -> datetime:
    if not isinstance(text, str):
        raise ValueError(text)
    return datetime.fromisoformat(text)


def delete_task(call: Call) -> dict[str, Any]:
    _no_body(call)
    assert call.task_id is not None
    services.delete_task(call.queue(), call.task_id, actor=call.actor)
    return {}


def run_task(call: Call) -> dict[str, Any]:
    body = _no_body(call, "responseView", "name")
    view = _view(body.get("responseView", 0), "responseView")
    assert call.task_id is not None
    task = services.run_task(call.queue(), call.task_id, actor=call.actor)
    return ct_tasks.shown(task, call.queue_path, view=view, out=call.out)


# -- pages --


def _page_size(call: Call, most: int) -> int:
    raw = call.query.get("pageSize", "0")
    if not re.fullmatch(r"-?\d{1,10}", raw):
        raise errors.invalid("pageSize", "pageSize must be an integer.")
    size = int(raw)
    if size < 0 or size > most:
        raise errors.invalid("pageSize", f"pageSize must be between 0 and {most}.")
    return size or most


def _make_token(value: Any) -> str:
    return base64.urlsafe_b64encode(jsonutil.dumps(value)).decode().rstrip("=")


def _token(call: Call) -> Any:
    raw = call.query.get("pageToken", "")
    if not raw:
        return None
    try:
        return jsonutil.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, binascii.Error) as exc:
        raise errors.invalid("pageToken", "The page token is not valid.") from exc
