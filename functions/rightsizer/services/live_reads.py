"""The drain's uncached controller reads behind a node's pods (docs/architecture.md §4): whether the
controllers they name still exist. Made before the cordon, at revalidate and at every eviction round
(the volume reads are ``services.node_view``).

Kubernetes RBAC (ClusterRole ``rightsizer``, ``infra/k8s/rbac.yaml``): ``get`` replicasets, statefulsets,
daemonsets (``apps``), jobs (``batch``) and replicationcontrollers.
"""

from __future__ import annotations

from collections.abc import Sequence

from rightsizer.domain.model import Pod
from rightsizer.domain.pods import ControllerRef, controllers_to_check
from rightsizer.ports import ClusterWriter


def gone_controllers(cluster: ClusterWriter, pods: Sequence[Pod]) -> frozenset[ControllerRef]:
    """The controllers the pods name that no longer exist (one uncached GET per distinct controller of a
    ReplicaSet, StatefulSet, DaemonSet, Job or ReplicationController kind): their pods are bare pods.

    Raises:
        PermanentError: the GET is refused (403 names the verb); TransientError: 429, 5xx, timeouts.
    """
    return frozenset(
        ref
        for ref in controllers_to_check(pods)
        if ref.gone(cluster.get_controller(ref.namespace, ref.group, ref.kind, ref.name))
    )
