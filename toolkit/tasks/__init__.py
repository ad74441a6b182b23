"""Tasks: settings, data, encoding, loss, the evaluation step, scoring and metric declarations.

A task is a settings dataclass registered under its name, like a method: the recipe's `task:`
section is built into it (unknown keys, types, bounds and `Literal` choices are checked by the
recipe layer), and its `check()` refuses impossible settings without touching data, so
`toolkit validate` stays cheap.

The loop knows a task only through this contract:
- `units(batch)` / `loss(outputs, batch)`: per-example loss terms and their sums, so the loop can
  normalise by the units of a whole accumulated step across processes;
- `eval_step(model, batch)`: per-example tensors (first dimension = examples) that the loop
  gathers across processes in dataset order; `score(outputs, raw)` turns them into metrics and
  sees the raw eval split (QA post-processing and generation need the original text);
- `declared_metrics()`: the declared metrics (name, direction, display scale) that best-model selection,
  early stopping and reports read. Eval loss is always reported and declared (lower is better).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pkgutil
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np

from toolkit import heads, hub, models
from toolkit.errors import UserError, beside_checkout, user_path
from toolkit.lazy import lazy
from toolkit.registry import Registry
from toolkit.schema import NO_EFFECT

torch = lazy("torch", globals())

TASKS: Registry[type] = Registry("task")


@dataclass(frozen=True)
class Metric:
    """A metric's declaration: its Hugging Face name, direction and display scale."""

    name: str
    higher_is_better: bool = True
    scale: float = 1.0  # multiply for display: 100 turns a fraction into percent
    # False: a number the evaluation reports that is not a score (SQuAD v2's best_f1_thresh, a
    # threshold tuned on the split): no checkpoint is better for a higher one, so train.metric
    # cannot select on it
    score: bool = True

    def better(self, value: float, than: float | None) -> bool:
        """Whether `value` beats `than` (None: nothing yet). An undefined score (NaN: a
        correlation of constant predictions) beats nothing, and anything defined beats it."""
        if value != value:
            return False
        if than is None or than != than:
            return True
        return value > than if self.higher_is_better else value < than

    def as_dict(self) -> dict[str, Any]:
        # `score` only where it is not one (a report marks no direction on it and chooses nothing by it)
        return {"higher_is_better": self.higher_is_better, "scale": self.scale, **({} if self.score else {"score": False})}


# Every metric the toolkit's tasks produce, by the name the Hugging Face ecosystem uses.
CATALOGUE: dict[str, Metric] = {m.name: m for m in [
    Metric("accuracy", True, 100.0), Metric("f1", True, 100.0),
    Metric("matthews_correlation", True, 100.0), Metric("pearson", True, 100.0),
    Metric("spearmanr", True, 100.0), Metric("exact_match", True, 100.0),
    Metric("rouge1", True, 100.0), Metric("rouge2", True, 100.0), Metric("rougeL", True, 100.0),
    Metric("rougeLsum", True, 100.0), Metric("bleu", True, 1.0), Metric("chrf", True, 1.0),
    Metric("perplexity", False, 1.0), Metric("loss", False, 1.0),
    # in-context prompting's label-word accuracies, as lm-evaluation-harness names them
    Metric("acc", True, 100.0), Metric("acc_norm", True, 100.0), Metric("acc_bytes", True, 100.0),
    # SQuAD v2's best null thresholds (logits, tuned on the split scored): numbers, not scores.
    # Here, not only in squad.py, so a report reads a run from before `score` was recorded rightly
    Metric("best_exact_thresh", True, 1.0, score=False), Metric("best_f1_thresh", True, 1.0, score=False),
]}


def declaration(name: str, declared: list[Metric] | None = None) -> Metric:
    """The declaration of `name`, split suffixes (`accuracy_mm`) included; unknown: scale 1, higher.
    A metric declared under its own name is that declaration, and otherwise the longest declared
    name it extends with a suffix: SQuAD v2's `best_f1_thresh` (a logit threshold, scale 1) was
    read as `best_f1` plus a suffix, a percentage, and reported 100 times its value."""
    known = list(declared or []) + list(CATALOGUE.values())
    exact = [m for m in known if m.name == name]
    extended = sorted((m for m in known if name.startswith(m.name + "_")), key=lambda m: -len(m.name))
    for metric in exact + extended:
        return Metric(name, metric.higher_is_better, metric.scale, score=metric.score)
    return Metric(name)


@dataclass(kw_only=True)
class Task:
    """Base of every task's settings dataclass; subclasses fill in the data side."""

    name: ClassVar[str] = ""
    head: ClassVar[str] = heads.SEQUENCE_CLASSIFICATION  # a toolkit.heads name
    eval_suffixes: ClassVar[tuple[str, ...]] = ("",)  # one per eval split (MNLI: "", "_mm")
    # whether the task tokenizes text given as lists of words (is_split_into_words): its
    # tokenizer is then loaded to tokenize each word as it reads inside running text
    # (models.load_tokenizer), which byte-level BPE tokenizers do only with add_prefix_space
    words_given: ClassVar[bool] = False
    # the recipe keys that name a record's fields (`check_fields`): those the model reads (and ids),
    # then those it is scored on
    field_keys: ClassVar[tuple[str, ...]] = ()
    # settings a trained run's saved files hold (a classifier's pair separator, in its saved
    # tokenizer): scoring the run reads them from there, so they cannot change at `toolkit eval`
    saved_keys: ClassVar[tuple[str, ...]] = ()
    # the key of a JSON document's list of records (`{"data": [...]}`) its training reader takes
    # besides a JSON list; predict reads the same layouts (inference._read_structured)
    json_field: ClassVar[str | None] = None
    scored_keys: ClassVar[tuple[str, ...]] = ()
    # the run's train.seed, set per instance by the recipe (not a setting, not in the hash): what a
    # task draws at random for training (the pretraining objectives' masks and noise) follows it,
    # so that the seeds of a sweep train on other draws and their spread counts them
    run_seed: ClassVar[int] = 0

    max_length: int = field(default=128, metadata={"min": 8})
    # default: $TOOLKIT_DATA. Not in the run id: the files read under it are, by their contents,
    # and named relative to it (`$TOOLKIT_DATA/...`, canonical_data_path)
    data_dir: str | None = field(default=None, metadata={NO_EFFECT: lambda t: True})
    max_train_samples: int | None = field(default=None, metadata={"min": 1})
    max_eval_samples: int | None = field(default=None, metadata={"min": 1})

    # --- declarations --------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse impossible settings (UserError naming the field); no data is read."""

    def ignores(self) -> dict[str, str]:
        """The task settings ('task.doc_stride', 'task.generation.num_beams') this run of the task
        never reads, each with why (known once `model_head` has seen the family): one set to other
        than its default is refused at validate (recipe.refuse_ignored). {}: it reads them all."""
        return {}

    def rescoring(self, made: "Task", keys: set[str]) -> None:
        """Refuse task overrides (`keys`, 'task.eval_file', ...) that would score a finished run
        (made with `made`) on other data than they name; eval and the API's evaluate call it.
        Nothing to refuse by default."""

    def as_made(self, ran: dict, keys: set[str]) -> None:
        """Settings added since a finished run was made, set to what the run did then: `ran` is
        the run's own task section as its recipe.yaml holds it (a key missing there: a run from
        before the field), `keys` the task overrides given now (those win). Nothing by default."""

    def named_fields(self) -> dict[str, list[str]]:
        """Recipe key -> the fields it names (`field_keys`, then `scored_keys`); unset keys left out."""
        out: dict[str, list[str]] = {}
        for key in self.field_keys + self.scored_keys:
            value = getattr(self, key)
            if value is not None:
                out[key] = [value] if isinstance(value, str) else list(value)
        return out

    def check_fields(self) -> None:
        """Each field of a record has one role: a field the task scores (its label, target, tags,
        answers) read as an input too would let the model read each answer in its own input
        (accuracy 1.0, ROUGE 100, exit 0); two inputs of one field are one input twice."""
        seen: dict[str, str] = {}
        for key, names in self.named_fields().items():
            for name in names:
                if name in seen:
                    why = ("the model would read what it is scored on in its own input"
                           if key in self.scored_keys else "a field holds one thing")
                    raise UserError(f"task.{key}: '{name}' is also in task.{seen[name]}: {why}; "
                                    "name a field of its own for each")
                seen[name] = key

    def declared_metrics(self) -> list[Metric]:
        raise NotImplementedError

    def main_metric(self) -> str:
        return self.declared_metrics()[0].name

    def metric_names(self) -> list[str]:
        """The keys of `eval` a run may select its best checkpoint on (train.metric): each declared
        score per eval split, and the loss."""
        names = [m.name + sfx for sfx in self.suffixes() for m in self.declared_metrics() if m.score]
        return names + ["loss" + sfx for sfx in self.suffixes()]

    def suffixes(self) -> tuple[str, ...]:
        return self.eval_suffixes

    def declaration(self, name: str) -> Metric:
        return declaration(name, self.declared_metrics())

    def check_tokenizer(self, folder: Path, checkpoint: str) -> None:
        """At validate, before any weights load: refuse (UserError) a tokenizer this task cannot
        use, from `folder`, the one its files are read from (`models.tokenizer_folder` of
        `checkpoint`). Most tasks take any tokenizer."""

    def model_head(self, family: str | None) -> str:
        """The head (a toolkit.heads name) this task needs on a model of `family` (its model_type):
        generation tasks pick causal-lm for decoders and seq2seq-lm for encoder-decoders."""
        return self.head

    def settle(self, family: str, trains: bool) -> None:
        """Settings a recipe leaves to the toolkit, decided when a recipe is launched (run, sweep,
        validate; not when a run's recipe.yaml is read back) for the model `family` (its
        model_type) and whether the method trains: what it decides is in recipe.yaml and the run
        id. Most tasks leave nothing unset."""

    def adapt_tokenizer(self, tokenizer: Any) -> None:
        """What the task sets in the tokenizer a run trains with, before anything is encoded; the
        run saves that tokenizer, so eval, predict and an export read as training did."""

    def head_kwargs(self) -> dict[str, Any]:
        """Extra from_pretrained kwargs for the head (num_labels, problem_type, label names)."""
        return {}

    # --- data ----------------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        """{'train': Dataset | None, 'eval': {suffix: Dataset}} of raw examples."""
        raise NotImplementedError

    def encode(self, dataset: Any, tokenizer: Any) -> Any:
        raise NotImplementedError

    def rows_are_examples(self) -> bool:
        """Whether `encode` makes one training row of each example, so that the optimizer steps
        can be counted off the raw split (a sweep's --dry-run and --estimate): False where it
        packs documents into blocks (the pretraining objectives) or cuts an example into
        windows (extractive QA), whose steps are counted off the encoded split."""
        return True

    def scoring(self, split: str) -> None:
        """`toolkit eval --split`: the split that will be scored (eval, train, test), said before
        `load`, so that what is checked of the data as the metric reads it is that split's alone
        (`TextToText.checked`): the eval split's references refused `--split train`, which does
        not score them. A run scores its eval split (the default)."""
        self._scored_split = split

    def as_scored(self, dataset: Any) -> Any:
        """A raw split that `toolkit eval --split` scores (the train split among them), made what
        `encode` takes for an evaluation split: most tasks encode every split alike."""
        return dataset

    def collator(self, tokenizer: Any, model: Any = None) -> Any:
        raise NotImplementedError

    def data_files(self) -> list[Path]:
        """Every local file `load` reads: their contents are part of a run's identity, so an
        edited file is a new run, never "finished already" with the old metrics.

        Held for every task by this one default rather than by each task: the files its
        settings name (`data_patterns`), `{lang}` filled with each side's language where the
        task has them, `task.data_dir` read for `$TOOLKIT_DATA`. tests/test_identity.py records
        the files each registered task's `load` opens and fails for one not listed here."""
        langs = [v for v in (getattr(self, "source_lang", None), getattr(self, "target_lang", None))
                 if isinstance(v, str)]
        found: set[Path] = set()
        for pattern in self.data_patterns():
            names = [pattern.replace("{lang}", lang) for lang in langs] if "{lang}" in pattern else [pattern]
            found |= {path for path in (data_path(n, self.data_dir) for n in names) if path.is_file()}
        return sorted(found)

    def data_patterns(self) -> list[str]:
        """The recipe's paths of the files `load` reads: by default every `*_file` setting; a
        task whose presets read files of their own (SAMSum, Multi30k) adds those."""
        values = [getattr(self, f.name) for f in fields(self) if f.name.endswith("_file")]
        return [v for v in values if isinstance(v, str) and v]

    def scored_source(self) -> str | None:
        """Where the examples a run scores come from, as its settings say before anything loads:
        a file (a preset's own too: SAMSum's test.json, IWSLT14's test.{lang}) or `<Hub id>[<split>]`;
        None where the settings name none (a carve of train, a Hub split found at load, GLUE's dev
        files). A report says from it whether a selection on the eval set was one on a test split."""
        if callable(getattr(self, "sources", None)):
            return self.sources()[1]
        if isinstance(getattr(self, "eval_file", None), str) and self.eval_file:
            return self.eval_file
        dataset, split = getattr(self, "dataset", None), getattr(self, "eval_split", None)
        return f"{dataset}[{split}]" if isinstance(dataset, str) and isinstance(split, str) else None

    def hub_data(self) -> dict | None:
        """{"<id> <config>": {split: fingerprint}} of each Hub data set the latest `load` read
        (hub_dataset); None where it read local files only. No run id covers which revision of a
        Hub data set the datasets cache holds (data_files() is empty for it), so a checkpoint and
        a finished run record this, and a resume or an eval on another revision is refused."""
        return getattr(self, "_hub_loaded", None) or None

    def head_fields(self) -> list[tuple[str, Path, list[tuple[str, str]]]]:
        """(setting, file, [(column or field, the setting that names it)]) per local data file:
        what its header or first record must hold, checked before any library loads
        (toolkit/recipe.py check_data). [] where nothing can be checked that cheaply."""
        return []

    def expand(self, value: str) -> str:
        """A path of this recipe's with `$TOOLKIT_DATA` read as `task.data_dir` when that is set."""
        return str(data_path(value, self.data_dir))

    def file_named(self, value: str) -> str:
        """A data file setting in the one form the run id and recipe.yaml hold (canonical_data_path):
        two settings name one file where these agree (a run's recipe.yaml holds that form; an
        override may spell the file another way)."""
        return canonical_data_path(value, self.data_dir)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the model's forward takes: the loss is the task's, so labels stay out."""
        return {k: v for k, v in batch.items() if k != "labels"}

    def batch_size(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["input_ids"].shape[0])

    # --- loss ----------------------------------------------------------------------------------
    def loss_sees_padding(self) -> bool:
        """Whether an example's training loss depends on how far its batch pads it (the loop then
        pads every micro-batch of a step alike: train.Loop._step_width)."""
        return False

    def units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(b,) loss terms per example: 1 for classification, target tokens for generation."""
        return torch.ones(self.batch_size(batch), device=batch["input_ids"].device)

    def loss(self, outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(b,) the SUM of each example's loss terms.

        The loop divides by the units of the whole accumulated step across all processes, so k
        micro-batches equal one k-times-larger batch exactly.
        """
        raise NotImplementedError

    # --- evaluation ----------------------------------------------------------------------------
    def eval_step(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-example tensors to gather; `loss` and `units` are always among them."""
        outputs = model(**self.model_inputs(batch))
        return {"loss": self.loss(outputs, batch).float(), "units": self.units(batch).float(),
                **self.outputs(outputs, batch)}

    def outputs(self, outputs: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What `score` needs of one batch beside the loss (predictions, labels, ...)."""
        return {}

    def eval_pad(self, key: str) -> float:
        """Fill value when outputs of different widths are stacked (across batches and processes)."""
        return -100

    def score(self, outputs: dict[str, np.ndarray], raw: Any) -> dict[str, float]:
        """Metrics of one eval split from the gathered outputs (`loss` and `units` per example
        among them) and the raw examples of that split, in the same order."""
        raise NotImplementedError

    def predictions(self, outputs: dict[str, np.ndarray], raw: Any) -> list[dict] | None:
        """Rows of predictions.jsonl (id, source, reference, prediction) for tasks that produce
        text; None: nothing to write (classification)."""
        return None

    def prediction_files(self, rows: list[dict], raw: Any) -> dict[str, Any]:
        """JSON documents written beside predictions.jsonl as `predictions.NAME.json`: what a
        benchmark's official scorer reads (SQuAD's gold file, answers and no-answer scores)."""
        return {}

    # names (NAME of `predictions.NAME.json`) an older version of the task wrote and this one
    # does not: removed where the predictions are written anew, so no stale file of another
    # meaning stays beside the new ones
    retired_prediction_files: ClassVar[tuple[str, ...]] = ()

    def run_name(self, name: str) -> str:
        """The name a run of the recipe `name` is filed under: a task whose recipe folders name a
        setting (SQuAD's `v1.1/`) files a run under the setting it runs with."""
        return name

    # --- prediction on new inputs (`toolkit predict`, the API's predict) -------------------------
    predicts: ClassVar[bool] = False  # whether the task has a prediction path (the two below)
    predict_word_lists: ClassVar[tuple[str, ...]] = ()  # input fields that may be a list of words

    def rows_of_own_format(self, lines: list[str], blank: list[int], name: str) -> list[dict] | None:
        """Input rows of a plain-text predict input (its non-blank `lines`, the numbers of the
        blank lines between them) that is written in the task's own training-file format (NER: a
        CoNLL file), as that format reads; None where it is not (one example per line)."""
        return None

    def predict_file(self, path: Path) -> list[dict] | None:
        """Input rows of a structured predict input (JSON) written in the task's own nested layout,
        read as its training reader reads that layout (SQuAD's articles, FILE:LINE for a bad
        record); None where the file is not in it (the shared reader reads flat records)."""
        return None

    def predict_records(self, items: list[Any]) -> list[Any]:
        """Inputs given to the API or on standard input with the task's own nesting taken apart
        (SQuAD's documents and articles into their questions); as given where it has none."""
        return items

    def predict_files(self, rows: list[dict]) -> dict[str, Any]:
        """JSON documents `toolkit predict --output OUT` writes beside OUT as `<OUT's stem>.NAME.json`
        from its rows: what a benchmark's official scorer reads (SQuAD: answers by question id)."""
        return {}

    def predict_fields(self, model: torch.nn.Module) -> list[str]:
        """The fields an input row needs, once the task has taken what it needs of the trained
        `model` (label names a classifier's config carries)."""
        raise NotImplementedError

    def input_fields(self, names: list[str], kinds: dict[str, str], where: str) -> list[str]:
        """The fields of a predict input (`kinds`: its field names -> "text", "list" or "other")
        that hold what `predict_fields` calls `names`, in that order, found as the task's readers
        find them in a file it evaluates on (`toolkit eval RUN task.eval_file=NEW`): a task whose
        readers infer each file's fields anew (QA, NER) infers an input's alike; one that reads
        every file by the fields found in its training file (classification, generation) reads
        inputs by those, `names` (the default)."""
        return names

    def predict(self, model: torch.nn.Module, tokenizer: Any, rows: list[dict]) -> list[dict]:
        """Per input row, its fields and the prediction (a label and its probabilities, tags
        per token, ...), in the rows' order."""
        raise NotImplementedError

    def submission(self, load: Callable[[], tuple[Any, Any]], out_dir: Path) -> list[Path]:
        """Files for the benchmark's test server (GLUE's `SST-2.tsv`, ...) from its test split,
        predicted by the trained (model, tokenizer) that `load()` gives."""
        raise UserError(f"--glue-test: this is a {self.name} run; only GLUE runs have test-server files")

    def metric_info(self) -> dict[str, str]:
        """Strings recorded beside the float metrics in metrics.json (sacreBLEU's signature)."""
        return {}

    def export_settings(self, tokenizer: Any = None) -> str:
        """What an export's line adds for a plain transformers user: the settings of the run's
        prediction that no saved file holds and that reading its outputs needs (extractive QA's
        answer search), as `; ...`; "" where the folder holds them all. `tokenizer`: the
        exported one, where what the line can promise depends on it (NER's pipeline words)."""
        return ""

    def reading_limit(self) -> int | None:
        """The length at which `tokenizer(..., truncation=True)` cuts a prediction input as the run
        cut it (a text or pair, NER's words, a QA window), saved as an export's `model_max_length`
        (transformers' token-classification pipeline cuts there by itself, the others with
        truncation=True); None where the run's cut is not the tokenizer's own (a prompt whose
        source is cut before its suffix: said in the export's line)."""
        return self.max_length

    def model_problem(self, model: Any) -> str | None:
        """Why this task's settings do not fit the loaded `model` (a setting its own config makes
        unread), or None: one line before anything trains or is scored. None by default."""
        return None

    def positions_problem(self, tokenizer: Any, max_length: int, limit: int) -> str | None:
        """Why a sequence this task builds can be longer than the model's `limit` positions when
        `task.max_length` alone fits them (setup checks that first), or None. Most tasks give the
        model nothing longer than max_length."""
        return None

    def longest_sequence(self, tokenizer: Any, max_length: int) -> tuple[int, str]:
        """(tokens, what makes them) of the longest sequence any self-attention layer reads: what
        an attention module's window is held against (attention.dense_warning). Most tasks
        give the model nothing longer than max_length."""
        return max_length, f"task.max_length {max_length}"

    # --- what the task changed or may misread in the user's data (rule 8: say what is cut) ------
    def tokenize(self, tokenizer: Any, *texts: Any, limit: int, text_target: Any = None, **kwargs: Any) -> Any:
        """`tokenizer(..., truncation=True, max_length=limit)` with a `cut` list beside: per row,
        whether truncation dropped tokens. The one place every task that truncates goes through,
        so each counts its cuts the same way (`note_cut`). Only rows that came out `limit` long
        can have been cut; those alone are tokenized again whole to tell."""
        given = {"text_target": text_target} if text_target is not None else {}
        enc = tokenizer(*texts, **given, truncation=True, max_length=limit, **kwargs)
        full = [i for i, row in enumerate(enc["input_ids"]) if len(row) >= limit]
        cut = [False] * len(enc["input_ids"])
        if full:
            pick = lambda seq: [seq[i] for i in full]
            again = {"text_target": pick(text_target)} if text_target is not None else {}
            whole = tokenizer(*[pick(t) for t in texts], **again, truncation=False, verbose=False, **kwargs)
            for i, row in zip(full, whole["input_ids"]):
                cut[i] = len(row) > limit
        enc["cut"] = cut
        return enc

    def note_cut(self, what: str, setting: str, limit: int, cut: list[bool]) -> None:
        """Count rows of `what` cut at `setting` (summed over the splits encoded in this run)."""
        counts = self.__dict__.setdefault("_cut_counts", {})
        done, total = counts.get((what, setting, limit), (0, 0))
        counts[(what, setting, limit)] = (done + sum(bool(c) for c in cut), total + len(cut))

    def note(self, key: str, line: str) -> None:
        """A warning about the data (labels differing only in case, a name with a space at its
        end), kept under `key` so that it is said once however often the data is read."""
        self.__dict__.setdefault("_notes", {}).setdefault(key, line)

    def _note_eval_is_train(self) -> None:
        """task.train_file and task.eval_file naming one file, or two files of the same bytes:
        the run trains and scores on the same examples (and in-context prompting could draw a
        query as its own demonstration). Said, not refused: a smoke check may mean it."""
        import filecmp

        given = [getattr(self, key, None) for key in ("train_file", "eval_file")]
        if not all(isinstance(g, str) and "{" not in g for g in given):
            return
        train, held = (data_path(g, self.data_dir) for g in given)
        if train.is_file() and held.is_file() and (train.resolve() == held.resolve()
                                                   or filecmp.cmp(train, held, shallow=False)):
            self.note("eval is train", f"task.eval_file {held} holds the same data as task.train_file: the "
                      "scores are of training examples, not held-out ones")

    def note_eval_in_train(self, raw: dict[str, Any]) -> None:
        """The examples of task.eval_file read as training ones too, whatever the files' bytes:
        a compressed copy of the train file, the same records as JSONL beside a CSV, or a dev file
        cut from the train file without taking it out (`head -n 200 train.csv > dev.csv`) scored
        training examples as held-out ones, exit 0, where only a byte-for-byte copy was said. An
        example is every field the task read but an id (an eval split scored as held out carries
        a mark of its own); said when at least half the eval examples are training examples."""
        given = [getattr(self, key, None) for key in ("train_file", "eval_file")]
        train, held = raw.get("train"), raw.get("eval", {}).get("")
        if not all(isinstance(g, str) and g for g in given) or train is None or held is None or not len(held):
            return
        self._note_eval_is_train()
        if "eval is train" in self.__dict__.get("_notes", {}):
            return
        fields = [c for c in held.column_names if c in train.column_names and c.lower() not in OWN_MARKS]
        if not fields:
            return
        wanted = dict.fromkeys(_example_keys(held, fields))
        seen = set()
        for key in _example_keys(train, fields):
            if key in wanted:
                seen.add(key)
        both = sum(1 for key in _example_keys(held, fields) if key in seen)
        if 2 * both >= len(held):
            shown = f"all {len(held)}" if both == len(held) else f"{both} of {len(held)}"
            self.note("eval is train", f"task.eval_file {given[1]}: {shown} eval examples are training examples too "
                                       f"(task.train_file {given[0]}): the scores are "
                                       f"{'' if both == len(held) else 'mostly '}of training examples, not held-out ones")

    def read_columns(self) -> list[str]:
        """The columns of a raw split that the model reads as its input text (a list of words is
        read joined): what `note_unreadable` counts. None by default."""
        return []

    def note_unreadable_splits(self, tok: Any, splits: dict[str, Any]) -> None:
        """`note_unreadable` over each raw split (`{"train": ds, "eval": {suffix: ds}}` or a
        flat `{name: ds}`) by its `read_columns`, each named by its file where the task has one."""
        for split, ds in splits.items():
            if isinstance(ds, dict):
                self.note_unreadable_splits(tok, {f"{split}{sfx}": d for sfx, d in ds.items()})
            elif ds is not None and len(ds):
                given = getattr(self, f"{split}_file", None)
                where = f"task.{split}_file {given}" if isinstance(given, str) and given else f"the {split} split"
                columns = [c for c in self.read_columns() if c in ds.column_names]
                self.note_unreadable(tok, input_texts(ds[c] for c in columns), where)

    def note_unreadable(self, tok: Any, texts: Any, where: str) -> None:
        """Input text the tokenizer mostly cannot read: T5's SentencePiece (no byte fallback) reads
        Chinese, Japanese, emoji, `{`, `}` and `~` as its unknown token, an uncased BERT whole words
        of the scripts its vocabulary lacks, and a classifier, tagger, reader or generator fed
        such text trained and scored on a row of unknown tokens, exit 0. Said once per split (or
        predict's inputs) whose characters, whitespace aside, are more than UNREADABLE_SHARE
        such characters (`models.unknown_share`, probed a character at a time): the shipped
        data's worst is 1.3% (wikitext-2's `<unk>` markers under T5; SAMSum's emoji 0.2%)."""
        lost, total, chars = models.unknown_share(tok, texts)
        if not total or lost <= UNREADABLE_SHARE * total:
            return
        shown = " ".join(repr(c) for c in chars[:8]) + (f" and {len(chars) - 8} more" if len(chars) > 8 else "")
        self.note(f"unreadable {where}",
                  f"{where}: {lost / total:.0%} of the input text's characters ({lost} of {total}, whitespace aside) "
                  f"are ones the tokenizer ({type(tok).__name__}) reads as its unknown token "
                  f"{getattr(tok, 'unk_token', None)!r} ({shown}): the model sees none of them (a WordPiece "
                  "tokenizer loses the whole word around each); use a checkpoint whose tokenizer covers them")

    def notices(self, run: bool = True) -> dict[str, str]:
        """key -> warning line: the notes, and one line per kind of cut with its count. What to do
        about a cut differs: a run can raise the setting; a finished run's predictions are cut
        where its training was (raising it means training again)."""
        lines = dict(self.__dict__.get("_notes", {}))
        for (what, setting, limit), (done, total) in self.__dict__.get("_cut_counts", {}).items():
            if done:
                advice = (f"raise {setting} to keep them whole" if run else
                          f"the run was trained at {setting}={limit}; a run with a higher one reads more")
                lines[f"cut {what}"] = f"{done} of {total} {what} cut at {setting}={limit} tokens (the rest is not seen); {advice}"
        return lines

    def say_notices(self, run: bool = True) -> None:
        """Each notice as one `warning:` line on stderr, once per run (rank 0 only); the run's
        setup calls this once its splits are encoded, so the counts cover every split, and
        prediction (`run=False`: the recipe's own files are not its business) once its inputs are."""
        if run:
            self._note_eval_is_train()
        said = self.__dict__.setdefault("_said", set())
        for key, line in self.notices(run).items():
            if key not in said and os.environ.get("RANK", "0") == "0":
                print(f"warning: {line}", file=sys.stderr)
            said.add(key)


UNREADABLE_SHARE = 0.05  # of an input's characters read as the unknown token: said above it


def input_texts(columns: Any) -> Any:
    """Each text of the given columns' values: a string as it is, a list of words joined by
    spaces (NER's tokens), anything else (a missing field) left out."""
    for values in columns:
        for value in values:
            if isinstance(value, str):
                yield value
            elif isinstance(value, (list, tuple)):
                yield " ".join(str(w) for w in value)


def data_root(override: str | None = None) -> Path:
    """The recipe's `task.data_dir` (read as every user path is: `$VARS` and `~` expanded; `$DATA`
    was a folder named `$DATA`, so a GLUE run went to the Hub's copy, exit 0), else $TOOLKIT_DATA,
    else the shared data folder beside the checkout, else ./data."""
    if override:
        return user_path(override)
    if os.environ.get("TOOLKIT_DATA"):
        return Path(os.environ["TOOLKIT_DATA"]).expanduser()
    return beside_checkout("data", Path(__file__).resolve().parents[2])


def data_path(value: str, data_dir: str | None = None) -> Path:
    """A data file named in a recipe: `$TOOLKIT_DATA` (the recipe's `task.data_dir` when set)
    and other variables, `~`, expanded; relative paths are taken from the working directory, as
    a shell would."""
    if "$TOOLKIT_DATA" in value or "${TOOLKIT_DATA}" in value:
        root = str(data_root(data_dir))
        value = value.replace("${TOOLKIT_DATA}", root).replace("$TOOLKIT_DATA", root)
    return user_path(value)


DATA_ROOT = "$TOOLKIT_DATA"


def canonical_data_path(value: str, data_dir: str | None = None) -> str:
    """A recipe's data file setting in one form, whatever spelled it (`$TOOLKIT_DATA/glue/x.tsv`,
    `${TOOLKIT_DATA}/...`, the same file by its absolute path, by a path relative to the working
    directory, through `..` or a symbolic link to its folder): `$TOOLKIT_DATA/<path in it>` for a
    file under the data root (`task.data_dir` when set), which names it on any machine, else its
    absolute path. The file's own name is kept (a link `x.csv` to `y.tsv` is read as a CSV file).
    One file named two ways was two run ids of one computation (the second trained again; a
    sweep's "finished already" missed it). Idempotent, and the same on every machine for a
    `$TOOLKIT_DATA/...` path, so a run's recipe.yaml (which holds it) hashes as it ran anywhere."""
    root = data_root(data_dir)
    path = Path(os.path.abspath(data_path(value, data_dir)))
    folder = path.parent.resolve()
    for inside, top in ((folder / path.name, root.resolve()), (path, Path(os.path.abspath(root)))):
        if inside.is_relative_to(top):
            return "/".join((DATA_ROOT, *inside.relative_to(top).parts))
    return str(folder / path.name)


def canonical_data_paths(task: "Task") -> dict[str, str]:
    """{setting: value as written} of each of `task`'s data path settings (every `*_file` and
    `data_dir`) that `canonical_data_path` (an absolute folder for `data_dir`) puts in another
    form, set on `task` in that form: what the hash covers and recipe.yaml holds (from any working
    directory, eval and predict find the files again); the written values are what the hash
    before it covered (Recipe.hash_as_before finds runs made then)."""
    written = {}
    data_dir = task.data_dir
    if isinstance(data_dir, str) and data_dir:
        absolute = str(Path(os.path.abspath(user_path(data_dir))))
        if absolute != data_dir:
            written["data_dir"], task.data_dir = data_dir, absolute
    for f in fields(task):
        value = getattr(task, f.name)
        if f.name.endswith("_file") and isinstance(value, str) and value:
            form = canonical_data_path(value, data_dir)
            if form != value:
                written[f.name] = value
                setattr(task, f.name, form)
    return written


hub_offline = hub.offline  # the name the task files use


def hub_dataset(task: Task, hub_id: str, config: str | None = None, split: str | None = None, *,
                rows: Callable[[Any, str], Any]) -> Any:
    """`datasets.load_dataset` of a Hub data set, recorded on `task` (Task.hub_data): each split's
    datasets fingerprint as loaded, the hash of its cache folder `<name>/<config>/<version>/<commit>`
    and the split (datasets' builder), so another revision of the data set has another one, then
    a space and the hash of its examples (content_fingerprint), which another revision holding the
    same rows shares: `"<datasets fingerprint> <content sha256>"`.

    Every split the task takes is checked as a file's records are, here, the one way in from the
    Hub (a `save_to_disk`-style folder or any source datasets loads by name too): `rows(split,
    name)` is the task's own file checks on the split (readers.check_text / check_scalar ...,
    each fault one line naming `name: record N` and the field: `where` with the format "hub"),
    and returns the split as the task reads it. `name` is `<hub id>[<split>]`. Unchecked, a
    list-valued text column, a null text or a Sequence label was read as its Python text ("[0,
    1]", "None") or dropped, exit 0. Returned: the split (`split` given), else a mapping of the
    splits, each checked when the task first takes it (a split it never reads is not refused)."""
    from datasets import load_dataset

    ds = load_dataset(hub_id, config, split=split)
    splits = {split: ds} if split is not None else dict(ds)
    record = task.__dict__.setdefault("_hub_loaded", {})
    record.setdefault(" ".join(str(p) for p in (hub_id, config) if p is not None), {}).update(
        {str(name): f"{getattr(d, '_fingerprint', None)} {content_fingerprint(d)}" for name, d in splits.items()})
    if split is not None:
        return rows(ds, f"{hub_id}[{split}]")
    return HubSplits(splits, hub_id, rows)


def is_test_source(source: str) -> bool:
    """Whether a scored source (`Task.scored_source`) is a test split: a Hub split named test
    (`imdb[test]`), or a file whose name has `test` as a word of its own or its start
    (test.json, ptb.test.txt, test_2016_flickr.de.gz; not latest.csv)."""
    name = source.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.search(r"(?<![a-z])test", name) is not None


class HubSplits(dict):
    """A Hub data set's splits (`hub_dataset`), each passed through the task's `rows` check the
    first time it is taken (`splits[name]`); `in`, `len` and iteration name them unchecked."""

    def __init__(self, splits: dict[str, Any], hub_id: str, rows: Callable[[Any, str], Any]) -> None:
        super().__init__(splits)
        self._hub_id, self._rows = hub_id, rows
        self._checked: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._checked:
            self._checked[name] = self._rows(super().__getitem__(name), f"{self._hub_id}[{name}]")
        return self._checked[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def values(self) -> Any:  # type: ignore[override]
        return [self[name] for name in self]

    def items(self) -> Any:  # type: ignore[override]
        return [(name, self[name]) for name in self]


def content_fingerprint(dataset: Any) -> str:
    """sha256 of a split's examples, in order, and its features (the label names a ClassLabel
    gives the ids): what the data is, whatever revision of the Hub data set held it. datasets'
    own fingerprint hashes the cache folder (its revision): a new revision with the same rows was
    another data set to resume, eval and the report (runs.hub_data_changed, reports.core)."""
    import json

    digest = hashlib.sha256(json.dumps(dataset.features.to_dict(), sort_keys=True, default=str).encode())
    for batch in dataset.iter(batch_size=1000):
        digest.update(json.dumps(batch, sort_keys=True, ensure_ascii=False, default=str).encode())
    return digest.hexdigest()


OWN_MARKS = ("id", "idx", "guid")  # fields that name an example, not part of it (`note_eval_in_train`)


def _example_keys(dataset: Any, fields: list[str]) -> Any:
    """Each row's `fields` as one hashable text, in row order, read in batches."""
    import json

    for batch in dataset.select_columns(fields).iter(batch_size=4096):
        for values in zip(*(batch[f] for f in fields)):
            yield json.dumps(values, ensure_ascii=False, sort_keys=True, default=str)


def fingerprint(dataset: Any, tokenizer: Any, *parts: Any) -> str:
    """The cache key of a `Dataset.map`, given as its `new_fingerprint`.

    Left alone, datasets derives the key by pickling the mapped function with dill, tokenizer
    and all: about 0.7 s a call on this project's tokenizers, paid by every run and test, and
    mostly for in-memory datasets that are never cached. The key here is what decides the
    output instead: the input's own fingerprint, the tokenizer (its class, path, settings and
    the full serialised fast tokenizer), `parts` (the task's settings, the step's name) and the
    code that maps (`code_key`). Without the code, a cache written before a fix to an encoding
    or a corruption was read back after it: a file's held-out masks stayed the old ones, exit 0."""
    h = hashlib.sha256(f"{dataset._fingerprint}|{_tokenizer_key(tokenizer)}|{code_key()}|{parts!r}".encode())
    return h.hexdigest()[:16]


def code_key(folder: Path | None = None) -> str:
    """A hash of the sources of the task package (`folder`: another one), whose functions every
    fingerprinted `map` runs; read once per process."""
    folder = Path(__file__).resolve().parent if folder is None else folder
    if folder not in _CODE_KEYS:
        h = hashlib.sha256()
        for path in sorted(folder.glob("*.py")):
            h.update(f"{path.name}|".encode() + path.read_bytes())
        _CODE_KEYS[folder] = h.hexdigest()[:16]
    return _CODE_KEYS[folder]


_CODE_KEYS: dict[Path, str] = {}


def _tokenizer_key(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    settings = (type(tokenizer).__name__, tokenizer.name_or_path, tokenizer.padding_side,
                tokenizer.truncation_side, tokenizer.model_max_length, sorted(tokenizer.special_tokens_map.items()))
    return hashlib.sha256(f"{settings!r}|{body}".encode()).hexdigest()


def subset(dataset: Any, n: int | None, seed: int = 0) -> Any:
    """A seeded random subset (fixed seed: the same examples for every training seed)."""
    if dataset is None or n is None or n >= len(dataset):
        return dataset
    return dataset.shuffle(seed=seed).select(range(n))


for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
