"""The Python API's arguments checked against its functions' own annotations, before any work.

`@typed` reads a function's type hints and, for every argument given, either returns it in its
plain form or raises one UserError naming the function, the argument and the type expected.
A string (or a path, or a mapping) where a list goes is one item, never a list of letters;
any other iterable is read into a list once, so a generator is not consumed twice. The hints
are the signature the user reads (`help(toolkit.run)`), so a new API function is checked by
declaring its types. Hand-written because the checking libraries (typeguard, beartype) check but
do not normalise, and their messages name Python internals rather than the argument to fix.

The command line's arguments: `Parser`, argparse's parser whose refusal is an `ArgumentsError`
(`toolkit`'s commands, said in one line by cli.main), and `ScriptParser`, the same for a script
with a main of its own (`benchmarks/`), which says it in one line itself, exit 2.
"""

from __future__ import annotations

import argparse
import collections.abc
import functools
import inspect
import os
import sys
import types
import typing
from typing import Any, Callable, TypeVar

from toolkit import quiet
from toolkit.errors import UserError, user_path

Fn = TypeVar("Fn", bound=Callable[..., Any])
_MISMATCH = object()  # what `conform` returns for a value that does not fit
SINGLE = (str, bytes, os.PathLike, collections.abc.Mapping)  # one item where a list goes


def typed(fn: Fn) -> Fn:
    """Check (and normalise) every argument of `fn` against its annotations (module docstring)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        hints = typing.get_type_hints(fn)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise UserError(f"{fn.__name__}: {exc}") from None
        for name, value in list(bound.arguments.items()):
            if name in hints:
                bound.arguments[name] = check(value, hints[name], f"{fn.__name__}: {name}")
        return fn(*bound.args, **bound.kwargs)

    return wrapper  # type: ignore[return-value]


def check(value: Any, tp: Any, where: str) -> Any:
    """`value` in its plain form if it fits `tp`, else one UserError saying what `where` expects."""
    result = conform(value, tp, where)
    if result is _MISMATCH:
        raise UserError(f"{where}: expected {describe(tp)}, got {_kind(value)}")
    if isinstance(result, str) and not result.strip() and _is_path(tp):  # runs_dir="" was the default folder
        raise UserError(f"{where}: an empty path; give a file or a folder" +
                        (", or None for the default" if type(None) in typing.get_args(tp) else ""))
    if _is_path(tp) and isinstance(result, (str, os.PathLike)):  # `~` and $VARS, as the CLI and a recipe read them
        return str(user_path(result)) if isinstance(result, str) else user_path(result)
    return result


def _is_path(tp: Any) -> bool:
    """A path annotation: str | os.PathLike (optionally | None)."""
    return {str, os.PathLike} <= set(typing.get_args(tp))


def conform(value: Any, tp: Any, where: str) -> Any:
    """The plain form of `value` as `tp` (lists for iterables, dicts for mappings), or _MISMATCH;
    an item of a list that does not fit raises at once, naming its position."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if tp is None or tp is type(None):
        return value if value is None else _MISMATCH
    if origin in (typing.Union, types.UnionType):
        for option in args:
            result = conform(value, option, where)
            if result is not _MISMATCH:
                return result
        return _MISMATCH
    if origin in (collections.abc.Mapping, dict):
        if not isinstance(value, collections.abc.Mapping):
            return _MISMATCH
        key_tp, value_tp = args or (Any, Any)
        return {check(k, key_tp, f"{where} key"): check(v, value_tp, f"{where}[{k!r}]") for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, tuple) or len(value) != len(args):
            return _MISMATCH
        return tuple(check(v, t, f"{where}[{i}]") for i, (v, t) in enumerate(zip(value, args)))
    if origin in (collections.abc.Iterable, collections.abc.Sequence, list):
        (item_tp,) = args or (Any,)
        if isinstance(value, SINGLE):
            single = conform(value, item_tp, where)
            return _MISMATCH if single is _MISMATCH else [check(value, item_tp, where)]
        if not isinstance(value, collections.abc.Iterable):
            return _MISMATCH
        return [check(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        return value if isinstance(value, bool) else _MISMATCH
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _MISMATCH
    if tp is float:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _MISMATCH
    if tp is os.PathLike:
        return value if isinstance(value, os.PathLike) else _MISMATCH
    if isinstance(tp, type):
        return value if isinstance(value, tp) else _MISMATCH
    return value  # an annotation this checker does not model: taken as it is


def describe(tp: Any) -> str:
    """An annotation in words: 'a path (str or os.PathLike)', 'a list of strings'."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        words = [describe(a) for a in args if a is not os.PathLike]
        if str in args and os.PathLike in args:  # str | os.PathLike is a path
            words = ["a path (str or os.PathLike)"] + [describe(a) for a in args if a not in (str, os.PathLike)]
        return " or ".join(dict.fromkeys(words))
    if origin in (collections.abc.Mapping, dict):
        return "a mapping (dict)"
    if origin is tuple:
        return f"a tuple of {len(args)} ({', '.join(describe(a) for a in args)})"
    if origin in (collections.abc.Iterable, collections.abc.Sequence, list):
        return f"a list of {_plural(args[0]) if args else 'items'}"
    return {type(None): "None", bool: "True or False", int: "an integer", float: "a number", str: "a string",
            os.PathLike: "a path"}.get(tp, getattr(tp, "__name__", str(tp)))


def _plural(tp: Any) -> str:
    words = describe(tp)
    for one, many in (("a path (str or os.PathLike)", "paths (str or os.PathLike)"), ("a string", "strings"),
                      ("a mapping (dict)", "mappings (dict)")):
        words = words.replace(one, many)
    return words


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


class ArgumentsError(UserError):
    """argparse's refusal of the command line (an unknown option, a missing argument, a bad choice
    or number), raised where argparse printed the command's usage block and `toolkit: error: ...`,
    and said by main() as one line naming the subcommand and where its options are listed."""

    def __init__(self, prog: str, message: str, unknown: list[str] | None = None) -> None:
        super().__init__(message)
        self.prog, self.message, self.unknown = prog, message, unknown or []


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are an ArgumentsError, not usage + exit: the subcommands'
    parsers are of this class too (add_subparsers makes its own kind). --help is argparse's own.
    An option is given by its whole name: argparse took a prefix for the option it begins, so
    `sweep R --seed 7` was `--seeds 7`, seven seeds from 42 (not the seed 7), exit 0; a prefix is
    now an unknown option, said with the whole name (`did you mean --seeds?`)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        raise ArgumentsError(self.prog, message)

    def _get_value(self, action, arg_string):  # type: ignore[no-untyped-def]
        """A value a type of ours refused (_given: an empty path), said with the command's name."""
        try:
            return super()._get_value(action, arg_string)
        except UserError as exc:
            raise UserError(f"{self.prog}: {exc}") from None


class ScriptParser(Parser):
    """The parser of a script with a main of its own (`benchmarks/`): a user error (an unknown
    option, a missing argument, a bad value) is one line naming the script and the option, exit 2,
    as `toolkit`'s own (`Parser`, said by cli.main); argparse printed the usage block first. --help
    is argparse's own. Once its arguments parse, the script is quiet as `toolkit` is (toolkit.quiet:
    the libraries' warnings, load reports and progress bars off; `-v` shows them, and the processes
    the script starts inherit either): `benchmarks/parity --smoke` with a fresh cache drew
    transformers' "Writing model shards" bar on stderr before its table or its error line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("-v", "--verbose", action="store_true",
                          help="show the libraries' warnings, load reports and progress bars (quiet by default, "
                               "as toolkit -v)")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def, override]
        parsed, extra = super().parse_known_args(args, namespace)
        if parsed.verbose:
            os.environ[quiet.VERBOSE] = "1"
        quiet.libraries()
        return parsed, extra

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {self.prog}: {message} ({self.prog} --help lists its options)", file=sys.stderr, flush=True)
        raise SystemExit(2)

    def _get_value(self, action, arg_string):  # type: ignore[no-untyped-def]
        try:
            return super()._get_value(action, arg_string)
        except UserError as exc:  # a type of the toolkit's refused a value (said with the script's name)
            print(f"error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
