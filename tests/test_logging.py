"""JSON logs: one line per state transition (API.md fields) and one per HTTP request."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.test import Client

from queues.tests.factories import QueueFactory
from taskforge.lib.logging import JsonFormatter
from tasks import events, transitions
from tasks.models import TaskStatus
from tasks.tests.factories import TaskFactory
from tests.helpers import TRANSITION_FIELDS

S = TaskStatus
REQUEST_FIELDS = {"method", "path", "status", "duration_ms", "remote_addr", "pid"}


def json_lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[dict[str, Any]]:
    """The records of `logger` as the settings' formatter writes them: JSON lines (one
    for each record, or for each transition of a batch statement's record)."""
    formatter = JsonFormatter()
    lines: list[dict[str, Any]] = []
    for record in caplog.records:
        if record.name == logger:
            text = formatter.format(record)
            lines.extend(json.loads(part) for part in text.split("\n"))
    return lines


# --- transitions ------------------------------------------------------------------------


@pytest.mark.django_db
def test_transitions__one_json_line_per_transition_with_the_api_fields(
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    """Every verb, the SQL hot paths (buffer_due, hand_out, ack) too: the lines
    tell the same chain as the task's events, one line per event."""
    caplog.set_level(logging.INFO, logger="taskforge.transitions")
    queue = QueueFactory(name="logged", max_retries=1)
    with django_capture_on_commit_callbacks(execute=True):
        a: Any = TaskFactory(queue=queue)
        with transaction.atomic():
            transitions.buffer_due(queue, limit=1)
            a.refresh_from_db()
            transitions.unbuffer([a])
            transitions.buffer_due(queue, limit=1)
            [a] = transitions.hand_out([str(a.pk)], worker_id="w1")
            transitions.fail(a, error="boom", retry_after_seconds=0)
            transitions.promote([a])
            transitions.buffer_due(queue, limit=1)
            [a] = transitions.hand_out([str(a.pk)], worker_id="w1")
            transitions.fail(a, error="boom")  # attempts spent: dead
            transitions.replay([a])
            transitions.cancel([a])
        b = TaskFactory(queue=queue, status=S.CLAIMED)
        transitions.hand_out([str(b.pk)], worker_id="w2", queues={queue.pk: queue})
        transitions.ack([(str(b.pk), 1, None)], worker_id="w2", queues={queue.pk: queue})

    lines = json_lines(caplog, "taskforge.transitions")

    assert all(set(line) == TRANSITION_FIELDS | {"level", "logger"} for line in lines), lines
    assert all(line["queue"] == "logged" and line["ts"].endswith("Z") for line in lines)
    for task, names in (
        (
            a,
            [
                "created",
                "buffered",
                "unbuffered",
                "buffered",
                "handed_out",
                "failed",
                "promoted",
                "buffered",
                "handed_out",
                "dead_lettered",
                "replayed",
                "cancelled",
            ],
        ),
        (b, ["created", "buffered", "handed_out", "acked"]),
    ):
        mine = [line for line in lines if line["task_id"] == str(task.pk)]
        assert [line["event"] for line in mine] == [f"task.{name}" for name in names]
        assert [
            (line["from_status"], line["to_status"], line["attempt"], line["worker_id"])
            for line in mine
        ] == [(e.from_status, e.to_status, e.attempt, e.worker_id) for e in events.chain(task, 50)]
        assert mine[0]["from_status"] is None and mine[0]["to_status"] == S.PENDING
        assert mine[0]["duration_ms"] is None
        assert all(line["duration_ms"] >= 0 for line in mine[1:])


@pytest.mark.django_db
def test_transitions__a_batch_statement_writes_one_line_per_task(
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    """A statement of several tasks logs one record, written as one JSON line per
    transition with the same fields as a single task's line."""
    caplog.set_level(logging.INFO, logger="taskforge.transitions")
    queue = QueueFactory(name="batched")
    with django_capture_on_commit_callbacks(execute=True):
        tasks = [TaskFactory(queue=queue, status=S.CLAIMED) for _ in range(3)]
    caplog.clear()
    with django_capture_on_commit_callbacks(execute=True):
        handed = transitions.hand_out([str(t.pk) for t in tasks], worker_id="w1")
        transitions.ack([(str(t.pk), 1, None) for t in handed], worker_id="w1")

    records = [r for r in caplog.records if r.name == "taskforge.transitions"]
    assert [r.getMessage() for r in records] == ["task.handed_out", "task.acked"]
    lines = json_lines(caplog, "taskforge.transitions")
    assert all(set(line) == TRANSITION_FIELDS | {"level", "logger"} for line in lines), lines
    assert sorted(line["task_id"] for line in lines[:3]) == sorted(str(t.pk) for t in tasks)
    assert [line["event"] for line in lines] == ["task.handed_out"] * 3 + ["task.acked"] * 3
    assert all(line["to_status"] == S.DONE and line["worker_id"] == "w1" for line in lines[3:])
    raw = JsonFormatter().format(records[1]).split("\n")
    assert raw[0].startswith('{"ts": ') and len(raw) == 3  # the single line's spelling


@pytest.mark.django_db
def test_transitions__no_line_for_a_rolled_back_transition(
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    caplog.set_level(logging.INFO, logger="taskforge.transitions")
    task = TaskFactory(queue=QueueFactory())

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        try:
            with transaction.atomic():
                transitions.cancel([task])
                raise RuntimeError("roll back")
        except RuntimeError:
            pass

    assert callbacks == []
    assert json_lines(caplog, "taskforge.transitions") == []


# --- requests ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_request_log__one_json_line_per_request(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="taskforge.request")

    client.get("/healthz?token=do-not-log-me")

    [line] = json_lines(caplog, "taskforge.request")
    assert set(line) == REQUEST_FIELDS | {"ts", "level", "logger", "event"}
    assert line["event"] == "http.request"
    assert line["method"] == "GET"
    assert line["path"] == "/healthz"  # no query string: it may carry secrets
    assert line["status"] == 200
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    assert line["remote_addr"] == "127.0.0.1"
    assert line["pid"] == os.getpid()
    assert "do-not-log-me" not in json.dumps(line)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("get", "/queues", 401),  # no key
        ("get", "/nowhere", 404),
        ("post", "/healthz", 405),
        ("get", "/boom/django/runtime", 500),
    ],
)
@pytest.mark.urls("tests.urls_boom")
def test_request_log__logs_error_answers_too(
    caplog: pytest.LogCaptureFixture, method: str, path: str, expected: int
) -> None:
    caplog.set_level(logging.INFO, logger="taskforge.request")
    client = Client(raise_request_exception=False)

    response = getattr(client, method)(path)

    assert response.status_code == expected
    [line] = json_lines(caplog, "taskforge.request")
    assert (line["method"], line["path"], line["status"]) == (method.upper(), path, expected)


@pytest.mark.django_db
def test_request_log__sees_answers_of_other_middleware(
    client: Client, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    """Outermost middleware: a 413 from the size guard is logged too."""
    caplog.set_level(logging.INFO, logger="taskforge.request")
    settings.TASKFORGE_MAX_REQUEST_BYTES = 10

    response = client.post("/queues", data="x" * 100, content_type="application/json")

    assert response.status_code == 413
    [line] = json_lines(caplog, "taskforge.request")
    assert line["status"] == 413


def test_settings__one_logging_configuration_all_json() -> None:
    assert settings.MIDDLEWARE[0] == "taskforge.api.request_log.RequestLogMiddleware"
    logging_config = settings.LOGGING
    assert logging_config["formatters"] == {"json": {"()": "taskforge.lib.logging.JsonFormatter"}}
    handlers = logging_config["handlers"]
    assert isinstance(handlers, dict)
    assert all(h["formatter"] == "json" for h in handlers.values())
    assert isinstance(logging.getLogger().handlers[0].formatter, JsonFormatter)


def test_json_formatter__timestamp_is_the_records_time_in_utc() -> None:
    """`ts` is RFC 3339 UTC to the microsecond, the record's own time (no clock read)."""
    formatter = JsonFormatter()
    for created in (0.0, 1_764_478_965.995018, 1_764_478_965.000001, 1_764_478_966.999999):
        record = logging.makeLogRecord({"msg": "x", "created": created})
        expected = datetime.fromtimestamp(created, tz=UTC)
        ts = json.loads(formatter.format(record))["ts"]
        assert ts.endswith("Z") and len(ts) == 27, ts
        parsed = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        assert abs((parsed - expected).total_seconds()) <= 1e-6, (ts, expected)


def test_json_formatter__keeps_the_spaced_layout() -> None:
    """`"key": value` with spaces, as every release wrote it: greps of the logs keep working."""
    record = logging.makeLogRecord({"msg": "loop.started", "loop": "dispatcher"})
    text = JsonFormatter().format(record)
    assert '"event": "loop.started", "loop": "dispatcher"' in text


def test_json_formatter__writes_what_the_stdlib_encoder_writes() -> None:
    """Any value a line may carry reads as json.dumps(default=str, ensure_ascii=False)
    writes it: odd floats, non-ASCII and escapes, lists, and str() of anything else."""
    extra = {
        "task_id": uuid.UUID("01a2342d-b443-7308-ad96-48ee20da1572"),
        "at": datetime(2026, 12, 2, 1, 2, 3, 456789, tzinfo=UTC),
        "duration_ms": 3.235,
        "ratio": float("nan"),
        "big": float("inf"),
        "text": 'é \u2028 "quoted" \\ \n',
        "queues": ["a", "b", None, True, 1],
        "nested": {"k": [1.5, {"z": None}]},
    }
    record = logging.makeLogRecord(
        {"msg": "task.acked", "created": 0.0, "name": "t", "levelname": "INFO", **extra}
    )
    text = JsonFormatter().format(record)
    expected: dict[str, object] = {"ts": "1970-01-01T00:00:00.000000Z", "level": "info"}
    expected |= {"logger": "t"}
    expected |= {"event": "task.acked", **extra}
    assert text == json.dumps(expected, default=str, ensure_ascii=False)


def test_json_formatter__a_batch_record_writes_each_line_as_its_own_record_would() -> None:
    """A record of several transitions (JSON_LINES): each line is the text a record of
    that entry alone writes, whatever the entry holds (nothing, or a key of the record's)."""
    from taskforge.lib.logging import JSON_LINES

    entries: list[dict[str, object]] = [
        {"task_id": "01a2342d-b443-7308-ad96-48ee20da1572", "attempt": 2, "worker": 'a", "b'},
        {},
        {"event": "task.renamed", "text": "é \u2028"},
    ]
    common = {"msg": "task.acked", "created": 0.0, "name": "t", "levelname": "INFO", "pid": 7}
    text = JsonFormatter().format(logging.makeLogRecord({**common, JSON_LINES: entries}))
    alone = [JsonFormatter().format(logging.makeLogRecord({**common, **e})) for e in entries]
    assert text.split("\n") == alone
    assert alone[1] == (
        '{"ts": "1970-01-01T00:00:00.000000Z", "level": "info", "logger": "t", '
        '"event": "task.acked", "pid": 7}'
    )


def test_gunicorn_lines__format_under_our_logging_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Regression for issue 11: Ctrl-C in `make run` printed "--- Logging error ---"
    tracebacks, gunicorn's `%(process)d` finding no process id on the record."""
    from gunicorn.glogging import Logger as GunicornLogger

    record = logging.LogRecord(
        "gunicorn.error", logging.INFO, __file__, 1, "Worker exiting", (), None
    )
    formatter = logging.Formatter(GunicornLogger.error_fmt, GunicornLogger.datefmt)
    assert f"[{os.getpid()}] [INFO] Worker exiting" in formatter.format(record)


@pytest.fixture
def plain_logger() -> Any:
    """A logger as LOGGING sets one up (a StreamHandler with the JSON formatter), on a
    buffer.  Not one of logging's registered loggers and not propagating, so pytest's
    capture handlers (on the root, and on registered loggers that do not propagate)
    are not on its way."""
    import io

    logger = logging.Logger("taskforge.tests.plain", logging.INFO)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.propagate = False
    return logger, handler, stream


def _without_ts(text: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        assert line.pop("ts").endswith("Z")
    return lines


def test_direct_info__writes_what_logger_info_writes(plain_logger: Any) -> None:
    """`taskforge.lib.logging.info` writes the text `logger.info` writes (but the
    clock's reading), for one line and for a batch, key order included."""
    from taskforge.lib import logging as json_logging
    from taskforge.lib.logging import JSON_LINES

    logger, handler, stream = plain_logger
    assert json_logging._plain_handlers(logger) == [handler]  # the direct write
    one = {"task_id": "01a2342d-b443-7308-ad96-48ee20da1572", "queue": "q", "attempt": 1}
    batch = {JSON_LINES: [one, {"task_id": "b", "text": 'é "x"'}, {}]}
    for extra in (one, batch, {}):
        json_logging.info(logger, "task.acked", extra)
        direct = stream.getvalue()
        stream.seek(0)
        stream.truncate()
        logger.info("task.acked", extra=extra)
        through = stream.getvalue()
        stream.seek(0)
        stream.truncate()
        assert direct.endswith("\n") and direct.count("\n") == through.count("\n")
        assert json.dumps(_without_ts(direct)) == json.dumps(_without_ts(through))


def test_direct_info__any_other_setup_goes_through_logging(
    plain_logger: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A filter, another kind of handler or a record factory: `Logger.info` takes
    the line, so what they do still happens (pytest's caplog sees the records)."""
    from taskforge.lib import logging as json_logging

    logger, handler, stream = plain_logger
    handler.addFilter(lambda record: True)
    assert json_logging._plain_handlers(logger) is None
    handler.filters.clear()
    logger.parent = logging.getLogger()
    logger.propagate = True  # pytest's capture handler on the root, now reached
    assert json_logging._plain_handlers(logger) is None
    caplog.set_level(logging.INFO, logger=logger.name)
    json_logging.info(logger, "task.acked", {"task_id": "x"})
    assert [r.task_id for r in caplog.records if r.name == logger.name] == ["x"]  # type: ignore[attr-defined]
    assert json.loads(stream.getvalue())["task_id"] == "x"
    logger.propagate = False
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *a, **k: factory(*a, **k))
    try:
        assert json_logging._plain_handlers(logger) is None
    finally:
        logging.setLogRecordFactory(factory)
    assert json_logging._plain_handlers(logger) == [handler]


def test_direct_info__below_the_level_writes_nothing(plain_logger: Any) -> None:
    from taskforge.lib import logging as json_logging

    logger, handler, stream = plain_logger
    logger.setLevel(logging.WARNING)
    json_logging.info(logger, "task.acked", {"task_id": "x"})
    logger.setLevel(logging.INFO)
    handler.setLevel(logging.WARNING)
    json_logging.info(logger, "task.acked", {"task_id": "x"})
    assert stream.getvalue() == ""
