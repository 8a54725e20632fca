"""SNS adapter of :class:`rightsizer.services.approval.ApprovalNotifier`: approval requests on the stack's topic.

The topic is the one every alarm notifies (``AlarmTopic``): its e-mail subscription and any AWS Chatbot
channel see approval requests too. IAM: ``sns:Publish`` on that topic (the drain function only).
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from botocore.exceptions import ClientError

from rightsizer.adapters.aws_errors import map_aws_error
from rightsizer.adapters.sdk_errors import SDK_ERRORS


class SNSClient(Protocol):
    """The one call of a boto3 SNS client this module makes (no SNS stubs in the dev dependencies)."""

    def publish(self, *, TopicArn: str, Subject: str, Message: str) -> Any:  # noqa: N803 (boto3 names)
        """``sns:Publish``."""
        ...


__all__ = ["SnsNotifier"]

#: The AWS actions this module calls.
IAM_ACTIONS: Final = frozenset({"sns:Publish"})


class SnsNotifier:
    """Publishes plain-text messages to one SNS topic.

    Raises (``publish``):
        TransientError / PermanentError: as :func:`rightsizer.adapters.aws_errors.map_aws_error`.
    """

    def __init__(self, client: SNSClient, topic_arn: str) -> None:
        self._client = client
        self._topic = topic_arn

    def publish(self, subject: str, message: str) -> None:
        """``sns:Publish`` (SNS limits: subject ≤ 100 ASCII characters, message ≤ 256 KiB)."""
        subject = subject.encode("ascii", "replace").decode("ascii")[:100]
        try:
            self._client.publish(TopicArn=self._topic, Subject=subject, Message=message)
        except ClientError as exc:
            raise map_aws_error(exc, "sns:Publish") from exc
        except SDK_ERRORS as exc:
            raise map_aws_error(exc, "sns:Publish") from exc
