"""Schedules in the Django admin; every write goes through `tasks.schedules`."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils import timezone

from dashboard import roles
from dashboard.admin.base import AsSentNameForm, GuardedAdmin, queue_name_problem
from taskforge.audit.log import of_request
from taskforge.lib import cron
from tasks import schedules
from tasks.models import Schedule


class ScheduleForm(AsSentNameForm):
    name_rule = staticmethod(queue_name_problem)

    class Meta:
        model = Schedule
        fields = (
            "queue",
            "name",
            "cron",
            "timezone",
            "payload",
            "priority",
            "max_retries",
            "paused",
        )

    def clean_cron(self) -> str:
        try:
            return cron.validate(self.cleaned_data["cron"])
        except cron.CronError as exc:
            raise forms.ValidationError(str(exc)) from exc

    def clean_timezone(self) -> str:
        name: str = self.cleaned_data["timezone"]
        try:
            cron.parse_timezone(name)
        except cron.CronError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return name

    def clean_payload(self) -> Any:
        payload = self.cleaned_data["payload"]
        if payload is None:
            raise forms.ValidationError("The payload may be any JSON value but null.")
        return payload


@admin.register(Schedule)
class ScheduleAdmin(GuardedAdmin[Schedule]):
    form = ScheduleForm
    list_display = ("name", "queue", "cron", "timezone", "paused", "next_run", "last_run_at")
    list_filter = ("paused",)
    list_select_related = ("queue",)
    search_fields = ("name", "queue__name")
    ordering = ("queue__name", "name")
    actions = ("pause", "resume")
    readonly_fields = ("next_run_at", "last_run_at", "created_at", "updated_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        # The queue and name are the schedule's identity in the API.
        if obj is not None:
            return ("queue", "name", *self.readonly_fields)
        return self.readonly_fields

    @admin.display(description="Next run")
    def next_run(self, schedule: Schedule) -> Any:
        return schedule.upcoming_run_at(timezone.now())

    def save_model(
        self, request: HttpRequest, obj: Schedule, form: ModelForm[Schedule], change: bool
    ) -> None:
        fields = {
            name: form.cleaned_data[name]
            for name in form.changed_data
            if name in schedules.CHANGEABLE
        }
        if change:
            updated = schedules.update_schedule(
                obj.queue, obj.name, **fields, actor=of_request(request)
            )
            obj.next_run_at, obj.updated_at = updated.next_run_at, updated.updated_at
            return
        data = form.cleaned_data
        created = schedules.create_schedule(
            data["queue"],
            name=data["name"],
            cron=data["cron"],
            payload=data["payload"],
            timezone=data["timezone"],
            priority=data["priority"],
            max_retries=data["max_retries"],
            paused=data["paused"],
            actor=of_request(request),
        )
        obj.pk, obj.next_run_at, obj.created_at = (
            created.pk,
            created.next_run_at,
            created.created_at,
        )
        obj._state.adding = False

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(roles.PAUSE_SCHEDULE)

    @admin.action(description="Pause selected schedules", permissions=["pause"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        count = schedules.set_paused(
            list(queryset.values_list("pk", flat=True)), True, actor=of_request(request)
        )
        self.message_user(request, f"Paused {count} schedule(s).", messages.SUCCESS)

    @admin.action(description="Resume selected schedules", permissions=["pause"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        count = schedules.set_paused(
            list(queryset.values_list("pk", flat=True)), False, actor=of_request(request)
        )
        self.message_user(request, f"Resumed {count} schedule(s).", messages.SUCCESS)
