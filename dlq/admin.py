"""Dead-letter entries in the Django admin: read-only; replay and discard go
through `dlq.services`."""

from __future__ import annotations

from collections import defaultdict

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import Http404, HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from dlq import services
from dlq.models import DeadLetterTask
from queues.models import Queue
from taskforge.dashboard.adminlib import LargeTableAdmin, ReadOnlyAdminMixin
from tasks.models import TaskStatus


class DeadNowFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("all", "Including replayed")]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[DeadLetterTask]
    ) -> QuerySet[DeadLetterTask]:
        # By default only tasks dead now, as GET /queues/:name/dlq.
        if self.value() == "all":
            return queryset
        return queryset.filter(task__status=TaskStatus.DEAD)

    def choices(self, changelist):  # type: ignore[no-untyped-def]
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "Dead now",
        }
        yield from super().choices(changelist)


@admin.register(DeadLetterTask)
class DeadLetterTaskAdmin(ReadOnlyAdminMixin, LargeTableAdmin):
    list_display = (
        "task_link",
        "queue",
        "died_at",
        "attempts",
        "replay_count",
        "replayed_at",
        "error",
    )
    list_filter = (DeadNowFilter, "queue")
    list_select_related = ("queue",)
    actions = ("replay", "discard")
    fields = (
        "task_link",
        "queue",
        "died_at",
        "attempts",
        "replay_count",
        "replayed_at",
        "last_error",
        "payload",
    )
    readonly_fields = ("task_link",)

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        # With a queue: dlq_queue_died_idx.  Without: the primary key (the
        # task id, time-ordered), so Postgres walks an index and stops after a
        # page instead of sorting the whole DLQ joined to the task table.
        if "queue__id__exact" in request.GET:
            return ("-died_at", "-task_id")
        return ("-task_id",)

    @admin.display(description="Task")
    def task_link(self, entry: DeadLetterTask) -> str:
        return format_html(
            '<a href="{}">{}</a>',
            reverse("dashboard:task", kwargs={"task_id": entry.task_id}),
            entry.task_id,
        )

    @admin.display(description="Last error")
    def error(self, entry: DeadLetterTask) -> str:
        text = entry.last_error or ""
        return text if len(text) <= 120 else text[:119] + "…"

    @staticmethod
    def _by_queue(queryset: QuerySet[DeadLetterTask]) -> dict[Queue, list[str]]:
        grouped: dict[object, list[str]] = defaultdict(list)
        for task_id, queue_id in queryset.values_list("task_id", "queue_id"):
            grouped[queue_id].append(str(task_id))
        queues = Queue.objects.in_bulk(list(grouped))
        return {queues[queue_id]: ids for queue_id, ids in grouped.items()}

    @admin.action(description="Replay selected tasks")
    def replay(self, request: HttpRequest, queryset: QuerySet[DeadLetterTask]) -> None:
        replayed = sum(
            services.replay_many(queue, ids) for queue, ids in self._by_queue(queryset).items()
        )
        self.message_user(request, f"Replayed {replayed} task(s).", messages.SUCCESS)

    @admin.action(description="Discard selected tasks for good")
    def discard(self, request: HttpRequest, queryset: QuerySet[DeadLetterTask]) -> None:
        discarded = 0
        for queue, ids in self._by_queue(queryset).items():
            for task_id in ids:
                try:
                    services.discard(queue, task_id)
                except Http404:
                    continue  # replayed meanwhile: not dead any more
                discarded += 1
        self.message_user(request, f"Discarded {discarded} task(s).", messages.SUCCESS)
