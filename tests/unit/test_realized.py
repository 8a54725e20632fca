"""Realized savings from the ledger: instance-hours actually avoided per UTC day and node group (issue 17)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from rightsizer.services.realized import RealizedSavings, realized_savings
from rightsizer.state import LedgerEntry, LedgerResult

T0 = datetime(2026, 11, 2, 22, 0, tzinfo=UTC)


def entry(
    eid: str,
    at: datetime,
    *,
    group: str | None = "gpu-a10g",
    kind: str = "scale_in",
    step: str = "terminate",
    result: LedgerResult = "applied",
    hourly: float | None = 5.672,
    node: str | None = "n1",
    instances: int | None = None,
) -> LedgerEntry:
    return LedgerEntry(
        execution_id=eid, node=node, instance_id=None, node_group=group, kind=kind, step=step, result=result,
        reason="", hourly_savings_usd=hourly, monthly_savings_usd=None, at=at, instances=instances,
    )  # fmt: skip


#: g5.12xlarge → g5.xlarge on two nodes (us-east-1 on-demand, the packaged catalog): (5.672 − 1.006) × 2.
REPLACED = (5.672 - 1.006) * 2


def replacement(
    eid: str, at: datetime, *, step: str = "ng_gone", result: LedgerResult = "applied"
) -> LedgerEntry:
    return entry(eid, at, kind="replace_node_group", step=step, result=result, hourly=REPLACED,
                 node="nodegroup:gpu-a10g", instances=2)  # fmt: skip


def test_a_replacement_books_the_price_difference_from_when_the_old_instances_left() -> None:
    # the old group's last instance left at 22:00; at 01:30 that is 2 h + 1.5 h of two g5.12xlarge not run,
    # each replaced by a g5.xlarge: 4 + 3 old-type instance-hours, priced at the difference
    rows = realized_savings([replacement("r1", T0)], T0 + timedelta(hours=3.5))
    assert [(r.day, r.node_group, r.kind, r.instance_hours, r.removals) for r in rows] == [
        (date(2026, 11, 2), "gpu-a10g", "replace_node_group", 4.0, 1),
        (date(2026, 11, 3), "gpu-a10g", "replace_node_group", 3.0, 0),
    ]
    assert [r.usd for r in rows] == [pytest.approx(2 * REPLACED), pytest.approx(1.5 * REPLACED)]
    assert rows[0].usd == pytest.approx(2 * (5.672 - 1.006) * 2)  # 18.664 USD on the first day


def test_a_replacement_and_a_scale_in_of_one_group_are_separate_rows() -> None:
    rows = realized_savings(
        [entry("s1", T0 - timedelta(hours=1)), replacement("r1", T0)], T0 + timedelta(hours=1)
    )
    assert [(r.kind, r.instance_hours, round(r.usd, 3)) for r in rows] == [
        ("replace_node_group", 2.0, round(REPLACED, 3)),
        ("scale_in", 2.0, round(2 * 5.672, 3)),
    ]


def test_only_the_replacement_s_applied_ng_gone_entry_books() -> None:
    others = [
        replacement("r1", T0, step="ng_validate", result="dry_run"),
        replacement("r2", T0, step="rollback", result="rolled_back"),
        replacement("r3", T0, step="ng_created"),  # no saving yet: the old instances still run
    ]
    assert realized_savings(others, T0 + timedelta(hours=1)) == []


def test_an_off_hours_restore_of_the_old_group_ends_the_replacement_s_saving() -> None:
    restore = entry(
        "o1", T0 + timedelta(minutes=30), kind="scale_node_group", step="restored", hourly=None, node=None
    )
    rows = realized_savings([replacement("r1", T0), restore], T0 + timedelta(hours=5))
    assert [(r.kind, r.instance_hours) for r in rows] == [("replace_node_group", 1.0)]


def test_an_open_removal_counts_until_now_split_at_utc_midnight() -> None:
    rows = realized_savings([entry("e1", T0)], T0 + timedelta(hours=5))
    assert rows == [
        RealizedSavings(date(2026, 11, 2), "gpu-a10g", 2.0, pytest.approx(2 * 5.672), 1),  # type: ignore[arg-type]
        RealizedSavings(date(2026, 11, 3), "gpu-a10g", 3.0, pytest.approx(3 * 5.672), 0),  # type: ignore[arg-type]
    ]


def test_an_off_hours_restore_of_the_group_ends_the_avoidance() -> None:
    restore = entry(
        "r1", T0 + timedelta(hours=1), kind="scale_node_group", step="restored", hourly=None, node=None
    )
    other_group = entry(
        "r2", T0 + timedelta(minutes=30), group="gpu-l4", kind="scale_node_group", step="restored"
    )
    rows = realized_savings([entry("e1", T0), restore, other_group], T0 + timedelta(hours=10))
    assert [(r.node_group, r.instance_hours) for r in rows] == [("gpu-a10g", 1.0)]


def test_only_applied_priced_removals_count() -> None:
    ignored = [
        entry("d1", T0, result="dry_run"),
        entry("f1", T0, result="rolled_back"),
        entry("u1", T0, hourly=None),  # unpriced or reserved capacity: nothing saved
        entry("o1", T0, kind="scale_node_group", step="desired_zero", node=None),
    ]
    assert realized_savings(ignored, T0 + timedelta(hours=1)) == []


def test_groups_and_days_are_reported_separately_and_in_order() -> None:
    rows = realized_savings(
        [entry("e1", T0, group="b"), entry("e2", T0 + timedelta(minutes=30), group="a", hourly=1.0)],
        T0 + timedelta(hours=1),
    )
    assert [(r.day.isoformat(), r.node_group, r.instance_hours, r.usd) for r in rows] == [
        ("2026-11-02", "a", 0.5, 0.5),
        ("2026-11-02", "b", 1.0, pytest.approx(5.672)),
    ]


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        realized_savings([], datetime(2026, 11, 2))  # noqa: DTZ001


def test_a_resize_books_the_price_difference_of_its_one_instance() -> None:
    # g5.4xlarge -> g5.xlarge (1.624 - 1.006 USD/h) on a standalone instance, resized 90 minutes ago
    resized = entry("z1", T0, group=None, kind="resize_instance", step="uncordon", hourly=1.624 - 1.006)
    rolled = entry(
        "z2", T0, group=None, kind="resize_instance", step="uncordon", result="rolled_back", hourly=None
    )
    rows = realized_savings([resized, rolled], T0 + timedelta(minutes=90))
    assert [(r.kind, r.node_group, r.instance_hours, r.removals) for r in rows] == [
        ("resize_instance", "(standalone)", 1.5, 1)
    ]
    assert rows[0].usd == pytest.approx(1.5 * (1.624 - 1.006))


@pytest.mark.parametrize("step", ["restore", "scaled_out"])
def test_a_removal_stops_saving_when_the_replacement_is_launched_not_when_it_is_ready(step: str) -> None:
    # Issue 30: EC2 bills the replacement from its launch. The restore's UpdateNodegroupConfig (desired up)
    # at 23:00, nodes Ready with GPUs at 23:12: the removal at 22:00 saved 1 h, not 1 h 12 min.
    launched = entry(
        "c1", T0 + timedelta(hours=1), kind="scale_node_group", step=step, hourly=None, node=None
    )
    ready = entry(
        "c1", T0 + timedelta(hours=1, minutes=12), kind="scale_node_group", step="restored", hourly=None,
        node=None,
    )  # fmt: skip
    rows = realized_savings([entry("e1", T0), launched, ready], T0 + timedelta(hours=5))
    assert [(r.node_group, r.instance_hours) for r in rows] == [("gpu-a10g", 1.0)]
    assert rows[0].usd == pytest.approx(5.672)
    # a failed restore call launched nothing: the saving runs on until the Ready entry
    failed = entry(
        "c1", T0 + timedelta(hours=1), kind="scale_node_group", step=step, result="failed", hourly=None,
        node=None,
    )  # fmt: skip
    rows = realized_savings([entry("e1", T0), failed, ready], T0 + timedelta(hours=5))
    assert [r.instance_hours for r in rows] == [pytest.approx(1.2)]
