"""Does the node's installed NVIDIA driver support the GPU of a resize's target type? (issue 17, preflight)

Pure: the caller passes the Node's labels and the packaged minimums (``gpu-drivers.csv``, parsed by
:func:`parse_driver_minimums`; sources in its ``source`` column and in CATALOG-PROVENANCE.md).

The installed driver comes from NVIDIA GPU Feature Discovery's Node labels (NVIDIA/k8s-device-plugin
``internal/lm/nvml.go`` @ 1b826acc6af3079d8923bac395c3124b8861a9a6, ``newVersionLabeler``; documented in
``docs/gpu-feature-discovery/README.md``): ``nvidia.com/cuda.driver-version.full`` (``"570.158.01"``),
``nvidia.com/cuda.driver-version.{major,minor,revision}``, and the deprecated
``nvidia.com/cuda.driver.{major,minor,rev}``. GFD splits the NVML driver version on ``.`` into 2 or 3
parts, so the revision may be empty.

Rule (:func:`driver_check`): a resize to the *same* GPU model needs nothing (the installed driver drives
that GPU now); to another NVIDIA model it needs the installed driver ≥ the model's minimum. An unknown
installed driver or an unknown minimum refuses unless the operator set ``resize_allow_unknown_driver``;
a known driver below the minimum always refuses. Non-NVIDIA targets are not checked here (a vendor change
is refused by the EC2 preflight's ``gpu_vendor_mismatch``).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DriverCheck",
    "DriverMinimum",
    "DriverVersion",
    "driver_check",
    "installed_driver",
    "parse_driver_minimums",
    "parse_driver_version",
]

GFD_FULL = "nvidia.com/cuda.driver-version.full"
GFD_PARTS = (
    "nvidia.com/cuda.driver-version.major",
    "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision",
)
GFD_DEPRECATED_PARTS = (
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
)
_VERSION = re.compile(r"^(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?$")


@dataclass(frozen=True, order=True, slots=True)
class DriverVersion:
    """An NVIDIA driver version ``major.minor[.revision]`` (revision 0 when absent), ordered numerically."""

    major: int
    minor: int
    revision: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}" + (f".{self.revision:02d}" if self.revision else "")


@dataclass(frozen=True, slots=True)
class DriverMinimum:
    """One ``gpu-drivers.csv`` row: the lowest Linux driver supporting ``gpu_model`` and why."""

    gpu_model: str
    min_driver: DriverVersion
    cuda_toolkit: str
    compute_capability: str
    source: str


@dataclass(frozen=True, slots=True)
class DriverCheck:
    """Outcome of :func:`driver_check`: ``ok``; ``code`` is a stable reason (``driver_too_old``,
    ``driver_version_unknown``, ``driver_minimum_unknown``, or for a pass ``same_gpu_model``,
    ``driver_supported``, ``not_nvidia``, ``unknown_driver_allowed``); ``detail`` is for people."""

    ok: bool
    code: str
    detail: str


def parse_driver_version(text: str) -> DriverVersion | None:
    """``"570.158.01"`` / ``"570.26"`` → :class:`DriverVersion`; None for anything else (never guessed)."""
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, rev = match.groups()
    return DriverVersion(int(major), int(minor), int(rev) if rev else 0)


def _from_parts(labels: Mapping[str, str], keys: tuple[str, str, str]) -> DriverVersion | None:
    major, minor, rev = (labels.get(k) for k in keys)
    if major is None or minor is None:
        return None
    return parse_driver_version(f"{major}.{minor}" + (f".{rev}" if rev else ""))


def installed_driver(labels: Mapping[str, str]) -> tuple[DriverVersion | None, str]:
    """The installed driver a Node's GFD labels report, and where it came from (or why it is unknown).

    Every GFD form present must parse and agree; labels that disagree (a stale label after a driver
    upgrade) or do not parse make the driver unknown rather than picking one.

    Returns:
        ``(version, source)``: ``source`` names the label(s) read, or ``"no GPU Feature Discovery driver
        labels"`` / ``"malformed …"`` / ``"conflicting …"`` with version None.
    """
    found: dict[str, DriverVersion | None] = {}
    if GFD_FULL in labels:
        found[GFD_FULL] = parse_driver_version(labels[GFD_FULL])
    for keys in (GFD_PARTS, GFD_DEPRECATED_PARTS):
        if keys[0] in labels or keys[1] in labels:
            found[keys[0].rsplit(".", 1)[0] + ".*"] = _from_parts(labels, keys)
    if not found:
        return None, "no GPU Feature Discovery driver labels"
    bad = sorted(name for name, version in found.items() if version is None)
    if bad:
        return None, "malformed " + ", ".join(bad)
    versions = {v for v in found.values() if v is not None}
    if len(versions) > 1:
        return None, "conflicting " + ", ".join(f"{k}={v}" for k, v in sorted(found.items()))
    (version,) = versions
    return version, ", ".join(sorted(found))


def driver_check(
    current_model: str | None,
    target_model: str,
    target_manufacturer: str,
    labels: Mapping[str, str],
    minimums: Mapping[str, DriverMinimum],
    *,
    allow_unknown: bool,
) -> DriverCheck:
    """Whether the node's installed driver supports the target type's GPU (see the module's rule).

    Args:
        current_model, target_model: catalog ``gpu_model`` of the current and target instance types
            (``current_model`` None when the current type is not in the catalog).
        target_manufacturer: catalog ``gpu_manufacturer`` of the target (``nvidia``, ``amd``).
        labels: the Node's ``metadata.labels``.
        minimums: ``gpu_model`` → minimum (``Catalog.driver_minimums``).
        allow_unknown: policy ``resize_allow_unknown_driver``.
    """
    if current_model is not None and current_model == target_model:
        return DriverCheck(
            True, "same_gpu_model", f"same GPU model ({target_model}): its driver drives it now"
        )
    if target_manufacturer.lower() != "nvidia":
        return DriverCheck(True, "not_nvidia", f"{target_model} is not an NVIDIA GPU")
    minimum = minimums.get(target_model)
    version, source = installed_driver(labels)
    if minimum is not None and version is not None:
        if version >= minimum.min_driver:
            return DriverCheck(
                True,
                "driver_supported",
                f"driver {version} ({source}) >= {minimum.min_driver} for {target_model}",
            )
        return DriverCheck(
            False,
            "driver_too_old",
            f"the AMI's driver {version} ({source}) is older than {minimum.min_driver}, the first driver "
            f"supporting {target_model} (CUDA {minimum.cuda_toolkit}, compute capability "
            f"{minimum.compute_capability}); use an AMI with a newer driver",
        )
    if minimum is None:
        code, detail = "driver_minimum_unknown", f"no minimum driver is known for {target_model}"
    else:
        code, detail = "driver_version_unknown", f"the installed driver is unknown ({source})"
    if allow_unknown:
        return DriverCheck(
            True, "unknown_driver_allowed", f"{detail}; allowed by resize_allow_unknown_driver"
        )
    return DriverCheck(
        False,
        code,
        f"{detail}: cannot tell whether the AMI drives {target_model}; run NVIDIA GPU Feature Discovery "
        "(labels nvidia.com/cuda.driver-version.*) or set resize_allow_unknown_driver: true to accept",
    )


def parse_driver_minimums(csv_text: str) -> dict[str, DriverMinimum]:
    """Parse ``gpu-drivers.csv`` text into minimums keyed by ``gpu_model``.

    Raises:
        ValueError: a ``min_driver`` that is not ``major.minor[.revision]``, or a model listed twice.
    """
    out: dict[str, DriverMinimum] = {}
    for row in csv.DictReader(io.StringIO(csv_text)):
        version = parse_driver_version(row["min_driver"])
        if version is None:
            raise ValueError(f"gpu-drivers.csv: min_driver {row['min_driver']!r} of {row['gpu_model']!r}")
        if row["gpu_model"] in out:
            raise ValueError(f"gpu-drivers.csv: {row['gpu_model']!r} listed twice")
        out[row["gpu_model"]] = DriverMinimum(
            row["gpu_model"], version, row["cuda_toolkit"], row["compute_capability"], row["source"]
        )
    return out
