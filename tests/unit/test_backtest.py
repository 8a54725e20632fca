"""Backtest (issue 8): exact figures on small hand-made traces, the baselines, the signal-set switch, the
sources and the CLI contract.

Hand-made traces: one sample per minute at ``T0 + k min`` (k = 0..180); the sample at g stands for the
minute (g − 1 min, g]. Policy windows are 30 min, decisions every 5 min, a node comes back 5 min after
demand returns, and a removal regrets when demand returns within 30 min.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rightsizer.backtest import simulate as bt
from rightsizer.backtest.report import (
    BacktestRequest,
    NamedPolicy,
    Sweep,
    run_backtest,
    scale_to_zero_policy,
)
from rightsizer.backtest.snapshot_series import read_snapshot_series
from rightsizer.backtest.sources import packaged_trace, read_trace
from rightsizer.cli import main
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.model import SIGNAL_ACTIVITY, MetricData, Node, Pod, Series
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import GPU_UTIL
from tests.builders import AT, gpu_node, node_devices, pod, snapshot, write_snapshot_dir

T0 = (AT - timedelta(days=1)).timestamp()  # 2026-11-01T10:00Z, a multiple of 5 min
MIN = 60.0
BUSY, IDLE = 50.0, 0.0
S2Z = scale_to_zero_policy()
G5 = load_catalog().get("g5.xlarge")
assert G5 is not None and G5.hourly_usd is not None
G5_USD = G5.hourly_usd

Activity = list[float | None]


def at(minute: float) -> float:
    return T0 + minute * MIN


def trace(
    activity: dict[str, Activity], *, holders: bool = True, pods_until: dict[str, float] | None = None
) -> bt.History:
    """One single-GPU g5.xlarge node per entry (its own node group), each with a GPU-holding server pod
    unless ``holders`` is False; ``pods_until`` ends a node's pod at that minute. Activity-only."""
    nodes = tuple(Node.model_validate(gpu_node(n, instance_type="g5.xlarge", gpus=1)) for n in activity)
    pods = tuple(Pod.model_validate(pod(f"{n}-server", n, gpus=1)) for n in activity) if holders else ()
    series = []
    length = max(len(v) for v in activity.values())
    for name, values in activity.items():
        points = [(at(k), v) for k, v in enumerate(values) if v is not None]
        labels = {"node": name, "gpu": "0", "UUID": f"GPU-{name}"}
        series.append(Series(labels, tuple(t for t, _ in points), tuple(v for _, v in points)))
    frames = [bt.Frame(at=T0, nodes=nodes, pods=pods)]
    for name, minute in sorted((pods_until or {}).items(), key=lambda x: x[1]):
        kept = tuple(p for p in frames[-1].pods if p.spec.nodeName != name)
        frames.append(bt.Frame(at=at(minute), nodes=nodes, pods=kept))
    return bt.History(
        cluster="test",
        region="us-east-1",
        start=T0,
        end=at(length - 1),
        resolution=60,
        frames=tuple(frames),
        metrics={GPU_UTIL: MetricData(GPU_UTIL, tuple(series))},
        signal_set=frozenset({SIGNAL_ACTIVITY}),
    )


def minutes(spec: dict[tuple[int, int], float], default: float = IDLE, n: int = 181) -> Activity:
    """Activity per minute 0..n-1: ``spec`` maps inclusive minute ranges to a value."""
    out: Activity = [default] * n
    for (lo, hi), v in spec.items():
        for k in range(lo, hi + 1):
            out[k] = v
    return out


def run(history: bt.History, policy: Policy = S2Z) -> bt.Figures:
    return bt.run_policy(bt.prepare(history), policy, "p")


# ---------------------------------------------------------------------------------------- exact figures


def test_node_idle_for_exactly_the_window_is_removed_then_regrets() -> None:
    # Busy to minute 60, idle 61..90 (exactly 30 one-minute samples), busy again from 91.
    history = trace({"n1": minutes({(0, 60): BUSY, (91, 180): BUSY})})
    f = run(history)
    assert [r.at for r in f.log] == [at(90)]  # not at 85: (55, 85] still holds busy samples
    removal = f.log[0]
    assert removal.demand_at == at(90)  # the minute (90, 91] is active
    assert removal.back_at == at(95)
    assert removal.regret
    assert f.removals == 1 and f.regrets == 1
    # Billed: the replacement is launched (and paid) at 90 when demand returns, so nothing was saved;
    # the 5 minutes until it is back are paid and unserved at once.
    assert removal.saved_seconds == 0
    assert f.gpu_hours_saved == 0 and f.usd_saved == 0
    assert f.unserved_gpu_minutes == pytest.approx(5.0)  # minutes 91..95 active, node back at 95
    prep = bt.prepare(history)
    assert prep.oracle_gpu_hours == pytest.approx(30 / 60)
    assert prep.paid_gpu_hours == pytest.approx(3.0)
    assert f.share_of_oracle == 0
    assert f.gpu_hours_paid == pytest.approx(3.0)
    assert f.idle_gpu_hours == pytest.approx(0.5)


def test_spike_inside_the_window_delays_the_removal() -> None:
    without = run(trace({"n1": minutes({(0, 60): BUSY})}))
    assert [r.at for r in without.log] == [at(90)]
    f = run(trace({"n1": minutes({(0, 60): BUSY, (75, 75): BUSY})}))
    # The spike at 75 keeps every window ending before 105 busy; (75, 105] is the first clean one.
    assert [r.at for r in f.log] == [at(105)]
    assert f.log[0].demand_at is None and f.log[0].back_at is None
    assert f.regrets == 0 and f.unserved_gpu_minutes == 0
    assert f.gpu_hours_saved == pytest.approx(75 / 60)  # 105 → 180
    assert bt.prepare(trace({"n1": minutes({(0, 60): BUSY, (75, 75): BUSY})})).oracle_gpu_hours == (
        pytest.approx(119 / 60)
    )
    assert f.share_of_oracle == pytest.approx(75 / 119)


def test_demand_returning_during_provisioning_is_unserved_and_the_new_node_is_young() -> None:
    # Idle 61..92, active 93-94, idle 95, active 96..100, idle 101..180.
    history = trace({"n1": minutes({(0, 60): BUSY, (93, 94): BUSY, (96, 100): BUSY})})
    f = run(history)
    assert [r.at for r in f.log] == [at(90), at(130)]
    first, second = f.log
    assert first.demand_at == at(92) and first.back_at == at(97) and first.regret
    assert first.unserved_gpu_minutes == pytest.approx(4.0)  # minutes 93, 94, 96, 97 (95 was idle)
    assert first.saved_seconds == 2 * MIN  # billed: 90 → 92, the replacement is paid from its launch
    assert second.demand_at is None and second.saved_seconds == 50 * MIN and not second.regret
    assert f.removals == 2 and f.regrets == 1
    assert f.gpu_hours_saved == pytest.approx(52 / 60)
    assert f.usd_saved == pytest.approx(G5_USD * 52 / 60)
    prep = bt.prepare(history)
    assert prep.oracle_gpu_hours == pytest.approx(113 / 60)  # 61..92, 95, 101..180
    assert f.idle_gpu_hours == pytest.approx((113 - 52) / 60)  # saved idle: 91, 92 and 131..180


def test_the_readded_node_is_too_young_for_a_window() -> None:
    history = trace({"n1": minutes({(0, 60): BUSY, (93, 93): BUSY})})
    prep = bt.prepare(history)
    f = bt.run_policy(prep, S2Z, "p")
    # Back at 97 (demand at 92 + 5): (93, 123] is clean at 125 but the node is 28 min old; 130 is the first.
    assert [r.at for r in f.log] == [at(90), at(130)]
    snap = bt.snapshot_at(prep, {}, {"n1": at(97)}, at(125), S2Z.idle_window)
    assert snap is not None
    report = plan(snap, S2Z, datetime.fromtimestamp(at(125), UTC)).nodes[0]
    assert report.verdict == "unknown" and "node_too_young" in report.reasons


def test_missing_samples_are_unknown_and_never_removed() -> None:
    # Idle throughout, but 4 of every 15 samples are missing: every 30-min window covers < 90 %.
    values: Activity = [None if k % 15 < 4 and k else IDLE for k in range(181)]
    history = trace({"n1": values})
    prep = bt.prepare(history)
    f = bt.run_policy(prep, S2Z, "p")
    assert f.removals == 0 and f.gpu_hours_saved == 0
    snap = bt.snapshot_at(prep, {}, {}, at(60), S2Z.idle_window)
    assert snap is not None
    report = plan(snap, S2Z, datetime.fromtimestamp(at(60), UTC)).nodes[0]
    assert report.verdict == "unknown"
    assert any(r.startswith("coverage_below_min") for r in report.reasons)
    known_idle = sum(1 for k in range(1, 181) if values[k] is not None)
    assert prep.oracle_gpu_hours == pytest.approx(known_idle / 60)  # missing minutes are not idle
    naive = bt.run_naive(prep)
    assert all(values[round((r.at - T0) / MIN)] is not None for r in naive.log)


def test_default_policy_protects_gpu_holders_and_scale_to_zero_evicts_them() -> None:
    history = trace({"n1": minutes({(0, 60): BUSY})})
    assert run(history, Policy()).removals == 0
    assert run(history, S2Z).removals == 1


# -------------------------------------------------------------------------------------------- baselines


def test_request_based_saves_nothing_when_every_pod_holds_its_gpu_all_the_time() -> None:
    history = trace({"n1": minutes({}), "n2": minutes({(0, 30): BUSY})})
    f = bt.run_request_based(bt.prepare(history))
    assert f.removals == 0 and f.gpu_hours_saved == 0 and f.usd_saved == 0
    assert f.share_of_oracle == 0


def test_request_based_removes_a_node_once_its_gpu_pod_is_gone() -> None:
    history = trace({"n1": minutes({}), "n2": minutes({})}, pods_until={"n2": 60})
    f = bt.run_request_based(bt.prepare(history))
    assert [(r.node, r.at) for r in f.log] == [("n2", at(70))]  # Cluster Autoscaler's 10 min unneeded


def test_naive_threshold_removes_after_one_sample_below_the_threshold() -> None:
    # Active except minute 5 and minute 20: the decisions at 5 and 20 see one idle sample each.
    history = trace({"n1": minutes({(6, 19): BUSY, (21, 180): BUSY}, default=IDLE)})
    f = bt.run_naive(bt.prepare(history))
    assert [r.at for r in f.log] == [at(5), at(20)]
    assert all(r.regret for r in f.log)
    assert f.unserved_gpu_minutes == pytest.approx(10.0)  # 5 active minutes after each removal


def test_oracle_and_ceilings_on_runs_of_10_and_40_minutes() -> None:
    # Idle runs: 11..20 (10 min) and 61..100 (40 min), busy otherwise.
    history = trace({"n1": minutes({(0, 10): BUSY, (21, 60): BUSY, (101, 180): BUSY})})
    prep = bt.prepare(history)
    oracle = bt.run_oracle(prep)
    assert oracle.gpu_hours_saved == pytest.approx(50 / 60) and oracle.removals == 2
    assert oracle.share_of_oracle == 1.0 and oracle.regrets == 0
    (c30,) = bt.ceilings(prep, [1800])
    assert c30.share == pytest.approx(40 / 50) and c30.reachable == pytest.approx(10 / 50)
    assert oracle.saved_by_step[-1] == pytest.approx(50 / 60)


# ------------------------------------------------------------------------------------- signal-set switch


def test_default_signal_set_still_requires_framebuffer_power_and_liveness() -> None:
    snap = snapshot([gpu_node("n1")], [], node_devices("n1", fb_used=None, power=None, energy=None))
    report = plan(snap, Policy()).nodes[0]
    assert report.verdict == "unknown"
    for reason in (
        "partial_response:DCGM_FI_DEV_FB_USED",
        "partial_response:DCGM_FI_DEV_FB_FREE",
        "partial_response:DCGM_FI_DEV_POWER_USAGE",
        "no_liveness_signal",
    ):
        assert reason in report.reasons
    complete = plan(snapshot([gpu_node("n1")], [], node_devices("n1")), Policy()).nodes[0]
    assert complete.verdict == "idle"


def test_activity_only_signal_set_skips_the_other_rules_but_not_activity() -> None:
    snap = snapshot([gpu_node("n1")], [], node_devices("n1", fb_used=None, power=None, energy=None))
    activity_only = dataclasses.replace(snap, signal_set=frozenset({SIGNAL_ACTIVITY}))
    report = plan(activity_only, Policy()).nodes[0]
    assert report.verdict == "idle"
    assert not any(r.startswith(("partial_response", "no_liveness", "power_ceiling")) for r in report.reasons)
    # A frozen exporter or a framebuffer above threshold would not even be looked at...
    busy_fb = snapshot([gpu_node("n1")], [], node_devices("n1", fb_used=lambda _i: 9000.0))
    assert (
        plan(dataclasses.replace(busy_fb, signal_set=frozenset({SIGNAL_ACTIVITY})), Policy()).nodes[0].verdict
        == "idle"
    )
    assert plan(busy_fb, Policy()).nodes[0].verdict in ("busy", "underutilized")
    # ...but activity is always required: no activity series ⇒ unknown.
    none = snapshot([gpu_node("n1")], [], node_devices("n1", util=None))
    assert (
        plan(dataclasses.replace(none, signal_set=frozenset({SIGNAL_ACTIVITY})), Policy()).nodes[0].verdict
        == "unknown"
    )


# ----------------------------------------------------------------------------------------------- sources


def _write_trace(path: Path, rows: list[tuple[float, float, str]]) -> Path:
    text = "value,timestamp_anon,container_ip\n" + "".join(f"{v},{t},{p}\n" for v, t, p in rows)
    path.write_bytes(gzip.compress(text.encode()))
    return path


def test_trace_reader_makes_one_single_gpu_node_per_pod(tmp_path: Path) -> None:
    rows = [(0.0, 1000.0 + 57 * k, "a" * 32) for k in range(40)]
    rows += [(80.0, 1000.0 + 57 * k, "b" * 32) for k in range(10, 20)]
    source = read_trace(_write_trace(tmp_path / "t.csv.gz", rows))
    h = source.history
    assert source.kind == "trace" and h.signal_set == frozenset({"activity"})
    assert h.resolution == 57 and h.start == 1000.0 and h.end == 1000.0 + 57 * 39
    prep = bt.prepare(h)
    assert set(prep.tracks) == {"gpu-aaaaaaaa", "gpu-bbbbbbbb"}
    assert prep.tracks["gpu-bbbbbbbb"].present == [(1000.0 + 570, 1000.0 + 57 * 19)]
    assert prep.tracks["gpu-aaaaaaaa"].present == [(1000.0, h.end)]
    assert all(t.gpus == 1 and t.hourly_usd == G5_USD for t in prep.tracks.values())
    pods = {p.spec.nodeName: p for f in h.frames for p in f.pods}
    assert pods["gpu-aaaaaaaa"].gpu_request() == 1


def test_trace_reader_rejects_multi_gpu_types_and_bad_files(tmp_path: Path) -> None:
    from rightsizer.domain.errors import ConfigError

    path = _write_trace(tmp_path / "t.csv.gz", [(0.0, 0.0, "a")])
    with pytest.raises(ConfigError, match="single-GPU"):
        read_trace(path, instance_type="g5.12xlarge")
    bad = tmp_path / "bad.csv"
    bad.write_text("value,when\n1,2\n")
    with pytest.raises(ConfigError, match="columns"):
        read_trace(bad)


def test_packaged_trace_is_the_full_alibaba_trace() -> None:
    source = read_trace(packaged_trace())
    h = source.history
    assert h.resolution == 57
    assert (h.end - h.start) / 3600 == pytest.approx(22.8)
    assert len({n.name for f in h.frames for n in f.nodes}) == 143
    assert (packaged_trace().parent / "LICENSE-NOTICE.md").read_text().count("SoCC '25") >= 1


def test_snapshot_series_replays_full_dcgm_snapshots(tmp_path: Path) -> None:
    # Two g5.12xlarge nodes in one node group; n-idle idle, n-busy busy; snapshots every 30 min.
    for k in range(3):
        when = AT + timedelta(minutes=30 * k)
        metrics = {
            **node_devices("n-idle"),
        }
        busy = node_devices("n-busy", util=lambda _i: 80.0)
        for name, items in busy.items():
            metrics.setdefault(name, []).extend(items)
        shifted = {
            name: [Series(s.labels, tuple(t + 1800 * k for t in s.times), s.values) for s in items]
            for name, items in metrics.items()
        }
        write_snapshot_dir(
            tmp_path / when.isoformat().replace("+00:00", "Z"),
            [gpu_node("n-idle"), gpu_node("n-busy")],
            [],
            shifted,
            at=when,
        )
    source = read_snapshot_series(tmp_path)
    h = source.history
    assert (
        h.start == (AT - timedelta(minutes=30)).timestamp() and h.end == (AT + timedelta(hours=1)).timestamp()
    )
    f = bt.run_policy(bt.prepare(h), Policy(), "default")
    assert [(r.node, r.at) for r in f.log] == [("n-idle", AT.timestamp())]
    assert f.gpu_hours_saved == pytest.approx(4 * 1.0)  # 4 GPUs, removed for the last hour


@pytest.mark.parametrize("position", [0, 2])
def test_a_snapshot_series_mixing_metrics_formats_is_refused_with_the_reason(
    tmp_path: Path, position: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # format-2 snapshots keep window facts, not raw samples: they cannot be merged with format-1 series
    # (a series of format-2 snapshots alone replays: tests/integration/test_backtest_format2.py)
    for k in range(3):
        when = AT + timedelta(minutes=30 * k)
        directory = tmp_path / when.isoformat().replace("+00:00", "Z")
        write_snapshot_dir(directory, [gpu_node("n-idle")], [], node_devices("n-idle"), at=when)
        if k == position:
            meta = json.loads((directory / "snapshot.json").read_text())
            (directory / "snapshot.json").write_text(json.dumps({**meta, "metrics_format": 2}))
    with pytest.raises(ConfigError) as refused:
        read_snapshot_series(tmp_path)
    assert refused.value.field == "metrics_format"
    assert "cannot be replayed as one history" in str(refused.value)
    assert main(["backtest", "--snapshot-series", str(tmp_path)]) == 2
    assert "metrics_format" in capsys.readouterr().err


def test_snapshot_series_needs_rfc3339_names(tmp_path: Path) -> None:
    (tmp_path / "yesterday").mkdir()
    assert main(["backtest", "--snapshot-series", str(tmp_path)]) == 2


# ---------------------------------------------------------------------------------------- service & CLI


def test_service_reuses_identical_policies_and_sweeps(tmp_path: Path) -> None:
    source = bt.Source("trace", "hand-made", trace({"n1": minutes({(0, 60): BUSY})}), "trace")
    request = BacktestRequest(
        (NamedPolicy("default", Policy()), NamedPolicy("s2z", S2Z)),
        sweep=Sweep.parse("idle_window=10m,30m"),
        sweep_base="s2z",
    )
    report = run_backtest(source, request)
    names = [r.figures.name for r in report.rows]
    assert names == ["default", "s2z", "request-based", "naive-threshold", "oracle"]
    assert [r.sweep_value for r in report.sweep_rows] == ["10m", "30m"]
    thirty = report.sweep_rows[1]
    assert thirty.figures.log == report.rows[1].figures.log and thirty.wall_seconds == 0.0
    assert report.sweep_rows[0].figures.log[0].at == at(70)  # a 10-min window: (60, 70] is clean
    assert report.sweep_rows[0].ceiling is not None and report.sweep_rows[0].ceiling.window == 600


def test_cli_trace_json_is_labelled_activity_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [(0.0 if 30 <= k <= 70 else 60.0, 1662858720.0 + 57 * k, "c" * 32) for k in range(120)]
    path = _write_trace(tmp_path / "t.csv.gz", rows)
    plot = tmp_path / "bt.png"
    code = main(
        ["backtest", "--trace", str(path), "--json", "--sweep", "idle_window=10m,20m", "--plot", str(plot)]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["basis"] == "activity-only" and doc["source"]["signals"] == ["activity"]
    runs = {r["name"]: r for r in doc["runs"]}
    assert list(runs) == [
        "default",
        "scale-to-zero",
        "workload-scale-to-zero",
        "request-based",
        "naive-threshold",
        "oracle",
    ]
    assert all(r["basis"] == "activity-only" for r in doc["runs"])
    # 39 idle minutes clear the node's 30-min window, never a workload's 2 h one (issue 32)
    assert runs["workload-scale-to-zero"]["removals"] == 0
    assert runs["default"]["gpu_hours_saved"] == 0.0
    assert runs["request-based"]["gpu_hours_saved"] == 0.0
    assert runs["scale-to-zero"]["removals"] == 1
    for key in (
        "gpu_hours_paid",
        "idle_gpu_hours",
        "share_of_oracle",
        "usd_saved",
        "regrets",
        "unserved_gpu_minutes",
    ):
        assert key in runs["scale-to-zero"]
    assert [p["value"] for p in doc["sweep"]["points"]] == ["10m", "20m"]
    assert doc["sweep"]["base"] == "scale-to-zero"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("why", ["no matplotlib", "no such directory"])
def test_a_plot_that_cannot_be_written_stops_before_the_replay(
    why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The packaged trace replays for minutes: a --plot that would fail at the end must fail first.
    import sys

    from rightsizer.backtest import report

    path = _write_trace(tmp_path / "t.csv.gz", [(0.0, 57.0 * k, "d" * 32) for k in range(60)])
    plot = tmp_path / "bt.png"
    if why == "no matplotlib":
        monkeypatch.setitem(sys.modules, "matplotlib", None)
    else:
        plot = tmp_path / "missing" / "bt.png"
    replays: list[object] = []
    monkeypatch.setattr(report, "run_backtest", lambda *a: replays.append(a))
    assert main(["backtest", "--trace", str(path), "--plot", str(plot)]) == 2
    assert replays == []
    err = capsys.readouterr().err
    assert "--plot" in err and ("gpu-rightsizer[plot]" in err if why == "no matplotlib" else "missing" in err)


def test_cli_table_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_trace(tmp_path / "t.csv.gz", [(0.0, 57.0 * k, "d" * 32) for k in range(60)])
    assert main(["backtest", "--trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert "activity-only" in out and "oracle" in out and "naive-threshold" in out
    assert main(["backtest", "--trace", str(path), "--sweep", "idle_windw=10m"]) == 2
    assert "idle_windw" in capsys.readouterr().err
    assert main(["backtest", "--prometheus"]) == 2
    assert main(["backtest", "--trace", str(path), "--step", "soon"]) == 2
    policy = tmp_path / "fast.yaml"
    policy.write_text("idle_window: 10m\nevict_idle_gpu_holders: true\n")
    assert main(["backtest", "--trace", str(path), "--policy", str(policy), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in doc["runs"]][:4] == [
        "default",
        "scale-to-zero",
        "workload-scale-to-zero",
        "fast",
    ]


@pytest.mark.parametrize(
    ("names", "refused"),
    [
        # the directory names order the series, each snapshot's taken_at places it: one time line or refused
        ([0, 30 * 60, 60 * 60], None),
        ([-7, 30 * 60 - 7, 60 * 60 + 59], None),  # named a few seconds off its taken_at: `date` in a cron job
        ([0, 30 * 60, 60 * 60 + 61], "named 2026-11-02T10:31:01Z but taken at 2026-11-02T10:30:00Z"),
        ([30 * 60, 0, 60 * 60], "named 2026-11-02T09:30:00Z but taken at 2026-11-02T10:00:00Z"),  # swapped
        ([0, 30 * 60, 90 * 60], "named 2026-11-02T11:00:00Z but taken at 2026-11-02T10:30:00Z"),
    ],
)
def test_a_snapshot_series_is_one_time_line_of_names_and_taken_at(
    tmp_path: Path, names: list[int], refused: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    start = AT - timedelta(minutes=30)
    for k, offset in enumerate(names):
        when = start + timedelta(minutes=30 * k)
        named = (start + timedelta(seconds=offset)).isoformat().replace("+00:00", "Z")
        write_snapshot_dir(tmp_path / named, [gpu_node("n-idle")], [], node_devices("n-idle"), at=when)
    code = main(["backtest", "--snapshot-series", str(tmp_path)])
    err = capsys.readouterr().err
    if refused is None:
        assert code == 0, err
    else:
        assert code == 2 and refused in err and "taken_at" in err, err


def test_one_snapshot_under_two_names_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a copy of one snapshot named a few seconds apart: the same instant twice in one history
    for named in ("2026-11-02T10:00:00Z", "2026-11-02T10:00:30Z"):
        write_snapshot_dir(tmp_path / named, [gpu_node("n-idle")], [], node_devices("n-idle"), at=AT)
    assert main(["backtest", "--snapshot-series", str(tmp_path)]) == 2
    assert "a history holds each instant once" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        # every argument the user typed is refused before the history is read (minutes from a packaged
        # trace or from Prometheus), not after: the sweep's values and key, the policy files, the plot
        (["--sweep", "idle_window=10x"], "idle_window"),
        (["--sweep", "idle_windw=10m,30m"], "--sweep"),
        (["--sweep", "idle_window=10m,-5m"], "idle_window"),
        (["--policy", "{tmp}/typo.yaml"], "idle_windw"),
        (["--policy", "{tmp}/none.yaml"], "none.yaml"),
        (["--plot", "{tmp}/missing/bt.png"], "--plot"),
        (["--unserved-gpu-minute-usd", "-1"], "--unserved-gpu-minute-usd"),
        (["--provision-delay", "measured"], "--provision-delay"),
        (["--step", "0s"], "--step"),
    ],
)
def test_a_bad_argument_stops_before_the_history_is_read(
    extra: list[str],
    flag: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import rightsizer.cli.backtest as cli_backtest

    (tmp_path / "typo.yaml").write_text("idle_windw: 10m\n")
    read: list[object] = []
    monkeypatch.setattr(cli_backtest, "_backtest_source", lambda args: read.append(args))
    argv = ["backtest", "--trace", "t.csv.gz", *(a.replace("{tmp}", str(tmp_path)) for a in extra)]
    assert main(argv) == 2
    assert read == [], "the history was read before the argument was refused"
    assert flag in capsys.readouterr().err
