"""AWS error taxonomy: every botocore failure leaves the AWS adapters as one of our error types.

Chosen by the AWS error ``Code`` (never by message text), then by HTTP status
(docs/architecture.md §4 "Errors"); the ``Aws*`` subclasses keep the code and the operation for logs
and alarms. Used by every module that calls AWS (:mod:`rightsizer.adapters.aws` re-exports the names).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Final

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ProfileNotFound,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from rightsizer.adapters.sdk_errors import ResponseParserError
from rightsizer.domain.errors import (
    ConfigError,
    PermanentError,
    RightsizerError,
    StalePlan,
    TransientError,
)

__all__ = [
    "ActionRefusedError",
    "AwsPermanentError",
    "AwsStalePlan",
    "AwsTransientError",
    "aws_errors",
    "environment_error",
    "error_code",
    "map_aws_error",
]


class AwsTransientError(TransientError):
    """A retryable AWS failure; ``code`` is the AWS error code, ``operation`` the API name."""

    def __init__(self, message: str, *, code: str, operation: str, retry_after: float = 5.0) -> None:
        self.code = code
        self.operation = operation
        super().__init__(message, retry_after=retry_after)


class AwsPermanentError(PermanentError):
    """A non-retryable AWS failure (validation, authorization); ``code`` is the AWS error code."""

    def __init__(self, message: str, *, code: str, operation: str) -> None:
        self.code = code
        self.operation = operation
        super().__init__(message)


class AwsStalePlan(StalePlan):
    """The resource the plan named no longer exists (``*NotFound`` codes)."""

    def __init__(self, message: str, *, code: str, operation: str) -> None:
        self.code = code
        self.operation = operation
        super().__init__(message)


class ActionRefusedError(PermanentError):
    """We refused an action before any side effect; ``reasons`` are stable codes, message explains.

    Reason codes: ``node_group_at_min_size``, ``in_auto_scaling_group``, ``instance_store_root``,
    ``instance_store_data_loss``, ``spot_instance``, ``architecture_mismatch``, ``target_has_no_gpus``,
    ``gpu_vendor_mismatch``, ``ena_incompatible``, ``nvme_incompatible``, ``efa_unsupported``,
    ``immutable_instance_type``, ``pod_does_not_fit``.
    """

    def __init__(self, message: str, *, reasons: Sequence[str]) -> None:
        self.reasons = tuple(reasons)
        super().__init__(message)


# Seconds to wait before retrying, per retryable code. ICE needs minutes, not seconds (BUG-27).
_TRANSIENT: Final[Mapping[str, float]] = {
    "Throttling": 5.0,
    "ThrottlingException": 5.0,
    "ThrottledException": 5.0,
    "RequestLimitExceeded": 5.0,
    "RequestThrottled": 5.0,
    "RequestThrottledException": 5.0,
    "TooManyRequestsException": 5.0,
    "SlowDown": 5.0,
    "PriorRequestNotComplete": 5.0,
    "RequestTimeout": 5.0,
    "RequestTimeoutException": 5.0,
    "InternalError": 10.0,
    "InternalFailure": 10.0,
    "InternalServerError": 10.0,
    "ServerException": 10.0,
    "ServiceUnavailable": 10.0,
    "ServiceUnavailableException": 10.0,
    "Unavailable": 10.0,
    "ResourceInUseException": 15.0,
    "ResourceContention": 15.0,
    "ScalingActivityInProgress": 15.0,
    "IncorrectInstanceState": 15.0,
    "IncorrectState": 15.0,
    "InsufficientInstanceCapacity": 120.0,
    "InsufficientCapacity": 120.0,
    "InsufficientHostCapacity": 120.0,
}

_PERMANENT: Final = frozenset(
    {
        "InvalidParameterException",
        "InvalidParameterValue",
        "InvalidParameterValueException",
        "InvalidParameterCombination",
        "InvalidRequestException",
        "MissingParameter",
        "ValidationError",
        "ValidationException",
        "AccessDenied",
        "AccessDeniedException",
        "UnauthorizedOperation",
        "UnauthorizedException",
        "AuthFailure",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "OptInRequired",
        "ClientException",
        "InvalidInstanceAttributeValue",
        "InvalidInstanceType",
        "InvalidInstanceID.Malformed",
        "Unsupported",
        "UnsupportedOperation",
        "UnsupportedInstanceAttribute",
        "LimitExceeded",
        "LimitExceededException",
        "ResourceLimitExceededException",
        "ServiceLinkedRoleFailure",
        "OperationNotPermitted",
    }
)


def map_aws_error(exc: Exception, operation: str) -> RightsizerError:
    """Translate an SDK exception into the taxonomy, by AWS error ``Code`` then HTTP status.

    Args:
        exc: a ``botocore`` ``ClientError`` / ``BotoCoreError`` (anything else is returned as a
            ``PermanentError``).
        operation: the AWS API name, e.g. ``TerminateInstanceInAutoScalingGroup``.

    Returns:
        ``AwsTransientError`` (throttling, 5xx, ``ResourceInUseException``, capacity, connection
        failures), ``AwsStalePlan`` (``*NotFound``), ``AwsPermanentError`` (validation, access denied,
        unknown 4xx), ``ConfigError`` (no credentials).
    """
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "Unknown")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        text = f"{operation} failed: {code}: {error.get('Message', '')}".rstrip(": ")
        if code in _TRANSIENT:
            return AwsTransientError(text, code=code, operation=operation, retry_after=_TRANSIENT[code])
        if code in _PERMANENT or code.startswith("AccessDenied"):
            return AwsPermanentError(text, code=code, operation=operation)
        if code.endswith("NotFound") or code.endswith("NotFoundException") or code == "NoSuchEntity":
            return AwsStalePlan(text, code=code, operation=operation)
        if status >= 500 or status == 429:
            return AwsTransientError(text, code=code, operation=operation, retry_after=10.0)
        return AwsPermanentError(text, code=code, operation=operation)
    if (setup := environment_error(exc)) is not None:
        return setup
    if isinstance(exc, ParamValidationError):
        # Our own request was malformed (BUG-25: instanceTypes on UpdateNodegroupConfig): a bug, not a retry.
        return AwsPermanentError(f"{operation}: {exc}", code="ParamValidationError", operation=operation)
    if isinstance(exc, ResponseParserError):
        # A body botocore cannot parse (an HTML error page from a proxy or load balancer, a cut-off
        # answer): nothing was decided on our side, so it is worth retrying.
        return AwsTransientError(f"{operation}: unreadable AWS answer: {exc}", code="ResponseParserError",
                                 operation=operation, retry_after=5.0)  # fmt: skip
    if isinstance(exc, BotoConnectionError):
        return AwsTransientError(
            f"{operation}: {exc}", code=type(exc).__name__, operation=operation, retry_after=10.0
        )
    if isinstance(exc, BotoCoreError):
        return AwsPermanentError(f"{operation}: {exc}", code=type(exc).__name__, operation=operation)
    return PermanentError(f"{operation}: {exc}")


def environment_error(exc: BaseException | None) -> ConfigError | None:
    """The one-line ``ConfigError`` naming the fix when ``exc``, or an exception it was raised from, says
    the caller's AWS environment lacks something (botocore ``NoCredentialsError``,
    ``PartialCredentialsError``, ``NoRegionError``, ``ProfileNotFound``); None otherwise. These are fixed
    by configuration, never by retrying (CLI exit 2, whichever command met them)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NoRegionError):
            return ConfigError("no AWS region: give --region REGION, or set AWS_REGION", field="aws.region")
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return ConfigError(
                "no AWS credentials found: run `aws configure` or `aws sso login`, set AWS_PROFILE, or export "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                field="aws",
            )
        if isinstance(exc, ProfileNotFound):
            return ConfigError(f"{exc}: set AWS_PROFILE to a profile of ~/.aws/config", field="aws")
        exc = exc.__cause__ or exc.__context__
    return None


@contextmanager
def aws_errors(operation: str) -> Iterator[None]:
    """Raise botocore errors inside the block as the taxonomy (``map_aws_error``), naming ``operation``."""
    try:
        yield
    except (ClientError, BotoCoreError, ResponseParserError) as exc:
        raise map_aws_error(exc, operation) from exc


def error_code(exc: BaseException) -> str | None:
    """The AWS error ``Code`` an ``Aws*`` error carries, else ``None``."""
    return getattr(exc, "code", None)
