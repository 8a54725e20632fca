"""``rightsizer serve``: the webhook's Lambda handler behind a loopback HTTP server, as a Function URL.

Every POST becomes a Function URL event (payload format 2.0) and a Lambda context emulation
(:class:`LocalLambdaContext`), so the handler runs exactly as Lambda runs it
(:func:`rightsizer.webhook_handler.function_url_handler`); drains run in this process, in background threads.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from rightsizer.config import Config
from rightsizer.webhook_handler import LambdaHandler

if TYPE_CHECKING:
    from rightsizer.ports import WorkflowStarter
    from rightsizer.services.webhook import DuplicateGuard
    from rightsizer.state import StateStore

__all__ = [
    "LocalLambdaContext",
    "WebhookHTTPServer",
    "build_serve_starter",
    "build_webhook_server",
    "function_url_event",
]

log = logging.getLogger("rightsizer")

#: Bytes of an over-long body read and thrown away so the client can read its 413 (closing a socket with
#: unread data sends a TCP reset, which clients report instead of the answer); beyond this we just close.
_DRAIN_LIMIT = 16 * 1_048_576


@dataclass
class LocalLambdaContext:
    """The parts of a Lambda context the handler and Powertools read, for invocations outside Lambda.

    ``timeout_s`` plays the function timeout: Powertools Idempotency lets an in-progress key expire
    when the invocation would have timed out.
    """

    aws_request_id: str
    function_name: str = "alert_webhook"
    function_version: str = "$LATEST"
    invoked_function_arn: str = "arn:aws:lambda:local:000000000000:function:alert_webhook"
    memory_limit_in_mb: int = 128
    log_group_name: str = "/local/alert_webhook"
    log_stream_name: str = "local"
    timeout_s: float = 30.0
    _deadline: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before this invocation's (simulated) timeout."""
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def function_url_event(
    *,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    query: str = "",
    source_ip: str = "127.0.0.1",
    request_id: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """An HTTP request as a Lambda Function URL event (payload format 2.0).

    Header names are lower-cased and repeated headers joined with commas, as Function URLs do; a body
    that is not UTF-8 text is base64-encoded with ``isBase64Encoded: true``.
    """
    at = now or datetime.now(UTC)
    lowered: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        lowered[key] = f"{lowered[key]},{value}" if key in lowered else value
    try:
        text, encoded = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, encoded = base64.b64encode(body).decode("ascii"), True
    request_id = request_id or str(uuid.uuid4())
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": lowered,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "local",
            "domainName": lowered.get("host", "127.0.0.1"),
            "domainPrefix": "local",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": lowered.get("user-agent", ""),
            },
            "requestId": request_id,
            "routeKey": "$default",
            "stage": "$default",
            "time": at.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(at.timestamp() * 1000),
        },
        "body": text if body else None,
        "isBase64Encoded": encoded,
    }


class WebhookHTTPServer(ThreadingHTTPServer):
    """A loopback HTTP server that hands every POST to a Lambda handler as a Function URL event.

    Args:
        address: ``(host, port)``; port 0 picks a free one (see ``server_address``).
        handler: the Lambda handler (``alert_webhook.app.lambda_handler``).
        max_body_bytes: bytes read from a body before the handler sees it; one more than the handler's
            limit is enough for it to answer 413.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: LambdaHandler, *, max_body_bytes: int) -> None:
        self.lambda_handler = handler
        self.max_body_bytes = max_body_bytes
        super().__init__(address, _WebhookRequestHandler)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>/``."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"


class _WebhookRequestHandler(BaseHTTPRequestHandler):
    server: WebhookHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: Alertmanager (and the benchmark) reuse connections
    # Headers and body leave in two writes; with Nagle on, the second waits for the peer's delayed ACK
    # (40 ms on Linux) on every keep-alive response.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            self._reply(411, {"content-type": "application/json"}, b'{"error":"length_required"}', close=True)
            return
        length = int(length_header)
        # Never hold more than the limit (+1 so the handler sees the body is too big and says 413).
        body = self.rfile.read(min(length, self.server.max_body_bytes + 1))
        unread = length - len(body)
        close = unread > 0
        if 0 < unread <= _DRAIN_LIMIT:
            while unread > 0:
                chunk = self.rfile.read(min(unread, 65536))
                if not chunk:
                    break
                unread -= len(chunk)
        path, _, query = self.path.partition("?")
        request_id = str(uuid.uuid4())
        event = function_url_event(
            method="POST",
            path=path,
            query=query,
            headers=dict(self.headers.items()),
            body=body,
            source_ip=self.client_address[0],
            request_id=request_id,
        )
        try:
            answer = self.server.lambda_handler(event, LocalLambdaContext(aws_request_id=request_id))
        except Exception:  # as Lambda would: the invocation failed, the caller gets a 502
            log.exception("serve: the handler raised")
            self._reply(502, {"content-type": "application/json"}, b'{"error":"handler_failed"}', close=close)
            return
        payload = answer.get("body") or ""
        data = base64.b64decode(payload) if answer.get("isBase64Encoded") else str(payload).encode("utf-8")
        self._reply(int(answer.get("statusCode", 200)), dict(answer.get("headers") or {}), data, close=close)

    def do_GET(self) -> None:
        self._reply(
            405, {"allow": "POST", "content-type": "application/json"}, b'{"error":"method_not_allowed"}'
        )

    do_PUT = do_DELETE = do_PATCH = do_GET

    def _reply(self, status: int, headers: Mapping[str, str], data: bytes, *, close: bool = False) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("serve: %s - %s", self.address_string(), format % args)


def build_serve_starter(config: Config, state: StateStore, *, execute: bool) -> WorkflowStarter:
    """The ``WorkflowStarter`` of ``rightsizer serve``: the in-process runner in background threads over
    ``state`` (the same store the webhook reads leases from), so the webhook answers at once.

    Dry run unless ``execute`` and the policy's ``dry_run: false`` (docs/architecture.md §5 "Live needs
    every switch").

    Raises:
        ConfigError: no ``cluster.name`` (the node scaler needs the EKS cluster).
    """
    from rightsizer.wiring import Runtime

    return Runtime(config, "serve", dry_run=not execute, state=state).starter()


def build_webhook_server(
    config: Config,
    *,
    port: int = 0,
    execute: bool = False,
    starter: WorkflowStarter | None = None,
    state: StateStore | None = None,
    guard: DuplicateGuard | None = None,
    environ: Mapping[str, str] | None = None,
) -> WebhookHTTPServer:
    """The ``serve`` server on 127.0.0.1:``port`` (0 = any free port), not yet serving.

    The webhook intake comes from the composition root (:meth:`rightsizer.wiring.Runtime.webhook_intake`,
    mode ``serve``) and is served by the Lambda's own handler body; ``starter``/``state``/``guard``
    override the defaults (in-process drains in background threads; the ``aws.table`` store or memory;
    Powertools Idempotency on the table, or memory without one).

    Raises:
        ConfigError: no token (``RIGHTSIZER_WEBHOOK_TOKEN`` / ``webhook.token_secret``), or no
            ``cluster.name`` for the drains.
    """
    from rightsizer.services.webhook import MAX_BODY_BYTES
    from rightsizer.webhook_handler import function_url_handler
    from rightsizer.wiring import Runtime

    runtime = Runtime(config, "serve", dry_run=not execute, state=state)
    intake = runtime.webhook_intake(starter=starter, guard=guard, environ=environ)
    handler = function_url_handler(lambda: intake)
    return WebhookHTTPServer(("127.0.0.1", port), handler, max_body_bytes=MAX_BODY_BYTES)
