"""`taskforge`: the command line on top of `TaskForge` (JSON on stdout).

Examples::

    taskforge queues    (or: taskforge queues list)
    taskforge queues create emails --max-retries 5 --rate-limit 20 --max-concurrency 10
    taskforge queues update emails --max-concurrency none    # none: no limit
    taskforge queues update emails --retry-policy '{"max_backoff_seconds": 60}'    # or none
    taskforge queues pause emails  |  taskforge queues resume emails
    taskforge enqueue emails '{"to": "a@example.com"}' --priority 1 --delay 30
    taskforge task emails 0190...  |  taskforge task cancel emails 0190...
    taskforge stats emails
    taskforge dlq list emails
    taskforge dlq replay emails ID [ID ...]    |  taskforge dlq replay emails --all
    taskforge dlq discard emails ID            # deleted for good
    taskforge schedules create reports nightly '0 3 * * *' '{"n": 1}' --timezone Europe/Paris
    taskforge schedules list reports  |  taskforge schedules show reports nightly
    taskforge schedules pause reports nightly  |  taskforge schedules resume reports nightly
    taskforge schedules update reports nightly --cron '30 3 * * *'
    taskforge schedules delete reports nightly

The server and key come from --url/--api-key or TASKFORGE_URL/TASKFORGE_API_KEY. An API
error prints `{"error": {...}}` on stderr and exits 1 (2 for a usage error).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from taskforge_client.client import TaskForge
from taskforge_client.errors import TaskForgeError
from taskforge_client.http import key_in_argv_warning


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskforge", description="TaskForge command line.")
    parser.add_argument("--url", default=os.environ.get("TASKFORGE_URL"))
    parser.add_argument("--api-key", default=os.environ.get("TASKFORGE_API_KEY"))
    parser.add_argument("--timeout", type=float, default=10.0)
    sub = parser.add_subparsers(dest="command", required=True)

    queues = sub.add_parser("queues", help="list queues; create, change, pause, resume one")
    queues_sub = queues.add_subparsers(dest="queues_command")
    queues_sub.add_parser("list", help="list queues (the default)")
    for verb, text in [("create", "add a queue (admin)"), ("update", "change a queue (admin)")]:
        one = queues_sub.add_parser(verb, help=text)
        one.add_argument("name")
        one.add_argument("--max-retries", type=int)
        one.add_argument("--rate-limit", type=_int_or_none, help="tasks per second, or none")
        one.add_argument(
            "--max-concurrency",
            type=_int_or_none,
            help="tasks executing at once across all workers, or none",
        )
        one.add_argument(
            "--push-url",
            help="POST each task to this URL instead of workers claiming it"
            + (
                " (replaces the whole push target; none: back to workers)"
                if verb == "update"
                else ""
            ),
        )
        one.add_argument("--push-timeout", type=int, help="seconds the target has (default 30)")
        one.add_argument(
            "--push-header",
            action="append",
            default=[],
            metavar="NAME:VALUE",
            help="a header sent with every push request (repeatable)",
        )
        one.add_argument(
            "--retry-policy",
            type=_object_or_none,
            metavar="JSON",
            help='the backoff between attempts, e.g. \'{"min_backoff_seconds": 1, '
            '"max_backoff_seconds": 300, "max_doublings": 5}\', or none',
        )
        one.add_argument(
            "--key-weight",
            action="append",
            default=[],
            metavar="KEY=WEIGHT",
            help="a fairness key's weight, 1..100 (repeatable; on update, replaces them all)",
        )
        one.add_argument(
            "--key-max-concurrency",
            type=_int_or_none,
            help="tasks of one fairness key executing at once, or none",
        )
        one.add_argument(
            "--key-rate-limit",
            type=_number_or_none,
            help="hand-outs per second per fairness key, or none",
        )
        if verb == "create":
            one.add_argument("--paused", action="store_true", help="create it paused")
    for verb, text in [("show", "show a queue"), ("pause", "pause a queue (admin)")]:
        queues_sub.add_parser(verb, help=text).add_argument("name")
    queues_sub.add_parser("resume", help="resume a queue (admin)").add_argument("name")

    enqueue = sub.add_parser("enqueue", help="add a task")
    enqueue.add_argument("queue")
    enqueue.add_argument("payload", help="the payload, as JSON")
    enqueue.add_argument("--priority", type=int)
    when = enqueue.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, help="seconds from now")
    when.add_argument("--at", help="ISO 8601 time with Z or an offset")
    enqueue.add_argument("--idempotency-key")
    enqueue.add_argument("--max-retries", type=int)
    enqueue.add_argument("--fairness-key", help="the tenant the task belongs to")

    task = sub.add_parser(
        "task",
        help="show a task, or cancel one",
        usage="taskforge task [show] QUEUE ID [--events]\n       taskforge task cancel QUEUE ID",
    )
    task.add_argument("words", nargs="+", metavar="[show|cancel] QUEUE ID")  # see _task_words
    task.add_argument("--events", action="store_true", help="also its state transitions")

    stats = sub.add_parser("stats", help="a queue's stats")
    stats.add_argument("queue")

    dlq = sub.add_parser("dlq", help="dead-letter queue")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True)
    dlq_list = dlq_sub.add_parser("list", help="list dead tasks")
    dlq_list.add_argument("queue")
    dlq_list.add_argument("--limit", type=int, default=100)
    replay = dlq_sub.add_parser("replay", help="replay dead tasks")
    replay.add_argument("queue")
    replay.add_argument("ids", nargs="*")
    replay.add_argument("--all", action="store_true")
    discard = dlq_sub.add_parser("discard", help="delete a dead task for good")
    discard.add_argument("queue")
    discard.add_argument("id")

    schedules = sub.add_parser("schedules", help="cron schedules (admin)")
    sched_sub = schedules.add_subparsers(dest="schedules_command", required=True)
    sched_list = sched_sub.add_parser("list", help="a queue's schedules")
    sched_list.add_argument("queue")
    create = sched_sub.add_parser("create", help="add a schedule")
    create.add_argument("queue")
    create.add_argument("name")
    create.add_argument("cron", help="5-field cron expression or @hourly, @daily, ...")
    create.add_argument("payload", help="the payload of each task, as JSON")
    create.add_argument("--timezone", help="IANA name (default UTC)")
    create.add_argument("--priority", type=int)
    create.add_argument("--max-retries", type=int)
    create.add_argument("--paused", action="store_true", help="create it paused")
    update = sched_sub.add_parser("update", help="change a schedule")
    update.add_argument("queue")
    update.add_argument("name")
    update.add_argument("--cron")
    update.add_argument("--timezone")
    update.add_argument("--payload", help="as JSON")
    update.add_argument("--priority", type=int)
    update.add_argument("--max-retries", type=int)
    for verb, text in [
        ("show", "show a schedule"),
        ("pause", "pause a schedule"),
        ("resume", "resume a schedule (the latest missed time is enqueued once)"),
        ("delete", "delete a schedule"),
    ]:
        one = sched_sub.add_parser(verb, help=text)
        one.add_argument("queue")
        one.add_argument("name")
    return parser


_NONE = object()  # `none` on the command line: remove the limit


def _int_or_none(text: str) -> Any:
    if text.lower() == "none":
        return _NONE
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer or none: {text!r}") from None


def _object_or_none(text: str) -> Any:
    if text.lower() == "none":
        return _NONE
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON or none: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object or none: {text!r}")
    return value


def _number_or_none(text: str) -> Any:
    if text.lower() == "none":
        return _NONE
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or none: {text!r}") from None


def _key_weights(args: argparse.Namespace) -> dict[str, int] | None:
    """The --key-weight KEY=WEIGHT options as a map (None when none was given)."""
    if not args.key_weight:
        return None
    weights: dict[str, int] = {}
    for item in args.key_weight:
        key, sep, weight = item.rpartition("=")
        if not sep or not weight.isdigit():
            raise ValueError(f"--key-weight wants KEY=WEIGHT, not {item!r}")
        weights[key] = int(weight)
    return weights


def _task_words(args: argparse.Namespace) -> str | None:
    """Split `task`'s words into args.action, args.queue, args.id; a usage error or None.

    `task QUEUE ID` and `task show QUEUE ID` show, `task cancel QUEUE ID` cancels. Two words
    starting with show or cancel are refused (the queue was left out, most likely): a queue
    with one of those names is shown with `task show cancel ID`.
    """
    words = args.words
    if len(words) == 3 and words[0] in ("show", "cancel"):
        args.action, args.queue, args.id = words
    elif len(words) == 2 and words[0] not in ("show", "cancel"):
        args.action, (args.queue, args.id) = "show", words
    else:
        return "task: give QUEUE ID (or show QUEUE ID) to show a task, cancel QUEUE ID to cancel it"
    if args.action == "cancel" and args.events:
        return "task cancel: --events is for showing a task"
    return None


def _run_queues(args: argparse.Namespace, client: TaskForge) -> Any:
    command = args.queues_command
    if command in (None, "list"):
        return {"results": [q.raw for q in client.list_queues()]}
    if command == "create":
        return client.create_queue(
            args.name,
            max_retries=args.max_retries,
            rate_limit=None if args.rate_limit is _NONE else args.rate_limit,
            max_concurrency=None if args.max_concurrency is _NONE else args.max_concurrency,
            push=_push(args),
            paused=True if args.paused else None,
            retry_policy=None if args.retry_policy is _NONE else args.retry_policy,
            key_weights=_key_weights(args),
            key_max_concurrency=None
            if args.key_max_concurrency is _NONE
            else args.key_max_concurrency,
            key_rate_limit=None if args.key_rate_limit is _NONE else args.key_rate_limit,
        ).raw
    if command == "update":
        changes: dict[str, Any] = {}
        if args.key_weight:
            changes["key_weights"] = _key_weights(args)
        for name in (
            "rate_limit",
            "max_concurrency",
            "retry_policy",
            "key_max_concurrency",
            "key_rate_limit",
        ):
            value = getattr(args, name)
            if value is not None:
                changes[name] = None if value is _NONE else value
        if args.push_url is not None:
            changes["push"] = None if args.push_url.lower() == "none" else _push(args)
        elif args.push_timeout is not None or args.push_header:
            raise ValueError("--push-timeout and --push-header need --push-url")
        return client.update_queue(args.name, max_retries=args.max_retries, **changes).raw
    if command == "show":
        return client.get_queue(args.name).raw
    if command == "pause":
        return client.pause_queue(args.name).raw
    if command == "resume":
        return client.resume_queue(args.name).raw
    raise AssertionError(args)  # pragma: no cover


def _push(args: argparse.Namespace) -> dict[str, Any] | None:
    """The `push` object of --push-url, --push-timeout and --push-header (None without a URL)."""
    if args.push_url is None:
        if args.push_timeout is not None or args.push_header:
            raise ValueError("--push-timeout and --push-header need --push-url")
        return None
    push: dict[str, Any] = {"url": args.push_url}
    if args.push_timeout is not None:
        push["timeout_seconds"] = args.push_timeout
    headers = {}
    for item in args.push_header:
        name, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"--push-header {item!r}: expected NAME:VALUE")
        headers[name.strip()] = value.strip()
    if headers:
        push["headers"] = headers
    return push


def _run_schedules(args: argparse.Namespace, client: TaskForge) -> Any:
    command = args.schedules_command
    if command == "list":
        return {"results": [s.raw for s in client.list_schedules(args.queue)]}
    if command == "create":
        return client.create_schedule(
            args.queue,
            args.name,
            args.cron,
            json.loads(args.payload),
            timezone=args.timezone,
            priority=args.priority,
            max_retries=args.max_retries,
            paused=True if args.paused else None,
        ).raw
    if command == "update":
        changes: dict[str, Any] = {
            "cron": args.cron,
            "timezone": args.timezone,
            "priority": args.priority,
        }
        if args.payload is not None:
            changes["payload"] = json.loads(args.payload)
        if args.max_retries is not None:
            changes["max_retries"] = args.max_retries
        return client.update_schedule(args.queue, args.name, **changes).raw
    if command == "show":
        return client.get_schedule(args.queue, args.name).raw
    if command == "pause":
        return client.pause_schedule(args.queue, args.name).raw
    if command == "resume":
        return client.resume_schedule(args.queue, args.name).raw
    if command == "delete":
        client.delete_schedule(args.queue, args.name)
        return {"deleted": True}
    raise AssertionError(args)  # pragma: no cover


def _run(args: argparse.Namespace, client: TaskForge) -> Any:
    if args.command == "queues":
        return _run_queues(args, client)
    if args.command == "enqueue":
        from taskforge_client.models import parse_time

        payload = json.loads(args.payload)
        return client.enqueue(
            args.queue,
            payload,
            priority=args.priority,
            delay=args.delay,
            at=parse_time(args.at) if args.at else None,
            idempotency_key=args.idempotency_key,
            max_retries=args.max_retries,
            fairness_key=args.fairness_key,
        ).raw
    if args.command == "task" and args.action == "cancel":
        return client.cancel_task(args.queue, args.id).raw
    if args.command == "task":
        out = client.get_task(args.queue, args.id).raw
        if args.events:
            out = {**out, "events": [e.raw for e in client.task_events(args.queue, args.id)]}
        return out
    if args.command == "stats":
        return client.stats(args.queue).raw
    if args.command == "dlq" and args.dlq_command == "list":
        return {"results": [d.raw for d in client.dlq(args.queue, limit=args.limit)]}
    if args.command == "dlq" and args.dlq_command == "replay":
        if args.all:
            return {"replayed": client.replay_all(args.queue)}
        return {"replayed": client.replay_many(args.queue, args.ids)}
    if args.command == "dlq" and args.dlq_command == "discard":
        client.discard(args.queue, args.id)
        return {"discarded": True}
    if args.command == "schedules":
        return _run_schedules(args, client)
    raise AssertionError(args)  # pragma: no cover


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `taskforge` console script; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    warning = key_in_argv_warning(argv)
    # Only to a person: a script reads stderr as the error's JSON.
    if warning and sys.stderr.isatty():
        print(f"warning: {warning}", file=sys.stderr)
    if not args.url or not args.api_key:
        parser.error("--url and --api-key (or TASKFORGE_URL and TASKFORGE_API_KEY) are required")
    if args.command == "dlq" and args.dlq_command == "replay" and bool(args.all) == bool(args.ids):
        parser.error("dlq replay: give task ids or --all (not both)")
    if args.command == "task" and (problem := _task_words(args)):
        parser.error(problem)
    payload = getattr(args, "payload", None)
    if payload is not None:
        try:
            json.loads(payload)
        except ValueError as exc:
            parser.error(f"payload is not JSON: {exc}")
    with TaskForge(args.url, args.api_key, timeout=args.timeout) as client:
        try:
            out = _run(args, client)
        except TaskForgeError as exc:
            sys.stderr.write(json.dumps(exc.to_dict()) + "\n")
            return 1
        except ValueError as exc:
            parser.error(str(exc))
    sys.stdout.write(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
