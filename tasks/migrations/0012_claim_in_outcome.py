"""An attempt's claim is recorded by its outcome's event row (`claimed_at`).

A nullable column with no default: adding it rewrites nothing and holds the
table's lock for an instant.  Rows written before keep their claims as rows
of their own (tasks.events reads both shapes).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0011_heartbeats_are_hot"),
    ]

    operations = [
        migrations.AddField(
            model_name="taskevent",
            name="claimed_at",
            field=models.DateTimeField(null=True),
        ),
    ]
