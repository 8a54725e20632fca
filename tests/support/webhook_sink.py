"""A local webhook receiver for Alertmanager deliveries: records (Authorization header, JSON payload)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookSink:
    """``http://127.0.0.1:<port>/`` answering 200 to every POST and keeping what it received; a context
    manager that serves while open."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with sink._lock:
                    sink.received.append((self.headers.get("Authorization", ""), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )

    def __enter__(self) -> WebhookSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def alerts(self) -> list[tuple[str, dict[str, Any]]]:
        """(Authorization header, alert) of every alert delivered so far."""
        with self._lock:
            return [(auth, alert) for auth, payload in self.received for alert in payload["alerts"]]

    def nodes(self, status: str = "firing") -> set[str]:
        """The ``node`` label of every delivered alert with ``status`` ("" when it has none)."""
        return {a["labels"].get("node", "") for _, a in self.alerts() if a["status"] == status}
