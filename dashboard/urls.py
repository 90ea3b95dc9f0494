"""Dashboard routes, included at /admin/dashboard/ (before the admin site's own)."""

from __future__ import annotations

from django.urls import path

from dashboard import sse, views

app_name = "dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("stream", sse.stream, name="stream"),
    path("queues/<str:name>/pause", views.queue_pause, name="queue-pause"),
    path("queues/<str:name>/resume", views.queue_resume, name="queue-resume"),
    path("queues/<str:name>/purge", views.queue_purge, name="queue-purge"),
    path("tasks/", views.tasks, name="tasks"),
    path("tasks/<uuid:task_id>", views.task_detail, name="task"),
    path("tasks/<uuid:task_id>/status", views.task_status, name="task-status"),
    path("tasks/<uuid:task_id>/cancel", views.task_cancel, name="task-cancel"),
    path("dlq/", views.dlq, name="dlq"),
    path("dlq/replay", views.dlq_replay, name="dlq-replay"),
    path("dlq/discard", views.dlq_discard, name="dlq-discard"),
    path("dlq/<uuid:task_id>/replay", views.dlq_replay_one, name="dlq-replay-one"),
    path("dlq/<uuid:task_id>/discard", views.dlq_discard_one, name="dlq-discard-one"),
    path("workers/", views.workers, name="workers"),
]
