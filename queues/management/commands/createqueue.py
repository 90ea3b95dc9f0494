"""`manage.py createqueue NAME [--max-retries N] [--rate-limit R] [--max-concurrency C]`."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rest_framework.exceptions import ValidationError

from queues import services
from queues.api.serializers import QueueCreateSerializer, QueueSerializer
from taskforge.api.exceptions import flatten_errors
from taskforge.audit.log import CLI
from taskforge.errors import TaskForgeError


class Command(BaseCommand):
    help = "Create a queue and print it as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--max-retries", type=int, default=None)
        parser.add_argument(
            "--rate-limit", type=int, default=None, help="Tasks per second; omit for unlimited."
        )
        parser.add_argument(
            "--max-concurrency",
            type=int,
            default=None,
            help="Tasks executing at once across all workers (1..100000); omit for unlimited.",
        )
        parser.add_argument("--paused", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        body: dict[str, Any] = {"name": options["name"], "paused": options["paused"]}
        if options["max_retries"] is not None:
            body["max_retries"] = options["max_retries"]
        if options["rate_limit"] is not None:
            body["rate_limit"] = options["rate_limit"]
        if options["max_concurrency"] is not None:
            body["max_concurrency"] = options["max_concurrency"]
        serializer = QueueCreateSerializer(data=body)
        try:
            serializer.is_valid(raise_exception=True)
            queue = services.create_queue(**serializer.validated_data, actor=CLI)
        except ValidationError as exc:
            problems = "; ".join(
                f"{field}: {' '.join(msgs)}" for field, msgs in flatten_errors(exc.detail).items()
            )
            raise CommandError(problems) from exc
        except TaskForgeError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(json.dumps(QueueSerializer(queue).data))
