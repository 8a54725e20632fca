"""Periods and schedules: weekly windows of local wall-clock time (docs/architecture.md §4, "Periods (contract)").

A period is ``{days: [Mon..Sun], start: "HH:MM", end: "HH:MM", timezone: IANA}``; a schedule is a list of
periods read as their union. Evaluation is a pure function of (schedule, instant), so a scheduler tick can
never miss a transition that happened between two ticks (BUG-29), and the weekday is always taken from the
instant converted into the period's own zone, never from UTC (BUG-28).

With L = the instant in ``timezone``:

- ``end > start``: weekday(L) in days and start <= L.time < end;
- ``end <= start`` (the window wraps past midnight; ``"00:00"`` as end means end of day): weekday(L) in
  days and L.time >= start, or the previous local day in days and L.time < end. Day filters therefore apply
  to the day the window *starts*.

Boundaries are instants, so every transition happens exactly once (issue 12): the start (or end) of a
period on local day D is the one UTC instant at which D's wall clock first shows that time. A wall time
inside a spring-forward gap takes effect when the clock jumps over it (the first wall time after the gap);
a wall time inside a repeated fall-back hour takes effect at its first occurrence, and the second pass of
the wall clock over it changes nothing (an off-hours scale-down or restore is never undone and redone).
An instant is inside the period when it lies in [start instant, end instant) of an occurrence starting on a
listed day.

No I/O beyond the tz database that ``zoneinfo`` reads, no clock: callers pass the instant.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated, Any, Literal, TypeAlias
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter

__all__ = [
    "Period",
    "Schedule",
    "Weekday",
    "boundary_instant",
    "next_transition",
    "parse_schedule",
    "period_contains",
    "schedule_contains",
]

_WEEKDAYS: tuple[str, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_FULL_NAMES: tuple[str, ...] = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAY_ALIASES: dict[str, str] = {
    **{short.lower(): short for short in _WEEKDAYS},
    **dict(zip(_FULL_NAMES, _WEEKDAYS, strict=True)),
}
_DAY_INDEX: dict[str, int] = {short: index for index, short in enumerate(_WEEKDAYS)}

# [0-9] rather than \d: \d also matches non-ASCII digits such as "٠٧:٠٠".
_HHMM = re.compile(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]")

# These keys exist on many hosts but mirror the machine's own setting, so a schedule using them would
# evaluate differently from one machine (or Lambda runtime) to the next.
_HOST_DEPENDENT_ZONES = frozenset({"localtime", "posixrules"})

# tzdata never puts two offset changes this close together, so sampling at this step finds every change.
_OFFSET_PROBE_STEP = timedelta(minutes=30)


def _normalise_day(value: object) -> object:
    if not isinstance(value, str):
        return value  # let the Literal check report the wrong type
    short = _DAY_ALIASES.get(value.strip().lower())
    if short is None:
        raise ValueError(f"unknown day {value!r}; expected Mon..Sun or a full day name such as 'Monday'")
    return short


def _check_hhmm(value: str) -> str:
    if not _HHMM.fullmatch(value):
        raise ValueError(f"{value!r} is not a time of day in HH:MM form (00:00 to 23:59)")
    return value


def _check_timezone(value: str) -> str:
    if value in _HOST_DEPENDENT_ZONES:
        raise ValueError(f"time zone {value!r} depends on the host; use an IANA name such as 'Europe/Berlin'")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(
            f"unknown IANA time zone {value!r} (not in the zone database); use a name such as 'Europe/Berlin' or 'UTC'"
        ) from exc
    return value


def _sorted_unique_days(days: list[str]) -> list[str]:
    # Week order makes two spellings of the same period compare equal and serialise identically.
    return sorted(set(days), key=_DAY_INDEX.__getitem__)


Weekday: TypeAlias = Annotated[
    Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], BeforeValidator(_normalise_day)
]
"""A day of the week as "Mon".."Sun"; input also accepts any letter case and full names ("monday")."""

HHMM: TypeAlias = Annotated[str, AfterValidator(_check_hhmm)]
"""A local wall-clock time "HH:MM", 00:00 to 23:59 (24:00 is spelled "00:00" as an end)."""

TimeZoneName: TypeAlias = Annotated[str, AfterValidator(_check_timezone)]
"""An IANA time zone key that ``zoneinfo`` can load, e.g. "Pacific/Auckland"."""


class Period(BaseModel):
    """One weekly window of local wall-clock time, e.g. Mon-Fri 07:00-19:00 in Pacific/Auckland.

    ``days`` is normalised to three-letter names, de-duplicated and sorted Mon..Sun. ``end <= start``
    wraps into the next local day and ``"00:00"`` as end means end of day; ``start == end`` is therefore a
    full 24 hours starting at ``start``. See the module docstring for the exact membership rule.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    days: Annotated[list[Weekday], AfterValidator(_sorted_unique_days)] = Field(
        min_length=1, description="Days on which the window starts, Mon..Sun."
    )
    start: HHMM = Field(description='Local wall-clock start "HH:MM", inclusive.')
    end: HHMM = Field(description='Local wall-clock end "HH:MM", exclusive; "00:00" means end of day.')
    timezone: TimeZoneName = Field(description="IANA time zone the days and times are read in.")

    def __hash__(self) -> int:
        # pydantic's frozen hash would hash the ``days`` list and raise TypeError.
        return hash((tuple(self.days), self.start, self.end, self.timezone))

    @property
    def zone(self) -> ZoneInfo:
        """The loaded ``ZoneInfo`` for ``timezone`` (zoneinfo caches instances, so this is cheap)."""
        return ZoneInfo(self.timezone)

    @property
    def start_time(self) -> time:
        """``start`` as a naive ``datetime.time``."""
        return time.fromisoformat(self.start)

    @property
    def end_time(self) -> time:
        """``end`` as a naive ``datetime.time``; 00:00 here means end of day when used as an end."""
        return time.fromisoformat(self.end)

    @property
    def wraps(self) -> bool:
        """True when the window runs past local midnight into the next day (``end <= start``)."""
        return self.end_time <= self.start_time

    @property
    def weekday_numbers(self) -> frozenset[int]:
        """``days`` as ``datetime.weekday()`` numbers, Monday = 0."""
        return frozenset(_DAY_INDEX[day] for day in self.days)


Schedule: TypeAlias = list[Period]
"""A named schedule's periods; an instant is inside the schedule when it is inside any period (a union)."""

_SCHEDULE_ADAPTER: TypeAdapter[list[Period]] = TypeAdapter(list[Period])


def parse_schedule(raw: Any) -> Schedule:
    """Validate a list of period mappings (e.g. loaded from YAML/JSON) into a ``Schedule``.

    Args:
        raw: a list of ``{days, start, end, timezone}`` mappings; an empty list is a schedule that never
            contains any instant.

    Returns:
        The validated periods, in input order.

    Raises:
        pydantic.ValidationError: naming the offending index and field, e.g. ``1.timezone``.
    """
    return _SCHEDULE_ADAPTER.validate_python(raw)


def _require_aware(instant: datetime) -> None:
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"instant must be timezone-aware, got naive {instant.isoformat()}")


def boundary_instant(day: date, wall: time, zone: ZoneInfo) -> datetime:
    """The one UTC instant at which local ``day``'s wall clock in ``zone`` first shows ``wall``.

    A repeated (fall-back) wall time gives its first occurrence; a wall time inside a spring-forward gap
    gives the instant of the jump (the first wall time after the gap).
    """
    local = datetime.combine(day, wall, tzinfo=zone)
    first = local.astimezone(UTC)  # fold=0: the offset in force before a transition
    second = local.replace(fold=1).astimezone(UTC)  # fold=1: the offset in force after it
    if first <= second:
        return first  # an ordinary time (equal) or a repeated one (the first pass comes first)
    # Inside a gap the two readings straddle the jump: the boundary takes effect when the clock jumps.
    return min(_offset_changes(zone, second, first))


def _occurrence(period: Period, day: date) -> tuple[datetime, datetime]:
    """[start, end) in UTC of the period's occurrence that starts on local ``day``."""
    zone = period.zone
    end_day = day + timedelta(days=1) if period.wraps else day
    return boundary_instant(day, period.start_time, zone), boundary_instant(end_day, period.end_time, zone)


def period_contains(period: Period, instant: datetime) -> bool:
    """Whether ``instant`` lies inside ``period``, evaluated in the period's own time zone.

    Args:
        period: the window.
        instant: an aware datetime in any zone; the occurrences of the period around its local date are
            resolved to instants (:func:`boundary_instant`) and compared in UTC.

    Returns:
        True when inside. Boundaries: ``start`` inclusive, ``end`` exclusive, to the microsecond.

    Raises:
        ValueError: ``instant`` is naive.
    """
    _require_aware(instant)
    moment = instant.astimezone(UTC)
    today = instant.astimezone(period.zone).date()
    days = period.weekday_numbers
    # An occurrence lasts at most a day plus a DST shift, so it started yesterday or today; tomorrow is
    # checked too for zones whose clock falls back across midnight (the date reads the day before).
    for offset in (-1, 0, 1):
        day = today + timedelta(days=offset)
        if day.weekday() not in days:
            continue
        start, end = _occurrence(period, day)
        if start <= moment < end:
            return True
    return False


def schedule_contains(periods: Sequence[Period], instant: datetime) -> bool:
    """Whether ``instant`` lies inside any of ``periods`` (the schedule is their union).

    Args:
        periods: the schedule; empty means never.
        instant: an aware datetime in any zone.

    Returns:
        ``any(period_contains(p, instant) for p in periods)``.

    Raises:
        ValueError: ``instant`` is naive (checked even when ``periods`` is empty).
    """
    _require_aware(instant)
    return any(period_contains(period, instant) for period in periods)


def _local_dates(first: date, last: date) -> Iterator[date]:
    day = first
    while day <= last:
        yield day
        day += timedelta(days=1)


def _wall_time_candidates(period: Period, lo: datetime, hi: datetime) -> set[datetime]:
    """UTC instants at which the period's local wall clock shows its start or end, near [lo, hi]."""
    zone = period.zone
    first = lo.astimezone(zone).date() - timedelta(days=1)
    last = hi.astimezone(zone).date() + timedelta(days=1)
    # Midnight needs no candidate of its own: the weekday changes there, but the state can only change
    # at midnight when start or end is 00:00 (before local midnight a window is in only if it started
    # that day, and after midnight only if it started then or continues from the day before).
    walls = {period.start_time, period.end_time}
    found: set[datetime] = set()
    for day in _local_dates(first, last):
        for wall in walls:
            local = datetime.combine(day, wall, tzinfo=zone)
            # Both folds: an ambiguous wall time is crossed twice. Wall times inside a gap map to
            # instants that are harmless extras; the real crossing is the offset change itself.
            for fold in (0, 1):
                found.add(local.replace(fold=fold).astimezone(UTC))
    return found


def _offset_changes(zone: ZoneInfo, lo: datetime, hi: datetime) -> set[datetime]:
    """UTC instants in (lo, hi] at which ``zone`` changes its UTC offset (the wall clock jumps)."""
    changes: set[datetime] = set()
    left = lo
    left_offset = lo.astimezone(zone).utcoffset()
    while left < hi:
        right = min(left + _OFFSET_PROBE_STEP, hi)
        right_offset = right.astimezone(zone).utcoffset()
        if right_offset != left_offset:
            before, after = left, right
            while after - before > timedelta(microseconds=1):
                middle = before + (after - before) // 2
                if middle.astimezone(zone).utcoffset() == left_offset:
                    before = middle
                else:
                    after = middle
            changes.add(after)
        left, left_offset = right, right_offset
    return changes


def next_transition(
    periods: Sequence[Period], instant: datetime, horizon: timedelta = timedelta(days=8)
) -> datetime | None:
    """The first instant after ``instant`` at which ``schedule_contains`` changes value.

    The schedule's state is constant on ``[instant, result)`` and differs at ``result``; because every
    boundary is a whole local minute, results are whole minutes for the zones in today's tz database.
    A boundary inside a spring-forward gap yields the instant the clock jumps; a boundary inside a
    repeated hour yields each occurrence at which the wall-clock rule actually flips the state.

    Args:
        periods: the schedule (union of periods).
        instant: an aware datetime; the search starts strictly after it.
        horizon: how far ahead to look, in elapsed time (not wall-clock time), must be positive; the
            default of 8 days covers a full week plus a window that crosses midnight.

    Returns:
        The transition as an aware datetime in ``instant``'s tzinfo, or None when the state does not
        change within ``(instant, instant + horizon]`` (e.g. an empty schedule).

    Raises:
        ValueError: ``instant`` is naive or ``horizon`` is not positive.
    """
    _require_aware(instant)
    if horizon <= timedelta(0):
        raise ValueError(f"horizon must be positive, got {horizon}")
    lo = instant.astimezone(UTC)
    hi = lo + horizon
    candidates: set[datetime] = set()
    for zone_name in {period.timezone for period in periods}:
        candidates |= _offset_changes(ZoneInfo(zone_name), lo, hi)
    for period in periods:
        candidates |= _wall_time_candidates(period, lo, hi)
    # The state is right-continuous and constant between candidates, so the first candidate whose state
    # differs from the current one is the transition; surplus candidates only cost an evaluation each.
    current = schedule_contains(periods, instant)
    for candidate in sorted(c for c in candidates if lo < c <= hi):
        if schedule_contains(periods, candidate) != current:
            return candidate.astimezone(instant.tzinfo)
    return None
