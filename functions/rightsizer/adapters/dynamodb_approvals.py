"""DynamoDB adapter of :class:`rightsizer.state.ApprovalStore`: approval requests and snoozes in the state table.

Items (same table and key names as :mod:`rightsizer.adapters.dynamodb_state`):

- approval request: ``pk`` = ``approval#<cluster>``, ``sk`` = ``exec#<execution id>``; ``doc`` = the
  immutable part as JSON (node, nonce, requested/expires instants, details), and the attributes a decision
  changes: ``status``, ``expires`` (epoch seconds, the condition of a decision), ``nonce``, ``task_token``,
  ``notified``, ``decided_by``, ``decided_at``, ``snooze_until``; ``ttl`` = expiry + 7 days;
- snooze: ``pk`` = ``snooze#<cluster>``, ``sk`` = ``node#<node>``; ``until`` (epoch seconds), ``by``,
  ``ttl`` = until + 1 day (expiry is decided by comparing ``until``, never by TTL).

A decision is one ``UpdateItem`` with ``ConditionExpression`` ``status = pending`` (and the nonce, and
``expires > now``): the single use of a link is this condition.

IAM: ``dynamodb:GetItem``, ``PutItem``, ``UpdateItem``, ``Query`` on the table, item families
``approval#<cluster>`` and ``snooze#<cluster>`` (``dynamodb:LeadingKeys`` in the template).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, cast

from botocore.exceptions import ClientError

from rightsizer.adapters.dynamodb_calls import table_errors
from rightsizer.adapters.dynamodb_codec import epoch_text, from_epoch_text, iso
from rightsizer.adapters.dynamodb_state import PK, SK, TTL_ATTRIBUTE
from rightsizer.state import ApprovalRequest, ApprovalStatus, approval_decision, require_aware

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

__all__ = ["DynamoDbApprovals"]

#: The AWS actions this module calls.
IAM_ACTIONS: Final = frozenset(
    {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"}
)
_KEEP_DECIDED: Final = timedelta(days=7)
_KEEP_SNOOZE: Final = timedelta(days=1)


def _utc(value: datetime, name: str) -> datetime:
    return require_aware(value, name).astimezone(UTC)


class DynamoDbApprovals:
    """Approval requests and snoozes of ``cluster`` (see the module docstring).

    Raises (every method):
        ConfigError: the table does not exist.
        TransientError / PermanentError: as :func:`rightsizer.adapters.aws_errors.map_aws_error`.
    """

    def __init__(self, client: DynamoDBClient, table_name: str, cluster: str) -> None:
        self._client = client
        self._table = table_name
        self._approvals = f"approval#{cluster}"
        self._snoozes = f"snooze#{cluster}"

    def _call(self, operation: str, fn: Any, *, conditional: bool = False, **kwargs: Any) -> Any:
        """``fn(TableName=…, **kwargs)``; ``None`` when ``conditional`` and the condition failed."""
        failed = "ConditionalCheckFailedException"
        try:
            with table_errors(self._table, operation, *([failed] if conditional else [])):
                return fn(TableName=self._table, **kwargs)
        except ClientError:  # only the expected code passes table_errors
            return None

    def _key(self, execution_id: str) -> dict[str, Any]:
        return {PK: {"S": self._approvals}, SK: {"S": f"exec#{execution_id}"}}

    @staticmethod
    def _request(item: dict[str, Any]) -> ApprovalRequest:
        doc = json.loads(item["doc"]["S"])

        def when(name: str) -> datetime | None:
            value = item.get(name)
            return None if value is None else datetime.fromisoformat(value["S"])

        return ApprovalRequest(
            execution_id=doc["execution_id"],
            node=doc["node"],
            nonce=doc["nonce"],
            requested_at=datetime.fromisoformat(doc["requested_at"]),
            expires_at=from_epoch_text(item["expires"]["N"]),
            status=cast(ApprovalStatus, item["status"]["S"]),
            task_token=item["task_token"]["S"] if "task_token" in item else None,
            notified=bool(item.get("notified", {}).get("BOOL", False)),
            decided_by=item["decided_by"]["S"] if "decided_by" in item else None,
            decided_at=when("decided_at"),
            snooze_until=when("snooze_until"),
            details=doc.get("details", {}),
        )

    def open_approval(self, request: ApprovalRequest) -> ApprovalRequest:
        """``ApprovalStore.open_approval``: a conditional PutItem, else an UpdateItem of a pending one's token."""
        expires = _utc(request.expires_at, "expires_at")
        doc = {
            "execution_id": request.execution_id,
            "node": request.node,
            "nonce": request.nonce,
            "requested_at": iso(_utc(request.requested_at, "requested_at")),
            "details": request.details,
        }
        item: dict[str, Any] = {
            **self._key(request.execution_id),
            "doc": {"S": json.dumps(doc, sort_keys=True, separators=(",", ":"))},
            "status": {"S": "pending"},
            "nonce": {"S": request.nonce},
            "expires": {"N": epoch_text(expires)},
            "notified": {"BOOL": request.notified},
            TTL_ATTRIBUTE: {"N": str(int((expires + _KEEP_DECIDED).timestamp()))},
        }
        if request.task_token:
            item["task_token"] = {"S": request.task_token}
        created = self._call(
            "PutItem",
            self._client.put_item,
            conditional=True,
            Item=item,
            ConditionExpression="attribute_not_exists(#pk)",
            ExpressionAttributeNames={"#pk": PK},
        )
        if created is None and request.task_token:
            self._call(
                "UpdateItem",
                self._client.update_item,
                conditional=True,
                Key=self._key(request.execution_id),
                UpdateExpression="SET #t = :t",
                ConditionExpression="#s = :pending",
                ExpressionAttributeNames={"#t": "task_token", "#s": "status"},
                ExpressionAttributeValues={":t": {"S": request.task_token}, ":pending": {"S": "pending"}},
            )
        stored = self.get_approval(request.execution_id)
        assert stored is not None  # written above, read strongly consistent
        return stored

    def mark_notified(self, execution_id: str) -> None:
        """``ApprovalStore.mark_notified``: one UpdateItem."""
        self._call(
            "UpdateItem",
            self._client.update_item,
            conditional=True,
            Key=self._key(execution_id),
            UpdateExpression="SET #n = :true",
            ConditionExpression="attribute_exists(#pk)",
            ExpressionAttributeNames={"#n": "notified", "#pk": PK},
            ExpressionAttributeValues={":true": {"BOOL": True}},
        )

    def get_approval(self, execution_id: str) -> ApprovalRequest | None:
        """``ApprovalStore.get_approval``: one consistent GetItem."""
        response = self._call(
            "GetItem", self._client.get_item, Key=self._key(execution_id), ConsistentRead=True
        )
        item = response.get("Item")
        return None if item is None else self._request(item)

    def decide_approval(
        self,
        execution_id: str,
        status: ApprovalStatus,
        *,
        by: str,
        now: datetime,
        nonce: str | None = None,
        snooze_until: datetime | None = None,
    ) -> ApprovalRequest | None:
        """``ApprovalStore.decide_approval``: the rule (:func:`approval_decision`) as one conditional
        UpdateItem returning the new item — ``allows`` as its condition, ``applied`` as its update."""
        decision = approval_decision(status, by=by, now=now, nonce=nonce, snooze_until=snooze_until)
        names = {"#s": "status", "#by": "decided_by", "#at": "decided_at"}
        values: dict[str, Any] = {
            ":s": {"S": decision.status},
            ":by": {"S": decision.decided_by},
            ":at": {"S": iso(decision.decided_at)},
            ":pending": {"S": "pending"},
        }
        update = "SET #s = :s, #by = :by, #at = :at"
        condition = "#s = :pending"
        if decision.unexpired_at is not None:
            names["#x"] = "expires"
            values[":now"] = {"N": epoch_text(decision.unexpired_at)}
            condition += " AND #x > :now"
        if decision.nonce is not None:
            names["#nonce"] = "nonce"
            values[":nonce"] = {"S": decision.nonce}
            condition += " AND #nonce = :nonce"
        if decision.snooze_until is not None:
            names["#z"] = "snooze_until"
            values[":z"] = {"S": iso(decision.snooze_until)}
            update += ", #z = :z"
        response = self._call(
            "UpdateItem",
            self._client.update_item,
            conditional=True,
            Key=self._key(execution_id),
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            ReturnValues="ALL_NEW",
        )
        if response is None:
            return None
        return self._request(response["Attributes"])

    def snooze(self, node: str, until: datetime, *, by: str, now: datetime) -> None:
        """``ApprovalStore.snooze``: one PutItem (replaces an earlier snooze of the node)."""
        until = _utc(until, "until")
        self._call(
            "PutItem",
            self._client.put_item,
            Item={
                PK: {"S": self._snoozes},
                SK: {"S": f"node#{node}"},
                "until": {"N": epoch_text(until)},
                "by": {"S": by},
                "at": {"S": iso(_utc(now, "now"))},
                TTL_ATTRIBUTE: {"N": str(int((until + _KEEP_SNOOZE).timestamp()))},
            },
        )

    def snoozes(self, now: datetime) -> dict[str, datetime]:
        """``ApprovalStore.snoozes``: Query of the cluster's snoozes, those running at ``now``."""
        now = _utc(now, "now")
        found: dict[str, datetime] = {}
        start: dict[str, Any] | None = None
        while True:
            query: dict[str, Any] = {
                "KeyConditionExpression": "#pk = :pk",
                "ExpressionAttributeNames": {"#pk": PK},
                "ExpressionAttributeValues": {":pk": {"S": self._snoozes}},
                "ConsistentRead": True,
            }
            if start:
                query["ExclusiveStartKey"] = start
            response = self._call("Query", self._client.query, **query)
            for item in response.get("Items", []):
                until = from_epoch_text(item["until"]["N"])
                if until > now:
                    found[item[SK]["S"].removeprefix("node#")] = until
            start = response.get("LastEvaluatedKey")
            if not start:
                return found
