"""A workflow record as a state-table item and back (DynamoDB API ``AttributeValue`` shapes).

The item's key (``pk`` ``wf#<execution id>``, ``sk`` ``wf``) and its conditional writes stay with
:class:`rightsizer.adapters.dynamodb_state.DynamoDbState`; this module holds only the encoding of the
record's attributes, so that the store keeps to its one job (which item, which condition).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import ValidationError

from rightsizer.adapters.dynamodb_codec import attr_n, attr_s, get_int, get_s, get_time, iso, opt_s, opt_time
from rightsizer.domain.errors import PermanentError
from rightsizer.domain.workflow_details import WorkflowDetails, parse_details
from rightsizer.state import LEDGER_RETENTION, EvictedPod, WorkflowRecord, require_aware

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

    Item = dict[str, AttributeValueTypeDef]

__all__ = ["workflow_attributes", "workflow_record"]


def workflow_attributes(record: WorkflowRecord, version: int) -> Item:
    """``record``'s attributes as stored at ``version`` (its key not included).

    Raises:
        ValueError: a time of the record is naive (``state.require_aware``).
    """
    started_at = require_aware(record.started_at, "started_at")
    item: Item = {
        "execution_id": attr_s(record.execution_id),
        "node": attr_s(record.node),
        "step": attr_s(record.step),
        "status": attr_s(record.status),
        "started_at": attr_s(iso(started_at)),
        "deadline": attr_s(iso(require_aware(record.deadline, "deadline"))),
        "evicted": {
            "L": [
                {
                    "M": {
                        "uid": attr_s(pod.uid),
                        "namespace": attr_s(pod.namespace),
                        "name": attr_s(pod.name),
                        "grace_deadline": attr_s(iso(require_aware(pod.grace_deadline, "grace_deadline"))),
                    }
                }
                for pod in record.evicted
            ]
        },
        "version": attr_n(version),
        # Needed only while the drain runs (and for a post-mortem): TTL keeps the table from growing
        # one item per execution forever. Leases and off-hours sizes never carry a ttl.
        "ttl": attr_n(int((started_at + LEDGER_RETENTION).timestamp())),
    }
    if record.instance_id is not None:
        item["instance_id"] = attr_s(record.instance_id)
    if record.cordoned_at is not None:
        item["cordoned_at"] = attr_s(iso(require_aware(record.cordoned_at, "cordoned_at")))
    if record.lease_epoch is not None:
        item["lease_epoch"] = attr_n(record.lease_epoch)
    # The typed details as the one JSON document earlier releases wrote (records in flight keep loading).
    item["details"] = attr_s(json.dumps(record.details.stored(), sort_keys=True, separators=(",", ":")))
    return item


def workflow_record(item: Item) -> WorkflowRecord:
    """The workflow record a stored item holds.

    Raises:
        PermanentError: the stored details are not readable by this release (an unknown ``kind``, a
            known key of the wrong type); unknown keys are kept (``rightsizer.domain.workflow_details``).
    """
    evicted = tuple(
        EvictedPod(
            uid=pod["uid"]["S"],
            namespace=pod["namespace"]["S"],
            name=pod["name"]["S"],
            grace_deadline=datetime.fromisoformat(pod["grace_deadline"]["S"]),
        )
        for pod in (entry["M"] for entry in item.get("evicted", {}).get("L", []))
    )
    epoch = item.get("lease_epoch")
    return WorkflowRecord(
        execution_id=get_s(item, "execution_id"),
        node=get_s(item, "node"),
        instance_id=opt_s(item, "instance_id"),
        step=get_s(item, "step"),
        status=get_s(item, "status"),
        started_at=get_time(item, "started_at"),
        deadline=get_time(item, "deadline"),
        cordoned_at=opt_time(item, "cordoned_at"),
        evicted=evicted,
        lease_epoch=None if epoch is None else int(epoch["N"]),
        details=_details(item),
        version=get_int(item, "version"),
    )


def _details(item: Item) -> WorkflowDetails:
    """The typed details of a stored workflow item (its ``details`` JSON document; none: a bare drain's)."""
    document = json.loads(item["details"]["S"]) if "details" in item else {}
    try:
        return parse_details(document)
    except ValidationError as exc:
        execution = item.get("execution_id", {}).get("S", "?")
        raise PermanentError(f"workflow record {execution}: details this release cannot read: {exc}") from exc
