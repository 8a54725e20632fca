"""The cluster package users install (``infra/k8s`` base + components, ``infra/overlays``), rendered with the
real ``kubectl kustomize``, and the files inside it.

Tests read what a user applies — the rendered output — never the component sources, so a broken overlay,
patch or replacement is seen.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.binaries import require_binary
from tests.support.crd_schema import KubeLoader

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "infra" / "k8s"
COMPONENTS = BASE / "components"
OVERLAYS = ROOT / "infra" / "overlays"
KUBE_PROMETHEUS_STACK = OVERLAYS / "kube-prometheus-stack"
PLAIN_PROMETHEUS = OVERLAYS / "plain-prometheus"
ALERT = "GPUNodeIdle"


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The documents ``kubectl kustomize <directory>`` renders; AssertionError with its stderr on failure."""
    kubectl = require_binary("kubectl")
    proc = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory}: {proc.stderr}"
    return [d for d in yaml.load_all(proc.stdout, Loader=KubeLoader) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one rendered document of ``kind``/``name``."""
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def plain_files() -> dict[str, str]:
    """File name -> content of every file the plain-Prometheus overlay ships in its ConfigMaps."""
    files: dict[str, str] = {}
    for doc in kustomize(PLAIN_PROMETHEUS):
        if doc["kind"] == "ConfigMap":
            files.update(doc["data"])
    return files


def alert_rule(groups: Mapping[str, Any]) -> dict[str, Any]:
    """The ``GPUNodeIdle`` rule of a rules file / PrometheusRule ``spec`` (``{"groups": [...]}``)."""
    [rule] = [r for g in groups["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    return dict(rule)


def rules_with_window(rules_text: str, idle_window: str) -> str:
    """The shipped rules file with the alert's ``for`` (the idle window, 30m as shipped) set to
    ``idle_window`` and the summary saying so; expressions and labels unchanged."""
    rules = yaml.safe_load(rules_text)
    alert = alert_rule(rules)
    assert alert["for"] == "30m", "the shipped rule's window changed: re-read this helper"
    rules_alert = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == ALERT)
    rules_alert["for"] = idle_window
    rules_alert["annotations"]["summary"] = alert["annotations"]["summary"].replace("30m", idle_window)
    return yaml.safe_dump(rules, sort_keys=False)
