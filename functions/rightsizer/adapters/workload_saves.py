"""Saved states of workloads scaled to zero (``ports.WorkloadSaves``, issue 32): on the state table
(:class:`DynamoWorkloadSaves`: item ``pk = workload#<cluster>``, ``sk = Kind/namespace/name``, the state as
JSON in ``saved``; PutItem if absent, GetItem consistent, Query, DeleteItem) and in memory
(:class:`MemoryWorkloadSaves`, same semantics, for ``serve``, the demo and tests).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Final

from rightsizer.adapters.dynamodb_codec import attr_s, get_s, placeholders
from rightsizer.adapters.dynamodb_state import PK, SK, _translated, put_new
from rightsizer.domain.errors import ConfigError
from rightsizer.domain.workload_scale import SavedWorkload

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = ["IAM_ACTIONS", "DynamoWorkloadSaves", "MemoryWorkloadSaves"]

#: DynamoDB calls of this module (tests/integration/test_iam.py).
IAM_ACTIONS: Final = frozenset(
    {"dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:Query", "dynamodb:DeleteItem"}
)


class DynamoWorkloadSaves:
    """``ports.WorkloadSaves`` on the state table, bound to ``cluster``."""

    def __init__(self, client: DynamoDBClient, table_name: str, cluster: str) -> None:
        if "#" in cluster:
            raise ConfigError(f"cluster name {cluster!r} must not contain '#'", field="cluster")
        self._client = client
        self._table = table_name
        self._pk = f"workload#{cluster}"

    def _key(self, workload: str) -> dict[str, Any]:
        return {PK: attr_s(self._pk), SK: attr_s(workload)}

    def save_workload(self, saved: SavedWorkload) -> SavedWorkload:
        """See ``ports.WorkloadSaves.save_workload`` (PutItem with ``attribute_not_exists``)."""
        item = {**self._key(saved.workload.text), "saved": attr_s(saved.model_dump_json())}
        if put_new(self._client, self._table, item):
            return saved
        stored = self.get_workload(saved.workload.text)
        return stored if stored is not None else self.save_workload(saved)

    def get_workload(self, workload: str) -> SavedWorkload | None:
        """See ``ports.WorkloadSaves.get_workload``."""
        with _translated("GetItem", self._table):
            item = self._client.get_item(
                TableName=self._table, Key=self._key(workload), ConsistentRead=True
            ).get("Item")
        return None if item is None else SavedWorkload.model_validate_json(get_s(item, "saved"))

    def forget_workload(self, workload: str) -> bool:
        """See ``ports.WorkloadSaves.forget_workload``."""
        with _translated("DeleteItem", self._table):
            response = self._client.delete_item(
                TableName=self._table, Key=self._key(workload), ReturnValues="ALL_OLD"
            )
        return bool(response.get("Attributes"))

    def saved_workloads(self) -> list[SavedWorkload]:
        """See ``ports.WorkloadSaves.saved_workloads`` (Query on the partition, every page)."""
        out: list[SavedWorkload] = []
        args: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": placeholders(PK),
            "ExpressionAttributeValues": {":pk": attr_s(self._pk)},
            "ConsistentRead": True,
        }
        while True:
            with _translated("Query", self._table):
                page = self._client.query(**args)
            out += [SavedWorkload.model_validate_json(get_s(i, "saved")) for i in page.get("Items", [])]
            if "LastEvaluatedKey" not in page:
                return sorted(out, key=lambda s: s.workload.text)
            args["ExclusiveStartKey"] = page["LastEvaluatedKey"]


class MemoryWorkloadSaves:
    """``ports.WorkloadSaves`` in memory (thread-safe; the same semantics as :class:`DynamoWorkloadSaves`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._saved: dict[str, SavedWorkload] = {}

    def save_workload(self, saved: SavedWorkload) -> SavedWorkload:
        """See ``ports.WorkloadSaves.save_workload``."""
        with self._lock:
            return self._saved.setdefault(saved.workload.text, saved)

    def get_workload(self, workload: str) -> SavedWorkload | None:
        """See ``ports.WorkloadSaves.get_workload``."""
        with self._lock:
            return self._saved.get(workload)

    def forget_workload(self, workload: str) -> bool:
        """See ``ports.WorkloadSaves.forget_workload``."""
        with self._lock:
            return self._saved.pop(workload, None) is not None

    def saved_workloads(self) -> list[SavedWorkload]:
        """See ``ports.WorkloadSaves.saved_workloads``."""
        with self._lock:
            return [self._saved[k] for k in sorted(self._saved)]
