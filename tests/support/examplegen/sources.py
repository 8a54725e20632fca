"""Sources of the example-snapshot generator: the copies in ``tests/fixtures/sources`` (real DCGM scrapes,
EKS node objects, the DescribeNodegroup shape) and the instance types the scenarios use."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

Json = dict[str, Any]

DEFAULT_TAKEN_AT = datetime(2026, 11, 2, 10, 0, 0, tzinfo=UTC)
SCENARIOS = ("demo", "scale")
CLUSTER = "demo-cluster"
REGION = "us-east-1"
ACCOUNT = "111122223333"
SCRAPE_INTERVAL_MS = 15_000
EXPORTER_NS = "gpu-operator"
EXPORTER_JOB = "nvidia-dcgm-exporter"
DCGM_METRICS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
)
METRIC_FILES = (*DCGM_METRICS, "up")
TIMESTAMP_METRIC = "DCGM_FI_DEV_GPU_UTIL"
# Kubernetes' random-suffix alphabet (k8s.io/apimachinery/pkg/util/rand): no vowels, no 0/1/3.
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


# ----------------------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------------------


def sources_dir() -> Path:
    """The copies of the shared fixtures the generator reads (``tests/fixtures/sources``)."""
    return Path(__file__).resolve().parents[2] / "fixtures" / "sources"


def _source_text(relative: str) -> str:
    node = sources_dir()
    for part in relative.split("/"):
        node = node / part
    return node.read_text(encoding="utf-8")


def _source_json(relative: str) -> Json:
    loaded: Json = json.loads(_source_text(relative))
    return loaded


_PROM_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\}\s+(\S+)$")
_PROM_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class PromSample:
    """One line of Prometheus text exposition: metric name, labels and value."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prom(text: str) -> list[PromSample]:
    """Parse Prometheus text exposition (comments and ``# HELP``/``# TYPE`` skipped) into samples."""
    samples = []
    for line in text.splitlines():
        match = _PROM_LINE.match(line.strip())
        if match is None:
            continue
        labels = dict(_PROM_LABEL.findall(match.group(2)))
        samples.append(PromSample(match.group(1), labels, float(match.group(3))))
    return samples


@dataclass(frozen=True)
class GpuModel:
    """What the generator needs to know about one GPU model, with where each fact comes from.

    ``fb_total_mib`` is DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE (MiB) of one physical GPU,
    ``idle_power_w`` the DCGM_FI_DEV_POWER_USAGE (W) of an idle GPU, ``max_power_w`` the board limit.
    """

    catalog_model: str
    model_name: str
    driver: str
    fb_total_mib: int
    idle_power_w: tuple[float, ...]
    max_power_w: float
    pci_bus_ids: tuple[str, ...]
    uuids: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class MigSlot:
    """One MIG instance as the reconstructed p4d scrape shows it (per physical GPU)."""

    profile: str
    gi_id: str
    fb_total_mib: int
    slices: int


@dataclass(frozen=True)
class Sources:
    """Facts read from the packaged scrapes and node objects."""

    models: dict[str, GpuModel]
    mig_layout: tuple[MigSlot, ...]
    mig_pods: dict[tuple[str, str], tuple[str, str, str]]
    mig_fb_used: dict[tuple[str, str], int]
    node_templates: dict[str, Json]
    nfd_cpu_labels: dict[str, str]
    nodegroup_template: Json


def _by_gpu(samples: Iterable[PromSample], name: str) -> dict[str, PromSample]:
    return {s.labels["gpu"]: s for s in samples if s.name == name and "GPU_I_ID" not in s.labels}


def load_sources() -> Sources:
    """Read every packaged source once and derive the per-model facts the scenarios use."""
    a10g = parse_prom(_source_text("dcgm/reconstructed/eks-g5.12xlarge-a10g.prom"))
    h100 = parse_prom(_source_text("dcgm/eks-p5.48xlarge-h100-gpu-operator.prom"))
    mig = parse_prom(_source_text("dcgm/reconstructed/eks-p4d.24xlarge-a100-mig-mixed.prom"))
    docs = parse_prom(_source_text("dcgm/a100-mig-1g.5gb-nvidia-docs.prom"))
    templates = {
        "g5": _source_json("k8s/eks-mng-g5.12xlarge-a10g.node.json"),
        "p4d": _source_json("k8s/eks-mng-p4d.24xlarge-a100-mig-mixed.node.json"),
        "p5": _source_json("k8s/eks-karpenter-p5.48xlarge-h100.node.json"),
    }
    gfd = _source_json("k8s/gfd-labels/h100-mig-disabled-single.node-labels.json")

    a10g_power = _by_gpu(a10g, "DCGM_FI_DEV_POWER_USAGE")
    a10g_util = _by_gpu(a10g, "DCGM_FI_DEV_GPU_UTIL")
    a10g_free = _by_gpu(a10g, "DCGM_FI_DEV_FB_FREE")
    a10g_used = _by_gpu(a10g, "DCGM_FI_DEV_FB_USED")
    # Idle = the GPUs the scrape shows at 0 % with no framebuffer held (gpu2, gpu3: P8 state).
    a10g_idle = tuple(
        a10g_power[g].value for g in sorted(a10g_power) if a10g_util[g].value == 0 and a10g_used[g].value == 0
    )
    a10g_first = a10g_power["0"].labels
    a10g_model = GpuModel(
        catalog_model="NVIDIA A10G",
        model_name=a10g_first["modelName"],
        driver=a10g_first["DCGM_FI_DRIVER_VERSION"],
        fb_total_mib=int(a10g_used["2"].value + a10g_free["2"].value),
        idle_power_w=a10g_idle,
        max_power_w=300.0,
        pci_bus_ids=tuple(a10g_power[g].labels["pci_bus_id"] for g in sorted(a10g_power)),
        uuids=tuple(a10g_power[g].labels["UUID"] for g in sorted(a10g_power)),
        source="dcgm/reconstructed/eks-g5.12xlarge-a10g.prom",
    )
    h100_power = _by_gpu(h100, "DCGM_FI_DEV_POWER_USAGE")
    h100_first = h100_power["0"].labels
    h100_model = GpuModel(
        catalog_model="NVIDIA H100",
        model_name=h100_first["modelName"],
        driver=h100_first["DCGM_FI_DRIVER_VERSION"],
        fb_total_mib=int(templates["p5"]["metadata"]["labels"]["nvidia.com/gpu.memory"]),
        # gpu0 carried a vLLM decode worker (113.6 W); gpus 1-7 are the real idle draw.
        idle_power_w=tuple(h100_power[g].value for g in sorted(h100_power) if g != "0"),
        max_power_w=700.0,
        pci_bus_ids=tuple(h100_power[g].labels["pci_bus_id"] for g in sorted(h100_power)),
        uuids=tuple(h100_power[g].labels["UUID"] for g in sorted(h100_power)),
        source="dcgm/eks-p5.48xlarge-h100-gpu-operator.prom",
    )
    mig_fb_free = [s for s in mig if s.name == "DCGM_FI_DEV_FB_FREE"]
    mig_fb_used = {
        (s.labels["gpu"], s.labels["GPU_I_ID"]): int(s.value) for s in mig if s.name == "DCGM_FI_DEV_FB_USED"
    }
    layout: list[MigSlot] = []
    for s in mig_fb_free:
        if s.labels["gpu"] != "0":
            continue
        gi = s.labels["GPU_I_ID"]
        profile = s.labels["GPU_I_PROFILE"]
        layout.append(MigSlot(profile, gi, int(s.value) + mig_fb_used[("0", gi)], int(profile[0])))
    mig_pods = {
        (s.labels["gpu"], s.labels["GPU_I_ID"]): (
            s.labels["namespace"],
            s.labels["pod"],
            s.labels["container"],
        )
        for s in mig_fb_free
        if "pod" in s.labels
    }
    per_gpu: dict[str, dict[str, str]] = {}
    for s in mig_fb_free:
        per_gpu.setdefault(s.labels["gpu"], s.labels)
    mig_first = per_gpu["0"]
    a100_model = GpuModel(
        catalog_model="NVIDIA A100",
        model_name=mig_first["modelName"],
        driver=mig_first["DCGM_FI_DRIVER_VERSION"],
        # FB_TOTAL 40960 MiB (node label nvidia.com/gpu.memory) minus the driver reservation DCGM leaves out.
        fb_total_mib=int(templates["p4d"]["metadata"]["labels"]["nvidia.com/gpu.memory"]) - 424,
        idle_power_w=(52.0,),
        max_power_w=400.0,
        pci_bus_ids=tuple(per_gpu[g]["pci_bus_id"] for g in sorted(per_gpu)),
        uuids=tuple(per_gpu[g]["UUID"] for g in sorted(per_gpu)),
        source="dcgm/reconstructed/eks-p4d.24xlarge-a100-mig-mixed.prom",
    )
    l4_model = GpuModel(
        catalog_model="NVIDIA L4",
        model_name="NVIDIA L4",
        driver=a10g_model.driver,
        fb_total_mib=a10g_model.fb_total_mib,
        idle_power_w=(16.2,),
        max_power_w=72.0,
        pci_bus_ids=("00000000:31:00.0",),
        uuids=(),
        source="derived from the A10G reconstruction (no L4 scrape in the sources)",
    )
    # The real A100 MIG scrape confirms the label layout used for MIG instances (GPU_I_PROFILE, GPU_I_ID on
    # the parent UUID) and that power/energy are per physical GPU; its values are not needed.
    assert any("GPU_I_ID" in s.labels for s in docs)
    nfd = {k: v for k, v in gfd.items() if k.startswith("feature.node.kubernetes.io/cpu-")}
    return Sources(
        models={"a10g": a10g_model, "h100": h100_model, "a100": a100_model, "l4": l4_model},
        mig_layout=tuple(layout),
        mig_pods=mig_pods,
        mig_fb_used=mig_fb_used,
        node_templates=templates,
        nfd_cpu_labels=nfd,
        nodegroup_template=_source_json("aws/eks-describe-nodegroup-gpu.constructed.json")["nodegroup"],
    )


@dataclass(frozen=True)
class InstanceType:
    """Catalog facts (ec2-gpu-instances.csv rows, us-east-1 Linux on-demand) for the types used here."""

    name: str
    vcpu: int
    memory_gib: int
    allocatable_cpu: str
    allocatable_memory_mi: int
    gpus: int
    model: str | None
    max_pods: int
    template: str
    usd_per_hour: float


INSTANCE_TYPES = {
    t.name: t
    for t in (
        InstanceType("g5.12xlarge", 48, 192, "47810m", 173400, 4, "a10g", 234, "g5", 5.672),
        InstanceType("g5.4xlarge", 16, 64, "15890m", 57691, 1, "a10g", 234, "g5", 1.624),
        InstanceType("g5.xlarge", 4, 16, "3920m", 14162, 1, "a10g", 58, "g5", 1.006),
        InstanceType("g6.xlarge", 4, 16, "3920m", 14162, 1, "l4", 58, "g5", 0.8048),
        InstanceType("p4d.24xlarge", 96, 1152, "95690m", 1082712, 8, "a100", 737, "p4d", 21.957642),
        InstanceType("p5.48xlarge", 192, 2048, "191450m", 1938410, 8, "h100", 100, "p5", 55.04),
        # Not a GPU type (no catalog row): the system node group's instances.
        InstanceType("m6i.xlarge", 4, 16, "3920m", 14162, 0, None, 58, "g5", 0.192),
    )
}

_GPU_LABELS = {
    "a10g": {"product": "NVIDIA-A10G", "family": "ampere", "major": "8", "minor": "6", "memory": "23028"},
    "l4": {"product": "NVIDIA-L4", "family": "ada-lovelace", "major": "8", "minor": "9", "memory": "23034"},
}
