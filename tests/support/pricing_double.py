"""A Price List Query API double over real HTTP: ``GetProducts`` answered from recorded products.

moto (5.2) does not implement the ``pricing`` service, so this serves the AWS JSON 1.1 protocol that boto3
speaks (``POST /`` with ``X-Amz-Target: AWSPriceListService.GetProducts``) from
``tests/fixtures/pricing/ec2-offers.json`` (real products, see its PROVENANCE.md), with the API's semantics:
every ``TERM_MATCH`` filter must match (``ServiceCode``/``productFamily`` on the product, any other field
on its attributes), answers come in pages of ``MaxResults`` (at most 100) with a ``NextToken``, and each
``PriceList`` entry is a JSON string. ``deny`` answers every call as IAM would without the grant
(HTTP 400 ``AccessDeniedException``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

OFFERS = Path(__file__).resolve().parents[1] / "fixtures" / "pricing" / "ec2-offers.json"


def load_offers() -> list[dict[str, Any]]:
    """The recorded products (decoded PriceList entries)."""
    loaded: list[dict[str, Any]] = json.loads(OFFERS.read_text(encoding="utf-8"))
    return loaded


def _value(product: Mapping[str, Any], field: str) -> Any:
    if field.lower() == "servicecode":
        return product.get("serviceCode")
    if field == "productFamily":
        return product["product"].get("productFamily")
    return product["product"]["attributes"].get(field)


class PricingDouble:
    """``GetProducts`` on ``http://127.0.0.1:<port>``; ``requests`` records each call's parameters."""

    def __init__(self, products: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.products = list(products if products is not None else load_offers())
        self.requests: list[dict[str, Any]] = []
        self.deny = False
        #: The most products one page holds (AWS may answer fewer than ``MaxResults``): tests page with it.
        self.max_page = 100
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Silent: tests read ``PricingDouble.requests`` instead."""

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                target = self.headers.get("X-Amz-Target", "")
                status, answer = double.answer(target, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def answer(self, target: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) for one request."""
        if target != "AWSPriceListService.GetProducts":
            return 400, {"__type": "UnknownOperationException", "message": target}
        self.requests.append(dict(body))
        if self.deny:
            return 400, {
                "__type": "AccessDeniedException",
                "Message": "User is not authorized to perform: pricing:GetProducts",
            }
        filters = body.get("Filters", [])
        if any(f.get("Type") != "TERM_MATCH" for f in filters):
            return 400, {"__type": "InvalidParameterException", "Message": "only TERM_MATCH is recorded"}
        matched = [
            p
            for p in self.products
            if p.get("serviceCode") == body.get("ServiceCode")
            and all(_value(p, f["Field"]) == f["Value"] for f in filters)
        ]
        size = min(int(body.get("MaxResults", 100)), self.max_page)
        start = int(body.get("NextToken", "0"))
        page = matched[start : start + size]
        answer: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in page]}
        if start + size < len(matched):
            answer["NextToken"] = str(start + size)
        return 200, answer

    def start(self) -> PricingDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def pricing_double(products: Sequence[Mapping[str, Any]] | None = None) -> Iterator[PricingDouble]:
    """A started :class:`PricingDouble`, stopped on exit."""
    double = PricingDouble(products).start()
    try:
        yield double
    finally:
        double.stop()
