# The W3C Trace Context an enqueue carried, kept per task (API.md "Tracing (v1.2)").
# Nullable columns without a default: adding them rewrites nothing.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0015_cloudtasks'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='traceparent',
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='tracestate',
            field=models.TextField(blank=True, null=True),
        ),
    ]
