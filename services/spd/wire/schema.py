"""Per-field checks derived from the message dataclasses (type hints + `limits` metadata): what
decode() accepts and encode() refuses; see spd.wire."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

import torch

from spd.wire.messages import MESSAGES, SparseDist, TENSORS_KEY, WireError


# ------------------------------------------------------------------ checks derived from the fields

Check = Callable[[Any], Any]  # a wire value -> the field's value; WireError if it does not fit
Plain = Callable[[Any], Any] | None  # a field's value -> what msgpack packs (None: the value itself)


@dataclass(frozen=True)
class _Schema:
    header: tuple[tuple[str, Check, Plain], ...]  # each header field, in order: (name, check, plain)
    names: frozenset[str]  # the header fields' names
    tensors: dict[str, tuple[str, bool]]  # tensor field -> (form: tensor | dist | map, optional)


def _schema(cls: type) -> _Schema:
    hints = typing.get_type_hints(cls)
    header: list[tuple[str, Check, Plain]] = []
    tensors: dict[str, tuple[str, bool]] = {}
    for f in dataclasses.fields(cls):
        form = _tensor_form(hints[f.name])
        if form is not None:
            tensors[f.name] = form
        else:
            header.append((f.name, _check(hints[f.name], f.metadata), _plain(hints[f.name])))
    names = frozenset(name for name, _, _ in header)
    assert TENSORS_KEY not in names and not any("." in name for name in tensors), cls
    return _Schema(tuple(header), names, tensors)


def _optional(tp) -> tuple[Any, bool]:
    """(T, True) for T | None, else (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1:
            return inner[0], True
        raise TypeError(f"wire: unions other than T | None are not supported: {tp!r}")
    return tp, False


def _tensor_form(tp) -> tuple[str, bool] | None:
    inner, optional = _optional(tp)
    if inner is torch.Tensor:
        return "tensor", optional
    if inner is SparseDist:
        return "dist", optional
    if typing.get_origin(inner) is dict and typing.get_args(inner) == (int, torch.Tensor):
        if optional:
            raise TypeError("wire: a dict[int, Tensor] field is never None (empty instead)")
        return "map", False
    return None


def _check(tp, meta) -> Check:
    """The check of a header field of type `tp` (with `limits` metadata `meta`)."""
    inner, optional = _optional(tp)
    if optional:
        check = _check(inner, meta)
        return lambda v: None if v is None else check(v)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        item, as_tuple = _check(args[0], {}), origin is tuple

        def check_array(v):
            if not isinstance(v, (list, tuple)):  # msgpack gives lists; encode checks tuples too
                raise WireError(f"expected an array, got {_type(v)}")
            items = [item(x) for x in v]
            return tuple(items) if as_tuple else items
        return check_array
    if origin is dict and args[0] is str:
        value = _check(args[1], {})

        def check_map(v):
            if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
                raise WireError(f"expected a map with string keys, got {_type(v)}")
            return {k: value(x) for k, x in v.items()}
        return check_map
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        struct, what = _schema(tp), tp.__name__
        if struct.tensors:
            raise TypeError(f"wire: nested {what} may not hold tensors")

        def check_struct(v):
            values = _read(struct, v, what)
            try:
                return tp(**values)
            except (TypeError, ValueError) as e:  # a __post_init__ that refuses the values
                raise WireError(f"{what}: {e}") from None
        return check_struct
    if tp in (str, int, float, bool):
        return _scalar(tp, meta.get("lo"), meta.get("below"), meta.get("chars"))
    raise TypeError(f"wire: no check for a field of type {tp!r}")


def _scalar(tp: Any, lo: int | None, below: int | None, chars: int | None) -> Check:
    def check(v: Any) -> Any:
        if type(v) is not tp:
            if tp is float and _is_int(v):
                v = float(v)
            elif not isinstance(v, tp) or (tp is int and isinstance(v, bool)):  # a bool is no int
                raise WireError(f"expected {tp.__name__}, got {_type(v)}")
        if (lo is not None and v < lo) or (below is not None and v >= below):
            raise WireError(f"{v} outside [{lo if lo is not None else '-inf'}, {below if below is not None else 'inf'})")
        if chars is not None and len(v) > chars:
            raise WireError(f"longer than {chars} chars")
        return v
    return check


def _read(schema: _Schema, mapping, what: str) -> dict[str, Any]:
    """The checked values of every header field of `schema` in `mapping` (exactly those)."""
    if not isinstance(mapping, dict):
        raise WireError(f"{what} must be a map, not {_type(mapping)}")
    values = {}
    for name, check, _ in schema.header:
        if name not in mapping:
            raise WireError(f"{what} field {name!r} missing")
        try:
            values[name] = check(mapping[name])
        except WireError as e:
            raise WireError(f"{what} field {name!r}: {e}") from None
    if len(mapping) != len(values):
        unknown = next(k for k in mapping if k not in schema.names)
        raise WireError(f"{what}: unknown field {unknown!r}")
    return values


def _plain(tp) -> Plain:
    """How a value of type `tp` becomes what msgpack packs: only nested dataclasses need it (as
    maps); msgpack packs everything else itself (tuples as arrays)."""
    inner, optional = _optional(tp)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if origin in (list, tuple, dict):
        item = _plain(args[-1])
        if item is None:
            return None
        if origin is dict:
            return lambda v: {k: item(x) for k, x in v.items()} if isinstance(v, dict) else v
        return lambda v: [item(x) for x in v] if isinstance(v, (list, tuple)) else v
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        fields = [(f.name, _plain(hint)) for f in dataclasses.fields(inner)
                  for hint in [typing.get_type_hints(inner)[f.name]]]
        return lambda v: {name: plain(getattr(v, name)) if plain else getattr(v, name)
                          for name, plain in fields} if isinstance(v, inner) else v  # else: the check says why
    return None


_SCHEMAS: dict[type, _Schema] = {cls: _schema(cls) for cls in MESSAGES.values()}


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _type(v) -> str:
    return type(v).__name__
