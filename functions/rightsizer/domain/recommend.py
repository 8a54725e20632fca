"""Rightsizing and GPU-sharing recommendations (docs/architecture.md §3 "Recommendations").

For a busy node: the cheapest catalog type that serves the observed peak without slowing it down
(``domain.throughput``: same GPU model first; another model only when it covers the peak's compute and
memory bandwidth with headroom and keeps NVLink for multi-GPU pods); if none, a MIG profile
(A100, H100, H200) or time-slicing replicas that pack the active workloads onto fewer GPUs, with the
manifests to apply. For an idle node held by GPU pods: who holds it and how to scale it to zero. For an
idle standalone instance: stop it. Pure; prices are catalog on-demand USD per hour. Only an action the
rightsizer executes carries USD savings (``hourly_savings_usd``); a recommendation whose target is priced
carries its estimate (``estimated_hourly_savings_usd``), never counted in the plan's savings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rightsizer.domain.catalog import HOURS_PER_MONTH, Catalog, InstanceType
from rightsizer.domain.eligibility import Judged, ResizeFacts, resize_refusals
from rightsizer.domain.gpu import GpuAssessment
from rightsizer.domain.model import AsgInfo, Ec2Instance, Node
from rightsizer.domain.plan import Action, ActionKind, action_id
from rightsizer.domain.pods import PodClassification
from rightsizer.domain.policy import Policy
from rightsizer.domain.quantity import parse_cpu_millis, parse_memory_mib
from rightsizer.domain.throughput import Demand, cheapest_fit
from rightsizer.domain.verdicts import Verdict

MIB_PER_GB = 1e9 / 2**20  # MIG profile names count decimal GB

# NVIDIA MIG User Guide, "Supported MIG Profiles": (profile, compute slices of 7, instances per GPU).
MIG_PROFILES: dict[str, tuple[tuple[str, int, int], ...]] = {
    "A100-40": (("1g.5gb", 1, 7), ("2g.10gb", 2, 3), ("3g.20gb", 3, 2), ("4g.20gb", 4, 1), ("7g.40gb", 7, 1)),
    "A100-80": (
        ("1g.10gb", 1, 7),
        ("2g.20gb", 2, 3),
        ("3g.40gb", 3, 2),
        ("4g.40gb", 4, 1),
        ("7g.80gb", 7, 1),
    ),
    "H100": (
        ("1g.10gb", 1, 7),
        ("1g.20gb", 1, 4),
        ("2g.20gb", 2, 3),
        ("3g.40gb", 3, 2),
        ("4g.40gb", 4, 1),
        ("7g.80gb", 7, 1),
    ),
    "H200": (
        ("1g.18gb", 1, 7),
        ("1g.35gb", 1, 4),
        ("2g.35gb", 2, 3),
        ("3g.71gb", 3, 2),
        ("4g.71gb", 4, 1),
        ("7g.141gb", 7, 1),
    ),
}
MAX_TIME_SLICING_REPLICAS = 8


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A node's recommendation: whether a cheaper shape fits, and the action to show for ``for_verdicts``."""

    cheaper_fits: bool
    action: Action | None
    for_verdicts: frozenset[Verdict]
    #: The observed demand a cheaper instance type was found for (None for MIG, sharing, holders): the
    #: node group replacement combines its nodes' demands (``domain.replacement``).
    demand: Demand | None = None
    #: The executable ``resize_instance`` a standalone node would get, replacing ``action`` when the
    #: resize's eligibility refuses nothing (``domain.eligibility``, decided by the planner).
    proposal: Action | None = None


def _mig_family(row: InstanceType) -> str | None:
    model = row.gpu_model
    if "A100" in model:
        return "A100-80" if row.gpu_memory_mib >= 60000 else "A100-40"
    if "H100" in model:
        return "H100"
    if "H200" in model:
        return "H200"
    return None


def _profile_mib(profile: str) -> float:
    return float(profile.split(".", 1)[1].removesuffix("gb")) * MIB_PER_GB


def _pod_requests(pods: Sequence[PodClassification]) -> tuple[int, float, int]:
    """Summed CPU (millicores) and memory (MiB) requests of non-ignored pods, and the largest GPU request."""
    cpu = 0
    mem = 0.0
    gpus = 0
    for c in pods:
        if c.ignored is not None:
            continue
        gpus = max(gpus, c.pod.gpu_request())
        for container in c.pod.spec.containers:
            req = container.resources.requests
            if "cpu" in req:
                cpu += parse_cpu_millis(req["cpu"])
            if "memory" in req:
                mem += parse_memory_mib(req["memory"])
    return cpu, mem, gpus


def _action(
    kind: ActionKind,
    node: Node,
    group: AsgInfo | None,
    to: Any,
    from_: Any,
    reason: str,
    hourly: float | None,
    manifests: list[str] | None = None,
    *,
    slowdown_pct: float = 0.0,
    why_safe: str = "",
    estimated: float | None = None,
) -> Action:
    return Action(
        action_id=action_id(kind, node.name, to),
        kind=kind,
        node=node.name,
        node_group=group.display_name if group else None,
        instance_id=node.instance_id,
        from_=from_,
        to=to,
        reason=reason,
        hourly_savings_usd=hourly,
        monthly_savings_usd=None if hourly is None else hourly * HOURS_PER_MONTH,
        estimated_hourly_savings_usd=estimated,
        estimated_monthly_savings_usd=None if estimated is None else estimated * HOURS_PER_MONTH,
        manifests=manifests or [],
        expected_slowdown_pct=slowdown_pct,
        why_safe=why_safe,
    )


def _shape(
    instance_type: str | None = None,
    mig_profile: str | None = None,
    mig_instances: int | None = None,
    replicas: int | None = None,
) -> dict[str, Any]:
    return {
        "instance_type": instance_type,
        "mig_profile": mig_profile,
        "mig_instances": mig_instances,
        "time_slicing_replicas": replicas,
    }


def time_slicing_manifest(replicas: int) -> str:
    """NVIDIA device plugin time-slicing ConfigMap (GPU Operator ``devicePlugin.config``)."""
    return (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: time-slicing-config\n  namespace: gpu-operator\n"
        "data:\n  any: |-\n    version: v1\n    flags:\n      migStrategy: none\n    sharing:\n      timeSlicing:\n"
        f"        resources:\n        - name: nvidia.com/gpu\n          replicas: {replicas}\n"
        "# then: kubectl patch clusterpolicies.nvidia.com/cluster-policy --type merge -p "
        '\'{"spec":{"devicePlugin":{"config":{"name":"time-slicing-config","default":"any"}}}}\'\n'
    )


def mig_manifests(profile: str, node: str) -> list[str]:
    """A mig-parted config for the GPU Operator's MIG manager, the node label, and a DRA claim template."""
    config = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: custom-mig-config\n  namespace: gpu-operator\n"
        f"data:\n  config.yaml: |\n    version: v1\n    mig-configs:\n      all-{profile}:\n"
        f"        - devices: all\n          mig-enabled: true\n          mig-devices:\n"
        f'            "{profile}": {dict((p, n) for fam in MIG_PROFILES.values() for p, _, n in fam)[profile]}\n'
    )
    label = f"kubectl label node {node} nvidia.com/mig.config=all-{profile} --overwrite\n"
    dra = (
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata:\n"
        f"  name: mig-{profile.replace('.', '-')}\nspec:\n  spec:\n    devices:\n      requests:\n"
        "      - name: mig\n        exactly:\n          deviceClassName: mig.nvidia.com\n"
        f"          selectors:\n          - cel:\n              expression: \"device.attributes['gpu.nvidia.com'].profile"
        f" == '{profile}'\"\n"
    )
    return [config, label, dra]


def _freed(row: InstanceType, workloads: int, needed: int, hourly: float | None) -> str:
    cost = f"{hourly:g} USD/h" if hourly is not None else "an unpriced amount"
    return (
        f"; frees {workloads - needed} of {row.gpu_count} GPUs for other pods, but the instance keeps "
        f"costing {cost}: no USD is saved until packing frees whole instances"
    )


def _sharing(
    row: InstanceType, assessment: GpuAssessment, policy: Policy, hourly: float | None
) -> tuple[dict[str, Any], list[str], str, str] | None:
    """MIG profile or time-slicing replicas that put the active workloads on fewer GPUs.

    Returns ``(to, manifests, reason, why_safe)``. Freed GPUs are capacity, not savings: the instance is
    still paid for, so no USD figure is attached (issue 17 "Honest savings").
    """
    workloads = [
        d
        for d in assessment.devices
        if (d.activity_max_pct or 0) > policy.gpu_activity_max_pct
        or (d.fb_used_max_mib or 0) > policy.fb_used_max_mib
    ]
    if not workloads or row.gpu_count < 2 or any(d.is_mig for d in assessment.devices):
        return None
    peak_fb = max((d.fb_used_max_mib or 0.0) for d in workloads) * (1 + policy.fb_headroom)
    peak_act = max((d.activity_max_pct or 0.0) for d in workloads)
    family = _mig_family(row)
    if family is not None:
        for profile, slices, per in MIG_PROFILES[family]:
            if peak_fb <= _profile_mib(profile) and peak_act <= 100.0 * slices / 7:
                needed = math.ceil(len(workloads) / per)
                if needed >= len(workloads):
                    return None
                why = (
                    f"{len(workloads)} workloads each fit MIG {profile} (peak {peak_fb:.0f} MiB with headroom, "
                    f"{peak_act:.0f}% activity): {needed} GPU(s) instead of {len(workloads)}"
                )
                safe = (
                    f"a {profile} slice has {slices}/7 of the GPU's compute ({100.0 * slices / 7:.0f}% >= the "
                    f"{peak_act:.0f}% peak activity) and {_profile_mib(profile):.0f} MiB >= {peak_fb:.0f} MiB"
                )
                shape = _shape(mig_profile=profile, mig_instances=len(workloads))
                return shape, [], why + _freed(row, len(workloads), needed, hourly), safe
        return None
    if peak_act <= 0 or peak_fb <= 0:
        return None
    replicas = min(MAX_TIME_SLICING_REPLICAS, int(100.0 // peak_act), int(row.gpu_memory_mib // peak_fb))
    if replicas < 2:
        return None
    needed = math.ceil(len(workloads) / replicas)
    if needed >= len(workloads):
        return None
    why = (
        f"{len(workloads)} workloads peak at {peak_act:.0f}% activity and {peak_fb:.0f} MiB with headroom: "
        f"time-slicing x{replicas} serves them on {needed} GPU(s)"
    )
    safe = (
        f"{replicas} replicas x {peak_act:.0f}% peak activity <= 100% of one GPU and {replicas} x "
        f"{peak_fb:.0f} MiB <= {row.gpu_memory_mib} MiB (time-slicing isolates no memory: a replica that "
        "outgrows its share can starve the others)"
    )
    manifests = [time_slicing_manifest(replicas)]
    return _shape(replicas=replicas), manifests, why + _freed(row, len(workloads), needed, hourly), safe


def recommend_for_node(
    *,
    node: Node,
    row: InstanceType | None,
    assessment: GpuAssessment,
    pods: Sequence[PodClassification],
    group: AsgInfo | None,
    standalone: bool,
    hourly: float | None,
    policy: Policy,
    catalog: Catalog,
) -> Recommendation | None:
    """The recommendation for one GPU node, or None.

    Returns a ``Recommendation`` whose action applies when the final verdict is in ``for_verdicts``:
    ``underutilized`` (cheaper type / MIG / time-slicing), ``protected`` (idle GPU holders) or ``idle``
    (a standalone instance, which no Auto Scaling group can scale in).
    """
    holders = [c.gpu_holder for c in pods if c.gpu_holder is not None]
    if assessment.idle and holders and not policy.evict_idle_gpu_holders:
        names = ", ".join(h.pod for h in holders)
        reason = (
            f"GPU held but idle by {names}: scale the owner to zero when idle (KEDA ScaledObject on "
            f"DCGM_FI_DEV_GPU_UTIL, or kubectl scale --replicas=0), or set evict_idle_gpu_holders: true; "
            f"the node costs {hourly if hourly is not None else 'an unknown amount of'} USD/h"
        )
        return Recommendation(
            False,
            _action("recommend", node, group, _shape(), node.instance_type, reason, None),
            frozenset({"protected"}),
        )
    if assessment.idle and standalone:
        cost = f"{hourly:g} USD/h" if hourly is not None else "an unpriced amount"
        reason = (
            "idle standalone instance (not in an Auto Scaling group): drain it, then stop or terminate it; "
            f"it costs {cost} while running"
        )
        return Recommendation(
            False,
            _action("recommend", node, group, _shape(), node.instance_type, reason, None, estimated=hourly),
            frozenset({"idle"}),
        )
    if not assessment.busy or row is None or row.gpu_count == 0:
        return None
    cpu_m, mem_mib, pod_gpus = _pod_requests(pods)
    gpus = max(assessment.peak_active_devices, pod_gpus, 1)
    fb_peak = max((d.fb_used_max_mib or 0.0) for d in assessment.devices) if assessment.devices else 0.0
    demand = Demand(
        gpus=gpus,
        fb_per_gpu_mib=fb_peak * (1 + policy.fb_headroom),
        activity_pct=assessment.activity_max_pct,
        pod_gpus=pod_gpus,
        cpu_m=cpu_m,
        memory_mib=mem_mib,
        mig=any(d.is_mig for d in assessment.devices),
        headroom=policy.throughput_headroom,
    )
    fit = cheapest_fit(row, catalog, demand)
    if fit is not None and row.hourly_usd is not None and fit.row.hourly_usd is not None:
        target = fit.row
        saved = row.hourly_usd - fit.row.hourly_usd
        peak = (
            f"peak {gpus} GPU(s) busy at once, {fb_peak:.0f} MiB framebuffer (+{policy.fb_headroom:.0%} headroom), "
            f"pods request {cpu_m}m CPU / {mem_mib:.0f} MiB"
        )
        proposal = None
        if standalone:
            # Executable only when the resize's eligibility refuses nothing (the planner asks it on the
            # node's final verdict and reasons, ``domain.eligibility.resize_refusals``).
            proposal = _action(
                "resize_instance",
                node,
                group,
                target.name,
                row.name,
                f"{target.name} fits: {peak}",
                saved,
                slowdown_pct=fit.expected_slowdown_pct,
                why_safe=fit.why_safe,
            )
            how = ""
        elif group is not None and group.nodegroup:
            how = (
                f"; managed node group {group.nodegroup} cannot change its instance type in place: create a new "
                f"node group (e.g. {group.nodegroup}-{target.name.replace('.', '-')}) with the same labels and "
                "taints, wait until its GPUs are allocatable, drain the old nodes, scale the old group to 0, then "
                "delete it; or publish a new launch template version with the new type and UpdateNodegroupVersion"
            )
        elif group is not None:
            how = (
                f"; Auto Scaling group {group.name}: new launch template version with {target.name}, "
                "then an instance refresh"
            )
        else:
            how = "; the node's Auto Scaling group is not known"
        return Recommendation(
            True,
            _action(
                "recommend",
                node,
                group,
                _shape(instance_type=target.name),
                row.name,
                f"{target.name} fits: {peak}; would save {saved:.4g} USD/h once applied{how}",
                None,
                slowdown_pct=fit.expected_slowdown_pct,
                why_safe=fit.why_safe,
                estimated=saved,
            ),
            frozenset({"underutilized"}),
            demand,
            proposal,
        )
    sharing = _sharing(row, assessment, policy, hourly)
    if sharing is None:
        return None
    to, manifests, why, safe = sharing
    if to["mig_profile"]:
        manifests = mig_manifests(to["mig_profile"], node.name)
    return Recommendation(
        True,
        _action("recommend", node, group, to, row.name, why, None, manifests, why_safe=safe),
        frozenset({"underutilized"}),
    )


def resize_or_recommend(
    rec: Recommendation,
    node: Node,
    row: InstanceType | None,
    judged: Judged,
    instance: Ec2Instance | None,
    policy: Policy,
    catalog: Catalog,
    *,
    standalone: bool,
) -> Recommendation:
    """``rec`` with its executable ``resize_instance`` proposal as the action when the resize's eligibility
    (``domain.eligibility.resize_refusals``, the one the resize workflow's validate calls on fresh facts)
    refuses nothing on the node's final verdict and reasons; else ``rec`` whose ``recommend`` names the
    refusals (issue 25). ``instance`` is the node's EC2 instance (DescribeInstances: tags, state), if known.
    """
    proposal = rec.proposal
    assert proposal is not None and rec.action is not None
    facts = ResizeFacts(
        judged=judged,
        allow_resize=policy.allow_resize,
        in_group=not standalone,
        tags=instance.tags if instance is not None else {},
        state=instance.state if instance is not None else "unknown",
        current=row,
        current_type=node.instance_type or "",
        target_type=str(proposal.to),
        target=catalog.get(str(proposal.to)),
        labels=node.labels,
        driver_minimums=catalog.driver_minimums,
        allow_unknown_driver=policy.resize_allow_unknown_driver,
        allow_instance_store_loss=policy.resize_allow_instance_store_loss,
    )
    refused = resize_refusals(facts)
    if not refused:
        return replace(rec, action=proposal)
    why = "; ".join(r.reason for r in refused)
    text = f"{rec.action.reason}; standalone instance: the resize preflight would refuse it: {why}"
    return replace(rec, action=rec.action.model_copy(update={"reason": text}))
