"""Scenarios: the demo cast read from its scenario file (``tests/fixtures/scenarios/demo.yaml``) and the
generated scale scenario."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from tests.support.examplegen.cast import (
    Device,
    Ids,
    Load,
    NodeCast,
    _daemonset_pods,
    _new_node,
    _pdb,
    _physical_devices,
    _system_pods,
    _workload_pod,
)
from tests.support.examplegen.sources import Json, Sources

_BUSY_HOLDER = ("activity_above_threshold", "fb_above_threshold", "power_above_idle", "idle_gpu_holder")

# ----------------------------------------------------------------------------------------------------------
# Demo scenario
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Scenario:
    """Everything a scenario produces before rendering."""

    nodes: list[NodeCast]
    pods: list[Json]
    pdbs: list[Json]
    groups: list[dict[str, Any]]
    notes: list[str]
    power_decimals: int
    nfd_labels: bool
    title: str


def _mng_group(name: str, itype: str, min_size: int, max_size: int, spot: bool = False) -> dict[str, Any]:
    return {"name": name, "itype": itype, "min": min_size, "max": max_size, "spot": spot}


def scenario_file(name: str) -> Path:
    """The scenario file of a file-described scenario (``tests/fixtures/scenarios/<name>.yaml``)."""
    return Path(__file__).resolve().parents[2] / "fixtures" / "scenarios" / f"{name}.yaml"


#: NodeCast attributes a scenario file may set on a node (everything else is drawn or derived).
_NODE_ATTRIBUTES = ("missing_gpus", "exporter_state", "spot", "mig", "hostname_is_pod", "verdict", "reasons")


def build_demo(src: Sources, ids: Ids, taken_at: datetime) -> Scenario:
    """The demo cast of ``tests/fixtures/scenarios/demo.yaml``: one node per behaviour the planner must get
    right (docs/architecture.md §3, BUG-01/02/04/05)."""
    return build_from_file(scenario_file("demo"), src, ids, taken_at)


def build_from_file(path: Path, src: Sources, ids: Ids, taken_at: datetime) -> Scenario:
    """Build the scenario a YAML file describes (its header comment documents the fields).

    Identifiers are drawn from ``ids`` in the file's order (node, its devices, its DaemonSet pods, its
    workloads; then the PDBs), so the same file and seed give the same snapshot byte for byte. ``{id}`` in a
    node's ``why`` or in ``notes`` becomes the generated name of the node with that ``id``.
    """
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    nodes: list[NodeCast] = []
    pods: list[Json] = []
    names: dict[str, str] = {}
    for entry in spec["nodes"]:
        node = _new_node(
            ids,
            taken_at,
            entry["type"],
            owner=entry["owner"],
            group=entry["group"],
            age=timedelta(days=entry["age_days"]),
            az=entry.get("az", "us-east-1a"),
            subnet=entry.get("subnet", 0),
        )
        if "id" in entry:
            names[entry["id"]] = node.name
        nodes.append(node)
        if entry.get("kind") == "system":
            pods.extend(_system_pods(ids, node, taken_at))
            continue
        gpus = entry.get("gpus")
        if gpus:
            model = src.models[gpus["model"]]
            node.devices = _physical_devices(
                ids, model, gpus["count"], real_uuids=gpus.get("real_uuids", False)
            )
        for key in _NODE_ATTRIBUTES:
            if key in entry:
                value = entry[key]
                setattr(node, key, tuple(value) if isinstance(value, list) else value)
        pods.extend(_daemonset_pods(ids, node, full=True))
        for workload in entry.get("workloads", []):
            _add_workload(ids, node, workload, taken_at)
        if "mig_scrape" in entry:
            _add_mig_scrape(src, ids, node, entry["mig_scrape"], taken_at)
        node.why = " ".join(entry.get("why", "").split())
    for node in nodes:
        if node.why:
            node.why = node.why.format_map(names)
    pdbs = [
        _pdb(
            ids,
            p["namespace"],
            p["name"],
            p["selector"],
            min_available=p.get("min_available"),
            max_unavailable=p.get("max_unavailable"),
            healthy=p["healthy"],
            allowed=p["allowed"],
        )
        for p in spec.get("pdbs", [])
    ]
    for node in nodes:
        pods.extend(node.workloads)
    groups = [
        _mng_group(g["name"], g["itype"], g["min"], g["max"], g.get("spot", False)) for g in spec["groups"]
    ]
    notes = [" ".join(note.split()).format_map(names) for note in spec.get("notes", [])]
    return Scenario(
        nodes, pods, pdbs, groups, notes, spec["power_decimals"], spec["nfd_labels"], spec["title"]
    )


def _add_workload(ids: Ids, node: NodeCast, workload: dict[str, Any], taken_at: datetime) -> None:
    args = {k: v for k, v in workload.items() if k not in ("generate_name", "started_ago", "load")}
    if "generate_name" in workload:
        args["name"] = ids.name(workload["generate_name"])
    pod = _workload_pod(ids, node, started=taken_at - timedelta(**workload["started_ago"]), **args)
    load = workload.get("load")
    if load is None:
        return
    attributed = (workload["namespace"], pod["metadata"]["name"], workload["container"])
    for index in load.get("devices", range(len(node.devices))):
        node.devices[index].load = Load(load["busy"], load["activity_pct"], load["fb_used_mib"], attributed)


def _add_mig_scrape(src: Sources, ids: Ids, node: NodeCast, mig: dict[str, Any], taken_at: datetime) -> None:
    """The pods and MIG devices of the real p4d MIG scrape (``Sources.mig_pods``, ``mig_layout``,
    ``mig_fb_used``) on ``node``; pod details come from the scenario's ``mig_scrape`` section."""
    for (_gpu, gi), (namespace, pod_name, container) in sorted(src.mig_pods.items()):
        slot = next(s for s in src.mig_layout if s.gi_id == gi)
        known = mig["pods"].get(pod_name, {})
        _workload_pod(
            ids,
            node,
            namespace=namespace,
            name=pod_name,
            app=known.get("app", pod_name.rsplit("-", 2)[0]),
            owner_kind=known.get("owner_kind", "ReplicaSet"),
            owner_api=known.get("owner_api", "apps/v1"),
            owner_name=known.get("owner_name", pod_name.rsplit("-", 1)[0]),
            container=container,
            image=mig["images"].get(namespace, mig["image"]),
            requests=known.get("requests", mig["default_requests"]),
            gpu_resource=f"nvidia.com/mig-{slot.profile}",
            gpus=1,
            started=taken_at - timedelta(**mig["started_ago"]),
        )
    model = src.models[mig["model"]]
    for gpu in range(mig["gpus"]):
        for slot in src.mig_layout:
            used = src.mig_fb_used.get((str(gpu), slot.gi_id), 0)
            attributed = src.mig_pods.get((str(gpu), slot.gi_id))
            busy = attributed is not None and attributed[1] == mig["busy_pod"]
            node.devices.append(
                Device(
                    gpu,
                    model.uuids[gpu],
                    model.pci_bus_ids[gpu],
                    slot.fb_total_mib,
                    Load(busy, mig["busy_activity_pct"] if busy else 0.0, used, attributed),
                    gi_id=slot.gi_id,
                    profile=slot.profile,
                    slices=slot.slices,
                )
            )


# ----------------------------------------------------------------------------------------------------------
# Scale scenario
# ----------------------------------------------------------------------------------------------------------


def build_scale(src: Sources, ids: Ids, taken_at: datetime, n_nodes: int) -> Scenario:
    """``n_nodes`` p4d.24xlarge (8× A100, MIG off) in managed node groups of ≤ 50: ~70 % idle, ~18 % busy,
    ~6 % underutilized, ~6 % unknown (frozen exporter, or exporter down for the last 12 minutes)."""
    a100 = src.models["a100"]
    rng = ids.rng
    nodes: list[NodeCast] = []
    pods: list[Json] = []
    groups: list[dict[str, Any]] = []
    group_size = 50
    for g in range((n_nodes + group_size - 1) // group_size):
        groups.append(_mng_group(f"gpu-p4d-{g:03d}", "p4d.24xlarge", 0, group_size + 10))
    for i in range(n_nodes):
        group = groups[i // group_size]["name"]
        age = timedelta(days=rng.randint(1, 60), seconds=rng.randint(0, 86_399))
        node = _new_node(
            ids,
            taken_at,
            "p4d.24xlarge",
            owner="mng",
            group=group,
            age=age,
            az=("us-east-1a", "us-east-1b", "us-east-1c")[i % 3],
            subnet=16 + (i % 16),
        )
        node.devices = _physical_devices(ids, a100, 8)
        pods.extend(_daemonset_pods(ids, node, full=False))
        roll = rng.random()
        if roll < 0.70:
            node.verdict, node.reasons = "idle", ("idle_window_clean",)
        elif roll < 0.88:
            node.verdict, node.reasons = "busy", (*_BUSY_HOLDER, "running_batch_pod")
            pod = _workload_pod(
                ids,
                node,
                namespace="training",
                app=f"llm-pretrain-{i:05d}",
                owner_kind="PyTorchJob",
                owner_api="kubeflow.org/v1",
                owner_name=f"llm-pretrain-{i:05d}",
                container="pytorch",
                name=f"llm-pretrain-{i:05d}-worker-0",
                image="nvcr.io/nvidia/pytorch:25.01-py3",
                requests={"cpu": "80", "memory": "900Gi"},
                gpu_resource="nvidia.com/gpu",
                gpus=8,
                started=taken_at - timedelta(hours=rng.randint(2, 40)),
            )
            # All 8 GPUs at ≥ 38 GiB: 8 × 38 GiB × 1.2 fits no cheaper catalog type, so busy, not underutilized.
            for dev in node.devices:
                dev.load = Load(
                    True,
                    rng.uniform(75, 92),
                    rng.randint(38_000, 39_800),
                    ("training", pod["metadata"]["name"], "pytorch"),
                )
        elif roll < 0.94:
            node.verdict, node.reasons = "underutilized", _BUSY_HOLDER
            pod = _workload_pod(
                ids,
                node,
                namespace="inference",
                app=f"embedder-{i:05d}",
                owner_kind="ReplicaSet",
                container="server",
                image="nvcr.io/nvidia/tritonserver:25.01",
                requests={"cpu": "2", "memory": "8Gi"},
                gpu_resource="nvidia.com/gpu",
                gpus=1,
                started=taken_at - timedelta(days=1),
            )
            node.devices[0].load = Load(
                True,
                rng.uniform(60, 80),
                rng.randint(9_000, 10_500),
                ("inference", pod["metadata"]["name"], "server"),
            )
        elif roll < 0.97:
            node.exporter_state = "frozen"
            node.verdict, node.reasons = "unknown", ("exporter_frozen",)
        else:
            node.exporter_state, node.down_seconds = "down", 720
            node.verdict, node.reasons = "unknown", ("coverage_below_min", "stale_metrics")
        nodes.append(node)
        pods.extend(node.workloads)
    # The planner chooses one idle node per run (default budget): highest price, fewest pods, oldest, name.
    idle = sorted((n for n in nodes if n.verdict == "idle"), key=lambda n: (n.created, n.name))
    for n in idle[1:]:
        n.verdict, n.reasons = "protected", ("disruption_budget_exhausted",)
    notes = [
        f"{n_nodes} p4d.24xlarge nodes × 8 A100 = {8 * n_nodes} devices per DCGM metric, "
        f"{len(groups)} managed node groups of ≤ {group_size}.",
        "Idle by metrics: ~70 %; under the default budget (1 node per run) only the oldest is `idle`, the "
        "rest are `protected` (disruption_budget_exhausted).",
        "Unknown: frozen exporters (flat energy), and exporters down for the last 12 minutes (up 0, series "
        "end, coverage 0.6, newest sample 12 min old).",
        "Power is rounded to 0.1 W to keep the files small.",
    ]
    return Scenario(nodes, pods, [], groups, notes, 1, False, "scale")
