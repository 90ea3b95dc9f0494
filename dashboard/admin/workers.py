"""Workers in the Django admin: read-only (workers register themselves by calling the API)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone

from dashboard.admin.base import GuardedAdmin
from workers.models import Worker


@admin.register(Worker)
class WorkerAdmin(GuardedAdmin[Worker]):
    list_display = ("worker_id", "last_seen_at", "stale")
    search_fields = ("worker_id",)
    ordering = ("-last_seen_at",)
    readonly_fields = ("worker_id", "last_seen_at")

    @admin.display(boolean=True, description="Stale")
    def stale(self, worker: Worker) -> bool:
        return worker.is_stale(timezone.now())

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        return False

    # Delete stays: forgetting an old worker is harmless (it reappears when it calls again).
