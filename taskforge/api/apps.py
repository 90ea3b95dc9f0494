from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "taskforge.api"
    default_auto_field = "django.db.models.BigAutoField"
    label = "api"

    def ready(self) -> None:
        # Multiprocess metrics pick their file names before any metric exists
        # (before Django builds the middleware, django-prometheus's metrics).
        from taskforge import metrics  # noqa: F401

        # Registers the OpenAPI security scheme of our API keys.
        from taskforge.api import schema  # noqa: F401

        # A dashboard stream ends when its user loses access (taskforge.api.revocation).
        from taskforge.api.revocation import connect_signals

        connect_signals()
