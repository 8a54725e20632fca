"""Kubernetes resource quantities (``"3920m"``, ``"16Gi"``, ``"1.5"``) as numbers.

The official client has ``kubernetes.utils.parse_quantity``, but the domain layer must not import SDKs
(import contract), so the few lines of the Kubernetes quantity grammar we need live here.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from functools import lru_cache

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}  # fmt: skip


@lru_cache(maxsize=4096)
def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity into a Decimal in base units.

    Raises:
        ValueError: when ``value`` is not a quantity (Kubernetes API ``resource.Quantity`` grammar).
    """
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = str(value).strip()
    suffix = ""
    for candidate in _BINARY:
        if text.endswith(candidate):
            suffix = candidate
            break
    else:
        if text and text[-1] in _DECIMAL and not text[-1].isdigit():
            suffix = text[-1]
        elif "e" in text.lower():
            suffix = ""
    number = text[: len(text) - len(suffix)] if suffix else text
    try:
        base = Decimal(number)
    except InvalidOperation as exc:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from exc
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    return base * _DECIMAL[suffix]


def parse_cpu_millis(value: str | int | float) -> int:
    """CPU quantity in millicores (``"3920m"`` → 3920, ``"2"`` → 2000)."""
    return int(parse_quantity(value) * 1000)


def parse_memory_mib(value: str | int | float) -> float:
    """Memory quantity in MiB (``"16Gi"`` → 16384.0)."""
    return float(parse_quantity(value) / (2**20))


@lru_cache(maxsize=4096)
def parse_count(value: str | int | float | None) -> int:
    """An extended-resource count such as ``nvidia.com/gpu: "8"``; missing or invalid ⇒ 0."""
    if value is None:
        return 0
    try:
        return int(parse_quantity(value))
    except ValueError:
        return 0
