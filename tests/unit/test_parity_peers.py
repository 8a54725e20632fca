"""Eligibility parity with kubectl drain, Cluster Autoscaler and Karpenter (issue 12 §4).

Each table is ported from the peer's public tests (Apache-2.0); rows keep the peer's case names. ``want`` is
the outcome for one pod on the node: ``evict`` (drained and evicted), ``skip`` (never evicted, does not
block), or ``block:<reason code>``. Where we are deliberately stricter the row says ``ours`` and why
(docs/operations.md "Parity with kubectl, Cluster Autoscaler and Karpenter").

Sources (repository, path, commit):
- kubernetes/kubectl ``pkg/cmd/drain/drain_test.go`` (TestDrain) and ``pkg/drain/filter_test.go``
  (TestSkipDeletedFilter), dee3483a3d6a64c07fdf746caf80af446dee99ac;
- kubernetes/autoscaler ``cluster-autoscaler/simulator/drainability/rules/localstorage/rule_test.go``,
  125e9c10dcaaad55de968aa12ac91012592e8d02, and the rules ``mirror``, ``daemonset``, ``safetoevict``,
  ``terminal``, ``replicated``, ``system``, ``notsafetoevict``, ``pdb`` (``rules.go`` order,
  084264c152c9fcf4cf06bc3204c51ff76253d914);
- kubernetes/autoscaler ``cluster-autoscaler/simulator/drainability/rules/replicacount/rule_test.go``
  (TestDrainable: controllers read back, "... with missing reference"),
  25af21c51501d4f8d893017c12decce8ccdc5f2e, rule ``replicacount/rule.go`` 292bf72fffc42edfa204a0e6bb035e06a4bdb801;
- kubernetes-sigs/karpenter ``pkg/utils/pod/scheduling.go`` (IsDoNotDisruptActive, IsEvictable,
  IsDisruptable, ToleratesDisruptedNoScheduleTaint), 2266468104f36373ed002241afaee2d3bbc26078.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from rightsizer.domain.model import Pod, PodDisruptionBudget
from rightsizer.domain.pods import PodContext, classify_pod, controllers_to_check
from rightsizer.domain.policy import Policy
from tests.builders import AT, pdb, pod, rfc

RC = ("ReplicationController", "v1")
RS = ("ReplicaSet", "apps/v1")
DS = ("DaemonSet", "apps/v1")
JOB = ("Job", "batch/v1")
SS = ("StatefulSet", "apps/v1")
EMPTYDIR = [{"name": "scratch", "emptyDir": {}}]
MIRROR = {"kubernetes.io/config.mirror": "abc"}
SAFE = "cluster-autoscaler.kubernetes.io/safe-to-evict"
SAFE_LOCAL = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"
KARPENTER = "karpenter.sh/do-not-disrupt"


@dataclass
class Case:
    name: str
    want: str
    owner: tuple[str, str] | None = RS
    phase: str = "Running"
    namespace: str = "default"
    annotations: dict[str, str] = field(default_factory=dict)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=dict)
    pdbs: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)
    owner_gone: bool = False
    """The controller object named by the pod does not exist (the drain's GET answers 404)."""


def outcome(case: Case) -> str:
    obj = pod(
        "bar-0",
        "node",
        namespace=case.namespace,
        owner=case.owner,
        phase=case.phase,
        annotations=case.annotations,
        volumes=case.volumes,
        labels={"app": "bar"},
    )
    obj["metadata"].update(case.meta)
    obj["status"].update(case.status)
    for key in [k for k, v in case.status.items() if v is None]:
        del obj["status"][key]
    obj["spec"].update(case.spec)
    parsed = Pod.model_validate(obj)
    # As the drain does: read back only the controllers it knows how to read; those answer 404 here.
    gone = frozenset(controllers_to_check([parsed])) if case.owner_gone else frozenset()
    ctx = PodContext(
        Policy(**case.policy),
        [PodDisruptionBudget.model_validate(p) for p in case.pdbs],
        {},
        AT,
        gone_controllers=gone,
    )
    result = classify_pod(parsed, ctx)
    if result.findings:
        return "block:" + ",".join(sorted({f.code for f in result.findings}))
    return "skip" if result.ignored else "evict"


# kubectl drain (TestDrain): our default is kubectl with --ignore-daemonsets; --force = allow_bare_pods,
# --delete-emptydir-data = delete_emptydir_data.
KUBECTL = [
    Case("RC-managed pod", "evict", owner=RC),
    Case("DS-managed pod (with --ignore-daemonsets, our only mode)", "skip", owner=DS),
    Case("DS-managed terminated pod", "skip", owner=DS, phase="Succeeded"),
    Case("orphaned DS-managed pod", "block:bare_pod", owner=None),
    Case("orphaned DS-managed pod with --force", "evict", owner=None, policy={"allow_bare_pods": True}),
    Case("DS-managed pod with --ignore-daemonsets", "skip", owner=DS),
    Case("DS-managed pod with emptyDir with --ignore-daemonsets", "skip", owner=DS, volumes=EMPTYDIR),
    # ours: running batch work is protected unless evict_running_jobs (kubectl --force evicts it).
    Case(
        "Job-managed pod with local storage (--force --delete-emptydir-data)",
        "evict",
        owner=JOB,
        volumes=EMPTYDIR,
        policy={"delete_emptydir_data": True, "evict_running_jobs": True},
    ),
    Case(
        "Job-managed pod with local storage, ours without evict_running_jobs",
        "block:running_batch_pod",
        owner=JOB,
        volumes=EMPTYDIR,
        policy={"delete_emptydir_data": True},
    ),
    Case("Job-managed terminated pod", "skip", owner=JOB, phase="Succeeded", volumes=EMPTYDIR),
    Case("RS-managed pod", "evict", owner=RS),
    Case("naked pod", "block:bare_pod", owner=None),
    Case("naked pod with --force", "evict", owner=None, policy={"allow_bare_pods": True}),
    Case(
        "pod with EmptyDir (--force)",
        "block:local_storage",
        owner=None,
        volumes=EMPTYDIR,
        policy={"allow_bare_pods": True},
    ),
    Case("terminated pod with emptyDir", "skip", owner=RC, phase="Failed", volumes=EMPTYDIR),
    Case(
        "pod with EmptyDir and --delete-emptydir-data",
        "evict",
        owner=None,
        volumes=EMPTYDIR,
        policy={"allow_bare_pods": True, "delete_emptydir_data": True},
    ),
    # TestSkipDeletedFilter: a terminating pod is never evicted again and never blocks.
    Case("pod deleted 0 s ago", "evict", owner=RS),
    Case("pod deleted 1 s ago", "skip", meta={"deletionTimestamp": rfc(AT - timedelta(seconds=1))}),
    Case("pod deleted 100 s ago", "skip", meta={"deletionTimestamp": rfc(AT - timedelta(seconds=100))}),
]


def _scratch(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "emptyDir": {}} for n in names]


# Cluster Autoscaler drainability rules (localstorage TestDrain table, then one row per other rule).
CLUSTER_AUTOSCALER = [
    Case("pod with EmptyDir", "block:local_storage", owner=RC, volumes=EMPTYDIR),
    Case(
        "pod with EmptyDir and SafeToEvictLocalVolumesKey annotation",
        "evict",
        owner=RC,
        volumes=EMPTYDIR,
        annotations={SAFE_LOCAL: "scratch"},
    ),
    Case(
        "pod with EmptyDir and empty value for SafeToEvictLocalVolumesKey annotation",
        "block:local_storage",
        owner=RC,
        volumes=EMPTYDIR,
        annotations={SAFE_LOCAL: ""},
    ),
    Case(
        "pod with EmptyDir and non-matching value for SafeToEvictLocalVolumesKey annotation",
        "block:local_storage",
        owner=RC,
        volumes=_scratch("scratch-1"),
        annotations={SAFE_LOCAL: "scratch-2"},
    ),
    Case(
        "pod with EmptyDir and SafeToEvictLocalVolumesKey annotation with matching values",
        "evict",
        owner=RC,
        volumes=_scratch("scratch-1", "scratch-2", "scratch-3"),
        annotations={SAFE_LOCAL: "scratch-1,scratch-2,scratch-3"},
    ),
    Case(
        "pod with EmptyDir and SafeToEvictLocalVolumesKey annotation with non-matching values",
        "block:local_storage",
        owner=RC,
        volumes=_scratch("scratch-1", "scratch-2", "scratch-3"),
        annotations={SAFE_LOCAL: "scratch-1,scratch-2,scratch-5"},
    ),
    Case(
        "pod with EmptyDir and SafeToEvictLocalVolumesKey annotation with some matching values",
        "block:local_storage",
        owner=RC,
        volumes=_scratch("scratch-1", "scratch-2", "scratch-3"),
        annotations={SAFE_LOCAL: "scratch-1,scratch-2"},
    ),
    Case(
        "pod with EmptyDir and SafeToEvictLocalVolumesKey annotation empty values",
        "block:local_storage",
        owner=RC,
        volumes=_scratch("scratch-1", "scratch-2", "scratch-3"),
        annotations={SAFE_LOCAL: ","},
    ),
    Case("EmptyDir failed pod", "skip", owner=None, phase="Failed", volumes=EMPTYDIR),
    Case("EmptyDir terminal pod", "skip", owner=None, phase="Succeeded", volumes=EMPTYDIR),
    Case("EmptyDir evicted pod", "skip", owner=None, phase="Failed", volumes=EMPTYDIR),
    Case("EmptyDir pod with PodSafeToEvict annotation", "evict", owner=None, annotations={SAFE: "true"}),
    Case(
        "EmptyDir long terminating pod with 0 grace period",
        "skip",
        owner=None,
        volumes=EMPTYDIR,
        phase="Unknown",
        meta={"deletionTimestamp": rfc(AT - timedelta(minutes=10))},
        spec={"terminationGracePeriodSeconds": 0},
    ),
    Case(
        "EmptyDir long terminating pod with extended grace period",
        "skip",
        owner=None,
        volumes=EMPTYDIR,
        phase="Unknown",
        meta={"deletionTimestamp": rfc(AT - timedelta(minutes=12))},
        spec={"terminationGracePeriodSeconds": 360},
    ),
    # mirror, daemonset, terminal, safetoevict, replicated, system, notsafetoevict, pdb
    Case("mirror pod", "skip", owner=None, annotations=MIRROR),
    Case("daemonset pod", "skip", owner=DS),
    Case(
        "safe-to-evict bare pod with emptyDir in kube-system",
        "evict",
        owner=None,
        namespace="kube-system",
        volumes=EMPTYDIR,
        annotations={SAFE: "true"},
    ),
    Case(
        "replicated: unknown custom controller kind",
        "block:bare_pod",
        owner=("CloneSet", "apps.kruise.io/v1alpha1"),
    ),
    Case(
        "replicated: custom controller kind whose group is configured",
        "evict",
        owner=("CloneSet", "apps.kruise.io/v1alpha1"),
        policy={"replicated_owner_groups": ["apps.kruise.io"]},
    ),
    Case("replicated: StatefulSet pod", "evict", owner=SS),
    Case("system: kube-system pod without PDB", "block:system_pod", owner=RS, namespace="kube-system"),
    Case(
        "system: kube-system pod with PDB",
        "evict",
        owner=RS,
        namespace="kube-system",
        pdbs=[pdb("bar", "kube-system", {"app": "bar"}, allowed=1)],
    ),
    Case("notsafetoevict: safe-to-evict false", "block:do_not_disrupt", annotations={SAFE: "false"}),
    Case(
        "pdb: no disruptions allowed",
        "block:pdb_blocks",
        pdbs=[pdb("bar", "default", {"app": "bar"}, allowed=0)],
    ),
    Case("pdb: disruption allowed", "evict", pdbs=[pdb("bar", "default", {"app": "bar"}, allowed=1)]),
]


# Cluster Autoscaler replicacount TestDrainable: every controller is read back; a missing one blocks
# (ControllerNotFound), ours as a bare pod. CA's RC references use apiVersion "core/v1"; the API server
# writes "v1" (the core group is ""), which is what a real pod carries. Job rows set evict_running_jobs:
# without it a running Job pod is protected anyway (docs/operations.md parity table, "running batch pods").
CA_DS_POD = {"cluster-autoscaler.kubernetes.io/daemonset-pod": "true"}
CLUSTER_AUTOSCALER_CONTROLLERS = [
    Case("RC-managed pod", "evict", owner=RC),
    Case("RC-managed pod with missing reference", "block:bare_pod", owner=RC, owner_gone=True),
    Case("DS-managed pod", "skip", owner=DS),
    Case("DS-managed pod with missing reference", "block:bare_pod", owner=DS, owner_gone=True),
    Case("DS-managed pod by a custom API Group", "skip", owner=("DaemonSet", "crd/v1")),
    Case(
        "DS-managed pod by a custom API Group with missing reference",
        "skip",
        owner=("DaemonSet", "crd/v1"),
        owner_gone=True,
    ),
    Case(
        "DS-managed pod by a custom Daemonset",
        "skip",
        owner=("CustomDaemonSet", "crd/v1"),
        annotations=CA_DS_POD,
    ),
    Case(
        "DS-managed pod by a custom Daemonset with missing reference",
        "skip",
        owner=("CustomDaemonSet", "crd/v1"),
        annotations=CA_DS_POD,
        owner_gone=True,
    ),
    Case("Job-managed pod", "evict", owner=JOB, policy={"evict_running_jobs": True}),
    Case(
        "Job-managed pod with missing reference",
        "block:bare_pod",
        owner=JOB,
        policy={"evict_running_jobs": True},
        owner_gone=True,
    ),
    Case("SS-managed pod", "evict", owner=SS),
    Case("SS-managed pod with missing reference", "block:bare_pod", owner=SS, owner_gone=True),
    Case("SS-managed pod by a custom API Group", "evict", owner=("StatefulSet", "kruise/v1")),
    Case(
        "SS-managed pod by a custom API Group with missing reference",
        "evict",
        owner=("StatefulSet", "kruise/v1"),
        owner_gone=True,
    ),
    Case("RS-managed pod", "evict", owner=RS),
    Case(
        "RS-managed pod that is being deleted",
        "skip",
        owner=RS,
        meta={"deletionTimestamp": rfc(AT - timedelta(hours=1))},
        owner_gone=True,
    ),
    Case("RS-managed pod with missing reference", "block:bare_pod", owner=RS, owner_gone=True),
    # ours: a pod without a live controller is a bare pod, with a bare pod's opt-ins (CA's customcontroller
    # rule runs before safe-to-evict and still blocks; kubectl --force and safe-to-evict evict bare pods).
    Case(
        "RS-managed pod with missing reference, safe-to-evict",
        "evict",
        owner=RS,
        annotations={SAFE: "true"},
        owner_gone=True,
    ),
    Case(
        "DS-managed pod with missing reference, allow_bare_pods (kubectl --force)",
        "evict",
        owner=DS,
        policy={"allow_bare_pods": True},
        owner_gone=True,
    ),
]


def _started(minutes: int | None) -> dict[str, Any]:
    return {"startTime": None if minutes is None else rfc(AT - timedelta(minutes=minutes))}


# Karpenter pod utilities: IsDoNotDisruptActive (Go time.ParseDuration, > 0, from status.startTime, fail
# safe without it), IsDisruptable (any active pod, DaemonSet included), IsEvictable (not terminating, not
# tolerating the disruption taint).
KARPENTER_CASES = [
    Case("do-not-disrupt true", "block:do_not_disrupt", annotations={KARPENTER: "true"}),
    Case(
        "do-not-disrupt 1h, started 30m ago",
        "block:do_not_disrupt",
        annotations={KARPENTER: "1h"},
        status=_started(30),
    ),
    Case("do-not-disrupt 1h, started 2h ago", "evict", annotations={KARPENTER: "1h"}, status=_started(120)),
    Case(
        "do-not-disrupt 1h30m, started 80m ago",
        "block:do_not_disrupt",
        annotations={KARPENTER: "1h30m"},
        status=_started(80),
    ),
    Case(
        "do-not-disrupt 1.5h, started 100m ago",
        "evict",
        annotations={KARPENTER: "1.5h"},
        status=_started(100),
    ),
    Case(
        "do-not-disrupt 90000ms, started 1m ago",
        "block:do_not_disrupt",
        annotations={KARPENTER: "90000ms"},
        status=_started(1),
    ),
    Case(
        "do-not-disrupt 1d is not a Go duration", "evict", annotations={KARPENTER: "1d"}, status=_started(1)
    ),
    Case(
        "do-not-disrupt bare number is not a Go duration",
        "evict",
        annotations={KARPENTER: "3600"},
        status=_started(1),
    ),
    Case("do-not-disrupt 0s is not positive", "evict", annotations={KARPENTER: "0s"}, status=_started(1)),
    Case("do-not-disrupt -1h is not positive", "evict", annotations={KARPENTER: "-1h"}, status=_started(1)),
    Case(
        "do-not-disrupt 1h without startTime fails safe",
        "block:do_not_disrupt",
        annotations={KARPENTER: "1h"},
        status=_started(None),
    ),
    Case(
        "DaemonSet pod with do-not-disrupt blocks",
        "block:do_not_disrupt",
        owner=DS,
        annotations={KARPENTER: "true"},
    ),
    Case(
        "mirror pod with our do-not-disrupt blocks",
        "block:do_not_disrupt",
        owner=None,
        annotations={**MIRROR, "rightsizer.io/do-not-disrupt": "true"},
    ),
    Case(
        "DaemonSet pod under a PDB that allows nothing blocks",
        "block:pdb_blocks",
        owner=DS,
        pdbs=[pdb("bar", "default", {"app": "bar"}, allowed=0)],
    ),
    Case(
        "terminating pod with do-not-disrupt does not block",
        "skip",
        annotations={KARPENTER: "true"},
        meta={"deletionTimestamp": rfc(AT)},
    ),
    Case(
        "terminal pod with do-not-disrupt does not block",
        "skip",
        phase="Succeeded",
        annotations={KARPENTER: "true"},
    ),
    Case("pod tolerating every taint is not evicted", "skip", spec={"tolerations": [{"operator": "Exists"}]}),
    Case(
        "pod tolerating node.kubernetes.io/unschedulable is not evicted",
        "skip",
        spec={
            "tolerations": [
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
            ]
        },
    ),
    Case(
        "pod tolerating only NoExecute taints is evicted",
        "evict",
        spec={"tolerations": [{"operator": "Exists", "effect": "NoExecute"}]},
    ),
    # policy/v1 Eviction: an unready pod under AlwaysAllow (or a healthy budget) may be evicted.
    Case(
        "unready pod, PDB AlwaysAllow",
        "evict",
        status={"conditions": [{"type": "Ready", "status": "False"}]},
        pdbs=[
            {
                **pdb("bar", "default", {"app": "bar"}, allowed=0),
                "spec": {
                    "selector": {"matchLabels": {"app": "bar"}},
                    "unhealthyPodEvictionPolicy": "AlwaysAllow",
                },
            }
        ],
    ),
    Case(
        "ready pod, PDB AlwaysAllow, no disruption allowed",
        "block:pdb_blocks",
        status={"conditions": [{"type": "Ready", "status": "True"}]},
        pdbs=[
            {
                **pdb("bar", "default", {"app": "bar"}, allowed=0),
                "spec": {
                    "selector": {"matchLabels": {"app": "bar"}},
                    "unhealthyPodEvictionPolicy": "AlwaysAllow",
                },
            }
        ],
    ),
]


@pytest.mark.parametrize("case", KUBECTL, ids=lambda c: c.name)
def test_kubectl_drain_table(case: Case) -> None:
    assert outcome(case) == case.want


@pytest.mark.parametrize("case", CLUSTER_AUTOSCALER, ids=lambda c: c.name)
def test_cluster_autoscaler_drainability_table(case: Case) -> None:
    assert outcome(case) == case.want


@pytest.mark.parametrize("case", CLUSTER_AUTOSCALER_CONTROLLERS, ids=lambda c: c.name)
def test_cluster_autoscaler_controller_table(case: Case) -> None:
    assert outcome(case) == case.want


@pytest.mark.parametrize("case", KARPENTER_CASES, ids=lambda c: c.name)
def test_karpenter_pod_table(case: Case) -> None:
    assert outcome(case) == case.want
