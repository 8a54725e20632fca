"""DynamoDB adapter of :class:`rightsizer.state.StateStore`: one table for every kind of state.

Semantics are those of :mod:`rightsizer.state`; ``tests/integration/test_state_contract.py`` holds this
store and :class:`rightsizer.adapters.memory_state.MemoryState` to the same suite.

Table (created for tests/demo by :func:`rightsizer.testing.dynamodb_table.create_state_table`, the
reference for the SAM template): string keys ``pk`` (HASH) and ``sk`` (RANGE), on-demand billing, TTL
attribute ``ttl`` and one sparse global secondary index ``gsi1`` (``gsi1pk`` HASH, ``gsi1sk`` RANGE,
projection ALL) carried by ledger items only.

Key layout (``<cluster>`` is the EKS cluster name, which cannot contain ``#``), as ``pk`` / ``sk``:

- node lease, or the tombstone a release leaves (it keeps the epoch): ``lease#<cluster>`` /
  ``node#<node>``;
- budget slot of a node: ``slot#<cluster>`` / ``node#<node>``; cluster slot counter:
  ``slot#<cluster>`` / ``count``; node group slot counter: ``slot#<cluster>`` / ``group#<node group>``;
- ledger entry (with ``ttl``): ``ledger#<execution id>`` / ``entry#<entry id>``, and on ``gsi1``
  ``gsi1pk`` = ``ledger#<cluster>``, ``gsi1sk`` = ``<at, RFC 3339 UTC with µs>#<execution id>#<entry id>``;
- workflow record: ``wf#<execution id>`` / ``wf``;
- off-hours saved sizes (never a ``ttl``): ``offhours#<cluster>#<node group>`` / ``sizes``;
- Powertools Idempotency (with ``ttl``): ``idempotency#<function name>`` / the request hash.

Leases and slots share one partition per cluster (``expired``, ``live``, ``reap_slots``: one Query each).
Powertools Idempotency shares the table (``DynamoDBPersistenceLayer(key_attr="pk", sort_key_attr="sk",
expiry_attr="ttl")``, ``static_pk_value`` ``idempotency#<function name>``, a prefix this module never
writes). Only ledger and idempotency items carry ``ttl``; lease expiry is a condition on ``expires_at``
(epoch seconds with µs), never TTL; off-hours sizes must never vanish before they are restored.

IAM actions (resource: the table and ``<table>/index/gsi1``): ``dynamodb:GetItem``, ``PutItem``,
``UpdateItem``, ``DeleteItem``, ``Query`` (a slot's ``TransactWriteItems`` is authorised as Put/Update/Delete
per item), limited per role with ``dynamodb:LeadingKeys`` to the ``pk`` families its code touches
(``template.yaml``, ``tests/integration/test_iam.py``); Powertools Idempotency needs nothing more. Tests and
the demo also use ``dynamodb:CreateTable``, ``DescribeTable`` and ``UpdateTimeToLive``.

The client is passed in (built by the wiring with the standard retry mode, which already retries
throttling); errors leave this module as the taxonomy of :mod:`rightsizer.domain.errors`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final, cast

from botocore.exceptions import ClientError

from rightsizer.adapters.aws_errors import map_aws_error
from rightsizer.adapters.dynamodb_codec import (
    attr_b,
    attr_money,
    attr_n,
    attr_s,
    epoch_text,
    from_epoch_text,
    get_int,
    get_s,
    get_time,
    iso,
    opt_float,
    opt_int,
    opt_s,
    opt_time,
    placeholders,
)
from rightsizer.adapters.dynamodb_workflows import workflow_attributes, workflow_record
from rightsizer.adapters.sdk_errors import SDK_ERRORS
from rightsizer.domain.errors import ConfigError, TransientError
from rightsizer.domain.model import GroupSizes
from rightsizer.state import (
    REFUSAL_SLOT_HELD,
    ConflictError,
    Lease,
    LeaseLostError,
    LedgerEntry,
    LedgerResult,
    SavedSizes,
    Slot,
    SlotRefusal,
    WorkflowRecord,
    require_aware,
    slot_refusal,
    sorted_slots,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef, TransactWriteItemTypeDef

__all__ = [
    "GSI1",
    "GSI1_PK",
    "GSI1_SK",
    "PK",
    "SK",
    "TTL_ATTRIBUTE",
    "DynamoDbState",
]

#: The AWS actions this module calls (TransactWriteItems is authorised per item as these actions).
IAM_ACTIONS: Final = frozenset(
    {
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:Query",
    }
)

PK: Final = "pk"
SK: Final = "sk"
TTL_ATTRIBUTE: Final = "ttl"
GSI1: Final = "gsi1"
GSI1_PK: Final = "gsi1pk"
GSI1_SK: Final = "gsi1sk"

_CONDITION_FAILED: Final = "ConditionalCheckFailedException"
_TX_CANCELED: Final = "TransactionCanceledException"
# Codes DynamoDB documents as retryable that the generic AWS mapping does not know.
_DDB_TRANSIENT: Final = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "TransactionConflictException",
        "LimitExceededException",
        "RequestLimitExceeded",
        "ThrottlingException",
        "InternalServerError",
    }
)

if TYPE_CHECKING:
    Item = dict[str, AttributeValueTypeDef]


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextmanager
def _translated(operation: str, table: str, *expected: str) -> Iterator[None]:
    """Map SDK errors onto the taxonomy; ``ClientError`` with an ``expected`` code passes through."""
    try:
        yield
    except ClientError as exc:
        code = _error_code(exc)
        if code in expected:
            raise
        if code == "ResourceNotFoundException":
            # Fail closed: without its table the workflow cannot hold leases or slots.
            raise ConfigError(
                f"DynamoDB table {table!r} not found ({operation})", field="state_table"
            ) from exc
        if code in _DDB_TRANSIENT:
            raise TransientError(f"{operation} failed: {code}", retry_after=2.0) from exc
        raise map_aws_error(exc, operation) from exc
    except SDK_ERRORS as exc:
        raise map_aws_error(exc, operation) from exc


def put_new(client: DynamoDBClient, table: str, item: Item) -> bool:
    """PutItem only where no item has this key yet (``attribute_not_exists(pk)``); False when one has.

    Raises:
        the taxonomy's errors (``_translated``) for anything but the failed condition.
    """
    try:
        with _translated("PutItem", table, _CONDITION_FAILED):
            client.put_item(
                TableName=table,
                Item=item,
                ConditionExpression="attribute_not_exists(#pk)",
                ExpressionAttributeNames=placeholders(PK),
            )
    except ClientError:
        return False
    return True


class DynamoDbState:
    """Every state port on one DynamoDB table, bound to ``cluster`` (see the module docstring).

    Args:
        client: a DynamoDB client (standard retry mode) for the table's region.
        table_name: the state table.
        cluster: the cluster whose leases, slots, off-hours sizes and ledger view this store serves.
        max_attempts: attempts of a budget-slot transaction that lost a race before
            :class:`~rightsizer.domain.errors.TransientError` is raised.
    """

    def __init__(
        self, client: DynamoDBClient, table_name: str, cluster: str, *, max_attempts: int = 5
    ) -> None:
        if "#" in cluster:
            raise ConfigError(f"cluster name {cluster!r} must not contain '#'", field="cluster")
        self._client = client
        self._table = table_name
        self._cluster = cluster
        self._max_attempts = max_attempts

    @property
    def cluster(self) -> str:
        """The cluster this store is bound to."""
        return self._cluster

    @property
    def table_name(self) -> str:
        """The DynamoDB table name."""
        return self._table

    # ------------------------------------------------------------------------------------ plumbing

    def _key(self, pk: str, sk: str) -> dict[str, AttributeValueTypeDef]:
        return {PK: attr_s(pk), SK: attr_s(sk)}

    def _get(self, pk: str, sk: str) -> Item | None:
        with _translated("GetItem", self._table):
            response = self._client.get_item(
                TableName=self._table, Key=self._key(pk, sk), ConsistentRead=True
            )
        return response.get("Item")

    def _query(self, operation_args: Mapping[str, Any]) -> list[Item]:
        items: list[Item] = []
        args = dict(operation_args, TableName=self._table)
        while True:
            with _translated("Query", self._table):
                response = self._client.query(**args)
            items.extend(response["Items"])
            last = response.get("LastEvaluatedKey")
            if not last:
                return items
            args["ExclusiveStartKey"] = last

    def _query_partition(self, pk: str, sk_prefix: str) -> list[Item]:
        return self._query(
            {
                "KeyConditionExpression": "#pk = :pk AND begins_with(#sk, :prefix)",
                "ExpressionAttributeNames": placeholders(PK, SK),
                "ExpressionAttributeValues": {":pk": attr_s(pk), ":prefix": attr_s(sk_prefix)},
                "ConsistentRead": True,
            }
        )

    # -------------------------------------------------------------------------------------- leases

    def _lease_pk(self) -> str:
        return f"lease#{self._cluster}"

    def _lease(self, item: Item) -> Lease:
        return Lease(
            cluster=self._cluster,
            node=get_s(item, "node"),
            epoch=get_int(item, "epoch"),
            owner=get_s(item, "owner"),
            expires_at=from_epoch_text(item["expires_at"]["N"]),
            cancel_requested=bool(item.get("cancel_requested", {}).get("BOOL", False)),
        )

    @staticmethod
    def _held(item: Item | None) -> bool:
        return item is not None and bool(item.get("held", {}).get("BOOL", False))

    def acquire(self, node: str, owner: str, now: datetime, ttl_seconds: int) -> Lease | None:
        """See :meth:`rightsizer.state.LeaseStore.acquire` (UpdateItem with a condition on ``expires_at``)."""
        require_aware(now)
        expires = now + timedelta(seconds=ttl_seconds)
        try:
            with _translated("UpdateItem", self._table, _CONDITION_FAILED):
                response = self._client.update_item(
                    TableName=self._table,
                    Key=self._key(self._lease_pk(), f"node#{node}"),
                    # The epoch survives releases (tombstone), so if_not_exists only seeds a new node.
                    UpdateExpression=(
                        "SET #epoch = if_not_exists(#epoch, :zero) + :one, #held = :true, "
                        "#owner = :owner, #expires_at = :expires, #cancel_requested = :false, "
                        "#node = :node"
                    ),
                    ConditionExpression="attribute_not_exists(#pk) OR #held = :false OR #expires_at <= :now",
                    ExpressionAttributeNames=placeholders(
                        PK, "epoch", "held", "owner", "expires_at", "cancel_requested", "node"
                    ),
                    ExpressionAttributeValues={
                        ":zero": attr_n(0),
                        ":one": attr_n(1),
                        ":true": attr_b(True),
                        ":false": attr_b(False),
                        ":owner": attr_s(owner),
                        ":expires": {"N": epoch_text(expires)},
                        ":node": attr_s(node),
                        ":now": {"N": epoch_text(now)},
                    },
                    ReturnValues="ALL_NEW",
                )
        except ClientError:
            # Held and live: ours (a re-acquire, or a retry of a write whose answer was lost) or not.
            current = self._get(self._lease_pk(), f"node#{node}")
            if current is None or not self._held(current):
                return None
            lease = self._lease(current)
            return lease if lease.owner == owner and not lease.expired(now) else None
        return self._lease(response["Attributes"])

    def renew(self, node: str, owner: str, epoch: int, now: datetime, ttl_seconds: int) -> Lease:
        """See :meth:`rightsizer.state.LeaseStore.renew`."""
        require_aware(now)
        try:
            with _translated("UpdateItem", self._table, _CONDITION_FAILED):
                response = self._client.update_item(
                    TableName=self._table,
                    Key=self._key(self._lease_pk(), f"node#{node}"),
                    UpdateExpression="SET #expires_at = :expires",
                    ConditionExpression=(
                        "#held = :true AND #owner = :owner AND #epoch = :epoch AND #expires_at > :now"
                    ),
                    ExpressionAttributeNames=placeholders("expires_at", "held", "owner", "epoch"),
                    ExpressionAttributeValues={
                        ":expires": {"N": epoch_text(now + timedelta(seconds=ttl_seconds))},
                        ":true": attr_b(True),
                        ":owner": attr_s(owner),
                        ":epoch": attr_n(epoch),
                        ":now": {"N": epoch_text(now)},
                    },
                    ReturnValues="ALL_NEW",
                )
        except ClientError as exc:
            raise LeaseLostError(
                f"lease of node {node} epoch {epoch} is not held by {owner} at {now.isoformat()}"
            ) from exc
        return self._lease(response["Attributes"])

    def release(self, node: str, owner: str, epoch: int) -> bool:
        """See :meth:`rightsizer.state.LeaseStore.release` (keeps a tombstone with the epoch)."""
        try:
            with _translated("UpdateItem", self._table, _CONDITION_FAILED):
                self._client.update_item(
                    TableName=self._table,
                    Key=self._key(self._lease_pk(), f"node#{node}"),
                    UpdateExpression="SET #held = :false REMOVE #owner, #expires_at, #cancel_requested",
                    ConditionExpression="#held = :true AND #owner = :owner AND #epoch = :epoch",
                    ExpressionAttributeNames=placeholders(
                        "held", "owner", "expires_at", "cancel_requested", "epoch"
                    ),
                    ExpressionAttributeValues={
                        ":false": attr_b(False),
                        ":true": attr_b(True),
                        ":owner": attr_s(owner),
                        ":epoch": attr_n(epoch),
                    },
                )
        except ClientError:
            return False
        return True

    def get(self, node: str) -> Lease | None:
        """See :meth:`rightsizer.state.LeaseStore.get`."""
        item = self._get(self._lease_pk(), f"node#{node}")
        return self._lease(item) if item is not None and self._held(item) else None

    def _held_leases(self, prefix: str = "") -> list[Lease]:
        items = self._query_partition(self._lease_pk(), f"node#{prefix}")
        return [self._lease(item) for item in items if self._held(item)]

    def expired(self, now: datetime) -> list[Lease]:
        """See :meth:`rightsizer.state.LeaseStore.expired`."""
        require_aware(now)
        return sorted((lease for lease in self._held_leases() if lease.expired(now)), key=attrgetter("node"))

    def live(self, now: datetime, prefix: str = "") -> list[Lease]:
        """See :meth:`rightsizer.state.LeaseStore.live` (one Query on the lease items under the prefix)."""
        require_aware(now)
        return sorted(
            (lease for lease in self._held_leases(prefix) if not lease.expired(now)), key=attrgetter("node")
        )

    def request_cancel(self, node: str, epoch: int) -> bool:
        """See :meth:`rightsizer.state.LeaseStore.request_cancel`."""
        try:
            with _translated("UpdateItem", self._table, _CONDITION_FAILED):
                self._client.update_item(
                    TableName=self._table,
                    Key=self._key(self._lease_pk(), f"node#{node}"),
                    UpdateExpression="SET #cancel_requested = :true",
                    ConditionExpression="#held = :true AND #epoch = :epoch",
                    ExpressionAttributeNames=placeholders("cancel_requested", "held", "epoch"),
                    ExpressionAttributeValues={":true": attr_b(True), ":epoch": attr_n(epoch)},
                )
        except ClientError:
            return False
        return True

    # -------------------------------------------------------------------------------- budget slots

    def _slot_pk(self) -> str:
        return f"slot#{self._cluster}"

    def _slot(self, item: Item) -> Slot:
        return Slot(
            cluster=self._cluster,
            group=get_s(item, "group"),
            node=get_s(item, "node"),
            owner=get_s(item, "owner"),
            taken_at=get_time(item, "taken_at"),
        )

    def _counter_update(self, sk: str, delta: int, limit: int | None) -> TransactWriteItemTypeDef:
        values: dict[str, AttributeValueTypeDef] = {":delta": attr_n(delta)}
        update: dict[str, Any] = {
            "TableName": self._table,
            "Key": self._key(self._slot_pk(), sk),
            "UpdateExpression": "ADD #held :delta",
            "ExpressionAttributeNames": placeholders("held"),
            "ExpressionAttributeValues": values,
        }
        if limit is not None:
            update["ConditionExpression"] = "attribute_not_exists(#held) OR #held < :limit"
            values[":limit"] = attr_n(limit)
        return cast("TransactWriteItemTypeDef", {"Update": update})

    def _transact(self, items: list[TransactWriteItemTypeDef]) -> bool:
        """Run one transaction; False when DynamoDB cancelled it (a condition failed or a race)."""
        try:
            with _translated("TransactWriteItems", self._table, _TX_CANCELED):
                self._client.transact_write_items(TransactItems=items)
        except ClientError:
            return False
        return True

    def _slot_counts(self, group: str) -> tuple[int, int]:
        """(cluster counter, group counter), strongly consistent, to tell which rule refused."""
        counts = []
        for sk in ("count", f"group#{group}"):
            item = self._get(self._slot_pk(), sk)
            counts.append(get_int(item, "held") if item is not None and "held" in item else 0)
        return counts[0], counts[1]

    def take_slot(
        self,
        group: str,
        node: str,
        owner: str,
        now: datetime,
        *,
        max_per_run: int,
        max_per_group: int,
        desired: int,
        min_size: int,
    ) -> Slot | SlotRefusal:
        """See :meth:`rightsizer.state.BudgetSlots.take_slot`.

        One TransactWriteItems: put the node's slot (must not exist), add 1 to the cluster counter
        (must stay ≤ ``max_per_run``) and to the group counter (must stay ≤ ``max_per_group`` and
        ≤ ``desired − min_size``). When DynamoDB cancels it, a consistent read tells which rule
        refused; if none does any more (a concurrent release, a transaction conflict) it tries again.

        Raises:
            TransientError: still contended after ``max_attempts`` transactions.
        """
        require_aware(now)
        slot_item: Item = {
            PK: attr_s(self._slot_pk()),
            SK: attr_s(f"node#{node}"),
            "group": attr_s(group),
            "node": attr_s(node),
            "owner": attr_s(owner),
            "taken_at": attr_s(iso(now)),
        }
        group_limit = min(max_per_group, desired - min_size)
        for _attempt in range(self._max_attempts):
            # A limit ≤ 0 cannot be expressed as `attribute_not_exists OR held < limit` (the first
            # branch would pass), so such calls go straight to the diagnosis below.
            if max_per_run > 0 and group_limit > 0:
                transaction: list[TransactWriteItemTypeDef] = [
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": slot_item,
                            "ConditionExpression": "attribute_not_exists(#pk)",
                            "ExpressionAttributeNames": placeholders(PK),
                        }
                    },
                    self._counter_update("count", 1, max_per_run),
                    self._counter_update(f"group#{group}", 1, group_limit),
                ]
                if self._transact(transaction):
                    return self._slot(slot_item)
            existing = self._get(self._slot_pk(), f"node#{node}")
            if existing is not None:
                held_slot = self._slot(existing)
                if held_slot.owner == owner:
                    return held_slot
                return SlotRefusal(
                    REFUSAL_SLOT_HELD, f"node {node} is already in flight for {held_slot.owner}"
                )
            in_cluster, in_group = self._slot_counts(group)
            refusal = slot_refusal(
                cluster=self._cluster,
                group=group,
                in_cluster=in_cluster,
                in_group=in_group,
                max_per_run=max_per_run,
                max_per_group=max_per_group,
                desired=desired,
                min_size=min_size,
            )
            if refusal is not None:
                return refusal
        raise TransientError(
            f"budget slot for node {node}: still contended after {self._max_attempts} attempts",
            retry_after=1.0,
        )

    def release_slot(self, node: str, owner: str) -> bool:
        """See :meth:`rightsizer.state.BudgetSlots.release_slot` (one transaction, three items)."""
        for _attempt in range(self._max_attempts):
            existing = self._get(self._slot_pk(), f"node#{node}")
            if existing is None:
                return False
            slot = self._slot(existing)
            if slot.owner != owner:
                return False
            transaction: list[TransactWriteItemTypeDef] = [
                {
                    "Delete": {
                        "TableName": self._table,
                        "Key": self._key(self._slot_pk(), f"node#{node}"),
                        # The group we decrement must be the one this slot counted in.
                        "ConditionExpression": "#owner = :owner AND #group = :group",
                        "ExpressionAttributeNames": placeholders("owner", "group"),
                        "ExpressionAttributeValues": {":owner": attr_s(owner), ":group": attr_s(slot.group)},
                    }
                },
                self._counter_update("count", -1, None),
                self._counter_update(f"group#{slot.group}", -1, None),
            ]
            if self._transact(transaction):
                return True
        raise TransientError(
            f"releasing budget slot of node {node}: still contended after {self._max_attempts} attempts",
            retry_after=1.0,
        )

    def slots(self) -> list[Slot]:
        """See :meth:`rightsizer.state.BudgetSlots.slots`."""
        return sorted_slots([self._slot(item) for item in self._query_partition(self._slot_pk(), "node#")])

    def reap_slots(self, now: datetime) -> list[Slot]:
        """See :meth:`rightsizer.state.BudgetSlots.reap_slots`."""
        require_aware(now)
        live = {(lease.node, lease.owner) for lease in self._held_leases() if not lease.expired(now)}
        reaped = [
            slot
            for slot in self.slots()
            if (slot.node, slot.owner) not in live and self.release_slot(slot.node, slot.owner)
        ]
        return sorted_slots(reaped)

    # -------------------------------------------------------------------------------------- ledger

    def record(self, entry: LedgerEntry) -> bool:
        """See :meth:`rightsizer.state.Ledger.record` (PutItem, condition: no such entry yet)."""
        item: Item = {
            PK: attr_s(f"ledger#{entry.execution_id}"),
            SK: attr_s(f"entry#{entry.entry_id}"),
            GSI1_PK: attr_s(f"ledger#{self._cluster}"),
            GSI1_SK: attr_s(f"{iso(entry.at)}#{entry.execution_id}#{entry.entry_id}"),
            "cluster": attr_s(self._cluster),
            "execution_id": attr_s(entry.execution_id),
            "entry_id": attr_s(entry.entry_id),
            "kind": attr_s(entry.kind),
            "step": attr_s(entry.step),
            "result": attr_s(entry.result),
            "reason": attr_s(entry.reason),
            "at": attr_s(iso(entry.at)),
            TTL_ATTRIBUTE: attr_n(entry.ttl),
        }
        optional: dict[str, AttributeValueTypeDef | None] = {
            "node": None if entry.node is None else attr_s(entry.node),
            "instance_id": None if entry.instance_id is None else attr_s(entry.instance_id),
            "node_group": None if entry.node_group is None else attr_s(entry.node_group),
            "hourly_savings_usd": attr_money(entry.hourly_savings_usd),
            "monthly_savings_usd": attr_money(entry.monthly_savings_usd),
            "instances": None if entry.instances is None else attr_n(entry.instances),
        }
        item.update({name: value for name, value in optional.items() if value is not None})
        return put_new(self._client, self._table, item)

    @staticmethod
    def _entry(item: Item) -> LedgerEntry:
        return LedgerEntry(
            execution_id=get_s(item, "execution_id"),
            node=opt_s(item, "node"),
            instance_id=opt_s(item, "instance_id"),
            node_group=opt_s(item, "node_group"),
            kind=get_s(item, "kind"),
            step=get_s(item, "step"),
            result=cast("LedgerResult", get_s(item, "result")),
            reason=get_s(item, "reason"),
            hourly_savings_usd=opt_float(item, "hourly_savings_usd"),
            monthly_savings_usd=opt_float(item, "monthly_savings_usd"),
            at=get_time(item, "at"),
            ttl=get_int(item, TTL_ATTRIBUTE),
            entry_id=get_s(item, "entry_id"),
            instances=opt_int(item, "instances"),
        )

    def entries(self, execution_id: str | None = None, node: str | None = None) -> list[LedgerEntry]:
        """See :meth:`rightsizer.state.Ledger.entries`."""
        if execution_id is not None:
            items = self._query_partition(f"ledger#{execution_id}", "entry#")
        else:
            items = self._query(
                {
                    "IndexName": GSI1,
                    "KeyConditionExpression": "#gsi1pk = :pk",
                    "ExpressionAttributeNames": placeholders(GSI1_PK),
                    "ExpressionAttributeValues": {":pk": attr_s(f"ledger#{self._cluster}")},
                }
            )
        chosen = [self._entry(item) for item in items]
        return sorted(
            (entry for entry in chosen if node is None or entry.node == node), key=LedgerEntry.sort_key
        )

    # ----------------------------------------------------------------------------------- workflows

    def save(self, record: WorkflowRecord, expected_version: int) -> WorkflowRecord:
        """See :meth:`rightsizer.state.WorkflowRecords.save` (PutItem conditioned on ``version``)."""
        item: Item = {
            PK: attr_s(f"wf#{record.execution_id}"),
            SK: attr_s("wf"),
            **workflow_attributes(record, expected_version + 1),
        }
        if expected_version == 0:
            written = put_new(self._client, self._table, item)
        else:
            try:
                with _translated("PutItem", self._table, _CONDITION_FAILED):
                    self._client.put_item(
                        TableName=self._table,
                        Item=item,
                        ConditionExpression="#version = :expected",
                        ExpressionAttributeNames=placeholders("version"),
                        ExpressionAttributeValues={":expected": attr_n(expected_version)},
                    )
                written = True
            except ClientError:
                written = False
        if not written:
            current = self.load(record.execution_id)
            actual = current.version if current is not None else None
            raise ConflictError(
                f"workflow {record.execution_id}: expected version {expected_version}, found {actual}",
                expected=expected_version,
                actual=actual,
            )
        return workflow_record(item)

    def load(self, execution_id: str) -> WorkflowRecord | None:
        """See :meth:`rightsizer.state.WorkflowRecords.load`.

        Raises:
            PermanentError: the stored details are not readable by this release (an unknown ``kind``, a
                known key of the wrong type); unknown keys are kept (``rightsizer.domain.workflow_details``).
        """
        item = self._get(f"wf#{execution_id}", "wf")
        return None if item is None else workflow_record(item)

    # ----------------------------------------------------------------------------------- off-hours

    def _sizes_pk(self, group: str) -> str:
        return f"offhours#{self._cluster}#{group}"

    @staticmethod
    def _saved(item: Item) -> SavedSizes:
        return SavedSizes(
            group=get_s(item, "group"),
            sizes=GroupSizes(
                min=get_int(item, "min_size"),
                desired=get_int(item, "desired_size"),
                max=get_int(item, "max_size"),
            ),
            saved_at=get_time(item, "saved_at"),
            restore_started_at=opt_time(item, "restore_started_at"),
        )

    def save_sizes(self, group: str, sizes: GroupSizes, now: datetime) -> SavedSizes:
        """See :meth:`rightsizer.state.OffhoursStore.save_sizes` (PutItem if not exists; no ``ttl``)."""
        require_aware(now)
        item: Item = {
            PK: attr_s(self._sizes_pk(group)),
            SK: attr_s("sizes"),
            "cluster": attr_s(self._cluster),
            "group": attr_s(group),
            "min_size": attr_n(sizes.min),
            "desired_size": attr_n(sizes.desired),
            "max_size": attr_n(sizes.max),
            "saved_at": attr_s(iso(now)),
        }
        if not put_new(self._client, self._table, item):
            stored = self._get(self._sizes_pk(group), "sizes")
            if stored is None:
                # Forgotten between our write and our read: the caller's next tick saves again.
                raise TransientError(
                    f"off-hours sizes of {group} changed concurrently", retry_after=1.0
                ) from None
            return self._saved(stored)
        return self._saved(item)

    def get_sizes(self, group: str) -> SavedSizes | None:
        """See :meth:`rightsizer.state.OffhoursStore.get_sizes`."""
        item = self._get(self._sizes_pk(group), "sizes")
        return None if item is None else self._saved(item)

    def mark_restore_started(self, group: str, now: datetime) -> SavedSizes | None:
        """See :meth:`rightsizer.state.OffhoursStore.mark_restore_started`."""
        require_aware(now)
        try:
            with _translated("UpdateItem", self._table, _CONDITION_FAILED):
                response = self._client.update_item(
                    TableName=self._table,
                    Key=self._key(self._sizes_pk(group), "sizes"),
                    UpdateExpression="SET #restore_started_at = if_not_exists(#restore_started_at, :now)",
                    ConditionExpression="attribute_exists(#pk)",
                    ExpressionAttributeNames=placeholders(PK, "restore_started_at"),
                    ExpressionAttributeValues={":now": attr_s(iso(now))},
                    ReturnValues="ALL_NEW",
                )
        except ClientError:
            return None
        return self._saved(response["Attributes"])

    def forget_sizes(self, group: str) -> bool:
        """See :meth:`rightsizer.state.OffhoursStore.forget_sizes`."""
        with _translated("DeleteItem", self._table):
            response = self._client.delete_item(
                TableName=self._table, Key=self._key(self._sizes_pk(group), "sizes"), ReturnValues="ALL_OLD"
            )
        return bool(response.get("Attributes"))
