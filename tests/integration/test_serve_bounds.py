"""Issue 14 item 4: ``rightsizer serve`` over real sockets — one credential per request, bounded workers,
stalled and trickling connections closed.

Raw sockets, because an HTTP client would never send two ``Authorization`` headers or stop mid-request.
The server is the ``serve`` server (:class:`WebhookHTTPServer`) around the webhook's Lambda handler body,
with short timeouts so a stall is seen in about a second.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from rightsizer.adapters.memory_state import MemoryState
from rightsizer.localserve import WebhookHTTPServer
from rightsizer.services.webhook import MAX_BODY_BYTES, MemoryDuplicateGuard, WebhookIntake
from rightsizer.webhook_handler import function_url_handler
from tests.unit.test_webhook import TOKEN, RecordingStarter, alert, payload

pytestmark = pytest.mark.integration

READ_TIMEOUT = 0.5
REQUEST_TIMEOUT = 1.0
BODY = json.dumps(payload(alert("firing", "gpu-1", "fp-1"))).encode()

Serve = Callable[..., tuple[WebhookHTTPServer, RecordingStarter]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    servers: list[tuple[WebhookHTTPServer, threading.Thread]] = []

    def start(**kwargs: int | float) -> tuple[WebhookHTTPServer, RecordingStarter]:
        starter = RecordingStarter()
        intake = WebhookIntake(
            token=TOKEN, starter=starter, leases=MemoryState("c"), guard=MemoryDuplicateGuard()
        )
        options = {"read_timeout_s": READ_TIMEOUT, "request_timeout_s": REQUEST_TIMEOUT, **kwargs}
        server = WebhookHTTPServer(
            ("127.0.0.1", 0),
            function_url_handler(lambda: intake),
            max_body_bytes=MAX_BODY_BYTES,
            authenticate=intake.authenticates,  # as build_webhook_server wires it
            **options,
        )
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        return server, starter

    yield start
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(5)


def connect(server: WebhookHTTPServer) -> socket.socket:
    sock = socket.create_connection(server.server_address[:2], timeout=10)
    return sock


def request(headers: list[tuple[str, str]], body: bytes = BODY) -> bytes:
    lines = ["POST /alertmanager HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def answer(sock: socket.socket) -> tuple[int, dict[str, object]]:
    """Status and JSON body of one response (Content-Length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), json.loads(rest[:length])


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (recv returned b"" or reset), or None if it did not."""
    sock.settimeout(seconds)
    started = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


GOOD = ("Authorization", f"Bearer {TOKEN}")


@pytest.mark.parametrize(
    "auth",
    [
        [GOOD, GOOD],
        [GOOD, ("Authorization", "Bearer wrong")],
        [("Authorization", "Bearer wrong"), GOOD],
        [GOOD, ("authorization", f"Bearer {TOKEN}")],
        [("AUTHORIZATION", "Bearer wrong"), ("authorization", f"Bearer {TOKEN}"), GOOD],
    ],
)
def test_two_authorization_headers_are_400_and_nothing_starts(
    serve: Serve, auth: list[tuple[str, str]]
) -> None:
    server, starter = serve()
    with connect(server) as sock:
        sock.sendall(request([*auth, ("Content-Type", "application/json")]))
        status, body = answer(sock)
    assert (status, body["error"]) == (400, "duplicate_authorization")
    assert starter.requests == []
    # one header still works
    with connect(server) as sock:
        sock.sendall(request([GOOD]))
        assert answer(sock)[0] == 202
    assert starter.nodes == ["gpu-1"]


@pytest.mark.parametrize(
    ("sent", "what"),
    [
        (b"", "nothing at all"),
        (b"POST /alertmanager HTTP/1.1\r\n", "a request line"),
        (b"POST /alertmanager HTTP/1.1\r\nHost: x\r\nContent-Le", "half the headers"),
        (request([GOOD])[:-10], "all but the last 10 bytes of the body"),
    ],
)
def test_a_stalled_connection_is_closed(serve: Serve, sent: bytes, what: str) -> None:
    server, starter = serve()
    with connect(server) as sock:
        sock.sendall(sent)
        waited = closed_within(sock, 5.0)
    assert waited is not None, f"still open after 5 s with {what}"
    assert waited < READ_TIMEOUT + 1.5
    assert starter.requests == []


def test_an_idle_keep_alive_connection_is_closed(serve: Serve) -> None:
    server, _ = serve()
    with connect(server) as sock:
        sock.sendall(request([GOOD]))
        assert answer(sock)[0] == 202
        waited = closed_within(sock, 5.0)
    assert waited is not None and waited < READ_TIMEOUT + 1.5


def test_a_trickling_body_is_cut_off_at_the_request_timeout(serve: Serve) -> None:
    # Each byte arrives within the read timeout, so only the request deadline can stop it.
    server, starter = serve()
    data = request([GOOD])
    head_len = data.index(b"\r\n\r\n") + 4
    with connect(server) as sock:
        sock.sendall(data[:head_len])
        started = time.monotonic()
        closed = False
        for byte in data[head_len:]:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(READ_TIMEOUT / 3)
            if time.monotonic() - started > REQUEST_TIMEOUT + 3:
                break
        if not closed:
            closed = closed_within(sock, 1.0) is not None
    assert closed
    assert time.monotonic() - started < REQUEST_TIMEOUT + 3
    assert starter.requests == []


def test_workers_are_bounded_and_the_overflow_is_503(serve: Serve) -> None:
    # GIVEN 2 workers and 2 waiting places, and 12 clients that connect and stall
    # (a read timeout long enough that the stalled four hold their places while the rest are counted)
    # (the head deadline longer than that: here only the read timeout frees a place)
    server, starter = serve(workers=2, backlog=2, read_timeout_s=2.0, request_timeout_s=5.0)
    before = threading.active_count()
    stalled = []
    for _ in range(12):
        sock = connect(server)
        sock.sendall(b"POST /alertmanager HTTP/1.1\r\n")  # and nothing more
        stalled.append(sock)
    time.sleep(0.2)

    # THEN at most 2 threads serve them, the 8 beyond workers + backlog are told 503 at once
    assert threading.active_count() - before <= 2
    busy = 0
    for sock in stalled[4:]:
        status, body = answer(sock)
        busy += (status, body["error"]) == (503, "server_busy")
    assert busy == 8

    # AND once the stalled ones time out (two rounds of 2 s: two wait in the backlog), a delivery is served
    time.sleep(4.5)
    for sock in stalled:
        sock.close()
    with connect(server) as sock:
        sock.sendall(request([GOOD]))
        assert answer(sock)[0] == 202
    assert starter.nodes == ["gpu-1"]
    assert threading.active_count() - before <= 2


@pytest.mark.parametrize(
    "auth",
    [[], [("Authorization", "Bearer wrong")], [("Authorization", f"Basic {TOKEN}")], [("X-Token", TOKEN)]],
)
def test_many_stalled_unauthenticated_senders_never_keep_a_valid_delivery_out(
    serve: Serve, auth: list[tuple[str, str]]
) -> None:
    # Issue 26: 40 connections that sent headers without the token and stalled in their body made serve
    # answer 503 to a valid delivery (it read bodies before checking the token). Now the token is checked
    # first: each is answered 401 and closed at once, its body never waited for.
    # GIVEN the default pool (8 workers, 32 waiting) and 40 stalled senders without the token
    server, starter = serve(read_timeout_s=5.0, request_timeout_s=10.0)
    stalled = []
    for _ in range(40):
        sock = connect(server)
        sock.sendall(request(auth)[:-10])  # whole headers, all but the last 10 bytes of the body
        stalled.append(sock)

    # WHEN a valid delivery arrives right after them (retried on 503, as Alertmanager retries)
    started = time.monotonic()
    status = 0
    while status != 202 and time.monotonic() - started < 2.0:
        with connect(server) as sock:
            sock.sendall(request([GOOD]))
            status, _ = answer(sock)

    # THEN it is served within a second or two (it waited for the stalled ones' 30 s before), and every
    # stalled sender was refused without its body being read
    assert status == 202 and time.monotonic() - started < 2.0
    assert starter.nodes == ["gpu-1"]
    for sock in stalled:
        assert answer(sock)[0] == 401
        assert closed_within(sock, 2.0) is not None
        sock.close()


def test_an_approval_link_is_still_read_without_a_bearer_token(serve: Serve) -> None:
    # Approval links are authenticated by the signed token in their body, never by a bearer token:
    # the pre-body check leaves /approval to the handler (which answers 404 here: no approvals served).
    server, _ = serve()
    body = b"token=abc"
    head = (
        "POST /approval HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with connect(server) as sock:
        sock.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
    assert data.split(b" ", 2)[1] == b"404"


def test_a_trickling_request_head_is_cut_off_at_the_request_timeout(serve: Serve) -> None:
    # A slow-headers sender (every byte within the read timeout, so only a deadline can stop it) would
    # hold a worker for as long as it likes: the head must arrive whole within the request timeout.
    server, starter = serve()
    head = request([GOOD])
    head = head[: head.index(b"\r\n\r\n")]
    with connect(server) as sock:
        started = time.monotonic()
        closed = False
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(READ_TIMEOUT / 3)
            if time.monotonic() - started > REQUEST_TIMEOUT + 3:
                break
        if not closed:
            closed = closed_within(sock, 1.0) is not None
    assert closed
    assert time.monotonic() - started < REQUEST_TIMEOUT + 3
    assert starter.requests == []
