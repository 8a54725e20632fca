"""Go's ``time.ParseDuration``, for annotations other tools parse with it (``karpenter.sh/do-not-disrupt``).

Source: the Go standard library, ``time/format.go`` ``ParseDuration``: an optional sign, then one or more
``<number><unit>`` pairs; numbers may have a fraction (``1.5h``, ``.5s``, ``1.s``); units ``ns``, ``us``
(``µs``, ``μs``), ``ms``, ``s``, ``m``, ``h``; the lone string ``0`` needs no unit. Days, bare numbers and
spaces are errors.
"""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)([^0-9.]+)")


def parse_go_duration(text: str) -> float:
    """Seconds of a Go duration string (may be negative or zero).

    Raises:
        ValueError: the text is not a Go duration (e.g. ``"1d"``, ``"10"``, ``""``, ``"1 h"``).
    """
    body, sign = text, 1.0
    if body[:1] in ("+", "-"):
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"{text!r} is not a Go duration")
    total, pos = 0.0, 0
    while pos < len(body):
        match = _PART.match(body, pos)
        if match is None or match.group(1) in ("", ".") or match.group(2) not in _UNITS:
            raise ValueError(f"{text!r} is not a Go duration (units ns, us, ms, s, m, h)")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return sign * total
