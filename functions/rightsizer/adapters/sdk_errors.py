"""The botocore exceptions a call can raise besides ``ClientError`` (one place, so no adapter forgets one).

``ResponseParserError`` — an answer botocore cannot parse, e.g. a proxy's HTML error page — is a plain
``Exception`` (``botocore.parsers``), not a ``BotoCoreError``: catching ``BotoCoreError`` alone lets it
escape as a traceback.
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError
from botocore.parsers import ResponseParserError

SDK_ERRORS: tuple[type[Exception], ...] = (BotoCoreError, ResponseParserError)
"""Catch with ``except SDK_ERRORS`` next to ``except ClientError``."""

__all__ = ["SDK_ERRORS", "ResponseParserError"]
