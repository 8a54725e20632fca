"""Answers travel uncompressed from a self-hosted Prometheus and decode to the same facts (issue 11:
Prometheus CPU is the cluster's scarce resource), on a real Prometheus 2.x behind a recording proxy.

The proxy forwards bytes verbatim (``http.client``: no decoding), so it sees the ``Accept-Encoding`` the
client really sends and the ``Content-Encoding`` Prometheus really answers with.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import pytest

from rightsizer.adapters.prometheus import build_client, collect_live
from rightsizer.domain.join import NodeJoiner
from rightsizer.domain.policy import Policy
from rightsizer.domain.usage import Window
from tests.builders import AT, snapshot
from tests.integration.test_observe_interval import Families, add_node
from tests.support.http_serve import serving

pytest_plugins = ["tests.support.prometheus_server"]
pytestmark = pytest.mark.integration

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host"}


@dataclass
class Exchange:
    accept_encoding: str
    content_encoding: str
    wire_bytes: int


@dataclass
class Recording:
    exchanges: list[Exchange] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture(scope="module")
def server(prometheus_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.support.prometheus_server import openmetrics_lines, start_prometheus

    families: Families = {}
    nodes = [add_node(families, f"gpu-{i}", i, 15.0) for i in range(1, 7)]

    def write(path: Any) -> None:
        with path.open("w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in openmetrics_lines(families))

    prom = start_prometheus(prometheus_binaries, tmp_path_factory.mktemp("encoding"), write_openmetrics=write)
    yield prom, snapshot(nodes, [], {})
    prom.stop()


@pytest.fixture
def proxy(server: Any) -> Iterator[tuple[str, Recording]]:
    prom, _ = server
    upstream = urlsplit(prom.url)
    recording = Recording()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
            try:
                conn.request("POST", self.path, body=body, headers=headers)
                answer = conn.getresponse()
                raw = answer.read()  # http.client never decodes a Content-Encoding
                with recording.lock:
                    recording.exchanges.append(
                        Exchange(
                            self.headers.get("Accept-Encoding", ""),
                            answer.getheader("Content-Encoding") or "",
                            len(raw),
                        )
                    )
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
            finally:
                conn.close()

        def log_message(self, *_args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url, recording


def test_a_self_hosted_prometheus_answers_uncompressed_and_the_facts_are_those_of_gzip(
    server: Any, proxy: tuple[str, Recording]
) -> None:
    _, base = server
    url, recording = proxy
    policy = Policy()
    window = Window.ending(AT, policy.idle_window, 60)
    joiner = NodeJoiner(base.nodes, base.pods, "node")
    collected = {}
    # WHEN the live path reads the same fleet as config prometheus builds the client: auto for a plain
    # Prometheus, and gzip forced (what AMP gets)
    for compression in ("auto", "gzip"):
        with build_client(url, compression=compression, stats=True) as client:
            collected[compression] = collect_live(client, joiner, window, policy, "node")
            decoded = client.stats.response_bytes
        seen = list(recording.exchanges)
        recording.exchanges.clear()
        # THEN every request asked for the encoding meant, and Prometheus answered in it
        expected = ("identity", "") if compression == "auto" else ("gzip", "gzip")
        assert {(e.accept_encoding, e.content_encoding) for e in seen} == {expected}
        wire = sum(e.wire_bytes for e in seen)
        if compression == "auto":
            assert wire == decoded  # the bytes Prometheus sent are the answers: nothing compressed
        else:
            assert wire < decoded / 3  # gzip did compress (the JSON of repeated labels shrinks ~10×)
    # AND the answers decode to the same facts either way
    assert collected["auto"] == collected["gzip"]
    assert sum(len(d) for d in collected["auto"].devices.values()) == 6
