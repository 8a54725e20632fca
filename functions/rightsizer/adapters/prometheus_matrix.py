"""``query_range`` answers of the live path, decoded straight into compact series and fed to the reducer.

The live path (``collect_live``) reads ~8 series per GPU per cycle (14 answers, 132,000 series and
35.5 MiB of JSON at 2,000 nodes × 8 GPUs; 146,000 and 38.5 MiB when each GPU's samples were counted
too, the figures below). Decoding them into dicts with the standard library and then
turning every label dict into a hashable key cost more client CPU than Prometheus spent answering most
of the queries. Here msgspec (a maintained, typed JSON decoder) decodes each answer into small structs
whose ``metric`` stays the raw JSON bytes of the label set: the same label set recurs in every answer,
so it is parsed and joined to its node once per collection and found again by a bytes lookup.
Measured on the same captured answers of 2,000 nodes (``benchmarks/collect_scale.py``, min of 5 runs on
a shared machine): decode 0.75 s (stdlib json) → 0.25 s; decode and feed 1.9 → 1.2 s. Step answers
without gaps (nearly all) are written into the reducer's per-step arrays as one slice. The reducer then
takes each answer whole (``ObservationReducer.add_many``: the work per series is chosen once per
answer, a one-point series needs no unzipping); with the reducer's own cuts, the 14 answers of 2,000
nodes cost 4.96 → 3.96 G instructions to decode and feed and 1.65 → 0.91 G to finish (valgrind, same
captured answers), 2.3 → 1.6 client CPU-s per collection measured per query against Prometheus.

Points are (Unix s, value); Prometheus writes values as strings (``"0"``, ``"1.5e3"``, ``"NaN"``,
``"+Inf"``, ``"-Inf"``), read as floats.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar, cast

import msgspec

from rightsizer.domain.observation_signals import ObservationReducer, Resolved, Row

V = TypeVar("V", float, str)


class _Series(msgspec.Struct, Generic[V], gc=False):
    """One series: its label set as raw JSON bytes, its points (Unix s, value)."""

    metric: msgspec.Raw = msgspec.Raw(b"{}")
    values: list[tuple[float, V]] = []


class _Timings(msgspec.Struct, gc=False):
    evalTotalTime: float = 0.0


class _Stats(msgspec.Struct, gc=False):
    timings: _Timings | None = None


class _Data(msgspec.Struct, Generic[V], gc=False):
    resultType: str = ""
    result: list[_Series[V]] | None = None
    stats: _Stats | None = None


class MatrixAnswer(msgspec.Struct, Generic[V], gc=False):
    """A ``query_range`` answer: ``status``, ``data`` (``resultType``, ``result``, ``stats``),
    ``warnings``; unknown fields are ignored. Values are floats (``V`` = float) or, for an answer
    holding ``"+Inf"``, the strings Prometheus sent (``V`` = str)."""

    status: str = ""
    data: _Data[V] | None = None
    warnings: list[str] | None = None

    @property
    def engine_seconds(self) -> float:
        """``data.stats.timings.evalTotalTime`` (sent with ``stats=all``), else 0."""
        stats = self.data.stats if self.data else None
        return stats.timings.evalTotalTime if stats and stats.timings else 0.0

    def envelope(self) -> dict[str, Any]:
        """The answer's envelope as the JSON API shapes it (``status``, ``warnings``, ``data.resultType``,
        ``data.result``), for ``answer_problem``; the series stay the decoded structs."""
        out: dict[str, Any] = {"status": self.status}
        if self.warnings:
            out["warnings"] = self.warnings
        if self.data is not None:
            out["data"] = {"resultType": self.data.resultType, "result": self.data.result}
        return out


# Lax decoding reads Prometheus' value strings ("0", "1.5e3", "NaN", "-Inf") as floats in C, except
# "+Inf", which it refuses: an answer holding one is decoded again with the values kept as text.
_FLOATS = msgspec.json.Decoder(MatrixAnswer[float], strict=False)
_TEXT = msgspec.json.Decoder(MatrixAnswer[str])
_LABELS = msgspec.json.Decoder()


def decode(content: bytes) -> MatrixAnswer[float] | MatrixAnswer[str]:
    """Decode a ``query_range`` answer.

    Raises:
        ValueError: not JSON, or not shaped like the API's answer (``msgspec.DecodeError`` is one).
    """
    try:
        return _FLOATS.decode(content)
    except msgspec.ValidationError:
        return _TEXT.decode(content)


class MatrixFeeder:
    """Feeds decoded answers to one ``ObservationReducer``, resolving each distinct label set once.

    Args:
        reducer: the collection's reducer (per-device facts; see ``domain.observation_signals``).
    """

    def __init__(self, reducer: ObservationReducer) -> None:
        self._reducer = reducer
        self._resolved: dict[bytes, Resolved] = {}

    def feed(self, kind: str, metric: str, answer: MatrixAnswer[float] | MatrixAnswer[str]) -> None:
        """Hand every series of ``answer`` (a usable matrix: see ``answer_problem``) to the reducer as
        (``kind``, ``metric``); no per-series object outlives this call.

        Raises:
            ValueError: a label set that is no JSON object, or a value that is no number.
        """
        result = answer.data.result if answer.data else None
        if result:
            self._reducer.add_many(kind, metric, self._rows(result))

    def _rows(self, result: list[_Series[float]] | list[_Series[str]]) -> Iterator[Row]:
        resolved = self._resolved
        for series in result:
            raw = bytes(series.metric)
            known = resolved.get(raw)
            if known is None:
                labels = _LABELS.decode(raw)
                if not isinstance(labels, dict):
                    raise ValueError(f"series labels are not an object: {raw[:80]!r}")
                known = resolved[raw] = self._reducer.resolve(labels)
            points = series.values
            if len(points) == 1:  # the answers read at the window's end only: one point per series
                ((t, v),) = points
                times: Sequence[float] = (t,)
                values: Sequence[float | str] = (v,)
            elif points:
                times, values = zip(*points, strict=True)
            else:
                continue
            if type(values[0]) is str:  # an answer holding "+Inf": the values came as text
                yield known, times, tuple(map(float, values))
            else:
                yield known, times, cast("Sequence[float]", values)
