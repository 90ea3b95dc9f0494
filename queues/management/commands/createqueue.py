"""`manage.py createqueue NAME [--max-retries N] [--rate-limit R] [--max-concurrency C]
[--push-url URL [--push-timeout S] [--push-header NAME:VALUE ...]]
[--key-weight KEY=WEIGHT ...] [--key-max-concurrency C] [--key-rate-limit R] [--paused]`."""

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
        parser.add_argument(
            "--push-url",
            default=None,
            help="Deliver the tasks by POSTing each to this http(s) URL (run_pusher) "
            "instead of to workers that claim them.",
        )
        parser.add_argument(
            "--push-timeout",
            type=int,
            default=None,
            help="Seconds a push target has to answer (1..1800, default 30); needs --push-url.",
        )
        parser.add_argument(
            "--push-header",
            action="append",
            default=[],
            metavar="NAME:VALUE",
            help="A header to send with each push request (repeatable); needs --push-url.",
        )
        parser.add_argument(
            "--key-weight",
            action="append",
            default=[],
            metavar="KEY=WEIGHT",
            help="A fairness key's weight, 1..100 (repeatable); a key not listed weighs 1.",
        )
        parser.add_argument(
            "--key-max-concurrency",
            type=int,
            default=None,
            help="Tasks of one fairness key executing at once (1..100000); omit for no cap.",
        )
        parser.add_argument(
            "--key-rate-limit",
            type=float,
            default=None,
            help="Hand-outs per second per fairness key (> 0); omit for no rate.",
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
        for name in ("key_max_concurrency", "key_rate_limit"):
            if options[name] is not None:
                body[name] = options[name]
        if options["key_weight"]:
            body["key_weights"] = self._weights(options["key_weight"])
        push = self._push(options)
        if push is not None:
            body["push"] = push
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
        self.stdout.write(json.dumps(QueueSerializer(queue, context={"reveal_push": True}).data))

    def _weights(self, items: list[str]) -> dict[str, Any]:
        """The --key-weight KEY=WEIGHT options as the `key_weights` object."""
        weights: dict[str, Any] = {}
        for item in items:
            key, sep, weight = item.rpartition("=")
            if not sep:
                raise CommandError(f"key_weights: {item!r} is not KEY=WEIGHT.")
            try:
                weights[key] = int(weight)
            except ValueError:
                weights[key] = weight  # the serializer says why it is refused
        return weights

    def _push(self, options: dict[str, Any]) -> dict[str, Any] | None:
        """The `push` object of the --push-* options (validated with the rest of the body)."""
        if options["push_url"] is None:
            if options["push_timeout"] is not None or options["push_header"]:
                raise CommandError("--push-timeout and --push-header need --push-url.")
            return None
        push: dict[str, Any] = {"url": options["push_url"]}
        if options["push_timeout"] is not None:
            push["timeout_seconds"] = options["push_timeout"]
        headers: dict[str, str] = {}
        for item in options["push_header"]:
            name, sep, value = item.partition(":")
            if not sep:
                raise CommandError(f"--push-header {item!r}: expected NAME:VALUE.")
            headers[name.strip()] = value.strip()
        if headers:
            push["headers"] = headers
        return push
