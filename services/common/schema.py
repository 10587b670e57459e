"""Typed models without a framework: the subset of pydantic that settings and plugin sections use.

The pusher runs on compute nodes, where every megabyte counts: pydantic and its
compiled core cost ~13 MB of RSS before a model is validated. A
:class:`Model` is declared the same way (annotations, defaults,
:func:`Field` constraints, :func:`field_validator`, :func:`model_validator`,
:class:`AliasChoices`, camelCase aliases) and validates in pydantic's lax mode
(``"12"`` is an integer, ``"yes"`` a boolean, a whole float an integer), with
errors that name the key path, what was expected and what was given. It keeps
pydantic's names for what callers use (``model_validate``, ``model_dump``,
``model_fields``, ``model_fields_set``), so a model moves between the two by
changing its imports.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, get_args, get_origin

__all__ = [
    "AliasChoices",
    "Field",
    "FieldInfo",
    "Model",
    "ModelConfig",
    "ValidationError",
    "ValidationInfo",
    "describe_type",
    "field_validator",
    "model_validator",
    "to_camel",
]

M = TypeVar("M", bound="Model")
F = TypeVar("F", bound=Callable[..., Any])


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_NONE = type(None)


def to_camel(name: str) -> str:
    """``queue_size`` -> ``queueSize`` (DCDB's spelling of the same key)."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


class AliasChoices:
    """Other keys a field accepts, in priority order (``AliasChoices("sensors", "numSensors")``)."""

    def __init__(self, *choices: str) -> None:
        self.choices = choices


@dataclass
class FieldInfo:
    """One field of a model: its type, default and constraints."""

    default: Any = MISSING
    default_factory: Callable[[], Any] | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    min_length: int | None = None
    validation_alias: AliasChoices | str | None = None
    description: str | None = None
    allow_inf_nan: bool = True
    """False: a NaN or infinite number is refused (a float field)."""
    annotation: Any = None
    name: str = ""
    aliases: tuple[str, ...] = ()

    def is_required(self) -> bool:
        return self.default is MISSING and self.default_factory is None

    def get_default(self) -> Any:
        if self.default_factory is not None:
            return self.default_factory()
        if isinstance(self.default, (list, dict, set)):
            return copy.deepcopy(self.default)
        return self.default


def Field(
    default: Any = MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    min_length: int | None = None,
    validation_alias: AliasChoices | str | None = None,
    description: str | None = None,
    allow_inf_nan: bool = True,
) -> Any:
    """A field's default and constraints (``Field(1024, ge=1)``)."""
    return FieldInfo(
        default,
        default_factory,
        ge,
        gt,
        le,
        lt,
        min_length,
        validation_alias,
        description,
        allow_inf_nan,
    )


@dataclass(frozen=True)
class ModelConfig:
    """How a model treats its input: unknown keys and DCDB's camelCase spelling."""

    extra: Literal["forbid", "ignore"] = "forbid"
    camel: bool = False
    """Accept ``queueSize`` for ``queue_size`` too (and name the key so in errors)."""


@dataclass
class ValidationInfo:
    """What a validator may look at: the fields validated before this one."""

    data: dict[str, Any]
    field_name: str | None = None


class ValidationError(ValueError):
    """Every problem of one validation, each with its key path (``loc``) and expectation."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self._errors = errors
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))

    def errors(self) -> list[dict[str, Any]]:
        """``[{"loc": (...), "type": ..., "msg": ..., "input": ..., "expected": ...}]``."""
        return self._errors

    def explain(self, where: str) -> str:
        """One clause per error: ``<where>.<key path>: expected ..., got ...``."""
        return "; ".join(explain_error(e, where) for e in self._errors)


def explain_error(err: dict[str, Any], where: str) -> str:
    loc = [str(p) for p in err["loc"]]
    path = ".".join([where, *loc]) if loc else where
    if err["type"] == "extra_forbidden":
        return f"{path}: unknown key; expected one of {', '.join(err['known'])}"
    if err["type"] == "missing":
        return f"{path}: required ({err['expected']}) but not given"
    return f"{path}: expected {err['expected']}, got {err['input']!r} ({err['msg']})"


def field_validator(*fields: str, mode: Literal["before", "after"] = "after") -> Callable[[F], F]:
    """Check or convert ``fields`` (``def f(cls, value[, info])``; raise ValueError to refuse)."""

    def mark(fn: F) -> F:
        func = fn.__func__ if isinstance(fn, classmethod) else fn
        func.__kelvin_field_validator__ = (fields, mode)  # type: ignore[attr-defined]
        return fn

    return mark


def model_validator(*, mode: Literal["after"] = "after") -> Callable[[F], F]:
    """Check the whole model after its fields (``def f(self) -> Self``; raise ValueError)."""

    def mark(fn: F) -> F:
        fn.__kelvin_model_validator__ = mode  # type: ignore[attr-defined]
        return fn

    return mark


@dataclass
class _Schema:
    fields: dict[str, FieldInfo]
    before: dict[str, list[Callable[..., Any]]] = field(default_factory=dict)
    after: dict[str, list[Callable[..., Any]]] = field(default_factory=dict)
    model_checks: list[Callable[..., Any]] = field(default_factory=list)


class _ModelMeta(type):
    def __getattr__(cls, name: str) -> Any:
        # model_fields of a model whose annotations could not be resolved at class
        # creation (a forward reference): resolve on first use.
        if name == "model_fields":
            return cls._schema().fields  # type: ignore[attr-defined,unused-ignore]
        raise AttributeError(name)


class Model(metaclass=_ModelMeta):
    """A typed model validated from a mapping; see the module docstring."""

    model_config: ClassVar[ModelConfig] = ModelConfig()
    model_fields: ClassVar[dict[str, FieldInfo]]
    __kelvin_schema__: ClassVar[_Schema | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__kelvin_schema__ = None
        # Defaults must not shadow the instance attributes: keep them in the schema only.
        for name, value in list(cls.__dict__.items()):
            if isinstance(value, FieldInfo):
                setattr(cls, f"__kelvin_field_{name}", value)
                delattr(cls, name)
        with contextlib.suppress(NameError):  # a forward reference: resolved on first use
            cls._schema()

    @classmethod
    def _schema(cls) -> _Schema:
        own = cls.__dict__.get("__kelvin_schema__")
        if own is not None:
            return own  # type: ignore[no-any-return]
        schema = _build_schema(cls)
        cls.__kelvin_schema__ = schema
        type.__setattr__(cls, "model_fields", schema.fields)
        return schema

    def __init__(self, **data: Any) -> None:
        validated = type(self)._validate(data, ())
        self.__dict__.update(validated.__dict__)

    # ------------------------------------------------------------------ pydantic's names

    @classmethod
    def model_validate(cls: type[M], data: Any) -> M:
        """A model from ``data`` (a mapping, or already a model); ValidationError otherwise."""
        return cls._validate(data, ())

    def model_dump(
        self, *, exclude_unset: bool = False, include: set[str] | None = None
    ) -> dict[str, Any]:
        """The fields as plain data (nested models as mappings)."""
        out: dict[str, Any] = {}
        for name in type(self)._schema().fields:
            if include is not None and name not in include:
                continue
            if exclude_unset and name not in self.model_fields_set:
                continue
            out[name] = _dump(getattr(self, name))
        return out

    @property
    def model_fields_set(self) -> set[str]:
        """The fields the input gave (the others hold their defaults)."""
        return self.__dict__.get("__fields_set__", set())  # type: ignore[no-any-return]

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        names = type(self)._schema().fields
        return all(getattr(self, n) == getattr(other, n) for n in names)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={getattr(self, n)!r}" for n in type(self)._schema().fields)
        return f"{type(self).__name__}({parts})"

    # ------------------------------------------------------------------ validation

    @classmethod
    def _validate(cls: type[M], data: Any, loc: tuple[Any, ...]) -> M:
        if isinstance(data, cls):
            return data
        if not isinstance(data, Mapping):
            raise ValidationError(
                [_err(loc, "model_type", "Input should be a valid dictionary", data, "a mapping")]
            )
        schema = cls._schema()
        errors: list[dict[str, Any]] = []
        values: dict[str, Any] = {}
        given: set[str] = set()
        used: set[Any] = set()
        for name, info in schema.fields.items():
            key = next((a for a in info.aliases if a in data), MISSING)
            here = (*loc, key if key is not MISSING else info.aliases[0])
            if key is MISSING:
                if info.is_required():
                    errors.append(
                        _err(
                            here, "missing", "Field required", None, describe_type(info.annotation)
                        )
                    )
                    continue
                values[name] = info.get_default()
                continue
            used.add(key)
            given.add(name)
            raw = data[key]
            try:
                for fn in schema.before.get(name, ()):
                    raw = _call_validator(fn, cls, raw, values, name)
                value = _coerce(info.annotation, raw, here, errors)
                if value is MISSING or not _constrain(info, value, here, errors):
                    continue
                for fn in schema.after.get(name, ()):
                    value = _call_validator(fn, cls, value, values, name)
            except (ValueError, AssertionError) as exc:
                if isinstance(exc, ValidationError):
                    errors.extend(exc.errors())
                else:
                    errors.append(
                        _err(
                            here,
                            "value_error",
                            f"Value error, {exc}",
                            raw,
                            describe_type(info.annotation),
                        )
                    )
                continue
            values[name] = value
        if cls.model_config.extra == "forbid":
            known = sorted(schema.fields)
            for key in data:
                if key not in used:
                    e = _err((*loc, key), "extra_forbidden", "Extra inputs are not permitted", None)
                    e["known"] = known
                    e["input"] = data[key]
                    errors.append(e)
        if errors:
            raise ValidationError(errors)
        obj = cls.__new__(cls)
        obj.__dict__.update(values)
        obj.__dict__["__fields_set__"] = given
        for check in schema.model_checks:
            try:
                obj = check(obj) or obj
            except (ValueError, AssertionError) as exc:
                raise ValidationError(
                    [_err(loc, "value_error", f"Value error, {exc}", dict(data), "a valid section")]
                ) from exc
        return obj


def _err(
    loc: tuple[Any, ...], kind: str, msg: str, given: Any, expected: str = "a valid value"
) -> dict[str, Any]:
    return {"loc": loc, "type": kind, "msg": msg, "input": given, "expected": expected}


def _call_validator(
    fn: Callable[..., Any], cls: type, value: Any, data: dict[str, Any], name: str
) -> Any:
    func = getattr(fn, "__func__", fn)
    if func.__code__.co_argcount >= 3:
        return func(cls, value, ValidationInfo(data, name))
    return func(cls, value)


def _build_schema(cls: type[Model]) -> _Schema:
    hints = typing.get_type_hints(cls)  # every base's annotations, in its own module
    fields: dict[str, FieldInfo] = {}
    config = cls.model_config
    for name, ann in hints.items():
        if name.startswith("_") or get_origin(ann) is ClassVar or ann is ClassVar:
            continue
        info = _declared(cls, name)
        info = copy.copy(info)
        info.annotation = ann
        info.name = name
        aliases: list[str] = []
        va = info.validation_alias
        if isinstance(va, AliasChoices):
            aliases.extend(va.choices)
        elif isinstance(va, str):
            aliases.append(va)
        camel = to_camel(name)
        if config.camel and camel not in aliases:
            # No explicit aliases: the camelCase key comes first (it names the key in errors).
            aliases.insert(len(aliases) if aliases else 0, camel)
        if name not in aliases:
            aliases.append(name)
        info.aliases = tuple(aliases)
        fields[name] = info
    schema = _Schema(fields)
    seen: set[str] = set()
    for klass in cls.__mro__:
        for attr, value in klass.__dict__.items():
            if attr in seen:
                continue
            func = getattr(value, "__func__", value)
            spec = getattr(func, "__kelvin_field_validator__", None)
            if spec is not None:
                seen.add(attr)
                names, mode = spec
                target = schema.before if mode == "before" else schema.after
                for n in names:
                    target.setdefault(n, []).append(value)
            if getattr(func, "__kelvin_model_validator__", None):
                seen.add(attr)
                schema.model_checks.append(func)
    return schema


def _declared(cls: type, name: str) -> FieldInfo:
    for klass in cls.__mro__:
        info = klass.__dict__.get(f"__kelvin_field_{name}")
        if isinstance(info, FieldInfo):
            return info
        if name in klass.__dict__:
            return FieldInfo(default=klass.__dict__[name])
        if name in inspect.get_annotations(klass):
            return FieldInfo()
    return FieldInfo()


def _dump(value: Any) -> Any:
    if isinstance(value, Model):
        return value.model_dump()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_dump(v) for v in value)
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _constrain(info: FieldInfo, value: Any, loc: tuple[Any, ...], errors: list[Any]) -> bool:
    """Whether ``value`` meets the field's bounds; the first it misses is appended to ``errors``."""
    problem: tuple[str, str] | None = None
    if isinstance(value, float) and not info.allow_inf_nan and not math.isfinite(value):
        problem = ("finite_number", "Input should be a finite number")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if info.ge is not None and not value >= info.ge:
            problem = ("greater_than_equal", f"Input should be greater than or equal to {info.ge}")
        elif info.gt is not None and not value > info.gt:
            problem = ("greater_than", f"Input should be greater than {info.gt}")
        elif info.le is not None and not value <= info.le:
            problem = ("less_than_equal", f"Input should be less than or equal to {info.le}")
        elif info.lt is not None and not value < info.lt:
            problem = ("less_than", f"Input should be less than {info.lt}")
    if (
        problem is None
        and info.min_length is not None
        and hasattr(value, "__len__")
        and len(value) < info.min_length
    ):
        problem = (
            ("too_short", f"String should have at least {info.min_length} characters")
            if isinstance(value, str)
            else (
                "too_short",
                f"List should have at least {info.min_length} item after validation, "
                f"not {len(value)}",
            )
        )
    if problem is None:
        return True
    errors.append(_err(loc, problem[0], problem[1], value, describe_type(info.annotation)))
    return False


_TRUE = {"true", "1", "yes", "on", "t", "y"}
_FALSE = {"false", "0", "no", "off", "f", "n"}


def _coerce(ann: Any, raw: Any, loc: tuple[Any, ...], errors: list[Any]) -> Any:
    """``raw`` as type ``ann`` (lax), or MISSING with the problem appended to ``errors``."""
    try:
        return _convert(ann, raw, loc)
    except _Invalid as bad:
        errors.extend(bad.errors)
        return MISSING


class _Invalid(Exception):
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors


def _fail(loc: tuple[Any, ...], ann: Any, raw: Any, kind: str, msg: str) -> _Invalid:
    return _Invalid([_err(loc, kind, msg, raw, describe_type(ann))])


def _convert(ann: Any, raw: Any, loc: tuple[Any, ...]) -> Any:
    if ann is Any or ann is object:
        return raw
    origin = get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        args = get_args(ann)
        if raw is None and _NONE in args:
            return None
        problems: list[dict[str, Any]] = []
        for arg in args:
            if arg is _NONE:
                continue
            try:
                return _convert(arg, raw, loc)
            except _Invalid as bad:
                problems.extend(bad.errors)
        if len([a for a in args if a is not _NONE]) == 1:
            raise _Invalid(problems)
        raise _fail(loc, ann, raw, "union", "Input matches none of the allowed types")
    if origin is Literal:
        choices = get_args(ann)
        for c in choices:
            if raw == c and type(raw) is type(c):
                return c
            if isinstance(c, int) and isinstance(raw, str) and raw.strip() == str(c):
                return c
        shown = ", ".join(repr(c) for c in choices[:-1])
        shown = f"{shown} or {choices[-1]!r}" if shown else repr(choices[-1])
        raise _fail(loc, ann, raw, "literal_error", f"Input should be {shown}")
    if origin in (list, tuple, set, frozenset) or ann in (list, tuple):
        if isinstance(raw, (str, bytes)) or not isinstance(raw, (list, tuple, set, frozenset)):
            raise _fail(loc, ann, raw, "list_type", "Input should be a valid list")
        args = get_args(ann)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(raw) != len(args):
                raise _fail(loc, ann, raw, "tuple_type", f"Input should have {len(args)} items")
            items = list(zip(args, raw, strict=True))
        else:
            item = args[0] if args else Any
            items = [(item, r) for r in raw]
        out: list[Any] = []
        problems = []
        for i, (t, r) in enumerate(items):
            try:
                out.append(_convert(t, r, (*loc, i)))
            except _Invalid as bad:
                problems.extend(bad.errors)
        if problems:
            raise _Invalid(problems)
        return tuple(out) if origin is tuple else out
    if origin is dict or ann is dict:
        if not isinstance(raw, Mapping):
            raise _fail(loc, ann, raw, "dict_type", "Input should be a valid dictionary")
        kt, vt = get_args(ann) or (Any, Any)
        result: dict[Any, Any] = {}
        problems = []
        for k, v in raw.items():
            try:
                result[_convert(kt, k, (*loc, k))] = _convert(vt, v, (*loc, k))
            except _Invalid as bad:
                problems.extend(bad.errors)
        if problems:
            raise _Invalid(problems)
        return result
    if isinstance(ann, type) and issubclass(ann, Model):
        try:
            return ann._validate(raw, loc)
        except ValidationError as exc:
            raise _Invalid(exc.errors()) from None
    if ann is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, int) and raw in (0, 1):
            return bool(raw)
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise _fail(loc, ann, raw, "bool_parsing", "Input should be a valid boolean")
    if ann is int:
        if isinstance(raw, int):  # bool included: True is 1
            return int(raw)
        if isinstance(raw, float):
            if math.isfinite(raw) and raw == int(raw):
                return int(raw)
            raise _fail(
                loc,
                ann,
                raw,
                "int_from_float",
                "Input should be a valid integer, got a number with a fractional part",
            )
        if isinstance(raw, str):
            try:
                return int(raw.strip())
            except ValueError:
                raise _fail(
                    loc,
                    ann,
                    raw,
                    "int_parsing",
                    "Input should be a valid integer, unable to parse string as an integer",
                ) from None
        raise _fail(loc, ann, raw, "int_type", "Input should be a valid integer")
    if ann is float:
        if isinstance(raw, (int, float)):
            return float(raw)
        if isinstance(raw, str):
            try:
                return float(raw.strip())
            except ValueError:
                raise _fail(
                    loc,
                    ann,
                    raw,
                    "float_parsing",
                    "Input should be a valid number, unable to parse string as a number",
                ) from None
        raise _fail(loc, ann, raw, "float_type", "Input should be a valid number")
    if ann is str:
        if isinstance(raw, str):
            return raw
        raise _fail(loc, ann, raw, "string_type", "Input should be a valid string")
    if ann is Path:
        if isinstance(raw, (str, Path)):
            return Path(raw)
        raise _fail(loc, ann, raw, "path_type", "Input is not a valid path")
    if isinstance(ann, type):
        if isinstance(raw, ann):
            return raw
        raise _fail(
            loc, ann, raw, "is_instance_of", f"Input should be an instance of {ann.__name__}"
        )
    return raw


def describe_type(ann: Any) -> str:
    """What a type annotation expects, in words (``an integer``, ``one of 'a', 'b'``)."""
    origin = get_origin(ann)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(ann))
    if origin in (typing.Union, types.UnionType):
        parts = [describe_type(a) for a in get_args(ann) if a is not _NONE]
        return " or ".join(parts) + (" (or null)" if _NONE in get_args(ann) else "")
    if origin in (list, tuple, set, frozenset):
        return f"a list of {describe_type(get_args(ann)[0]) if get_args(ann) else 'values'}"
    if origin is dict:
        return "a mapping"
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "a boolean (true/false)",
        Path: "a path",
    }
    if ann in names:
        return names[ann]
    if isinstance(ann, type) and (issubclass(ann, Model) or hasattr(ann, "model_fields")):
        return "a mapping"
    return getattr(ann, "__name__", str(ann))
