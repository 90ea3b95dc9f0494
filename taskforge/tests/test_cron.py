"""Cron expressions: what is accepted, and the fire times across daylight saving."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from taskforge.lib import cron

NY = ZoneInfo("America/New_York")


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def fires(expression: str, zone: ZoneInfo, after: datetime, count: int) -> list[datetime]:
    found = []
    for _ in range(count):
        after = cron.next_after(expression, zone, after)
        found.append(after)
    return found


@pytest.mark.parametrize(
    "expression",
    [
        "* * * * *",
        "*/15 9-17 * * mon-fri",
        "0 0 1,15 * *",
        "30 4 * jan-mar SUN",
        "5-55/10 * * * *",
        "0 0 * * 7",
        "@hourly",
        "@daily",
        "@weekly",
        "@monthly",
        "@yearly",
        "@annually",
        "@midnight",
        "@Daily",
    ],
)
def test_validate__accepts_standard_expressions(expression: str) -> None:
    assert cron.validate(expression)


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("0 0 * * * *", "5 fields"),
        ("* * * *", "5 fields"),
        ("", "5 fields"),
        ("61 * * * *", "not a valid"),
        ("*/0 * * * *", "not a valid"),
        ("0 0 L * *", "not standard"),
        ("0 0 1W * *", "not standard"),
        ("0 0 * * 5#2", "not standard"),
        ("H * * * *", "not standard"),
        ("? * * * *", "not standard"),
        ("@reboot", "Unknown name"),
        ("0 0 30 2 *", "no time"),
        ("0 0 * foo *", "not a valid"),
    ],
)
def test_validate__refuses_anything_else(expression: str, why: str) -> None:
    with pytest.raises(cron.CronError, match=why):
        cron.validate(expression)


@pytest.mark.parametrize("name", ["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata"])
def test_parse_timezone__accepts_iana_names(name: str) -> None:
    assert cron.parse_timezone(name).key == name


@pytest.mark.parametrize("name", ["", "Mars/Olympus", "/etc/passwd", "../UTC", "EST+5", "a\x00b"])
def test_parse_timezone__refuses_other_text(name: str) -> None:
    with pytest.raises(cron.CronError):
        cron.parse_timezone(name)


def test_next_after__is_strictly_after() -> None:
    assert cron.next_after("0 * * * *", ZoneInfo("UTC"), utc(2024, 1, 1, 10)) == utc(2024, 1, 1, 11)


def test_next_after__reads_the_expression_in_the_zone() -> None:
    # 09:00 in Paris is 08:00 UTC in winter, 07:00 UTC in summer.
    paris = ZoneInfo("Europe/Paris")
    assert cron.next_after("0 9 * * *", paris, utc(2024, 1, 10)) == utc(2024, 1, 10, 8)
    assert cron.next_after("0 9 * * *", paris, utc(2024, 7, 10)) == utc(2024, 7, 10, 7)


def test_next_after__a_time_in_a_gap_fires_once_when_the_gap_ends() -> None:
    # 2024-03-10: New York's clocks go from 02:00 EST straight to 03:00 EDT.
    assert fires("30 2 * * *", NY, utc(2024, 3, 9, 12), 2) == [
        utc(2024, 3, 10, 7),  # 03:00 EDT, the first instant after the gap
        utc(2024, 3, 11, 6, 30),  # 02:30 EDT the next day
    ]


def test_next_after__every_fire_time_of_a_gap_hour_is_one_fire() -> None:
    times = fires("*/20 * * * *", NY, utc(2024, 3, 10, 6, 30), 4)
    # 01:40 EST, then 02:00/02:20/02:40 do not exist: one fire at 03:00 EDT
    # (which is also the expression's own 03:00), then 03:20.
    assert times == [utc(2024, 3, 10, 6, 40), utc(2024, 3, 10, 7), utc(2024, 3, 10, 7, 20),
                     utc(2024, 3, 10, 7, 40)]  # fmt: skip


def test_next_after__a_repeated_time_fires_once_at_its_first_occurrence() -> None:
    # 2024-11-03: New York's 01:00-02:00 happens twice (EDT, then EST).
    assert fires("30 1 * * *", NY, utc(2024, 11, 2, 12), 2) == [
        utc(2024, 11, 3, 5, 30),  # 01:30 EDT; not again at 01:30 EST
        utc(2024, 11, 4, 6, 30),
    ]


def test_next_after__from_inside_the_repeat_does_not_fire_it_again() -> None:
    second_0145 = utc(2024, 11, 3, 6, 45)  # 01:45 EST, the repeat
    assert cron.next_after("*/30 * * * *", NY, second_0145) == utc(2024, 11, 3, 7)  # 02:00 EST


def test_next_after__times_never_go_backwards_across_a_year_of_transitions() -> None:
    for zone in ("America/New_York", "Europe/London", "Australia/Lord_Howe", "Antarctica/Troll"):
        times = fires("*/30 * * * *", ZoneInfo(zone), utc(2024, 1, 1), 48 * 366)
        assert all(a < b for a, b in itertools.pairwise(times)), zone


def test_latest_at_or_before__is_the_last_fire_not_after() -> None:
    assert cron.latest_at_or_before("0 * * * *", ZoneInfo("UTC"), utc(2024, 1, 1, 10)) == utc(
        2024, 1, 1, 10
    )
    assert cron.latest_at_or_before("0 * * * *", ZoneInfo("UTC"), utc(2024, 1, 1, 10, 59)) == utc(
        2024, 1, 1, 10
    )


def test_latest_at_or_before__in_a_repeat_is_the_first_occurrence() -> None:
    assert cron.latest_at_or_before("30 1 * * *", NY, utc(2024, 11, 3, 6, 45)) == utc(
        2024, 11, 3, 5, 30
    )


def test_latest_at_or_before__after_a_gap() -> None:
    assert cron.latest_at_or_before("30 2 * * *", NY, utc(2024, 3, 10, 7, 1)) == utc(2024, 3, 10, 7)


def test_latest_and_next__agree_with_each_other() -> None:
    zone = ZoneInfo("Europe/Berlin")
    at = utc(2024, 10, 27)
    for _ in range(200):
        at += timedelta(minutes=7)
        latest = cron.latest_at_or_before("*/15 * * * *", zone, at)
        assert latest <= at < cron.next_after("*/15 * * * *", zone, latest)
