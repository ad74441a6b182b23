"""Tag schemes of token classification, checked before training rather than assumed.

Entity scores (seqeval, conlleval's rules) read a tag as a one-letter prefix and a type: `B-PER`
is prefix B, type PER. A tag without a prefix is read all the same, wrongly: `PER` becomes prefix
P + type ER, `ORG` prefix O (outside), so a file of plain types trains and reports an entity F1
that means nothing. Here every tag must be `O` or `P-TYPE` with P one of the scheme's prefixes,
and every sentence must follow the scheme's rules:

- IOB2 (BIO): an entity starts with B-X and continues with I-X;
- IOB1: an entity starts with I-X; B-X only starts an X entity right after another X entity;
- IOBES: B-X (I-X)* E-X for an entity of several words, S-X for one word.

`auto` takes IOBES when any tag has an E- or S- prefix, else BIO: IOB2, or IOB1 where a file
starts an entity with I- (conlleval reads both the same way, so either is scored right).
The files of a run are in one scheme: files of two are one line naming each file's scheme.
seqeval's own `auto_detect` is not used: it accepts tags with no delimiter (`BPER`) and does not
check sentences. Scoring stays seqeval's default mode, the one run_ner and conlleval report.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Callable, Sequence

from toolkit.errors import UserError

SCHEMES = ("auto", "IOB1", "IOB2", "IOBES")
PREFIXES = {"IOB1": "BI", "IOB2": "BI", "IOBES": "BIES"}
_TAG = re.compile(r"^([A-Z])-(\S+)\Z")  # \Z: `$` took a tag ending in a line break (`B-PER\n`)


@lru_cache(maxsize=4096)
def split(tag: str | None) -> tuple[str, str]:
    """(prefix, type) of a tag; ("O", "") for outside and for the sentence's edge (None)."""
    if tag is None or tag == "O":
        return "O", ""
    match = _TAG.match(tag)
    return (match.group(1), match.group(2)) if match else ("?", tag)


def check_label(tag: str, scheme: str, place: str | Callable[[], str]) -> None:
    """One tag's form: `O` or `P-TYPE` with P among the scheme's prefixes (B, I, E, S for auto);
    `place` (or a callable giving it, called only on an error) is where the tag is."""
    if tag == "O":
        return
    prefix, kind = split(tag)
    allowed = PREFIXES.get(scheme, "BIES")
    if prefix in allowed:
        return
    where = place() if callable(place) else place
    if prefix == "?":
        q = (lambda text: repr(text)) if any(c.isspace() for c in tag) else (lambda text: f"'{text}'")  # one line
        reads = f"prefix {q(tag[0])} + type {q(tag[1:])}" if len(tag) > 1 else f"prefix {q(tag)} with no type"
        raise UserError(f"{where}: tag {q(tag)} has no B-/I- prefix, so entity scoring would read it as "
                        f"{reads}; {_written_right(tag)}")
    if prefix not in allowed:
        hint = {"L": "BILOU's L-: write IOBES's E-", "U": "BILOU's U-: write IOBES's S-"}.get(
            prefix, f"the {scheme if scheme != 'auto' else 'IOB2/IOBES'} prefixes are {', '.join(allowed)}")
        raise UserError(f"{where}: tag '{tag}' has prefix '{prefix}'; {hint}")


# A prefix written otherwise than `P-` (`b-PER`, `B_PER`, `B.PER`, `B:PER`): the tag it stands for
_MISWRITTEN = re.compile(r"^([BIESbies])[-_.:](\S+)$")


def _written_right(tag: str) -> str:
    """How a tag without a prefix is written right: a tag with spaces at its ends is the tag
    without them (`B-PER ` is told to write `B-PER`, not `B-B-PER `); the outside tag written `0` (zero) or `o` is
    `O`; a number is an id, read as one from a JSON number alone (with task.labels); a prefix in lower case or joined by `_`, `.` or `:` (`b-per`, `B_PER`) is the capital
    letter and `-` (`B-per`, `B-PER`); anything else a plain type, written BIO. The advice was the
    plain type's for all of them: `B-0` for `0`, `B-b-per` for `b-per`."""
    ids = ("a number is a tag id only as a JSON number in a JSON(L) file's tags, with task.labels naming "
           "the tags in id order; elsewhere write the tag names")
    if tag.strip() != tag and tag.strip():  # ' O', 'B-PER ' (a JSON string, task.labels): was 'write B-B-PER '
        fixed = tag.strip()
        right = f"write {fixed!r}" if fixed == "O" or _TAG.match(fixed) else _written_right(fixed)
        return f"a tag holds no spaces at its ends: {right}"
    if tag in ("0", "o"):
        return "the tag outside entities is O (the capital letter)" + (f"; {ids}" if tag == "0" else "")
    if tag.isascii() and tag.isdigit():  # a CoNLL file of ids: 'B-1' was the advice
        return ids
    miswritten = _MISWRITTEN.match(tag)
    if miswritten:
        return (f"a prefix is a capital letter and '-': write {miswritten.group(1).upper()}-{miswritten.group(2)} "
                "(every tag of the file alike)")
    return f"write BIO tags (B-{tag} for an entity's first word, I-{tag} for the rest, O outside)"


def scheme_of(tag_sets: Sequence[Sequence[Sequence[str]]], scheme: str) -> str:
    """The scheme `auto` stands for in these files (see the module's docstring)."""
    if scheme != "auto":
        return scheme
    prefixes = {split(t)[0] for sentences in tag_sets for sentence in sentences for t in sentence}
    if prefixes & {"E", "S"}:
        return "IOBES"
    for sentences in tag_sets:
        for sentence in sentences:
            for prev, tag in zip([None, *sentence], sentence):
                p, t = split(tag)
                if p == "I" and split(prev) not in (("B", t), ("I", t)):
                    return "IOB1"
    return "IOB2"


def check_sentence(tags: Sequence[str], scheme: str, where: Callable[[int], str]) -> None:
    """The first tag that breaks `scheme`'s rules (see the module's docstring) is one line naming
    its place, the rule and the fix; `where(i)` is the place of word i."""
    for i, tag in enumerate([*tags, None]):
        prev = tags[i - 1] if i else None
        if tag in (None, "O") and prev in (None, "O"):
            continue  # most words: nothing to check
        (pp, pt), (p, t) = split(prev), split(tag)
        rule = _broken(pp, pt, p, t, scheme)
        if rule:
            here = where(min(i, len(tags) - 1))
            shown = "the sentence's end" if tag is None else f"'{tag}'"
            after = f"'{prev}'" if prev is not None else "the sentence's start"
            raise UserError(f"{here}: {shown} after {after} is not {scheme}: {rule}"
                            + (" (or set task.scheme to the file's scheme)" if scheme != "IOBES" else ""))


def _broken(pp: str, pt: str, p: str, t: str, scheme: str) -> str | None:
    open_chunk = pp in ("B", "I")
    if scheme == "IOB2" and p == "I" and not (open_chunk and pt == t):
        return f"an entity starts with B-{t}, and I-{t} only continues one"
    if scheme == "IOB1" and p == "B" and not (open_chunk and pt == t):
        return f"an entity starts with I-{t}; B-{t} only starts one right after another {t} entity"
    if scheme == "IOBES":
        if p in ("I", "E") and not (open_chunk and pt == t):
            return f"{p}-{t} only continues a B-{t}/I-{t} entity (one word alone is S-{t})"
        if open_chunk and not (p in ("I", "E") and pt == t):
            return f"the {pt} entity opened by {pp}-{pt} must continue with I-{pt} or end with E-{pt}"
    return None


def check_files(files: dict[str, Any], scheme: str) -> str:
    """Every tag of every file (name -> Sentences with string tags) against the scheme; returns
    the scheme found (`auto` resolved)."""
    for sentences in files.values():
        seen: set[str] = set()
        for s, tags in enumerate(sentences.tags):
            for w, tag in enumerate(tags):
                if tag not in seen:
                    check_label(tag, scheme, lambda s=s, w=w: sentences.where(s, w))
                    seen.add(tag)
    found = scheme_of([f.tags for f in files.values()], scheme)
    for sentences in files.values():
        for s, tags in enumerate(sentences.tags):
            try:
                check_sentence(tags, found, lambda w, s=s, f=sentences: f.where(s, w))
            except UserError as error:
                _refuse_mixed(files, sentences, error)
                raise
    return found


def _refuse_mixed(files: dict[str, Any], broken: Any, error: UserError) -> None:
    """Files written in different schemes (a Hub-derived IOB2 train file beside CoNLL-2003's
    original IOB1 test file) are one line naming each file's scheme and the tag that shows it.
    The line was the first break of the scheme the other file set, ending "(or set task.scheme to
    the file's scheme)", which no setting fixes: a scheme of one file is refused in the other. The
    scorer reads both alike (conlleval's rules), but the model learns one file's tags (B- at an
    entity's start) and token accuracy compares them with the other's (I-), so no scheme is taken."""
    shown = {n: (scheme_of([f.tags], "auto"), _evidence(f)) for n, f in files.items()}
    if not shown[_name(files, broken)][1] or len({sc for sc, at in shown.values() if at}) < 2:
        return  # one scheme among the files that show one: the break is the file's own
    said = "; ".join(f"the {n} file is {sc} ({at})" for n, (sc, at) in shown.items() if at)
    raise UserError(f"{said}: a run's files are in one tag scheme, whatever task.scheme says (the model learns "
                    "one file's tags and token accuracy compares them with the other's); write every file in one "
                    "scheme (IOB1 to IOB2: an I-X that starts an entity is B-X)") from error


def _name(files: dict[str, Any], sentences: Any) -> str:
    return next(n for n, f in files.items() if f is sentences)


def _evidence(sentences: Any) -> str | None:
    """Where a file first shows its scheme (`scheme_of`): an E-/S- tag (IOBES), an entity that
    starts with I- (IOB1) or with B- (IOB2, as IOB1 starts one with B- only after its type)."""
    for kind in ("IOBES", "IOB1", "IOB2"):
        for s, tags in enumerate(sentences.tags):
            for w, (prev, tag) in enumerate(zip([None, *tags], tags)):
                (pp, pt), (p, t) = split(prev), split(tag)
                starts = pp not in ("B", "I") or pt != t
                if (kind == "IOBES" and p in ("E", "S")) or (kind == "IOB1" and p == "I" and starts) \
                        or (kind == "IOB2" and p == "B" and starts):
                    after = repr(prev) if prev else "the sentence's start"
                    return f"{sentences.where(s, w)}: '{tag}' after {after}"
    return None


def label_order(tags: set[str]) -> list[str]:
    """Label names in id order for tags read from files: O, then by type, B I E S within one."""
    rest = sorted(tags - {"O"}, key=lambda tag: (split(tag)[1], "BIES".find(split(tag)[0])))
    return ["O", *rest]
