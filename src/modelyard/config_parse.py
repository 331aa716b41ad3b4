"""Typed configuration from parsed YAML or JSON: one routine, one error style.

Every config object is a frozen, keyword-only dataclass. A field's limits are declared with it
(`setting(64, ge=1)`; a `Literal` type lists the choices) and checked by `check_fields(self)` in
`__post_init__`, so an object built in code is held to the same rules as one read from a file.
`from_mapping(cls, data, where)` builds one from a mapping, converting each value by the field's
annotated type:

- a dataclass: from a mapping, recursively (None: all defaults); `setting(inline=True)`: its keys
  sit in the parent's mapping; `setting(key="default")`: the YAML key differs from the field's;
- `X | None`: None, or an X;
- `tuple[X, ...]`, `frozenset[X]`: from a list (a single string is a list of one); from a mapping
  when X is a dataclass with a `name` (the key) or a pair (the items);
- `Mapping[str, X]`: from a mapping (a dataclass X with a `name` gets the key);
- `Literal[...]`: one of the choices (YAML reads on/off as booleans: they count as "on"/"off");
- an enum: by value; `int`, `float`, `bool`, `str`: checked (an int passes as a float, a number
  as a string); `Any`: as it is.

Every error is a `ConfigError` (a ValueError) that starts with the dotted path of what is wrong:
`gateway.tenants.acme.rpm: must be >= 1, not 0`, `server: unknown key(s) ['prot']`.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

_MISSING: Any = dataclasses.MISSING


class ConfigError(ValueError):
    """A bad config value: `path` (dotted, "" for the top) and what is wrong with it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


def setting(
    default: Any = _MISSING,
    *,
    factory: Any = _MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    key: str | None = None,
    inline: bool = False,
) -> Any:
    """A dataclass field with limits (checked by check_fields) and how it reads from YAML."""
    metadata = {"ge": ge, "gt": gt, "le": le, "key": key, "inline": inline}
    if factory is not _MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_fields(obj: object) -> None:
    """Check every field's declared limits and Literal choices (call from __post_init__); None
    passes."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        choices = get_args(hints[f.name]) if get_origin(hints[f.name]) is Literal else ()
        if choices and value not in choices:
            raise ConfigError(f.name, f"must be one of {list(choices)}, not {value!r}")
        limits = [(op, f.metadata.get(op)) for op in ("ge", "gt", "le")]
        if value is None or all(bound is None for _, bound in limits):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f.name, f"must be a number, not {value!r}")
        for op, bound in limits:
            if bound is not None and not _holds(op, value, bound):
                sign = {"ge": ">=", "gt": ">", "le": "<="}[op]
                raise ConfigError(f.name, f"must be {sign} {_number(bound)}, not {value!r}")


def from_mapping(cls: type[T], data: Any, where: str = "") -> T:
    """Build a `cls` from parsed YAML/JSON (see the module docstring); ConfigError if bad."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(where, f"must be a mapping, not {type(data).__name__}")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    known: set[str] = set()
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        if f.metadata.get("inline"):
            names = {g.name for g in dataclasses.fields(hints[f.name])}
            known |= names
            part = {k: v for k, v in data.items() if k in names}
            kwargs[f.name] = from_mapping(hints[f.name], part, where)
            continue
        key = f.metadata.get("key") or f.name
        known.add(key)
        if key in data:
            kwargs[f.name] = convert(hints[f.name], data[key], _join(where, key))
    unknown = sorted(str(k) for k in set(data) - known)
    if unknown:
        raise ConfigError(where, f"unknown key(s) {unknown} (known: {sorted(known)})")
    try:
        return cls(**kwargs)
    except ConfigError as exc:  # a field's limit, from check_fields
        raise ConfigError(_join(where, exc.path), exc.problem) from None
    except (ValueError, TypeError) as exc:  # a rule across fields, or a missing field
        raise ConfigError(where, str(exc)) from None


def convert(tp: Any, value: Any, path: str) -> Any:
    """`value` as the annotated type `tp` (see the module docstring)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        return _union(args, value, path)
    if origin is Literal:
        if isinstance(value, bool) and {"on", "off"} <= set(args):
            value = "on" if value else "off"
        if value not in args:
            raise ConfigError(path, f"must be one of {list(args)}, not {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, path)  # type: ignore[arg-type]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(
                path, f"must be one of {[m.value for m in tp]}, not {value!r}"
            ) from None
    if origin in (tuple, frozenset):
        return _collection(origin, args, value, path)
    if origin is Mapping or origin is dict:
        return _mapping(args, value, path)
    return _scalar(tp, value, path)


def _union(args: tuple[Any, ...], value: Any, path: str) -> Any:
    if value is None and type(None) in args:
        return None
    choices = [a for a in args if a is not type(None)]
    errors = []
    for choice in choices:
        try:
            return convert(choice, value, path)
        except ConfigError as exc:
            errors.append(exc)
    raise errors[0]


def _collection(origin: Any, args: tuple[Any, ...], value: Any, path: str) -> Any:
    if origin is tuple and args and args[-1] is not Ellipsis:  # a fixed-length tuple
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ConfigError(path, f"must be a list of {len(args)}, not {value!r}")
        pairs = enumerate(zip(args, value, strict=True))
        return tuple(convert(a, v, f"{path}[{i}]") for i, (a, v) in pairs)
    item = args[0]
    if value is None:
        value = ()
    if isinstance(value, Mapping):
        if get_origin(item) is tuple:  # pairs, e.g. {model: share}
            items = [convert(item, list(pair), f"{path}.{pair[0]}") for pair in value.items()]
        elif _named(item):
            items = [_named_item(item, k, v, path) for k, v in value.items()]
        else:
            raise ConfigError(path, "must be a list, not a mapping")
    else:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple | set | frozenset):
            raise ConfigError(path, f"must be a list, not {type(value).__name__}")
        items = [convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    return frozenset(items) if origin is frozenset else tuple(items)


def _mapping(args: tuple[Any, ...], value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be a mapping, not {type(value).__name__}")
    item = args[1] if len(args) == 2 else Any
    if _named(item):
        return {str(k): _named_item(item, k, v, path) for k, v in value.items()}
    return {str(k): convert(item, v, f"{path}.{k}") for k, v in value.items()}


def _named(tp: Any) -> bool:
    """A dataclass whose `name` field comes from its key in a mapping."""
    return dataclasses.is_dataclass(tp) and "name" in {f.name for f in dataclasses.fields(tp)}


def _named_item(tp: Any, key: Any, value: Any, path: str) -> Any:
    where = _join(path, str(key))
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(where, f"must be a mapping, not {type(value).__name__}")
    return from_mapping(tp, {**(value or {}), "name": str(key)}, where)


def _scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"must be true or false, not {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"must be an integer, not {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(path, f"must be a number, not {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise ConfigError(path, f"must be a string, not {value!r}")
        return value
    raise ConfigError(path, f"cannot read a {tp!r} from a config file")  # pragma: no cover


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a dataclass (cached: check_fields runs per construction)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = get_type_hints(cls)
    return hints


def _holds(op: str, value: float, bound: float) -> bool:
    if op == "ge":
        return value >= bound
    if op == "gt":
        return value > bound
    return value <= bound


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
