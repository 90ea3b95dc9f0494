"""Tasks and their events in the Django admin: read-only.

Both tables hold millions of rows: the change lists never count (see
`dashboard.admin.base`) and order on an index for every filter
combination they offer.  The only action, cancel, goes through
`tasks.services`.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from dashboard import roles
from dashboard.admin.base import LargeTableAdmin, ReadOnlyAdminMixin
from queues.models import Queue
from taskforge.audit.log import of_request
from tasks import services
from tasks.models import Task, TaskEvent


def _dashboard_link(task_id: uuid.UUID) -> str:
    return format_html(
        '<a href="{}">{}</a>', reverse("dashboard:task", kwargs={"task_id": task_id}), task_id
    )


def _search(queryset: QuerySet[Any], term: str, *, id_field: str) -> QuerySet[Any]:
    """An exact task id, or else an exact worker id: both have an index."""
    term = term.strip()
    if not term:
        return queryset
    try:
        return queryset.filter(**{id_field: uuid.UUID(term)})
    except ValueError:
        field = "claimed_by" if id_field == "pk" else "worker_id"
        return queryset.filter(**{field: term})


def _queue_filter(request: HttpRequest) -> uuid.UUID | None:
    """The change list's queue filter, when it names a queue id."""
    try:
        return uuid.UUID(request.GET["queue__id__exact"])
    except (KeyError, ValueError):
        return None  # none, or not an id: the admin's own filter refuses it


@admin.register(Task)
class TaskAdmin(ReadOnlyAdminMixin, LargeTableAdmin):
    list_display = (
        "id",
        "queue",
        "status",
        "priority",
        "attempts",
        "claimed_by",
        "created_at",
        "inspect",
    )
    list_filter = ("status", "queue")
    list_select_related = ("queue",)
    search_fields = ("=id",)  # replaced by get_search_results: task id or worker id
    search_help_text = "An exact task id, or an exact worker id."
    actions = ("cancel",)
    fields = (
        "id",
        "queue",
        "status",
        "priority",
        "attempts",
        "max_retries",
        "scheduled_at",
        "claimed_at",
        "claimed_by",
        "heartbeat_at",
        "last_error",
        "payload",
        "result",
        "idempotency_key",
        "created_at",
        "updated_at",
        "finished_at",
    )

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        # With a queue: task_queue_created_idx / task_not_done_idx.
        # Without: the primary key, which is time-ordered (UUIDv7).
        if "queue__id__exact" in request.GET:
            return ("-created_at", "-id")
        return ("-id",)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Task], search_term: str
    ) -> tuple[QuerySet[Task], bool]:
        return _search(queryset, search_term, id_field="pk"), False

    @admin.display(description="Dashboard")
    def inspect(self, task: Task) -> str:
        return format_html(
            '<a href="{}">Inspect</a>', reverse("dashboard:task", kwargs={"task_id": task.pk})
        )

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(roles.CANCEL)

    @admin.action(
        description="Cancel selected tasks (pending, claimed or retry)", permissions=["cancel"]
    )
    def cancel(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        cancelled = services.cancel_many(ids, actor=of_request(request))
        skipped = len(ids) - cancelled
        self.message_user(request, f"Cancelled {cancelled} task(s).", messages.SUCCESS)
        if skipped:
            self.message_user(
                request,
                f"Skipped {skipped} task(s) that are executing or finished.",
                messages.WARNING,
            )


class _EventQueueFilter(admin.SimpleListFilter):
    """An event's queue is its task's (`TaskEvent.queue` is set on outcomes only)."""

    title = "queue"
    parameter_name = "queue__id__exact"  # the URL of a queue filter on any other list

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (str(pk), name) for pk, name in Queue.objects.order_by("name").values_list("pk", "name")
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() is None:
            return queryset
        queue_id = _queue_filter(request)
        if queue_id is None:
            raise IncorrectLookupParameters(f"Not a queue id: {self.value()!r}")
        return queryset.filter(task__queue_id=queue_id)


@admin.register(TaskEvent)
class TaskEventAdmin(ReadOnlyAdminMixin, LargeTableAdmin):
    list_display = (
        "at",
        "task_link",
        "queue_name",
        "from_status",
        "to_status",
        "worker_id",
        "attempt",
        "claimed_at",
    )
    list_filter = (_EventQueueFilter, "to_status")
    list_select_related = ("task__queue",)
    search_fields = ("=task__id",)  # replaced by get_search_results
    search_help_text = "An exact task id, or an exact worker id."
    fields = (
        "task_link",
        "queue_name",
        "at",
        "from_status",
        "to_status",
        "worker_id",
        "attempt",
        "error",
        "claimed_at",
    )
    readonly_fields = ("task_link", "queue_name")

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        # With a queue (_EventQueueFilter: through the tasks): its tasks newest
        # first (task_queue_created_idx), then each task's events newest first
        # (taskevent_by_task_idx), so a page reads about 13 tasks whatever
        # the history (the primary key, filtered by queue, would walk every
        # newer event of the other queues).  Without: the primary key.
        if _queue_filter(request) is not None:
            return ("-task__created_at", "-task_id", "-id")
        return ("-id",)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[TaskEvent], search_term: str
    ) -> tuple[QuerySet[TaskEvent], bool]:
        return _search(queryset, search_term, id_field="task_id"), False

    @admin.display(description="Task")
    def task_link(self, event: TaskEvent) -> str:
        return _dashboard_link(event.task_id)

    @admin.display(description="Queue")
    def queue_name(self, event: TaskEvent) -> str:
        return event.task.queue.name
