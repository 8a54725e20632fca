"""Create the state table: key schema, TTL and index exactly as the DynamoDB adapter expects.

Used by the contract tests, the demo and as the reference for the SAM template's
``AWS::DynamoDB::Table`` (see :data:`TABLE_DEFINITION`); the key layout itself is documented in
:mod:`rightsizer.adapters.dynamodb_state`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from rightsizer.adapters.dynamodb_state import GSI1, GSI1_PK, GSI1_SK, PK, SK, TTL_ATTRIBUTE

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

__all__ = ["TABLE_DEFINITION", "create_state_table"]

#: CreateTable arguments without ``TableName``; the SAM template mirrors these (plus
#: ``TimeToLiveSpecification: {AttributeName: ttl, Enabled: true}``).
TABLE_DEFINITION: Final[dict[str, Any]] = {
    "AttributeDefinitions": [
        {"AttributeName": PK, "AttributeType": "S"},
        {"AttributeName": SK, "AttributeType": "S"},
        {"AttributeName": GSI1_PK, "AttributeType": "S"},
        {"AttributeName": GSI1_SK, "AttributeType": "S"},
    ],
    "KeySchema": [
        {"AttributeName": PK, "KeyType": "HASH"},
        {"AttributeName": SK, "KeyType": "RANGE"},
    ],
    "GlobalSecondaryIndexes": [
        {
            "IndexName": GSI1,
            "KeySchema": [
                {"AttributeName": GSI1_PK, "KeyType": "HASH"},
                {"AttributeName": GSI1_SK, "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "ALL"},
        }
    ],
    # On demand: a few writes per drain step, bursts at off-hours boundaries; nothing to provision.
    "BillingMode": "PAY_PER_REQUEST",
}


def create_state_table(client: DynamoDBClient, table_name: str) -> None:
    """Create ``table_name`` (``pk``/``sk`` strings, index ``gsi1``), wait until ACTIVE, enable TTL on ``ttl``.

    Raises:
        botocore.exceptions.ClientError: ``ResourceInUseException`` when the table already exists.
    """
    client.create_table(TableName=table_name, **TABLE_DEFINITION)
    client.get_waiter("table_exists").wait(TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    client.update_time_to_live(
        TableName=table_name,
        TimeToLiveSpecification={"AttributeName": TTL_ATTRIBUTE, "Enabled": True},
    )
