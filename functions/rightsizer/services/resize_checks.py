"""What a resize checks on fresh facts (issue 17): the resize eligibility's facts from EC2, Auto Scaling
and the Node, the driver rule that let it pass, and what a fresh report forbids
(``rightsizer.domain.eligibility``'s ``RESIZE_GUARDS``, the planner's own rule).
"""

from __future__ import annotations

from collections.abc import Mapping

from rightsizer.domain.catalog import Catalog
from rightsizer.domain.drivers import driver_check
from rightsizer.domain.eligibility import Judged, ResizeFacts, resize_assessment
from rightsizer.domain.errors import PermanentError
from rightsizer.domain.plan import NodeReport
from rightsizer.domain.policy import Policy
from rightsizer.domain.workflow_details import ResizeDetails
from rightsizer.state import WorkflowRecord


def resize_details(record: WorkflowRecord) -> ResizeDetails:
    """The details of a resize record.

    Raises:
        PermanentError: the record is of another kind.
    """
    if not isinstance(record.details, ResizeDetails):
        raise PermanentError(f"not_a_resize_record:{record.details.kind}")
    return record.details


def resize_facts(
    report: NodeReport | None,
    execution_id: str,
    policy: Policy,
    catalog: Catalog,
    *,
    in_group: bool,
    tags: Mapping[str, str],
    state: str,
    current_type: str,
    target_type: str,
    labels: Mapping[str, str],
) -> ResizeFacts:
    """The resize eligibility's facts (``domain.eligibility.ResizeFacts``) from fresh reads: the
    assessor's report, EC2 DescribeInstances (tags, state, type), Auto Scaling membership and the Node."""
    return ResizeFacts(
        judged=Judged.of(report),
        allow_resize=policy.allow_resize,
        in_group=in_group,
        tags=tags,
        state=state,
        current=catalog.get(current_type),
        current_type=current_type,
        target_type=target_type,
        target=catalog.get(target_type),
        labels=labels,
        driver_minimums=catalog.driver_minimums,
        allow_unknown_driver=policy.resize_allow_unknown_driver,
        allow_instance_store_loss=policy.resize_allow_instance_store_loss,
        execution_id=execution_id,
    )


def driver_summary(facts: ResizeFacts) -> str:
    """``code: detail`` of the driver rule that let the resize pass (recorded in the workflow's details)."""
    assert facts.target is not None
    check = driver_check(
        facts.current.gpu_model if facts.current else None,
        facts.target.gpu_model,
        facts.target.gpu_manufacturer,
        facts.labels,
        facts.driver_minimums,
        allow_unknown=facts.allow_unknown_driver,
    )
    return f"{check.code}: {check.detail}"


def resize_blockers(report: NodeReport | None, execution_id: str) -> list[str]:
    """Reasons a fresh report forbids resizing (the ``assessment`` guard of
    ``domain.eligibility.RESIZE_GUARDS``): not a GPU node, excluded, unknown metrics (never act on missing
    data), a protection other than our own cordon, or no cheaper shape fitting any more (verdict other than
    ``underutilized``). Busy reasons are what a resize is for, so they pass, and so do idle GPU holders: on
    a busy node they are the workload the resize moves (the eviction API still applies)."""
    return [r.reason for r in resize_assessment(Judged.of(report), execution_id)]
