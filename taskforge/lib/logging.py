"""One JSON object per log line, for every record TaskForge writes."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RESERVED = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# The stdlib's encoder, not orjson (taskforge.lib.jsonutil): lines keep the
# `"key": value` spacing that tools grepping the logs may rely on.  Through its
# public API: the C encoder made once (`json.encoder.c_make_encoder`, private)
# saved ~1.1 us of CPU a line (a transition's: 3.9 -> 2.8 us, best of 15), so
# ~2 us for a single-path request's two lines (its transition's and
# `http.request`), ~1 us a task in a batch: far below what a private part must
# buy to be kept (~50 us a request, taskforge.lib.internals).
_encode: Callable[[Any], str] = json.JSONEncoder(default=str, ensure_ascii=False).encode


# A record whose `extra` holds this key, a list of dicts, is written as one JSON line
# per dict (the transitions of one batch statement: tasks.transitionlog.log).
JSON_LINES = "_json_lines"

# (unix second, its "YYYY-MM-DDTHH:MM:SS"): lines of the same second share it.
_second: tuple[int, str] = (-1, "")


def _timestamp(created: float) -> str:
    """RFC 3339 UTC with microseconds, as `2026-11-30T05:02:45.995018Z`."""
    global _second
    second = int(created)
    cached = _second  # one read: another thread may replace it
    if cached[0] != second:
        cached = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        _second = cached
    return f"{cached[1]}.{int((created - second) * 1_000_000):06d}Z"


class JsonFormatter(logging.Formatter):
    """Formats a record as `{"ts", "level", "logger", "event", ...extra}`.

    The message is the `event`; variable data travels in `extra={...}` and
    becomes top-level keys, so a transition line reads
    `{"ts": ..., "event": "task.acked", "task_id": ..., ...}`.  Every task
    transition writes a line, so this is on the hot paths: kept lean.
    """

    def format(self, record: logging.LogRecord) -> str:
        return render(
            record.created,
            record.levelname,
            record.name,
            record.getMessage(),
            record.__dict__,
            self.formatException(record.exc_info) if record.exc_info else None,
            record.__dict__.get(JSON_LINES),
            skip=_RESERVED,
        )


def render(
    created: float,
    level: str,
    name: str,
    event: str,
    fields: Mapping[str, Any],
    exc: str | None = None,
    batch: list[dict[str, Any]] | None = None,
    *,
    skip: frozenset[str] = frozenset(),
) -> str:
    """The text of a record: `{"ts", "level", "logger", "event", ...fields}` (but
    the fields named in `skip` or starting with `_`), and with a batch
    (`JSON_LINES`) one such line per entry."""
    line: dict[str, Any] = {
        "ts": _timestamp(created),
        "level": level.lower(),
        "logger": name,
        "event": event,
    }
    for key, value in fields.items():
        if key not in skip and key[0] != "_":
            line[key] = value
    if exc is not None:
        line["exc"] = exc
    if batch is not None:
        # One line per entry, each as a record of its own would read: the
        # record's own fields, encoded once, then the entry's.
        head = _encode(line)[:-1]  # without its closing brace
        return "\n".join(
            [
                _spliced(head, _encode(entry))
                if line.keys().isdisjoint(entry)
                else _encode(line | entry)
                for entry in batch
            ]
        )
    return _encode(line)


def _spliced(head: str, entry: str) -> str:
    """`{"ts": ..., "event": ...` and `{"task_id": ...}` as one object."""
    return head + "}" if entry == "{}" else head + ", " + entry[1:]


def lean_records() -> None:
    """Spare each record the thread lookups no line prints.

    The logging HOWTO's "Optimization" section.  The process id stays:
    gunicorn's own lines print `%(process)d` (without it every line it logs
    while stopping was a "--- Logging error ---" traceback).  The private
    `_srcfile = None` (no caller lookup) is left alone: it saved ~1 us a
    record, see taskforge.lib.internals.
    """
    logging.logThreads = False
    logging.logMultiprocessing = False


def info(logger: logging.Logger, event: str, extra: dict[str, Any]) -> None:
    """`logger.info(event, extra=extra)`, the same text written without a LogRecord
    when the line goes only to plain JSON stream handlers (the LOGGING setting's).

    The hot paths write four transition lines and three request lines per task on
    the single path; through `Logger.info` a line cost ~10 us here (the record,
    its handling, the formatter's pass over the record's attributes), written
    directly ~4 us, the same bytes (tests/test_logging.py compares them).  Any
    other setup (a filter, another handler, a record factory, pytest's caplog)
    takes `Logger.info`.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    handlers = _plain_handlers(logger)
    if handlers is None:
        logger.info(event, extra=extra)
        return
    text = render(
        time.time(),
        "INFO",
        logger.name,
        event,
        extra,
        None,
        extra.get(JSON_LINES),
    )
    for handler in handlers:
        # What Handler.handle and StreamHandler.emit do with a formatted record.
        with handler.lock:  # type: ignore[union-attr]
            try:
                handler.stream.write(text + handler.terminator)
                handler.flush()
            except RecursionError:
                raise
            except Exception:
                handler.handleError(
                    logger.makeRecord(logger.name, logging.INFO, "", 0, event, (), None)
                )


def _plain_handlers(logger: logging.Logger) -> list[logging.StreamHandler[Any]] | None:
    """The handlers a record of `logger` at INFO would reach, if each is a plain
    StreamHandler with a JsonFormatter and nothing on the way filters or adds to
    the record; None otherwise."""
    if logging.getLogRecordFactory() is not logging.LogRecord:
        return None
    found: list[logging.StreamHandler[Any]] = []
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if (
                type(handler) is not logging.StreamHandler
                or type(handler.formatter) is not JsonFormatter
                or handler.filters
            ):
                return None
            if handler.level <= logging.INFO:
                found.append(handler)
        if not current.propagate:
            break
        current = current.parent
    # No handler at all: logging's last resort decides (it prints nothing at INFO).
    return found or None
