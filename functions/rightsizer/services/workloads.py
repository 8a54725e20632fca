"""Workload scale-to-zero and its exact restore (issue 32, docs/architecture.md §4 "Workload
scale-to-zero"): the executor of the plan's ``scale_to_zero`` workload verdicts and of ``rightsizer
restore``.

Scale down: read the owner fresh (and the ScaledObject / HPA the verdict names), re-check that it still
runs (a scale subresource at 0 replicas is left alone), capture the prior state
(``domain.workload_scale.capture``), keep it in the state table (never overwritten), then send the
patches: the state onto the owner's annotation first, then the owner's own switch. Restore: the saved
state from the state table (else from the owner's annotation, if the table lost it), the switch back,
the annotation removed, the saved state forgotten. A dry run reads and reports, and writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from rightsizer.domain.eligibility import (
    WORKLOAD_GUARDS,
    WorkloadFacts,
    first_refusal_message,
    workload_refusals,
)
from rightsizer.domain.workload_model import SCALABLE_KINDS, WorkloadRef
from rightsizer.domain.workload_scale import SavedWorkload, capture, restore_patches, scale_down_patches
from rightsizer.domain.workloads import WorkloadVerdict
from rightsizer.ports import WorkloadSaves, WorkloadWriter

__all__ = ["WorkloadOutcome", "WorkloadScaler", "parse_workload"]

log = logging.getLogger(__name__)

Result = Literal[
    "scaled_to_zero", "would_scale", "restored", "would_restore", "already_zero", "not_found", "nothing_saved"
]
_KIND_GROUP = {kind: group for group, kind in SCALABLE_KINDS}


@dataclass(frozen=True)
class WorkloadOutcome:
    """What happened to one workload: the result, the saved state (when there is one) and why."""

    workload: str
    result: Result
    saved: SavedWorkload | None
    message: str


def parse_workload(text: str) -> WorkloadRef:
    """``Deployment/ml/llm`` (or ``deployment/ml/llm``) → :class:`WorkloadRef`.

    Raises:
        ValueError: not ``Kind/namespace/name`` of a kind in ``SCALABLE_KINDS``.
    """
    parts = text.split("/")
    kinds = {k.lower(): k for k in _KIND_GROUP}
    if len(parts) != 3 or not all(parts) or parts[0].lower() not in kinds:
        raise ValueError(
            f"{text!r} is not Kind/namespace/name with Kind one of {', '.join(sorted(_KIND_GROUP))}"
        )
    kind = kinds[parts[0].lower()]
    return WorkloadRef(group=_KIND_GROUP[kind], kind=kind, namespace=parts[1], name=parts[2])


class WorkloadScaler:
    """Scale workloads to zero and restore them exactly (module docstring).

    Args:
        cluster: Kubernetes reads and merge patches of workload objects.
        saves: the saved states (state table).
        dry_run: report what would be done, write nothing.
        by: who acts (execution id, ``cli``), kept in the saved state.
        clock: aware "now".
    """

    def __init__(
        self,
        cluster: WorkloadWriter,
        saves: WorkloadSaves,
        *,
        dry_run: bool,
        by: str = "cli",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._cluster = cluster
        self._saves = saves
        self._dry_run = dry_run
        self._by = by
        self._clock = clock

    def scale_to_zero(self, verdict: WorkloadVerdict) -> WorkloadOutcome:
        """Scale the workload of a ``scale_to_zero`` verdict to zero, saving its state first.

        Raises:
            ValueError: the verdict is not ``scale_to_zero`` or names no method.
        """
        w = verdict.workload
        if workload_refusals(WorkloadFacts(verdict, True)) or verdict.method is None:
            raise ValueError(f"{w.text}: verdict {verdict.decision} is not scale_to_zero")
        owner = self._cluster.get_object(w.group, w.kind, w.namespace, w.name)
        stale = first_refusal_message(WORKLOAD_GUARDS, WorkloadFacts(verdict, True, owner is not None))
        if owner is None or stale is not None:
            return WorkloadOutcome(w.text, "not_found", None, stale or "the owner is gone")
        saved = self._saves.get_workload(w.text) or SavedWorkload.from_object(owner)
        if saved is None:
            if verdict.method == "scale_subresource" and (owner.get("spec") or {}).get("replicas") == 0:
                return WorkloadOutcome(w.text, "already_zero", None, "spec.replicas is 0 already")
            so = self._read("keda.sh", "ScaledObject", w.namespace, verdict.scaled_object)
            hpa = self._read("autoscaling", "HorizontalPodAutoscaler", w.namespace, verdict.hpa)
            at = self._clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            saved = capture(w, verdict.method, owner, at=at, by=self._by, scaled_object=so, hpa=hpa)
        if self._dry_run:
            return WorkloadOutcome(w.text, "would_scale", saved, f"would scale to zero by {saved.method}")
        saved = self._saves.save_workload(saved)  # the state table first: nothing is touched unsaved
        for patch in scale_down_patches(saved):
            done = self._cluster.patch_object(
                patch.group, patch.kind, patch.namespace, patch.name, patch.subresource, patch.body
            )
            if done is None:
                return WorkloadOutcome(w.text, "not_found", saved, f"{patch.kind} {patch.name} is gone")
        log.info("%s: scaled to zero by %s (saved %s)", w.text, saved.method, saved.annotation())
        return WorkloadOutcome(w.text, "scaled_to_zero", saved, f"scaled to zero by {saved.method}")

    def _read(self, group: str, kind: str, namespace: str, name: str | None) -> dict[str, object] | None:
        return None if name is None else self._cluster.get_object(group, kind, namespace, name)

    def restore(self, workload: str) -> WorkloadOutcome:
        """Put back exactly what was saved for ``workload`` (``Kind/namespace/name``), then forget it.

        Raises:
            ValueError: ``workload`` is not ``Kind/namespace/name`` of a scalable kind.
        """
        ref = parse_workload(workload)
        saved = self._saves.get_workload(ref.text)
        if saved is None:
            owner = self._cluster.get_object(ref.group, ref.kind, ref.namespace, ref.name)
            saved = SavedWorkload.from_object(owner) if owner is not None else None
        if saved is None:
            return WorkloadOutcome(
                ref.text, "nothing_saved", None, "no saved state in the table or on the owner"
            )
        if self._dry_run:
            return WorkloadOutcome(ref.text, "would_restore", saved, f"would restore by {saved.method}")
        for patch in restore_patches(saved):
            done = self._cluster.patch_object(
                patch.group, patch.kind, patch.namespace, patch.name, patch.subresource, patch.body
            )
            if done is None:
                self._saves.forget_workload(ref.text)
                return WorkloadOutcome(ref.text, "not_found", saved, f"{patch.kind} {patch.name} is gone")
        self._saves.forget_workload(ref.text)
        log.info("%s: restored by %s", ref.text, saved.method)
        return WorkloadOutcome(ref.text, "restored", saved, f"restored by {saved.method}")

    def restore_all(self) -> list[WorkloadOutcome]:
        """Restore every workload with a saved state in the table."""
        return [self.restore(s.workload.text) for s in self._saves.saved_workloads()]
