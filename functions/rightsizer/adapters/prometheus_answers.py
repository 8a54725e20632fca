"""What a Prometheus HTTP API answer says when it cannot be used (BUG-05, BUG-50).

One reading for the live client (``adapters.prometheus``), the snapshot files it writes and the snapshot
loader (``adapters.snapshot_dir``): an answer that is not ``success``, carries ``warnings`` or has another
result type is a *problem* — its metric's nodes are ``unknown`` — and the problem names the error's class
and the warnings' own words (up to 300 characters), so the log says what to change: Thanos partial responses, AMP's refusals by
size or cost (413 "response larger than the max", 422 "the query hit the aggregated data size limit", the
Query Samples Processed error threshold) and its QSP warning (HTTP 200 with a warning; AMP user guide
"Managing the query cost"), instead of an unexplained ``unknown``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["answer_problem", "refusal_answer"]


def answer_problem(answer: Mapping[str, Any], result_type: Literal["vector", "matrix"]) -> str | None:
    """Why an API answer cannot be used, or None: ``status_<s>[: <errorType>]``, ``warnings: <their
    text>``, ``not_a_<type>`` (at most 300 characters).

    Warnings make an answer unusable on purpose: Thanos and AMP use them for partial results and AMP for a
    query over its QSP warning threshold. An error's text is not repeated (it can echo series labels,
    which snapshots do not keep); an HTTP error's text is in the client's exception, which the live path
    logs.
    """
    if answer.get("status") != "success":
        error_type = answer.get("errorType")
        return (f"status_{answer.get('status')}" + (f": {error_type}" if error_type else ""))[:300]
    warnings = answer.get("warnings")
    if warnings:
        texts = warnings if isinstance(warnings, list) else [warnings]
        return ("warnings: " + "; ".join(str(w) for w in texts))[:300]
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") != result_type:
        return f"not_a_{result_type}"
    if not isinstance(data.get("result"), list):
        return f"not_a_{result_type}"
    return None


def refusal_answer(status_code: int, text: str) -> bytes:
    """The ``status: error`` API answer standing for a 4xx refusal without a JSON body (AMP answers 413 as
    text/plain): ``errorType`` ``http_<status>``, ``error`` the body's first 300 characters — so a snapshot
    records it like any error answer and only its metric is unknown."""
    return json.dumps({"status": "error", "errorType": f"http_{status_code}", "error": text[:300]}).encode()
