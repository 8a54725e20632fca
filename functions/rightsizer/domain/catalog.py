"""The EC2 GPU instance catalog and the default idle power ceilings (packaged data, see CATALOG-PROVENANCE.md).

Parsing is pure: callers pass the CSV text (``load_catalog()`` reads the packaged copy through
``importlib.resources``, which is package data, not I/O on user input).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources

from rightsizer.domain.drivers import DriverMinimum, parse_driver_minimums
from rightsizer.domain.prices import PriceBook
from rightsizer.domain.quantity import parse_cpu_millis, parse_memory_mib

HOURS_PER_MONTH = 730.0


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One catalog row: an EC2 instance type with GPUs.

    Units: ``memory_gib`` GiB, ``gpu_memory_mib`` MiB per GPU, ``allocatable_cpu_m`` millicores,
    ``allocatable_memory_mib`` MiB (Karpenter's allocatable figures), ``local_nvme_gb`` GB,
    ``hourly_usd`` on-demand Linux USD per hour: the packaged us-east-1 price, or in a catalog with a region's
    prices applied (``Catalog.with_prices``) that region's price, None when unknown or not sold there.
    """

    name: str
    family: str
    arch: str
    vcpu: int
    memory_gib: float
    gpu_count: int
    gpu_manufacturer: str
    gpu_model: str
    gpu_memory_mib: int
    compute_capability: float | None
    local_nvme_gb: int
    allocatable_cpu_m: int | None
    allocatable_memory_mib: float | None
    hourly_usd: float | None


@dataclass(frozen=True, slots=True)
class GpuPerformance:
    """Published per-GPU figures of one GPU model (``gpu-models.csv``, sources in its ``source`` column).

    Units: ``tensor_tflops`` dense (no sparsity) BF16 tensor TFLOPS, FP16 where the model has no BF16,
    None when the vendor publishes no dense figure; ``memory_bandwidth_gbps`` GB/s; ``nvlink`` whether the
    model's multi-GPU instances connect their GPUs with NVLink/NVSwitch; ``mig`` Multi-Instance GPU support.
    """

    gpu_model: str
    gpu_memory_mib: int
    tensor_tflops: float | None
    memory_bandwidth_gbps: float | None
    nvlink: bool
    mig: bool
    source: str


@dataclass(frozen=True, slots=True)
class Catalog:
    """Instance types by name, idle power ceilings (W) by ``gpu_model``, GPU performance by model and memory,
    and the minimum NVIDIA driver per ``gpu_model`` (``gpu-drivers.csv``, the resize preflight).

    ``prices`` is the region's price book applied by :meth:`with_prices` (None: the packaged us-east-1
    prices); ``packaged_usd`` keeps the packaged price of every type a region's book re-priced.
    """

    types: dict[str, InstanceType]
    idle_power_w: dict[str, float]
    performance: dict[tuple[str, int], GpuPerformance] = field(default_factory=dict)
    driver_minimums: dict[str, DriverMinimum] = field(default_factory=dict)
    prices: PriceBook | None = None
    packaged_usd: Mapping[str, float] = field(default_factory=dict)

    def with_prices(self, book: PriceBook | None) -> Catalog:
        """This catalog priced for ``book``'s region.

        A book the Price List Query API answered replaces every row's ``hourly_usd`` by the region's price,
        None for a type the region does not sell on demand (so it is never recommended there); the packaged
        price stays in ``packaged_usd`` for a node of such a type that runs anyway. A book without API prices
        (denied, unreachable) changes no price and is only remembered, so reasons can say why.
        """
        if book is None:
            return self
        if not book.from_api:
            return replace(self, prices=book)
        packaged = {name: row.hourly_usd for name, row in self.types.items() if row.hourly_usd is not None}
        types = {
            name: replace(row, hourly_usd=book.usd_per_hour.get(name)) for name, row in self.types.items()
        }
        return replace(self, types=types, prices=book, packaged_usd=packaged)

    def on_demand_usd(self, name: str) -> float | None:
        """USD per hour of ``name`` on demand: the region's price, else the packaged us-east-1 one, else None."""
        row = self.types.get(name)
        if row is not None and row.hourly_usd is not None:
            return row.hourly_usd
        return self.packaged_usd.get(name)

    def get(self, name: str | None) -> InstanceType | None:
        """The catalog row for ``name`` (e.g. ``"g5.12xlarge"``), or None."""
        return self.types.get(name) if name else None

    def performance_of(self, row: InstanceType) -> GpuPerformance | None:
        """The published figures of ``row``'s GPU (model and memory size must both match), or None.

        Fractional-GPU types (``g6f``: an eighth of an L4) match no row: their share of the GPU is not
        a published figure, so they are never judged by throughput.
        """
        return self.performance.get((row.gpu_model, row.gpu_memory_mib))


def _opt_float(text: str) -> float | None:
    text = text.strip()
    return float(text) if text else None


def _opt_int(text: str) -> int:
    text = text.strip()
    return int(float(text)) if text else 0


def parse_catalog(csv_text: str) -> dict[str, InstanceType]:
    """Parse ``ec2-gpu-instances.csv`` text into instance types keyed by name."""
    rows: dict[str, InstanceType] = {}
    for row in csv.DictReader(io.StringIO(csv_text)):
        cpu = row.get("allocatable_cpu_karpenter", "").strip()
        mem = row.get("allocatable_memory_karpenter", "").strip()
        rows[row["instance_type"]] = InstanceType(
            name=row["instance_type"],
            family=row["family"],
            arch=row["arch"],
            vcpu=_opt_int(row["vcpu"]),
            memory_gib=float(row["memory_gib"] or 0),
            gpu_count=_opt_int(row["gpu_count"]),
            gpu_manufacturer=row["gpu_manufacturer"],
            gpu_model=row["gpu_model"],
            gpu_memory_mib=_opt_int(row["gpu_memory_mib_per_gpu"]),
            compute_capability=_opt_float(row["cuda_compute_capability"]),
            local_nvme_gb=_opt_int(row["local_nvme_gb"]),
            allocatable_cpu_m=parse_cpu_millis(cpu) if cpu else None,
            allocatable_memory_mib=parse_memory_mib(mem) if mem else None,
            hourly_usd=_opt_float(row["on_demand_usd_per_hour_us_east_1_linux"]),
        )
    return rows


def parse_idle_power(csv_text: str) -> dict[str, float]:
    """Parse ``idle_power.csv`` text into {gpu_model: ceiling in W}."""
    return {row["gpu_model"]: float(row["idle_power_max_w"]) for row in csv.DictReader(io.StringIO(csv_text))}


def _bool(text: str, column: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"gpu-models.csv: {column} must be true or false, not {text!r}")
    return value == "true"


def parse_gpu_models(csv_text: str) -> dict[tuple[str, int], GpuPerformance]:
    """Parse ``gpu-models.csv`` text into figures keyed by (``gpu_model``, MiB per GPU).

    Raises:
        ValueError: a non-numeric figure or a boolean column that is not ``true``/``false``.
    """
    out: dict[tuple[str, int], GpuPerformance] = {}
    for row in csv.DictReader(io.StringIO(csv_text)):
        memory = int(row["gpu_memory_mib_per_gpu"])
        out[(row["gpu_model"], memory)] = GpuPerformance(
            gpu_model=row["gpu_model"],
            gpu_memory_mib=memory,
            tensor_tflops=_opt_float(row["dense_bf16_tflops"]) or _opt_float(row["dense_fp16_tflops"]),
            memory_bandwidth_gbps=_opt_float(row["memory_bandwidth_gbps"]),
            nvlink=_bool(row["nvlink"], "nvlink"),
            mig=_bool(row["mig"], "mig"),
            source=row["source"],
        )
    return out


@cache
def load_catalog() -> Catalog:
    """The packaged catalog (``rightsizer/data``), parsed once per process."""
    data = resources.files("rightsizer") / "data"
    return Catalog(
        types=parse_catalog((data / "ec2-gpu-instances.csv").read_text(encoding="utf-8")),
        idle_power_w=parse_idle_power((data / "idle_power.csv").read_text(encoding="utf-8")),
        performance=parse_gpu_models((data / "gpu-models.csv").read_text(encoding="utf-8")),
        driver_minimums=parse_driver_minimums((data / "gpu-drivers.csv").read_text(encoding="utf-8")),
    )
