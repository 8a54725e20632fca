"""``rightsizer serve``: the webhook's Lambda handler behind a loopback HTTP server, as a Function URL.

Every POST becomes a Function URL event (payload format 2.0) and a Lambda context emulation
(:class:`LocalLambdaContext`), so the handler runs exactly as Lambda runs it
(:func:`rightsizer.webhook_handler.function_url_handler`); drains run in this process, in background threads.

Bounded whatever the clients do (issue 14): connections are served by a fixed pool of
``SERVE_WORKERS`` threads with at most ``SERVE_BACKLOG`` more waiting (beyond that a connection is answered
503 and closed at once); every socket read times out after ``READ_TIMEOUT_S`` and a request must arrive
whole within ``REQUEST_TIMEOUT_S``, so a stalled or trickling connection is closed; a request with more
than one ``Authorization`` header is answered 400 ``duplicate_authorization`` before anything else, and a
POST without the bearer token is answered 401 before its body is read (issue 26), so senders without the
token cannot hold the workers while they stall in a body.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING, Any, Final

from rightsizer.config import Config
from rightsizer.logsafety import redact_url
from rightsizer.services.approval import APPROVAL_PATH
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
#: Threads serving connections (each request also fans its alerts out to the intake's own bounded pool).
SERVE_WORKERS: Final = 8
#: Accepted connections that may wait for a worker; more are answered 503 and closed without one.
SERVE_BACKLOG: Final = 32
#: Seconds a socket read (or write) may block before the connection is closed (idle keep-alive included).
READ_TIMEOUT_S: Final = 10.0
#: Seconds from the first byte of a request's body to its last: a trickling sender is cut off.
REQUEST_TIMEOUT_S: Final = 30.0
_UNAUTHORIZED: Final = b'{"error":"unauthorized","detail":"missing or wrong bearer token"}'
_BUSY_BODY: Final = b'{"error":"server_busy","detail":"all workers busy; retry"}'
_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)


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
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    body: bytes,
    query: str = "",
    source_ip: str = "127.0.0.1",
    request_id: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """An HTTP request as a Lambda Function URL event (payload format 2.0).

    Header names are lower-cased and repeated headers (given as ``(name, value)`` pairs) joined with
    commas, as Function URLs do; a body that is not UTF-8 text is base64-encoded with
    ``isBase64Encoded: true``.
    """
    at = now or datetime.now(UTC)
    lowered: dict[str, str] = {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in pairs:
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


class WebhookHTTPServer(HTTPServer):
    """A loopback HTTP server that hands every POST to a Lambda handler as a Function URL event.

    Args:
        address: ``(host, port)``; port 0 picks a free one (see ``server_address``).
        handler: the Lambda handler (``alert_webhook.app.lambda_handler``).
        max_body_bytes: bytes read from a body before the handler sees it; one more than the handler's
            limit is enough for it to answer 413.
        workers: threads serving connections (``SERVE_WORKERS``).
        backlog: accepted connections allowed to wait for a worker (``SERVE_BACKLOG``); more get 503.
        read_timeout_s: seconds one socket read may block (``READ_TIMEOUT_S``).
        request_timeout_s: seconds a request body may take to arrive (``REQUEST_TIMEOUT_S``).
        authenticate: asked with a POST's headers before its body is read (the intake's bearer check);
            ``False`` is answered 401 and the connection closed, body unread. Approval links (authenticated
            by the signed token in their body) are not asked. ``None``: every body is read.
    """

    def __init__(
        self,
        address: tuple[str, int],
        handler: LambdaHandler,
        *,
        max_body_bytes: int,
        workers: int = SERVE_WORKERS,
        backlog: int = SERVE_BACKLOG,
        read_timeout_s: float = READ_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        authenticate: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> None:
        self.lambda_handler = handler
        self.authenticate = authenticate
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s
        self.request_timeout_s = request_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="serve")
        self._slots = threading.BoundedSemaphore(workers + backlog)
        # Request heads in progress (socket -> deadline), cut by one reaper thread when late.
        self._heads: dict[socket.socket, float] = {}
        self._heads_lock = threading.Lock()
        self._closing = threading.Event()
        super().__init__(address, _WebhookRequestHandler)
        self._reaper = threading.Thread(target=self._reap, name="serve-heads", daemon=True)
        self._reaper.start()

    def head_started(self, connection: socket.socket) -> None:
        """A request head begins on ``connection``: it must be whole within ``request_timeout_s``."""
        with self._heads_lock:
            self._heads[connection] = time.monotonic() + self.request_timeout_s

    def head_done(self, connection: socket.socket) -> None:
        """The head of ``connection``'s request arrived (or the request ended)."""
        with self._heads_lock:
            self._heads.pop(connection, None)

    def _reap(self) -> None:
        # A head trickled in a byte at a time (each read within the read timeout) would hold a worker for
        # ever: past its deadline the socket is shut down, and the worker's blocked read ends.
        tick = max(0.05, min(0.5, self.request_timeout_s / 4))
        while not self._closing.wait(tick):
            now = time.monotonic()
            with self._heads_lock:
                late = [c for c, deadline in self._heads.items() if deadline < now]
                for connection in late:
                    del self._heads[connection]
            for connection in late:
                log.warning("serve: a request head arrived too slowly; connection closed")
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>/``."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"

    def process_request(self, request: Any, client_address: Any) -> None:
        """Queue the connection for the pool, or answer 503 and close it when pool and backlog are full."""
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            self._pool.submit(self._serve, request, client_address)
        except RuntimeError:  # the pool is shut down: the server is closing
            self._slots.release()
            self.shutdown_request(request)

    def _refuse(self, request: Any) -> None:
        """503 and close, on the accepting thread, in at most ~0.1 s whatever the client does."""
        try:
            request.settimeout(0.05)
            request.sendall(_BUSY)
            request.shutdown(socket.SHUT_WR)
            # Read what the client already sent (at most 64 KiB): closing with unread data sends a TCP
            # reset, which can destroy the 503 before the client reads it.
            for _ in range(16):
                if not request.recv(4096):
                    break
        except OSError:
            pass
        finally:
            request.close()

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except (TimeoutError, ConnectionError):
            log.debug("serve: connection from %s closed (timeout or reset)", client_address[0])
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def server_close(self) -> None:
        """Stop accepting, then stop the workers (connections in progress are cut at their next read)."""
        self._closing.set()
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class _WebhookRequestHandler(BaseHTTPRequestHandler):
    server: WebhookHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: Alertmanager (and the benchmark) reuse connections
    # Headers and body leave in two writes; with Nagle on, the second waits for the peer's delayed ACK
    # (40 ms on Linux) on every keep-alive response.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        # Every read and write of this connection is bounded: a stalled peer is closed, never waited on.
        self.connection.settimeout(self.server.read_timeout_s)

    def handle_one_request(self) -> None:
        # The request line and headers must arrive whole within request_timeout_s (the server's reaper
        # cuts a late head); the body has its own deadline (_read_body).
        self.server.head_started(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.head_done(self.connection)

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers
        self.server.head_done(self.connection)
        return parsed

    def _read_body(self, length: int) -> bytes | None:
        """Up to ``length`` bytes of body within ``request_timeout_s``; None when the sender stalled."""
        deadline = time.monotonic() + self.server.request_timeout_s
        chunks: list[bytes] = []
        left = length
        try:
            while left > 0:
                if time.monotonic() > deadline:
                    return None
                chunk = self.rfile.read1(min(left, 65536))
                if not chunk:
                    return None
                chunks.append(chunk)
                left -= len(chunk)
        except TimeoutError:
            return None
        return b"".join(chunks)

    def do_POST(self) -> None:
        if len(self.headers.get_all("Authorization") or []) > 1:
            # One request, one credential: which of two counts would depend on who parses (issue 14).
            self._reply(
                400,
                {"content-type": "application/json"},
                b'{"error":"duplicate_authorization","detail":"more than one Authorization header"}',
                close=True,
            )
            return
        if (
            self.server.authenticate is not None
            and self.path.partition("?")[0].rstrip("/") != APPROVAL_PATH
            and not self.server.authenticate({k.lower(): v for k, v in self.headers.items()})
        ):
            # Before the body: a sender without the token never holds a worker while it trickles one in.
            self._reply(401, {"content-type": "application/json"}, _UNAUTHORIZED, close=True)
            self._discard_sent()
            return
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            self._reply(411, {"content-type": "application/json"}, b'{"error":"length_required"}', close=True)
            return
        length = int(length_header)
        # Never hold more than the limit (+1 so the handler sees the body is too big and says 413).
        body = self._read_body(min(length, self.server.max_body_bytes + 1))
        if body is None:
            log.warning("serve: %s sent its body too slowly; connection closed", self.address_string())
            self.close_connection = True
            return
        unread = length - len(body)
        close = unread > 0
        if 0 < unread <= _DRAIN_LIMIT and self._read_body(unread) is None:
            self.close_connection = True
            return
        self._forward("POST", body, close)

    def _discard_sent(self) -> None:
        """Read what the client already sent (at most 64 KiB, never waiting for more), so closing does not
        send a TCP reset that could destroy the answer before the client reads it."""
        try:
            self.wfile.flush()
            self.connection.setblocking(False)
            for _ in range(16):
                if not self.rfile.read1(4096):
                    break
        except (OSError, ValueError, TypeError):  # nothing more buffered (BlockingIOError), or closed
            pass

    def _forward(self, method: str, body: bytes, close: bool) -> None:
        path, _, query = self.path.partition("?")
        request_id = str(uuid.uuid4())
        event = function_url_event(
            method=method,
            path=path,
            query=query,
            headers=list(self.headers.items()),
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
        if self.path.partition("?")[0].rstrip("/") == APPROVAL_PATH:  # an approval link's confirm page
            self._forward("GET", b"", False)
            return
        self._not_allowed()

    def _not_allowed(self) -> None:
        self._reply(
            405, {"allow": "POST", "content-type": "application/json"}, b'{"error":"method_not_allowed"}'
        )

    do_PUT = do_DELETE = do_PATCH = _not_allowed

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
        # The access line names the request line: an approval link's ?token= is a credential (issue 26).
        log.debug("serve: %s - %s", self.address_string(), redact_url(format % args))


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
    return WebhookHTTPServer(
        ("127.0.0.1", port), handler, max_body_bytes=MAX_BODY_BYTES, authenticate=intake.authenticates
    )
