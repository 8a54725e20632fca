"""The KEDA example wakes a GPU Deployment from zero and scales it past two replicas (issue 16).

GIVEN the ScaledObject ``infra/k8s/components/keda-example`` renders (valid against KEDA's CRD schema)
AND its triggers' queries and thresholds turned into the replica count KEDA and the HPA would ask for
(``desired_replicas``)
WHEN promtool evaluates that over a day in the life of the Deployment — no traffic and no replica; the
first requests at the ingress while no replica (so no GPU or model-server series) exists; heavy load on two
replicas; traffic gone
THEN the answer is 0 → 1 → several (> 2) → 0.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster_package import COMPONENTS, kustomize
from tests.support.crd_schema import crd_errors
from tests.support.promtool_test import promtool_unit_test

pytestmark = pytest.mark.integration

MINUTES = 80


def scaled_object(tmp_path: Path) -> dict[str, Any]:
    """The ScaledObject as a user's overlay that adds the component renders it."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    component = os.path.relpath(COMPONENTS / "keda-example", overlay)
    (overlay / "kustomization.yaml").write_text(
        f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\ncomponents:\n  - {component}\n"
    )
    [doc] = kustomize(overlay)
    return doc


def desired_replicas(obj: dict[str, Any]) -> str:
    """PromQL for the replica count KEDA + HPA ask for, from the ScaledObject's prometheus triggers:

    - a trigger's value is its query, 0 when empty (prometheus scaler, ``ignoreNullValues`` default true);
    - it is active when the value exceeds ``activationThreshold``; no active trigger ⇒ 0 replicas
      (``minReplicaCount`` 0, after ``cooldownPeriod``);
    - otherwise max over triggers of ceil(value / threshold) (HPA ``AverageValue``), within
      [1, ``maxReplicaCount``].
    Stabilization windows and the HPA's 10 % tolerance only delay these numbers; they are left out."""
    spec = obj["spec"]
    assert spec["minReplicaCount"] == 0
    values, active, per_trigger = [], [], []
    for i, trigger in enumerate(spec["triggers"]):
        assert trigger["type"] == "prometheus"
        meta = trigger["metadata"]
        assert meta.get("metricType", "AverageValue") == "AverageValue"
        value = f"(({meta['query']}) or vector(0))"
        values.append(value)
        active.append(f"({value} > {float(meta['activationThreshold'])})")
        per_trigger.append(
            f'label_replace(ceil({value} / {float(meta["threshold"])}), "trigger", "{i}", "", "")'
        )
    scale = f"clamp(max({' or '.join(per_trigger)}), 1, {int(spec['maxReplicaCount'])})"
    return f"({scale} and on () ({' or '.join(active)})) or on () vector(0)"


def counter(rates_per_min: list[float]) -> str:
    """promtool values of a counter that grows by ``rates_per_min[m]`` in minute m."""
    total, out = 0.0, ["0"]
    for inc in rates_per_min:
        total += inc
        out.append(f"{total:g}")
    return " ".join(out)


def gauge(points: list[float | None]) -> str:
    """promtool values, ``stale`` where the series is gone (its pod deleted or never created)."""
    return " ".join("stale" if p is None else f"{p:g}" for p in points)


def timeline() -> list[dict[str, str]]:
    """0-10 min: nothing; 10-20: 1 req/s at the ingress, no replica yet (no DCGM or vLLM series);
    20-40: 10 req/s, two replicas at 100 % GPU, 30 queued requests; 40-80: no traffic, replicas gone."""
    minutes = range(MINUTES + 1)
    busy = [20 <= m < 40 for m in minutes]
    requests = [0.0 if m < 10 else 60.0 if m < 20 else 600.0 if m < 40 else 0.0 for m in range(MINUTES)]
    ingress = 'nginx_ingress_controller_requests{exported_namespace="llm-serving",ingress="vllm-llama3-8b",namespace="ingress-nginx",status="200",method="POST"}'
    series = [{"series": ingress, "values": counter(requests)}]
    for pod, gpu in (("vllm-llama3-8b-6d9f7-abcde", "0"), ("vllm-llama3-8b-6d9f7-fghij", "1")):
        dcgm = f'DCGM_FI_DEV_GPU_UTIL{{exported_namespace="llm-serving",exported_pod="{pod}",gpu="{gpu}",namespace="gpu-operator"}}'
        series.append({"series": dcgm, "values": gauge([100.0 if b else None for b in busy])})
        queue = f'vllm:num_requests_waiting{{namespace="llm-serving",pod="{pod}"}}'
        series.append({"series": queue, "values": gauge([15.0 if b else None for b in busy])})
    return series


def test_scaled_object_is_valid_for_keda(tmp_path: Path) -> None:
    obj = scaled_object(tmp_path)
    assert crd_errors(obj) == []
    assert obj["spec"]["maxReplicaCount"] > 2


def test_wakes_from_zero_scales_past_two_and_returns_to_zero(tmp_path: Path) -> None:
    expr = desired_replicas(scaled_object(tmp_path))
    expected = {"5m": 0, "15m": 1, "30m": 5, "75m": 0}
    proc = promtool_unit_test(tmp_path, timeline(), samples=[(expr, t, n) for t, n in expected.items()])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_model_formula_reproduces_the_old_examples_faults(tmp_path: Path) -> None:
    """The control: the previous example's triggers (a wake-up metric only the replicas export, an `avg`
    of utilization) never wake from zero and never ask for more than 2 replicas."""
    old = {
        "spec": {
            "minReplicaCount": 0,
            "maxReplicaCount": 4,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "query": 'avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL{exported_namespace="llm-serving",exported_pod=~"vllm-llama3-8b-.*"}[5m]))',
                        "threshold": "60",
                        "activationThreshold": "5",
                    },
                },
                {
                    "type": "prometheus",
                    "metadata": {
                        "query": 'sum(vllm:num_requests_waiting{namespace="llm-serving"}) or vector(0)',
                        "threshold": "8",
                        "activationThreshold": "0",
                    },
                },
            ],
        }
    }
    series = [s for s in timeline() if "vllm:" not in s["series"]]  # utilization only: the avg cap
    expr = desired_replicas(old)
    proc = promtool_unit_test(tmp_path, series, samples=[(expr, "15m", 0), (expr, "30m", 2)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
