# Cheaper rows (issue 12): fewer index entries and no foreign-key checks per
# event.  The new indexes are built before the old ones go, each without
# locking writes out of a table that may already hold millions of tasks.

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("queues", "0001_initial"),
        ("tasks", "0004_claimed_key"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(("status", "done"), _negated=True),
                fields=["queue", "status", "-created_at", "-id"],
                include=("scheduled_at",),
                name="task_not_done_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="taskevent",
            index=models.Index(
                condition=models.Q(("from_status", "executing")),
                fields=["queue", "at"],
                name="taskevent_outcome_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(("status", "dead")), fields=["queue"], name="task_dead_idx"
            ),
        ),
        RemoveIndexConcurrently(model_name="task", name="task_queue_status_idx"),
        RemoveIndexConcurrently(model_name="task", name="task_queue_status_new_idx"),
        RemoveIndexConcurrently(model_name="taskevent", name="taskevent_queue_at_idx"),
        migrations.AlterField(
            model_name="taskevent",
            name="queue",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="queues.queue",
            ),
        ),
        migrations.AlterField(
            model_name="taskevent",
            name="task",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="events",
                to="tasks.task",
            ),
        ),
    ]
