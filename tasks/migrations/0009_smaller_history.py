"""Smaller rows of history (storage per finished task, issue 12).

- task_queue_created_idx becomes ascending, (queue, created_at, id): the task
  list reads it backwards just as well, and new entries then go in at the
  index's right end, where Postgres splits a full page 90/10 instead of 50/50.
  It was twice the size it needed to be.  Built under a new name and dropped
  CONCURRENTLY (enqueues, claims and acks go on meanwhile), then renamed.
- taskevent.queue_id may be NULL: only the outcomes of attempts carry it now
  (models.TaskEvent).  Dropping NOT NULL reads and rewrites nothing.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models
from django.db.models.deletion import CASCADE


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("queues", "0003_push"),
        ("tasks", "0008_event_task_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(fields=["queue", "created_at", "id"], name="task_queue_newest_idx"),
        ),
        RemoveIndexConcurrently(model_name="task", name="task_queue_created_idx"),
        migrations.RenameIndex(
            model_name="task",
            old_name="task_queue_newest_idx",
            new_name="task_queue_created_idx",
        ),
        migrations.AlterField(
            model_name="taskevent",
            name="queue",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=CASCADE,
                related_name="+",
                to="queues.queue",
            ),
        ),
    ]
