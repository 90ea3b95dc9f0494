"""DeadCount, each queue's DLQ depth, now the dlq app's: it enters the state of `dlq` over
the table it had under `tasks` (tasks_deadcount), rows and all.

The table keeps its name: processes of the version before, still running during a
rolling upgrade, go on writing it, and their rows count.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0003_deaths"),
        ("queues", "0002_max_concurrency"),
        ("tasks", "0014_deadcount_to_dlq"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="DeadCount",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("dead", models.BigIntegerField()),
                        (
                            "queue",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="queues.queue",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "tasks_deadcount",
                        "indexes": [
                            models.Index(
                                fields=["queue"], include=("dead",), name="deadcount_queue_idx"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
