"""A deployed stack read as a config (``rightsizer status|history|savings|approve|reject|snooze --stack``).

CloudFormation ``DescribeStacks`` gives the cluster and the state table (outputs), the off-hours timetable
and the policy's source (parameters); the policy itself is read only when a command needs it (``snooze``
without ``--for``: SSM ``GetParameter`` of ``PolicyParameterName``, else ``PolicyInline``). The region is
the stack ARN's, else ``--region``, else the AWS environment's (``AWS_REGION``, ``AWS_DEFAULT_REGION``,
the profile's ``region``); none of them is a one-line ``ConfigError`` naming the fix.
"""

from __future__ import annotations

import re
from typing import Any

from rightsizer.config import Config
from rightsizer.domain.errors import ConfigError

#: Stack outputs ``config_from_stack`` reads (template.yaml ``Outputs``).
STACK_OUTPUTS = ("ClusterName", "StateTableName")
#: ``arn:<partition>:cloudformation:<region>:<account>:stack/<name>/<id>`` (CloudFormation stack ARN).
_STACK_ARN = re.compile(r"^arn:aws[a-z-]*:cloudformation:(?P<region>[a-z0-9-]+):\d{12}:stack/[^/]+/.+$")


def stack_region(stack: str, region: str | None = None) -> str:
    """The region to read ``stack`` in: its ARN's, else ``region`` (``--region``), else the AWS
    environment's (botocore's order: ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile's ``region``).

    Raises:
        ConfigError: no region from any of them, or ``--region`` contradicting the ARN's.
    """
    import boto3

    arn = _STACK_ARN.match(stack)
    if arn:
        if region and region != arn["region"]:
            raise ConfigError(
                f"{region} is not the stack ARN's region {arn['region']}: drop --region", field="--region"
            )
        return arn["region"]
    found = region or boto3.session.Session().region_name
    if not found:
        raise ConfigError(
            "no AWS region: give --region REGION or the stack's ARN, or set AWS_REGION", field="--region"
        )
    return str(found)


def config_from_stack(stack: str, region: str | None = None, *, with_policy: bool = False) -> Config:
    """The config of a deployed stack: cluster and state table from its outputs, the off-hours node groups
    from its ``OffhoursConfig`` parameter, and with ``with_policy`` the deployed policy (CloudFormation
    ``DescribeStacks``; SSM ``GetParameter`` when the policy is in ``PolicyParameterName``; endpoint
    from ``AWS_ENDPOINT_URL``). Region: :func:`stack_region`.

    Raises:
        ConfigError: no region, no credentials, the stack does not exist, lacks an output of
            :data:`STACK_OUTPUTS` (not a GPU Rightsizer stack, or one older than these outputs), or its
            off-hours or policy parameter is invalid.
        PermanentError / TransientError: access denied, throttling (``aws_errors``).
    """
    import boto3
    import yaml
    from botocore.exceptions import BotoCoreError, ClientError
    from pydantic import ValidationError

    from rightsizer.adapters.aws_errors import map_aws_error

    session = boto3.session.Session(region_name=stack_region(stack, region))
    client = session.client("cloudformation")
    try:
        described = client.describe_stacks(StackName=stack)["Stacks"][0]
    except ClientError as exc:
        # CloudFormation answers a missing stack with ValidationError "Stack with id X does not exist".
        if "does not exist" in str(exc):
            raise ConfigError(f"stack {stack!r} not found in {session.region_name}", field="--stack") from exc
        raise map_aws_error(exc, "cloudformation:DescribeStacks") from exc
    except BotoCoreError as exc:
        raise map_aws_error(exc, "cloudformation:DescribeStacks") from exc
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    missing = [key for key in STACK_OUTPUTS if key not in outputs]
    if missing:
        raise ConfigError(
            f"stack {stack!r} has no output {', '.join(missing)} (not a GPU Rightsizer stack, or deployed "
            "before these outputs existed: redeploy)",
            field="--stack",
        )
    parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in described.get("Parameters", [])}
    document: dict[str, Any] = {
        "cluster": {"name": outputs["ClusterName"], "region": session.region_name},
        "aws": {"region": session.region_name, "table": outputs["StateTableName"]},
    }
    try:
        document["offhours"] = yaml.safe_load(parameters.get("OffhoursConfig") or "{}") or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"stack parameter OffhoursConfig: {exc}", field="OffhoursConfig") from exc
    if with_policy:
        document["policy"] = _deployed_policy(session, parameters)
    try:
        return Config.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(f"stack parameter OffhoursConfig: {exc}", field="OffhoursConfig") from exc


def _deployed_policy(session: Any, parameters: dict[str, str]) -> Any:
    """The policy the stack's functions read: the SSM parameter ``PolicyParameterName`` when set (it wins,
    as in template.yaml), else ``PolicyInline``.

    Raises:
        ConfigError: the policy text is invalid; PermanentError / TransientError: the SSM read failed.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    from rightsizer.adapters.aws_errors import map_aws_error
    from rightsizer.wiring.settings import parse_policy_text

    name = parameters.get("PolicyParameterName") or ""
    if not name:
        return parse_policy_text(
            parameters.get("PolicyInline") or "{}", source="stack parameter PolicyInline"
        )
    try:
        text = session.client("ssm").get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
    except (BotoCoreError, ClientError) as exc:
        raise map_aws_error(exc, f"ssm:GetParameter {name}") from exc
    return parse_policy_text(text, source=f"ssm:{name}")
