"""The decision policy (docs/architecture.md §5 "Policy"): keys, units and defaults, validated with pydantic.

Durations accept ``"30s"``, ``"10m"``, ``"1h"``, ``"1h30m"`` or integer seconds and are stored as
integer seconds. Percentages are in percent (0-100). Unknown keys are rejected with the key's name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
)

from rightsizer.domain.periods import Period

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: No duration the product reads is longer (ten years): a bigger one is a typo, and past ~2.7e6 years
#: Python's ``timedelta`` overflows (issue 26: ``--for 99999999999999h`` crashed with a traceback).
MAX_DURATION_S = 3650 * 86400
#: A snooze keeps a node out of plans at most this long (the policy's ``approval_snooze`` and
#: ``rightsizer snooze --for`` alike).
MAX_SNOOZE_S = 30 * 86400


def parse_duration(value: object) -> int:
    """Parse a duration into whole seconds.

    Args:
        value: integer seconds, or a string such as ``"30s"``, ``"10m"``, ``"1h30m"`` (units ms, s, m, h,
            d; Prometheus style).

    Returns:
        The duration in seconds (int, 0 <= seconds <= ``MAX_DURATION_S``).

    Raises:
        ValueError: for negative numbers, booleans, strings that are not a duration, and durations over
            ``MAX_DURATION_S`` (ten years).
    """
    seconds = _parse_duration(value)
    if seconds > MAX_DURATION_S:
        raise ValueError(
            f"{value!r} is longer than {MAX_DURATION_S // 86400}d, the longest duration accepted"
        )
    return seconds


def _parse_duration(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '10m'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        pos = 0
        total = 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if text and pos == len(text):
            return math.ceil(total) if math.isfinite(total) else MAX_DURATION_S + 1
    raise ValueError(f"{value!r} is not a duration (use integer seconds or e.g. '30s', '10m', '1h')")


Seconds = Annotated[int, BeforeValidator(parse_duration)]
"""A duration in seconds, written as integer seconds or ``"10m"``-style text."""

DEFAULT_BATCH_OWNER_GROUPS = ("batch", "kubeflow.org", "ray.io", "jobset.x-k8s.io", "batch.volcano.sh")
DEFAULT_ALERT_NODE_LABELS = ("node", "Hostname", "hostname", "kubernetes_node")
_PERCENT_BUDGET = re.compile(r"^(\d+)%$")


def _budget(value: object) -> int | str:
    if isinstance(value, bool):
        raise ValueError("a node budget is an integer or 'N%'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a node budget cannot be negative")
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        match = _PERCENT_BUDGET.match(text)
        if match and 0 <= int(match.group(1)) <= 100:
            return f"{int(match.group(1))}%"
    raise ValueError(f"{value!r} is not a node budget (an integer or 'N%' with 0 <= N <= 100)")


NodeBudget = Annotated[int | str, BeforeValidator(_budget)]

#: Instance families kept warm by default (issue 28): p4d/p5-class capacity is often unavailable for
#: hours (InsufficientInstanceCapacity), so the last idle node of such a type costs more in unserved work
#: than it saves. A family key covers every size (``p5`` covers ``p5.48xlarge``; ``p6`` covers
#: ``p6-b200.48xlarge``), an instance type key only itself (``domain.capacity.warm_floor_of``).
DEFAULT_WARM_FLOOR: Mapping[str, int] = {"p4d": 1, "p4de": 1, "p5": 1, "p5e": 1, "p5en": 1, "p6": 1}


def _warm_floor(value: object) -> dict[str, int]:
    """The operator's ``warm_floor`` entries over the defaults (``{"p5": 0}`` turns one default off)."""
    if value is None:
        return dict(DEFAULT_WARM_FLOOR)
    if not isinstance(value, Mapping):
        raise ValueError("warm_floor is a map from instance type or family to a node count")
    merged = dict(DEFAULT_WARM_FLOOR)
    for key, count in value.items():
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"warm_floor key {key!r} is not an instance type or family")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"warm_floor[{key!r}] must be a whole number of nodes >= 0, got {count!r}")
        merged[key.strip()] = count
    return merged


WarmFloor = Annotated[dict[str, int], BeforeValidator(_warm_floor)]

Approval = Literal["none", "required"]
"""Whether a person must approve a drain before its cordon (``approval``, docs/architecture.md §4)."""
#: The longest approval wait (the drain state machine's timeout leaves room for it, wiring.settings).
MAX_APPROVAL_TIMEOUT_S = 86400


def _names(value: object) -> object:
    return [value] if isinstance(value, str) else value


class WorkloadPolicy(BaseModel):
    """Policy keys of workload scale-to-zero (``workloads:`` in the policy; docs/architecture.md §5).

    Durations in seconds (or ``"2h"``). Everything is decided and reported by default; nothing is scaled
    unless ``scale_to_zero`` is true and the policy is not a dry run.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    scale_to_zero: bool = Field(
        False, description="Propose and (outside a dry run) execute scale_workload actions."
    )
    idle_window: Seconds = Field(
        7200, gt=0, description="Seconds every GPU the workload's pods run on must be idle (default 2h)."
    )
    grace_period: Seconds = Field(
        900, ge=0, description="Seconds after a workload's (or its newest pod's) creation it is kept."
    )
    exclude_namespaces: Annotated[list[str], BeforeValidator(_names)] = Field(
        default_factory=lambda: ["kube-system"], description="Namespaces whose workloads are always kept."
    )
    allow_gitops: bool = Field(
        False,
        description="Scale workloads an Argo CD or Flux tracking label/annotation names (their self-heal "
        "must ignore replicas, e.g. Argo CD ignoreDifferences on /spec/replicas).",
    )
    allow_hpa: bool = Field(
        False, description="Scale HPA targets to 0 (an HPA stops scaling a target at 0 replicas)."
    )
    allow_keda: bool = Field(
        False, description='Pause KEDA ScaledObjects at 0 (autoscaling.keda.sh/paused-replicas: "0").'
    )


class Policy(BaseModel):
    """What counts as idle and what the rightsizer may do about it (docs/architecture.md §5, all keys optional).

    Frozen and strict about keys (``extra="forbid"``): a typo is an error naming the key.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dry_run: bool = Field(True, description="Validate and record what would be done; act on nothing.")
    idle_window: Seconds = Field(1800, gt=0, description="Seconds every GPU must stay idle (default 30m).")
    gpu_activity_max_pct: float = Field(
        5.0,
        ge=0,
        le=100,
        description="Activity ceiling in percent: max(100 x DCGM_FI_PROF_GR_ENGINE_ACTIVE, DCGM_FI_DEV_GPU_UTIL).",
    )
    fb_used_max_mib: float = Field(
        1024.0, ge=0, description="Framebuffer ceiling in MiB (DCGM_FI_DEV_FB_USED) per device."
    )
    idle_power_max_w: dict[str, float] = Field(
        default_factory=dict,
        description="Power ceiling in W per catalog gpu_model (DCGM_FI_DEV_POWER_USAGE); "
        "merged over the packaged table (data/idle_power.csv).",
    )
    min_coverage: float = Field(
        0.9, ge=0, le=1, description="Share of window steps that must hold a finite sample (0..1)."
    )
    max_sample_age: Seconds | None = Field(
        None,
        ge=0,
        description="Newest raw sample may be at most this old (s); default: two measured scrape "
        "intervals plus one query step, at most 300 s (300 s when the interval is not measured).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Only nodes carrying all these labels are considered."
    )
    node_groups: list[str] = Field(
        default_factory=list, description="Only these node groups (EKS or ASG names); empty = all."
    )
    max_nodes_per_run: int = Field(1, ge=0, description="Nodes in flight per cluster at any moment.")
    max_nodes_per_node_group: NodeBudget = Field(
        1, description="Nodes in flight per node group: an integer or 'N%' of DesiredCapacity, rounded up."
    )
    cooldown: Seconds = Field(600, ge=0, description="Seconds after a node group's last scale-up.")
    disruption_windows: list[Period] = Field(
        default_factory=list,
        description="Periods when disruption is allowed (docs/architecture.md §4); empty = always.",
    )
    drain_timeout: Seconds = Field(600, gt=0, description="Seconds from cordon to a drained node.")
    skip_wait_for_delete_timeout: Seconds = Field(
        60,
        ge=0,
        description="A pod still terminating this many seconds after its deletionTimestamp (the end of its "
        "grace period: a finalizer, a NotReady kubelet) is no longer waited for (kubectl drain "
        "--skip-wait-for-delete-timeout; Cluster Autoscaler skips long-terminating pods); 0 waits until "
        "drain_timeout.",
    )
    max_decision_age: Seconds = Field(
        300, ge=0, description="Re-read metrics when the decision is older (s)."
    )
    allow_bare_pods: bool = Field(False, description="Evict pods that no controller owns (they are lost).")
    delete_emptydir_data: bool = Field(False, description="Evict pods with emptyDir volumes (data lost).")
    evict_node_local_data: bool = Field(
        False,
        description="Evict pods whose data lives on the node: hostPath, generic ephemeral volumes, local or "
        "node-pinned PersistentVolumes (data lost, or the pod stays Pending).",
    )
    evict_system_pods: bool = Field(
        False, description="Evict non-DaemonSet kube-system pods without a PodDisruptionBudget."
    )
    evict_running_jobs: bool = Field(False, description="Evict running pods owned by batch controllers.")
    replicated_owner_groups: list[str] = Field(
        default_factory=list,
        description="API groups of custom controllers that recreate their pods (e.g. apps.kruise.io); a "
        "pod owned by any other unknown kind counts as a bare pod.",
    )
    batch_owner_groups: list[str] = Field(
        default_factory=lambda: list(DEFAULT_BATCH_OWNER_GROUPS),
        description="API groups whose owners count as batch work (Job, PyTorchJob, RayJob, ...).",
    )
    evict_idle_gpu_holders: bool = Field(
        False, description="Evict pods that hold a GPU but leave it idle (notebooks, idle servers)."
    )
    workloads: WorkloadPolicy = Field(
        default_factory=WorkloadPolicy,
        description="Workload scale-to-zero: idle window, grace period, exclusions and opt-ins.",
    )
    showback_team_label: str = Field(
        "team",
        min_length=1,
        description="Pod label whose value names the team that idle GPU-hours and USD are shown back to "
        '(docs/architecture.md §3 "Showback"); pods without it count under (none).',
    )
    fb_headroom: float = Field(
        0.2, ge=0, le=10, description="Framebuffer headroom for recommendations (ratio)."
    )
    throughput_headroom: float = Field(
        0.2,
        ge=0,
        le=10,
        description="Compute and memory-bandwidth headroom (ratio) a different GPU model must leave over "
        "a busy node's observed peak.",
    )
    consolidation: Literal["off", "idle_holders", "all"] = Field(
        "off",
        description="Empty partly-used GPU nodes onto fewer (issue 29, docs/consolidation.md): off; "
        "idle_holders (a pod moves only if its node's GPUs were idle the whole window, CPU-only pods "
        "always); all (any pod the drain may evict, placed by its requests).",
    )
    consolidation_max_candidates: int = Field(
        100,
        ge=1,
        le=1000,
        description="Nodes a plan simulates emptying, least measured GPU use first (a bound on its work).",
    )
    allow_resize: bool = Field(False, description="Resize opted-in standalone instances in place.")
    resize_timeout: Seconds = Field(
        1800,
        gt=0,
        description="Seconds from stopping an instance to resize it until its Node must be Ready with the "
        "new type's GPUs; past it the original type is restored.",
    )
    resize_allow_instance_store_loss: bool = Field(
        False, description="Allow resizing instance-store types (their local NVMe data is lost on stop)."
    )
    # Strict: an override that weakens a safety check must be a real boolean, not a truthy string.
    resize_allow_unknown_driver: StrictBool = Field(
        False,
        description="Resize to another GPU model even when the node's installed NVIDIA driver (GPU Feature "
        "Discovery labels) or the target GPU's minimum driver is unknown. A known driver older than the "
        "target's minimum is refused whatever this says.",
    )
    allow_replace_node_group: bool = Field(
        False,
        description="Replace opted-in managed node groups (tag rightsizer.io/enabled=true) with a node group "
        'of the recommended instance type (docs/architecture.md §4 "Node group replacement").',
    )
    replace_ready_timeout: Seconds = Field(
        1800,
        gt=0,
        le=3600,
        description="Seconds from creating the replacement node group until it must be ACTIVE with every "
        "node Ready and the new type's GPUs allocatable; past it the replacement rolls back.",
    )
    replace_delete_old_after: Seconds | None = Field(
        None,
        ge=0,
        le=1800,
        description="Delete the old node group this many seconds after its last instance left; null keeps it "
        "at size 0 (the default).",
    )
    replace_settle: Seconds | None = Field(
        None,
        ge=0,
        le=7 * 24 * 3600,
        description="Seconds after a node group replacement finished (its old group's last instance left) "
        "during which the new group's nodes stay protected (replacement_settling) from scale-in, resize, "
        "another replacement and drains; null = idle_window + cooldown: a whole idle window of evidence "
        "taken after the pods moved, plus the scale-down delay after a scale-up (Cluster Autoscaler's "
        "scale-down-delay-after-add, Karpenter's consolidateAfter).",
    )
    release_reserved_capacity: StrictBool = Field(
        False,
        description="Allow scale-in, resize, replacement and consolidation of nodes whose instance runs in an "
        "On-Demand Capacity Reservation or a Capacity Block (DescribeInstances CapacityReservationId, "
        "InstanceLifecycle=capacity-block, Karpenter capacity-type reserved). The reservation is paid for "
        "whether it runs or not: removal saves nothing and frees the slot for any matching launch.",
    )
    warm_floor: WarmFloor = Field(
        default_factory=lambda: dict(DEFAULT_WARM_FLOOR),
        description="Nodes of an instance type (or family) a node group keeps through scale-in, off-hours "
        "and consolidation. Entries merge over the default of 1 for p4d, p4de, p5, p5e, p5en and p6 (0 "
        "turns one off); recent InsufficientInstanceCapacity evidence raises a type's floor by one.",
    )
    alert_node_labels: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ALERT_NODE_LABELS),
        description="Alert labels that may carry the node name, first present wins.",
    )
    restore_deadline: Seconds = Field(1800, gt=0, description="Off-hours restore alarm after this many s.")
    unserved_gpu_minute_usd: float = Field(
        0.10,
        ge=0,
        description="The operator's price (USD) of one GPU-minute of work that waited for a removed node "
        "to come back: `backtest --sweep idle_window=...` and the recommended window weigh billed "
        "savings against unserved GPU-minutes at this price; warm pools are recommended against it.",
    )
    allow_warm_pool: bool = Field(
        False,
        description="Let `apply` set the recommended warmPoolConfig on managed node groups that off-hours "
        "takes down (EKS UpdateNodegroupConfig).",
    )
    drain_failure_backoff: Seconds = Field(
        1800,
        ge=0,
        description="Seconds the assessment leaves a node alone after its drain failed or rolled back "
        "(Cluster Autoscaler's scale-down-delay-after-failure, per node).",
    )

    approval: Approval = Field(
        "none",
        description="'required': every drain waits for a person's approve/reject/snooze before its "
        "cordon (an approval request on the alarm topic; links on the webhook's Function URL).",
    )
    approval_node_groups: dict[str, Approval] = Field(
        default_factory=dict,
        description="Per node group (EKS or ASG name) override of 'approval'.",
    )
    approval_timeout: Seconds = Field(
        3600,
        gt=0,
        le=MAX_APPROVAL_TIMEOUT_S,
        description="Seconds a drain waits for its approval; unanswered, it is abandoned with nothing "
        "cordoned (at most 24h).",
    )
    approval_snooze: Seconds = Field(
        86400,
        gt=0,
        le=MAX_SNOOZE_S,
        description="How long the approval request's snooze link keeps the node out of plans (s).",
    )

    @field_validator("idle_power_max_w")
    @classmethod
    def _positive_ceilings(cls, value: dict[str, float]) -> dict[str, float]:
        for model, watts in value.items():
            if not watts > 0:
                raise ValueError(f"idle_power_max_w[{model!r}] must be > 0 W")
        return value

    def approval_required(self, *groups: str | None) -> bool:
        """Whether a drain in a node group known by any of ``groups`` (EKS node group, ASG name) needs a
        person's approval: the first group named in ``approval_node_groups`` decides, else ``approval``."""
        for group in groups:
            if group is not None and group in self.approval_node_groups:
                return self.approval_node_groups[group] == "required"
        return self.approval == "required"

    @property
    def replace_settle_seconds(self) -> int:
        """Seconds a finished replacement's new nodes stay protected: ``replace_settle``, else
        ``idle_window + cooldown``."""
        return self.replace_settle if self.replace_settle is not None else self.idle_window + self.cooldown

    def node_group_budget(self, desired_capacity: int) -> int:
        """Nodes of one node group that may be in flight, from ``max_nodes_per_node_group``.

        Args:
            desired_capacity: the Auto Scaling group's DesiredCapacity.

        Returns:
            An integer; ``"N%"`` is N percent of ``desired_capacity`` rounded up (docs/architecture.md §3).
        """
        budget = self.max_nodes_per_node_group
        if isinstance(budget, int):
            return budget
        percent = int(budget.rstrip("%"))
        return -(-percent * max(desired_capacity, 0) // 100)


def load_policy(data: Mapping[str, Any] | None, *, source: str = "policy") -> Policy:
    """Validate a policy mapping (parsed YAML/JSON) into a ``Policy``.

    Raises:
        ConfigError: naming ``source`` and the first offending key (dotted path); ``problems`` every one.
    """
    from rightsizer.domain.validation import config_error

    try:
        return Policy.model_validate(dict(data or {}))
    except ValidationError as exc:
        raise config_error(exc, source=source, model=Policy) from exc
