"""Scale a workload to zero and back exactly (issue 32, docs/architecture.md §4 "Workload scale-to-zero").
Pure: what to save and which JSON merge patches to send; ``services.workloads`` reads and sends them.

Before anything changes, the prior state is captured (:class:`SavedWorkload`: replicas, the
InferenceService's ``minReplicas``, the Notebook's ``kubeflow-resource-stopped``, the ScaledObject's
``autoscaling.keda.sh/paused-replicas``, the HPA's bounds), kept in the state table, and written as the
annotation ``rightsizer.io/scaled-to-zero`` on the owner in the first patch; only then the owner's own
switch is turned:

- ``scale_subresource`` (Deployment, StatefulSet, LeaderWorkerSet; an HPA target when opted in: an HPA
  does not scale a target at 0 replicas): ``PATCH …/scale {"spec": {"replicas": 0}}``;
- ``notebook_stopped``: the Notebook's ``kubeflow-resource-stopped`` annotation (the Kubeflow notebook
  controller scales its StatefulSet to 0 while it is set);
- ``inferenceservice_min_replicas``: ``spec.predictor.minReplicas: 0`` (KServe may then scale the
  predictor to zero);
- ``keda_paused_replicas``: the ScaledObject's ``autoscaling.keda.sh/paused-replicas: "0"`` (KEDA holds
  the target at 0 and stops scaling it).

A restore sends the saved values back (an absent annotation or field is removed again with ``null``) and
then removes our annotation. The saved state is never overwritten while it exists: a second scale-down
keeps the first one's values (off-hours saved sizes follow the same rule).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, ValidationError

from rightsizer.domain.workload_model import (
    ANN_KEDA_PAUSED_REPLICAS,
    ANN_NOTEBOOK_STOPPED,
    WorkloadRef,
)

__all__ = [
    "ANN_SAVED",
    "METHODS",
    "Patch",
    "SavedWorkload",
    "capture",
    "restore_patches",
    "scale_down_patches",
]

#: The annotation on the owner holding the saved state (JSON of :class:`SavedWorkload`).
ANN_SAVED: Final = "rightsizer.io/scaled-to-zero"
METHODS: Final = frozenset(
    {"scale_subresource", "notebook_stopped", "inferenceservice_min_replicas", "keda_paused_replicas"}
)


class SavedWorkload(BaseModel):
    """A workload's state before its scale-down: what a restore puts back, field by field (None = the
    field or annotation was absent). ``saved_at`` is RFC 3339 UTC; ``by`` who scaled it (execution id or
    ``cli``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadRef
    method: str
    saved_at: str
    by: str
    replicas: int | None = None
    min_replicas: int | None = None
    notebook_stopped: str | None = None
    scaled_object: str | None = None
    paused_replicas: str | None = None
    hpa: str | None = None
    hpa_min_replicas: int | None = None
    hpa_max_replicas: int | None = None

    def annotation(self) -> str:
        """The annotation value (compact JSON)."""
        return self.model_dump_json()

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> SavedWorkload | None:
        """The state saved on ``obj``'s annotation, or None (absent or not ours: not JSON of this model)."""
        text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANN_SAVED)
        if not text:
            return None
        try:
            return cls.model_validate(json.loads(text))
        except (ValueError, ValidationError):
            return None


@dataclass(frozen=True, slots=True)
class Patch:
    """One JSON merge patch (RFC 7386) to an object of (group, kind) or its ``subresource`` (``scale``)."""

    group: str
    kind: str
    namespace: str
    name: str
    subresource: str | None
    body: dict[str, Any]


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("spec") or {}


def capture(
    workload: WorkloadRef,
    method: str,
    owner: Mapping[str, Any],
    *,
    at: str,
    by: str,
    scaled_object: Mapping[str, Any] | None = None,
    hpa: Mapping[str, Any] | None = None,
) -> SavedWorkload:
    """The state to save before scaling ``workload`` down by ``method``.

    Args:
        workload: the scalable owner.
        method: one of :data:`METHODS`.
        owner: the owner as read (``GET``), the ScaledObject and HPA scaling it when there are any.
        at: RFC 3339 UTC instant; by: execution id or ``cli``.

    Raises:
        ValueError: an unknown ``method``, or ``keda_paused_replicas`` without a ScaledObject.
    """
    if method not in METHODS:
        raise ValueError(f"unknown scale method {method!r}")
    if method == "keda_paused_replicas" and scaled_object is None:
        raise ValueError("keda_paused_replicas needs the ScaledObject")
    predictor = _spec(owner).get("predictor") or {}
    hpa_spec = _spec(hpa)
    return SavedWorkload(
        workload=workload,
        method=method,
        saved_at=at,
        by=by,
        replicas=_spec(owner).get("replicas"),
        min_replicas=predictor.get("minReplicas"),
        notebook_stopped=(_meta(owner).get("annotations") or {}).get(ANN_NOTEBOOK_STOPPED),
        scaled_object=_meta(scaled_object).get("name") if scaled_object else None,
        paused_replicas=(_meta(scaled_object).get("annotations") or {}).get(ANN_KEDA_PAUSED_REPLICAS),
        hpa=_meta(hpa).get("name") if hpa else None,
        hpa_min_replicas=hpa_spec.get("minReplicas"),
        hpa_max_replicas=hpa_spec.get("maxReplicas"),
    )


def _switch(saved: SavedWorkload, down: bool) -> Patch:
    w = saved.workload
    if saved.method == "scale_subresource":
        return Patch(
            w.group,
            w.kind,
            w.namespace,
            w.name,
            "scale",
            {"spec": {"replicas": 0 if down else saved.replicas}},
        )
    if saved.method == "notebook_stopped":
        value = saved.saved_at if down else saved.notebook_stopped
        return Patch(
            w.group,
            w.kind,
            w.namespace,
            w.name,
            None,
            {"metadata": {"annotations": {ANN_NOTEBOOK_STOPPED: value}}},
        )
    if saved.method == "inferenceservice_min_replicas":
        minimum = 0 if down else saved.min_replicas
        return Patch(
            w.group, w.kind, w.namespace, w.name, None, {"spec": {"predictor": {"minReplicas": minimum}}}
        )
    assert saved.scaled_object is not None  # capture() refuses keda_paused_replicas without one
    value = "0" if down else saved.paused_replicas
    return Patch(
        "keda.sh",
        "ScaledObject",
        w.namespace,
        saved.scaled_object,
        None,
        {"metadata": {"annotations": {ANN_KEDA_PAUSED_REPLICAS: value}}},
    )


def _annotate(saved: SavedWorkload, value: str | None) -> Patch:
    w = saved.workload
    return Patch(
        w.group, w.kind, w.namespace, w.name, None, {"metadata": {"annotations": {ANN_SAVED: value}}}
    )


def scale_down_patches(saved: SavedWorkload) -> list[Patch]:
    """The patches of a scale-down, in order: the saved state onto the owner's annotation, then the switch."""
    return [_annotate(saved, saved.annotation()), _switch(saved, down=True)]


def restore_patches(saved: SavedWorkload) -> list[Patch]:
    """The patches of a restore, in order: the switch back to the saved values, then our annotation removed."""
    return [_switch(saved, down=False), _annotate(saved, None)]
