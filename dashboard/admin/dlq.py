"""Dead-letter entries in the Django admin: read-only; replay and discard go
through `dlq.services`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from dashboard import roles
from dashboard.admin.base import LargeTableAdmin, ReadOnlyAdminMixin
from dlq import services
from dlq.models import DeadLetterQuerySet, DeadLetterTask
from taskforge.audit.log import of_request

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices


class DeadNowFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[DeadLetterTask]
    ) -> list[tuple[str, str]]:
        return [("all", "Including replayed")]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[DeadLetterTask]
    ) -> QuerySet[DeadLetterTask]:
        # By default only tasks dead now, as GET /queues/:name/dlq.
        if self.value() == "all":
            return queryset
        return cast(DeadLetterQuerySet, queryset).dead_now()

    def choices(self, changelist: ChangeList) -> Iterator[_ListFilterChoices]:
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

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(roles.REPLAY)

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(roles.DISCARD)

    @admin.action(description="Replay selected tasks", permissions=["replay"])
    def replay(self, request: HttpRequest, queryset: QuerySet[DeadLetterTask]) -> None:
        replayed = services.replay_selected(_ids(queryset), actor=of_request(request))
        self.message_user(request, f"Replayed {replayed} task(s).", messages.SUCCESS)

    @admin.action(description="Discard selected tasks for good", permissions=["discard"])
    def discard(self, request: HttpRequest, queryset: QuerySet[DeadLetterTask]) -> None:
        # Tasks replayed meanwhile are not dead any more: skipped.
        discarded = services.discard_selected(_ids(queryset), actor=of_request(request))
        self.message_user(request, f"Discarded {discarded} task(s).", messages.SUCCESS)


def _ids(queryset: QuerySet[DeadLetterTask]) -> list[str]:
    return [str(task_id) for task_id in queryset.values_list("task_id", flat=True)]
