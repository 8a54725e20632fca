"""The fleet's AWS calls (issue 31): the spoke role, Organizations accounts, a spoke's regions and clusters,
and the fleet bucket (manifest, Distributed Map results, report).

Every ``ClientError`` leaves as :class:`rightsizer.domain.fleet.FleetError` (kind ``aws``, the error's
``Code``), which :func:`rightsizer.domain.fleet.classify_failure` turns into the cluster's outcome.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from rightsizer.adapters.aws import make_client, shared_models_session
from rightsizer.domain.fleet import FleetError
from rightsizer.logsafety import register_secret

#: Every action this module calls (tests/integration/test_iam.py and test_fleet_template.py hold the
#: hub's and the spoke's roles to them).
IAM_ACTIONS: Final = frozenset(
    {
        "sts:AssumeRole",
        "organizations:ListAccounts",
        "ec2:DescribeRegions",
        "eks:ListClusters",
        "eks:DescribeCluster",
        "s3:GetObject",
        "s3:PutObject",
    }
)


def _fail(call: str, exc: Exception) -> FleetError:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        return FleetError("aws", f"{call}: {code}: {error.get('Message', '')}", code=code)
    return FleetError("unreachable", f"{call}: {exc}")


def spoke_role_arn(account_id: str, role_name: str, partition: str = "aws") -> str:
    """The spoke role's ARN in ``account_id`` (``infra/spoke/spoke.yaml``'s ``RoleName``)."""
    return f"arn:{partition}:iam::{account_id}:role/{role_name}"


def assume_role_session(
    role_arn: str,
    *,
    external_id: str | None,
    region: str,
    endpoint_url: str | None = None,
    session_name: str = "gpu-rightsizer-fleet",
    base: boto3.session.Session | None = None,
) -> boto3.session.Session:
    """A session with the role's temporary credentials (``sts:AssumeRole``, 1 h; an assessment takes at
    most the member function's 300 s). The secret key and session token are registered for redaction.

    Raises:
        FleetError: kind ``aws`` with AWS's code (``AccessDenied``: the trust policy or the external id
            does not admit the hub; ``RegionDisabledException``: STS is off in the region).
    """
    base = base or shared_models_session(region)
    sts = make_client("sts", region, endpoint_url, session=base)
    params: dict[str, Any] = {"RoleArn": role_arn, "RoleSessionName": session_name[:64]}
    if external_id:
        params["ExternalId"] = external_id
    try:
        credentials = sts.assume_role(**params)["Credentials"]
    except (ClientError, BotoCoreError) as exc:
        raise _fail(f"sts:AssumeRole {role_arn}", exc) from exc
    register_secret(credentials["SecretAccessKey"])
    register_secret(credentials["SessionToken"])
    return shared_models_session(
        region,
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
    )


def active_accounts(session: boto3.session.Session, endpoint_url: str | None = None) -> list[str]:
    """The organisation's ACTIVE account ids, sorted (``organizations:ListAccounts``, paginated; needs the
    management account or a delegated administrator)."""
    client = make_client("organizations", "us-east-1", endpoint_url, session=session)
    try:
        pages = client.get_paginator("list_accounts").paginate()
        return sorted(
            a["Id"] for page in pages for a in page["Accounts"] if a.get("Status", "ACTIVE") == "ACTIVE"
        )
    except (ClientError, BotoCoreError) as exc:
        raise _fail("organizations:ListAccounts", exc) from exc


@dataclass(frozen=True)
class DiscoveredCluster:
    """An EKS cluster as discovery reads it: its name and tags (``eks:DescribeCluster``)."""

    name: str
    tags: dict[str, str]


class SpokeInventory:
    """One account's view through its spoke role: enabled regions and EKS clusters per region."""

    def __init__(self, session: boto3.session.Session, endpoint_url: str | None = None) -> None:
        self._session = session
        self._endpoint_url = endpoint_url

    def enabled_regions(self, home_region: str) -> list[str]:
        """The regions enabled in the account (``ec2:DescribeRegions`` lists only those by default)."""
        ec2 = make_client("ec2", home_region, self._endpoint_url, session=self._session)
        try:
            return sorted(r["RegionName"] for r in ec2.describe_regions()["Regions"])
        except (ClientError, BotoCoreError) as exc:
            raise _fail("ec2:DescribeRegions", exc) from exc

    def clusters(self, region: str) -> Iterator[DiscoveredCluster]:
        """The region's EKS clusters with their tags (``eks:ListClusters``, ``eks:DescribeCluster``)."""
        eks = make_client("eks", region, self._endpoint_url, session=self._session)
        try:
            names = [n for page in eks.get_paginator("list_clusters").paginate() for n in page["clusters"]]
            for name in sorted(names):
                cluster = eks.describe_cluster(name=name)["cluster"]
                yield DiscoveredCluster(name, dict(cluster.get("tags") or {}))
        except (ClientError, BotoCoreError) as exc:
            raise _fail(f"eks:ListClusters/DescribeCluster {region}", exc) from exc


class FleetBucket:
    """The fleet's S3 bucket: JSON documents in, JSON documents out (``s3:PutObject``, ``s3:GetObject``)."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._s3 = client
        self.bucket = bucket

    def put_json(self, key: str, document: Any) -> None:
        """Write ``document`` as JSON at ``key``."""
        body = json.dumps(document, separators=(",", ":")).encode()
        try:
            self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")
        except (ClientError, BotoCoreError) as exc:
            raise _fail(f"s3:PutObject s3://{self.bucket}/{key}", exc) from exc

    def get_json(self, key: str) -> Any:
        """The JSON document at ``key``.

        Raises:
            FleetError: kind ``aws``, code ``NoSuchKey`` when there is none.
        """
        try:
            body = self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise _fail(f"s3:GetObject s3://{self.bucket}/{key}", exc) from exc
        return json.loads(body)


def fleet_bucket(bucket: str, region: str, endpoint_url: str | None = None) -> FleetBucket:
    """The hub's fleet bucket with the function's own credentials."""
    return FleetBucket(make_client("s3", region, endpoint_url), bucket)
