"""How a recipe key is declared and read: its default and checks, its type, and the table it sits in.

The generic half of `workbench.train.recipe`: a key is a dataclass field made by `declared(default, *checks)`;
`typed` reads a TOML value as the field's annotated type (an int where a float is declared becomes that float),
`check_keys` runs every field's own checks, `plain` and `finite` turn a recipe into the dict recipe.toml
records and refuse a non-finite number. What the keys are, and the checks that read several keys, are the
recipe's own (`workbench.train.recipe`).
"""

from __future__ import annotations

import math
import typing
from dataclasses import field, fields, is_dataclass

from workbench.errors import WorkbenchError


def within(low, high, low_ok: bool = True):
    """A check: the value lies in [low, high] (in (low, high] when `low_ok` is False)."""
    def check(key: str, value) -> None:
        if not (low <= value <= high) or (value == low and not low_ok):
            raise WorkbenchError(f"recipe key '{key}' = {value} must lie in {'[' if low_ok else '('}{low}, {high}]")
    return check


def at_least(low: int):
    """A check: the count is `low` or more."""
    def check(key: str, value) -> None:
        if value < low:
            raise WorkbenchError(f"recipe key '{key}' = {value} must be >= {low}")
    return check


def above(low: float, strict: bool = False):
    """A check: the number is finite and at least `low` (above it when `strict`)."""
    def check(key: str, value) -> None:
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise WorkbenchError(f"recipe key '{key}' = {value} must be a finite number {'>' if strict else '>='} "
                                 f"{low:g}")
    return check


def one_of(*accepted: str):
    """A check: the value (or each item of a list) is one of `accepted`."""
    def check(key: str, value) -> None:
        for v in value if isinstance(value, list) else [value]:
            if v not in accepted:
                raise WorkbenchError(f"recipe key '{key}' = '{v}' is not accepted; accepted: {', '.join(accepted)}")
    return check


def declared(default, *checks):
    """A recipe key's one declaration: its default (whose annotation is the accepted type) and its checks."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"checks": checks})
    return field(default=default, metadata={"checks": checks})


def table(cls):
    """A table of keys, every key at its default unless the recipe writes it."""
    return field(default_factory=cls)


def type_hints(cls) -> dict:
    return typing.get_type_hints(cls)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def typed(key: str, value, hint):
    """`value` as the annotated type `hint` (an int where a float is declared becomes that float)."""
    if typing.get_origin(hint) is list:
        item = typing.get_args(hint)[0]
        if not isinstance(value, list):
            raise WorkbenchError(f"recipe key '{key}' = {value!r} must be of type list")
        numbers = item in (int, float)   # an int list's items are checked as depths later, with their own message
        if not all(is_number(v) if numbers else isinstance(v, item) for v in value):
            raise WorkbenchError(f"recipe key '{key}' = {value!r} must be a list of "
                                 f"{'numbers' if numbers else item.__name__ + 's'}")
        return list(value)
    if type(None) in typing.get_args(hint):   # an optional list or number
        inner = [h for h in typing.get_args(hint) if h is not type(None)]
        if value is not None and len(inner) == 1 and typing.get_origin(inner[0]) is list:
            return typed(key, value, inner[0])
        if value is None or is_number(value):
            return None if value is None else float(value)
        raise WorkbenchError(f"recipe key '{key}' = {value!r} must be a number")
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is float:
        ok = is_number(value)
        value = float(value) if ok else value
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    if not ok:
        raise WorkbenchError(f"recipe key '{key}' = {value!r} must be of type {hint.__name__}")
    return value


def plain(node):
    if is_dataclass(node):
        return {f.name: plain(getattr(node, f.name)) for f in fields(node) if getattr(node, f.name) is not None}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return node


def finite(node, key: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            finite(v, f"{key}.{k}" if key else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            finite(v, f"{key}.{i}")
    elif isinstance(node, float) and not math.isfinite(node):
        raise WorkbenchError(f"recipe key '{key}' = {node} must be a finite number")


def check_keys(node, prefix: str = "") -> None:
    """Runs every key's own checks (its declaration's range or choices), tables and stages included."""
    for f in fields(node):
        value, full = getattr(node, f.name), prefix + f.name
        if is_dataclass(value):
            check_keys(value, full + ".")
        elif isinstance(value, list) and value and is_dataclass(value[0]):
            for i, item in enumerate(value):
                check_keys(item, f"{full}.{i}.")
        else:
            for check in f.metadata.get("checks", ()):
                check(full, value)
