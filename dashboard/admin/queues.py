"""Queues in the Django admin; settings go through `queues.services`, purges through
`tasks.services`."""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse, reverse_lazy
from django.utils.html import format_html

from dashboard import roles
from dashboard.admin.base import AsSentNameForm, GuardedAdmin, queue_name_problem
from queues import push, services
from queues.models import Queue
from taskforge.audit.log import of_request
from tasks import services as task_services

# The admin's "View site" link leads to the operator dashboard.
# (A lazy string: the URLconf is not loaded yet; Django renders it as text.)
admin.site.site_url = cast(str, reverse_lazy("dashboard:overview"))
admin.site.site_header = "TaskForge admin"
admin.site.site_title = "TaskForge admin"
admin.site.index_title = "Data"


class QueueForm(AsSentNameForm):
    """The admin's queue form: `push` checked by the API's own rule (queues.push), the
    name as typed.

    `push` is shown redacted, to superusers too (API.md v1.2 "Secrets in push
    settings"), and what comes back is read by `push.unredacted`: a header value
    left `[redacted]`, or the URL left as shown, keeps the stored secret, so a
    change of another field (or of the timeout) never wipes the credentials.
    """

    name_rule = staticmethod(queue_name_problem)

    class Meta:
        model = Queue
        fields = ("name", "max_retries", "rate_limit", "max_concurrency", "push", "paused")
        help_texts = {
            "push": 'null: workers claim the tasks. Else {"url": "https://...", '
            '"timeout_seconds": 30, "headers": {"Authorization": "..."}}: run_pusher POSTs '
            f"each task there (docs/push.md). Header values show as {push.REDACTED} and the "
            "URL without its user info and query: left as shown they keep the stored ones, "
            "typed anew they replace them.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.instance._state.adding:
            self.initial["push"] = push.redacted(self.instance.push)

    def clean_push(self) -> dict[str, Any] | None:
        value = self.cleaned_data.get("push")
        if value is None:
            return None
        # The instance still holds the stored target: the form's values reach it
        # after the fields are cleaned (ModelForm._post_clean).
        stored = None if self.instance._state.adding else self.instance.push
        try:
            return push.unredacted(push.parse(value), stored).as_json()
        except push.InvalidPush as exc:
            raise forms.ValidationError(str(exc)) from exc


@admin.register(Queue)
class QueueAdmin(GuardedAdmin[Queue]):
    form = QueueForm
    list_display = (
        "name",
        "paused",
        "max_retries",
        "rate_limit",
        "max_concurrency",
        "push_target",
        "created_at",
        "dashboard",
    )
    list_filter = ("paused",)
    search_fields = ("name",)
    ordering = ("name",)
    actions = ("pause", "resume", "purge")
    readonly_fields = ("created_at",)

    def get_readonly_fields(self, request: HttpRequest, obj: Queue | None = None) -> Any:
        # The name is the queue's identity in the API and in workers' configs.
        # `push_settings` stands in for `push` on a page the user may only view.
        if obj is None:
            return ("created_at", "push_settings")
        return ("name", "created_at", "push_settings")

    def get_fields(self, request: HttpRequest, obj: Queue | None = None) -> Any:
        fields = [name for name in super().get_fields(request, obj) if name != "push_settings"]
        if obj is not None and not self.has_change_permission(request, obj) and "push" in fields:
            # A view-only page prints the model's fields as stored: the secrets too.
            fields[fields.index("push")] = "push_settings"
        return fields

    @admin.display(description="Push")
    def push_settings(self, queue: Queue) -> str:
        return json.dumps(push.redacted(queue.push))

    @admin.display(description="Push to")
    def push_target(self, queue: Queue) -> str:
        return push.display_url(queue.push["url"]) if queue.push else "—"

    @admin.display(description="Tasks")
    def dashboard(self, queue: Queue) -> str:
        url = reverse("dashboard:tasks") + f"?queue={queue.name}"
        return format_html('<a href="{}">Inspect tasks</a>', url)

    def has_delete_permission(self, request: HttpRequest, obj: Queue | None = None) -> bool:
        # The admin's delete page would list every task of the queue (millions);
        # DELETE /queues/:name refuses a queue with live tasks and is the way.
        return False

    def save_model(
        self, request: HttpRequest, obj: Queue, form: ModelForm[Queue], change: bool
    ) -> None:
        fields = {name: form.cleaned_data[name] for name in form.changed_data if name != "name"}
        if change:
            services.update_queue(obj, **fields, actor=of_request(request))
            return
        # The form's unique check has refused a taken name already.
        created = services.create_queue(obj.name, **fields, actor=of_request(request))
        obj.pk, obj.created_at = created.pk, created.created_at
        obj._state.adding = False

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(roles.PAUSE)

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(roles.PURGE)

    @admin.action(description="Pause selected queues", permissions=["pause"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for queue in queryset:
            services.set_paused(queue, paused=True, actor=of_request(request))
        self.message_user(request, f"Paused {len(queryset)} queue(s).", messages.SUCCESS)

    @admin.action(description="Resume selected queues", permissions=["pause"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for queue in queryset:
            services.set_paused(queue, paused=False, actor=of_request(request))
        self.message_user(request, f"Resumed {len(queryset)} queue(s).", messages.SUCCESS)

    @admin.action(
        description="Purge selected queues (cancel every task not started)…", permissions=["purge"]
    )
    def purge(self, request: HttpRequest, queryset: QuerySet[Queue]) -> HttpResponse | None:
        queues = list(queryset)
        if request.POST.get("confirmed") != "yes":
            return TemplateResponse(
                request,
                "admin/queues/queue/purge_confirmation.html",
                {
                    **self.admin_site.each_context(request),
                    "title": "Purge queues?",
                    "queues": queues,
                    "opts": self.model._meta,
                    "action_checkbox_name": ACTION_CHECKBOX_NAME,
                },
            )
        actor = of_request(request)
        cancelled = sum(task_services.purge_queue(queue, actor=actor) for queue in queues)
        self.message_user(
            request,
            f"Purged {len(queues)} queue(s): {cancelled:,} tasks cancelled.",
            messages.SUCCESS,
        )
        return None
