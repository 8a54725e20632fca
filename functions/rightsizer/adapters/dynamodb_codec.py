"""DynamoDB attribute encoding for the state table (DynamoDB API ``AttributeValue`` shapes).

Strings ``S``, numbers ``N`` (integers; money as USD per hour, exact decimal of the float's shortest repr),
booleans ``BOOL``; times as fixed-width ISO 8601 UTC strings (so they sort chronologically) or as exact
epoch seconds with microseconds (``"1796135700.000000"``, for TTL-style comparisons).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

    Item = dict[str, AttributeValueTypeDef]

__all__ = [
    "attr_b",
    "attr_money",
    "attr_n",
    "attr_s",
    "epoch_text",
    "from_epoch_text",
    "get_int",
    "get_s",
    "get_time",
    "iso",
    "opt_float",
    "opt_s",
    "opt_time",
    "placeholders",
]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO: Final = timedelta(microseconds=1)


def attr_s(value: str) -> AttributeValueTypeDef:
    """A string attribute ``{"S": value}``."""
    return {"S": value}


def attr_n(value: int | Decimal) -> AttributeValueTypeDef:
    """A number attribute ``{"N": str(value)}``."""
    return {"N": str(value)}


def attr_b(value: bool) -> AttributeValueTypeDef:
    """A boolean attribute ``{"BOOL": value}``."""
    return {"BOOL": value}


def iso(value: datetime) -> str:
    """``value`` as fixed-width ISO 8601 UTC with microseconds and ``Z``."""
    # Fixed width with microseconds: strings sort chronologically (the ledger's gsi1sk relies on it).
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def epoch_text(value: datetime) -> str:
    """``value`` as exact epoch seconds with six decimals (microseconds)."""
    # Exact microseconds as a decimal string; a float would round and break `expires_at <= now`.
    micros = (value - _EPOCH) // _MICRO
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), 1_000_000)
    return f"{sign}{whole}.{frac:06d}"


def from_epoch_text(text: str) -> datetime:
    """The UTC datetime of an :func:`epoch_text` string."""
    return _EPOCH + _MICRO * int(Decimal(text).scaleb(6))


def attr_money(value: float | None) -> AttributeValueTypeDef | None:
    """A USD-per-hour amount as a number attribute, or ``None``."""
    # str(float) is the shortest round-tripping repr, so float(Decimal(str(x))) == x.
    return None if value is None else {"N": str(Decimal(str(value)))}


def get_s(item: Item, name: str) -> str:
    """The string attribute ``name`` of ``item`` (KeyError when absent)."""
    return item[name]["S"]


def opt_s(item: Item, name: str) -> str | None:
    """The string attribute ``name`` of ``item``, or ``None``."""
    value = item.get(name)
    return None if value is None else value["S"]


def get_int(item: Item, name: str) -> int:
    """The number attribute ``name`` of ``item`` as an int (KeyError when absent)."""
    return int(item[name]["N"])


def opt_int(item: Item, name: str) -> int | None:
    """The number attribute ``name`` of ``item`` as an int, or ``None``."""
    value = item.get(name)
    return None if value is None else int(value["N"])


def opt_float(item: Item, name: str) -> float | None:
    """The number attribute ``name`` of ``item`` as a float, or ``None``."""
    value = item.get(name)
    return None if value is None else float(Decimal(value["N"]))


def get_time(item: Item, name: str) -> datetime:
    """The ISO 8601 attribute ``name`` of ``item`` as a datetime (KeyError when absent)."""
    return datetime.fromisoformat(item[name]["S"])


def opt_time(item: Item, name: str) -> datetime | None:
    """The ISO 8601 attribute ``name`` of ``item`` as a datetime, or ``None``."""
    value = item.get(name)
    return None if value is None else datetime.fromisoformat(value["S"])


def placeholders(*attributes: str) -> dict[str, str]:
    """Expression attribute names ``{"#name": name}`` for ``attributes``."""
    # Every attribute goes through a placeholder: several of ours (owner, node, cluster, ttl, min, max)
    # are DynamoDB reserved words or may become one.
    return {f"#{name}": name for name in attributes}
