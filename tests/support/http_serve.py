"""A real ``http.server`` on 127.0.0.1 in a daemon thread, for scripted servers and recording proxies."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free port of 127.0.0.1 (one thread a request) until the block ends.

    Yields the base URL (``http://127.0.0.1:<port>``); on exit the server stops and closes its socket.
    """
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def reply(handler: BaseHTTPRequestHandler, status: int, headers: Mapping[str, str], payload: bytes) -> None:
    """Answer the request ``handler`` is serving: ``status``, ``headers``, a ``Content-Length`` and
    ``payload``."""
    handler.send_response(status)
    for key, value in headers.items():
        handler.send_header(key, value)
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)
