from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The operator dashboard: its pages, the Django admin of every model, /metrics' gauges."""

    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"
