"""Display strings for the dashboard, made in Python so the first render and
the live (SSE) updates show exactly the same text."""

from __future__ import annotations

from datetime import UTC, datetime

DASH = "—"


def number(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def rate(value: float | None) -> str:
    if value is None:
        return DASH
    if value == 0:
        return "0/s"
    if value < 10:
        return f"{value:.2f}/s"
    return f"{value:,.1f}/s"


def percent(value: float | None) -> str:
    if value is None:
        return DASH
    if value == 0:
        return "0%"
    if value < 0.01:
        return f"{value * 100:.1f}%"
    return f"{value * 100:.0f}%"


def age(seconds: float | None) -> str:
    """`3m 12s`, `2h 5m`, `4d 1h`; a dash for None."""
    if seconds is None:
        return DASH
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def ago(value: datetime | None, now: datetime) -> str:
    if value is None:
        return DASH
    return age((now - value).total_seconds()) + " ago"


def timestamp(value: datetime | None) -> str:
    """UTC, to the millisecond: `2024-05-01 10:00:03.120Z`."""
    if value is None:
        return DASH
    value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
