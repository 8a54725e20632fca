"""DynamoDB errors of the small item stores in the product's taxonomy (:mod:`rightsizer.adapters.dynamodb_plans`,
:mod:`rightsizer.adapters.dynamodb_approvals`).

A context manager rather than a call wrapper: the SDK call stays in the store's own frame, so the IAM test
(``tests/support/iam.py``) attributes it to the module that declares its ``IAM_ACTIONS``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import ClientError

from rightsizer.adapters.aws_errors import map_aws_error
from rightsizer.adapters.sdk_errors import SDK_ERRORS
from rightsizer.domain.errors import ConfigError

__all__ = ["table_errors"]


@contextmanager
def table_errors(table: str, operation: str, *expected: str) -> Iterator[None]:
    """Map the errors of a call on ``table``; a ``ClientError`` whose code is in ``expected`` passes through.

    Raises:
        ConfigError: the table does not exist (fail closed, naming ``aws.table``).
        TransientError / PermanentError: as :func:`rightsizer.adapters.aws_errors.map_aws_error`.
    """
    try:
        yield
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code in expected:
            raise
        if code == "ResourceNotFoundException":
            raise ConfigError(f"DynamoDB table {table!r} not found ({operation})", field="aws.table") from exc
        raise map_aws_error(exc, operation) from exc
    except SDK_ERRORS as exc:
        raise map_aws_error(exc, operation) from exc
