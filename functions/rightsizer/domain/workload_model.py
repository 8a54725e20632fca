"""The objects workload verdicts read (issue 32, docs/architecture.md §3 "Workloads"): owners of pods
(ReplicaSet, Deployment, StatefulSet, Kubeflow Notebook, KServe InferenceService, LeaderWorkerSet, and any
other kind a chain of ``ownerReferences`` passes through), HorizontalPodAutoscalers and KEDA ScaledObjects,
each projected to the fields read (the policy keys are ``domain.policy.WorkloadPolicy``).

Sources: Kubernetes API ``apps/v1`` Deployment/StatefulSet/ReplicaSet ``spec.replicas``;
``autoscaling/v2`` HorizontalPodAutoscaler ``spec.scaleTargetRef``, ``minReplicas``, ``maxReplicas``;
``keda.sh/v1alpha1`` ScaledObject ``spec.scaleTargetRef``, ``minReplicaCount``, ``maxReplicaCount`` and the
``autoscaling.keda.sh/paused-replicas`` annotation (keda.sh docs "Pause autoscaling");
``kubeflow.org/v1`` Notebook and its ``kubeflow-resource-stopped`` annotation (Kubeflow notebook
controller: the StatefulSet is scaled to 0 while it is set); ``serving.kserve.io/v1beta1``
InferenceService ``spec.predictor.minReplicas`` / ``maxReplicas``; ``leaderworkerset.x-k8s.io/v1``
LeaderWorkerSet ``spec.replicas`` (scale subresource).
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from rightsizer.domain.model import ObjectMeta

__all__ = [
    "ANN_KEDA_PAUSED_REPLICAS",
    "ANN_NOTEBOOK_STOPPED",
    "ANN_SCALE_TO_ZERO",
    "RESOURCES",
    "SCALABLE_KINDS",
    "KubeObject",
    "ScaleTargetRef",
    "WorkloadRef",
]

#: KEDA's pause switch on a ScaledObject: the target is held at this many replicas (keda.sh "Pause").
ANN_KEDA_PAUSED_REPLICAS: Final = "autoscaling.keda.sh/paused-replicas"
#: Kubeflow's stop switch on a Notebook (the controller scales its StatefulSet to 0 while present).
ANN_NOTEBOOK_STOPPED: Final = "kubeflow-resource-stopped"
#: A workload's own opt-out: ``"false"`` keeps it (``keep:excluded:annotation``).
ANN_SCALE_TO_ZERO: Final = "rightsizer.io/scale-to-zero"

#: (API group, kind) of the owners the rightsizer scales, and how: the scale subresource, or the owner's
#: own switch.
SCALABLE_KINDS: Final = {
    ("apps", "Deployment"): "scale_subresource",
    ("apps", "StatefulSet"): "scale_subresource",
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): "scale_subresource",
    ("kubeflow.org", "Notebook"): "notebook_stopped",
    ("serving.kserve.io", "InferenceService"): "inferenceservice_min_replicas",
}


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


class _K8s(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class ScaleTargetRef(_K8s):
    """``spec.scaleTargetRef`` of an HPA or a ScaledObject (``apiVersion`` defaults to ``apps/v1`` as KEDA's)."""

    apiVersion: str = "apps/v1"
    kind: str = "Deployment"
    name: str


class _Predictor(_K8s):
    minReplicas: int | None = None
    maxReplicas: int | None = None


class _Spec(_K8s):
    replicas: int | None = None
    predictor: _Predictor | None = None
    scaleTargetRef: ScaleTargetRef | None = None
    minReplicas: int | None = None
    maxReplicas: int | None = None
    minReplicaCount: int | None = None
    maxReplicaCount: int | None = None


class KubeObject(_K8s):
    """Any namespaced object the workload verdicts read, projected to the fields above (unread ones
    dropped)."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: _Spec = Field(default_factory=_Spec)

    @property
    def group(self) -> str:
        """The API group (``""`` for the core group)."""
        return _group(self.apiVersion)

    @property
    def ref(self) -> WorkloadRef:
        """This object as a :class:`WorkloadRef`."""
        return WorkloadRef(
            group=self.group, kind=self.kind, namespace=self.metadata.namespace, name=self.metadata.name
        )


class WorkloadRef(BaseModel):
    """A workload by API group, kind, namespace and name; ``text`` is ``Kind/namespace/name``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: str
    kind: str
    namespace: str
    name: str

    @property
    def text(self) -> str:
        """``Deployment/ml/llm-server``: how plans, the CLI and the state table name it."""
        return f"{self.kind}/{self.namespace}/{self.name}"


#: (API group, kind) → (version, plural) of every object workload scale-to-zero reads or writes (the
#: versions the product speaks: Kubernetes apps/v1 and autoscaling/v2, Kubeflow v1, KServe v1beta1,
#: LeaderWorkerSet v1, KEDA v1alpha1).
RESOURCES: Final = {
    ("apps", "Deployment"): ("v1", "deployments"),
    ("apps", "StatefulSet"): ("v1", "statefulsets"),
    ("apps", "ReplicaSet"): ("v1", "replicasets"),
    ("kubeflow.org", "Notebook"): ("v1", "notebooks"),
    ("serving.kserve.io", "InferenceService"): ("v1beta1", "inferenceservices"),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): ("v1", "leaderworkersets"),
    ("autoscaling", "HorizontalPodAutoscaler"): ("v2", "horizontalpodautoscalers"),
    ("keda.sh", "ScaledObject"): ("v1alpha1", "scaledobjects"),
}
