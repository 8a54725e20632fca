"""The map keys the decision reads of Kubernetes objects: one allowlist for every projection.

Labels, annotations and container env are open maps; the models (``domain.model``) keep them whole. Two
projections keep only the keys listed here: the snapshot writer (``adapters.snapshot_projection``: what a
snapshot directory keeps, so no secret leaks through a field nobody reads) and the live plan's compact
read of ~150,000 pods (``domain.pod_parts``, issue 11 item 7). Every entry names the code that reads it;
``tests/unit/test_snapshot_projection.py`` proves each one is read, ``tests/integration/test_paged_lists.py``
that a plan made from the projected objects equals the plan made from whole ones.
"""

from __future__ import annotations

from typing import Final

from rightsizer.domain.capacity import KARPENTER_RESERVATION_ID, KARPENTER_RESERVATION_TYPE
from rightsizer.domain.drivers import GFD_DEPRECATED_PARTS, GFD_FULL, GFD_PARTS
from rightsizer.domain.model import ANN_CORDONED_BY, ANN_DO_NOT_DISRUPT
from rightsizer.domain.planner import CA_SCALE_DOWN_DISABLED, KARPENTER_NODEPOOL
from rightsizer.domain.pods import (
    CA_DAEMONSET_POD,
    CA_SAFE_TO_EVICT,
    CA_SAFE_TO_EVICT_LOCAL_VOLUMES,
    KARPENTER_DO_NOT_DISRUPT,
    MIRROR_ANNOTATION,
    NVIDIA_VISIBLE_DEVICES,
)

__all__ = ["ENV_NAMES", "NODE_ANNOTATIONS", "NODE_LABELS", "POD_ANNOTATIONS", "POD_LABELS"]

#: Node labels the decision reads: instance type (``Node.instance_type``), pricing region, zone and
#: capacity type (``planner._price``), node group and Karpenter ownership (``planner._selected``,
#: ``_node_protections``), the do-not-disrupt label, and the GPU operator's labels (``domain.gpu``).
#: Selectors compare further keys (a pod's ``nodeSelector``, a PersistentVolume's node affinity, the
#: policy's ``node_selector``): the snapshot adds those per snapshot, the live read keeps every label.
NODE_LABELS: Final = frozenset(
    {
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/instance-type",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "eks.amazonaws.com/capacityType",
        "karpenter.sh/capacity-type",
        # The capacity reservation Karpenter launched the node into (``domain.capacity.reservation_of``).
        KARPENTER_RESERVATION_ID,
        KARPENTER_RESERVATION_TYPE,
        "eks.amazonaws.com/nodegroup",
        KARPENTER_NODEPOOL,
        ANN_DO_NOT_DISRUPT,
        "nvidia.com/gpu.present",
        "nvidia.com/gpu.replicas",
        "nvidia.com/gpu.count",
        "nvidia.com/gpu.product",
        "nvidia.com/mig.strategy",
        "nvidia.com/mig.config",
        # The installed NVIDIA driver (GPU Feature Discovery): the resize preflight, also in the plan.
        GFD_FULL,
        *GFD_PARTS,
        *GFD_DEPRECATED_PARTS,
    }
)
#: Node annotations read: ``planner._node_protections`` (do-not-disrupt family, our cordon marker) and
#: ``services.healing.stale_cordons`` (our cordon marker).
NODE_ANNOTATIONS: Final = frozenset(
    {ANN_DO_NOT_DISRUPT, KARPENTER_DO_NOT_DISRUPT, CA_SCALE_DOWN_DISABLED, ANN_CORDONED_BY}
)
#: Pod annotations the eviction filters read (``domain.pods``: mirror pods, do-not-disrupt, safe-to-evict,
#: a custom controller's DaemonSet-like pod).
POD_ANNOTATIONS: Final = frozenset(
    {
        MIRROR_ANNOTATION,
        CA_DAEMONSET_POD,
        ANN_DO_NOT_DISRUPT,
        KARPENTER_DO_NOT_DISRUPT,
        CA_SAFE_TO_EVICT,
        CA_SAFE_TO_EVICT_LOCAL_VOLUMES,
    }
)
#: Pod labels read whatever the objects hold: none — pod labels matter only to the PodDisruptionBudget
#: selectors of the same observation (the snapshot adds their keys; the live read keeps every label).
POD_LABELS: Final = frozenset[str]()
#: Container env entries ``domain.pods.gpu_holding`` reads (value or the presence of ``valueFrom``).
ENV_NAMES: Final = frozenset({NVIDIA_VISIBLE_DEVICES})
