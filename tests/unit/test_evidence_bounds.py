"""Evidence that cannot fool us (issue 11 item 6): the freshness bound follows the measured scrape interval,
and a framebuffer total far from the catalog's memory for the GPU makes the device unknown.

Pure: format-2 snapshot directories written to ``tmp_path`` and decoded by the real loader, and
``assess_gpus`` on hand-made device signals.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path

import pytest

from rightsizer.adapters.snapshot_dir import load_snapshot
from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.gpu import FRESHNESS_FALLBACK_S, assess_gpus, freshness_bound
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.model import Node, Series
from rightsizer.domain.observation_signals import signals_from_observation
from rightsizer.domain.planner import plan
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import GPU_UTIL, PROF_ACTIVE, UP, DeviceSignals, Window, collect_signals
from tests.builders import AT, STEP, WINDOW, gpu_node, node_devices, snapshot, times
from tests.unit.test_observation import DEV, END, NODE, decide, idle_files, matrix, steps, write

#: The scrape target of the device in ``idle_files`` (``test_observation.DEV``: no ``job`` label).
TARGET = {"instance": "10.1.0.1:9400"}


def with_interval(
    scrape: float, age: float, target: dict[str, str] = TARGET, **extra: dict[str, object]
) -> dict[str, dict[str, object]]:
    """Idle files whose exporter ``target`` was scraped every ``scrape`` s (``up.count.json``: scrape
    attempts in the window), the device's newest activity sample ``age`` s old."""
    return idle_files(
        **{
            f"metrics/{UP}.count.json": matrix([(END, str(WINDOW // scrape))], target),
            f"metrics/{GPU_UTIL}.timestamp.json": matrix([(END, str(END - age))]),
            **extra,
        }
    )


def intervals(root: Path) -> list[float | None]:
    """``sample_interval_s`` of the snapshot's devices, as ``plan --snapshot`` reads them."""
    snap = load_snapshot(root)
    files = {"step": snap.metrics, "timestamp": snap.timestamps, **snap.metric_extras}
    window = Window.ending(snap.meta.taken_at, WINDOW, STEP)
    signals = signals_from_observation(files, NodeJoiner(snap.nodes, snap.pods), window, 5.0)
    return [d.sample_interval_s for d in signals.devices[NODE]]


@pytest.mark.parametrize("scrape", [10, 15, 30, 60])
def test_the_default_freshness_bound_is_two_measured_intervals_plus_a_step(
    tmp_path: Path, scrape: int
) -> None:
    bound = 2 * scrape + STEP
    fresh = decide(write(tmp_path / "fresh", with_interval(scrape, bound - 1)))
    stale = decide(write(tmp_path / "stale", with_interval(scrape, bound + 1)))
    assert not [r for r in fresh.reasons if r.startswith("stale_metrics")], fresh.reasons
    assert f"stale_metrics:{bound + 1}s" in stale.reasons and stale.verdict == "unknown"


def test_an_exporter_silent_for_four_minutes_is_stale_where_five_minutes_let_it_pass(tmp_path: Path) -> None:
    report = decide(write(tmp_path, with_interval(15, 240)))
    assert "stale_metrics:240s" in report.reasons


def test_the_up_count_of_another_target_never_sets_the_interval_of_a_device(tmp_path: Path) -> None:
    # GIVEN up counts of 15 s scrapes, but of targets the device's series do not come from: another
    # address, or its address under another job (the device's series carry no job)
    for i, target in enumerate(({"instance": "10.9.9.9:9400"}, {**TARGET, "job": "node-exporter"})):
        files = with_interval(15, 200, target)
        # THEN its interval is unknown: the fixed bound (200 s is fresh), as without any count
        report = decide(write(tmp_path / str(i), files))
        assert not [r for r in report.reasons if r.startswith("stale_metrics")], report.reasons
        assert intervals(tmp_path / str(i)) == [None]


def test_job_and_instance_together_name_the_target(tmp_path: Path) -> None:
    # GIVEN one address scraped by two jobs: dcgm every 60 s, a node exporter relabelled to the same
    # instance every 15 s; the device's series come from the dcgm job
    dev = {**DEV, "job": "dcgm"}
    counts = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {"metric": {**TARGET, "job": "dcgm"}, "values": [[END, str(WINDOW // 60)]]},
                {"metric": {**TARGET, "job": "node-exporter"}, "values": [[END, str(WINDOW // 15)]]},
            ],
        },
    }
    files = idle_files(
        **{
            f"metrics/{GPU_UTIL}.json": matrix(steps("1"), dev),
            f"metrics/{UP}.count.json": counts,
            f"metrics/{GPU_UTIL}.timestamp.json": matrix([(END, str(END - 100))], dev),
        }
    )
    # THEN its interval is its own job's: 60 s (a 100 s old sample is fresh: 2 × 60 + 60 = 180 s)
    assert intervals(write(tmp_path, files)) == [60.0]
    assert not [r for r in decide(tmp_path).reasons if r.startswith("stale_metrics")]


def test_format_2_snapshots_with_per_device_activity_counts_decide_as_when_written(tmp_path: Path) -> None:
    # GIVEN a format-2 snapshot written before up.count.json: per-device count_over_time of the activity
    # metrics, GPU_UTIL every 15 s, the profiling metric every 60 s
    files = idle_files(
        **{
            f"metrics/{GPU_UTIL}.count.json": matrix([(END, str(WINDOW // 15))]),
            f"metrics/{PROF_ACTIVE}.count.json": matrix([(END, str(WINDOW // 60))]),
            f"metrics/{GPU_UTIL}.timestamp.json": matrix([(END, str(END - 100))]),
        }
    )
    # THEN the device's best-sampled activity metric sets its interval: 2 × 15 s + 60 s = 90 s < 100 s
    assert "stale_metrics:100s" in decide(write(tmp_path / "old", files)).reasons
    # AND its own counts win over an up count in the same files (a hand-made mix)
    mixed = {**files, f"metrics/{UP}.count.json": matrix([(END, str(WINDOW // 60))], TARGET)}
    assert "stale_metrics:100s" in decide(write(tmp_path / "mixed", mixed)).reasons


def test_a_configured_bound_wins_and_no_measurement_falls_back(tmp_path: Path) -> None:
    loaded = write(tmp_path / "a", with_interval(15, 200))

    configured = plan(load_snapshot(loaded), Policy(max_sample_age=600)).nodes[0]
    assert not [r for r in configured.reasons if r.startswith("stale_metrics")]
    # a format-2 snapshot written before any count files (per-device or up): the previous fixed bound
    old = decide(
        write(
            tmp_path / "b",
            idle_files(**{f"metrics/{GPU_UTIL}.timestamp.json": matrix([(END, str(END - 200))])}),
        )
    )
    assert not [r for r in old.reasons if r.startswith("stale_metrics")]
    old_stale = decide(
        write(
            tmp_path / "c",
            idle_files(**{f"metrics/{GPU_UTIL}.timestamp.json": matrix([(END, str(END - 301))])}),
        )
    )
    assert "stale_metrics:301s" in old_stale.reasons


def test_freshness_bound_of_several_devices() -> None:
    fast, slow = (
        DeviceSignals("n", "a", sample_interval_s=15.0),
        DeviceSignals("n", "b", sample_interval_s=45.0),
    )
    assert freshness_bound(None, [fast, slow], 60) == 150
    assert freshness_bound(None, [fast, DeviceSignals("n", "c")], 60) == FRESHNESS_FALLBACK_S
    assert (
        freshness_bound(None, [DeviceSignals("n", "d", sample_interval_s=200.0)], 60) == FRESHNESS_FALLBACK_S
    )
    assert freshness_bound(120, [fast], 60) == 120


# ----------------------------------------------------------------------------- framebuffer vs catalog


def device(total: float | None, *, mig: bool = False, used: float = 300.0) -> DeviceSignals:
    return DeviceSignals(
        "n",
        "GPU-0",
        gpu_instance="1" if mig else "",
        activity_max_pct=0.0,
        coverage=1.0,
        fb_used_max_mib=used,
        fb_total_mib=total,
        power_max_w=27.0,
        newest_sample=END - 10,
        sample_interval_s=15.0,
        liveness="moving",
        has_fb=True,
        has_power=True,
    )


def fb_reasons(instance_type: str, dev: DeviceSignals) -> list[str]:
    catalog = load_catalog()
    node = Node.model_validate(
        gpu_node("n", instance_type=instance_type, gpus=1, created=AT - timedelta(days=2))
    )
    assessment = assess_gpus(
        node,
        catalog.get(instance_type),
        [dev],
        policy=Policy(),
        power_ceilings=catalog.idle_power_w,
        window=Window.ending(AT, WINDOW, STEP),
        at=AT,
        up_coverage=None,
        problems=(),
        present=frozenset(
            {GPU_UTIL, "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE"}
        ),
        exporter=None,
    )
    return [r for r in assessment.reasons if r.startswith("fb_implausible")]


@pytest.mark.parametrize(
    ("instance_type", "total"),
    [
        ("g5.xlarge", 22731),  # A10G: 24,576 MiB nominal, the driver reports 22,731 used + free
        ("g4dn.xlarge", 15360),  # T4 16 GiB
        ("p4d.24xlarge", 40536),  # A100 40 GB
        ("p5.48xlarge", 81559),  # H100 80 GB
        ("g6.xlarge", 23034),  # L4
    ],
)
def test_real_framebuffer_totals_are_plausible(instance_type: str, total: float) -> None:
    assert fb_reasons(instance_type, device(total)) == []


@pytest.mark.parametrize(
    ("instance_type", "total"),
    [
        ("p4d.24xlarge", 22731),  # an A10G's reading on an A100 node
        ("g5.xlarge", 40536),  # an A100's reading on an A10G node
        ("g4dn.xlarge", 8192),  # half the memory missing
        ("p5.48xlarge", 1.0),  # a nearly-zero total
    ],
)
def test_a_total_far_from_the_catalog_memory_makes_the_device_unknown(
    instance_type: str, total: float
) -> None:
    reasons = fb_reasons(instance_type, device(total))
    assert len(reasons) == 1 and reasons[0].startswith("fb_implausible:total_"), reasons


def test_mig_slices_and_uncatalogued_types_are_not_compared() -> None:
    assert fb_reasons("p4d.24xlarge", device(4864, mig=True)) == []  # a 1g.5gb slice
    assert fb_reasons("x9.unknown", device(22731)) == []


# ---------------------------------------------------------------- format 1: the bound from raw sample times


def format1_timestamps(scrape: float, stopped: float, phase: float) -> list[float]:
    """What a format-1 ``timestamp(M)`` matrix holds at each step point: the time of the newest raw sample
    (scrapes every ``scrape`` s, offset ``phase``), none after the exporter stopped ``stopped`` s before AT."""
    last = AT.timestamp() - stopped
    return [phase + ((min(t, last) - phase) // scrape) * scrape for t in times()]


def format1_reasons(
    scrape: float, stopped: float, *, phase: float = 7.0, with_timestamps: bool = True
) -> list[str]:
    """The reasons of a format-1 source's one idle A10G node whose exporter scrapes every ``scrape`` s."""
    labels = {"node": "n1", "gpu": "0", "UUID": "GPU-n1-0", "Hostname": "n1"}
    stamps = [Series(labels, tuple(times()), tuple(format1_timestamps(scrape, stopped, phase)))]
    snap = snapshot(
        [gpu_node("n1", instance_type="g5.2xlarge", gpus=1)],
        [],
        node_devices("n1", 1),
        timestamps={GPU_UTIL: stamps} if with_timestamps else None,
    )
    return [r for r in plan(snap, Policy()).nodes[0].reasons if r.startswith("stale_metrics")]


def format1_bound(scrape: float, stopped: float, phase: float = 7.0) -> tuple[float, float]:
    """(the rule's bound, the newest sample's age at AT) for such a source: two × the shortest gap between
    the distinct raw sample times the matrix shows, plus one step, at most 300 s."""
    distinct = sorted(set(format1_timestamps(scrape, stopped, phase)))
    gap = min(b - a for a, b in itertools.pairwise(distinct))
    return min(FRESHNESS_FALLBACK_S, 2 * gap + STEP), AT.timestamp() - distinct[-1]


def test_format_1_shows_fast_scrapes_only_at_the_step_resolution() -> None:
    # A healthy 15 s scrape at the 60 s step: one sample per step point, 60 s apart — format 1 only knows
    # the interval is at most 60 s (bound 180 s; format 2 counts every sample: 90 s). A 90 s scrape is
    # seen exactly (240 s); a 120 s one reaches the lookback cap.
    assert format1_bound(15, 0.0)[0] == 180
    assert format1_bound(90, 0.0)[0] == 240
    assert format1_bound(120, 0.0)[0] == FRESHNESS_FALLBACK_S
    # an exporter silent for four minutes is stale, where the fixed 5 minutes let it pass
    assert format1_reasons(15, 240) == ["stale_metrics:248s"]


@pytest.mark.parametrize("scrape", [15, 30, 60, 90, 120])
@pytest.mark.parametrize("stopped", [0, 50, 100, 130, 170, 185, 230, 250, 290])
def test_format_1_is_stale_exactly_beyond_the_rule(scrape: int, stopped: int) -> None:
    bound, age = format1_bound(scrape, stopped)
    assert format1_reasons(scrape, stopped) == ([f"stale_metrics:{int(age)}s"] if age > bound else [])


@pytest.mark.parametrize("scrape", [10, 15, 30, 45, 60, 90, 120, 240])
@pytest.mark.parametrize("phase", [0.0, 7.0, 59.0])
def test_format_1_never_calls_a_healthy_exporter_stale(scrape: int, phase: float) -> None:
    # The shortest gap is a whole number of intervals, an upper bound of the interval: a healthy exporter
    # (newest sample at most one interval old) is fresh at any scrape interval and phase
    assert format1_reasons(scrape, 0.0, phase=phase) == []


def test_format_1_without_raw_sample_times_keeps_the_fixed_bound() -> None:
    # Without timestamp matrices a format-1 source shows no raw sample time at all (freshness comes from
    # the point times, which Prometheus' lookback carries forward): nothing to measure, 300 s kept
    assert format1_reasons(15, 0.0, with_timestamps=False) == []
    snap = snapshot([gpu_node("n1", instance_type="g5.2xlarge", gpus=1)], [], node_devices("n1", 1))
    window = Window.ending(AT, WINDOW, STEP)
    signals = collect_signals(snap.metrics, {}, NodeJoiner(snap.nodes, snap.pods), window, 5.0)
    (device,) = signals.devices["n1"]
    assert device.sample_interval_s is None
    assert freshness_bound(None, [device], STEP) == FRESHNESS_FALLBACK_S
