"""The webhook's Powertools logger and function name (issue 25: the composition root builds the intake
with this logger without importing the Lambda handler module, ``rightsizer.webhook_handler``)."""

from __future__ import annotations

import sys
from typing import Final

from aws_lambda_powertools import Logger

from rightsizer import logsafety

__all__ = ["FUNCTION_NAME", "logger"]

#: The Lambda function's name in the template, and the Powertools service name of its logs.
FUNCTION_NAME: Final = "alert_webhook"

# stderr: Lambda sends it to CloudWatch like stdout, and ``rightsizer serve`` keeps stdout for data.
logger = Logger(service=FUNCTION_NAME, stream=sys.stderr)
# No log level prints a credential: SDK loggers floored at INFO, every handler redacts (issue 14).
logsafety.install([logger.registered_handler])
