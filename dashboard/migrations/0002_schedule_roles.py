# Schedules (v1.1) in the two groups: both see them, operators pause and resume them.

from django.contrib.auth.management import create_permissions
from django.db import migrations

VIEW = [("tasks", "view_schedule")]
OPERATE = [("dashboard", "pause_schedule")]
GROUPS = {"TaskForge viewers": VIEW, "TaskForge operators": VIEW + OPERATE}


def grant(apps, schema_editor):
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, permissions in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(
            *[
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
                for app_label, codename in permissions
            ]
        )


def revoke(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    for name, permissions in GROUPS.items():
        for group in Group.objects.filter(name=name):
            group.permissions.remove(
                *Permission.objects.filter(
                    content_type__app_label__in=[a for a, _ in permissions],
                    codename__in=[c for _, c in permissions],
                )
            )


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0001_roles"),
        ("tasks", "0006_schedules"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="operation",
            options={
                "default_permissions": (),
                "managed": False,
                "permissions": [
                    ("pause_queue", "Can pause and resume queues"),
                    ("purge_queue", "Can purge queues"),
                    ("cancel_task", "Can cancel tasks"),
                    ("replay_task", "Can replay dead tasks"),
                    ("discard_task", "Can discard dead tasks"),
                    ("pause_schedule", "Can pause and resume schedules"),
                ],
                "verbose_name": "operator action",
            },
        ),
        migrations.RunPython(grant, revoke),
    ]
