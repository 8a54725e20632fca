"""Issue 14 item 3: a snapshot holds only what the decision reads, so planted secrets never reach it.

Secrets are planted wherever tokens and passwords live in real clusters — container ``command``/``args``,
init-container args, env values, probe HTTP headers, lifecycle hooks, pod and node annotations (with
``kubectl.kubernetes.io/last-applied-configuration``), labels nobody reads, volume sources, PDB, PVC and
PV metadata, DRA device configuration, Auto Scaling group and EC2 instance tags, and the labels an
exporter adds to DCGM series (pod labels, ``label_*``, a label whose very name is a secret, an unjoinable
series) — in a cluster on the Kubernetes double, moto and a real Prometheus. ``rightsizer snapshot`` must
write none of them (nor may either plan print them), while
``plan --snapshot`` on what it wrote still decides exactly like ``plan --config`` on the live objects, and
the labels/annotations that decide (do-not-disrupt, PDB selectors, a PersistentVolume's node affinity, the
policy's node selector) survive.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rightsizer.adapters.kubernetes import KubernetesCluster
from rightsizer.adapters.prometheus import PrometheusClient
from rightsizer.adapters.snapshot_dir import parse_resource_claims
from rightsizer.adapters.snapshot_projection import project_documents
from rightsizer.services.snapshot import ObserveRequest, metric_documents, observe
from rightsizer.testing.k8s import KubernetesDouble
from tests.builders import AT, STEP, WINDOW, gpu_node, pdb, pod, pv, pvc, rfc
from tests.support.planted_cluster import (
    NODES,
    dcgm_families,
    node_ip,
    run,
    snapshot_and_plans,
    static_tokens,
    write_config,
)

if TYPE_CHECKING:
    from rightsizer.adapters.aws import AwsClients
    from rightsizer.testing.moto_eks import BuiltCluster, MotoServer
    from tests.support.prometheus_server import PrometheusServer

pytest_plugins = ["tests.support.moto_fixtures", "tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

#: place → a secret only that place holds (label values must be valid label values).
PLACES = (
    "container-command",
    "container-args",
    "container-env",
    "init-args",
    "init-command",
    "init-env",
    "ephemeral-env",
    "liveness-header",
    "readiness-exec",
    "startup-header",
    "poststart-exec",
    "prestop-header",
    "pod-annotation",
    "pod-last-applied",
    "pod-label",
    "pod-status-message",
    "volume-csi-attribute",
    "volume-ephemeral-template",
    "volume-hostpath",
    "node-annotation",
    "node-last-applied",
    "node-label",
    "pdb-annotation",
    "pvc-annotation",
    "pv-csi-attribute",
    "pv-label",
    "asg-tag",
    "instance-tag",
    "series-pod-label",
    "series-label-value",
    "series-container",
    "unmapped-series-label",
)
SECRETS = {place: f"SECRET-{place}-k3y7x9" for place in PLACES}
#: A series label whose name is itself a secret (label names allow no dashes).
SECRET_LABEL_NAME = "SECRET_series_label_name_k3y7x9"
SECRETS["series-label-name"] = SECRET_LABEL_NAME
#: A label key only the policy's node_selector reads, one only a PV's node affinity reads.
TEAM, RACK = "example.com/team", "example.com/rack"


@pytest.fixture
def double() -> Iterator[KubernetesDouble]:
    with KubernetesDouble(seed=7, resource_api_versions=None) as d:
        yield d


def secret_families() -> dict[str, list[tuple[dict[str, str], list[Any]]]]:
    """``dcgm_families`` with what exporters add in real clusters: the workload pod's namespace, name,
    container and labels (dcgm-exporter's pod mapping, ``label_*`` from kube-state-metrics joins), a
    label named by a secret; and a series of an exporter nothing joins (``Hostname=localhost``)."""
    s = SECRETS
    families = dcgm_families()
    for metric, series in families.items():
        for labels, _ in series:
            labels[SECRET_LABEL_NAME] = "1"
            labels["label_ci_token"] = s["series-label-value"]
            if metric != "up" and labels["Hostname"] == "gpu-busy":
                labels.update(
                    namespace="ml",  # the trainer pod: read by the join (and agrees with the node)
                    pod="trainer-0",
                    container=s["series-container"],
                    label_example_com_ci_token=s["series-pod-label"],
                )
        if metric != "up":
            labels, samples = series[0]
            stray = {
                **{k: v for k, v in labels.items() if k in ("gpu", "modelName", "job")},
                "UUID": "GPU-stray",
                "Hostname": "localhost",
                "instance": "10.99.0.1:9400",
                "label_token": s["unmapped-series-label"],
            }
            series.append((stray, samples))
    return families


@pytest.fixture
def prometheus(prometheus_factory: Any) -> PrometheusServer:
    server: PrometheusServer = prometheus_factory(secret_families())
    return server


def _header(place: str) -> dict[str, Any]:
    return {
        "httpGet": {
            "path": "/healthz",
            "port": 8080,
            "httpHeaders": [{"name": "Authorization", "value": SECRETS[place]}],
        }
    }


def seed_secret_cluster(double: KubernetesDouble, instance_ids: tuple[str, ...]) -> None:
    """Three nodes as in test_snapshot_cli, with deciding labels/annotations and secrets everywhere."""
    s = SECRETS
    for index, (name, instance_id) in enumerate(zip(NODES, instance_ids, strict=False)):
        node = gpu_node(
            name,
            instance_type="g5.2xlarge",
            gpus=1,
            instance_id=instance_id,
            ip=node_ip(index),
            labels={TEAM: "ml", RACK: f"r{index}", "example.com/owner": s["node-label"]},
            annotations={
                "example.com/bootstrap-token": s["node-annotation"],
                "kubectl.kubernetes.io/last-applied-configuration": json.dumps(
                    {"metadata": {"annotations": {"token": s["node-last-applied"]}}}
                ),
                # Decides: the busy node is protected (reason do_not_disrupt:node must survive).
                **(
                    {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}
                    if name == "gpu-busy"
                    else {}
                ),
            },
        )
        double.add_node(node)
    trainer = pod(
        "trainer-0",
        "gpu-busy",
        namespace="ml",
        gpus=1,
        labels={"app": "trainer", "example.com/ci-token": s["pod-label"]},
        annotations={
            "example.com/db-password": s["pod-annotation"],
            "kubectl.kubernetes.io/last-applied-configuration": json.dumps(
                {"spec": {"containers": [{"env": [{"name": "API_KEY", "value": s["pod-last-applied"]}]}]}}
            ),
        },
        env=[
            {"name": "API_KEY", "value": s["container-env"]},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        ],
        volumes=[
            {
                "name": "creds",
                "csi": {
                    "driver": "secrets-store.csi.k8s.io",
                    "volumeAttributes": {"token": s["volume-csi-attribute"]},
                },
            },
            {
                "name": "scratch",
                "ephemeral": {
                    "volumeClaimTemplate": {
                        "metadata": {"annotations": {"token": s["volume-ephemeral-template"]}},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}},
                        },
                    }
                },
            },
            {"name": "host", "hostPath": {"path": f"/var/lib/{s['volume-hostpath']}"}},
        ],
    )
    main = trainer["spec"]["containers"][0]
    main["command"] = ["python", "train.py", f"--token={s['container-command']}"]
    main["args"] = ["--password", s["container-args"]]
    main["livenessProbe"] = _header("liveness-header")
    main["readinessProbe"] = {"exec": {"command": ["check", s["readiness-exec"]]}}
    main["startupProbe"] = _header("startup-header")
    main["lifecycle"] = {
        "postStart": {"exec": {"command": ["sh", "-c", f"login {s['poststart-exec']}"]}},
        "preStop": _header("prestop-header"),
    }
    trainer["spec"]["initContainers"] = [
        {
            "name": "init",
            "command": ["fetch", s["init-command"]],
            "args": [f"--secret={s['init-args']}"],
            "env": [{"name": "TOKEN", "value": s["init-env"]}],
        }
    ]
    trainer["spec"]["ephemeralContainers"] = [
        {"name": "debug", "image": "busybox", "env": [{"name": "T", "value": s["ephemeral-env"]}]}
    ]
    trainer["status"]["message"] = f"pulled with {s['pod-status-message']}"
    double.add_pod(trainer)
    # gpu-idle: a pod whose volume is reachable from this node only, through a label only the PV's node
    # affinity reads (the node must stay protected by node-local data after projection).
    web = pod(
        "web-0",
        "gpu-idle",
        namespace="web",
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "web-data"}}],
        annotations={"karpenter.sh/do-not-disrupt": "true"},  # decides too: the pod blocks the node
    )
    double.add_pod(web)
    claim = pvc("web-data", "pv-web", namespace="web")
    claim["metadata"]["annotations"] = {"example.com/key": s["pvc-annotation"]}
    double.add_pvc(claim)
    volume = pv("pv-web", affinity={RACK: ["r0"]})
    volume["spec"]["csi"]["volumeAttributes"] = {"password": s["pv-csi-attribute"]}
    volume["metadata"]["labels"] = {"example.com/owner": s["pv-label"]}
    double.add_pv(volume)
    budget = pdb("trainer", "ml", {"app": "trainer"}, allowed=1)
    budget["metadata"]["annotations"] = {"example.com/note": s["pdb-annotation"]}
    double.add_pdb(budget)


def tag_aws(clients: AwsClients, cluster: BuiltCluster) -> None:
    group = cluster.nodegroups["gpu-a10g"]
    clients.autoscaling.create_or_update_tags(
        Tags=[
            {
                "ResourceId": group.asg_name,
                "ResourceType": "auto-scaling-group",
                "Key": "example.com/api-key",
                "Value": SECRETS["asg-tag"],
                "PropagateAtLaunch": False,
            }
        ]
    )
    clients.ec2.create_tags(
        Resources=list(group.instance_ids),
        Tags=[{"Key": "example.com/api-key", "Value": SECRETS["instance-tag"]}],
    )


def leaked(directory: Path) -> dict[str, list[str]]:
    """place → the files that hold its secret."""
    found: dict[str, list[str]] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            for place, secret in SECRETS.items():
                if secret in text:
                    found.setdefault(place, []).append(path.relative_to(directory).as_posix())
    return found


def test_no_planted_secret_reaches_the_snapshot_and_the_decision_is_unchanged(
    tmp_path: Path,
    double: KubernetesDouble,
    moto_server: MotoServer,
    aws_clients: AwsClients,
    gpu_cluster: BuiltCluster,
    prometheus: PrometheusServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN a cluster with secrets in every place above, on the double, moto and a real Prometheus
    seed_secret_cluster(double, gpu_cluster.nodegroups["gpu-a10g"].instance_ids)
    tag_aws(aws_clients, gpu_cluster)
    config = write_config(tmp_path, double, moto_server, prometheus.url, gpu_cluster.cluster)
    with config.open("a", encoding="utf-8") as fh:
        fh.write(f"policy:\n  node_selector:\n    {TEAM}: ml\n  cooldown: 0s\n  max_nodes_per_run: 10\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"node_selector:\n  {TEAM}: ml\nmax_nodes_per_run: 10\nmax_nodes_per_node_group: 10\ncooldown: 0s\n",
        encoding="utf-8",
    )
    out = tmp_path / "snap"
    raw = tmp_path / "raw"

    # WHEN the cluster is snapshotted, then planned from the snapshot and live at the same instant
    from_snapshot, live = snapshot_and_plans(config, policy, out, capsys)

    # THEN no secret is in any written file, nor in what either plan printed
    assert leaked(out) == {}
    assert [p for p, secret in SECRETS.items() if secret in from_snapshot + live] == []

    # AND every secret was really there to leak: the unprojected observation of the same cluster holds each
    reader = KubernetesCluster.for_eks(double.base_url, static_tokens())
    unprojected = dict(observe(reader, None, None, _request()).documents)
    with PrometheusClient(prometheus.url) as client:
        for name, document in metric_documents(client, _request()).items():
            unprojected[name.replace("/", "_")] = document
    raw.mkdir()
    for name, document in unprojected.items():
        (raw / name).write_text(json.dumps(document), encoding="utf-8")
    aws = aws_clients.autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]
    instances = aws_clients.ec2.describe_instances()["Reservations"]
    (raw / "aws.json").write_text(json.dumps({"asgs": aws, "ec2": instances}, default=str), encoding="utf-8")
    assert set(leaked(raw)) == set(SECRETS)

    # AND plan --snapshot reproduces the live decision, verdicts and reasons included
    snap_doc, live_doc = json.loads(from_snapshot), json.loads(live)
    assert snap_doc == live_doc
    rows = {n["node"]: n for n in live_doc["nodes"]}
    assert set(rows) == set(NODES)  # the policy's node selector (TEAM) still selects every node
    assert "do_not_disrupt:node" in rows["gpu-busy"]["reasons"]  # node annotation scale-down-disabled
    assert "pdb_blocks:ml/trainer-0:trainer" in rows["gpu-busy"]["reasons"]  # pod label read by the PDB
    assert "do_not_disrupt:web/web-0" in rows["gpu-idle"]["reasons"]  # pod annotation karpenter.sh/...
    assert "local_storage:web/web-0" in rows["gpu-idle"]["reasons"]  # PV node affinity on RACK
    assert {r["node_group"] for r in rows.values()} == {"gpu-a10g"}  # node group via the ASG survives
    # the stray exporter is reported, with the labels the decision reads (join, device, scrape target)
    # and nothing else
    (stray,) = {json.dumps(u["labels"], sort_keys=True) for u in live_doc["unmapped"]}
    assert json.loads(stray) == {
        "Hostname": "localhost",
        "UUID": "GPU-stray",
        "gpu": "0",
        "instance": "10.99.0.1:9400",
        "job": "dcgm-exporter",
    }
    assert any(a["kind"] == "scale_in" and a["node"] == "gpu-idle-2" for a in live_doc["actions"])

    # AND the label keys kept because a selector compares them do decide: without them the plan changes
    without = {n["node"]: n for n in json.loads(_plan_without_node_label(out, RACK, policy, capsys))["nodes"]}
    assert "local_storage:web/web-0" not in without["gpu-idle"]["reasons"]
    unselected = json.loads(_plan_without_node_label(out, TEAM, policy, capsys))["nodes"]
    assert {n["verdict"] for n in unselected} == {"excluded"}
    assert all("not_selected" in n["reasons"] for n in unselected)

    # AND the deciding keys are in the files, the others are not
    nodes = {n["metadata"]["name"]: n for n in json.loads((out / "nodes.json").read_text())["items"]}
    assert nodes["gpu-busy"]["metadata"]["annotations"] == {
        "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"
    }
    assert {TEAM, RACK, "node.kubernetes.io/instance-type"} <= set(nodes["gpu-idle"]["metadata"]["labels"])
    assert "kubernetes.io/hostname" not in nodes["gpu-idle"]["metadata"]["labels"]  # nothing reads it here
    pods = {p["metadata"]["name"]: p for p in json.loads((out / "pods.json").read_text())["items"]}
    assert pods["trainer-0"]["metadata"]["labels"] == {"app": "trainer"}  # the PDB selector's key only
    assert pods["trainer-0"]["metadata"]["annotations"] == {}
    assert pods["web-0"]["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    busy = [
        series["metric"]
        for series in json.loads((out / "metrics" / "DCGM_FI_DEV_GPU_UTIL.json").read_text())["data"][
            "result"
        ]
        if series["metric"].get("Hostname") == "gpu-busy"
    ]
    assert busy == [
        {
            "gpu": "0",
            "UUID": "GPU-00000001-0000-0000-0000-000000000000",
            "Hostname": "gpu-busy",
            "instance": f"{node_ip(1)}:9400",
            "job": "dcgm-exporter",
            "namespace": "ml",
            "pod": "trainer-0",
        }
    ]


def _plan_without_node_label(
    snapshot: Path, key: str, policy: Path, capsys: pytest.CaptureFixture[str]
) -> str:
    """The plan of a copy of ``snapshot`` whose nodes lack label ``key``."""
    copy = snapshot.parent / f"without-{key.replace('/', '_')}"
    shutil.copytree(snapshot, copy)
    nodes = json.loads((copy / "nodes.json").read_text())
    for node in nodes["items"]:
        node["metadata"]["labels"].pop(key)
    (copy / "nodes.json").write_text(json.dumps(nodes), encoding="utf-8")
    code, out, err = run(
        ["plan", "--snapshot", str(copy), "--policy", str(policy), "--at", rfc(AT), "--json"], capsys
    )
    assert code == 0, err
    return out


def _request() -> ObserveRequest:
    return ObserveRequest(at=AT, window_seconds=WINDOW, step_seconds=STEP, cluster="c", region="us-east-1")


def test_dra_objects_keep_their_allocation_and_lose_their_configuration(double: KubernetesDouble) -> None:
    # GIVEN DRA served, a claim allocated on gpu-0 through a slice, with opaque driver config and secrets
    double.set_resource_api_versions(["v1beta1"])
    double.add_node(gpu_node("gpu-0", instance_type="g5.2xlarge", gpus=1))
    secret = "SECRET-dra-config-k3y7x9"
    double.add_resource_slice(
        {
            "apiVersion": "resource.k8s.io/v1beta1",
            "kind": "ResourceSlice",
            "metadata": {"name": "gpu-0-slice", "annotations": {"token": secret}},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": "gpu-0",
                "pool": {"name": "gpu-0", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "basic": {"attributes": {"serial": {"string": secret}}}}],
            },
        }
    )
    double.add_resource_claim(
        {
            "apiVersion": "resource.k8s.io/v1beta1",
            "kind": "ResourceClaim",
            "metadata": {"name": "train", "namespace": "ml", "labels": {"token": secret}},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}],
                    "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"password": secret}}}],
                }
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-0", "device": "gpu-0"}
                        ],
                        "config": [
                            {
                                "source": "FromClaim",
                                "opaque": {"driver": "gpu.nvidia.com", "parameters": {"password": secret}},
                            }
                        ],
                    }
                },
                "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "u1"}],
            },
        }
    )
    reader = KubernetesCluster.for_eks(double.base_url, static_tokens())
    documents = observe(reader, None, None, _request()).documents
    assert secret in json.dumps(documents)

    # WHEN projected
    projected = project_documents(documents)

    # THEN no secret remains and the claims decode to the same nodes and pods
    assert secret not in json.dumps(projected)

    def claims(docs: dict[str, Any]) -> Any:
        return parse_resource_claims(
            docs["resourceclaims.json"]["items"], docs["resourceslices.json"]["items"]
        )

    assert claims(projected) == claims(documents)
    (claim,) = claims(projected)
    assert (claim.nodes, claim.reserved_for, claim.allocated) == (
        frozenset({"gpu-0"}),
        frozenset({"trainer-0"}),
        True,
    )
