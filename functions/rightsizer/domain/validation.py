"""Every mistake of a config, policy, timetable or settings document, one line each (issue 27 item 2).

pydantic collects every field error of one validation; this module turns each into a line naming where
(``source``), the key path (``prometheus.timeout``, ``offhours.schedules.nights.0.timezone``), what is wrong
(with the value given) and the fix: the nearest valid key for an unknown one, the bound for a number out of
range, the kind of value expected. :func:`config_error` wraps them in one ``ConfigError`` whose
``problems`` hold them all (``rightsizer validate`` prints every one; other commands the first).
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from rightsizer.domain.errors import ConfigError

__all__ = ["KeyedValueError", "combined", "config_error", "validation_problems"]


class KeyedValueError(ValueError):
    """A model-level check's error blaming one key (``key``, dotted, relative to the model checked):
    pydantic places such errors at the model itself, which for a whole document is no key at all."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _loc(err: Any, field_name: Callable[[str], str] | None) -> list[str]:
    """The error's key path; a :class:`KeyedValueError` from a model-level check adds its key."""
    loc = [str(p) for p in err["loc"]]
    if field_name is not None and loc:
        loc[0] = field_name(loc[0])
    raised = err.get("ctx", {}).get("error")
    if isinstance(raised, KeyedValueError):
        loc += raised.key.split(".")
    return loc


_EXPECTED = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
    "list_type": "a list",
    "tuple_type": "a list",
}
_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (``X``, ``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    if isinstance(annotation, types.UnionType):
        for arg in annotation.__args__:
            found += _models_in(arg)
    return found


def _keys_at(model: type[BaseModel] | None, path: Sequence[int | str]) -> list[str]:
    """The valid keys of the mapping at ``path`` inside ``model`` (empty when not a model there)."""
    current: list[type[BaseModel]] = [model] if model is not None else []
    for part in path:
        if isinstance(part, int) or not current:
            continue  # list index or dict key: same models below
        nxt: list[type[BaseModel]] = []
        for m in current:
            field = m.model_fields.get(str(part))
            if field is not None:
                nxt += _models_in(field.annotation)
        if nxt:
            current = nxt
        elif not any(str(part) in m.model_fields for m in current):
            # a dict key (e.g. a schedule's name): the models stay those of the values below it
            continue
        else:
            return []
    keys: list[str] = []
    for m in current:
        keys += [name for name in m.model_fields if name not in keys]
    return keys


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fix(err: Any, model: type[BaseModel] | None) -> str:
    kind = err["type"]
    loc = err["loc"]
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return f"add {loc[-1]}" if loc else "add the required keys"
    if kind == "extra_forbidden":
        valid = _keys_at(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
        return (
            f"did you mean {close[0]}?"
            if close
            else "remove it" + (f" (keys here: {', '.join(valid)})" if valid else "")
        )
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        bound = ctx.get(key)
        return (
            f"give a value {words} {int(bound) if isinstance(bound, float) and bound.is_integer() else bound}"
        )
    if kind in ("literal_error", "enum"):
        return f"use one of {ctx.get('expected')}"
    if kind in _EXPECTED:
        return f"give {_EXPECTED[kind]}"
    return ""


def validation_problems(
    exc: ValidationError,
    *,
    source: str | None,
    model: type[BaseModel] | None = None,
    prefix: str = "",
    field_name: Callable[[str], str] | None = None,
) -> list[str]:
    """One line per error of ``exc``: ``source: key.path: message (got value); fix``.

    Args:
        exc: the ``ValidationError`` of one ``model_validate``.
        source: the file or parameter validated (None: no prefix).
        model: the model validated, for the valid keys an unknown key is matched against.
        prefix: key path of the validated document inside its file (``policy`` for a config's policy).
        field_name: maps the first key to the name the user wrote (an environment variable).
    """
    lines = []
    for err in exc.errors():
        path = ".".join(p for p in (prefix, *_loc(err, field_name)) if p)
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "model_type":  # pydantic names our model class: the user wrote a JSON/YAML value
            message = f"expected a mapping, got {type(err.get('input')).__name__}"
        if (
            err["type"] not in ("missing", "extra_forbidden")
            and "input" in err
            and not isinstance(err["input"], dict | list)
            and repr(err["input"]) not in message
        ):
            message += f" (got {_shown(err['input'])})"
        fix = _fix(err, model)
        # a whole document of the wrong kind has no key to name: the source names it
        line = (f"{path}: " if path else "") + message + (f"; {fix}" if fix else "")
        lines.append(f"{source}: {line}" if source else line)
    return lines


def config_error(
    exc: ValidationError,
    *,
    source: str | None,
    model: type[BaseModel] | None = None,
    prefix: str = "",
    field_name: Callable[[str], str] | None = None,
) -> ConfigError:
    """A ``ConfigError`` naming the first problem of ``exc``, with every problem in ``problems``."""
    problems = validation_problems(exc, source=source, model=model, prefix=prefix, field_name=field_name)
    first = exc.errors()[0] if exc.errors() else {"loc": ()}
    field = ".".join(p for p in (prefix, *_loc(first, field_name)) if p) or None
    text = problems[0].removeprefix(f"{source}: " if source else "").removeprefix(f"{field}: ")
    if len(problems) > 1:
        text += f" (and {len(problems) - 1} more: rightsizer validate lists them)"
    return ConfigError(text, source=source, field=field, problems=problems)


def combined(errors: Sequence[ConfigError]) -> ConfigError:
    """One ``ConfigError`` for several documents' errors (a config and its policy file; a deployment's
    settings, policy and timetable): the first error's message, every error's ``problems``."""
    if len(errors) == 1:
        return errors[0]
    problems = [line for error in errors for line in error.problems]
    return ConfigError(
        f"{problems[0]} (and {len(problems) - 1} more: rightsizer validate lists them)", problems=problems
    )
