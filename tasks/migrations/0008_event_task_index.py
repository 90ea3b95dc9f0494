"""taskevent_task_idx (task, id) becomes taskevent_by_task_idx (task).

A task's events share one key, so B-tree deduplication stores one entry per
task with a list of its rows: the index is a third of its old size (storage per
finished task, issue 12). Built and dropped CONCURRENTLY: on a server with
history this takes a while, and enqueues, claims and acks go on meanwhile.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("queues", "0003_push"),
        ("tasks", "0007_dead_counts"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskevent",
            index=models.Index(fields=["task"], name="taskevent_by_task_idx"),
        ),
        RemoveIndexConcurrently(
            model_name="taskevent",
            name="taskevent_task_idx",
        ),
    ]
