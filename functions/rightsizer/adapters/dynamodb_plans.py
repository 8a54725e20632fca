"""DynamoDB adapter of :class:`rightsizer.state.PlanHistory`: the latest assessments in the state table.

Items (same table and key names as :mod:`rightsizer.adapters.dynamodb_state`): ``pk`` = ``plan#<cluster>``,
``sk`` = ``at#<at, RFC 3339 UTC with µs>`` (sorts chronologically), ``doc`` = the document as
zlib-compressed JSON (Binary; 1,000 nodes of records stay far below the 400 KB item limit), ``ttl`` =
``at`` + :data:`PLAN_RETENTION` (DynamoDB TTL removes old assessments: a short history, never a growing
one). The newest is one ``Query`` (``ScanIndexForward=false``, ``Limit``).

IAM: ``dynamodb:PutItem`` and ``dynamodb:Query`` on the table, item family ``plan#<cluster>``
(``dynamodb:LeadingKeys`` in the template's per-role ``StateItems`` statements).
"""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from rightsizer.adapters.dynamodb_calls import table_errors
from rightsizer.adapters.dynamodb_state import PK, SK, TTL_ATTRIBUTE
from rightsizer.state import require_aware

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

__all__ = ["PLAN_RETENTION", "DynamoDbPlans"]

#: The AWS actions this module calls.
IAM_ACTIONS: Final = frozenset({"dynamodb:PutItem", "dynamodb:Query"})
#: How long an assessment stays in the history before TTL may delete it.
PLAN_RETENTION: Final = timedelta(days=2)
_DOC: Final = "doc"


class DynamoDbPlans:
    """The cluster's recent assessments in the state table (see the module docstring).

    Raises (every method):
        ConfigError: the table does not exist.
        TransientError / PermanentError: as :func:`rightsizer.adapters.aws.map_aws_error`.
    """

    def __init__(self, client: DynamoDBClient, table_name: str, cluster: str) -> None:
        self._client = client
        self._table = table_name
        self._pk = f"plan#{cluster}"

    def _call(self, operation: str, fn: Any, **kwargs: Any) -> Any:
        with table_errors(self._table, operation):
            return fn(TableName=self._table, **kwargs)

    def save_plan(self, document: dict[str, Any], at: datetime) -> None:
        """``PlanHistory.save_plan``: one PutItem."""
        at = require_aware(at, "at").astimezone(UTC)
        body = zlib.compress(json.dumps(document, separators=(",", ":"), sort_keys=True).encode())
        expires = int((at + PLAN_RETENTION).timestamp())
        self._call(
            "PutItem",
            self._client.put_item,
            Item={
                PK: {"S": self._pk},
                SK: {"S": "at#" + at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
                _DOC: {"B": body},
                TTL_ATTRIBUTE: {"N": str(expires)},
            },
        )

    def plans(self, limit: int = 1) -> list[dict[str, Any]]:
        """``PlanHistory.plans``: one Query, newest first."""
        if limit < 1:
            return []
        response = self._call(
            "Query",
            self._client.query,
            KeyConditionExpression="#pk = :pk AND begins_with(#sk, :at)",
            ExpressionAttributeNames={"#pk": PK, "#sk": SK},
            ExpressionAttributeValues={":pk": {"S": self._pk}, ":at": {"S": "at#"}},
            ScanIndexForward=False,
            Limit=limit,
            ConsistentRead=True,
        )
        documents: list[dict[str, Any]] = []
        for item in response.get("Items", []):
            documents.append(json.loads(zlib.decompress(item[_DOC]["B"])))
        return documents
