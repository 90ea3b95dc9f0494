"""API keys in the Django admin.

A key is shown once, on the page right after it is created, and never again:
only its SHA-256 is stored.  Keys are revoked, not deleted, so `last_used_at`
stays on record.  (`python manage.py createapikey` does the same from a shell.)
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from dashboard.admin.base import AsSentNameForm, GuardedAdmin
from taskforge.api import keys
from taskforge.api.models import ApiKey
from taskforge.audit.log import of_request

# The request attribute that carries a new key from save_model to response_add.
_ISSUED_KEY = "_taskforge_issued_key"


def _key_name_problem(name: str) -> str | None:
    try:
        keys.check_name(name)
    except keys.InvalidKeyName as exc:
        return exc.message
    return None


class ApiKeyForm(AsSentNameForm):
    name_rule = staticmethod(_key_name_problem)

    class Meta:
        model = ApiKey
        fields = ("name", "role")


@admin.register(ApiKey)
class ApiKeyAdmin(GuardedAdmin[ApiKey]):
    form = ApiKeyForm
    list_display = ("name", "role", "created_at", "last_used_at", "revoked")
    list_filter = ("role", "revoked")
    search_fields = ("name",)
    ordering = ("-created_at",)
    actions = ("revoke",)
    fields = ("name", "role", "created_at", "last_used_at", "revoked")

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        if obj is None:
            return ("created_at", "last_used_at", "revoked")
        return self.fields

    def has_delete_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return False

    def save_model(
        self, request: HttpRequest, obj: ApiKey, form: ModelForm[ApiKey], change: bool
    ) -> None:
        if change:
            return  # every field is read-only once the key exists
        issued, key = keys.issue(name=obj.name, role=obj.role, actor=of_request(request))
        obj.pk, obj.key_hash, obj.created_at = issued.pk, issued.key_hash, issued.created_at
        obj._state.adding = False
        setattr(request, _ISSUED_KEY, key)

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        key = getattr(request, _ISSUED_KEY, None)
        if key is None:
            return super().response_add(request, obj, post_url_continue)
        return TemplateResponse(
            request,
            "admin/api/apikey/issued.html",
            {
                **self.admin_site.each_context(request),
                "title": "API key created",
                "opts": self.model._meta,
                "api_key": obj,
                "key": key,
            },
        )

    # Revoking changes the key: Django's own change permission (superusers, or
    # whoever an administrator gives `api.change_apikey`).
    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = keys.revoke(queryset, actor=of_request(request))
        self.message_user(request, f"Revoked {revoked} key(s).", messages.SUCCESS)
