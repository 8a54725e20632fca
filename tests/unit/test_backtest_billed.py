"""Billed accounting in the backtest (issue 30): a removed node is saved only while no instance is billed
for it. EC2 bills the replacement from its launch, which is when demand returns (the desired-size change),
not when it is back ``provision_delay`` later; so a longer restore never raises savings.

The hand-computed replay uses ``tests.unit.test_backtest``'s trace builder: one sample per minute, the
sample at minute k stands for (k − 1, k]; decisions every 5 minutes; one single-GPU g5.xlarge node.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rightsizer.backtest import simulate as bt
from rightsizer.backtest.frontier import Frontier, frontier, frontier_json, render_frontier
from rightsizer.backtest.report import BacktestRequest, NamedPolicy, Sweep, run_backtest
from rightsizer.cli import main
from rightsizer.domain.policy import Policy
from tests.unit.test_backtest import BUSY, G5_USD, MIN, S2Z, _write_trace, at, minutes, trace

#: Busy 0..20, idle 21..100, busy 101..103, idle 104..180.
BURST = minutes({(0, 20): BUSY, (101, 103): BUSY})


def policy(window_min: int) -> Policy:
    return S2Z.model_copy(update={"idle_window": window_min * 60})


def replay(activity: dict[str, list[float | None]], window_min: int, delay_min: float) -> bt.Figures:
    model = bt.SimModel(provision_delay=int(delay_min * 60))
    return bt.run_policy(bt.prepare(trace(activity), model), policy(window_min), "p")


# Derived by hand from the model's rules (not from the simulator):
# - first removal at the first 5-min step t whose window (t − W, t] holds only idle samples: 21 ≥ t − W + 1;
# - demand = 100 (the slot (100, 101] is active): the replacement is billed from 100, back at 100 + d;
# - unserved = active slots 101..103 inside (100, 100 + d];
# - second removal at the first step ≥ 103 + W (a clean window again) and ≥ 100 + d + W (the new node must
#   be as old as the window: node_too_young); nothing active after it, so it saves until 180.
HAND = [
    # (W min, d min, removals at, saved minutes, unserved GPU-minutes)
    (10, 1, [30, 115], 70 + 65, 1),
    (10, 5, [30, 115], 70 + 65, 3),
    (10, 10, [30, 120], 70 + 60, 3),
    (30, 1, [50, 135], 50 + 45, 1),
    (30, 5, [50, 135], 50 + 45, 3),
    (30, 10, [50, 140], 50 + 40, 3),
]


@pytest.mark.parametrize(("window", "delay", "removed_at", "saved", "unserved"), HAND)
def test_replay_matches_the_bill_computed_by_hand(
    window: int, delay: int, removed_at: list[int], saved: int, unserved: int
) -> None:
    f = replay({"n1": BURST}, window, delay)
    assert [r.at for r in f.log] == [at(m) for m in removed_at]
    first = f.log[0]
    assert first.demand_at == at(100) and first.back_at == at(100 + delay)
    assert first.saved_seconds == (100 - removed_at[0]) * MIN  # to the launch, not to the return
    assert f.gpu_hours_saved == pytest.approx(saved / 60)
    assert f.usd_saved == pytest.approx(G5_USD * saved / 60)
    assert f.unserved_gpu_minutes == pytest.approx(unserved)
    assert f.regrets == 0 and f.readds == 1
    # the oracle: every idle minute (21..100 and 104..180 = 80 + 77), nothing else
    assert f.share_of_oracle == pytest.approx(saved / 157)


def test_a_longer_restore_never_looks_cheaper_on_the_hand_trace() -> None:
    for window in (10, 30):
        saved = [replay({"n1": BURST}, window, d).gpu_hours_saved for d in (1, 2, 5, 10)]
        assert saved == sorted(saved, reverse=True)
        unserved = [replay({"n1": BURST}, window, d).unserved_gpu_minutes for d in (1, 2, 5, 10)]
        assert unserved == sorted(unserved)


def test_a_warm_pool_restores_faster_and_its_stopped_instances_cost_ebs_only() -> None:
    cold = replay({"n1": BURST}, 10, 5)
    pool = bt.WarmPoolModel(provision_delay=60, ebs_usd_per_hour=0.02)
    model = bt.SimModel(provision_delay=300, warm_pool=pool)
    warm = bt.run_policy(bt.prepare(trace({"n1": BURST}), model), policy(10), "warm")
    assert warm.log[0].back_at == at(101)
    assert warm.unserved_gpu_minutes == pytest.approx(1)  # only (100, 101]: 3 cold
    assert warm.gpu_hours_saved == cold.gpu_hours_saved == pytest.approx(135 / 60)
    # the pooled, stopped instance waits while the node is out: 135 min of EBS
    assert warm.warm_pool_usd == pytest.approx(0.02 * 135 / 60)
    assert warm.usd_saved == pytest.approx(G5_USD * 135 / 60 - 0.02 * 135 / 60)
    running = bt.WarmPoolModel(provision_delay=60, pool_fraction=1.0, state="RUNNING")
    hot = bt.run_policy(bt.prepare(trace({"n1": BURST}), bt.SimModel(warm_pool=running)), policy(10), "hot")
    assert hot.usd_saved == pytest.approx(0)  # a running pool saves nothing: it only buys time


# ------------------------------------------------------------------------------------ properties

_RUN = st.tuples(st.sampled_from([BUSY, 0.0]), st.integers(min_value=1, max_value=40))


@st.composite
def activities(draw: st.DrawFn) -> dict[str, list[float | None]]:
    """One or two nodes, each a sequence of busy/idle runs over 0..120 minutes, every sample known."""
    out: dict[str, list[float | None]] = {}
    for name in ("n1", "n2")[: draw(st.integers(min_value=1, max_value=2))]:
        values: list[float | None] = []
        while len(values) < 121:
            value, length = draw(_RUN)
            values.extend([value] * length)
        out[name] = values[:121]
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    activity=activities(),
    window=st.sampled_from([5, 10, 20]),
    delays=st.lists(st.sampled_from([0, 1, 2, 5, 10, 20]), min_size=2, max_size=2, unique=True),
)
def test_billed_savings_never_exceed_the_oracle_nor_grow_with_a_slower_restore(
    activity: dict[str, list[float | None]], window: int, delays: list[int]
) -> None:
    fast, slow = sorted(delays)
    a = replay(activity, window, fast)
    b = replay(activity, window, slow)
    oracle = bt.run_oracle(bt.prepare(trace(activity))).gpu_hours_saved
    for f in (a, b):
        assert f.gpu_hours_saved <= oracle + 1e-9
        # each removal saves only up to its replacement's launch: idle time, all of it
        assert f.idle_gpu_hours == pytest.approx(oracle - f.gpu_hours_saved)
    assert b.gpu_hours_saved <= a.gpu_hours_saved + 1e-9


# ------------------------------------------------------------------------ the window chosen by price


def _sweep(price: float, *, warm: bt.WarmPoolModel | None = None) -> Frontier:
    base = policy(10).model_copy(update={"unserved_gpu_minute_usd": price})
    request = BacktestRequest(
        (NamedPolicy("p", base),),
        model=bt.SimModel(provision_delay=600),
        sweep=Sweep("idle_window", ("10m", "30m")),
        baselines=False,
        warm_pool=warm,
    )
    report = run_backtest(bt.Source("trace", "hand", trace({"n1": BURST}), "trace"), request)
    chosen = frontier(report)
    assert chosen is not None
    return chosen


def test_the_sweep_names_the_window_with_the_best_net_value_at_the_operator_s_price() -> None:
    # From HAND at d = 10 min: 10m saves 130 min with 3 unserved GPU-minutes, 30m 90 min with 3.
    cheap = _sweep(0.10)
    ten, thirty = cheap.cold
    assert (ten.value, thirty.value) == ("10m", "30m")
    assert ten.usd_saved == pytest.approx(G5_USD * 130 / 60)
    assert ten.unserved_gpu_minutes == pytest.approx(3)
    assert ten.net_usd == pytest.approx(G5_USD * 130 / 60 - 0.10 * 3)
    assert thirty.net_usd == pytest.approx(G5_USD * 90 / 60 - 0.10 * 3)
    assert cheap.best == ten and cheap.price == 0.10
    assert cheap.oracle_usd == pytest.approx(G5_USD * 157 / 60)
    assert frontier_json(cheap)["best"] == {"value": "10m", "warm_pool": False}
    # a warm pool restoring in 1 min leaves 1 unserved GPU-minute instead of 3 and, back sooner, the node
    # is removed again at 115 (HAND's d = 1 min row: 135 min saved), for 135 min of EBS
    pool = bt.WarmPoolModel.of("STOPPED", 60, volume_gb=100)
    warm = _sweep(10.0, warm=pool)
    assert [p.unserved_gpu_minutes for p in warm.warm] == [pytest.approx(1), pytest.approx(1)]
    ebs = 100 * 0.08 / 730
    assert warm.warm[0].warm_pool_usd == pytest.approx(ebs * 135 / 60)
    assert warm.best is not None and warm.best.warm and warm.best.value == "10m"
    assert warm.best.net_usd == pytest.approx(G5_USD * 135 / 60 - ebs * 135 / 60 - 10.0)
    text = "\n".join(render_frontier(warm))
    assert "best: idle_window=10m with the warm pool" in text


def test_cli_frontier_and_measured_delay_need_their_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [(0.0 if 30 <= k <= 70 else 60.0, 1662858720.0 + 57 * k, "c" * 32) for k in range(120)]
    path = _write_trace(tmp_path / "t.csv.gz", rows)
    plot = tmp_path / "f.png"
    argv = ["backtest", "--trace", str(path), "--json", "--sweep", "idle_window=10m,20m"]
    assert (
        main([*argv, "--warm-pool-delay", "1m", "--unserved-gpu-minute-usd", "0.5", "--plot", str(plot)]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    front = doc["frontier"]
    assert front["unserved_gpu_minute_usd"] == 0.5
    assert [(p["value"], p["warm_pool"]) for p in front["points"]] == [
        ("10m", False), ("20m", False), ("10m", True), ("20m", True)
    ]  # fmt: skip
    for p in front["points"]:
        assert p["net_usd"] == pytest.approx(p["usd_saved"] - 0.5 * p["unserved_gpu_minutes"])
    assert front["best"]["value"] in ("10m", "20m")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["backtest", "--trace", str(path), "--provision-delay", "measured"]) == 2
    assert "--provision-delay" in capsys.readouterr().err
    assert main([*argv, "--unserved-gpu-minute-usd", "-1"]) == 2


def test_the_best_window_of_a_cluster_s_history_is_recorded_and_read_back_by_status() -> None:
    from datetime import UTC, datetime

    from rightsizer.adapters.memory_state import MemoryState
    from rightsizer.backtest.frontier import recommendation_reason
    from rightsizer.render import render_window
    from rightsizer.services.status import recommended_window
    from rightsizer.state import LedgerEntry

    chosen = _sweep(0.10)
    reason = recommendation_reason(chosen, at(0), at(180))
    assert reason is not None and reason.startswith("idle_window=10m warm_pool=false net_usd=")
    state = MemoryState("c")
    assert recommended_window(state.entries()) is None
    state.record(
        LedgerEntry("backtest-1", None, None, None, "backtest", "recommended_window", "applied", reason, None, None,
                    datetime(2026, 12, 7, 4, 0, tzinfo=UTC))
    )  # fmt: skip
    window = recommended_window(state.entries())
    assert window is not None
    assert (window["parameter"], window["value"], window["warm_pool"]) == ("idle_window", "10m", False)
    assert window["net_usd"] == pytest.approx(round(G5_USD * 130 / 60 - 0.10 * 3, 2))
    assert window["unserved_gpu_minute_usd"] == 0.10 and window["from"] == "2026-11-01T10:00:00Z"
    assert "Recommended idle_window from this cluster's history: 10m" in render_window(window)
