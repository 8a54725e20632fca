"""The dashboard's idle-GPU panels count what the rightsizer counts (issue 16).

GIVEN a cluster of seven one-GPU nodes over two hours — three idle and unheld, one busy MIG GPU whose
instances read DCGM_FI_DEV_GPU_UTIL 0, one GPU with a model loaded, one held by a notebook pod (kube-state-
metrics), one idle with only a DaemonSet pod and a finished Job on it — and the shipped recording rules
WHEN promtool evaluates the panels' own expressions (read from ``infra/dashboards/gpu-rightsizer.json``)
THEN "idle now" is 4 nodes, "idle GPU-hours" is 4 GPUs × the hours seen and the share 4/7 — where
the previous expression (DCGM_FI_DEV_GPU_UTIL ≤ 5 alone) counted all seven, the MIG GPU twice;
AND a cluster where nothing is idle by the rule shows 0 GPU-hours.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cluster_package import plain_files
from tests.support.promtool_test import promtool_unit_test

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "dashboards" / "gpu-rightsizer.json"
STEPS = 24  # 5-minute samples 0..2 h (25 points)
_OLD_HOURS = "sum(sum_over_time((count by (node) (DCGM_FI_DEV_GPU_UTIL <= 5))[24h:5m])) / 12"


def panel_expr(title_start: str) -> str:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    [expr] = [t["expr"] for p in panels if p["title"].startswith(title_start) for t in p["targets"]]
    return str(expr)


def gpu(node: str, uuid: str, util: float, fb: float, mig: str = "") -> list[dict[str, str]]:
    labels = f'node="{node}",gpu="0",UUID="{uuid}"' + (f',GPU_I_ID="{mig}"' if mig else "")
    return [
        {"series": f"DCGM_FI_DEV_GPU_UTIL{{{labels}}}", "values": f"{util:g}x{STEPS}"},
        {"series": f"DCGM_FI_DEV_FB_USED{{{labels}}}", "values": f"{fb:g}x{STEPS}"},
    ]


def pod(node: str, namespace: str, name: str, owner: str, phase: str, resource: str) -> list[dict[str, str]]:
    key = f'namespace="{namespace}",pod="{name}"'
    rows = [
        {"series": f'kube_pod_info{{{key},node="{node}"}}', "values": f"1x{STEPS}"},
        {"series": f'kube_pod_owner{{{key},owner_kind="{owner}"}}', "values": f"1x{STEPS}"},
        {"series": f'kube_pod_status_phase{{{key},phase="{phase}"}}', "values": f"1x{STEPS}"},
    ]
    if resource:
        rows.append(
            {
                "series": f'kube_pod_container_resource_requests{{{key},node="{node}",resource="{resource}"}}',
                "values": f"1x{STEPS}",
            }
        )
    return rows


def mixed_cluster() -> list[dict[str, str]]:
    rows = gpu("a", "GPU-a", 0, 0) + gpu("b", "GPU-b", 1, 200)  # idle, unheld
    rows += gpu("mig", "GPU-m", 0, 0, mig="2") + gpu("mig", "GPU-m", 0, 0, mig="3")
    rows += [
        {
            "series": 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{node="mig",gpu="0",UUID="GPU-m",GPU_I_ID="2"}',
            "values": f"0.71x{STEPS}",
        }
    ]
    rows += gpu("model", "GPU-l", 0, 15360)  # a loaded model
    rows += gpu("held", "GPU-h", 0, 0) + pod(
        "held", "lab", "jupyter-0", "StatefulSet", "Running", "nvidia_com_gpu"
    )
    rows += gpu("ds", "GPU-d", 0, 0) + pod(
        "ds", "kube-system", "probe-x", "DaemonSet", "Running", "nvidia_com_gpu"
    )
    rows += pod("ds", "batch", "train-1", "Job", "Succeeded", "nvidia_com_gpu")
    rows += gpu("c", "GPU-c", 3, 100)  # idle, unheld (third idle node)
    return rows


def busy_cluster() -> list[dict[str, str]]:
    """Nothing idle by the rule: MIG busy, a model loaded, a holder. The old panel saw 3 idle GPUs."""
    rows = gpu("mig", "GPU-m", 0, 0, mig="2")
    rows += [
        {
            "series": 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{node="mig",gpu="0",UUID="GPU-m",GPU_I_ID="2"}',
            "values": f"0.5x{STEPS}",
        }
    ]
    rows += gpu("model", "GPU-l", 0, 15360)
    rows += gpu("held", "GPU-h", 0, 0) + pod(
        "held", "lab", "jupyter-0", "StatefulSet", "Running", "nvidia_com_gpu"
    )
    return rows


def run_promtool(tmp_path: Path, series: list[dict[str, str]], checks: list[tuple[str, float]]) -> None:
    rules = {"rules.yaml": plain_files()["gpu-idle-rules.yaml"]}
    samples = [(expr, "2h", value) for expr, value in checks]
    proc = promtool_unit_test(tmp_path, series, rule_files=rules, samples=samples, interval="5m")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_idle_panels_follow_the_rightsizers_rule(tmp_path: Path) -> None:
    points = STEPS + 1  # 0, 5 m, ..., 2 h
    run_promtool(
        tmp_path,
        mixed_cluster(),
        [
            (panel_expr("GPU nodes idle now"), 4),  # a, b, c, ds
            (panel_expr("GPU nodes reporting"), 7),
            (panel_expr("Idle GPU-hours"), 4 * points / 12),
            (panel_expr("Idle GPU share"), 4 / 7),
            # the control: GPU_UTIL <= 5 alone calls all seven idle, the MIG GPU twice (per instance)
            (_OLD_HOURS, 8 * points / 12),
        ],
    )


def test_no_idle_gpu_hours_when_the_rule_finds_none(tmp_path: Path) -> None:
    points = STEPS + 1
    run_promtool(
        tmp_path,
        busy_cluster(),
        [
            (panel_expr("Idle GPU-hours"), 0),
            (panel_expr("GPU nodes idle now"), 0),
            (_OLD_HOURS, 3 * points / 12),
        ],
    )


def test_the_power_panel_keeps_nodes_without_a_node_label_apart(tmp_path: Path) -> None:
    # GIVEN two nodes whose exporters add no `node` label (the GPU Operator's ServiceMonitor), joined to their
    # nodes by kube_pod_info, and a static exporter no pod explains
    def power(uuid: str, exporter: str, watts: float) -> dict[str, str]:
        labels = f'gpu="0",UUID="{uuid}",namespace="gpu-operator",pod="{exporter}"'
        return {"series": f"DCGM_FI_DEV_POWER_USAGE{{{labels}}}", "values": f"{watts:g}x{STEPS}"}

    series = [power("GPU-1", "dcgm-a", 30), power("GPU-2", "dcgm-a", 32), power("GPU-3", "dcgm-b", 250)]
    series += [
        {
            "series": 'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-x",Hostname="localhost"}',
            "values": f"27x{STEPS}",
        }
    ]
    for exporter, node in (("dcgm-a", "node-a"), ("dcgm-b", "node-b")):
        series.append(
            {
                "series": f'kube_pod_info{{namespace="gpu-operator",pod="{exporter}",node="{node}"}}',
                "values": f"1x{STEPS}",
            }
        )
    expr = panel_expr("Power by node")
    # THEN the panel has one series per node with that node's watts (before: sum by (node) of every
    # series merged node-a, node-b and the static exporter into one series of 339 W with no node)
    run_promtool(
        tmp_path,
        series,
        [
            (f"count({expr})", 2),
            (f'sum({expr}{{node="node-a"}})', 62),
            (f'sum({expr}{{node="node-b"}})', 250),
            (f'count({expr}{{node=""}}) or vector(0)', 0),
        ],
    )
