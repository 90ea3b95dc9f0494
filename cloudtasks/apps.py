from __future__ import annotations

from django.apps import AppConfig


class CloudTasksConfig(AppConfig):
    """The Cloud Tasks v2 REST API under /v2/ (API-cloudtasks.md); no models of its own."""

    name = "cloudtasks"
    default_auto_field = "django.db.models.BigAutoField"
