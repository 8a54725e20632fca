"""The webhook's Lambda handler body, shared by the ``alert_webhook`` Lambda and ``rightsizer serve``.

A Function URL event (payload format 2.0) becomes a :class:`~rightsizer.services.webhook.WebhookRequest`,
the intake answers it, and the answer goes back as ``{statusCode, headers, body}``. It lives in the core
package (not in the handler module) so that the installed wheel, which ships no handler module, can serve
the webhook locally exactly as Lambda runs it (docs/architecture.md §5 "Webhook").

Cold start (issue 33): importing this module loads the logger only; the event model, the intake and its
services load with the first request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.logging import correlation_paths

from rightsizer.webhook_log import FUNCTION_NAME as FUNCTION_NAME
from rightsizer.webhook_log import logger as logger

if TYPE_CHECKING:
    from rightsizer.services.webhook import WebhookIntake

__all__ = ["FUNCTION_NAME", "LambdaHandler", "function_url_handler", "logger"]

#: The Lambda handler's signature: Function URL event and context in, ``{statusCode, headers, body}`` out.
LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


def function_url_handler(intake: Callable[[], WebhookIntake]) -> LambdaHandler:
    """The webhook's Lambda handler over the intake ``intake()`` returns (asked on every invocation, so
    the handler module can build it lazily at the first one).

    Status codes: 401 bad token, 413 body over 1 MiB, 400 malformed JSON / schema / not a Function URL
    event, 202 workflows started or cancels recorded, 200 nothing to do, 503 retry later (see
    :meth:`rightsizer.services.webhook.WebhookIntake.handle` for the bodies). Path ``/approval`` is an
    approval link instead (GET shows, POST decides; 401 forged or expired, 409 reused:
    :meth:`~rightsizer.services.webhook.WebhookIntake.handle_approval`).
    """

    @logger.inject_lambda_context(correlation_id_path=correlation_paths.LAMBDA_FUNCTION_URL)
    def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        from aws_lambda_powertools.utilities.parser import parse
        from aws_lambda_powertools.utilities.parser.models import LambdaFunctionUrlModel
        from pydantic import ValidationError

        from rightsizer.services.approval import APPROVAL_PATH
        from rightsizer.services.webhook import WebhookRequest, WebhookResponse

        try:
            url = parse(event=event, model=LambdaFunctionUrlModel)
        except ValidationError:  # not from a Function URL: a wiring mistake, never Alertmanager's
            logger.error("event is not a Function URL (payload format 2.0) event")
            return WebhookResponse(
                400, {"error": "invalid_event", "detail": "not a Function URL event"}
            ).to_function_url()
        body = url.body if isinstance(url.body, str) else None
        context_ = url.requestContext
        # Powertools parses sourceIp as a network (``203.0.113.9/32``): the address is its only member.
        source = context_.http.sourceIp
        request = WebhookRequest(
            url.headers,
            body,
            bool(url.isBase64Encoded),
            context_.requestId,
            str(getattr(source, "network_address", source)),
        )
        if url.rawPath.rstrip("/") == APPROVAL_PATH:
            method = url.requestContext.http.method.upper()
            return intake().handle_approval(method, url.rawQueryString or "", request).to_function_url()
        return intake().handle(request, lambda_context=context).to_function_url()

    return lambda_handler
