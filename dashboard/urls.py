"""Dashboard routes, included at /admin/dashboard/ (before the admin site's own)."""

from __future__ import annotations

from django.urls import path

from dashboard import sse
from dashboard.views import audit, dlq, queues, schedules, tasks, workers

app_name = "dashboard"

urlpatterns = [
    path("", queues.overview, name="overview"),
    path("stream", sse.stream, name="stream"),
    path("queues/<str:name>/pause", queues.queue_pause, name="queue-pause"),
    path("queues/<str:name>/resume", queues.queue_resume, name="queue-resume"),
    path("queues/<str:name>/purge", queues.queue_purge, name="queue-purge"),
    path("tasks/", tasks.tasks, name="tasks"),
    path("tasks/<uuid:task_id>", tasks.task_detail, name="task"),
    path("tasks/<uuid:task_id>/status", tasks.task_status, name="task-status"),
    path("tasks/<uuid:task_id>/cancel", tasks.task_cancel, name="task-cancel"),
    path("dlq/", dlq.dlq, name="dlq"),
    path("dlq/replay", dlq.dlq_replay, name="dlq-replay"),
    path("dlq/discard", dlq.dlq_discard, name="dlq-discard"),
    path("dlq/<uuid:task_id>/replay", dlq.dlq_replay_one, name="dlq-replay-one"),
    path("dlq/<uuid:task_id>/discard", dlq.dlq_discard_one, name="dlq-discard-one"),
    path("workers/", workers.workers, name="workers"),
    path("audit/", audit.audit, name="audit"),
    path("schedules/", schedules.schedules, name="schedules"),
    path("schedules/<uuid:schedule_id>/pause", schedules.schedule_pause, name="schedule-pause"),
    path("schedules/<uuid:schedule_id>/resume", schedules.schedule_resume, name="schedule-resume"),
]
