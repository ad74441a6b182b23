"""Raw text for the pretraining objectives (mlm, clm, denoise, span_corruption): not a plug-in.

Sources: a .txt / .gz file (one document per line, blank-line separated documents, or the file one
running text: `documents`), records (JSONL, JSON: a list or `{"data": [...]}`, CSV, TSV) with a
text field, or a Hub text data set. Documents are tokenised, each with the special tokens the
tokenizer puts around a text (the end-of-text token after it where it puts none there; a running
text's lines keep their line breaks and the frame goes around the whole text, as run_clm.py reads
a file), and packed into blocks with datasets' `map` (cached on disk for file sources), as
transformers' run_mlm.py / run_clm.py / run_t5_mlm_flax.py do, or, for mlm under `line_by_line`,
each one example cut at max_length and padded (run_mlm.py's --line_by_line).

The held-out split is a seeded fraction of the documents or its own file. Its examples are
marked (`heldout` column) so that `encode` corrupts them ONCE, at encode time, with a generator
seeded by (corruption_seed, block index): every evaluation of a run, every process, every run of
the recipe and every train.seed of a sweep scores the same masks. Training blocks are corrupted
afresh in the collator, each from a generator seeded by (corruption_seed, train.seed, epoch, block
index): new masks every epoch (dynamic masking) that a resumed run draws exactly as an
uninterrupted one, and other masks under another train.seed, as run_mlm.py's collator draws from
the generator `--seed` seeds (they were drawn from corruption_seed alone: every seed of a sweep
trained on the same masks, and its spread left the masks' variance out, exit 0). Torch's global
RNG would not do: the data loader collates one batch ahead of the step a checkpoint captures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from toolkit import models, readers
from toolkit.errors import UserError
from toolkit.schema import added
from toolkit.lazy import lazy
from toolkit.tasks import CATALOGUE, Metric, _fields, data_path, fingerprint, hub_dataset, hub_offline, subset
from toolkit.tasks._lm import IGNORE, TokenTask, decoder_inputs, special_frame, token_hits

torch = lazy("torch", globals())

HELDOUT = "heldout"  # column marking raw held-out documents (corrupted at encode time)


def _read_files(files: dict[str, str], fmt: str, documents: str, text_field: str | None,
                task: Any) -> tuple[Any, str | None]:
    """Local files -> (DatasetDict with one `text` column, the field it came from), through the
    shared reader: a text that is not text (a list, a number) or a file with nothing but
    whitespace is one line naming it. Records are read as summarization reads them (JSONL, a
    JSON list or `{"data": [...]}`, CSV, TSV: run_clm.py and run_mlm.py read CSV and JSON); a
    field the recipe leaves out is found in the first file (`text` and the like, else its only
    field) and read from the next one too."""
    from datasets import DatasetDict

    out = {}
    for split, file in files.items():
        path = data_path(file)
        if not path.exists():
            raise UserError(f"task.{split}_file: {path} is not there")
        if fmt == RECORDS:
            kind = readers.file_format(path, ("json", "jsonl", "csv", "tsv"))
            document = readers.document_field(path, kind, "data")
            ds = readers.read(path, kind, field=document)
            _fields.note_spaced(task, list(ds.column_names), str(path))
            text_field = text_field or _fields.pick_text(ds, str(path), "task.text_field")
            if text_field not in ds.column_names:
                raise UserError(f"task.text_field: {path} has no field '{text_field}' "
                                f"(fields: {', '.join(repr(c) for c in ds.column_names)}); set task.text_field"
                                + readers.near_name(text_field, ds.column_names))
            keys = (lambda i: [document, i]) if document else None
            readers.check_text(ds, text_field, path, kind, what=f"'{text_field}'", keys=keys, blank_ok=True,
                               note=task.note)
            ds = ds.select_columns([text_field])
            out[split] = ds.rename_column(text_field, "text") if text_field != "text" else ds
        elif documents == "blank_line":
            out[split] = _blank_line_documents(readers.read(path, "text", sample_by="paragraph"))
        else:
            out[split] = readers.read(path, "text", sample_by="line")
    return DatasetDict(out), text_field


def _blank_line_documents(paragraphs: Any) -> Any:
    """Documents separated by lines with nothing in them (`readers.blank`), from datasets' text
    builder's paragraphs, which it splits at an empty line only: WikiText's separators are lines
    of one space, and its whole valid.txt was one document. Each document is its lines joined by
    \n, without the line break datasets leaves after a file's last paragraph."""

    def split(batch: dict) -> dict:
        out: list[str] = []
        for text in batch["text"]:
            lines: list[str] = []
            for line in text.split("\n") + [""]:
                if not readers.blank(line):
                    lines.append(line)
                elif lines:
                    out.append("\n".join(lines))
                    lines = []
        return {"text": out}

    from datasets.utils import logging as ds_logging

    bars = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        return paragraphs.map(split, batched=True)
    finally:
        if bars:
            ds_logging.enable_progress_bar()


RECORDS = "records"
RECORD_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")  # files of records, each text one field


def _format(file: str) -> str:
    """records (.jsonl, .json, .csv, .tsv, `.gz` too) or text (any other name: .txt, WikiText's
    .tokens, .raw). A CSV or TSV was read as plain text (its header line a document, its quotes
    text, exit 0), then refused, where run_clm.py and run_mlm.py read its `text` column: it is
    read as records now, as a `{"data": [...]}` JSON is (summarization's layout, refused here)."""
    return RECORDS if file.lower().removesuffix(".gz").endswith(RECORD_SUFFIXES) else "text"


@dataclass(kw_only=True)
class TextTask(TokenTask):
    """Settings and data side shared by the pretraining objectives; subclasses corrupt blocks."""

    # What each objective declares: the kind of model it trains (refused on another kind at
    # validate, naming the examples and the objectives that would fit instead), and whether its
    # held-out score is perplexity (mlm, clm) or the loss alone (denoise, span_corruption).
    kind: ClassVar[str] = ""
    examples: ClassVar[str] = ""
    # the objectives whose examples may be single documents (`line_by_line`): mlm, as run_mlm.py's
    # --line_by_line; the others pack, as their references do (name: what they follow)
    packs_as: ClassVar[str] = ""
    instead: ClassVar[str] = ""
    perplexity: ClassVar[bool] = False

    train_file: str | None = None  # .txt/.gz, or records: .jsonl/.json/.csv/.tsv; `$TOOLKIT_DATA` is expanded
    eval_file: str | None = None  # held-out file; None: `eval_fraction` of the train documents
    dataset: str | None = None  # a Hub data set id (instead of files)
    dataset_config: str | None = None
    train_split: str = "train"
    eval_split: str | None = "validation"  # Hub split; None: `eval_fraction` of train
    text_field: str | None = None  # records / Hub: the field of the text; None: `text` or the like
    # plain text files: `line` one document a line (run_mlm.py's reading), `blank_line` documents
    # separated by blank lines (their lines joined by \n), `text` the file one running text, its
    # line breaks kept and nothing between its lines (run_clm.py's keep_linebreaks reading)
    documents: Literal["line", "blank_line", "text"] = "line"
    # each document (a line, a blank_line paragraph, a record) its own example: framed as the
    # tokenizer frames a text, cut at max_length, padded in the batch, never packed with another
    # (run_mlm.py's --line_by_line); False: documents packed into blocks of max_length
    line_by_line: bool = added(False, neutral=False)
    eval_fraction: float = field(default=0.05, metadata={"min": 0.001, "max": 0.5})
    # numpy's generators take seeds of 0 and up (a negative one was a ValueError traceback from
    # inside datasets' split or the first batch's masks); the bounds are train.seed's
    split_seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # fixed: every training
    # seed is evaluated on the same documents
    corruption_seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # the held-out
    # masks / spans are drawn from this seed alone; the training ones from it and train.seed

    def check(self) -> None:
        if (self.train_file is None) == (self.dataset is None):
            raise UserError("task: set exactly one of task.train_file (a local text/JSONL file) "
                            "and task.dataset (a Hub data set id)")
        if self.dataset is not None and self.eval_file is not None:
            raise UserError("task.eval_file: goes with task.train_file; a Hub data set uses task.eval_split")
        if self.line_by_line and self.documents == "text":
            raise UserError("task.line_by_line: reads each document as an example of its own, and documents: text "
                            "makes the file one running text; use documents: line (run_mlm.py's --line_by_line "
                            "reads a line an example) or blank_line")
        if self.line_by_line and self.packs_as:
            raise UserError(f"task.line_by_line: {self.name} packs documents into blocks of task.max_length, as "
                            f"{self.packs_as} does; one document an example is mlm's (run_mlm.py's --line_by_line); "
                            "remove it")

    def ignores(self) -> dict[str, str]:
        """A Hub data set's parts with files; a fraction split off the train documents where the
        held-out ones are given."""
        out = {}
        if self.dataset is None:
            why = "it names a part of a Hub data set, and this task reads task.train_file; set task.dataset to use it"
            out = {f"task.{name}": why for name in ("dataset_config", "train_split", "eval_split")}
        if (self.dataset is not None or _format(self.train_file or "") == RECORDS) and self.documents != "text":
            out["task.documents"] = ("it splits plain text files into documents (lines or blank-line "
                                     "paragraphs), and this task's documents are records (JSONL, JSON, CSV, "
                                     "TSV, a Hub data set): each text is one (or all one running text: "
                                     "documents: text)")
        else:  # a plain text file: its documents are lines or paragraphs, no field is read
            out["task.text_field"] = ("it names the field of the text in records (JSONL, JSON, CSV, TSV) or a Hub data set, and "
                                      "task.train_file is plain text (a document a line or paragraph)")
        if self.running() and self._split_off_train():
            out["task.split_seed"] = ("documents: text holds out the text's first task.eval_fraction of lines, "
                                      "in order (as run_clm.py's validation_split_percentage), drawing nothing")
        if self.eval_file is not None or self.dataset is not None and self.eval_split is not None:
            out["task.eval_fraction"] = ("it splits held-out documents off the train ones, and this task's are "
                                         "given (task.eval_file or task.eval_split); unset those to use it")
        return out

    def running(self) -> bool:
        """The source read as one running text (`documents: text`): its rows end to end, framed
        once at its start and end; blank rows are text. A plain text file's rows are its lines,
        each with its line break (`line_breaks`); records' and a Hub data set's rows are their
        texts as they are (WikiText on the Hub: a line each, its `\n` in it)."""
        return self.documents == "text"

    def line_breaks(self) -> bool:
        """Each row a line of a plain text file, whose line break the reader took off."""
        return self.running() and self.dataset is None and _format(self.train_file or "") != RECORDS

    def note_eval_in_train(self, raw: dict[str, Any]) -> None:
        """A running text's lines are its examples here, less its blank ones: the line breaks two
        texts share (WikiText's " " lines are a third of it) said that an eval file of another
        text was mostly training examples."""
        if self.running() and raw.get("train") is not None and raw.get("eval", {}).get("") is not None:
            raw = {**raw, "train": self._with_text(raw["train"], False),
                   "eval": {**raw["eval"], "": self._with_text(raw["eval"][""], False)}}
        super().note_eval_in_train(raw)

    def _split_off_train(self) -> bool:
        """The held-out documents are a fraction drawn from the training ones."""
        return self.eval_file is None and (self.dataset is None or self.eval_split is None)

    def rescoring(self, made: Any, keys: set[str]) -> None:
        """`toolkit eval RUN` on a run that held out `eval_fraction` of its training documents:
        another fraction or split_seed drew another held-out part, documents the run trained on
        scored as held out, exit 0; another train_file (or Hub data set) scored a fraction of that
        one as if it were the file. One line each, naming what scores a file whole (eval_file)."""
        if not (made._split_off_train() and self._split_off_train()):
            return
        # another reading of the file (task.documents) cuts other documents, and draws others
        moved = [k for k in ("eval_fraction", "split_seed", "documents") if getattr(self, k) != getattr(made, k)]
        if moved:
            raise UserError(f"task.{moved[0]}: the run held out task.eval_fraction={made.eval_fraction} of its "
                            f"training documents (task.split_seed={made.split_seed}); another draw would score "
                            "documents the run trained on as held out; leave it as the run had it, or score a "
                            "file of its own whole with task.eval_file=FILE")
        def where(task: Any, key: str) -> Any:
            value = getattr(task, key)
            return task.file_named(value) if key == "train_file" and value else value

        source = [k for k in ("train_file", "dataset", "dataset_config", "train_split") if f"task.{k}" in keys
                  and where(self, k) != where(made, k)]
        if source:
            raise UserError(f"task.{source[0]}: the run holds out a fraction of its training documents, so only "
                            f"task.eval_fraction={self.eval_fraction} of {getattr(self, source[0])} would be "
                            "scored, as if all of it; score a file whole with task.eval_file=FILE")

    def check_tokenizer(self, folder: Path, checkpoint: str) -> None:
        """At validate: the tokens the corruption puts in (a mask token, T5's sentinels), which a
        tokenizer of the right model kind may lack (T5's has no mask token; BART's and a BERT2BERT
        warm start's have no sentinels): such a recipe passed validate and was refused at run,
        after the model loaded. Files that name them pass without importing anything
        (`tokenizer_named`); otherwise the tokenizer is read (never the weights) and asked as the
        run asks (`refuse_tokenizer`)."""
        if self.tokenizer_named(folder):
            return
        try:
            tokenizer = models.load_tokenizer(str(folder))
        except (OSError, ValueError, TypeError):  # no tokenizer readable there: the run says why
            return
        self.refuse_tokenizer(tokenizer, checkpoint)

    def tokenizer_named(self, folder: Path) -> bool:
        """Whether the tokenizer files in `folder`, read as text, show what `refuse_tokenizer`
        asks for (False: undecided, the tokenizer is read)."""
        return True

    def refuse_tokenizer(self, tokenizer: Any, checkpoint: str | None = None) -> None:
        """UserError where the corruption cannot run on `tokenizer` (`checkpoint`: whose it is)."""

    def model_head(self, family: str | None) -> str:
        require_kind(self.name, family, self.kind, self.examples, self.instead)
        return self.head

    def metric_info(self) -> dict[str, str]:
        """What was scored, where the source was read other than a document a line: a running
        text (its line breaks where a line read alone ends with the end-of-text token) or
        blank-line paragraphs are other tokens of the same file, so a grid over task.documents
        would choose the reading that scored lower (recorded only then: runs a line a document,
        before and since, record nothing of it and stay one metric)."""
        read = {"text": "the source as one running text, line breaks kept",
                "blank_line": "blank-line separated paragraphs, their lines joined by line breaks"}.get(self.documents)
        return {**super().metric_info(), **({"documents": read} if read else {})}

    def declared_metrics(self) -> list[Metric]:
        if not self.perplexity:
            return [CATALOGUE["loss"]]  # the loop adds the loss
        return [CATALOGUE["perplexity"], CATALOGUE["accuracy"]]

    def outputs(self, outputs: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.perplexity:
            return {}
        return {"hits": token_hits(outputs.logits, batch["labels"], self._shift(batch))}

    def score(self, outputs: dict[str, np.ndarray], raw: Any) -> dict[str, float]:
        """Perplexity and, as run_mlm and run_clm report it, the accuracy of the labelled tokens
        (the most likely token is the label; masked tokens for mlm, each next token once for clm),
        both over the whole split."""
        if not self.perplexity:
            return {}
        return {**super().score(outputs, raw),
                "accuracy": float(outputs["hits"].sum() / max(outputs["units"].sum(), 1.0))}

    # --- raw documents ---------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        if self.dataset is not None:
            train, heldout = self._load_hub()
        else:
            files = {"train": self.expand(self.train_file),
                     **({"eval": self.expand(self.eval_file)} if self.eval_file else {})}
            fmts = {_format(f) for f in files.values()}
            if len(fmts) > 1:
                raise UserError("task.eval_file: must have the same format as task.train_file (plain text, or "
                                "records: JSONL, JSON, CSV, TSV)")
            ds, self._found_text_field = _read_files(files, fmts.pop(), self.documents, self.text_field, self)
            train, heldout = ds["train"], ds.get("eval")
        running = self.running()
        train = self._with_text(train, running)
        if len(train) == 0 or running and self._with_text(train, False).num_rows == 0:
            raise UserError(f"task: the training text ({self.train_file or self.dataset}) has no document "
                            "with any text in it")
        if heldout is None:
            if len(train) < 2:
                raise UserError(f"task.train_file: {len(train)} {'line(s)' if running else 'document(s) with text'}; "
                                "holding out task.eval_fraction of them needs at least 2 (or set task.eval_file)")
            if running:  # the text's first lines, in order: a draw would stitch lines apart into one text
                k = min(len(train) - 1, math.ceil(len(train) * self.eval_fraction))
                train, heldout = train.select(range(k, len(train))), train.select(range(k))
            else:
                parts = train.train_test_split(test_size=self.eval_fraction, seed=self.split_seed)
                train, heldout = parts["train"], parts["test"]
        else:
            heldout = self._with_text(heldout, running)
            if len(heldout) == 0 or running and self._with_text(heldout, False).num_rows == 0:
                raise UserError(f"task.eval_file: {self.eval_file} has no document with any text in it")
        cap = (lambda ds, n, _: ds if n is None or n >= len(ds) else ds.select(range(n))) if running else subset
        heldout = cap(heldout, self.max_eval_samples, self.split_seed)
        heldout = heldout.add_column(HELDOUT, [True] * len(heldout))
        return {"train": cap(train, self.max_train_samples, self.split_seed), "eval": {"": heldout}}

    @staticmethod
    def _with_text(ds: Any, running: bool) -> Any:
        """The documents with text in them (a blank one dropped); a running text keeps its blank
        lines (paragraph breaks, as run_clm.py reads them)."""
        return ds if running else ds.filter(lambda t: bool(t) and not readers.blank(t), input_columns="text")

    def as_scored(self, dataset: Any) -> Any:
        """Any split scored is scored by the held-out rules: corrupted once from corruption_seed
        (masks by block index), clm's sliding windows. The train split was encoded as training
        blocks, so `toolkit eval --split train` scored clm on run_clm's blocks (no context at a
        block's start, its first token unscored) and the others on the training masks, numbers
        of another definition than the eval split's on the same text, exit 0."""
        if dataset is None or HELDOUT in dataset.column_names:
            return dataset
        return dataset.add_column(HELDOUT, [True] * len(dataset))

    def _load_hub(self) -> tuple[Any, Any]:
        if hub_offline():
            raise UserError(f"task.dataset: '{self.dataset}' is on the Hub and the Hub is off-line "
                            "(HF_HUB_OFFLINE=1); use task.train_file with a local copy")
        try:
            ds = hub_dataset(self, self.dataset, self.dataset_config, rows=self._hub_rows)
        except UserError:
            raise
        except Exception as exc:  # network, missing config: one line for the user
            raise UserError(f"task.dataset: could not load '{self.dataset}' from the Hub "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})") from None
        for split in (self.train_split, self.eval_split):
            if split is not None and split not in ds:
                raise UserError(f"task: '{self.dataset}' has no split '{split}' (has: {', '.join(ds)})")
        return ds[self.train_split], (ds[self.eval_split] if self.eval_split else None)

    def _hub_rows(self, split: Any, name: str) -> Any:
        """A Hub split's text field as a file's (`_read_files`): text in every record, a blank one
        dropped later; the field picked from the first split taken (the train split) holds for the
        next. A list of words or a null was read as its Python text or dropped, exit 0."""
        field = self.text_field or self.__dict__.get("_hub_field") or \
            _fields.pick_text(split, self.dataset, "task.text_field")
        if field not in split.column_names:
            raise UserError(f"task.text_field: '{self.dataset}' has no column '{field}'"
                            + readers.near_name(field, split.column_names))
        self._hub_field = field  # not the settings: the recipe's hash stays as written
        readers.check_text(split, field, Path(name), "hub", what=f"'{field}'", blank_ok=True)
        split = split.select_columns([field])
        return split.rename_column(field, "text") if field != "text" else split

    # --- tokenising and packing -------------------------------------------------------------
    def block_length(self, tokenizer: Any) -> int:
        """Tokens of raw text per training block (the objective adds its special tokens)."""
        return self.max_length

    def special_mask(self) -> bool:
        """Keep a per-token special-tokens mask (1 on the ids `document_start` / `document_end`
        put around each document): mlm never selects them."""
        return False

    def document_start(self, tokenizer: Any) -> list[int]:
        """Token ids put before every document before packing: what the tokenizer puts before a
        text (BERT's [CLS], RoBERTa's <s>, a Llama-style BOS; GPT-2 and T5 none), as run_mlm's and
        run_clm's tokenizer(text) puts it there."""
        return special_frame(tokenizer)[0]

    def document_end(self, tokenizer: Any) -> list[int]:
        """Token ids appended to every document before packing, so that no two documents run into
        each other in a block: what the tokenizer puts after a text (BERT's [SEP], T5's and
        BART's </s>, as run_mlm's and run_t5_mlm_flax's tokenizer(text) and run_bart_dlm_flax's
        eos_token put it there), else its end-of-text token (GPT-2's <|endoftext|>). Only clm
        had one: span_corruption and denoise packed documents end to end ("...sat.A dog ran"),
        a text the model was taught to reconstruct as one, exit 0. A tokenizer that puts nothing
        after a text and has no end-of-text token is refused: its documents ran into each other
        in every objective ("the cat sat.a dog ran.", one text), exit 0."""
        after = special_frame(tokenizer)[1]
        if after or tokenizer.eos_token_id is not None:
            return after or [tokenizer.eos_token_id]
        raise UserError(f"task.name: {self.name} packs documents into blocks and ends each with the "
                        "tokenizer's end-of-text token; this tokenizer puts nothing after a text and has no "
                        "eos_token, so documents would run into each other; set eos_token in its "
                        "tokenizer_config.json")

    def word_starts(self) -> bool:
        """Keep a per-token word-start flag (whole-word masking and BART's span starts need it)."""
        return False

    def rows_are_examples(self) -> bool:
        return False  # documents packed into blocks

    def read_columns(self) -> list[str]:
        return ["text"]

    def encode(self, dataset: Any, tokenizer: Any) -> Any:
        heldout = HELDOUT in dataset.column_names
        blocks = self.by_document(dataset, tokenizer) if self.line_by_line else self.pack(dataset, tokenizer, whole=heldout)
        if heldout:
            return self.encode_heldout(blocks, tokenizer)
        return blocks.add_column("block", list(range(len(blocks))))  # seeds its masks

    def pack(self, dataset: Any, tokenizer: Any, whole: bool = False) -> Any:
        """Documents -> blocks of `block_length` tokens. Training (`whole` False): the remainder
        of each 1000 documents is dropped, as run_mlm.py's group_texts does (a short corpus keeps
        one shorter block). Held out (`whole`): the split is one stream and its last, shorter
        block is kept, so every held-out token is scored, as clm's windows score them. It was
        packed as training is: up to block_length - 1 tokens per 1000 documents went unscored
        (half of an eval file 1.5 blocks long), and the perplexity was not the whole split's."""
        size, end, starts = self.block_length(tokenizer), self.document_end(tokenizer), self.word_starts()
        special, begin = self.special_mask(), self.document_start(tokenizer)
        tokenised = self.framed(dataset, tokenizer)
        key = (self, special, starts, begin, end, size)

        def group(batch: dict) -> dict:
            total = sum(len(x) for x in batch["input_ids"])
            usable = total if whole or total < size else (total // size) * size
            out = {}
            for key, rows in batch.items():
                flat = [v for row in rows for v in row][:usable]
                out[key] = [flat[i:i + size] for i in range(0, usable, size)]
            return out

        return tokenised.map(group, batched=True, batch_size=None if whole else 1000,
                             desc=f"packing into blocks of {size}",
                             new_fingerprint=fingerprint(tokenised, tokenizer, key, "pack", whole))

    def framed(self, dataset: Any, tokenizer: Any) -> Any:
        """Documents -> their token ids, each framed by `document_start` / `document_end` (with the
        special-tokens mask and word starts the objective keeps), one row a document."""
        end, starts = self.document_end(tokenizer), self.word_starts()
        special, begin = self.special_mask(), self.document_start(tokenizer)

        running, breaks, last = self.running(), self.line_breaks(), len(dataset) - 1

        def tok(batch: dict, indices: list[int]) -> dict:
            texts = [t + "\n" for t in batch["text"]] if breaks else batch["text"]
            enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=starts)
            # a running text is framed once: its start before its first line, its end after its last
            heads = [begin if not running or i == 0 else [] for i in indices]
            tails = [end if not running or i == last else [] for i in indices]
            out = {"input_ids": [h + x + t for h, x, t in zip(heads, enc["input_ids"], tails)]}
            if special:
                out["special_tokens_mask"] = [[1] * len(h) + [0] * len(x) + [1] * len(t)
                                              for h, x, t in zip(heads, enc["input_ids"], tails)]
            if starts:
                specials = set(tokenizer.all_special_ids)
                out["word_start"] = [[1] * len(h) + word_starts(text, x, offsets, enc.word_ids(i), specials)
                                     + [1] * len(t) for i, (text, x, offsets, h, t)
                                     in enumerate(zip(texts, enc["input_ids"], enc["offset_mapping"], heads, tails))]
            return out

        key = (self, special, starts, begin, end, self.block_length(tokenizer))
        return dataset.map(tok, batched=True, with_indices=True, remove_columns=dataset.column_names, desc="tokenising",
                           new_fingerprint=fingerprint(dataset, tokenizer, key, "tokenise", running, breaks))

    def by_document(self, dataset: Any, tokenizer: Any) -> Any:
        """`line_by_line`: each document one example, its tokens cut at max_length with the frame
        kept (`tokenizer(text, truncation=True, max_length=...)`, as run_mlm.py's --line_by_line
        reads each line), the cut documents counted and said. Padding comes in the collator, after
        the masks are drawn, so it is never selected nor scored."""
        size, end = self.max_length, self.document_end(tokenizer)
        body = size - len(end) - len(self.document_start(tokenizer))
        if body < 1:
            raise UserError(f"task.max_length: {size} leaves no room for a document's tokens between the "
                            f"{size - body} special tokens that frame it; raise it")
        tokenised = self.framed(dataset, tokenizer)
        self.note_cut("documents", "task.max_length", size,
                      [len(x) > size for rows in tokenised.iter(batch_size=1000) for x in rows["input_ids"]])

        def cut(batch: dict) -> dict:
            return {k: [row if len(row) <= size else row[:size - len(end)] + row[len(row) - len(end):] for row in rows]
                    for k, rows in batch.items()}

        return tokenised.map(cut, batched=True, desc=f"cutting documents at {size}",
                             new_fingerprint=fingerprint(tokenised, tokenizer, self, "by document", size, end))

    def encode_heldout(self, blocks: Any, tokenizer: Any) -> Any:
        """The held-out blocks corrupted once, each with its own seeded generator."""
        seed = self.corruption_seed

        def corrupt(example: dict, index: int) -> dict:
            rng = np.random.default_rng([seed, index])
            return self.corrupt(example, rng, tokenizer)

        return blocks.map(corrupt, with_indices=True, remove_columns=blocks.column_names,
                          desc="corrupting held-out blocks",
                          new_fingerprint=fingerprint(blocks, tokenizer, self, "corrupt"))

    def corrupt(self, example: dict, rng: np.random.Generator, tokenizer: Any) -> dict:
        """One block -> {'input_ids', 'labels'} (lists of ints) for the model."""
        raise NotImplementedError

    def collator(self, tokenizer: Any, model: Any = None) -> Any:
        return BlockCollator(self, tokenizer, model)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def tokenizer_files(folder: Path) -> dict[str, str]:
    """The tokenizer files in `folder` that are there, by name, as text."""
    out = {}
    for name in TOKENIZER_FILES:
        try:
            out[name] = (folder / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    return out


def config_value(files: dict[str, str], key: str) -> Any:
    """`key` of tokenizer_config.json, else of special_tokens_map.json (None where neither sets it)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            value = json.loads(files.get(name, "{}")).get(key)
        except (ValueError, AttributeError):
            continue
        if value is not None:
            return value
    return None


def whose(checkpoint: str | None) -> str:
    """The tokenizer a refusal names."""
    return f"the tokenizer of model.checkpoint '{checkpoint}'" if checkpoint else "this tokenizer"


def unspaced(ch: str) -> bool:
    """A character of a script written without spaces between words (CJK ideographs, kana)."""
    code = ord(ch)
    return (0x3040 <= code <= 0x30FF or 0x3400 <= code <= 0x4DBF or 0x4E00 <= code <= 0x9FFF
            or 0xF900 <= code <= 0xFAFF or 0x20000 <= code <= 0x2FA1F)


def word_starts(text: str, ids: list[int], offsets: list[tuple[int, int]], word_ids: list[int | None],
                specials: set[int]) -> list[int]:
    """1 where a token of `text` begins a word: a word is a run of characters between
    whitespace, as transformers' whole-word collator (the tokens' character offsets touch) and
    fairseq's BART (a token that begins with a space) draw words; a special token is a word of its
    own. In a script written without spaces (CJK) the tokenizer's own words stand. It was the
    tokenizer's pre-tokenizer words, which split punctuation off: WikiText's and PTB's `<unk>` was
    three words to BERT ('<', 'un ##k', '>') and "n't" three, so whole-word masking masked
    'un ##k' between a visible '<' and '>', and BART's spans cut "don" from "'t", exit 0."""
    out, previous_end, previous_word, previous_special = [], None, None, True
    for token, (start, stop), word in zip(ids, offsets, word_ids):
        special = token in specials
        touches = previous_end is not None and start <= previous_end
        if touches and word != previous_word and any(map(unspaced, text[start:start + 1] + text[previous_end - 1:previous_end])):
            touches = False  # the tokenizer's word boundary inside unspaced text
        out.append(int(special or previous_special or not touches))
        previous_end, previous_word, previous_special = max(stop, previous_end or 0), word, special
    return out


def pad(rows: list[list[int]], value: int) -> torch.Tensor:
    """(b, longest) int64 tensor, right-padded with `value`."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    return out


class BlockCollator:
    """Training blocks are corrupted here (fresh draws each epoch); held-out blocks arrive with
    their labels already. Pads, builds the attention mask and, for encoder-decoders, the decoder
    inputs from the labels as the model's family defines them."""

    def __init__(self, task: TextTask, tokenizer: Any, model: Any) -> None:
        self.task, self.tokenizer, self.model = task, tokenizer, model
        self.epoch = 0

    def use_epoch(self, epoch: int) -> None:
        """The loop calls this before each epoch: masks are drawn anew every epoch."""
        self.epoch = epoch

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if "labels" not in examples[0]:
            seed, run = self.task.corruption_seed, self.task.run_seed
            examples = [self.task.corrupt(e, np.random.default_rng([seed, 1, run, self.epoch, e["block"]]),
                                          self.tokenizer) for e in examples]
        pad_id = self.tokenizer.pad_token_id
        ids = [list(e["input_ids"]) for e in examples]
        batch = {"input_ids": pad(ids, pad_id),
                 "attention_mask": pad([[1] * len(x) for x in ids], 0),
                 "labels": pad([list(e["labels"]) for e in examples], IGNORE)}
        if self.task.head == "seq2seq-lm":
            # what the model's own labels path builds (mBART's shift wraps the language code that
            # ends its labels to the front; BART: </s>, T5: <pad> before the labels). It was BART's
            # shift behind config.decoder_start_token_id for every family, exit 0 on mBART
            batch["decoder_input_ids"] = decoder_inputs(self.model, batch["labels"], self.tokenizer.pad_token_id)
        return batch

def require_kind(task: str, family: str | None, kind: str, examples: str, instead: str) -> None:
    """Refuse (at validate) an objective on a model of the wrong kind, naming what would fit."""
    if family is None:  # asked without a model (a method's own checks): nothing to refuse yet
        return
    found = models.kind_of(family)
    if found != kind:
        raise UserError(f"task.name: '{task}' trains {kind}s ({examples}); {family} models are "
                        f"{(found + 's') if found else 'none of encoder, decoder, encoder-decoder'}; "
                        f"use {instead}")
