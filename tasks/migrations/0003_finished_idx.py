# The retention scan's index, built without locking writes out of a table that
# may already hold millions of tasks.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("queues", "0001_initial"),
        ("tasks", "0002_pending_sched_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(("status__in", ["done", "cancelled", "dead"])),
                fields=["status", "finished_at"],
                name="task_finished_idx",
            ),
        ),
    ]
