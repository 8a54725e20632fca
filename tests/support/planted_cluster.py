"""A planted GPU cluster on real servers, shared by the snapshot and handler tests.

Three g5.2xlarge nodes of node group ``gpu-a10g`` (``gpu-idle``, ``gpu-busy``, ``gpu-idle-2``) on the
Kubernetes API double, backed by the moto node group's instances, with workloads (a trainer whose env,
init container and last-applied annotation hold planted values) and a PDB; raw DCGM scrapes every 15 s
for one A10G per node in a real Prometheus; the kubeconfig and ``rightsizer.yaml`` that point the CLI at
them; and the CLI runs that snapshot the cluster and plan it from the snapshot and live.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from botocore.credentials import ReadOnlyCredentials

from rightsizer.adapters.eks_auth import EksTokenSource
from rightsizer.cli import main
from rightsizer.testing.k8s import KubernetesDouble
from rightsizer.testing.moto_eks import MotoServer
from tests.builders import AT, STEP, WINDOW, gpu_node, pdb, pod, rfc

if TYPE_CHECKING:
    from tests.support.prometheus_server import Sample

END = AT.timestamp()
JOB = "dcgm-exporter"
RAW_TIMES = [END - WINDOW - 900 + 7 + 15.0 * k for k in range(int((WINDOW + 900) / 15))]
NODES = {"gpu-idle": 0.0, "gpu-busy": 85.0, "gpu-idle-2": 0.0}  # node → GPU utilization %


def node_ip(index: int) -> str:
    return f"10.0.{index}.5"


def seed_cluster(double: KubernetesDouble, instance_ids: tuple[str, ...]) -> None:
    """Three g5.2xlarge nodes of node group gpu-a10g backed by the moto instances, with workloads."""
    for index, (name, instance_id) in enumerate(zip(NODES, instance_ids, strict=False)):
        double.add_node(
            gpu_node(
                name,
                instance_type="g5.2xlarge",
                gpus=1,
                instance_id=instance_id,
                ip=node_ip(index),
                created=AT - timedelta(days=3),
            )
        )
    secret_env = [
        {"name": "API_KEY", "value": "s3cr3t-value"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
    ]
    trainer = pod("trainer-0", "gpu-busy", namespace="ml", gpus=1, env=secret_env)
    trainer["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
    trainer["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = json.dumps(
        {"spec": {"containers": [{"env": [{"name": "API_KEY", "value": "s3cr3t-value"}]}]}}
    )
    trainer["spec"]["initContainers"] = [{"name": "init", "env": [{"name": "TOKEN", "value": "s3cr3t-init"}]}]
    double.add_pod(trainer)
    double.add_pod(pod("web-0", "gpu-idle", namespace="web"))
    double.add_pdb(pdb("trainer", "ml", {"app": "trainer"}, allowed=1))


def dcgm_families() -> dict[str, list[tuple[dict[str, str], list[Sample]]]]:
    """Raw DCGM scrapes every 15 s over W + 15 min before ``AT`` for one A10G per node, plus ``up``."""
    families: dict[str, list[tuple[dict[str, str], list[Sample]]]] = {}
    for index, (name, util) in enumerate(NODES.items()):
        base = {
            "gpu": "0",
            "UUID": f"GPU-{index:08d}-0000-0000-0000-000000000000",
            "modelName": "NVIDIA A10G",
            "Hostname": name,
            "instance": f"{node_ip(index)}:9400",
            "job": JOB,
        }

        # The busy GPU works 40 s of every minute and is quiet the 20 s around the minute: the scrape
        # just before every step point (at :52) is quiet, so reading one sample per step would call it
        # idle (issue 11). Every sample counts: it must read busy on every path.
        def busy(t: float, working: bool = util > 0) -> bool:
            return working and 10 <= t % 60 < 50

        values = {
            "DCGM_FI_DEV_GPU_UTIL": lambda t, u=util, b=busy: u if b(t) else 0.0,
            "DCGM_FI_DEV_FB_USED": lambda t, b=busy: 15000.0 if b(t) else 300.0,
            "DCGM_FI_DEV_FB_FREE": lambda t, b=busy: 7000.0 if b(t) else 21700.0,
            "DCGM_FI_DEV_POWER_USAGE": lambda t, b=busy: 180.0 if b(t) else 27.0,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda t: 9.8e10 + (t - RAW_TIMES[0]) * 27_000.0,
        }
        for metric, value in values.items():
            families.setdefault(metric, []).append((base, [(t, value(t)) for t in RAW_TIMES]))
        families.setdefault("up", []).append(
            ({"instance": f"{node_ip(index)}:9400", "job": JOB}, [(t, 1.0) for t in RAW_TIMES])
        )
    return families


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig at ``path`` whose current context ``double`` reaches ``server`` with the double's token."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: double\n"
        f"clusters:\n- name: double\n  cluster:\n    server: {server}\n"
        "users:\n- name: rightsizer\n  user:\n    token: local-test-token\n"
        "contexts:\n- name: double\n  context:\n    cluster: double\n    user: rightsizer\n",
        encoding="utf-8",
    )
    return path


def write_config(
    tmp_path: Path,
    double: KubernetesDouble,
    moto: MotoServer,
    prom_url: str,
    cluster: str,
    *,
    pricing_endpoint_url: str | None = None,
) -> Path:
    """The config of these tests; the Price List Query API at ``pricing_endpoint_url`` (a
    ``tests.support.pricing_double``), else off: moto, which runs in this process, prints to stdout for a
    service it lacks, and these tests read the CLI's stdout."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", double.base_url)
    config = tmp_path / "rightsizer.yaml"
    pricing = (
        f"  pricing_endpoint_url: {pricing_endpoint_url}\n"
        if pricing_endpoint_url
        else "  pricing_api: false\n"
    )
    config.write_text(
        f"cluster:\n  name: {cluster}\n  context: double\n  kubeconfig: {kubeconfig}\n"
        f"prometheus:\n  url: {prom_url}\n  step: {STEP}s\n  job: {JOB}\n"
        f"aws:\n  region: us-east-1\n  endpoint_url: {moto.endpoint_url}\n{pricing}",
        encoding="utf-8",
    )
    return config


def static_tokens() -> EksTokenSource:
    return EksTokenSource("c", "us-east-1", lambda: ReadOnlyCredentials("AKIDEXAMPLE", "secret", None))


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def snapshot_and_plans(
    config: Path, policy: Path, out: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[str, str]:
    """``rightsizer snapshot`` of the cluster into ``out``, then ``plan --snapshot`` and ``plan --config``,
    all at ``AT``; returns what the two plans printed (JSON documents). Each command must exit 0."""
    code, _, err = run(["snapshot", "--config", str(config), "--out", str(out), "--at", rfc(AT)], capsys)
    assert code == 0, err
    code, from_snapshot, err = run(
        ["plan", "--snapshot", str(out), "--policy", str(policy), "--at", rfc(AT), "--json"], capsys
    )
    assert code == 0, err
    code, live, err = run(
        ["plan", "--config", str(config), "--policy", str(policy), "--at", rfc(AT), "--json"], capsys
    )
    assert code == 0, err
    return from_snapshot, live
