"""`ner`: named-entity recognition as token classification (CoNLL-2003 by default).

Files hold one `token TAG` per line, a blank line between sentences (`-DOCSTART-` lines are
skipped), or JSON / JSONL records of words and tags (`tokens` / `ner_tags`). The tags are checked
against their scheme (IOB2, IOB1 or IOBES; `_tags`) before anything trains, and read from the
files when `labels` is null. As transformers' run_ner does, each word's tag is learnt on its first
sub-token and the other sub-tokens are left out of loss and scoring (-100). Scores are entity-level
precision, recall and F1 as seqeval computes them (an entity counts when its type and span both
match; the default, conlleval-compatible mode), plus token accuracy.

A sentence is scored on all its gold words. Unlike run_ner, which drops the words past
`task.max_length` from both the gold and the predicted tags (an entity F1 of the sentence's head
only, optimistic where sentences are cut), a word the model never saw (past the cut, or one the
tokenizer turns into no sub-token) is predicted `O` against its gold tag: a missed entity counts as
missed. Each encoded row carries `word_index` (the word each first sub-token starts) so the
scorer maps predictions back to words without the tokenizer; `toolkit predict` encodes as
training does, tags unseen words `O` by the same rule and counts them in the same warnings. Not
a sliding window: that would make one sentence several features, with their merge in every
entry point, where raising task.max_length (the warning says by how many words) is the real fix.

The task declares its own head (`token-classification`) and its prediction path (tags per word),
so neither the model loader nor `toolkit predict` knows it by name.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from toolkit import heads, readers
from toolkit.errors import UserError
from toolkit.lazy import lazy
from toolkit.tasks import TASKS, Metric, Task, _fields, _tags, fingerprint, subset
from toolkit.tasks._classification import undefined

torch = lazy("torch", globals())
F = lazy("torch.nn.functional", globals())

TOKEN_CLASSIFICATION = heads.declare("token-classification", heads.Head(
    "AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "TOKEN_CLS"))
# CoNLL-2003's tags in the order of the Hub's conll2003 data set (its ClassLabel ids)
CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
IGNORE = -100
WORD_INDEX = "word_index"  # per sub-token: the word it starts (first sub-token), else -100
OUTSIDE = "O"  # the tag of a word the model never saw
ENTITY_SCORING = "seqeval default mode (conlleval), not strict"  # metric_info


@dataclass
class Sentences:
    """A file's sentences: words and their tags as written, and where each is (for errors)."""

    path: Path
    tokens: list[list[str]]
    tags: list[list[Any]]  # strings; a JSONL file may hold numbers (ids into task.labels)
    lines: list[list[int]] | None  # CoNLL: each word's line; JSONL: None (the record's line)

    def where(self, sentence: int, word: int = 0) -> str:
        if self.lines is not None:
            return f"{self.path}:{self.lines[sentence][word]}"
        return readers.where(self.path, "jsonl", sentence)


WORD_BREAK = re.compile(r"[ \t\r\n]+")


def split_words(text: str) -> list[str]:
    """A text's words as a CoNLL file separates them: at spaces and tabs (and the line breaks
    that end its lines), the one rule of the file reader and of `toolkit predict`'s text inputs.
    A no-break space, U+2028 or U+3000 is part of a word: str.split broke 'New\u00a0York', one
    word of a training file, into two words at predict (two tags, exit 0)."""
    return [word for word in WORD_BREAK.split(text) if word]


def read_conll(path: Path) -> Sentences:
    """One sentence per blank-line-separated block of `token ... TAG` lines (`-DOCSTART-` lines
    are skipped), each with as many columns as the first: a line of more (a word holding a space,
    `New York B-LOC`) was read as its first and last column, the word 'New', exit 0. The shared
    reader's byte scan checks it first (there, size limit, gzip, UTF-8).
    Columns are separated by spaces and tabs only, as CoNLL's readers split them (`split_words`):
    a no-break space or U+2028 is part of the word (str.split would cut 'New\u00a0York' to 'New')."""
    readers.scan(path, plain=True)
    out = Sentences(path, [], [], [])
    words: list[str] = []
    tags: list[str] = []
    lines: list[int] = []
    width: tuple[int, int] | None = None  # (columns, line) of the first word line: every one has as many
    with readers.open_text(path) as handle:
        text = list(handle)  # the sentences are kept anyway: the text is no larger
    for number, line in enumerate(text + [""], start=1):
        parts = split_words(line)
        if not parts or parts[0] == "-DOCSTART-":
            if words:
                out.tokens.append(words)
                out.tags.append(tags)
                out.lines.append(lines)
            words, tags, lines = [], [], []
            continue
        if len(parts) < 2:
            raise UserError(f"{path}:{number}: expected 'token TAG', got {line.strip()!r}")
        if width is None:
            width = (len(parts), number)
        elif len(parts) != width[0]:  # 'New York B-LOC' beside 'word TAG' lines: the word was 'New'
            raise UserError(f"{path}:{number}: {len(parts)} columns where line {width[1]} has {width[0]}; every "
                            "word line holds the same columns (the word first, the tag last), separated by spaces "
                            "or tabs: a word cannot hold a space")
        if readers.blank(parts[0]):  # a zero-width space or a no-break space: no word to tag
            raise UserError(f"{path}:{number}: the token {parts[0]!r} is blank (nothing but invisible "
                            "characters); every line needs a word")
        words.append(parts[0])
        tags.append(parts[-1])
        lines.append(number)
    if not out.tokens:
        raise UserError(f"{path}: holds no sentences")
    return out


TOKENS_FIELDS = ("tokens", "words")
TAGS_FIELDS = ("ner_tags", "tags", "labels", "ner")


def read_jsonl(path: Path, tokens_field: str | None = None, tags_field: str | None = None) -> Sentences:
    """One sentence per record: a list of words and a list of tags, one per word (the Hub's
    `tokens` / `ner_tags`); fields named otherwise are inferred, or listed when several fit."""
    fmt = readers.file_format(path, ("json", "jsonl"))
    ds = readers.read(path, fmt)
    lists = [n for n, f in ds.features.items() if not hasattr(f, "dtype")]  # list-valued fields
    fields: list[str] = []
    for setting, given, names in (("tokens_field", tokens_field, TOKENS_FIELDS), ("tags_field", tags_field, TAGS_FIELDS)):
        fields.append(find_field(setting, given, names, list(ds.column_names), lists, fields, path))
    out = Sentences(path, [], [], None)
    for i, record in enumerate(ds.to_list()):
        words, tags = record.get(fields[0]), record.get(fields[1])
        at = lambda: readers.where(path, fmt, i)
        if not isinstance(words, list) or not words or not all(isinstance(w, str) and not readers.blank(w) for w in words):
            raise UserError(f"{at()}: '{fields[0]}' should be a non-empty list of words")
        if tags is not None and not isinstance(tags, list):  # "O B-X" was "holds no tags for 2 words"
            raise UserError(f"{at()}: '{fields[1]}' is {readers.json_type(tags)}, expected a list of tags, one per word")
        if not isinstance(tags, list) or len(tags) != len(words):
            count = len(tags) if isinstance(tags, list) else "no"
            raise UserError(f"{at()}: '{fields[1]}' holds {count} tags for {len(words)} words; give one tag per word")
        out.tokens.append(words)
        out.tags.append(tags)
    return out


def find_field(setting: str, given: str | None, names: tuple[str, ...], columns: list[str], lists: list[str],
               taken: list[str], where: Any, fix: str = "set task.{setting}") -> str:
    """The field of the words (or tags) among a record's `columns`: `given` (the recipe's
    task.`setting`), else the first of `names` present, else the one list-valued field (`lists`)
    no other role has taken or could name; else one line listing the candidates (ending in `fix`)."""
    if given is not None and given not in columns:
        raise UserError(f"task.{setting}: {where} has no field '{given}' (it has: {', '.join(columns)})"
                        + readers.near_name(given, columns))
    found = given or next((n for n in names if n in columns), None)
    free = [n for n in lists if n not in taken and n not in TOKENS_FIELDS + TAGS_FIELDS]
    if found is None and len(free) != 1:
        raise UserError(f"task.{setting}: {where} has no '{names[0]}' field (candidates: "
                        f"{', '.join(repr(n) for n in free) or 'none'}; fields: {', '.join(columns)}); "
                        + fix.format(setting=setting))
    return found or free[0]


def read_sentences(path: Path, tokens_field: str | None = None, tags_field: str | None = None) -> Sentences:
    """JSON / JSONL records by their extension (`.gz` too), else a CoNLL file."""
    suffixes = [x.lower() for x in path.suffixes if x.lower() != ".gz"]
    if suffixes and suffixes[-1] in (".json", ".jsonl"):
        if not path.is_file():
            raise UserError(f"{path}: no such file")
        return read_jsonl(path, tokens_field, tags_field)
    return read_conll(path)


def is_tag(text: str) -> bool:
    """Whether a CoNLL column reads as a tag of some scheme (`O`, or B-/I-/E-/S- and a type)."""
    return text == "O" or _tags.split(text)[0] in ("B", "I", "E", "S")


def align_labels(word_ids: list[int | None], tags: list[int]) -> list[int]:
    """Each word's tag on its first sub-token; -100 on the rest and on special tokens (run_ner's
    default, `label_all_tokens` off)."""
    out, previous = [], None
    for word in word_ids:
        out.append(IGNORE if word is None or word == previous else tags[word])
        previous = word
    return out


def first_words(word_ids: list[int | None]) -> list[int]:
    """Per sub-token, the index of the word it starts (its first sub-token), else -100: where
    align_labels puts each word's tag, so that scoring maps predictions back to words."""
    out, previous = [], None
    for word in word_ids:
        out.append(IGNORE if word is None or word == previous else word)
        previous = word
    return out


def word_tags(preds: Any, words: Any, count: int, names: list[str]) -> list[str]:
    """One predicted tag per word of a sentence of `count` words: the prediction at the word's
    first sub-token, `O` for a word no sub-token of which the model saw."""
    tags = [OUTSIDE] * count
    for pred, word in zip(preds, words):
        if 0 <= word < count:
            tags[word] = names[pred]
    return tags


def untagged(tokenizer: Any, words: list[str], firsts: list[int], cut: bool) -> dict[str, Any]:
    """A predicted row's words the model did not tag (tagged `O` by rule): `tagged`, how many
    words fit task.max_length where the sentence was cut (the words from there on are past the
    cut), and `no_token`, the indices of words the tokenizer turns into no sub-token (a lone
    combining accent or U+FFFD to BERT's), wherever they are. `tagged` was the count of words
    seen: one such word inside a sentence made it one short, so `tags[:tagged]`, read as the
    tags the model gave, dropped the last word's real tag and kept the untagged word's `O`."""
    seen = {w for w in firsts if w != IGNORE}
    has_token = seen
    if cut:  # which of the unseen words are past the cut: the sentence tokenized whole
        has_token = {w for w in tokenizer(words, is_split_into_words=True).word_ids() if w is not None}
    past = [j for j in range(len(words)) if j in has_token and j not in seen]
    none = [j for j in range(len(words)) if j not in has_token]
    return {**({"tagged": past[0]} if past else {}), **({"no_token": none} if none else {})}


PROBE_WORDS = ("U.S.", "Jean-Pierre", "O'Neil", "3,000", "St.")  # words of one token-free piece each


def pipeline_splits(tokenizer: Any) -> list[str]:
    """The words of PROBE_WORDS (a CoNLL sentence's: punctuation inside a word) that transformers'
    token-classification pipeline takes as more than one word (its `gather_pre_entities`, which
    aggregation_strategy "first" groups by): with a tokenizer whose model marks continued
    sub-tokens (WordPiece's `##`), a token starts a word where its text is as long as its token
    string, so a piece its pre-tokenizer split off ('.' of 'U.S.') is a word of its own; with
    others, a token starts a word after a space, as the run's words are. An unknown token starts
    one in both."""
    if not getattr(tokenizer, "is_fast", False):
        return []
    text = " ".join(PROBE_WORDS)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    marked = getattr(getattr(getattr(tokenizer, "_tokenizer", None), "model", None), "continuing_subword_prefix", None)
    split, seen = [], set()
    for token, (start, end) in zip(tokenizer.convert_ids_to_tokens(enc["input_ids"]), enc["offset_mapping"]):
        if end <= start:
            continue
        word = text[:end - 1].count(" ")  # the word of the token's last character
        if marked:
            starts = len(token) == end - start
        else:
            starts = start == 0 or " " in text[start - 1:start + 1]
        starts = starts or token == tokenizer.unk_token
        if word in seen and starts and PROBE_WORDS[word] not in split:
            split.append(PROBE_WORDS[word])
        seen.add(word)
    return split


class WordCollator:
    """transformers' DataCollatorForTokenClassification, with `word_index` padded as the labels
    are (-100, on the tokenizer's padding side): that collator pads `labels` alone."""

    def __init__(self, tokenizer: Any) -> None:
        from transformers import DataCollatorForTokenClassification

        self.inner = DataCollatorForTokenClassification(tokenizer, return_tensors="pt")
        self.left = tokenizer.padding_side == "left"

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        rows = [list(f[WORD_INDEX]) for f in features]
        batch = self.inner([{k: v for k, v in f.items() if k != WORD_INDEX} for f in features])
        width = batch["labels"].shape[1]
        fill = lambda row: [IGNORE] * (width - len(row))
        batch[WORD_INDEX] = torch.tensor([fill(r) + r if self.left else r + fill(r) for r in rows])
        return batch


def entity_scores(true: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    """seqeval's entity-level precision, recall and F1 (default mode) and token accuracy. A score
    whose denominator is 0 is undefined: NaN (null in metrics.json) with a warning, as a GLUE F1
    of no positive anywhere is (`_classification.undefined`), never seqeval's zero_division 0.0,
    which read a split of sentences without entities, tagged all O, as a model that found nothing
    (F1 0.0 where it was right everywhere). Precision of no predicted entity, recall of no gold
    entity, F1 of neither (2TP / (2TP + FP + FN)); one entity on either side keeps F1 defined."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score
    from seqeval.metrics.sequence_labeling import get_entities

    gold, found = len(get_entities(true)), len(get_entities(pred))
    said = f"{len(true)} sentence(s)"
    out = {"f1": float(f1_score(true, pred, zero_division=0)),
           "precision": float(precision_score(true, pred, zero_division=0)),
           "recall": float(recall_score(true, pred, zero_division=0)),
           "accuracy": float(accuracy_score(true, pred))}
    if not gold and not found:
        out["f1"] = undefined(f"warning: f1 is undefined (no entity in the gold tags nor the predictions of {said}); "
                              "recorded as null")
    if not found:
        out["precision"] = undefined(f"warning: precision is undefined (no entity predicted in {said}); recorded as null")
    if not gold:
        out["recall"] = undefined(f"warning: recall is undefined (no entity in the gold tags of {said}); recorded as null")
    return out


@TASKS.register("ner")
@dataclass(kw_only=True)
class Ner(Task):
    head = TOKEN_CLASSIFICATION
    words_given = True

    train_file: str | None = "$TOOLKIT_DATA/ner/conll2003/train.txt"  # CoNLL, or .jsonl/.json records
    eval_file: str = "$TOOLKIT_DATA/ner/conll2003/valid.txt"
    # tag names in id order; None: every tag the files hold (O first, then by type)
    labels: list[str] | None = field(default_factory=lambda: list(CONLL_TAGS))
    scheme: Literal["auto", "IOB1", "IOB2", "IOBES"] = "auto"  # checked in labels and files (_tags)
    field_keys: ClassVar[tuple[str, ...]] = ("tokens_field",)
    scored_keys: ClassVar[tuple[str, ...]] = ("tags_field",)
    tokens_field: str | None = None  # JSONL fields; None: tokens / words
    tags_field: str | None = None  # None: ner_tags / tags / labels / ner

    def __post_init__(self) -> None:
        self._found_labels: list[str] | None = None  # read from the files at load
        self._found_scheme: str | None = None

    def check(self) -> None:
        if self.labels is None:
            return
        if len(set(self.labels)) != len(self.labels) or "O" not in self.labels:
            raise UserError(f"task.labels: BIO tags, each once and 'O' among them (got {', '.join(self.labels)})")
        for tag in self.labels:
            _tags.check_label(tag, self.scheme, "task.labels")

    @property
    def label_names(self) -> list[str] | None:
        return list(self.labels) if self.labels is not None else self._found_labels

    def adopt_labels(self, names: list[str]) -> None:
        if self.label_names is None:
            self._found_labels = list(names)

    def declared_metrics(self) -> list[Metric]:
        return [Metric("f1", True, 100.0), Metric("precision", True, 100.0), Metric("recall", True, 100.0),
                Metric("accuracy", True, 100.0)]

    def metric_info(self) -> dict[str, str]:
        """The scheme the files were checked against, and the entity matching the scores are of:
        seqeval's default mode (conlleval's chunk rules, run_ner's), not its strict mode, which
        drops a predicted entity that starts with I- in IOB2 (the two differ on one model)."""
        return {"tag_scheme": self._found_scheme, "entity_scoring": ENTITY_SCORING} if self._found_scheme else {}

    def head_kwargs(self) -> dict[str, Any]:
        names = self.label_names or []
        return {"num_labels": len(names), "id2label": dict(enumerate(names)),
                "label2id": {n: i for i, n in enumerate(names)}}

    # --- data ----------------------------------------------------------------------------------
    def data_files(self) -> list[Path]:
        return [Path(self.expand(f)) for f in (self.train_file, self.eval_file) if f]

    def load(self) -> dict[str, Any]:
        """Both files read, their tags checked against the scheme (and task.labels), then ids."""
        from datasets import Dataset

        files = {split: read_sentences(Path(self.expand(f)), self.tokens_field, self.tags_field)
                 for split, f in (("train", self.train_file), ("eval", self.eval_file)) if f}
        for sentences in files.values():
            self._names_for_numbers(sentences)
        self._found_scheme = _tags.check_files(files, self.scheme)
        self._note_foreign_labels(files)
        self._note_eval_only_types(files)
        if self.label_names is None:  # not adopted from a trained model (eval)
            self._found_labels = _tags.label_order({t for f in files.values() for s in f.tags for t in s})
            count, shown = _fields.alike_names(self._found_labels)
            if count:  # `B-PER` and `B-Per` (or B-PER and a zero-width space) were two entity types, silently
                self.note("label case", f"{', '.join(dict.fromkeys(str(f) for f in (self.train_file, self.eval_file) if f))}: "
                                        f"{count} group(s) of tags differ only in case, spaces, Unicode form or "
                                        f"invisible characters ({shown}); each is its own tag (and entity type): "
                                        "write them alike if they are one")
        ids = {split: self._ids(sentences) for split, sentences in files.items()}
        limit = {"train": self.max_train_samples, "eval": self.max_eval_samples}
        data = {split: subset(Dataset.from_dict(d), limit[split]) for split, d in ids.items()}
        return {"train": data.get("train"), "eval": {"": data["eval"]}}

    def _note_foreign_labels(self, files: dict[str, Sentences]) -> None:
        """task.labels holding tags of a prefix the files' scheme lacks (IOBES's E-/S- beside IOB2 or
        IOB1 files, `auto` resolved): no file holds them, so those classes are never trained, yet
        the head has them and predict can give them, exit 0 without a word. Said, not refused: a run
        trained so (and its eval) keeps working. The reverse (IOB2 labels, IOBES files) is refused
        where a file's S- tag is not one of task.labels (`_ids`)."""
        allowed = _tags.PREFIXES.get(self._found_scheme or "", "BIES")
        foreign = [t for t in self.labels or [] if t != "O" and _tags.split(t)[0] not in allowed]
        if foreign:
            names = ", ".join(str(self.expand(f)) for f in (self.train_file, self.eval_file) if f)
            self.note("labels scheme", f"task.labels holds {', '.join(foreign)}, not {self._found_scheme} tags, and "
                                       f"the files ({names}) are {self._found_scheme}: no file holds them, so those "
                                       "classes are never trained, yet the model can predict them; drop them from "
                                       "task.labels (or write the files in IOBES)")

    def _note_eval_only_types(self, files: dict[str, Sentences]) -> None:
        """An entity type the eval file holds and no training sentence does (a dev-only `LOC`, a type
        spelled another way in one file): the model never learns it, and every one of its entities
        counts as missed, exit 0 without a word (text classification refuses a dev-only label;
        here a dev-only I- tag of a trained type is fine, so the unit is the type). Said, not
        refused: the score is what the model does. Read over the whole training file, not the
        `max_train_samples` part a run keeps, so a small smoke run is not said to lack types."""
        if "train" not in files or "eval" not in files:
            return
        def types(sentences: Sentences) -> set[str]:
            return {_tags.split(t)[1] for tags in sentences.tags for t in tags if t != "O"}

        only = [t if t.isprintable() and t.strip() == t else ascii(t) for t in sorted(types(files["eval"]) - types(files["train"]))]
        if only:  # an invisible character or an edge space escaped, as the label-case line does
            self.note("eval-only types", f"{self.expand(self.eval_file)}: entity type(s) {', '.join(only)} appear in no "
                                         f"sentence of {self.expand(self.train_file)}: the model never learns them, and "
                                         "every one of their entities counts as missed in the scores")

    def _names_for_numbers(self, sentences: Sentences) -> None:
        """A JSONL file's numeric tags are ids into task.labels (as the Hub's ClassLabel is). A
        whole number is an id however the reader holds it: JSON has one number type, and one
        `0.0` (or `1e0`) anywhere in the file made the reader hold every sentence's tags as doubles,
        so the first sentence, written `[1, 2, 0]`, was refused as "tags should be text or numbers"."""
        for s, tags in enumerate(sentences.tags):
            tags = sentences.tags[s] = [int(t) if isinstance(t, float) and t.is_integer() else t for t in tags]
            if not any(isinstance(t, int) and not isinstance(t, bool) for t in tags):
                if not all(isinstance(t, str) for t in tags):
                    raise UserError(f"{sentences.where(s)}: tags should be text (B-PER) or numbers (ids into task.labels)")
                continue
            if self.labels is None:
                raise UserError(f"{sentences.where(s)}: tags are numbers; set task.labels to the tag names in "
                                "id order (e.g. [O, B-PER, I-PER, ...])")
            bad = next((t for t in tags if not isinstance(t, int) or not 0 <= t < len(self.labels)), None)
            if bad is not None:
                raise UserError(f"{sentences.where(s)}: tag {bad!r} is not an id into task.labels (0..{len(self.labels) - 1})")
            sentences.tags[s] = [self.labels[t] for t in tags]

    def _ids(self, sentences: Sentences) -> dict[str, list]:
        names = self.label_names or []
        index = {tag: i for i, tag in enumerate(names)}
        for s, tags in enumerate(sentences.tags):
            for w, tag in enumerate(tags):
                if tag not in index:
                    raise UserError(f"{sentences.where(s, w)}: tag '{tag}' is not one of task.labels ({', '.join(names)})")
        return {"tokens": sentences.tokens, "tags": [[index[t] for t in tags] for tags in sentences.tags]}

    def read_columns(self) -> list[str]:
        return ["tokens"]

    def encode(self, dataset: Any, tokenizer: Any) -> Any:
        if not getattr(tokenizer, "is_fast", False):
            raise UserError("task.name: ner needs a fast tokenizer (word ids map tags to sub-tokens)")

        def tok(batch: dict) -> dict:
            out = self.tokenize(tokenizer, batch["tokens"], limit=self.max_length, is_split_into_words=True)
            out["labels"] = [align_labels(out.word_ids(i), tags) for i, tags in enumerate(batch["tags"])]
            out[WORD_INDEX] = [first_words(out.word_ids(i)) for i in range(len(batch["tags"]))]
            out["unseen"] = [len(words) - sum(w != IGNORE for w in firsts)
                             for words, firsts in zip(batch["tokens"], out[WORD_INDEX])]
            return out

        encoded = dataset.map(tok, batched=True, remove_columns=dataset.column_names,
                              new_fingerprint=fingerprint(dataset, tokenizer, self, "encode, words mapped"))
        self.note_cut("sentences", "task.max_length", self.max_length, encoded["cut"])
        self._note_unseen(sum(encoded["unseen"]), sum(len(t) for t in dataset["tokens"]))
        return encoded.remove_columns(["cut", "unseen"])

    def _note_unseen(self, unseen: int, total: int) -> None:
        """Words no sub-token of which the model sees, summed over the splits encoded in this run
        (said beside the count of cut sentences, `notices`)."""
        done, words = self.__dict__.get("_unseen", (0, 0))
        self.__dict__["_unseen"] = (done + unseen, words + total)

    def notices(self, run: bool = True) -> dict[str, str]:
        lines = super().notices(run)
        unseen, total = self.__dict__.get("_unseen", (0, 0))
        if unseen:
            fate = (f"not trained on, and scored as tagged {OUTSIDE} against their gold tags" if run
                    else f"tagged {OUTSIDE}")
            lines["unseen words"] = (f"{unseen} of {total} words are never seen by the model (past "
                                     f"task.max_length={self.max_length} tokens, or no sub-token): {fate}")
        return lines

    def collator(self, tokenizer: Any, model: Any = None) -> Any:
        return WordCollator(tokenizer)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v for k, v in batch.items() if k not in ("labels", WORD_INDEX)}

    # --- loss and evaluation -------------------------------------------------------------------
    def units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(b,) tagged words: the loss is a mean over words, as Trainer's is over the batch."""
        return (batch["labels"] != IGNORE).sum(-1)

    @staticmethod
    def tag_logits(outputs: Any, width: int) -> torch.Tensor:
        """(b, width, c): the logits of the input's own positions. PEFT's soft prompts (prompt
        tuning, p-tuning) come first and get logits too; kept, they shifted every tag by the
        virtual tokens (a traceback in the loss)."""
        return outputs.logits[:, -width:]

    def loss(self, outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        labels = batch["labels"]  # (b, t)
        logits = self.tag_logits(outputs, labels.shape[1]).float()  # (b, t, c)
        per_token = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="none")
        return per_token.sum(-1)  # (b,)

    def outputs(self, outputs: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"preds": self.tag_logits(outputs, batch["labels"].shape[1]).argmax(-1), WORD_INDEX: batch[WORD_INDEX]}

    def score(self, outputs: dict[str, np.ndarray], raw: Any) -> dict[str, float]:
        """Every gold word of every sentence (the raw split's tags), against the prediction at
        its first sub-token, or `O` where the model never saw it (see the module's docstring)."""
        names = self.label_names or []
        true = [[names[i] for i in tags] for tags in raw["tags"]]
        pred = [word_tags(p_row, w_row, len(gold), names)
                for p_row, w_row, gold in zip(outputs["preds"], outputs[WORD_INDEX], true)]
        return entity_scores(true, pred)

    # --- prediction ----------------------------------------------------------------------------
    predicts = True
    predict_word_lists = ("tokens",)

    def export_settings(self, tokenizer: Any = None) -> str:
        """An export's line says how the run read a tag per word: the folder's model tags every
        sub-token, and transformers' token-classification pipeline, as loaded, gives each one
        its own tag (aggregation_strategy "none"), those after a word's first never trained
        (-100): other tags than `toolkit predict`'s, exit 0, for every word of more than one.
        The pipeline's aggregation_strategy "first" is named as the way to group entities so only
        where it finds the run's words (`pipeline_splits`): with a WordPiece tokenizer (BERT) it
        cut 'U.S.' into four words, each tagged at its own (untrained) sub-token, and gave other
        entities than the run's, exit 0, where the line said it grouped them by the run's rule."""
        said = ("; a word's tag is the one at its first sub-token (the rest were never trained, as run_ner "
                "trains them): the tokenizer on the words with is_split_into_words=True, the argmax at the "
                "first position of each word_ids() value, O for a word with none (past the cut); ")
        split = pipeline_splits(tokenizer) if tokenizer is not None else []
        if not split:
            return said + ("pipeline(\"token-classification\", model=OUT, aggregation_strategy=\"first\") groups "
                           "entities by that rule")
        return said + ("pipeline(\"token-classification\", model=OUT) does not: its words are not the run's with this "
                       f"tokenizer ({', '.join(repr(w) for w in split)} are several words each to it, cut where its "
                       "tokenizer cuts them, each tagged at its own sub-token, with any aggregation_strategy), so its "
                       "entities "
                       "differ on such words; tag by the rule above")

    def predict_fields(self, model: Any) -> list[str]:
        self.labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        return ["tokens"]

    def input_fields(self, names: list[str], kinds: dict[str, str], where: str) -> list[str]:
        """The words of a predict input as a JSONL file to evaluate on has them found
        (`find_field`): task.tokens_field where set, else `tokens` or `words`, else the one
        list-valued field; predict demanded `tokens` even of a run trained on (and evaluated on)
        files of `words` or of the field task.tokens_field names."""
        lists = [k for k, v in kinds.items() if v == "list"]
        return [find_field("tokens_field", self.tokens_field, TOKENS_FIELDS, list(kinds), lists, [], where,
                           fix="name it so in the input")]

    def predict(self, model: Any, tokenizer: Any, rows: list[dict]) -> list[dict]:
        """Per row its id field where it has one (`_fields.row_key`), its words (`tokens`: a list,
        or a string split at spaces and tabs, `words_of`) and one tag per word. Words are encoded
        as training encodes them (`Task.tokenize`), and what the model does not see (past
        task.max_length sub-tokens) is tagged `O`, as the scorer counts it, and said in the run's
        warnings (the cut sentences, the unseen words); `tagged` and `no_token` (`untagged`) say
        which words a row's model did not tag, where any."""
        self.predict_fields(model)
        sentences = [self.words_of(row["tokens"], i) for i, row in enumerate(rows)]
        enc = self.tokenize(tokenizer, sentences, limit=self.max_length, is_split_into_words=True)
        firsts = [first_words(enc.word_ids(i)) for i in range(len(sentences))]
        seen = [sum(w != IGNORE for w in row) for row in firsts]
        self.note_cut("sentences", "task.max_length", self.max_length, enc["cut"])
        self._note_unseen(sum(len(w) for w in sentences) - sum(seen), sum(len(w) for w in sentences))
        out = []
        device = next(model.parameters()).device
        for i, words in enumerate(sentences):
            inputs = {k: torch.tensor([v[i]], device=device) for k, v in enc.items() if k != "cut"}
            with torch.no_grad():
                outputs = model(**inputs)
                ids = self.tag_logits(outputs, inputs["input_ids"].shape[1])[0].argmax(-1).tolist()
            tags = word_tags(ids, firsts[i], len(words), self.labels)
            out.append({**_fields.row_key(rows[i], ["tokens"]), "tokens": words, "tags": tags,
                        **untagged(tokenizer, words, firsts[i], enc["cut"][i])})
        return out

    def rows_of_own_format(self, lines: list[str], blank: list[int], name: str) -> list[dict] | None:
        """A CoNLL file given to predict (`word ... TAG` lines, as training and evaluation read)
        was predicted line by line, each line a sentence of its word and its tag ('EU B-ORG'
        tagged as two words), exit 0. A plain input is read as CoNLL where every word line holds
        the same columns, at least two, the last one tags in form (below), and it has two word lines
        or a -DOCSTART- line: sentences end at blank lines, words are the first column, the tags
        are not read (they are what is predicted). Said in one note.
        The last column need only be tags in form (`O`, or B-/I-/E-/S- and a type), not the run's
        own: a test file whose gold tags hold a type the model was not trained on (a tag set of
        another data set, a type missing from a `labels: null` run's files) was read as plain
        lines, each `word POS chunk TAG` line a sentence of four words, exit 0. One of the run's
        tags (`O` will do) must be among them; the note counts the tags that are not the run's.
        A file with a -DOCSTART- line is CoNLL whatever else it holds: one column (words, no tags)
        is read so, and lines of unequal columns or a last column that is no tag are one line
        naming the line (they were read as plain lines, each a sentence, exit 0)."""
        cols = [split_words(line) for line in lines]
        words = [c for c in cols if c[0] != "-DOCSTART-"]
        gaps = set(blank)
        at = [n for n, c in zip((n for n in range(1, len(lines) + len(blank) + 1) if n not in gaps), cols)
              if c[0] != "-DOCSTART-"]  # each word line's number in the file
        width = len(words[0]) if words else 0
        odd = next((i for i, c in enumerate(words) if len(c) != width), None)
        untagged = next((i for i, c in enumerate(words) if not is_tag(c[-1])), None) if width >= 2 else None
        foreign = sorted({c[-1] for c in words} - set(self.label_names or ())) if width >= 2 else []
        if len(words) < len(cols):  # -DOCSTART- lines: CoNLL, read as one or refused (was: lines, exit 0)
            fix = "a file with -DOCSTART- lines is read as a CoNLL file: every word line the same columns, " \
                  "separated by spaces or tabs, the word first and the tag (if any) last"
            if odd is not None:
                raise UserError(f"{name}:{at[odd]}: {len(words[odd])} columns where line {at[0]} has {width}; {fix}")
            if untagged is not None:
                raise UserError(f"{name}:{at[untagged]}: the last column {words[untagged][-1]!r} is not a tag (O, or "
                                f"B-/I-/E-/S- and a type); {fix}")
        elif not words or odd is not None or width < 2 or untagged is not None or len(words) < 2 \
                or len(foreign) == len({c[-1] for c in words}):  # none of the run's tags (not even O): lines
            return None
        sentences: list[list[str]] = [[]]
        pending = iter(cols)
        for number in range(1, len(lines) + len(blank) + 1):
            c = None if number in gaps else next(pending)
            if c is None or c[0] == "-DOCSTART-":
                if sentences[-1]:
                    sentences.append([])
            else:
                sentences[-1].append(c[0])
        rows = [{"tokens": s} for s in sentences if s]
        if not rows:
            raise UserError(f"--input: {name} holds no sentences (-DOCSTART- lines alone)")
        shape = f"{width} columns, the last one tags" if width >= 2 else "1 column, words alone"
        print(f"note: {name}: read as a CoNLL file ({shape}): "
              f"{len(rows)} sentences, each word's first column predicted" + ("; its tags are not read" if width >= 2 else "")
              + (f" ({len(foreign)} tag(s) not among this run's: {', '.join(foreign[:5])}{', ...' * (len(foreign) > 5)})"
                 if foreign else ""), file=sys.stderr)
        return rows

    @staticmethod
    def words_of(value: Any, row: int) -> list[str]:
        """A predict input's words: a list as given, a text split as a CoNLL file's line is
        (`split_words`); a blank word (a zero-width or no-break space alone) refused as the
        readers refuse it in training files, where the model would tag nothing it could see."""
        words = split_words(value) if isinstance(value, str) else [str(w) for w in value]
        bad = next((j for j, w in enumerate(words) if readers.blank(w)), None)
        if bad is not None or not words:
            shown = f"word {bad + 1} ({words[bad]!r}) is blank" if bad is not None else "holds no words"
            raise UserError(f"predict: input {row}: 'tokens' {shown}; every word needs a visible "
                            "character (words are split at spaces and tabs only, as in a CoNLL file)")
        return words
