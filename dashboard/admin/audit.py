"""The audit log in the Django admin: read-only for everyone, superusers included
(entries are written by the actions they record, and never changed)."""

from __future__ import annotations

from django.contrib import admin

from dashboard.admin.base import GuardedAdmin, ReadOnlyAdminMixin
from taskforge.audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdminMixin, GuardedAdmin[AuditEntry]):
    list_display = ("at", "actor_kind", "actor_name", "action", "queue", "target", "details")
    list_filter = ("action", "actor_kind")
    search_fields = ("=actor_name", "=queue", "=target")
    search_help_text = "An exact actor name, queue name or target."
    ordering = ("-at", "-id")
    fields = list_display
    actions = None
