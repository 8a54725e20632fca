"""Who is calling, from the caller's own AWS credentials (issue 26: a decider is never self-declared).

``rightsizer approve|reject|snooze`` records the principal AWS authenticated, not ``$USER``: STS
``GetCallerIdentity`` answers the ARN of the credentials that sign the request (an IAM user, or the
assumed role and its session name, ``arn:aws:sts::<account>:assumed-role/<role>/<session>``). The call
needs no IAM permission (AWS: "No permissions are required to perform this operation").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from botocore.exceptions import ClientError

from rightsizer.adapters.aws_errors import map_aws_error
from rightsizer.adapters.sdk_errors import SDK_ERRORS

if TYPE_CHECKING:
    from mypy_boto3_sts.client import STSClient

__all__ = ["IAM_ACTIONS", "caller_arn"]

#: The AWS actions this module calls (always allowed: no policy grants or denies it).
IAM_ACTIONS: Final = frozenset({"sts:GetCallerIdentity"})


def caller_arn(sts: STSClient) -> str:
    """The ARN of the principal whose credentials sign ``sts``'s requests (STS ``GetCallerIdentity``).

    Raises:
        ConfigError: no AWS credentials; AwsPermanentError / AwsTransientError: STS refused or failed
            (``rightsizer.adapters.aws_errors.map_aws_error``).
    """
    try:
        return str(sts.get_caller_identity()["Arn"])
    except ClientError as exc:
        raise map_aws_error(exc, "sts:GetCallerIdentity") from exc
    except SDK_ERRORS as exc:
        raise map_aws_error(exc, "sts:GetCallerIdentity") from exc
