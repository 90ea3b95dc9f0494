from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class QueuesConfig(AppConfig):
    name = "queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from queues.models import Queue

        post_save.connect(_forget, sender=Queue, dispatch_uid="queues.lookup.forget")
        post_delete.connect(_forget, sender=Queue, dispatch_uid="queues.lookup.forget.delete")


def _forget(sender: Any, instance: Any, **kwargs: Any) -> None:
    from queues import lookup

    lookup.forget(instance)
