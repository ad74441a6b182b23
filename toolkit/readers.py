"""The one reader of a user's data files, for every task: one line naming FILE:LINE for each fault.

datasets' own Arrow builders (`json`, `csv`, `text`) read the file, in chunks, into its on-disk
cache; the checks then run on the Arrow table, batch by batch, so a large file costs its cache on
disk and a bounded amount of memory. What the builders would report as a pyarrow or pandas
traceback without the file or line is found here first, by one streaming pass over the bytes
(`scan`: size, gzip, UTF-8, nothing but whitespace), or afterwards, on the error path only, by
re-reading the file to put a line number on the record the table names (`where`). A JSONL file
longer than the builder's chunk, whose later chunks it would cast to the first one's types, gets
one more streaming pass first (`_jsonl_types`).

Limits (environment, MiB): TOOLKIT_MAX_INPUT_MB (default 20480) caps the bytes of any file after
decompression, a gzip bomb included; TOOLKIT_MAX_JSON_MB (default 2048) caps a single JSON
document, which has no line structure and is parsed whole (datasets' json builder does so too):
use JSONL above it. Hand-written: the byte scan, the JSON position walker and the messages; the
reading itself is datasets'.
"""

from __future__ import annotations

import codecs
import csv
import glob
import gzip
import hashlib
import io
import json
import logging
import os
import re
import shutil
import stat
import sys
import unicodedata
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from toolkit.errors import UserError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".json": "json", ".jsonl": "jsonl", ".txt": "text"}
CHUNK = 1 << 20


class Unreadable(UserError):
    """The builder failed and no line could be named, or (a JSON document) a field mixes types only
    inside its lists or objects: a task that knows its schema may look closer (SQuAD's nested
    records) before this is said."""


def limit_bytes(name: str, default_mb: int) -> int:
    """A size limit from the environment (MiB, fractions allowed), in bytes."""
    value = os.environ.get(name, "")
    try:
        limit = round(float(value) * (1 << 20)) if value else default_mb << 20
    except ValueError:
        limit = 0
    if not limit > 0:
        raise UserError(f"{name}: expected a positive number of MiB, got '{value}'")
    return limit


def file_format(path: Path, allowed: tuple[str, ...] = ("csv", "tsv", "json", "jsonl")) -> str:
    """csv / tsv / json / jsonl / text from the name (a trailing .gz is the compression)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    fmt = FORMATS.get(suffixes[-1]) if suffixes else None
    if fmt not in allowed:
        names = ", ".join("." + ("txt" if a == "text" else a) for a in allowed)
        raise UserError(f"{path}: unknown data format (use {names}, optionally .gz)")
    return fmt


def _open_bytes(path: Path) -> Any:
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else path.open("rb")


def scan(path: Path, lines: bool = True, name: str | None = None, plain: bool = False,
         digest: Any = None, escapes: bool = False) -> int:
    """One streaming pass over the (decompressed) bytes: the file is there, within the size limit,
    a whole gzip, UTF-8 (the first bad byte named by line), free of NUL bytes, not only whitespace
    and, for line formats (`lines`: all but a JSON document), without a line longer than
    TOOLKIT_MAX_LINE_MB: a binary file or one with no line breaks is refused here, in bounded
    memory, before a builder reads a whole "line" into memory. Returns the decompressed size.
    `name`: how to call the file in messages (`<stdin>` for standard input spooled to a file);
    `plain`: text read line by line, where a carriage return that ends no line is refused
    (`_bare_cr`); `digest`: a hashlib object fed every byte (what the file holds, for the cache);
    `escapes`: JSON, where a string's escaped half of a surrogate pair alone is refused
    (`_lone_surrogate`)."""
    shown = name or str(path)
    if not path.is_file():
        kind = stream_kind(path)
        raise UserError(f"{shown}: is {kind}, not a file; save its bytes to a file and name that" if kind
                        else f"{shown}: no such file" if not path.exists() else f"{shown}: is not a file")
    limit = limit_bytes("TOOLKIT_MAX_INPUT_MB", 20480)
    longest = limit_bytes("TOOLKIT_MAX_LINE_MB", 64) if lines else None
    decoder = codecs.getincrementaldecoder("utf-8")()
    size, count, text_seen, run, cr = 0, 0, False, 0, False
    surrogate, tail = False, b""  # an escape that may be half of a surrogate pair seen; the last bytes
    try:
        with _open_bytes(path) as handle:
            while chunk := handle.read(CHUNK):
                if size == 0:
                    _not_compressed(chunk, shown, path)
                    _not_utf16(chunk, shown)
                    one_bom(chunk, shown)
                size += len(chunk)
                if size > limit:
                    raise UserError(f"{shown}: holds more than {limit / (1 << 20):.3g} MiB of data"
                                    f"{' once decompressed' if path.suffix.lower() == '.gz' else ''}; "
                                    "the limit is TOOLKIT_MAX_INPUT_MB (raise it, or split the file)")
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    line = count + chunk[:max(exc.start, 0)].count(b"\n") + 1
                    raise UserError(f"{shown}:{line}: not UTF-8 text (byte 0x{chunk[exc.start]:02x}); "
                                    "save the file as UTF-8") from None
                nul = chunk.find(b"\x00")
                if nul >= 0:
                    line = count + chunk[:nul].count(b"\n") + 1
                    raise UserError(f"{shown}:{line}: holds a NUL byte (binary data, or UTF-16 text?); "
                                    "expected UTF-8 text")
                run = _line_run(chunk, run, longest, shown, count)
                cr = _bare_cr(chunk, cr, shown, count) if plain else False
                if escapes and not surrogate:
                    surrogate = SURROGATE_HINT.search(tail + chunk) is not None
                    tail = chunk[-5:]
                if digest is not None:
                    digest.update(chunk)
                count += chunk.count(b"\n")
                text_seen = text_seen or bool(chunk.strip().lstrip(codecs.BOM_UTF8).strip())
            decoder.decode(b"", final=True)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise UserError(f"{shown}: not a readable gzip file ({exc})") from None
    except OSError as exc:  # not the gzip's fault: a file it may not read, a disk error
        raise UserError(f"{shown}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UserError(f"{shown}:{count + 1}: not UTF-8 text (the file ends inside a character)") from None
    if not text_seen:
        raise UserError(f"{shown}: the file is empty" + (" (only whitespace)" if size else ""))
    if surrogate:
        _no_lone_surrogate(path, shown)
    return size


SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]")  # what begins an escaped half of a surrogate pair
SURROGATE = re.compile("[\ud800-\udfff]")  # in a str: what JSON's lone escapes leave, no character
JSON_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)")  # one escape of a JSON string, left to right


def _no_lone_surrogate(path: Path, shown: str) -> None:
    """A JSON string holding an escaped half of a UTF-16 surrogate pair without its other half
    (`"\\ud83d"`: a text cut inside an emoji by a UTF-16 tool, as JavaScript's slice() cuts one,
    written by json.dumps) is one line naming its line: it is no character, and datasets' json
    builder dropped it from a JSON list without a word (ujson), the text trained without it,
    exit 0, while JSON lines with one were "could not be read as jsonl (ValueError: Trailing
    data at position 130)", no line named. A pair (`\\ud83d\\ude00`) is the character it
    encodes. Run where `scan` saw such an escape, over the file's lines (an escape is never
    split between two)."""
    with open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if "\\u" not in line:
                continue
            high = None  # (where a high half's escape ends, the escape)
            for match in JSON_ESCAPE.finditer(line):
                code = int(match.group(1), 16) if match.group(1) else None
                if high is not None:
                    if code is not None and 0xDC00 <= code <= 0xDFFF and match.start() == high[0]:
                        high = None
                        continue
                    break
                if code is not None and 0xD800 <= code <= 0xDBFF:
                    high = (match.end(), match.group(0))
                elif code is not None and 0xDC00 <= code <= 0xDFFF:
                    high = (match.end(), match.group(0))
                    break
            if high is not None:
                raise UserError(f"{shown}:{number}: a string holds {high[1]}, one half of a UTF-16 surrogate pair "
                                "without the other (a text cut inside an emoji or another character past U+FFFF), "
                                "which is no character; datasets' JSON reader would drop it or fail: remove it, or "
                                "write the character whole")


# The first bytes of compressed files: what a file holds when its name does not say so
COMPRESSED = {b"\x1f\x8b": "gzip", b"PK\x03\x04": "zip", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd",
              b"BZh": "bzip2"}


# What datasets' readers take a file beginning so for, whatever its name (its magic numbers that
# UTF-8 text can begin with): such a text file cannot be read by them
DATASETS_MAGIC = {b"BZh": "bzip2", b"PK\x03\x04": "zip", b"PK\x05\x06": "zip", b"PK\x07\x08": "zip",
                  b"\x04\x22\x4d\x18": "lz4"}


def _not_compressed(head: bytes, shown: str, path: Path) -> None:
    """A (decompressed) file that is itself compressed is one line naming the compression: it was
    "not UTF-8 text (byte 0x8b)". A gzip file is read when its name ends in .gz; the others are
    to be decompressed first."""
    for magic, kind in COMPRESSED.items():
        if head.startswith(magic) and (kind != "bzip2" or head[3:10].startswith(b"1AY&SY", 1)):
            inner = " inside the .gz" if path.suffix.lower() == ".gz" else ""
            fix = (f"name it {path.name}.gz" if kind == "gzip" and not inner and shown == str(path) else
                   "decompress it first (only gzip is read, by a name ending in .gz)")
            raise UserError(f"{shown}: holds {kind}-compressed data{inner}, not text; {fix}")


UNICODE_MARKS = {codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32",  # before UTF-16: FF FE begins both
                 codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16"}


def one_bom(head: bytes, shown: str) -> None:
    """A file that begins with more than one UTF-8 byte order mark (a file re-saved "as UTF-8" by a
    tool that read its BOM as text, files joined with theirs) is one line: every reader strips
    one, so the rest began the first column's name (`\ufefftext`: conventional-name inference
    missed `text`, a named column was "missing"), the first CoNLL word or the first line of text,
    exit 0, and CSV / JSON were a builder's error. Said by `scan`, which every read of a file
    passes (CSV, TSV, JSON, JSONL, CoNLL, text, predict's inputs), and by validate's `head_names`."""
    marks = 0
    while head.startswith(codecs.BOM_UTF8, marks * 3):
        marks += 1
    if marks > 1:
        raise UserError(f"{shown}: begins with {marks} UTF-8 byte order marks (U+FEFF), where a file has one at "
                        "most: the others would be read as the start of its first field; remove them (save it "
                        "as UTF-8, or strip the leading EF BB BF bytes)")


def one_json_document(path: Path) -> None:
    """A `.json` file holding JSON lines (one object a line, as transformers' example scripts
    write and datasets' json builder reads under `.json`) is one line asking for `.jsonl`: it was
    "expected a JSON list of objects" for a list reader, and `x.json:2: not valid JSON (Extra
    data)` for the readers that take a `{"data": [...]}` document (summarization, translation,
    SQuAD, predict's inputs), neither saying what the file is. Told from the file's first MiB:
    an object, then a line break and another object. Nothing else is changed: a .json file is one
    JSON document (a list of records, or `{"data": [...]}`), a .jsonl file a record a line. Called
    by `read` (every reader of a .json file) and by validate (recipe.check_data)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes.pop()
    if suffixes[-1:] != [".json"]:  # a name file_format reads as another format, or as none
        return
    try:
        with _open_bytes(path) as raw:
            head = raw.read(HEAD_BYTES).decode("utf-8-sig", errors="replace").lstrip()
    except (OSError, EOFError, zlib.error):
        return  # the read names what is wrong with the file
    if not head.startswith("{"):
        return
    try:
        end = json.JSONDecoder().raw_decode(head)[1]
    except ValueError:  # not JSON, or a first object past the head: the read says what it is
        return
    rest = head[end:]
    after = rest.lstrip()
    if "\n" in rest[:len(rest) - len(after)] and after.startswith("{"):
        raise UserError(f"{path}: holds JSON lines (one object a line), not one JSON document; a .json file is "
                        "read as a list of records (or {\"data\": [...]}): name it .jsonl"
                        + (".gz" if path.suffix.lower() == ".gz" else ""))


def one_bom_at_most(path: Path) -> None:
    """`one_bom` on a file's first bytes, for validate (recipe.check_data), which reads no more of a
    file with no header (text, CoNLL); a file that cannot be read is left to the read to name."""
    try:
        with _open_bytes(path) as raw:
            head = raw.read(12)
    except (OSError, EOFError, zlib.error):
        return
    one_bom(head, str(path))


def _not_utf16(head: bytes, shown: str) -> None:
    """A file that begins with UTF-16's (or UTF-32's) byte order mark, as Excel's "Unicode Text"
    and Windows tools save text, is said as such: it was `not UTF-8 text (byte 0xff)`."""
    for mark, kind in UNICODE_MARKS.items():
        if head.startswith(mark):
            raise UserError(f"{shown}: holds {kind} text (it begins with {kind}'s byte order mark); save the file "
                            "as UTF-8")


def _line_run(chunk: bytes, run: int, longest: int | None, shown: str, count: int) -> int:
    """Bytes since the last line break once `chunk` is read (`run`: before it); a line longer
    than `longest` is refused, naming it."""
    if longest is None:
        return 0
    parts = chunk.split(b"\n")
    lengths = [run + len(parts[0])] + [len(p) for p in parts[1:]]
    for i, length in enumerate(lengths):
        if length > longest:
            raise UserError(f"{shown}:{count + i + 1}: no line break within {longest / (1 << 20):.3g} MiB; "
                            "expected text with one record a line (the limit is TOOLKIT_MAX_LINE_MB)")
    return lengths[-1]


def _bare_cr(chunk: bytes, carried: bool, shown: str, count: int) -> bool:
    """Refuses a carriage return that is not part of a \\r\\n line end (`carried`: the last chunk
    ended with one); returns whether this chunk does. datasets' text builder and Python's text
    files break a line there, other readers (and `wc -l`) do not: line-aligned files would shift."""
    found = 0 if carried and not chunk.startswith(b"\n") else None
    if found is None:
        match = re.search(rb"\r(?!\n)", chunk[:-1] if chunk.endswith(b"\r") else chunk)
        found = match.start() if match else None
    if found is not None:
        line = count + chunk[:found].count(b"\n") + 1
        raise UserError(f"{shown}:{line}: a carriage return (\\r) inside a line, where datasets' text reader "
                        "would break it and line-aligned files would shift; lines end at \\n or \\r\\n: "
                        "remove it (or save the file with \\n line ends)")
    return chunk.endswith(b"\r")


# Characters nothing is read from: whitespace, control characters (\x00-\x1f but tab and line
# breaks are whitespace too) and format characters (zero-width space U+200B, joiners, the BOM
# U+FEFF, the soft hyphen). A text of these alone is blank: BERT's and T5's tokenizers drop them
# all (the model then reads [CLS] [SEP] or </s> alone, and predicts a label for no text at all).
INVISIBLE = ("Cc", "Cf", "Zs", "Zl", "Zp")
BLANK_PATTERN = r"^[\s\p{Z}\p{Cc}\p{Cf}]*$"  # the same rule in RE2, for pyarrow


def blank(text: str) -> bool:
    """Whether `text` holds nothing but whitespace, control and format characters."""
    return all(ch.isspace() or unicodedata.category(ch) in INVISIBLE for ch in text)


def read_lines(source: str) -> tuple[list[str], str, list[int]]:
    """(the non-blank lines, the name to show, the numbers of the blank lines between them) of a
    plain-text file, a pipe (`stream_kind`) or standard input (`-`), with the checks every file
    gets (`scan`), split at \\n and \\r\\n only: U+2028 and the other characters str.splitlines
    breaks at are text inside a line (as the `text` builder reads them). Blank lines after the
    last text are not counted."""
    if source == "-":
        with spooled_stdin() as path:
            return _lines(path, "<stdin>")
    if stream_kind(Path(source)):
        with spooled(Path(source)) as path:
            return _lines(path, source)
    return _lines(Path(source), source)


@contextmanager
def source_file(source: str) -> Iterator[tuple[Path, str]]:
    """(a file holding `source`'s bytes, the name to show): standard input (`-`) and a pipe or
    device spooled (`spooled_stdin`, `spooled`), a file as it is."""
    if source == "-":
        with spooled_stdin() as path:
            yield path, "<stdin>"
    elif stream_kind(Path(source)):
        with spooled(Path(source)) as path:
            yield path, source
    else:
        yield Path(source), source


def lines_of(path: Path, name: str) -> tuple[list[str], str, list[int]]:
    """`read_lines` of a file that `source_file` gave."""
    return _lines(path, name)


@contextmanager
def as_format(path: Path, fmt: str, name: str) -> Iterator[Path]:
    """`path`'s bytes under a name whose extension says `fmt` (`input.csv`), for a reader that
    tells a format by its name; a UserError naming that copy names `name`, what the user gave."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="toolkit-input-") as folder:
        copy = Path(folder) / f"input.{fmt}{'.gz' if name.lower().endswith('.gz') else ''}"
        shutil.copyfile(path, copy)
        try:
            yield copy
        except UserError as exc:
            raise type(exc)(str(exc).replace(str(copy), name)) from None


def _lines(path: Path, name: str) -> tuple[list[str], str, list[int]]:
    lines = [line.removesuffix("\r") for line in _text_of(path, name).split("\n")]
    last = max((i for i, line in enumerate(lines) if not blank(line)), default=-1)
    return ([line for line in lines if not blank(line)], name,
            [i + 1 for i, line in enumerate(lines[:last]) if blank(line)])


def _text_of(path: Path, name: str) -> str:
    scan(path, name=name, plain=True)
    with _open_bytes(path) as raw:
        return raw.read().decode("utf-8-sig")


def stream_kind(path: Path) -> str | None:
    """What a path the OS opens is when it is not a regular file nor a folder: 'a pipe' (bash's
    `<(...)`, which names /dev/fd/N, or a named FIFO), 'a device', 'a socket'; None otherwise (a
    regular file, a folder, nothing there). Such an input gives its bytes once and cannot be
    measured first: `spooled` reads it whole."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return ("a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def stream_refused(setting: str, path: Path) -> str | None:
    """The one line for a data file a recipe names that is a pipe or a device (`stream_kind`),
    None otherwise. `toolkit predict --input` takes one (`spooled`); a recipe does not: a run reads
    its data more than once (its bytes are part of the run id, then it trains on them, a resume
    reads them again), and a pipe gives its bytes once."""
    kind = stream_kind(path)
    if kind is None:
        return None
    return (f"{setting}: {path}: is {kind}, not a file; a run reads its data more than once (the bytes "
            "name the run, then it trains on them): save it to a file and name that")


@contextmanager
def spooled_stdin() -> Iterator[Path]:
    """Standard input's bytes in a temporary file (bounded by TOOLKIT_MAX_INPUT_MB), so that they
    get the checks a file gets, in the same words."""
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="toolkit-stdin-", suffix=".txt") as spool:
        _copy_bounded(sys.stdin.buffer, spool, "<stdin>")
        yield Path(spool.name)


@contextmanager
def spooled(path: Path) -> Iterator[Path]:
    """A pipe or device (`stream_kind`) read once, in full (bounded by TOOLKIT_MAX_INPUT_MB),
    into a temporary file of the same name, so that its extension still says its format and
    every check and reader that opens a file twice (the byte scan, then the builder) reads the
    same bytes. A UserError that names the temporary file is said again with `path`: messages
    name what the user gave."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="toolkit-input-") as folder:
        copy = Path(folder) / (path.name or "input")
        try:
            with path.open("rb") as source, copy.open("wb") as spool:
                _copy_bounded(source, spool, str(path))
        except OSError as exc:
            raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        try:
            yield copy
        except UserError as exc:
            raise type(exc)(str(exc).replace(str(copy), str(path))) from None


def _copy_bounded(source: Any, spool: Any, shown: str) -> None:
    limit = limit_bytes("TOOLKIT_MAX_INPUT_MB", 20480)
    size = 0
    while chunk := source.read(CHUNK):
        size += len(chunk)
        if size > limit:
            raise UserError(f"{shown}: holds more than {limit / (1 << 20):.3g} MiB of data; the limit is "
                            "TOOLKIT_MAX_INPUT_MB")
        spool.write(chunk)
    spool.flush()


def open_text(path: Path) -> Any:
    """The file's text, streamed line by line (gzip too), for readers of line formats datasets
    has no builder for (CoNLL); `scan` first has checked size, gzip and UTF-8."""
    return io.TextIOWrapper(_open_bytes(path), encoding="utf-8-sig")


@contextmanager
def _quiet_builders() -> Iterator[None]:
    """datasets logs a builder failure at ERROR level before raising it: the one line is ours
    (and a file's progress bar is noise beside it)."""
    from datasets.utils import logging as ds_logging

    logger = logging.getLogger("datasets")
    level, bars = logger.level, ds_logging.is_progress_bar_enabled()
    logger.setLevel(logging.CRITICAL)
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            ds_logging.enable_progress_bar()


def document_field(path: Path, fmt: str, field: str | None) -> str | None:
    """`field` where a JSON file is a document (`{"data": [...]}`, first character `{`) and the
    reader takes that layout, else None: a JSON list, JSONL, CSV, or a reader that takes lists only."""
    return field if field and fmt == "json" and first_char(path) == "{" else None


def read(path: Path, fmt: str | None = None, *, field: str | None = None, columns: list[str] | None = None,
         sample_by: str = "line") -> Any:
    """One file -> a datasets.Dataset read by datasets' builder for its format. CSV/TSV cells are
    read as written (strings: labels 01 and 1 stay two, a column of numbers stays text), every
    column named by the header, each once; `field` picks a JSON document's list ({"data": [...]})."""
    from datasets import Features, Value, load_dataset

    fmt = fmt or file_format(path)
    digest = hashlib.sha256()
    size = scan(path, lines=fmt != "json", plain=fmt == "text", digest=digest, escapes=fmt in ("json", "jsonl"))
    literal = builder_path(path)
    kwargs: dict[str, Any] = {}
    if fmt in ("csv", "tsv"):
        header = csv_header(path, fmt)
        csv_rows(path, fmt, len(header))
        kwargs = {"keep_default_na": False, "encoding": "utf-8-sig",
                  "features": Features({name: Value("string") for name in header})}
        if fmt == "tsv":
            kwargs.update(delimiter="\t", quoting=csv.QUOTE_NONE)  # TSV: quotes are text
        builder = "csv"
    elif fmt == "json":
        limit = limit_bytes("TOOLKIT_MAX_JSON_MB", 2048)
        if size > limit:
            raise UserError(f"{path}: a {size / (1 << 20):.2f} MiB JSON document is parsed whole; the limit "
                            f"is {limit / (1 << 20):.3g} MiB (TOOLKIT_MAX_JSON_MB): write it as JSONL, one record a line")
        one_json_document(path)  # JSON lines named .json: said as such by every layout's reader
        first = first_char(path)
        if field is None and first != "[":
            raise UserError(f"{path}: expected a JSON list of objects (or use .jsonl, one object a line)")
        if field is not None and first != "{":
            raise UserError(f"{path}: expected a JSON object with a '{field}' list")
        if field is None and first_item_char(path) not in "{]":  # datasets reads ["a", "b"] as `text`
            raise UserError(_json_problem(path, None) or f"{path}: expected a JSON list of objects")
        json_keys_once(path, field)  # first: a repeated key can empty what the builder reads ({"data": []} last)
        # a document's list ({"data": [...]}) the builder reads with the encoding it is given: a UTF-8
        # BOM (Notepad's, PowerShell's) was "could not be read as json (ValueError: Expected object or
        # value)" there, where a JSON list, JSONL and CSV with one read as written
        builder, kwargs = "json", ({"field": field, "encoding": "utf-8-sig"} if field else {})
    elif fmt == "jsonl":
        if first_char(path) == "[":  # the builder reads it as a list, and no record's line could be named
            raise UserError(f"{path}: holds a JSON list, not JSON lines (one object a line); name it .json")
        spread = _spread_first_record(path)  # the builder reads it, and every line named after was wrong
        if spread:
            raise UserError(spread)
        builder, kwargs = "json", {"chunksize": JSONL_CHUNK}
        if size > JSONL_CHUNK:  # the builder types each field by the first chunk and casts the rest to it
            problem = _jsonl_types(path)
            if problem:
                raise UserError(problem)
    else:
        builder, kwargs = "text", {"sample_by": sample_by, "encoding": "utf-8-sig"}

    def load(**settings: Any) -> Any:
        with _quiet_builders():
            # the cache is named by the bytes: datasets alone keys it on path and mtime, and a file
            # replaced with its mtime kept (cp -p, rsync -t, unzip) would be read as it was
            return load_dataset(builder, name=f"sha256-{digest.hexdigest()}", data_files=literal,
                                split="train", **{**kwargs, **settings})

    try:
        try:
            ds = load()
        except Exception as exc:
            error = _builder_error(path, fmt, exc, field)
            if not (isinstance(error, Unreadable) and fmt == "jsonl" and size > JSONL_CHUNK):
                raise error from None
            # types the first chunk set that later records do not fit, though JSON's type holds (a whole
            # number, later a fraction; a field null or absent at first): typed by the whole file, as a
            # smaller one is, within the memory a JSON document may take
            limit = limit_bytes("TOOLKIT_MAX_JSON_MB", 2048)
            if size > limit:
                raise UserError(f"{path}: a field's values after the first {JSONL_CHUNK >> 20} MiB do not fit the "
                                f"type its first records gave it, and typing it by the whole {size / (1 << 20):.0f} "
                                f"MiB file passes TOOLKIT_MAX_JSON_MB ({limit / (1 << 20):.3g}): raise it, or give "
                                f"the first records every field, numbers as written later ({exc})") from None
            ds = load(chunksize=size + 1)
    except UserError:
        raise
    except Exception as exc:
        raise _builder_error(path, fmt, exc, field) from None
    if fmt in ("csv", "tsv") and len(ds) == 0:
        raise UserError(f"{path}: has a header and no rows")
    if fmt in ("csv", "tsv"):
        _no_header_again(ds, header, path, fmt)
        _no_short_row(ds, header, path, fmt)
    if fmt == "tsv":
        _no_csv_quoting(ds, header, path)
    if len(ds) == 0:
        raise UserError(f"{path}: holds no records")
    if fmt in ("json", "jsonl"):
        ds = _as_written(ds, path, fmt, field)
    if fmt in ("json", "jsonl") and field is None and _a_record_all_null(ds):
        problem = _not_a_record(path, fmt)  # a `null` line: said as what it is, not as missing fields
        if problem:
            raise UserError(problem)
    return ds


def _holds(kind: Any, test: Any) -> bool:
    """Whether an Arrow type is, or holds inside its lists and structs, a type `test` says yes to."""
    import pyarrow as pa

    if test(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _holds(kind.value_type, test)
    if pa.types.is_struct(kind):
        return any(_holds(kind.field(i).type, test) for i in range(kind.num_fields))
    return False


def _dated(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_timestamp(kind) or pa.types.is_date(kind)


def _as_written(ds: Any, path: Path, fmt: str, field: str | None) -> Any:
    """Each field of a JSON(L) file that datasets' json builder holds otherwise than the file
    writes it, taken again from the file, each value as json.loads reads it, typed as Arrow types
    those values:
    - a field whose every string reads as an ISO 8601 date or time (JSON and JSONL): pyarrow's
      JSON reader types it a timestamp (pandas', for a `{"data": [...]}` document, one named
      `date`, `*_at`, `*_time`, ...), so labels "2021-03-04T08:00:00Z" came out as the class
      "2021-03-04 08:00:00", "2020-01-01" and "2020-01-01 00:00:00" (or one instant in two zones)
      were one class, exit 0, and a text field of dates was refused as "a number, expected text";
    - a number with a fraction in a JSON document (a list, or `{"data": [...]}`): the builder
      writes the records again with pandas' ujson, which keeps 10 decimals (and 10 significant
      digits past 1e16), so regression targets 1e-12, 2e-12, 3e-12 were all 0.0, 3.4567e-8 was
      3.46e-8, and labels differing past the 10th decimal were one class, exit 0, where the same
      records as JSONL read as written.
    Nested in lists and objects too (SQuAD's answers). Only where such a field is there (its
    values are compared): one column held in memory; a JSON document is parsed whole anyway."""
    import pyarrow as pa
    from datasets import Dataset
    from datasets.table import InMemoryTable

    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    suspect = (lambda kind: _dated(kind) or pa.types.is_floating(kind)) if fmt == "json" else _dated
    changed, records = False, ()
    for i, named in enumerate(table.schema):
        if not _holds(named.type, suspect):
            continue
        if records == ():  # the file's records walked once, for every field that needs them
            records = _records_of(path, fmt, field)
        values = None if records is None else [r.get(named.name) if isinstance(r, dict) else None for r in records]
        if values is None or len(values) != len(table):
            raise UserError(f"{path}: field '{named.name}' is read by datasets' JSON reader otherwise than the file "
                            "writes it (dates and times as timestamps), and its records cannot be read again one by "
                            "one to keep them as written; write one record a line (JSONL) or as a JSON list")
        try:
            column = pa.array(values)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):  # a whole number past int64 beside
            continue  # fractions: held as doubles, which `check_exact` says where the number names something
        if column.type == named.type and column.equals(table.column(i).combine_chunks()):
            continue  # read as written
        table, changed = table.set_column(i, named.name, column), True
    if not changed:
        return ds
    seen = hashlib.sha256(f"{ds._fingerprint}|as written".encode()).hexdigest()[:16]
    return Dataset(InMemoryTable(table), split=ds.split, fingerprint=seen)


def _records_of(path: Path, fmt: str, field: str | None) -> list[Any] | None:
    """The JSON(L) file's records as json.loads reads them, in record order; None where they
    cannot be walked one by one."""
    try:
        return list(_json_records(path, fmt, field))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def builder_path(path: Path) -> str:
    """`path` as datasets' builders read it, as the one file it names: they take `data_files` for a
    pattern (fsspec's glob), so a file named `train[1].csv` was read as `train1.csv` where both were
    there (`[1]` a character class), `only[2].csv` as no file ('has a header and no rows') and
    `reviews*.csv` as every file its name matches, joined, exit 0, while its own bytes named the run.
    `*`, `?` and `[` are escaped; `::`, which the builders take for a chain of URLs whatever
    precedes it, cannot be, and is one line."""
    text = str(path)
    if "::" in text:
        raise UserError(f"{path}: datasets' readers take '::' in a path for a chain of URLs (zip://...::file) and "
                        "cannot name this file; rename it (or its folder) without '::'")
    return glob.escape(text)


def _a_record_all_null(ds: Any) -> bool:
    """Whether some record has every field null (a `null` line, or `{}`: the file then says which)."""
    import pyarrow.compute as pc

    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    if table.num_columns == 0:
        return False
    nulls = [pc.is_null(table.column(i)) for i in range(table.num_columns)]
    every = nulls[0]
    for more in nulls[1:]:
        every = pc.and_(every, more)
    return bool(pc.any(every).as_py())


# What datasets' json builder reads of a JSONL file at a time (its JsonConfig.chunksize default):
# each field is typed by the first chunk, and later chunks are cast to those types
JSONL_CHUNK = 10 << 20


def _jsonl_types(path: Path) -> str | None:
    """The first record of a JSONL file whose field has another JSON type than earlier records
    gave it, said as `_jsonl_problem` says it; None where every field keeps its type. For a file
    larger than one chunk: the builder cast a later string "1" beside numbers to 1, a later
    number 5 in a text field to "5", exit 0, where a smaller file is refused at that line. A
    streaming pass of the json module (a line that is not JSON is the builder's to say). Inside
    lists and objects too (`tokens[]`, `answers.answer_start[]`): a later word 5 in a list of
    words became "5", a later answer_start "3" became 3."""
    first: dict[str, tuple[str, int]] = {}
    with _open_bytes(path) as raw:
        for n, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8-sig"), start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                return None
            if isinstance(value, dict):
                for key, inner in value.items():
                    changed = _type_change(inner, key, first, n)
                    if changed:
                        return f"{path}:{n}: {changed}"
    return None


def _type_change(value: Any, name: str, first: dict[str, tuple[str, Any]], line: Any, deep: bool = True) -> str | None:
    """`value`'s JSON type against the one `name` had first (`first`, updated), and so on inside
    it (`deep`); nulls fit any type. `line`: a JSONL line number, or a JSON document's "record N"."""
    if value is None:
        return None
    kind = json_type(value)
    seen = first.setdefault(name, (kind, line))
    if seen[0] != kind:
        return f"'{name}' is {kind} here but {seen[0]} at {_at(seen[1])}; one type per field"
    if not deep:
        return None
    inner = value.items() if isinstance(value, dict) else \
        ((None, v) for v in value) if isinstance(value, list) else ()
    for key, item in inner:
        changed = _type_change(item, f"{name}.{key}" if key is not None else f"{name}[]", first, line)
        if changed:
            return changed
    return None


def csv_header(path: Path, fmt: str) -> list[str]:
    """The header row; a column named twice is refused (pandas would rename it `label.1`), and so
    is a first record with more fields than the header: pandas would take the first ones for an
    index and shift every column silently (later rows with more fields it refuses itself)."""
    records = _records(path, fmt)
    try:
        line, header = next(records, (1, []))
        header = header if line == 1 else []
        start, first = next(records, (None, None))  # past blank and whitespace-only lines, as pandas
    finally:
        records.close()
    if not header or not any(h.strip() for h in header):
        raise UserError(f"{path}:1: the first line should be a header naming the columns")
    excel_separator_line(path, header)
    for i, name in enumerate(header):
        if not name.strip():
            raise UserError(f"{path}:1: column {i + 1} of the header has no name; name every column")
        if name in header[:i]:
            raise UserError(f"{path}:1: the header names column '{name}' twice (columns "
                            f"{header.index(name) + 1} and {i + 1}); rename one")
    if first is not None and len(first) > len(header):
        raise UserError(_field_count(path, fmt, len(header), start, len(first)))
    if fmt == "tsv":
        tsv_quoted_header(path, header)
    return header


def excel_separator_line(path: Path, names: list[str]) -> None:
    """A first line `sep=,` (or `sep=;`, `sep=<tab>`: what Excel writes to name its separator) is
    no header: it was said as "column 2 of the header has no name", or read as one column `sep=;`."""
    if names and re.fullmatch(r"sep=.?", names[0].strip(), re.IGNORECASE) and not any(n.strip() for n in names[1:]):
        raise UserError(f"{path}:1: the first line is Excel's separator line (sep=...), not a header; "
                        "remove that line (the header is the one after it)")


# A TSV cell as a CSV writer quotes a text that holds a quote (pandas' `to_csv(sep="\t")`, the csv
# module's writer): the whole field in quotes, each quote inside doubled. GLUE's TSVs, read with
# quotes as text, hold quoted sentences but never a doubled quote.
CSV_QUOTED = r'^"([^"]|"")*""([^"]|"")*"$'
_TSV_ADVICE = ("a .tsv is read with its quotes as text (as GLUE's files are): write it without quoting "
               "(pandas: quoting=csv.QUOTE_NONE; R: quote=FALSE), or comma-separated as .csv")


def tsv_quoted_header(path: Path, names: list[str]) -> None:
    """A TSV header whose names are in quotes (`"text"<tab>"label"`, as R's write.table and
    QUOTE_ALL writers put them) is one line: read with quotes as text, the columns were named
    `"text"`, and every text and label kept its quotes (`"pos"` a class), exit 0."""
    quoted = [n for n in names if len(n) >= 2 and n.startswith('"') and n.endswith('"')]
    if quoted:
        raise UserError(f"{path}:1: the header's names are in quotes ({', '.join(quoted[:3])}), as a CSV "
                        f"writer quotes them; {_TSV_ADVICE}")


def _no_csv_quoting(ds: Any, header: list[str], path: Path) -> None:
    """No TSV cell is written as a CSV writer quotes a text that holds a quote (`CSV_QUOTED`):
    such a text was trained on with its outer quotes and each quote inside twice, exit 0."""
    import pyarrow.compute as pc

    offset = 0
    for batch in ds.data.to_batches(max_chunksize=65536):
        for name in header:
            values = batch.column(batch.schema.get_field_index(name))
            bad = pc.index(pc.fill_null(pc.match_substring_regex(values, CSV_QUOTED), False), True).as_py()
            if bad >= 0:
                raise UserError(_csv_quoted(where(path, 'tsv', offset + bad), f"'{name}'", values[bad].as_py()))
        offset += len(batch)


def no_csv_quoting_rows(path: Path, rows: list[list[str]], names: list[str] | None = None, first: int = 1) -> None:
    """`_no_csv_quoting` over rows the csv module read (GLUE's own TSV reader): a GLUE file
    re-saved by pandas (`to_csv(sep="\\t")`) had a sentence with a quote in it written as
    `"He said ""hi"" twice"`, read and trained on so, exit 0. `names` the header's, where it has
    one; `first` the line of rows[0]."""
    pattern = re.compile(CSV_QUOTED)
    for n, row in enumerate(rows, start=first):
        for i, cell in enumerate(row):
            if cell.startswith('"') and pattern.match(cell):
                column = f"'{names[i]}'" if names and i < len(names) else str(i + 1)
                raise UserError(_csv_quoted(f"{path}:{n}", column, cell))


def _csv_quoted(place: str, column: str, value: str) -> str:
    return (f"{place}: column {column} is written with CSV quoting ({value[:40]!r}: in quotes, each quote "
            "inside doubled); " + _TSV_ADVICE)


def _no_header_again(ds: Any, header: list[str], path: Path, fmt: str) -> None:
    """No record repeats the header, as two files joined with their headers (`cat a.csv b.csv`)
    do: pandas reads the second header as a row, and a class named like the label column was
    trained on, exit 0. Each column compared with its name (a UTF-8 BOM before the first one
    ignored), over the Arrow table."""
    import pyarrow.compute as pc

    offset = 0
    for batch in ds.data.to_batches(max_chunksize=65536):
        same = None
        for i, name in enumerate(header):
            values = batch.column(batch.schema.get_field_index(name))
            values = pc.utf8_ltrim(values, characters="\ufeff") if i == 0 else values
            equal = pc.fill_null(pc.equal(values, name), False)
            same = equal if same is None else pc.and_(same, equal)
        bad = pc.index(same, True).as_py()
        if bad >= 0:
            raise UserError(f"{where(path, fmt, offset + bad)}: repeats the header line ({_field_names(header)}), "
                            "as files joined with their headers do; keep the first header only")
        offset += len(batch)


def _no_short_row(ds: Any, header: list[str], path: Path, fmt: str) -> None:
    """No record has fewer fields than the header: pandas filled the missing ones with "", and a
    row cut short (or split by a lone carriage return, which pandas ends a line at) was said as
    its label or text being empty. The file is re-read only where some cell is empty."""
    import pyarrow.compute as pc

    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    if not any(pc.any(pc.equal(table.column(name), "")).as_py() for name in header):
        return
    short = _short_row(path, fmt, len(header))
    if short is not None:
        line, got, cr = short
        raise UserError(f"{path}:{line}: this row has {got} field{'s' * (got != 1)}, the header has {len(header)}"
                        + ("; the line ends in a lone carriage return (\\r), which ends a row: take it out, or "
                           "quote the field that holds it" if cr else
                           f"; give every row {len(header)} fields ({'tab' if fmt == 'tsv' else 'comma'}-separated)"))


def _short_row(path: Path, fmt: str, want: int) -> tuple[int, int, bool] | None:
    """(line, fields, whether its last line ends in a lone \\r) of the first record after the
    header with fewer than `want` fields."""
    last = [""]
    return next(((line, len(row), last[0].endswith("\r")) for line, row in _records(path, fmt, last)
                 if line > 1 and len(row) < want), None)


def _field_names(names: list[str]) -> str:
    shown = ", ".join(names[:4])
    return shown + (", ..." if len(names) > 4 else "")


# a quote followed by spaces or tabs up to a comma or the line end. Where the quote closes a field
# this is the whitespace strict mode refuses; where it is inside a quoted field (a doubled "") or an
# unquoted one, taking the whitespace out changes nothing strict mode decides.
_QUOTE_SPACE = re.compile(r'"[ \t]+(?=,|\r|\n|$)')


CR = "\r"


def csv_rows(path: Path, fmt: str, want: int) -> None:
    """One streaming pass of Python's csv module over a CSV/TSV file, for what pandas reads without
    a word. CSV: every quoted field closes where the field ends (RFC 4180: a quote inside one is
    written twice): one line naming the line the field starts on. A review opening with an
    unclosed quote (`"Best phone ever,pos`) ran on over the next rows, read as one text up to a
    later quote, and three examples were lost, exit 0 (pandas reads past it; text after a
    closing quote, `"Best" phone`, it joins silently): strict mode refuses both. Spaces and tabs
    between a closing quote and the comma or line end (`"abc" ,pos`) are what the csv module and
    pandas read without a word (as `abc `), and no swallowed row: strict mode refuses them too, so
    they are taken out of what it sees (`_QUOTE_SPACE`; line numbers are kept). Both formats: rows
    end at one kind of line end. A row that ends at a lone carriage return (\r, classic Mac's line
    end) in a file whose rows end at \n is refused at its line: pandas read the row after it
    shifted, its empty first field dropped and every later one a column to the left (a `\r` then
    `,"pos"` was the text `pos` with an empty label; with a third column, the label read from it),
    exit 0 (`want`: the header's fields, for a row a lone \r cut short). A file whose every row
    ends at \r is read as such."""
    csv.field_size_limit(sys.maxsize)
    last = [""]

    def lines(text: Any) -> Iterator[str]:
        for line in text:
            last[0] = line
            yield _QUOTE_SPACE.sub('"', line) if fmt == "csv" else line

    ends: dict[str, tuple[int, int]] = {}  # line end (CR or "\n") -> (line, fields) of the first row ending so
    with _open_bytes(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        rows = (csv.reader(lines(text), strict=True) if fmt == "csv" else
                csv.reader(lines(text), delimiter="\t", quoting=csv.QUOTE_NONE))
        start = 1
        try:
            for row in rows:
                end = "\n" if last[0].endswith("\n") else CR if last[0].endswith(CR) else ""
                if end:
                    ends.setdefault(end, (start, len(row) if any(f.strip(" \t") for f in row) else 0))
                    if len(ends) > 1:
                        line, got = ends[CR]
                        raise UserError(f"{path}:{line}: " + (
                            f"this row has {got} field{'s' * (got != 1)}, the header has {want}; the line ends in a "
                            "lone carriage return (\\r), which ends a row: take it out, or quote the field that "
                            "holds it" if 0 < got < want else
                            "this row ends at a lone carriage return (\\r) and others at line breaks (\\n); "
                            "pandas reads the row after such a line end shifted a column: save the file with one "
                            "kind of line end (\\n or \\r\\n)"))
                start = rows.line_num + 1
        except csv.Error as exc:
            raise UserError(f"{path}:{start}: a quoted field does not close where the field ends ({exc}); a "
                            "quote inside a field is written twice (\"\"), and a field that holds a comma, "
                            "quote or line break is quoted whole") from None


def _long_row(path: Path, fmt: str, want: int) -> tuple[int, int] | None:
    """(line, fields) of the first record with more than `want` fields, the line the one it starts
    on (error path: a re-read with the csv module, as `where` reads)."""
    return next(((line, len(row)) for line, row in _records(path, fmt) if len(row) > want), None)


def _records(path: Path, fmt: str, last: list[str] | None = None,
             skipped: list[int] | None = None) -> Iterator[tuple[int, list[str]]]:
    """(the line it starts on, its fields) of each record of a CSV/TSV file that pandas reads, the
    header first: Python's csv module, past what pandas skips, blank lines and lines of nothing but
    spaces and tabs (which the csv module reads as a record of one field: every later line named
    was one line too early, and such a line after the header hid a first record that would shift
    every column). `last`, where given, holds the last line read (the record's last line);
    `skipped`, where given, gets the number of each line passed over, before the next record."""
    csv.field_size_limit(sys.maxsize)
    last = last if last is not None else [""]

    def lines(text: Any) -> Iterator[str]:
        for line in text:
            last[0] = line
            yield line

    with _open_bytes(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        quoting = csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
        rows = csv.reader(lines(text), delimiter="\t" if fmt == "tsv" else ",", quoting=quoting)
        start = 1
        for row in rows:
            if not row or len(row) == 1 and rows.line_num == start and not last[0].strip(" \t\r\n"):
                if skipped is not None:
                    skipped.append(start)
            else:
                yield start, row
            start = rows.line_num + 1


def skipped_lines(path: Path, fmt: str) -> list[int]:
    """The numbers of the lines between a CSV/TSV file's records that pandas reads as no record
    (blank, or spaces and tabs alone), those after the last record not counted: in a file of
    one column such a line is an input of blank text to whoever wrote it, as a blank line of a
    plain-text file is (`read_lines`)."""
    passed, found, records = [], [], 0  # records: the header counted
    for _ in _records(path, fmt, skipped=passed):
        records += 1
        if records > 2:  # the lines passed over between the first record and this one
            found += passed
        passed.clear()
    return found


def _field_count(path: Path, fmt: str, want: Any, line: Any, got: Any) -> str:
    return (f"{path}:{line}: expected {want} fields like the header ({'tab' if fmt == 'tsv' else 'comma'}-"
            f"separated), got {got}" + ("" if fmt == "tsv" else "; quote a field that holds a comma"))


HEAD_BYTES = 1 << 20  # what head_names reads of a file: a header or a first record fits in it


def head_names(path: Path) -> list[str] | None:
    """The columns a CSV/TSV header names, or the fields of the first record of a JSONL file or a
    JSON list, read from the file's first MiB: what the recipe's columns are checked against
    before any library loads. None where that cannot be told from the head (a JSON document
    whose first record is longer, a nested layout): the full read says what is wrong there."""
    fmt = file_format(path, tuple(FORMATS.values()))
    if fmt == "text":
        return None
    try:
        with _open_bytes(path) as raw:
            first = raw.read(HEAD_BYTES)
        one_bom(first, str(path))  # said here as a read says it: the header's first name began with one
        head = codecs.getincrementaldecoder("utf-8-sig")().decode(first)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError):
        return None  # damaged gzip, not UTF-8: the full read names the place
    if "\x00" in head:
        return None
    if fmt in ("csv", "tsv"):
        # the first record as csv_header reads it: a quoted name may hold a line break, and a line
        # may end at \r alone (a header cut at the first \n was a wrong header, or a traceback)
        stream = io.StringIO(head, newline="")
        quoting = csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
        try:
            names = next(csv.reader(stream, delimiter="\t" if fmt == "tsv" else ",", quoting=quoting, strict=True), [])
        except csv.Error:
            return None
        if stream.tell() >= len(head) and len(head) >= HEAD_BYTES // 4:  # the header may go on past the head
            return None
        ok = names and all(n.strip() for n in names) and len(set(names)) == len(names)
        excel_separator_line(path, names)
        if ok and fmt == "tsv":
            tsv_quoted_header(path, names)  # said at validate as a run says it
        return names if ok else None  # a header that is not one: csv_header says why
    if fmt == "jsonl":
        line = next((l for l in head.split("\n") if l.strip()), "")
    else:
        found = re.match(r"\s*\[\s*", head)
        if not found:
            return None
        line = head[found.end():]
    try:
        record = json.JSONDecoder().raw_decode(line.strip() if fmt == "jsonl" else line)[0]
    except ValueError:
        return None
    if not isinstance(record, dict) or not record:
        return None
    names = list(record)  # and an object field's own fields, as text-to-text readers lift them
    for value in record.values():
        names += [k for k in value if k not in names] if isinstance(value, dict) else []
    return names


def _root(exc: BaseException) -> BaseException:
    seen = exc
    while seen.__cause__ is not None or (seen.__context__ is not None and not seen.__suppress_context__):
        seen = seen.__cause__ or seen.__context__
    return seen


def _builder_error(path: Path, fmt: str, exc: Exception, field: str | None) -> UserError:
    """What the builder could not read, said with a line number where one can be found."""
    root = _root(exc)
    message = str(root).splitlines()[0] if str(root) else type(root).__name__
    with _open_bytes(path) as raw:
        head = raw.read(8)
    mark = next((m for m in DATASETS_MAGIC if head.startswith(m)), None)
    if mark is not None:  # text (the byte scan passed) that begins as a compressed file does
        return UserError(f"{path}:1: begins with {mark.decode('latin-1')!r}, the mark of a {DATASETS_MAGIC[mark]} "
                         "file, and datasets' reader takes the file for one; put other text first")
    if "corresponds to no data" in message:  # the builder made an empty table
        return UserError(f"{path}: " + ("has a header and no rows" if fmt in ("csv", "tsv") else "holds no records"))
    if fmt in ("csv", "tsv"):
        found = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", message)
        if found:  # pandas' "line" is its count of records (a quoted line break is not one): ours is the file's
            want, line, got = found.groups()
            return UserError(_field_count(path, fmt, want, *(_long_row(path, fmt, int(want)) or (line, got))))
    elif fmt == "jsonl":
        problem = _jsonl_problem(path)
        if problem:
            return UserError(problem)
    elif fmt == "json":
        problem = _json_problem(path, field)
        if problem:
            return UserError(problem)
        problem = _json_problem(path, field, deep=True)
        if problem:  # Unreadable: a reader that walks the document itself (SQuAD's) says it at its place
            return Unreadable(problem)
    return Unreadable(f"{path}: could not be read as {fmt} ({type(root).__name__}: {message[:200]})")


def _distinct(pairs: list[tuple[str, Any]]) -> dict:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("a key twice")
    return found


def json_keys_once(path: Path, field: str | None) -> None:
    """No object of a JSON document names a key twice: the builder kept the last silently
    (`{"text": "first", "text": "second"}` read as "second"), where a JSONL file of the same
    record is refused. A second parse of a document already under TOOLKIT_MAX_JSON_MB (a fast
    check; the key and place are looked for only when one repeats)."""
    text = read_small_text(path)
    try:
        json.loads(text, object_pairs_hook=_distinct, parse_constant=_not_json_number, parse_int=_builder_int,
                   parse_float=_finite_float)
    except _Overflow as exc:
        raise UserError(f"{path}:{_constant_line(text, exc.args[1])}: {exc.args[0]}") from None
    except _TooLong as exc:
        raise UserError(f"{path}:{_constant_line(text, exc.args[0])}: a whole number of {len(exc.args[0].lstrip('-'))} "
                        f"digits ({exc.args[0][:24]}{'...' * (len(exc.args[0]) > 24)}), past what datasets' JSON reader "
                        "reads of a JSON document (-2^63 to 2^64 - 1); write it as a string (\"...\")") from None
    except _NotJsonNumber as exc:  # the builder read it as null ("empty label"), a JSONL line as -inf
        raise UserError(f"{path}:{_constant_line(text, exc.args[0])}: a value is {exc.args[0]}, which JSON has "
                        "no number for (NaN and Infinity are Python's, not JSON's); give the value, or leave "
                        "the record out") from None
    except ValueError:
        raise UserError(_json_problem(path, field) or f"{path}: an object names a key twice") from None


class _NotJsonNumber(ValueError):
    pass


def _not_json_number(name: str) -> Any:
    raise _NotJsonNumber(name)


class _TooLong(ValueError):
    pass


class _Overflow(ValueError):
    pass


def _finite_float(literal: str) -> float:
    """A JSON number with a fraction or an exponent, refused where no double holds it (`1e400`):
    the json module reads it as infinity, datasets' JSON lines reader failed on it ("could not be
    read as jsonl (ValueError: Trailing data at position 33)", no line) and its JSON-document
    reader called it "Infinity, which JSON has no number for", a word the file does not hold."""
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise _Overflow(f"the number {literal[:24]}{'...' * (len(literal) > 24)} is past what a double holds "
                        "(about 1.8e308) and would read as infinity; write it within that range, or as a string",
                        literal)
    return value


def _builder_int(literal: str) -> int:
    """A JSON document's whole number, refused past what datasets' json builder reads (its ujson:
    -2^63 to 2^64 - 1): "could not be read as json (ValueError: Value is too big! at position
    25)" named no line, where JSONL reads such a number as a double (`check_exact`)."""
    value = int(literal)
    if not -(1 << 63) <= value < 1 << 64:
        raise _TooLong(literal)
    return value


def _constant_line(text: str, name: str) -> int:
    """The line of the first `name` (NaN, Infinity, -Infinity, a number) outside a string of a
    JSON text, as a whole token."""
    blanked = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: " " * len(m.group()), text)
    found = re.search(rf"(?<![\w.+-]){re.escape(name)}(?![\w.])", blanked)
    at = found.start() if found else 0
    return blanked.count("\n", 0, at) + 1


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise ValueError(f"the key '{key}' appears twice in one object")
    return dict(pairs)


def _jsonl_problem(path: Path, only: str | None = None) -> str | None:
    """The first line that is not one JSON object with distinct keys, or whose field changes
    type (a line-by-line re-read; `only`: that field's type alone)."""
    kinds = _Kinds(only)
    for n, line, rest in _jsonl_lines(path):
        try:
            value = json.loads(line, object_pairs_hook=_no_duplicates, parse_float=_finite_float)
        except json.JSONDecodeError as exc:
            return f"{path}:{n}: " + (_spread_value(line, rest) or not_json_line(line, exc))
        except _Overflow as exc:
            return f"{path}:{n}: {exc.args[0]}"
        except ValueError as exc:
            return f"{path}:{n}: {exc}"
        if not isinstance(value, dict):
            return f"{path}:{n}: expected a JSON object per line, got {json_type(value)}"
        changed = kinds.change(value, n)
        if changed:
            return f"{path}:{n}: {changed}"
    return None


def not_json_line(line: str, exc: json.JSONDecodeError) -> str:
    """What is wrong with a JSONL line the json module refused: a record followed by a comma (a
    JSON list's items cut into lines, `{...},`) is said as such; it was "not valid JSON (Extra
    data)"."""
    body = line.strip()
    if body.endswith(","):
        try:
            json.loads(body[:-1])
        except ValueError:
            pass
        else:
            return ("a comma after the record; a JSON lines file holds one JSON object a line and nothing "
                    "after it (a list's items written a line each keep their commas: take them out, or "
                    "write a .json list)")
    return f"not valid JSON ({exc.msg})"


def _jsonl_lines(path: Path) -> Iterator[tuple[int, str, Any]]:
    """(line number, line, the lines after it) of each line of a JSONL file that is not blank."""
    with _open_bytes(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig")
        for n, line in enumerate(text, start=1):
            if line.strip():
                yield n, line, text


def _spread_first_record(path: Path) -> str | None:
    """The first record of a JSONL file said as `_spread_value` says it, where it is spread over
    lines (a file pretty-printed whole); None else."""
    for n, line, rest in _jsonl_lines(path):
        try:
            json.loads(line)
        except ValueError:
            spread = _spread_value(line, rest)
            return f"{path}:{n}: {spread}" if spread else None
        return None
    return None


def _spread_value(line: str, rest: Any) -> str | None:
    """Where a JSONL line that is not JSON begins one JSON value that goes on over later lines (a
    pretty-printed object, `json.dump(..., indent=2)`): that said, with its last line; else None.
    Looked for in the next MiB."""
    text, size = [line], len(line)
    for more in rest:
        text.append(more)
        size += len(more)
        if size > HEAD_BYTES:
            break
    joined = "".join(text)
    try:
        end = json.JSONDecoder().raw_decode(joined.lstrip())[1] + len(joined) - len(joined.lstrip())
    except ValueError:
        return None
    lines = joined.count("\n", 0, end) + 1
    if lines < 2:
        return None
    return (f"one JSON value runs over {lines} lines here (pretty-printed); a .jsonl file holds one record "
            "per line: write each record on one line, or name the file .json (a list of records)")


class _Kinds:
    """The JSON type each field had first: a field that changes type is named with both lines."""

    def __init__(self, only: str | None = None) -> None:
        self.first: dict[str, tuple[str, Any]] = {}
        self.only = only

    def change(self, record: dict, where: Any) -> str | None:
        for key, value in record.items():
            if value is None or self.only not in (None, key):
                continue
            kind = json_type(value)
            seen = self.first.setdefault(key, (kind, where))
            if seen[0] != kind:
                return f"'{key}' is {kind} here but {seen[0]} at {_at(seen[1])}; one type per field"
        return None


def first_in_file(path: Path, fmt: str, column: str, field: str | None, bad: Any) -> tuple[int, Any] | None:
    """(index, value) of the first record of a JSON(L) file whose `column` holds a value `bad`
    says is wrong, read from the file (error path). Where a column of mixed JSON types reaches the
    table as JSON text (datasets' `Json`), datasets keeps a string that parses as JSON as it is:
    the string "007" is stored as the number 7 is, "NaN" and "null" as no value, "[1]" as a list.
    Taken from the table, a string was named as the record at fault, or `json.loads("007")` was a
    traceback. None where no record has such a value (or the file cannot be walked so: a Hub
    split, whose `path` is its name)."""
    if fmt not in ("json", "jsonl"):
        return None
    try:
        for i, record in enumerate(_json_records(path, fmt, field)):
            if isinstance(record, dict) and column in record and bad(record[column]):
                return i, record[column]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def _json_records(path: Path, fmt: str, field: str | None) -> Any:
    """The records of a JSON(L) file as Python values, in file order (`field`: a JSON document's
    list of records)."""
    if fmt == "jsonl":
        return (json.loads(line) for _, line, _ in _jsonl_lines(path))
    document = json.loads(read_small_text(path))
    return iter(document[field] if field is not None else document)


def values_in_file(path: Path, fmt: str, column: str, field: str | None) -> list[Any] | None:
    """Each record's `column` as the JSON(L) file holds it (None where a record lacks it), in
    record order: a column of mixed JSON types reaches the table as JSON text, in which a string
    that parses as JSON ("[1]") is kept as the value it spells (`first_in_file`), so its values
    are taken from the file itself. A lifted field (`a.b`, or `b` named by its own name,
    `lift_nested`) is looked up inside its object. None where the file cannot be walked so."""
    def value(record: Any) -> Any:
        if not isinstance(record, dict):
            return None
        if column in record:
            return record[column]
        if "." in column:
            for key in column.split("."):
                record = record.get(key) if isinstance(record, dict) else None
            return record
        return next((inner[column] for inner in record.values() if isinstance(inner, dict) and column in inner), None)

    if fmt not in ("json", "jsonl"):
        return None
    try:
        return [value(record) for record in _json_records(path, fmt, field)]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _at(where: Any) -> str:
    return f"line {where}" if isinstance(where, int) else str(where)


def _not_a_record(path: Path, fmt: str) -> str | None:
    """The first record of a JSON(L) file that is not an object, said as such: the builder reads a
    `null` line (or list item) as a record whose every field is null, which was then called a
    missing field. None where every record is an object."""
    problem = _jsonl_problem(path) if fmt == "jsonl" else _json_problem(path, None)
    return problem if problem and "expected a JSON object" in problem else None


def _json_problem(path: Path, field: str | None, only: str | None = None, deep: bool = False) -> str | None:
    """The first record of a JSON document that is not an object, or whose field has another JSON
    type than an earlier record gave it; `deep`: inside lists and objects too (`refs[]`,
    `meta.k[]`), which a document's list ({"data": [...]}, read through pandas) cannot hold either:
    pyarrow's own line ("could not be read as json (ArrowTypeError ...)") named no record, where
    the same records as JSONL read or name their line. Error paths only."""
    text = read_small_text(path)
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        return f"{path}:{exc.lineno}: not valid JSON ({exc.msg})"
    except ValueError as exc:
        return f"{path}: {exc}"
    if field is not None:
        if not isinstance(value, dict) or field not in value:
            return f"{path}: expected a JSON object with a '{field}' list"
        value = value[field]
    if not isinstance(value, list):
        return f"{path}: expected a JSON list of records, got {json_type(value)}"
    first: dict[str, tuple[str, Any]] = {}
    for i, item in enumerate(value):
        keys = ([field] if field else []) + [i]
        if not isinstance(item, dict):
            return f"{path}:{json_line(text, keys)}: expected a JSON object, got {json_type(item)}"
        for key, inner in item.items():
            if only not in (None, key):
                continue
            changed = _type_change(inner, key, first, f"record {i + 1}", deep)
            if changed:
                return f"{path}:{json_line(text, keys + [key])}: record {i + 1}: {changed}"
    return None


def first_char(path: Path) -> str:
    """The first character that is not whitespace (a JSON file's shape: '[' a list, '{' an object)."""
    with _open_bytes(path) as raw:
        while chunk := raw.read(4096):
            chunk = chunk.lstrip(codecs.BOM_UTF8).lstrip()
            if chunk:
                return chunk[:1].decode("latin-1")
    return ""


def first_item_char(path: Path) -> str:
    """The first character after a JSON list's opening bracket ('{' for a list of objects)."""
    with _open_bytes(path) as raw:
        head = raw.read(1 << 16).decode("utf-8-sig", errors="replace").lstrip()
    return head[1:].lstrip()[:1] if head.startswith("[") else ""


def read_small_text(path: Path) -> str:
    """The whole text of a file already under TOOLKIT_MAX_JSON_MB (error paths only)."""
    with _open_bytes(path) as raw:
        return raw.read().decode("utf-8-sig")


def near_name(name: str, names: Any) -> str:
    """For a field `name` a file lacks: the note naming the file's field that differs from it only
    in case or in spaces at its ends (`Text` for `text`, `'text '`), which fields are not matched
    by (a setting names a field as written); "" where there is none. Appended to the line that
    refuses the name, so the fix is in it."""
    fold = name.strip().casefold()
    alike = [n for n in names if isinstance(n, str) and n != name and n.strip().casefold() == fold]
    if not alike:
        return ""
    return f" ({' and '.join(repr(n) for n in alike)} differs only in case or spaces; names are read as written)"


def json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}
    return names.get(type(value), "a number")


# --- line numbers for records the table names (error paths) ----------------------------------
def where(path: Path, fmt: str, index: int, keys: list[Any] | None = None) -> str:
    """FILE:LINE of record `index` (0-based) of a file read by `read`; `keys` go further into a
    JSON document's record ({"data": [articles]}: ["data", a, "paragraphs", p, ...]). A Hub
    split (`fmt` "hub", `path` its name) has no lines: its record's number."""
    if fmt == "hub":
        return f"{path}: record {index + 1}"
    try:
        line = _line_of(path, fmt, index, keys)
    except Exception:  # a position is a courtesy: never let it hide the error being reported
        line = None
    return f"{path}:{line}" if line else f"{path}: record {index + 1}"


def _line_of(path: Path, fmt: str, index: int, keys: list[Any] | None) -> int | None:
    if fmt == "json":
        return json_line(read_small_text(path), keys if keys is not None else [index])
    if fmt == "text":
        return index + 1
    if fmt == "jsonl":
        with _open_bytes(path) as raw:
            seen = -1
            for n, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8-sig"), start=1):
                seen += _values_on(line) if line.strip() else 0
                if seen >= index:
                    return n
        return None
    return next((line for i, (line, _) in enumerate(_records(path, fmt)) if i == index + 1), None)  # 0: the header


def _values_on(line: str) -> int:
    """How many JSON values a JSONL line holds: one, or more where records were joined on one line
    (`{...}{...}`, a file that ended without a line break and another after it), which the json
    builder reads as that many records; a later record's line counts them."""
    decoder, pos, count = json.JSONDecoder(), _skip(line, 0), 0
    while pos < len(line):
        try:
            pos = _skip(line, decoder.raw_decode(line, pos)[1])
        except ValueError:
            return max(count, 1)
        count += 1
    return max(count, 1)


def json_line(text: str, keys: list[Any]) -> int:
    """The line on which the value at `keys` (object keys and list indices) starts in a JSON text.
    Walks the text with the json module's own scanner, skipping values it does not enter."""
    decoder, pos = json.JSONDecoder(), _skip(text, 0)
    for key in keys:
        if text[pos] == "[":
            pos = _skip(text, pos + 1)
            for _ in range(int(key)):
                pos = _skip(text, decoder.raw_decode(text, pos)[1])
                pos = _skip(text, pos + 1)  # the comma
        else:
            pos = _skip(text, pos + 1)
            while True:
                name, pos = json.decoder.scanstring(text, pos + 1)
                pos = _skip(text, _skip(text, pos) + 1)  # the colon
                if name == key:
                    break
                pos = _skip(text, decoder.raw_decode(text, pos)[1])
                pos = _skip(text, pos + 1)  # the comma
    return text.count("\n", 0, pos) + 1


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n\ufeff":
        pos += 1
    return pos


def lift_nested(ds: Any) -> Any:
    """Records whose object fields hold the texts, as run_translation.py reads its JSON files and
    WMT comes from the Hub (`{"translation": {"en": ..., "de": ...}}`): each inner field becomes a
    field of the record under its own name (`en`, `de`; `translation.en` where the record has an
    `en` of its own), so the fields are found as in flat records. They were refused, with a hint
    (task.source_field=translation) that named an object, not a text. Objects whose fields differ
    from record to record (one lacks `de`, one adds `fr`) the json builder keeps as JSON text
    (datasets' `Json` feature): their fields are lifted the same way (`_lift_json`), a record
    without one then missing it at its line, where the file was refused with that same hint."""
    from datasets import Json

    nested = {name: list(feature) for name, feature in ds.features.items() if isinstance(feature, dict)}
    mixed = {name: keys for name, feature in ds.features.items()
             if isinstance(feature, Json) and (keys := _object_keys(ds, name))}
    if not nested and not mixed:
        return ds
    flat = _lift_json(ds, mixed) if mixed else ds
    flat = flat.flatten() if nested else flat
    taken = set(flat.column_names)
    rename = {}
    for name, inners in {**nested, **mixed}.items():
        for inner in inners:
            if inner not in taken:
                rename[f"{name}.{inner}"] = inner
                taken.add(inner)
    return flat.rename_columns(rename)


def _object_keys(ds: Any, column: str) -> list[str] | None:
    """The fields, in order of first appearance, of a JSON-text column whose every value is an
    object (or null); None where one is not."""
    import pyarrow.compute as pc

    keys: dict[str, None] = {}
    for batch in ds.data.to_batches(max_chunksize=65536):
        values = batch.column(batch.schema.get_field_index(column)).storage
        if not pc.all(pc.fill_null(pc.starts_with(pc.utf8_ltrim_whitespace(values), "{"), True)).as_py():
            return None
        for text in values.drop_null().to_pylist():
            keys.update(dict.fromkeys(json.loads(text)))
    return list(keys) or None


def _lift_json(ds: Any, mixed: dict[str, list[str]]) -> Any:
    """Each JSON-text object column of `mixed` as a column per field, `name.field`, holding each
    value as JSON text (`Json`), null where a record lacks it: what `check_text` reads, so a
    number or a missing text is said at its line as in any other column."""
    from datasets import Features, Json

    features = Features({**{k: v for k, v in ds.features.items() if k not in mixed},
                         **{f"{name}.{key}": Json() for name, keys in mixed.items() for key in keys}})

    def lift(batch: dict) -> dict:
        out = {}
        for name, keys in mixed.items():
            for key in keys:
                found = [record.get(key) if isinstance(record, dict) else None for record in batch[name]]
                out[f"{name}.{key}"] = [None if value is None else json.dumps(value) for value in found]
        return out

    with _quiet_builders():
        return ds.map(lift, batched=True, remove_columns=list(mixed), features=features)


def is_text(ds: Any, column: str) -> bool:
    """Whether `column` of `ds` is stored as plain strings (a missing column counts as text: its
    check says it is missing)."""
    from datasets import Value

    feature = ds.features.get(column)
    return feature is None or (isinstance(feature, Value) and feature.dtype in ("string", "large_string"))


def as_text(ds: Any, columns: list[str]) -> Any:
    """`columns` as plain string columns once `check_text` has found every value text: a column
    kept as JSON text (`Json`, `_lift_json`) becomes the strings it holds."""
    from datasets import Features, Json, Value

    encoded = [c for c in columns if isinstance(ds.features[c], Json)]
    if not encoded:
        return ds
    features = Features({k: Value("string") if k in encoded else v for k, v in ds.features.items()})
    with _quiet_builders():
        return ds.map(lambda batch: {c: batch[c] for c in encoded}, batched=True, features=features)


# --- checks on the table -----------------------------------------------------------------------
# What pandas reads as a missing value by default (read_csv's na_values), and what R's write.csv
# and Python's str(None) / str(float("nan")) write for one. The toolkit reads a cell as written, so
# such a label is a class of its own and such a text the text "NA": said where found, never dropped
# or refused (`tasks._fields.missing_marks` for labels, `check_text`'s `note` for texts).
MISSING_MARKS = frozenset({"#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                           "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})


def check_text(ds: Any, column: str, path: Path, fmt: str, what: str | None = None,
               keys: Any = None, blank_ok: bool = False, note: Any = None) -> None:
    """Every value of `column` is text with something in it (`blank_ok`: text at all): the first
    null, non-string or blank value is one line naming file, line and column. Runs over the Arrow
    table in batches. A file's text (not a Hub dataset's, which its user cannot edit) begins with
    no byte order mark: `scan` allows one at the file's start, which every reader strips, but one
    at a later row (`cat a.csv b.csv`, `cat a.jsonl b.jsonl`) or the start of a cell was trained
    as an invisible first character of the text, exit 0 (a label so was already refused).
    `note(key, line)` (a task's `note`): texts that are nothing but a missing-value mark
    (`MISSING_MARKS`: R's write.csv `NA`, `nan` from str() of pandas' NaN, `None`) are said in one
    warning with their count and first place; pandas (and run_glue / run_summarization through
    it) reads such a cell as no text, and here it was trained and scored as the text "NA", exit 0."""
    import pyarrow as pa
    import pyarrow.compute as pc

    what = what or f"column '{column}'"
    marks = pa.array(sorted(MISSING_MARKS))
    marked_count, marked_first = 0, None  # texts that are a missing-value mark: (how many, first)
    if column not in ds.column_names:
        raise UserError(f"{path}: {what} is missing (it has: {', '.join(ds.column_names)})"
                        + near_name(column, ds.column_names))
    offset = 0
    for batch in ds.data.to_batches(max_chunksize=65536):
        values = batch.column(batch.schema.get_field_index(column))
        encoded = isinstance(values.type, pa.BaseExtensionType)  # mixed types: each value as JSON text
        if encoded:
            values = values.storage
        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            bad = pc.index(pc.is_valid(values), True).as_py()
            bad = 0 if bad < 0 else bad
            raise UserError(f"{where(path, fmt, offset + bad, _keys(keys, offset + bad))}: {what} is "
                            f"{_describe(values[bad].as_py())}, expected text")
        text = values
        if encoded:
            not_str = pc.invert(pc.starts_with(pc.fill_null(values, '"'), '"'))
            if pc.any(not_str).as_py():  # the stored JSON text cannot say which (`first_in_file`)
                field = keys(0)[0] if callable(keys) else None
                found = first_in_file(path, fmt, column, field, lambda v: v is not None and not isinstance(v, str))
                if found is None:  # a field lifted from an object (`lift_nested`): json.dumps wrote its text
                    bad = pc.index(not_str, True).as_py()
                    found = (offset + bad, _json_value(values[bad].as_py()))
                raise UserError(f"{where(path, fmt, found[0], _keys(keys, found[0]))}: {what} is "
                                f"{json_type(found[1])}, expected text")
            text = pc.utf8_slice_codeunits(values, 1, -1)
        missing = pc.index(pc.is_null(values), True).as_py()
        if missing >= 0:
            raise UserError(f"{where(path, fmt, offset + missing, _keys(keys, offset + missing))}: "
                            f"{what} is missing; every record needs it")
        empty = -1 if blank_ok else pc.index(pc.match_substring_regex(text, BLANK_PATTERN), True).as_py()
        if empty >= 0:
            shown = "" if not text[empty].as_py().strip() else f" (only {_invisible(text[empty].as_py())})"
            raise UserError(f"{where(path, fmt, offset + empty, _keys(keys, offset + empty))}: {what} is "
                            f"empty{shown}; every record needs some text")
        marked = -1 if fmt == "hub" else pc.index(pc.starts_with(text, "\ufeff"), True).as_py()
        if marked >= 0:
            raise UserError(f"{where(path, fmt, offset + marked, _keys(keys, offset + marked))}: {what} begins with "
                            "a byte order mark (U+FEFF), as a file joined after another with `cat` leaves its "
                            "first row; the model would read it as an invisible start of the text: remove it")
        if note is not None and fmt != "hub":  # a Hub data set's text is as published
            hits = pc.fill_null(pc.is_in(pc.utf8_trim_whitespace(text), value_set=marks), False)
            count = pc.sum(hits).as_py() or 0
            if count and marked_first is None:
                first = pc.index(hits, True).as_py()
                marked_first = (offset + first, text[first].as_py().strip())
            marked_count += count
        offset += len(batch)
    if marked_first is not None:
        index, mark = marked_first
        note(f"missing text {path} {column}",
             f"{where(path, fmt, index, _keys(keys, index))}: {what} is {mark!r}"
             + (f" here and in {marked_count - 1} more record(s)" if marked_count > 1 else "")
             + ", which pandas and R write for a missing value; each is read as that text (cells are read as "
               "written): take out the records that have no text")


def text_end(ds: Any, column: str) -> int:
    """The number of rows up to the last one with text in `column` (blank by `blank`'s rule):
    what a text file holds before the blank lines that end it."""
    import numpy as np
    import pyarrow.compute as pc

    blanks = np.concatenate([pc.match_substring_regex(chunk, BLANK_PATTERN).to_numpy(zero_copy_only=False)
                             for chunk in ds.data.column(column).chunks] or [np.zeros(0, bool)])
    texts = np.flatnonzero(~blanks)
    return int(texts[-1]) + 1 if len(texts) else 0


def _invisible(text: str) -> str:
    """The characters of a blank text that are not whitespace, named: 'U+200B ZERO WIDTH SPACE'."""
    names = dict.fromkeys(f"U+{ord(ch):04X} {unicodedata.name(ch, unicodedata.category(ch))}"
                          for ch in text if not ch.isspace())
    return ", ".join(list(names)[:3]) + (", ..." if len(names) > 3 else "")


def check_scalar(ds: Any, column: str, path: Path, fmt: str, what: str) -> None:
    """Every value of `column` is a string, a number or true/false (a label), all of one JSON
    type: the first list or object, or the first value whose type differs from the first one's,
    is one line naming file and line (str() would make `[1]` a class of its own, and 1, "1" and
    true three classes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offset = 0
    for batch in ds.data.to_batches(max_chunksize=65536):
        values = batch.column(batch.schema.get_field_index(column))
        found = None  # (index in the file, value)
        if isinstance(values.type, pa.BaseExtensionType):  # mixed JSON types, stored as JSON text,
            # which cannot say which (`first_in_file`): the file can
            found = first_in_file(path, fmt, column, None, lambda v: isinstance(v, (list, dict)))
            if found is None:  # no file to walk (a Hub split): the stored JSON text says it
                text = pc.fill_null(values.storage, "0")
                bad = pc.index(pc.or_(pc.starts_with(text, "["), pc.starts_with(text, "{")), True).as_py()
                found = (offset + bad, json.loads(values.storage[bad].as_py())) if bad >= 0 else None
        elif pa.types.is_nested(values.type):
            bad = pc.index(pc.is_valid(values), True).as_py()
            found = (offset + bad, values[bad].as_py()) if bad >= 0 else None
        if found is not None:
            raise UserError(f"{where(path, fmt, found[0])}: {what} is {json_type(found[1])}, expected "
                            "text or a number")
        if pa.types.is_floating(values.type):  # NaN, Infinity: not JSON, yet Python's json.dumps
            # writes a missing float so, and it was read as the class "nan", exit 0
            bad = pc.index(pc.fill_null(pc.invert(pc.is_finite(values)), False), True).as_py()
            if bad >= 0:
                value = values[bad].as_py()
                shown = "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
                raise UserError(f"{where(path, fmt, offset + bad)}: {what} is {shown}, which JSON "
                                "has no number for (NaN and Infinity are Python's, not JSON's); give the value, "
                                "or leave the record out")
        if isinstance(values.type, pa.BaseExtensionType):  # scalars of more than one JSON type
            # the table cannot say which: datasets stores "1" beside 1 as 1. The file can.
            problem = (_jsonl_problem(path, column) if fmt == "jsonl" else
                       _json_problem(path, None, column) if fmt == "json" else None)  # a Hub split: no file
            raise UserError(problem or f"{path}: {what} holds values of more than one type; one type per field")
        offset += len(batch)


EXACT = 2 ** 53  # a double holds every whole number below it, and not every one above


def check_exact(ds: Any, column: str, path: Path, fmt: str, what: str) -> None:
    """Numbers that name something (a label, an id) are held as written: a JSON column the reader
    holds as doubles (a whole number past int64, or one beside a fraction) rounds whole numbers
    of 2^53 and more, so labels 12345678901234567890 and 12345678901234567891 (or 2^53 + 1 beside
    2^53) were read as one class, exit 0. The first such value is one line naming its place."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offset = 0
    for batch in ds.data.to_batches(max_chunksize=65536):
        values = batch.column(batch.schema.get_field_index(column))
        if pa.types.is_floating(values.type):
            whole = pc.and_(pc.greater_equal(pc.abs(values), float(EXACT)), pc.equal(pc.floor(values), values))
            bad = pc.index(pc.fill_null(whole, False), True).as_py()
            if bad >= 0:
                raise UserError(f"{where(path, fmt, offset + bad)}: {what} is a whole number of 2^53 or more "
                                "in a JSON column read as doubles (about 16 digits): two such numbers can read "
                                "as one; write them as strings (\"...\")")
        offset += len(batch)


def number_name(value: Any) -> str:
    """The name of a value that names something (a label, an id): text as written (CSV cells are
    text: 01 and 1 stay two); a JSON number by its value, so that 1 and 1.0 are one name, "1"
    (a column holding both is read as doubles, and every name came out "0.0", "1.0"); a JSON
    true/false as JSON writes it, as a CSV's `true` reads (Python's str() said "True")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _keys(keys: Any, index: int) -> list[Any] | None:
    return keys(index) if callable(keys) else None


def _describe(value: Any) -> str:
    return json_type(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else \
        f"a number ({value})"
