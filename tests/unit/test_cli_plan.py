"""CLI ``rightsizer plan --snapshot``: JSON contract, table, and exit 2 on bad snapshots (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rightsizer.cli import main
from rightsizer.domain.plan import action_id
from tests.builders import const, gpu_node, merge_metrics, node_devices, pod, write_snapshot_dir

NODE_KEYS = {
    "node", "verdict", "reasons", "node_group", "instance_id", "instance_type", "gpus",
    "gpu_activity_max_pct", "fb_used_max_mib", "coverage", "hourly_usd",
}  # fmt: skip
ACTION_KEYS = {
    "action_id", "kind", "node", "node_group", "instance_id", "from", "to", "reason",
    "hourly_savings_usd", "monthly_savings_usd", "manifests", "expected_slowdown_pct", "why_safe",
    "estimated_hourly_savings_usd", "estimated_monthly_savings_usd",
}  # fmt: skip


@pytest.fixture
def snap_dir(tmp_path: Path) -> Path:
    nodes = [
        gpu_node("idle-1", instance_type="g5.12xlarge", gpus=4, instance_id="i-idle1"),
        gpu_node("busy-1", instance_type="g5.12xlarge", gpus=4, instance_id="i-busy1"),
        gpu_node("frozen-1", instance_type="g5.12xlarge", gpus=4, instance_id="i-frozen1"),
    ]
    metrics = merge_metrics(
        node_devices("idle-1", 4),
        node_devices("busy-1", 4, util=const(95), fb_used=const(20000)),
        node_devices("frozen-1", 4, energy="frozen", power=const(30)),
    )
    return write_snapshot_dir(tmp_path / "snap", nodes, [pod("vllm-0", "busy-1", gpus=4)], metrics)


def test_plan_json_follows_the_contract(snap_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--snapshot", str(snap_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {
        "at",
        "taken_at",
        "dry_run",
        "policy",
        "nodes",
        "actions",
        "unmapped",
        "savings",
        "showback",
        "workloads",
        "reservations",
    }
    assert doc["at"] == doc["taken_at"] == "2026-11-02T10:00:00Z"
    assert doc["dry_run"] is True
    assert doc["policy"]["idle_window"] == 1800
    assert [n["node"] for n in doc["nodes"]] == ["busy-1", "frozen-1", "idle-1"]
    assert all(set(n) == NODE_KEYS for n in doc["nodes"])
    assert {n["node"]: n["verdict"] for n in doc["nodes"]} == {
        "busy-1": "busy",
        "frozen-1": "unknown",
        "idle-1": "idle",
    }
    [action] = doc["actions"]
    assert set(action) == ACTION_KEYS
    assert (action["kind"], action["node"], action["from"], action["to"]) == ("scale_in", "idle-1", 3, 2)
    assert action["action_id"] == action_id("scale_in", "idle-1", 2)
    assert action["hourly_savings_usd"] == pytest.approx(5.672)
    assert action["expected_slowdown_pct"] == 0 and "idle for the whole" in action["why_safe"]
    assert doc["savings"] == {"hourly_usd": pytest.approx(5.672), "monthly_usd": pytest.approx(5.672 * 730)}


def test_plan_table_names_verdicts_and_savings(snap_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--snapshot", str(snap_dir)]) == 0
    out = capsys.readouterr().out
    assert "idle-1" in out and "idle_window_clean" in out and "exporter_frozen" in out
    assert "Savings of executable actions: 5.67 USD/hour, 4,140.56 USD/month" in out
    assert "safe: slowdown 0%: every GPU idle for the whole 30 min window" in out


def test_plan_at_and_policy_override(
    snap_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "gpu_activity_max_pct: 99\nfb_used_max_mib: 30000\nidle_power_max_w: {NVIDIA A10G: 400}\n"
    )
    assert (
        main(
            [
                "plan",
                "--snapshot",
                str(snap_dir),
                "--policy",
                str(policy),
                "--json",
                "--at",
                "2026-11-02T11:00:00+01:00",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["at"] == "2026-11-02T10:00:00Z"
    assert {n["node"]: n["verdict"] for n in doc["nodes"]}["busy-1"] == "protected"


@pytest.mark.parametrize(
    ("breakage", "needle"),
    [
        (lambda d: (d / "nodes.json").unlink(), "nodes.json: required file is missing"),
        (lambda d: (d / "pods.json").write_text("{not json"), "pods.json: not valid JSON"),
        (
            lambda d: (d / "snapshot.json").write_text(
                '{"taken_at": "2026-11-02T10:00:00", "window_seconds": 1800, "step_seconds": 60, "cluster": "c", "region": "r"}'
            ),
            "snapshot.json: taken_at",
        ),
        (
            lambda d: (d / "nodes.json").write_text('{"kind": "List", "items": [{"metadata": {}}]}'),
            "nodes.json: items[0].metadata.name",
        ),
        (
            lambda d: (d / "nodegroups.json").write_text(
                '{"autoScalingGroups": [{"AutoScalingGroupName": "x"}]}'
            ),
            "nodegroups.json: autoScalingGroups.0.MinSize",
        ),
    ],
)
def test_bad_snapshot_exits_2_naming_file_and_field(
    snap_dir: Path, capsys: pytest.CaptureFixture[str], breakage: object, needle: str
) -> None:
    breakage(snap_dir)  # type: ignore[operator]
    assert main(["plan", "--snapshot", str(snap_dir), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert needle in err


def test_bad_metrics_file_is_partial_not_fatal(snap_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (snap_dir / "metrics" / "DCGM_FI_DEV_POWER_USAGE.json").write_text(
        '{"status": "success", "warnings": ["partial"], "data": {"resultType": "matrix", "result": []}}'
    )
    assert main(["plan", "--snapshot", str(snap_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {n["verdict"] for n in doc["nodes"]} == {"unknown"}
    assert doc["actions"] == []


def test_bad_policy_key_exits_2(snap_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("idle_windw: 10m\n")
    assert main(["plan", "--snapshot", str(snap_dir), "--policy", str(policy)]) == 2
    assert "p.yaml: idle_windw: Extra inputs are not permitted" in capsys.readouterr().err


def test_naive_at_exits_2(snap_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--snapshot", str(snap_dir), "--at", "2026-11-02T10:00:00"]) == 2
    assert "--at" in capsys.readouterr().err


def test_snapshot_into_a_non_empty_directory_exits_2_before_contacting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "cluster: {name: nowhere-eks, region: us-east-1}\naws: {endpoint_url: 'http://127.0.0.1:9'}\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["snapshot", "--config", str(config), "--out", str(out)]) == 2
    assert "--out" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"


def test_a_reader_that_stops_early_is_no_failure(snap_dir: Path) -> None:
    # `rightsizer plan ... | head` : the reader closed the pipe; nothing failed, so nothing may say so
    # (no "failed: BrokenPipeError", no interpreter noise at exit), and the exit code is a quiet 1.
    import subprocess
    import sys

    command = [sys.executable, "-m", "rightsizer.cli", "plan", "--snapshot", str(snap_dir)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before the first line is written
    _, err = proc.communicate(timeout=60)
    assert err == ""
    assert proc.returncode == 1


@pytest.mark.parametrize(
    ("at", "idle_window"),
    [
        ("2026-11-03T10:00:00Z", "30m"),  # a day after taken_at: no recorded sample in its window
        ("2026-11-02T10:30:00Z", "30m"),  # the window (10:00, 10:30] starts where the recording ends
        ("2026-11-02T09:29:00Z", "30m"),  # before the recorded window (09:30, 10:00]
        ("2026-11-02T10:10:00Z", "10m"),  # a shorter policy window reaches less far past taken_at
    ],
)
def test_at_beyond_the_recorded_window_exits_2_naming_the_window(
    snap_dir: Path, tmp_path: Path, at: str, idle_window: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # WHEN the policy's window ending at --at shares no instant with the metrics the snapshot recorded
    # THEN every node would be `unknown` for want of data: a usage error saying what to pass instead
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"idle_window: {idle_window}\n")
    assert main(["plan", "--snapshot", str(snap_dir), "--policy", str(policy), "--at", at]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.strip().splitlines()
    assert "--at" in line and "2026-11-02T09:30:00Z" in line and "2026-11-02T10:00:00Z" in line, line


@pytest.mark.parametrize(
    ("at", "verdicts"),
    [
        ("2026-11-02T09:30:00Z", "unknown"),  # inside the recorded span: decided as before, reasons say why
        ("2026-11-02T09:45:00Z", "unknown"),
        ("2026-11-02T10:01:00Z", "idle"),
    ],
)
def test_at_the_recording_can_answer_decides_as_before(
    snap_dir: Path, at: str, verdicts: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--snapshot", str(snap_dir), "--json", "--at", at]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {n["node"]: n["verdict"] for n in doc["nodes"]}["idle-1"] == verdicts
