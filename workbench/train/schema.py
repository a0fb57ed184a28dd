"""How a recipe key is declared and refused: its type and bounds as a pydantic field, and the one-line error.

The generic half of `workbench.train.recipe`. A table is a frozen pydantic dataclass (`table`) that refuses a key it
does not declare (`extra="forbid"`) and a number that is not finite; each key's annotation says what it accepts:

    lr: Real(above=0.0) = 1e-4            # a finite float > 0 (an int is read as that float)
    every: Count(1) = 100                 # an int >= 1, never a bool or a float
    kind: Literal["chain", "park"]        # one of the names
    enabled: Flag = True                  # a bool, never 1 or "true"

`refusal` turns pydantic's first error into the recipe's one-line message: an unknown key names the nearest known
key (the recipe's own `unknown` formatter), a value out of range states the range its field declares.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import fields
from typing import Annotated, Literal

import annotated_types
from pydantic import AfterValidator, ConfigDict, Field, Strict, ValidationError
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from workbench.errors import WorkbenchError

# Strict per key, not per table: a table's own value may be given as a dict (a TOML table), its keys may not be coerced
# ("8" is no int, 1 no bool); a float key still reads an int, as TOML writes `lr = 1`.
CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)
Flag = Annotated[bool, Strict()]
Text = Annotated[str, Strict()]


def Count(low: int | None = None, high: int | None = None):  # noqa: N802 - a type, read as one in the tables
    """An int in [low, high] (either bound may be left open); a bool or a float is refused."""
    return Annotated[int, Strict(), Field(ge=low, le=high)]


def Real(low: float | None = None, high: float | None = None, *, above: float | None = None,  # noqa: N802
         below: float | None = None):
    """A finite float in [low, high], or above `above` / below `below` (open bounds); an int reads as that float."""
    return Annotated[float, Strict(), Field(ge=low, le=high, gt=above, lt=below)]


def Number(low: float | None = None, *, below: float | None = None):  # noqa: N802
    """A list item that is a finite number >= low (below `below`), kept as written: recipe.toml records `[1, 3]`
    as given, where a float key reads 1 as 1.0."""
    return (Annotated[int, Strict(), Field(ge=low, lt=below)]
            | Annotated[float, Strict(), Field(ge=low, lt=below, allow_inf_nan=False)])


def OneOf(names: tuple[str, ...]):  # noqa: N802
    """One of `names`."""
    return Literal[names]


def Registered(names: Callable[[], tuple[str, ...]]):  # noqa: N802
    """One of the names `names()` returns when a value is checked: a registry that modules add to (the stage kinds,
    `workbench.train.kinds`), read then rather than when the table is declared."""
    def check(value: str) -> str:
        accepted = names()
        if value not in accepted:
            raise PydanticCustomError("not_registered", "not a registered name", {"accepted": ", ".join(accepted)})
        return value

    return Annotated[str, Strict(), AfterValidator(check)]


def table(cls):
    """A recipe table: a frozen pydantic dataclass whose keys are checked when it is built (`CONFIG`)."""
    return dataclass(frozen=True, config=CONFIG)(cls)


def default(cls):
    """A table's field default: the table at every key's default (a fresh one per recipe)."""
    return Field(default_factory=cls)


def items(values: list):
    """A list key's default (a fresh copy per recipe)."""
    return Field(default_factory=lambda: list(values))


def is_table(annotation) -> bool:
    return isinstance(annotation, type) and hasattr(annotation, "__pydantic_fields__")


def annotation(cls, name: str):
    """The declared annotation of the key `name` of table `cls`, its bounds and `Strict` included."""
    info = cls.__pydantic_fields__[name]
    described = [Field(description=info.description)] if info.description else []
    return Annotated[(info.annotation, *info.metadata, *described)] if info.metadata else info.annotation


def keys_of(cls) -> list[str]:
    return [f.name for f in fields(cls)]


# ------------------------------------------------------------------ pydantic's error as the recipe's one line
def _leaf(root, loc: tuple):
    """(dotted key, its annotation, where in `loc` an item of a list value is named or None) of the key an error's
    `loc` points at."""
    cls, key, hint = root, [], None
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        if isinstance(part, int):               # a stage's index, or an item of a list value
            if hint is None:
                key.append(str(part))
                continue
            return ".".join(key), hint, len(loc) - len(parts) - 1
        if cls is None or part not in cls.__pydantic_fields__:
            return ".".join([*key, part]), None, None
        key.append(part)
        hint = annotation(cls, part)
        target = _unwrap(hint)
        if typing.get_origin(target) is list and is_table(typing.get_args(target)[0]):
            cls, hint = typing.get_args(target)[0], None        # [[stages]]: the index comes next
        elif is_table(target):
            cls, hint = target, None
        else:
            cls = None
    return ".".join(key), hint, None


def _unwrap(hint):
    """The type under Annotated and Optional."""
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    inner = [h for h in typing.get_args(hint) if h is not type(None)]
    if type(None) in typing.get_args(hint) and len(inner) == 1:
        return _unwrap(inner[0])
    return hint


def _bounds(hint) -> dict:
    """{"ge"|"gt"|"le"|"lt": value} the annotation declares (through Optional and Annotated)."""
    found = {}
    for arg in [hint, *typing.get_args(hint)]:
        if typing.get_origin(arg) is Annotated:
            for meta in typing.get_args(arg)[1:]:
                for name in ("ge", "gt", "le", "lt"):
                    if isinstance(meta, getattr(annotated_types, name.capitalize())):
                        found[name] = getattr(meta, name)
                for m in getattr(meta, "metadata", ()):
                    for name in ("ge", "gt", "le", "lt"):
                        if isinstance(m, getattr(annotated_types, name.capitalize())):
                            found[name] = getattr(m, name)
        elif arg is not hint and typing.get_args(arg):
            found.update(_bounds(arg))
    return found


def _range(bounds: dict, whole: bool) -> str:
    """The range the bounds state: "lie in [1, 64]", "be >= 1", "be a finite number > 0"."""
    low = bounds.get("ge", bounds.get("gt"))
    high = bounds.get("le", bounds.get("lt"))
    if low is not None and high is not None:
        return f"lie in {'[' if 'ge' in bounds else '('}{low}, {high}{']' if 'le' in bounds else ')'}"
    sign = ">=" if "ge" in bounds else ">" if "gt" in bounds else "<=" if "le" in bounds else "<"
    bound = low if low is not None else high
    return f"be >= {bound}" if whole and sign == ">=" else f"be a finite number {sign} {bound:g}"


_TYPES = {"int_type": "int", "int_from_float": "int", "float_type": "float", "bool_type": "bool",
          "string_type": "str", "list_type": "list"}
_RANGE = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def _item_type(hint) -> str:
    item = _unwrap(typing.get_args(_unwrap(hint))[0])
    if item in (int, float) or {_unwrap(a) for a in typing.get_args(item)} == {int, float}:
        return "numbers"
    return f"{getattr(item, '__name__', 'value')}s"


def refusal(err: ValidationError, root, raw: dict, unknown) -> WorkbenchError:
    """The one-line error of pydantic's first error (an unknown key first), `root` the validated table, `raw` what
    the user gave, `unknown(key)` the message for an unknown key."""
    # an item that may be an int or a float fails both: keep the member of the item's own type
    errors = [e for e in err.errors(include_url=False)
              if _member(e) in ("int", "float") and _member(e) == type(e["input"]).__name__ or _member(e) is None]
    errors = errors or err.errors(include_url=False)
    e = next((e for e in errors if e["type"] in ("unexpected_keyword_argument", "extra_forbidden")), errors[0])
    key, hint, index = _leaf(root, e["loc"])
    value = e["input"]
    whole = _lookup(raw, e["loc"][:index]) if index is not None else value
    kind = e["type"]
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        return unknown(key)
    if kind in ("dataclass_type", "dataclass_args_type", "dict_type", "model_type"):
        return WorkbenchError(f"recipe key '{key}' must be a table, got {value!r}")
    if kind == "not_registered":
        return WorkbenchError(f"recipe key '{key}' = '{value}' is not accepted; accepted: {e['ctx']['accepted']}")
    if kind == "literal_error":
        accepted = typing.get_args(_unwrap(typing.get_args(_unwrap(hint))[0]) if index is not None else _unwrap(hint))
        return WorkbenchError(f"recipe key '{key}' = '{value}' is not accepted; accepted: {', '.join(accepted)}")
    if kind in _TYPES and index is not None:
        return WorkbenchError(f"recipe key '{key}' = {whole!r} must be a list of {_item_type(hint)}")
    if kind in _TYPES:
        return WorkbenchError(f"recipe key '{key}' = {value!r} must be of type {_TYPES[kind]}")
    if kind == "finite_number":
        return WorkbenchError(f"recipe key '{key}' = {value} must be a finite number")
    if kind in _RANGE:
        target = typing.get_args(_unwrap(hint))[0] if index is not None else hint
        shown = float(value) if _unwrap(target) is float else value
        where = f"'{key}' = {whole}: item {shown} must" if index is not None else f"'{key}' = {shown} must"
        return WorkbenchError(f"recipe key {where} {_range(_bounds(target), _unwrap(target) is int)}")
    if kind in ("too_short", "too_long"):
        return WorkbenchError(f"recipe key '{key}' = {value} must hold {e['ctx'].get('min_length')} values"
                              if e["ctx"].get("min_length") == e["ctx"].get("max_length", -1) else
                              f"recipe key '{key}' = {value}: {e['msg'].lower()}")
    if kind == "string_pattern_mismatch":
        return WorkbenchError(f"recipe key '{key}' = {value!r} is not of the form {_form(hint)}")
    return WorkbenchError(f"recipe key '{key}' = {value!r}: {e['msg']}")


def _form(hint) -> str:
    """What a text key's pattern stands for: the `description` its Field gives, else the pattern."""
    for meta in typing.get_args(hint)[1:]:
        if getattr(meta, "description", None):
            return meta.description
    return next(str(m.pattern) for m in typing.get_args(hint)[1:] if getattr(m, "pattern", None))


def _member(error: dict) -> str | None:
    """The union member an error is about ("int" from pydantic's "constrained-int"), or None."""
    tag = error["loc"][-1]
    return tag.rsplit("-", 1)[-1] if isinstance(tag, str) and tag.rsplit("-", 1)[-1] in ("int", "float") else None


def _lookup(raw, loc: tuple):
    node = raw
    for part in loc:
        node = node[part]
    return node
