from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from dashboard import metrics as metrics_views
from dlq.api import views as dlq_views
from taskforge.api import audit as audit_views
from taskforge.api import health
from tasks.api import queues as queue_views
from tasks.api import schedules as schedule_views
from tasks.api import views as task_views
from workers.api import views as worker_views

handler400 = "taskforge.api.handlers.bad_request"
handler403 = "taskforge.api.handlers.permission_denied"
handler404 = "taskforge.api.handlers.page_not_found"
handler500 = "taskforge.api.handlers.server_error"

Q = "queues/<str:name>"

urlpatterns: list[URLPattern | URLResolver] = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_views.metrics, name="metrics"),
    path("queues", queue_views.QueueListView.as_view(), name="queue-list"),
    path(f"{Q}", queue_views.QueueDetailView.as_view(), name="queue-detail"),
    path(f"{Q}/pause", queue_views.QueuePauseView.as_view(), name="queue-pause"),
    path(f"{Q}/resume", queue_views.QueueResumeView.as_view(), name="queue-resume"),
    path(f"{Q}/purge", queue_views.QueuePurgeView.as_view(), name="queue-purge"),
    path(f"{Q}/stats", task_views.QueueStatsView.as_view(), name="queue-stats"),
    path(f"{Q}/keys", task_views.QueueKeysView.as_view(), name="queue-keys"),
    path(f"{Q}/tasks", task_views.TaskListView.as_hot_view(), name="task-list"),
    path(f"{Q}/tasks/batch", task_views.TaskBatchView.as_hot_view(), name="task-batch"),
    path(f"{Q}/tasks/<str:task_id>", task_views.TaskDetailView.as_view(), name="task-detail"),
    path(
        f"{Q}/tasks/<str:task_id>/events",
        task_views.TaskEventsView.as_view(),
        name="task-events",
    ),
    path(f"{Q}/schedules", schedule_views.ScheduleListView.as_view(), name="schedule-list"),
    path(
        f"{Q}/schedules/<str:schedule>",
        schedule_views.ScheduleDetailView.as_view(),
        name="schedule-detail",
    ),
    path(f"{Q}/dlq", dlq_views.DlqListView.as_view(), name="dlq-list"),
    path(f"{Q}/dlq/replay", dlq_views.DlqBulkReplayView.as_view(), name="dlq-replay-bulk"),
    path(f"{Q}/dlq/<str:task_id>", dlq_views.DlqEntryView.as_view(), name="dlq-entry"),
    path(f"{Q}/dlq/<str:task_id>/replay", dlq_views.DlqReplayOneView.as_view(), name="dlq-replay"),
    path("workers", worker_views.WorkerListView.as_view(), name="worker-list"),
    path("workers/claim", worker_views.ClaimView.as_hot_view(), name="worker-claim"),
    path("workers/heartbeat", worker_views.HeartbeatView.as_hot_view(), name="worker-heartbeat"),
    path(
        "workers/heartbeat/batch",
        worker_views.HeartbeatBatchView.as_hot_view(),
        name="worker-heartbeat-batch",
    ),
    path("workers/ack", worker_views.AckView.as_hot_view(), name="worker-ack"),
    path("workers/ack/batch", worker_views.AckBatchView.as_hot_view(), name="worker-ack-batch"),
    path("workers/nack", worker_views.NackView.as_hot_view(), name="worker-nack"),
    path("audit", audit_views.AuditListView.as_view(), name="audit-list"),
    # The Cloud Tasks v2 REST API (API-cloudtasks.md), beside the native one.
    path("", include("cloudtasks.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    # The operator dashboard; before the admin site, whose catch-all would take it.
    path("admin/dashboard/", include("dashboard.urls")),
    path("admin/", admin.site.urls),
]
