"""Cron expressions: what a schedule accepts, and when it fires.

The expression is standard 5-field cron (minute hour day-of-month month
day-of-week) or one of the `@` names; croniter parses it and walks the
wall-clock times it names.  The mapping of those wall-clock times to
instants in the schedule's time zone is ours, so daylight saving is handled
in one place, the same way for every expression:

- a wall-clock time the clocks skip (a spring-forward gap) fires once, at
  the first instant after the gap (02:30 on a day 02:00-03:00 is skipped
  fires at 03:00);
- a wall-clock time the clocks repeat (a fall-back overlap) fires once, at
  its first occurrence.

The mapping never goes backwards in time (a later wall-clock time never maps
to an earlier instant), which is what lets `next_after` and `latest_at_or_before`
walk from a starting point without a window to search.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

__all__ = [
    "CronError",
    "latest_at_or_before",
    "next_after",
    "parse_timezone",
    "validate",
]

# The `@` names of classic cron that name times (`@reboot` does not).
MACROS = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
# One field: a list of `*`, a number or a three-letter name, or a range of
# them, each with an optional step.  No `L`, `W`, `#`, `?`, `H` or `R`:
# those are extensions of some crons, not the standard expression.
_ITEM = r"(?:\*|(?:[0-9]+|[A-Za-z]{3})(?:-(?:[0-9]+|[A-Za-z]{3}))?)(?:/[0-9]+)?"
_FIELD = re.compile(rf"{_ITEM}(?:,{_ITEM})*")
FIELDS = 5
# Longer than any daylight-saving shift in the tz database (2 h at most), so a
# walk started this far before a wall-clock time sees every candidate.
_SHIFT_MARGIN = timedelta(hours=3)


class CronError(ValueError):
    """The expression or time zone is not one a schedule accepts."""


def validate(expression: str) -> str:
    """The expression, checked: 5 standard fields or an `@` name, and firing at all.

    Raises:
        CronError: it does not parse, has 6 fields, uses an extension, or
            names no time that exists (`0 0 30 2 *`).
    """
    text = expression.strip()
    if text.startswith("@"):
        if text.lower() not in MACROS:
            raise CronError(f"Unknown name {text!r}; use one of {', '.join(sorted(MACROS))}.")
        text = text.lower()
    else:
        fields = text.split()
        if len(fields) != FIELDS:
            raise CronError(
                f"A cron expression has 5 fields (minute hour day-of-month month "
                f"day-of-week); this one has {len(fields)}."
            )
        bad = [field for field in fields if not _FIELD.fullmatch(field)]
        if bad:
            raise CronError(f"Field {bad[0]!r} is not standard cron.")
        text = " ".join(fields)
    if not croniter.is_valid(text):
        raise CronError(f"{expression!r} is not a valid cron expression.")
    try:
        croniter(text, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterError as exc:
        raise CronError(f"{expression!r} names no time that exists.") from exc
    return text


def parse_timezone(name: str) -> ZoneInfo:
    """The IANA zone of that name.

    Raises:
        CronError: no such zone (or not a name: a path, an empty string).
    """
    if not name or name.startswith(("/", ".")) or ".." in name or "\x00" in name:
        raise CronError(f"{name!r} is not an IANA time zone name.")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise CronError(f"{name!r} is not an IANA time zone name.") from exc


def next_after(expression: str, zone: ZoneInfo, after: datetime) -> datetime:
    """The first fire time strictly after the instant `after`, in UTC."""
    # Every wall-clock time before local(after) maps to an instant at or
    # before `after` (the mapping is monotonic and maps local(after) itself
    # at or before it), so the walk starts there.
    start = after.astimezone(zone).replace(tzinfo=None)
    walk = croniter(expression, start)
    while True:
        fire = _instant(walk.get_next(datetime), zone)
        if fire > after:
            return fire


def latest_at_or_before(expression: str, zone: ZoneInfo, at: datetime) -> datetime:
    """The last fire time at or before the instant `at`, in UTC."""
    # A wall-clock time up to the largest shift after local(at) can still map
    # at or before `at` (the first occurrence of a repeated hour); walking
    # back from there, the first one that does is the latest.
    start = at.astimezone(zone).replace(tzinfo=None) + _SHIFT_MARGIN
    walk = croniter(expression, start)
    while True:
        fire = _instant(walk.get_prev(datetime), zone)
        if fire <= at:
            return fire


def _instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The UTC instant a naive wall-clock time in `zone` fires at (see the module doc)."""
    first = wall.replace(tzinfo=zone, fold=0)
    utc = first.astimezone(UTC)
    if utc.astimezone(zone).replace(tzinfo=None) == wall:
        return utc  # exists; in a repeat, fold=0 is its first occurrence
    # In a gap.  fold=0 reads it with the offset before the gap and fold=1
    # with the one after; the gap's end lies between those two instants:
    # find the first instant whose wall-clock time is past `wall`.
    low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    high = utc
    if low > high:
        low, high = high, low
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).replace(tzinfo=None) > wall:
            high = middle
        else:
            low = middle
    # Transitions fall on whole seconds.
    return high.replace(microsecond=0)
