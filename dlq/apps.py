from __future__ import annotations

from django.apps import AppConfig


class DlqConfig(AppConfig):
    name = "dlq"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from dlq import receivers
        from tasks import signals

        signals.dead_lettered.connect(receivers.on_dead_lettered, dispatch_uid="dlq.dead")
        signals.replayed.connect(receivers.on_replayed, dispatch_uid="dlq.replayed")
        signals.dead_deleted.connect(receivers.on_dead_deleted, dispatch_uid="dlq.deleted")
        signals.upkeep.connect(receivers.on_upkeep, dispatch_uid="dlq.upkeep")
        signals.dlq_depths.connect(receivers.on_dlq_depths, dispatch_uid="dlq.depths")
