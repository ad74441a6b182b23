"""Which column of a user's file is the input and which the output, when the recipe names none.

Own data in two arguments (`task.train_file`, `task.eval_file`) needs the fields found as
transformers' run_glue / run_summarization find them: conventional names first (`text`,
`document`, `dialogue`, `source` ... are inputs; `summary`, `target`, `label` ... outputs), then,
for a file of two columns, the text-like one is the input: the longer texts (a document beside
its summary) or the many distinct values (a sentence beside its label). Where that does not
decide (two columns of like texts, three unknown columns), one line lists the candidates and the
recipe keys to set: run_summarization would take the first two columns silently.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

from toolkit import readers
from toolkit.errors import UserError

# Columns that are neither input nor output: skipped when counting candidates.
ID_NAMES = ("id", "idx", "index", "guid", "uid", "key", "instruction")
KEY_NAMES = ID_NAMES[:-1]  # those that name a record: kept beside its prediction (`row_key`)

TEXT_INPUTS = ("text", "sentence", "document", "dialogue", "article", "source", "input", "content",
               "body", "passage", "review", "prompt")
LABEL_OUTPUTS = ("label", "labels", "score", "class", "category", "target", "y")
TEXT_OUTPUTS = ("summary", "target", "highlights", "abstract", "output", "headline", "completion",
                "response", "reference", "translation")
SAMPLE = 500  # rows read to compare columns (the first ones: the file's head)
MARGIN = 1.5  # how much more text-like the input must be than the output to decide by it


@dataclass(frozen=True)
class Keys:
    """The recipe keys that name the two fields, for the line that asks to set them."""

    source: str
    target: str


def named(columns: list[str], names: tuple[str, ...], skip: tuple[str, ...] = (), where: str = "") -> str | None:
    """The first column (case and outer spaces ignored) bearing one of `names`, in `names`' order;
    two columns of that one name (`label` and `Label `) are one line, never the last one taken."""
    folded: dict[str, list[str]] = {}
    for c in columns:
        if c not in skip:
            folded.setdefault(c.strip().lower(), []).append(c)
    for n in (n.strip().lower() for n in names):  # a name given in capitals (a code: zh-CN) too
        if n in folded:
            if len(folded[n]) > 1:
                raise UserError(f"{where}: the fields {' and '.join(repr(c) for c in folded[n])} are one name "
                                "once case and spaces are ignored; rename one")
            return folded[n][0]
    return None


def language_tag(code: str) -> tuple[str, ...]:
    """A BCP-47-ish language code as its parts, case and separator ignored: zh-CN, zh_cn and
    ZH-cn are one code (BCP 47 tags are case-insensitive; `_` is the POSIX locale's separator)."""
    return tuple(p for p in code.strip().lower().replace("_", "-").split("-") if p)


def language_field(columns: list[str], code: str, where: str) -> str | None:
    """The field a language code names: the one whose name is that code (any case, `-` or `_`),
    else the one whose language part is the code's (`pt_BR` for pt, `pt` for pt-BR); None where
    no field, or several alike (`zh-CN` and `zh-TW` for zh), fit."""
    tag = language_tag(code)
    same = [c for c in columns if tag and language_tag(c) == tag]
    if len(same) > 1:
        raise UserError(f"{where}: the fields {' and '.join(repr(c) for c in same)} are one language "
                        f"code ({code}) once case and - or _ are ignored; rename one")
    alike = same or [c for c in columns if tag and language_tag(c)[:1] == tag[:1]]
    return alike[0] if len(alike) == 1 else None


def candidates(columns: list[str], taken: tuple[str, ...] = ()) -> list[str]:
    return [c for c in columns if c not in taken and c.strip().lower() not in ID_NAMES]


def row_key(row: dict, read: list[str]) -> dict:
    """{name: value} of an input row's id field (`id`, `idx`, `index`, `guid`, `uid` or `key`, case
    and outer spaces ignored; not one the task reads), else {}: a prediction row starts with it,
    as the QA rows start with their question's id, so predictions join their inputs by key (a
    test file's `id` was dropped, and the rows could be matched by position alone)."""
    name = next((n for n in row if n not in read and str(n).strip().lower() in KEY_NAMES), None)
    return {} if name is None else {name: row[name]}


def text_likeness(values: list[Any]) -> tuple[float, float]:
    """(mean characters, share of distinct values) of a column's first rows."""
    texts = [str(v) for v in values[:SAMPLE] if v is not None]
    if not texts:
        return 0.0, 0.0
    return sum(map(len, texts)) / len(texts), len(set(texts)) / len(texts)


def _strings(values: list[Any]) -> list[str] | None:
    """A column's values where every one is text and not all are numbers written as text."""
    values = [v for v in values if v is not None]
    if not values or not all(isinstance(v, str) for v in values) or all(_number(v) for v in values):
        return None
    return values


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def likeliest_text(ds: Any, columns: list[str]) -> str | None:
    """The column of `columns` most like a text, for the example a "cannot tell" line gives: one
    a conventional input name names (`review`, `body`), else the one clearly so by its values
    (strings, not numbers written as text, the longest by MARGIN); None where none is (the line
    then lists the columns without one). The example was the first column, an id
    (`task.text_columns=[row_id]`) as readily as the text."""
    by_name = named(columns, TEXT_INPUTS)
    if by_name is not None:
        return by_name
    head = ds.select(range(min(SAMPLE, len(ds))))
    lengths = {c: text_likeness(v)[0] for c in columns if (v := _strings(head[c]))}
    ranked = sorted(lengths, key=lambda c: -lengths[c])
    if ranked and (len(ranked) == 1 or lengths[ranked[0]] >= MARGIN * lengths[ranked[1]]):
        return ranked[0]
    return None


def likeliest_label(ds: Any, columns: list[str]) -> str | None:
    """The column of `columns` clearly most like a class label (two or more values, the fewest
    distinct by MARGIN), for a "cannot tell" line's example; None where none clearly is (a
    constant column is no label; it was the example as the last column)."""
    head = ds.select(range(min(SAMPLE, len(ds))))
    shares = {}
    for c in columns:
        values = [str(v) for v in head[c] if v is not None]
        if len(set(values)) > 1:
            shares[c] = text_likeness(values)[1]
    ranked = sorted(shares, key=lambda c: shares[c])
    if ranked and (len(ranked) == 1 or shares[ranked[0]] * MARGIN <= shares[ranked[1]]):
        return ranked[0]
    return None


def example(*settings: tuple[str, str | None]) -> str:
    """`, e.g. key=value ...` for the settings whose value is known, else nothing."""
    known = [f"{key}={value}" for key, value in settings if value is not None]
    return f", e.g. {' '.join(known)}" if known else ""


def by_likeness(ds: Any, a: str, b: str, measure: int) -> tuple[str, str] | None:
    """(input, output) of two columns when one is clearly the more text-like by `measure`
    (0: mean length, 1: share of distinct values), else None."""
    head = ds.select(range(min(SAMPLE, len(ds))))
    la, lb = text_likeness(head[a])[measure], text_likeness(head[b])[measure]
    if la >= MARGIN * lb and la > 0:
        return a, b
    if lb >= MARGIN * la and lb > 0:
        return b, a
    return None


HEADER_WORDS = 4  # a header whose every name has this many words or more reads as a record of texts


def no_record_as_header(ds: Any, where: str) -> None:
    """A CSV/TSV whose fields are to be found (the recipe names not all of them) and whose header
    line reads as a record: a file written without a header (`df.to_csv(header=False)`, R's
    `col.names=FALSE`, a hand-made file) had its first record taken for the names, so that record
    was read by no split and the fields found were named by its values (`task.label_column: neg`),
    exit 0. pandas (run_glue, run_summarization) reads such a file so too, but there the columns
    are named by the recipe or found by name. Read as a record: a name that is also a value of its
    own column where that column's values repeat (the first record's label, `neg` beside `pos` and
    `neg`; a text column's name that one of its texts repeats is no sign), a name that is a number
    over a column of numbers (a score; not pandas' default names 0, 1, ... of a DataFrame written
    without its own), or a header whose every name is a text of HEADER_WORDS words or more (a
    document and its summary). One line; a header that is one is kept by naming the fields."""
    if not where.lower().removesuffix(".gz").endswith((".csv", ".tsv")):
        return
    columns = list(ds.column_names)
    if columns == [str(i) for i in range(len(columns))]:  # pandas' names for unnamed columns
        return
    import pyarrow.compute as pc

    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    head = ds.select(range(min(SAMPLE, len(ds))))
    why = None
    for name in columns:
        if text_likeness(head[name])[1] <= 0.5 and \
                pc.any(pc.equal(pc.utf8_trim_whitespace(table.column(name)), name.strip())).as_py():
            why = f"{name!r} is also a value of its column"
        elif _number(name) and all(_number(v) for v in head[name]):
            why = f"{name!r} is a number, as its column's values are"
        if why:
            break
    if why is None and len(columns) > 1 and all(len(n.split()) >= HEADER_WORDS for n in columns):
        why = f"every name is a text of {HEADER_WORDS} words or more"
    if why:
        raise UserError(f"{where}:1: the header line reads as a record ({why}): a file without a header has its "
                        "first record read as the column names, and trains without it; add a header line "
                        "naming the columns (e.g. text,label), or name the fields in the recipe if this "
                        "header is meant")


def pick_pair(ds: Any, where: str, source: str | None, target: str | None, keys: Keys,
              inputs: tuple[str, ...], outputs: tuple[str, ...], measure: int | None = 0,
              fill: bool = True) -> tuple[str, str]:
    """(input field, output field) of a file: given ones kept, conventional names next, the one
    other column beside a known one (`fill`), then the more text-like of two columns (`measure`,
    None: never by content); else one UserError line listing the candidates and `keys`."""
    columns = list(ds.column_names)
    for value, key in ((source, keys.source), (target, keys.target)):
        if value is not None and value not in columns:
            raise UserError(f"{where}: has no field '{value}' ({key}); its fields: "
                            f"{', '.join(repr(c) for c in columns)}" + readers.near_name(value, columns))
    if source is None or target is None:  # to be found by name or content: not by a record's values
        no_record_as_header(ds, where)
    if source is not None and source == target:
        raise UserError(f"{keys.source} and {keys.target} are both '{source}'; name two fields")
    source = source or named(columns, inputs, skip=(target,), where=where)
    target = target or named(columns, outputs, skip=(source,), where=where)
    rest = candidates(columns, taken=tuple(c for c in (source, target) if c))
    if source is None and target is not None and len(rest) == 1 and fill:
        source = rest[0]
    elif target is None and source is not None and len(rest) == 1 and fill:
        target = rest[0]
    elif source is None and target is None and len(rest) == 2 and measure is not None:
        source, target = by_likeness(ds, rest[0], rest[1], measure) or (None, None)
    if source is None or target is None or source == target:
        source_eg = source or likeliest_text(ds, rest or columns)
        target_eg = target or likeliest_text(ds, [c for c in rest or columns if c != source_eg])
        raise UserError(f"{where}: cannot tell which field is the input and which the output "
                        f"(fields: {', '.join(repr(c) for c in columns)}); set {keys.source} and "
                        f"{keys.target}" + example((keys.source, source_eg), (keys.target, target_eg)))
    return source, target


def pick_text(ds: Any, where: str, key: str, names: tuple[str, ...] = TEXT_INPUTS) -> str:
    """The one text field of a file of documents: conventional names, else its only column."""
    columns = list(ds.column_names)
    return one_text(columns, where, names, lambda first: f"set {key}" + example((key, first)),
                    likely=lambda rest: likeliest_text(ds, rest))


def one_text(columns: list[str], where: str, names: tuple[str, ...], fix: Any, fill: bool = True,
             likely: Any = None) -> str:
    """The text field among `columns`: the first of `names` present, else (`fill`) the only
    candidate column; else one line listing the fields and `fix(example)`, the example the
    candidate `likely(candidates)` names (None: none clearly), else the first candidate."""
    found = named(columns, names, where=where)
    rest = candidates(columns)
    if found is None and fill and len(rest) == 1:
        found = rest[0]
    if found is None:
        raise UserError(f"{where}: cannot tell which field holds the text (fields: "
                        f"{', '.join(repr(c) for c in columns)}); "
                        + fix(likely(rest or columns) if likely else (rest or columns or ['?'])[0]))
    return found


MISSING_MARKS = readers.MISSING_MARKS  # what pandas, R and Python write for a missing value


def missing_marks(names: Any) -> list[str]:
    """The names (labels) that pandas, R or Python write for a missing value (`MISSING_MARKS`)."""
    return sorted(n for n in names if isinstance(n, str) and n.strip() in MISSING_MARKS)


def quoted(names: list[str]) -> str:
    """Names as the messages show them: quoted, so a space at an end is seen."""
    return ", ".join(repr(n) for n in names)


def note_spaced(task: Any, columns: list[str], where: str) -> None:
    """A warning (once per run) for field names with a space at an end: `'sentence '` is read
    as written, and a recipe naming `sentence` would not find it."""
    spaced = [c for c in columns if c != c.strip()]
    if spaced:
        task.note(f"spaced names {where}", f"{where}: {len(spaced)} field name(s) with a space at an end "
                                           f"({quoted(spaced)}); they are read as written, spaces included")


def alike_names(values: Any, number: Any = None) -> tuple[int, str]:
    """(how many groups, the first three shown) of names (labels, tags) that differ only in case,
    spaces at an end, Unicode form (NFKC: `café` as one code point or two, full-width letters),
    characters that show nothing (control and format characters: a BOM two joined files left,
    a zero-width space, the soft hyphen) or, where `number` (a compiled pattern) matches, how a
    number is written (`1`, `1.0`, `01`, `+1`). Each group is written quoted, escaped (`ascii`)
    where two of it would look the same. (0, "") where none are alike."""
    groups: dict[Any, list[str]] = {}
    for value in values:
        text = _visible(unicodedata.normalize("NFKC", value)).strip()
        key = ("number", float(text)) if number is not None and number.fullmatch(text) else ("text", text.casefold())
        groups.setdefault(key, []).append(value)
    alike = sorted(sorted(g) for g in groups.values() if len(g) > 1)
    shown = "; ".join(" / ".join(map(_shown(g), g)) for g in alike[:3]) + ("; ..." if len(alike) > 3 else "")
    return len(alike), shown


def _shown(group: list[str]) -> Any:
    looks = {_visible(unicodedata.normalize("NFC", v)) for v in group}
    return repr if len(looks) == len(group) else ascii


def _visible(text: str) -> str:
    """`text` without the characters that show nothing but are not spaces (control and format
    characters, as `readers.INVISIBLE` counts them)."""
    return "".join(ch for ch in text if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf"))
