"""Roles for people: the two groups API.md v1.1 names, and the permission each
dashboard page and action (and each Django admin action) checks.

Superusers hold every permission.  Anyone else needs `is_staff` to sign in,
and then a group (or permissions given one by one in the admin).
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission

VIEWERS = "TaskForge viewers"
OPERATORS = "TaskForge operators"

# Seeing the pages ("app_label.codename", as `User.has_perm` takes them).
VIEW_QUEUES = "queues.view_queue"
VIEW_TASKS = "tasks.view_task"
VIEW_DLQ = "dlq.view_deadlettertask"
VIEW_WORKERS = "workers.view_worker"
VIEW_AUDIT = "audit.view_auditentry"
VIEW_SCHEDULES = "tasks.view_schedule"

# The operator actions (`dashboard.models.Operation`).
PAUSE = "dashboard.pause_queue"  # pause and resume
PURGE = "dashboard.purge_queue"
CANCEL = "dashboard.cancel_task"
REPLAY = "dashboard.replay_task"
DISCARD = "dashboard.discard_task"
PAUSE_SCHEDULE = "dashboard.pause_schedule"  # pause and resume

VIEW = (
    VIEW_QUEUES,
    VIEW_TASKS,
    "tasks.view_taskevent",
    VIEW_DLQ,
    VIEW_WORKERS,
    "api.view_apikey",
    VIEW_AUDIT,
    VIEW_SCHEDULES,
)
OPERATE = (PAUSE, PURGE, CANCEL, REPLAY, DISCARD, PAUSE_SCHEDULE)

# What each group holds; dashboard/migrations/0001_roles.py created them so
# (0002_schedule_roles added the schedules).
GROUPS = {VIEWERS: VIEW, OPERATORS: VIEW + OPERATE}


def ensure_groups() -> None:
    """Create the two groups with exactly their permissions, if a flush (tests)
    or an operator removed them; migrating created them in the first place."""
    for name, permissions in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set([_permission(p) for p in permissions])


def _permission(dotted: str) -> Permission:
    app_label, codename = dotted.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)
