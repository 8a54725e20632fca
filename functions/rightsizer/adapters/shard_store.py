"""The sharded assessment's AWS calls (issue 33 item 3): its S3 bucket (each run's Nodes, shard list and
partials) and the start of a sharded run (Step Functions ``StartExecution``).

Every ``ClientError`` leaves as the project's error taxonomy (``adapters.aws_errors.map_aws_error``): a
throttle is transient (the state machine retries the task), a denied call permanent.
"""

from __future__ import annotations

import json
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from rightsizer.adapters.aws import make_client
from rightsizer.adapters.aws_errors import map_aws_error

#: Every action this module calls (tests/integration/test_iam.py holds the roles to them).
IAM_ACTIONS: Final = frozenset({"s3:GetObject", "s3:PutObject", "states:StartExecution"})


class ShardBucket:
    """The shard bucket: bytes in, bytes out (``s3:PutObject``, ``s3:GetObject``)."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._s3 = client
        self.bucket = bucket

    def put_bytes(self, key: str, body: bytes) -> None:
        """Write ``body`` (JSON) at ``key``."""
        try:
            self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")
        except (ClientError, BotoCoreError) as exc:
            raise map_aws_error(exc, f"PutObject s3://{self.bucket}/{key}") from exc

    def get_bytes(self, key: str) -> bytes:
        """The object at ``key``.

        Raises:
            PermanentError: no such object (a shard that never wrote its partial), or access denied.
        """
        try:
            body: bytes = self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise map_aws_error(exc, f"GetObject s3://{self.bucket}/{key}") from exc
        return body


def shard_bucket(bucket: str, region: str, endpoint_url: str | None = None) -> ShardBucket:
    """The stack's shard bucket with the function's own credentials."""
    return ShardBucket(make_client("s3", region, endpoint_url), bucket)


def start_sharded_run(
    state_machine_arn: str, name: str, document: dict[str, Any], region: str, endpoint_url: str | None = None
) -> str:
    """Start the sharded assessment state machine as execution ``name`` (idempotent: a name already used —
    a retried tick — is the run already started); returns ``name``."""
    client = make_client("stepfunctions", region, endpoint_url)
    body = json.dumps(document, sort_keys=True, separators=(",", ":"))
    try:
        client.start_execution(stateMachineArn=state_machine_arn, name=name, input=body)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ExecutionAlreadyExists":
            raise map_aws_error(exc, "StartExecution") from exc
    except BotoCoreError as exc:
        raise map_aws_error(exc, "StartExecution") from exc
    return name
