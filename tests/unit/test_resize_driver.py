"""The resize preflight's driver check (issue 17): the node's installed NVIDIA driver, read from GPU Feature
Discovery's Node labels, against the packaged minimum of the target type's GPU model.

Tables run across every GPU model of the packaged catalog: a driver exactly at the minimum passes, one
revision below is refused (``driver_too_old``, whatever the override says), no labels refuse
(``driver_version_unknown``) unless ``resize_allow_unknown_driver``; a same-model resize needs nothing.
Label forms follow NVIDIA/k8s-device-plugin ``internal/lm/nvml.go`` @ 1b826acc6af3079d8923bac395c3124b8861a9a6.
"""

from __future__ import annotations

import pytest

from rightsizer.domain.catalog import load_catalog
from rightsizer.domain.drivers import (
    DriverMinimum,
    DriverVersion,
    driver_check,
    installed_driver,
    parse_driver_minimums,
    parse_driver_version,
)
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.policy import load_policy

CATALOG = load_catalog()
MINIMUMS = CATALOG.driver_minimums
NVIDIA_MODELS = sorted({r.gpu_model for r in CATALOG.types.values() if r.gpu_manufacturer == "nvidia"})


def gfd(version: str, *, form: str = "full") -> dict[str, str]:
    """The labels GFD sets for ``version`` (its ``newVersionLabeler``), in one of its three forms."""
    major, minor, *rest = version.split(".")
    rev = rest[0] if rest else ""
    if form == "full":
        return {"nvidia.com/cuda.driver-version.full": version}
    if form == "parts":
        return {
            "nvidia.com/cuda.driver-version.major": major,
            "nvidia.com/cuda.driver-version.minor": minor,
            "nvidia.com/cuda.driver-version.revision": rev,
        }
    return {"nvidia.com/cuda.driver.major": major, "nvidia.com/cuda.driver.minor": minor,
            "nvidia.com/cuda.driver.rev": rev}  # fmt: skip


def below(version: DriverVersion) -> str:
    """The highest version strictly below ``version`` that still looks like a driver."""
    if version.revision:
        return f"{version.major}.{version.minor}.{version.revision - 1:02d}"
    return f"{version.major}.{version.minor - 1}.99" if version.minor else f"{version.major - 1}.99.99"


def test_every_nvidia_gpu_model_of_the_catalog_has_a_sourced_minimum() -> None:
    assert NVIDIA_MODELS, "the catalog lists NVIDIA models"
    missing = [m for m in NVIDIA_MODELS if m not in MINIMUMS]
    assert missing == []
    for minimum in MINIMUMS.values():
        assert minimum.source and minimum.cuda_toolkit and minimum.compute_capability
        assert minimum.gpu_model in NVIDIA_MODELS, f"{minimum.gpu_model} is no catalog model"


@pytest.mark.parametrize("model", NVIDIA_MODELS)
@pytest.mark.parametrize("form", ["full", "parts", "deprecated"])
def test_a_driver_at_the_minimum_passes_and_one_below_is_refused(model: str, form: str) -> None:
    minimum = MINIMUMS[model].min_driver
    at = driver_check("other", model, "nvidia", gfd(str(minimum), form=form), MINIMUMS, allow_unknown=False)
    assert (at.ok, at.code) == (True, "driver_supported"), at.detail
    old = below(minimum)
    for allow in (False, True):  # the override never lets a known-too-old driver through
        refused = driver_check("other", model, "nvidia", gfd(old, form=form), MINIMUMS, allow_unknown=allow)
        assert (refused.ok, refused.code) == (False, "driver_too_old"), refused.detail
        assert str(parse_driver_version(old)) in refused.detail and str(minimum) in refused.detail


@pytest.mark.parametrize("model", NVIDIA_MODELS)
def test_an_unknown_driver_is_refused_unless_the_operator_allows_it(model: str) -> None:
    refused = driver_check("other", model, "nvidia", {}, MINIMUMS, allow_unknown=False)
    assert (refused.ok, refused.code) == (False, "driver_version_unknown")
    assert "resize_allow_unknown_driver" in refused.detail and "GPU Feature Discovery" in refused.detail
    allowed = driver_check("other", model, "nvidia", {}, MINIMUMS, allow_unknown=True)
    assert (allowed.ok, allowed.code) == (True, "unknown_driver_allowed")


@pytest.mark.parametrize("model", NVIDIA_MODELS)
def test_the_same_gpu_model_needs_no_driver_knowledge(model: str) -> None:
    check = driver_check(model, model, "nvidia", {}, MINIMUMS, allow_unknown=False)
    assert (check.ok, check.code) == (True, "same_gpu_model")


def test_every_cross_model_resize_the_catalog_allows_is_judged_by_the_target_minimum() -> None:
    # Every (current, target) pair of distinct NVIDIA models: the newest minimum of all passes everywhere,
    # a driver below the target's minimum fails exactly where it should.
    newest = max(m.min_driver for m in MINIMUMS.values())
    for current in NVIDIA_MODELS:
        for target in NVIDIA_MODELS:
            if current == target:
                continue
            ok = driver_check(current, target, "nvidia", gfd(str(newest)), MINIMUMS, allow_unknown=False)
            assert ok.ok, (current, target, ok.detail)
            old = driver_check(current, target, "nvidia", gfd("384.81"), MINIMUMS, allow_unknown=False)
            assert old.ok is (MINIMUMS[target].min_driver <= DriverVersion(384, 81)), (current, target)


def test_a_target_model_without_a_minimum_is_refused_unless_allowed() -> None:
    labels = gfd("580.105.08")
    refused = driver_check("NVIDIA A10G", "NVIDIA X999", "nvidia", labels, MINIMUMS, allow_unknown=False)
    assert (refused.ok, refused.code) == (False, "driver_minimum_unknown")
    allowed = driver_check("NVIDIA A10G", "NVIDIA X999", "nvidia", labels, MINIMUMS, allow_unknown=True)
    assert (allowed.ok, allowed.code) == (True, "unknown_driver_allowed")


def test_a_non_nvidia_target_is_left_to_the_vendor_check() -> None:
    check = driver_check(
        "AMD Radeon Pro V520", "AMD Radeon Pro V520", "amd", {}, MINIMUMS, allow_unknown=False
    )
    assert check.ok
    check = driver_check(None, "AMD Radeon Pro V520", "amd", {}, MINIMUMS, allow_unknown=False)
    assert (check.ok, check.code) == (True, "not_nvidia")


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (gfd("570.158.01"), DriverVersion(570, 158, 1)),
        (gfd("570.158.01", form="parts"), DriverVersion(570, 158, 1)),
        (gfd("455.23", form="deprecated"), DriverVersion(455, 23, 0)),  # GFD's empty revision
        (
            {**gfd("580.65.06"), **gfd("580.65.06", form="parts"), **gfd("580.65.06", form="deprecated")},
            DriverVersion(580, 65, 6),
        ),
        ({}, None),
        (gfd("570.x.01"), None),  # malformed: never guessed
        ({"nvidia.com/cuda.driver-version.full": ""}, None),
        ({**gfd("570.158.01"), **gfd("535.247.01", form="deprecated")}, None),  # stale label: conflicting
        ({"nvidia.com/cuda.driver-version.major": "570"}, None),  # no minor
        ({"nvidia.com/gpu.product": "NVIDIA-A10G"}, None),
    ],
)
def test_installed_driver_reads_the_gfd_labels(
    labels: dict[str, str], expected: DriverVersion | None
) -> None:
    version, source = installed_driver(labels)
    assert version == expected, source
    if expected is None:
        assert source.startswith(("no GPU Feature Discovery", "malformed", "conflicting"))


def test_a_conflicting_or_malformed_label_refuses_like_an_unknown_driver() -> None:
    labels = {**gfd("580.65.06"), **gfd("520.61.05", form="deprecated")}
    check = driver_check("NVIDIA A10G", "NVIDIA L4", "nvidia", labels, MINIMUMS, allow_unknown=False)
    assert (check.ok, check.code) == (False, "driver_version_unknown") and "conflicting" in check.detail


def test_driver_versions_compare_numerically() -> None:
    assert parse_driver_version("570.26") == DriverVersion(570, 26, 0)
    assert DriverVersion(455, 23, 4) > DriverVersion(455, 23, 0)
    assert DriverVersion(535, 104, 5) > DriverVersion(535, 86, 10)  # not text order
    assert str(DriverVersion(570, 158, 1)) == "570.158.01"


def test_the_minimums_table_is_validated() -> None:
    head = "gpu_model,min_driver,cuda_toolkit,compute_capability,source\n"
    with pytest.raises(ValueError, match="min_driver"):
        parse_driver_minimums(head + "NVIDIA L4,R520,11.8,8.9,x\n")
    with pytest.raises(ValueError, match="twice"):
        parse_driver_minimums(head + "NVIDIA L4,520.61.05,11.8,8.9,x\nNVIDIA L4,520.61.05,11.8,8.9,x\n")
    parsed = parse_driver_minimums(head + "NVIDIA L4,520.61.05,11.8,8.9,x\n")
    assert parsed == {"NVIDIA L4": DriverMinimum("NVIDIA L4", DriverVersion(520, 61, 5), "11.8", "8.9", "x")}


def test_the_override_is_a_validated_policy_key() -> None:
    assert load_policy({}).resize_allow_unknown_driver is False
    assert load_policy({"resize_allow_unknown_driver": True}).resize_allow_unknown_driver is True
    with pytest.raises(ConfigError) as truthy:
        load_policy({"resize_allow_unknown_driver": "yes"})
    assert "resize_allow_unknown_driver" in str(truthy.value)
    with pytest.raises(ConfigError) as typo:
        load_policy({"resize_allow_unknown_drivers": True})
    assert "resize_allow_unknown_drivers" in str(typo.value)
