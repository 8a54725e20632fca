"""Periods (docs/architecture.md §4): local wall-clock windows, wrap-around, DST, and cases BUG-28 / BUG-29."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rightsizer.domain.periods import (
    Period,
    boundary_instant,
    next_transition,
    parse_schedule,
    period_contains,
    schedule_contains,
)

AUCKLAND = ZoneInfo("Pacific/Auckland")
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")

WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


def period(days: list[str], start: str, end: str, timezone: str = "Europe/Berlin") -> Period:
    return Period(days=days, start=start, end=end, timezone=timezone)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


# --- BUG-28: weekday must come from the schedule's zone, not from UTC ------------------------------------

UPTIME_AUCKLAND = [period(["Mon", "Tue", "Wed", "Thu", "Fri"], "07:00", "19:00", "Pacific/Auckland")]


@pytest.mark.parametrize(
    ("now_utc", "local", "utc_weekday", "expected_up"),
    [
        ("2024-03-03T19:30:00+00:00", "2024-03-04T08:30:00+13:00", 6, True),  # local Monday, UTC Sunday
        ("2024-03-08T06:30:00+00:00", "2024-03-08T19:30:00+13:00", 4, False),  # Friday after 19:00
        ("2024-03-08T19:30:00+00:00", "2024-03-09T08:30:00+13:00", 4, False),  # local Saturday, UTC Friday
    ],
)
def test_bug28_weekday_and_time_are_read_in_the_schedule_zone(
    now_utc: str, local: str, utc_weekday: int, expected_up: bool
) -> None:
    # GIVEN an instant whose UTC weekday differs from (or matches) the Auckland weekday
    instant = utc(now_utc)
    assert instant.weekday() == utc_weekday
    assert instant.astimezone(AUCKLAND).isoformat() == local
    # WHEN the uptime schedule is evaluated THEN the local weekday and local time decide
    assert schedule_contains(UPTIME_AUCKLAND, instant) is expected_up


def test_bug28_monday_scale_up_is_at_0700_auckland_not_1300() -> None:
    sunday_evening_utc = utc("2024-03-03T12:00:00+00:00")  # Mon 01:00 NZDT
    assert next_transition(UPTIME_AUCKLAND, sunday_evening_utc) == utc("2024-03-03T18:00:00+00:00")


# --- BUG-29: windows across midnight and across the weekend ---------------------------------------------

NIGHTLY = [period(WEEKDAYS, "22:30", "06:00")]
WEEKEND = [
    period(["Fri"], "20:00", "00:00"),
    period(["Sat", "Sun"], "00:00", "00:00"),
    period(["Mon"], "00:00", "07:00"),
]
EVENING_TO_MIDNIGHT = [period(["Mon", "Tue", "Wed", "Thu", "Fri"], "18:00", "00:00")]


@pytest.mark.parametrize(
    ("schedule", "local", "expected_down"),
    [
        (NIGHTLY, "2024-05-14T23:15:00+02:00", True),
        (NIGHTLY, "2024-05-14T02:00:00+02:00", True),
        (NIGHTLY, "2024-05-14T06:00:00+02:00", False),  # end is exclusive
        (NIGHTLY, "2024-05-14T12:00:00+02:00", False),
        (WEEKEND, "2024-05-18T13:00:00+02:00", True),  # Saturday
        (WEEKEND, "2024-05-20T06:59:00+02:00", True),  # Monday before 07:00
        (WEEKEND, "2024-05-17T19:59:00+02:00", False),  # Friday before 20:00
        (EVENING_TO_MIDNIGHT, "2024-05-17T23:59:30+02:00", True),
        (EVENING_TO_MIDNIGHT, "2024-05-18T00:00:30+02:00", False),  # Friday's window ended at midnight
    ],
    ids=[
        "nightly-2315",
        "nightly-0200",
        "nightly-0600-exclusive",
        "nightly-noon",
        "weekend-sat",
        "weekend-mon-0659",
        "weekend-fri-1959",
        "evening-fri-235930",
        "evening-sat-000030",
    ],
)
def test_bug29_downtime_windows(schedule: list[Period], local: str, expected_down: bool) -> None:
    assert schedule_contains(schedule, datetime.fromisoformat(local)) is expected_down


def test_bug29_weekend_transitions_are_fri_2000_and_mon_0700() -> None:
    thursday = datetime(2024, 5, 16, 12, 0, tzinfo=BERLIN)
    down_at = next_transition(WEEKEND, thursday)
    assert down_at == datetime(2024, 5, 17, 20, 0, tzinfo=BERLIN)
    assert down_at is not None
    # The three adjacent periods form one continuous downtime: no flip at Fri/Sat or Sun/Mon midnight.
    assert next_transition(WEEKEND, down_at) == datetime(2024, 5, 20, 7, 0, tzinfo=BERLIN)


def test_bug29_a_tick_after_midnight_still_sees_the_window_end() -> None:
    # Ticks at 23:55 and 00:05 must agree with a pure evaluation, so the stop at midnight cannot be missed.
    assert schedule_contains(EVENING_TO_MIDNIGHT, datetime(2024, 5, 17, 23, 55, tzinfo=BERLIN)) is True
    assert schedule_contains(EVENING_TO_MIDNIGHT, datetime(2024, 5, 18, 0, 5, tzinfo=BERLIN)) is False
    assert next_transition(EVENING_TO_MIDNIGHT, datetime(2024, 5, 17, 23, 59, 30, tzinfo=BERLIN)) == (
        datetime(2024, 5, 18, 0, 0, tzinfo=BERLIN)
    )


def test_nightly_window_starting_sunday_continues_into_monday() -> None:
    assert schedule_contains(NIGHTLY, datetime(2024, 5, 13, 5, 59, 59, tzinfo=BERLIN)) is True  # Monday


# --- Europe/Berlin DST ----------------------------------------------------------------------------------


def test_berlin_spring_forward_start_inside_gap_takes_effect_at_0300() -> None:
    # 2024-03-31 02:00 CET jumps to 03:00 CEST at 01:00 UTC; 02:30 never happens on the wall clock.
    sunday = [period(["Sun"], "02:30", "04:00")]
    assert period_contains(sunday[0], utc("2024-03-31T00:59:59+00:00")) is False  # 01:59:59 CET
    assert period_contains(sunday[0], utc("2024-03-31T01:00:00+00:00")) is True  # 03:00 CEST
    assert period_contains(sunday[0], utc("2024-03-31T01:59:59+00:00")) is True  # 03:59:59 CEST
    assert period_contains(sunday[0], utc("2024-03-31T02:00:00+00:00")) is False  # 04:00 CEST
    assert next_transition(sunday, utc("2024-03-30T23:00:00+00:00")) == utc("2024-03-31T01:00:00+00:00")


def test_berlin_spring_forward_end_inside_gap_takes_effect_at_0300() -> None:
    sunday = [period(["Sun"], "01:00", "02:30")]
    assert schedule_contains(sunday, utc("2024-03-31T00:59:00+00:00")) is True  # 01:59 CET
    assert schedule_contains(sunday, utc("2024-03-31T01:00:00+00:00")) is False  # 03:00 CEST
    assert next_transition(sunday, utc("2024-03-31T00:30:00+00:00")) == utc("2024-03-31T01:00:00+00:00")


@pytest.mark.parametrize("fold", [0, 1])
def test_berlin_fall_back_repeated_hour_is_wholly_in(fold: int) -> None:
    # 2024-10-27 03:00 CEST falls back to 02:00 CET at 01:00 UTC: 02:30 happens twice.
    repeated = period(["Sun"], "02:00", "03:00")
    instant = datetime(2024, 10, 27, 2, 30, tzinfo=BERLIN, fold=fold)
    assert instant.astimezone(UTC) == utc(["2024-10-27T00:30:00+00:00", "2024-10-27T01:30:00+00:00"][fold])
    assert period_contains(repeated, instant) is True


def test_berlin_fall_back_repeated_hour_edges_and_single_transition() -> None:
    repeated = [period(["Sun"], "02:00", "03:00")]
    assert schedule_contains(repeated, utc("2024-10-26T23:59:59+00:00")) is False  # 01:59:59 CEST
    assert schedule_contains(repeated, utc("2024-10-27T00:00:00+00:00")) is True  # first 02:00
    assert schedule_contains(repeated, utc("2024-10-27T01:00:00+00:00")) is True  # second 02:00
    assert schedule_contains(repeated, utc("2024-10-27T02:00:00+00:00")) is False  # 03:00 CET
    # The clock jumping back from 02:59:59 to 02:00 stays inside: the next flip is 03:00 CET.
    assert next_transition(repeated, utc("2024-10-26T23:30:00+00:00")) == utc("2024-10-27T00:00:00+00:00")
    assert next_transition(repeated, utc("2024-10-27T00:00:00+00:00")) == utc("2024-10-27T02:00:00+00:00")


def test_berlin_fall_back_boundary_inside_repeated_hour_acts_once_at_its_first_occurrence() -> None:
    # Issue 12: boundaries are instants. A start at 02:30 on the fall-back day takes effect at the first
    # 02:30 (CEST); the clock going back to 02:00 and passing 02:30 again (CET) changes nothing.
    late = [period(["Sun"], "02:30", "04:00")]
    first_0230 = utc("2024-10-27T00:30:00+00:00")
    assert next_transition(late, utc("2024-10-27T00:00:00+00:00")) == first_0230
    assert schedule_contains(late, utc("2024-10-27T01:00:00+00:00")) is True  # 02:00 CET, second pass
    assert schedule_contains(late, utc("2024-10-27T01:30:00+00:00")) is True  # 02:30 CET, second pass
    assert next_transition(late, first_0230) == utc("2024-10-27T03:00:00+00:00")  # 04:00 CET
    # An end inside the repeated hour ends the window once, at its first occurrence.
    early = [period(["Sat"], "22:00", "02:30")]
    assert next_transition(early, utc("2024-10-26T21:00:00+00:00")) == first_0230
    assert schedule_contains(early, utc("2024-10-27T01:00:00+00:00")) is False  # 02:00 CET: stays out
    assert next_transition(early, first_0230) == utc("2024-11-02T21:00:00+00:00")  # next Saturday 22:00 CET


# --- America/New_York DST -------------------------------------------------------------------------------


def test_new_york_spring_forward_2024_03_10() -> None:
    # 02:00 EST jumps to 03:00 EDT at 07:00 UTC.
    gap_start = [period(["Sun"], "02:15", "05:00", "America/New_York")]
    assert schedule_contains(gap_start, utc("2024-03-10T06:59:00+00:00")) is False  # 01:59 EST
    assert schedule_contains(gap_start, utc("2024-03-10T07:00:00+00:00")) is True  # 03:00 EDT
    assert next_transition(gap_start, utc("2024-03-10T05:00:00+00:00")) == utc("2024-03-10T07:00:00+00:00")


def test_new_york_fall_back_2024_11_03() -> None:
    # 02:00 EDT falls back to 01:00 EST at 06:00 UTC: 01:00-02:00 happens twice.
    repeated = [period(["Sun"], "01:00", "02:00", "America/New_York")]
    assert schedule_contains(repeated, datetime(2024, 11, 3, 1, 30, tzinfo=NEW_YORK, fold=0)) is True
    assert schedule_contains(repeated, datetime(2024, 11, 3, 1, 30, tzinfo=NEW_YORK, fold=1)) is True
    assert schedule_contains(repeated, utc("2024-11-03T04:59:00+00:00")) is False  # 00:59 EDT
    assert schedule_contains(repeated, utc("2024-11-03T07:00:00+00:00")) is False  # 02:00 EST
    assert next_transition(repeated, utc("2024-11-03T04:00:00+00:00")) == utc("2024-11-03T05:00:00+00:00")
    assert next_transition(repeated, utc("2024-11-03T05:00:00+00:00")) == utc("2024-11-03T07:00:00+00:00")


def test_new_york_office_hours_shift_in_utc_across_the_dst_weekend() -> None:
    office = [period(["Mon", "Tue", "Wed", "Thu", "Fri"], "09:00", "17:00", "America/New_York")]
    friday_close = utc("2024-03-08T22:00:00+00:00")  # 17:00 EST
    assert schedule_contains(office, friday_close) is False
    assert next_transition(office, friday_close) == utc("2024-03-11T13:00:00+00:00")  # 09:00 EDT Monday


# --- week wrap, end exclusivity, end of day ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("local", "expected"),
    [
        (datetime(2024, 5, 19, 21, 59, tzinfo=BERLIN), False),  # Sun before start
        (datetime(2024, 5, 19, 22, 0, tzinfo=BERLIN), True),  # Sun start, inclusive
        (datetime(2024, 5, 20, 0, 0, tzinfo=BERLIN), True),  # Mon midnight
        (datetime(2024, 5, 20, 1, 0, tzinfo=BERLIN), True),  # Mon 01:00, the week wrapped
        (datetime(2024, 5, 20, 2, 0, tzinfo=BERLIN), False),  # end exclusive
        (datetime(2024, 5, 21, 1, 0, tzinfo=BERLIN), False),  # Tue: Mon is not a start day
        (datetime(2024, 5, 18, 23, 0, tzinfo=BERLIN), False),  # Sat
    ],
)
def test_sunday_window_wraps_into_monday(local: datetime, expected: bool) -> None:
    assert period_contains(period(["Sun"], "22:00", "02:00"), local) is expected


def test_end_is_exclusive_to_the_microsecond() -> None:
    work = period(["Mon"], "07:00", "19:00")
    assert period_contains(work, datetime(2024, 5, 13, 7, 0, tzinfo=BERLIN)) is True
    assert period_contains(work, datetime(2024, 5, 13, 6, 59, 59, 999999, tzinfo=BERLIN)) is False
    assert period_contains(work, datetime(2024, 5, 13, 18, 59, 59, 999999, tzinfo=BERLIN)) is True
    assert period_contains(work, datetime(2024, 5, 13, 19, 0, tzinfo=BERLIN)) is False


def test_start_equal_to_end_is_a_full_day_from_start() -> None:
    day = period(["Wed"], "07:00", "07:00")
    assert period_contains(day, datetime(2024, 5, 15, 6, 59, tzinfo=BERLIN)) is False
    assert period_contains(day, datetime(2024, 5, 15, 7, 0, tzinfo=BERLIN)) is True
    assert period_contains(day, datetime(2024, 5, 16, 6, 59, tzinfo=BERLIN)) is True
    assert period_contains(day, datetime(2024, 5, 16, 7, 0, tzinfo=BERLIN)) is False


def test_midnight_to_midnight_covers_exactly_the_listed_days() -> None:
    saturday = period(["Sat"], "00:00", "00:00")
    assert period_contains(saturday, datetime(2024, 5, 17, 23, 59, 59, tzinfo=BERLIN)) is False
    assert period_contains(saturday, datetime(2024, 5, 18, 0, 0, tzinfo=BERLIN)) is True
    assert period_contains(saturday, datetime(2024, 5, 18, 23, 59, 59, tzinfo=BERLIN)) is True
    assert period_contains(saturday, datetime(2024, 5, 19, 0, 0, tzinfo=BERLIN)) is False


def test_instant_zone_does_not_matter_only_the_period_zone() -> None:
    work = period(["Mon"], "07:00", "19:00", "Pacific/Auckland")
    same_instant = [
        datetime(2024, 3, 4, 8, 30, tzinfo=AUCKLAND),
        datetime(2024, 3, 3, 19, 30, tzinfo=UTC),
        datetime(2024, 3, 3, 14, 30, tzinfo=NEW_YORK),
    ]
    assert [period_contains(work, instant) for instant in same_instant] == [True, True, True]


# --- next_transition shapes ---------------------------------------------------------------------------


def test_next_transition_returns_in_the_instants_tzinfo_and_is_strictly_after() -> None:
    work = [period(["Mon"], "07:00", "19:00")]
    start = datetime(2024, 5, 13, 7, 0, tzinfo=BERLIN)
    result = next_transition(work, start)
    assert result is not None
    assert result.tzinfo is BERLIN
    assert result.isoformat() == "2024-05-13T19:00:00+02:00"


def test_next_transition_none_when_state_never_changes() -> None:
    always = [period(WEEKDAYS, "00:00", "00:00", "America/New_York")]
    now = utc("2024-03-10T06:00:00+00:00")
    assert next_transition(always, now) is None
    assert next_transition([], now) is None


def test_next_transition_respects_the_horizon() -> None:
    weekly = [period(["Mon"], "07:00", "08:00")]
    tuesday = datetime(2024, 5, 14, 9, 0, tzinfo=BERLIN)
    assert next_transition(weekly, tuesday, horizon=timedelta(days=5)) is None
    assert next_transition(weekly, tuesday, horizon=timedelta(days=5, hours=22)) == datetime(
        2024, 5, 20, 7, 0, tzinfo=BERLIN
    )
    with pytest.raises(ValueError, match="horizon"):
        next_transition(weekly, tuesday, horizon=timedelta(0))


# --- naive datetimes --------------------------------------------------------------------------------


def test_naive_instants_are_rejected() -> None:
    naive = datetime(2024, 5, 13, 7, 0)  # noqa: DTZ001 - the point of the test
    work = period(["Mon"], "07:00", "19:00")
    with pytest.raises(ValueError, match="timezone-aware"):
        period_contains(work, naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule_contains([], naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        next_transition([work], naive)


# --- validation -------------------------------------------------------------------------------------


def test_days_are_normalised_to_three_letters_in_week_order() -> None:
    parsed = Period(
        days=["sunday", "MON", "Tuesday", "wed", "Mon"], start="07:00", end="19:00", timezone="UTC"
    )
    assert parsed.days == ["Mon", "Tue", "Wed", "Sun"]
    assert parsed.model_dump() == {
        "days": ["Mon", "Tue", "Wed", "Sun"],
        "start": "07:00",
        "end": "19:00",
        "timezone": "UTC",
    }


VALID = {"days": ["Mon"], "start": "07:00", "end": "19:00", "timezone": "Europe/Berlin"}


@pytest.mark.parametrize(
    ("override", "loc", "message"),
    [
        ({"start": "7:00"}, ("start",), "'7:00' is not a time of day in HH:MM form"),
        ({"start": "24:00"}, ("start",), "'24:00' is not a time of day"),
        ({"end": "12:60"}, ("end",), "'12:60' is not a time of day"),
        ({"end": "07:00:00"}, ("end",), "'07:00:00' is not a time of day"),
        ({"end": "ab:cd"}, ("end",), "'ab:cd' is not a time of day"),
        ({"start": "\u0660\u0667:\u0660\u0660"}, ("start",), "is not a time of day"),
        ({"timezone": "Mars/Olympus"}, ("timezone",), "unknown IANA time zone 'Mars/Olympus'"),
        ({"timezone": "europe/berlin"}, ("timezone",), "unknown IANA time zone 'europe/berlin'"),
        ({"timezone": ""}, ("timezone",), "unknown IANA time zone ''"),
        ({"timezone": "../etc/passwd"}, ("timezone",), "unknown IANA time zone '../etc/passwd'"),
        ({"timezone": "localtime"}, ("timezone",), "depends on the host"),
        ({"days": ["Funday"]}, ("days", 0), "unknown day 'Funday'"),
        ({"days": ["Mon", "Tues"]}, ("days", 1), "unknown day 'Tues'"),
        ({"days": []}, ("days",), "at least 1 item"),
        ({"begin": "07:00"}, ("begin",), "Extra inputs are not permitted"),
    ],
)
def test_invalid_period_names_the_field(
    override: dict[str, object], loc: tuple[object, ...], message: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        Period.model_validate({**VALID, **override})
    errors = raised.value.errors()
    assert [error["loc"] for error in errors] == [loc]
    assert message in errors[0]["msg"]


def test_missing_field_is_named() -> None:
    with pytest.raises(ValidationError) as raised:
        Period.model_validate({"days": ["Mon"], "start": "07:00", "end": "19:00"})
    assert [error["loc"] for error in raised.value.errors()] == [("timezone",)]


def test_equal_periods_hash_equal() -> None:
    spelled_differently = Period.model_validate({**VALID, "days": ["monday"]})
    assert len({Period.model_validate(VALID), spelled_differently}) == 1


def test_period_is_frozen() -> None:
    work = Period.model_validate(VALID)
    with pytest.raises(ValidationError, match="frozen"):
        work.start = "08:00"  # type: ignore[misc]


def test_parse_schedule_validates_each_period_with_its_index() -> None:
    assert parse_schedule([VALID]) == [Period.model_validate(VALID)]
    assert parse_schedule([]) == []
    with pytest.raises(ValidationError) as raised:
        parse_schedule([VALID, {**VALID, "timezone": "Nowhere/Land"}])
    assert [error["loc"] for error in raised.value.errors()] == [(1, "timezone")]


# --- properties -------------------------------------------------------------------------------------

# Zones with the awkward cases: 30-minute DST (Lord Howe), 45-minute offsets (Kathmandu, Chatham),
# southern-hemisphere DST (Auckland, Santiago), negative DST (Dublin), and no DST at all.
ZONES = [
    "UTC",
    "Europe/Berlin",
    "Europe/Dublin",
    "America/New_York",
    "America/St_Johns",
    "America/Santiago",
    "Pacific/Auckland",
    "Pacific/Chatham",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "Asia/Kolkata",
]

hhmm = st.builds(
    lambda hour, minute: f"{hour:02d}:{minute:02d}",
    st.sampled_from([0, 1, 2, 3, 12, 22, 23]) | st.integers(0, 23),
    st.sampled_from([0, 30, 59]) | st.integers(0, 59),
)
periods_strategy = st.builds(
    Period,
    days=st.lists(st.sampled_from(WEEKDAYS), min_size=1, max_size=7),
    start=hhmm,
    end=hhmm,
    timezone=st.sampled_from(ZONES),
)
schedules = st.lists(periods_strategy, min_size=0, max_size=3)
instants = st.datetimes(
    min_value=datetime(2000, 1, 1),  # noqa: DTZ001 - hypothesis bounds are naive by API
    max_value=datetime(2040, 12, 31),  # noqa: DTZ001
    timezones=st.sampled_from([ZoneInfo(name) for name in ZONES]),
)


@given(schedule=schedules, instant=instants)
def test_schedule_is_the_union_of_its_periods(schedule: list[Period], instant: datetime) -> None:
    assert schedule_contains(schedule, instant) == any(period_contains(p, instant) for p in schedule)


@given(schedule=schedules, instant=instants, fraction=st.floats(0, 1, exclude_max=True))
@example(  # the result lands just after a spring-forward gap of the instant's zone
    schedule=[period(["Sat"], "01:00", "01:00", "UTC")],
    instant=datetime(2004, 3, 28, 0, 0, tzinfo=BERLIN),
    fraction=0.0,
)
def test_next_transition_flips_the_state_and_nothing_flips_before_it(
    schedule: list[Period], instant: datetime, fraction: float
) -> None:
    horizon = timedelta(days=8)
    result = next_transition(schedule, instant, horizon)
    before = schedule_contains(schedule, instant)
    # Arithmetic on datetimes sharing a ZoneInfo is wall-clock arithmetic (1 µs before 03:00 CEST lands in
    # the spring-forward gap), so elapsed time is measured in UTC.
    start = instant.astimezone(UTC)
    if result is None:
        assert schedule_contains(schedule, start + horizon * fraction) == before
        return
    assert result.tzinfo is instant.tzinfo
    end = result.astimezone(UTC)
    assert start < end <= start + horizon
    just_before = end - timedelta(microseconds=1)
    assert schedule_contains(schedule, just_before) == before
    assert schedule_contains(schedule, end) != before
    probe = start + (end - start) * fraction
    assert schedule_contains(schedule, min(probe, just_before)) == before


minute_instants = st.builds(
    lambda minutes: datetime(2000, 1, 1, tzinfo=UTC) + timedelta(minutes=minutes),
    st.integers(0, 40 * 365 * 24 * 60),
)


@settings(max_examples=60, deadline=None)
@given(schedule=schedules, instant=minute_instants)
def test_next_transition_matches_a_minute_by_minute_scan(schedule: list[Period], instant: datetime) -> None:
    # Every boundary is a whole local minute and these zones' offsets are whole minutes, so scanning UTC
    # minutes is a complete (if slow) oracle.
    horizon = timedelta(days=2)
    before = schedule_contains(schedule, instant)
    expected = None
    for minute in range(1, int(horizon / timedelta(minutes=1)) + 1):
        candidate = instant + timedelta(minutes=minute)
        if schedule_contains(schedule, candidate) != before:
            expected = candidate
            break
    assert next_transition(schedule, instant, horizon) == expected


# --- boundaries are instants: every transition acts exactly once (issue 12) ----------------------------

DST_ZONES = [z for z in ZONES if z not in ("UTC", "Asia/Kathmandu", "Asia/Kolkata")]


def _offset_changes_in(zone: ZoneInfo, year: int) -> list[datetime]:
    """UTC instants of the zone's offset changes in ``year`` (hourly probe, then bisection to the minute)."""
    changes = []
    probe = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    while probe < end:
        nxt = probe + timedelta(hours=1)
        if probe.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            lo, hi = probe, nxt
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            changes.append(hi)
        probe = nxt
    return changes


@settings(max_examples=40, deadline=None)
@given(
    zone_name=st.sampled_from(DST_ZONES),
    year=st.integers(2005, 2038),
    pick=st.integers(0, 3),
    start_shift=st.integers(-90, 90),
    length=st.integers(1, 24 * 60),
)
def test_each_boundary_acts_exactly_once_across_dst_changes(
    zone_name: str, year: int, pick: int, start_shift: int, length: int
) -> None:
    """A one-day period whose start (and, for short windows, end) falls in or near a skipped or repeated
    local hour is entered once and left once: scanning every minute around it flips the state at most
    twice, always in then out, and never back in."""
    zone = ZoneInfo(zone_name)
    changes = _offset_changes_in(zone, year)
    if not changes:
        return
    change = changes[pick % len(changes)]
    before = (change - timedelta(minutes=1)).astimezone(zone)
    wall = (datetime(2000, 1, 1, before.hour, before.minute) + timedelta(minutes=start_shift)).time()  # noqa: DTZ001
    end = (datetime(2000, 1, 1, wall.hour, wall.minute) + timedelta(minutes=length)).time()  # noqa: DTZ001
    day = (change + timedelta(minutes=start_shift)).astimezone(zone)
    p = Period(days=[WEEKDAYS[day.weekday()]], start=f"{wall:%H:%M}", end=f"{end:%H:%M}", timezone=zone_name)
    instant = change - timedelta(hours=30)
    states = []
    while instant <= change + timedelta(hours=54):
        states.append(period_contains(p, instant))
        instant += timedelta(minutes=1)
    flips = [(a, b) for a, b in itertools.pairwise(states) if a != b]
    assert flips in ([], [(False, True)], [(True, False)], [(False, True), (True, False)]), (p, flips)


@pytest.mark.parametrize(
    ("zone", "day", "wall"),
    [
        ("Europe/Berlin", "2024-10-27", "02:30"),  # repeated
        ("America/New_York", "2023-11-05", "01:15"),  # repeated
        ("Pacific/Auckland", "2025-04-06", "02:45"),  # repeated (southern autumn)
        ("Australia/Lord_Howe", "2024-04-07", "01:45"),  # repeated half hour
        ("America/Santiago", "2026-04-04", "23:30"),  # repeated across midnight
        ("Europe/Dublin", "2021-10-31", "01:30"),  # negative DST in tzdata
    ],
)
def test_a_repeated_wall_time_takes_effect_at_its_first_occurrence(zone: str, day: str, wall: str) -> None:
    tz = ZoneInfo(zone)
    local = datetime.fromisoformat(f"{day}T{wall}").replace(tzinfo=tz)
    first, second = local.astimezone(UTC), local.replace(fold=1).astimezone(UTC)
    assert first < second  # the wall time really happens twice
    assert boundary_instant(local.date(), local.time(), tz) == first


@pytest.mark.parametrize(
    ("zone", "day", "wall"),
    [
        ("Europe/Berlin", "2024-03-31", "02:30"),
        ("America/New_York", "2030-03-10", "02:05"),
        ("Pacific/Chatham", "2024-09-29", "03:00"),
        ("Australia/Lord_Howe", "2024-10-06", "02:15"),
    ],
)
def test_a_skipped_wall_time_takes_effect_when_the_clock_jumps(zone: str, day: str, wall: str) -> None:
    tz = ZoneInfo(zone)
    local = datetime.fromisoformat(f"{day}T{wall}").replace(tzinfo=tz)
    instant = boundary_instant(local.date(), local.time(), tz)
    just_before = instant - timedelta(microseconds=1)
    assert just_before.astimezone(tz).utcoffset() != instant.astimezone(tz).utcoffset()  # the jump itself
    assert instant.astimezone(tz).time() > local.time()  # the first wall time after the gap
