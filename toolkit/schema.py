"""The settings schema, at the bottom of the toolkit: a raw mapping -> a settings dataclass,
each value checked against its field's type (Literal choices, lists, nested blocks; ints widen to
floats) and its declared bounds (`min`, `max`, `below`, `min_items` in the field's metadata), every
mistake one line naming the field. Recipes, methods, tasks and attention modules all use it."""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from typing import Any, Literal

from toolkit.errors import UserError
from toolkit.registry import did_you_mean, foreign_hint


def _fits(value: Any, tp: Any) -> bool:
    """Whether `value` is of the kind `tp` names (a Literal: one of its values)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if tp is Any:
        return True
    base = origin or tp
    return isinstance(base, type) and isinstance(value, base)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`; ints widen to floats; everything else must match."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(types, "UnionType", None)):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        fits = [a for a in inner if _fits(value, a)]
        return _coerce(value, (fits or inner)[0], where)
    if origin is Literal:
        choices = [str(c) for c in typing.get_args(tp)]
        if value not in typing.get_args(tp):
            # as YAML writes it: `mixed_precision=null` was "'None' is not allowed", `true` 'True'
            shown = {None: "null", True: "true", False: "false"}.get(value, value) if _keyable(value) else value
            raise UserError(f"{where}: '{shown}' is not allowed{did_you_mean(str(shown), choices)}")
        return value
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]  # `method.target_modules=query` means a one-element list
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        key_type, value_type = typing.get_args(tp) or (Any, Any)
        return {_coerce(k, key_type, f"{where} key {k!r}"): _coerce(v, value_type, f"{where}.{k}") for k, v in value.items()}
    if tp is float and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        number = _as_float(value, where)
        if number is not None:
            return number
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):  # a nested settings block (a task's `generation:`)
        return build_dataclass(tp, value, where)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise UserError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}{_quote_hint(value, tp)}")
    return value


def _keyable(value: Any) -> bool:
    """None or a bool (each a key of the spelling table), never a 1 that equals True."""
    return value is None or isinstance(value, bool)


def _quote_hint(value: Any, tp: Any) -> str:
    """A number or a boolean where text goes: YAML read `1` (`true`, `1.5`) as one, so a name that
    is a number (a CSV column headed `1`, `task.text_columns: [1]`) was refused as 'expected str,
    got int 1' with no word of the quotes that make it text."""
    if tp is not str:
        return ""
    if isinstance(value, bool):
        return f"; a name that YAML reads as {str(value).lower()} is written quoted: '{str(value).lower()}'"
    if isinstance(value, (int, float)):
        return f"; a name that is a number is written quoted: '{value}'"
    return ""


# A number as YAML 1.2 spells one in decimal (`3`, `-.5`, `1e-4`, `5.0E-4`): what a quoted number
# ("3e-4") or a YAML 1.1 reader's string may hold for a float field. Python's float() reads more
# (`1_000`, ` 3 `, `١`), which YAML 1.2 and an int field refuse: `train.lr: 1_000` ran with 1000.0
# where `train.batch_size: 1_000` was refused.
DECIMAL = r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
_DECIMAL = re.compile(DECIMAL)
_NOT_FINITE = re.compile(r"[-+]?(?:inf|infinity|nan)", re.IGNORECASE)  # said as such by _check_bounds


def decimal_float(text: str) -> float:
    """The float of a decimal number's text (DECIMAL); ValueError for a nonzero one that a float
    cannot hold, past its smallest: float('1e-400') is 0.0, so `train.lr=1e-400` trained with lr 0
    and `max_grad_norm: 1e-400` turned clipping off (0 is off), exit 0. Past the largest it is inf,
    which the bounds refuse as not finite."""
    value = float(text)
    if value == 0 and re.search(r"[1-9]", re.split(r"[eE]", text)[0]):
        raise ValueError("is too small for a float (it reads as 0); write 0 if 0 is meant")
    return value


def _as_float(value: int | float | str, where: str) -> float | None:
    """The float a float field holds for `value`, one value for one number: an int of any size
    (10**400 was an OverflowError traceback), a string spelling a decimal number, and -0.0 as 0.0
    (a float field's -0.0 is the run of 0.0, yet hashed apart: `train.lr=-0.0` or `weight_decay:
    -0.0` was another run id of the same run, and a sweep over `0,-0.0` trained it twice). None:
    a string that is no number (said by the caller as the wrong type)."""
    if isinstance(value, str):
        if _NOT_FINITE.fullmatch(value):
            value = float(value)
        elif not _DECIMAL.fullmatch(value):
            return None
        else:
            try:
                value = decimal_float(value)
            except ValueError as exc:
                raise UserError(f"{where}: {value} {exc}") from None
    elif isinstance(value, int):
        try:
            value = float(value)
        except OverflowError:
            raise UserError(f"{where}: an integer of {len(str(value)) if value.bit_length() < 14000 else 'thousands of'} "
                            "digits is not a finite number (past a float's range)") from None
    return 0.0 if value == 0 else value


def _check_bounds(value: Any, metadata: Any, where: str) -> None:
    """Finite, and within the field's declared `min` / `max` / `below` (field metadata); `below`
    is an open bound: a dropout or a moving average's beta of 1 would keep nothing."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}: {value} is not a finite number")
    lo, hi, below = metadata.get("min"), metadata.get("max"), metadata.get("below")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if lo is not None and value < lo:
            raise UserError(f"{where}: {value} is below the minimum {lo}")
        if hi is not None and value > hi:
            raise UserError(f"{where}: {value} is above the maximum {hi}")
        if below is not None and value >= below:
            raise UserError(f"{where}: {value} must be below {below}")


def _once_each(items: list, where: str) -> None:
    """Every list setting is a set of names or numbers (modules, layers, labels, columns, trackers,
    buckets): an item given twice means nothing more, yet made another recipe hash (another run of
    the same thing) or, for labels and verbalizers, a class no prediction can name apart."""
    seen: list = []
    for item in items:
        if any(item == other and type(item) is type(other) for other in seen):
            raise UserError(f"{where}: {item!r} is listed twice; give each once")
        seen.append(item)


# field metadata: a value that means what null means (`max_grad_norm: 0`, clipping off, as null):
# stored as null, so the two spellings of one setting are one recipe hash (they were two run ids)
NONE_ALIAS = "none_alias"


def build_dataclass(cls: type, raw: Any, where: str) -> Any:
    """Raw mapping -> `cls`, naming the field of any unknown key, wrong type or out-of-range value."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping, got {type(raw).__name__} {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in fields:
            hint = foreign_hint(str(key)) or (did_you_mean(str(key), list(fields)) if fields
                                              else f" ({where} {getattr(cls, 'name', '') or cls.__name__} takes no settings)")
            raise UserError(f"{where}.{key}: unknown key{hint}")
    kwargs = {}
    for name, f in fields.items():
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise UserError(f"{where}.{name}: required field is missing")
            continue
        value = _coerce(raw[name], hints[name], f"{where}.{name}")
        if isinstance(value, list):
            if len(value) < f.metadata.get("min_items", 0):
                raise UserError(f"{where}.{name}: needs at least {f.metadata['min_items']} item(s)")
            _once_each(value, f"{where}.{name}")
            for i, item in enumerate(value):
                _check_bounds(item, f.metadata, f"{where}.{name}[{i}]")
        elif isinstance(value, dict):  # a mapping's values bounded as a list's items are
            for key, item in value.items():
                _check_bounds(item, f.metadata, f"{where}.{name}.{key}")
        else:
            _check_bounds(value, f.metadata, f"{where}.{name}")
        if NONE_ALIAS in f.metadata and value is not None and not isinstance(value, bool) \
                and value == f.metadata[NONE_ALIAS]:
            value = None  # one setting, one value: the recipe hash and recipe.yaml say null
        kwargs[name] = value
    return cls(**kwargs)


def build_plugin(registry: Any, raw: Any, where: str) -> Any:
    """A `{name: ..., settings...}` section -> the registered settings dataclass of that name. A
    bare name is its mapping, as for `model.attention`: `method=full` over a LoRA recipe (a section
    naming another plug-in starts afresh) was 'expected a mapping with a name', where `method=lora`
    over it, merged into the section it names, ran."""
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping with a name, got {type(raw).__name__} {raw!r}")
    raw = dict(raw)
    if "name" not in raw:
        raise UserError(f"{where}.name: required field is missing")
    cls = registry.get(str(raw.pop("name")), f"{where}.name")
    return build_dataclass(cls, raw, where)


NEUTRAL = "neutral"  # field metadata: the value that behaves as the toolkit did before the field existed


def added(default: Any = dataclasses.MISSING, *, neutral: Any, default_factory: Any = dataclasses.MISSING,
          **metadata: Any) -> Any:
    """A settings field added after runs were made without it (`dataclasses.field` otherwise).
    `neutral`: the value that reproduces what the toolkit did before the field existed. A recipe
    holding it hashes as if the field were not there (`unhashed`), so the run ids of every recipe
    and run made before it stay: a toolkit upgrade does not rename runs or train them again. A
    default other than `neutral` (the behaviour changed) changes the ids, as it must."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={**metadata, NEUTRAL: neutral})


WAS = "was"  # field metadata: the fixed value an unpinned field (`unpinned`) had before it could be unset


def unpinned(was: Any, **metadata: Any) -> Any:
    """A settings field that had the fixed default `was` and now defaults to unset (None: what the
    library or the checkpoint says, as transformers' own scripts read it). Unset hashes as unset:
    it asks for the checkpoint's value, which is another computation than `was` wherever the
    checkpoint says otherwise, so a recipe that leaves it has a new run id, and a recipe that
    writes `was` keeps the old one (it found `was` hashed then; not hashing unset as `was`, which
    would make the two one run id, one run's decoding returned as "finished already" for the
    other). A run made before holds `was` written in its recipe.yaml and is read as it ran. `was`
    is no request either where the field is ignored (recipe.refuse_ignored): runs made before
    wrote it everywhere."""
    return dataclasses.field(default=None, metadata={**metadata, WAS: was})


def is_neutral(f: dataclasses.Field, value: Any) -> bool:
    """Whether `value` is field `f`'s declared neutral value: equal as numbers (a float field
    holds 0.0 where `neutral=0` was declared; the schema widens ints), but a boolean only equals
    a boolean (false is no 0)."""
    if NEUTRAL not in f.metadata:
        return False
    neutral = f.metadata[NEUTRAL]
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    return bool(value == neutral)


# field metadata: a list whose order does not change the computation (a set of module names,
# layer indices, bucket lengths, trackers): hashed sorted, so `[value, query]` and `[query, value]`
# are one run id (they were two runs of one computation). A list whose order means something
# (labels in id order, text columns as a pair, metrics whose first selects) is not marked.
UNORDERED = "unordered"

# field metadata: a function of the settings block (and the block holding it, None at the top:
# a task's `generation` is in its task) that gives the value the field's unset (None) stands for
# (`eval_batch_size`: twice the batch), or None where that is known only later (a checkpoint's, a
# file's). That value written out hashes as unset: one computation, one run id.
DERIVED = "derived"

# field metadata: a function of the settings block, true where the field is not read at all
# (`epochs` beside `max_steps`, which sets the schedule alone): hashed as its default there, so
# the recipes that differ only in it are one run id
UNUSED_WHEN = "unused_when"

# field metadata: a function of the settings block, true where the field cannot change the run's
# result (its model/, its scores, what its finished folder holds) but only what is seen on the way
# (`report_to`: which trackers are told; `log_every`: how often the loss is logged; `save_every` and
# `save_total_limit` where no step checkpoint is kept) or where its data is read from (`data_dir`,
# whose files are in the run id by their contents): hashed as its default, always, so a launch that
# differs only in it is the same run ("finished already", a resume), not a second one (it was)
NO_EFFECT = "no_effect"


def _sorted(items: list) -> list:
    """`items` in one order whatever order they were written in (numbers and strings apart)."""
    return sorted(items, key=lambda item: (type(item).__name__, item))


def unhashed(settings: Any, data: dict, canonical: bool = True, written: tuple[str, ...] = (),
             parent: Any = None, no_effect: bool = True) -> dict:
    """`data` (the settings dataclass `settings` as plain data) without the fields that hold their
    neutral value (`added`), nested settings blocks too: what a recipe's hash covers. With
    `canonical`, each computation in one form: an `UNORDERED` list sorted, a `DERIVED` field whose
    value is the one its unset stands for as unset, an `UNUSED_WHEN` field that is not read as its
    default (except the fields named in `written`: --smoke's sizes, see Recipe.hashed_dict), a
    `NO_EFFECT` field where it cannot change the result as its default.
    Without it: the hash as it was before those rules (Recipe.hash_as_before, which finds the
    runs made then); without `no_effect`, the first canonical forms, before NO_EFFECT
    (Recipe.hash_as_first_forms)."""
    out = dict(data)
    for f in dataclasses.fields(settings):
        if f.name not in out:
            continue
        value = getattr(settings, f.name)
        if is_neutral(f, value):
            del out[f.name]
        elif dataclasses.is_dataclass(value) and isinstance(out[f.name], dict):
            out[f.name] = unhashed(value, out[f.name], canonical, parent=settings, no_effect=no_effect)
        elif not canonical:
            continue
        elif no_effect and NO_EFFECT in f.metadata and f.metadata[NO_EFFECT](settings):
            out[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        elif f.metadata.get(UNORDERED) and isinstance(out[f.name], list):
            out[f.name] = _sorted(out[f.name])
        elif DERIVED in f.metadata and value is not None and f.name not in written \
                and derived_value(f, settings, parent) == value:
            out[f.name] = None
        elif UNUSED_WHEN in f.metadata and f.name not in written and f.metadata[UNUSED_WHEN](settings):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out[f.name] = default
    return out


def value_of(settings: Any, name: str, parent: Any = None) -> Any:
    """Field `name` of `settings` as the toolkit reads it: as set, else the value its unset stands
    for (its `DERIVED` function: the one rule the hash and the readers share)."""
    value = getattr(settings, name)
    if value is not None:
        return value
    return derived_value(next(f for f in dataclasses.fields(settings) if f.name == name), settings, parent)


def derived_value(f: dataclasses.Field, settings: Any, parent: Any = None) -> Any:
    """The value field `f` of `settings` (inside `parent`, if nested) takes when unset (its
    `DERIVED` function), or None where the settings do not say it."""
    try:
        return f.metadata[DERIVED](settings, parent)
    except (TypeError, ValueError, AttributeError, ZeroDivisionError):
        return None
