"""The base of text-to-text tasks (summarization, translation, generative QA).

Not a plug-in itself. One raw example is a source text and a target text (and, for scoring, one
or more references). How they become model inputs depends on the family:
- encoder-decoder (T5, BART, an EncoderDecoderModel): source -> encoder, target -> labels; the
  collator pads on the right (whatever the tokenizer's padding side), labels with -100, and asks
  the model to build decoder_input_ids from them (each family shifts its own way), as
  transformers' DataCollatorForSeq2Seq does;
- decoder-only (GPT-2): prompt + target + EOS in one sequence, the prompt's positions -100 in the
  labels so the loss is over the target alone; for generation the prompt alone, left-padded.

Evaluation computes the loss and generates (transformers' `generate`, KV cache on) in the same
step. Encoded examples are sorted by length (longest first) so generation batches hold examples of
similar length; each carries its `example_index`, and scoring puts them back in raw order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields as settings_fields
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

import numpy as np

from toolkit import readers, schema
from toolkit.errors import UserError
from toolkit.lazy import lazy, no_grad
from toolkit.tasks import data_path
from toolkit.tasks._fields import language_tag
from toolkit.tasks._lm import IGNORE, TokenTask, continued, decoder_inputs, leading_special, special_frame, text_end
from toolkit.models import (CASE_PROBE, kind_of, lowercased, most_across, parts_lost, reads_padding, shards_weights,
                            unknown_characters)

torch = lazy("torch", globals())

EXTRA = ("example_index", "prompt_ids", "prompt_mask")  # collated beside the model's inputs


@dataclass
class Generation:
    """Decoding settings (transformers' GenerationConfig names), always greedy or beam search.

    A setting left unset (None) is the checkpoint's generation_config, else transformers' default,
    as transformers' Seq2SeqTrainer (run_summarization, run_translation) and its pipelines read
    them: bart-large-cnn's 4 beams, length_penalty 2.0, no_repeat_ngram_size 3 and min_length 56,
    t5-small's greedy search. `num_beams`, `length_penalty` and `no_repeat_ngram_size` were pinned
    to 1 / 1.0 / 0 and the length and repetition constraints cleared, whatever the checkpoint said
    (exit 0): unset now hashes as unset (`schema.unpinned`: a recipe that leaves them has a new
    run id, one that writes the old values keeps its id and finds the runs made before), and a run
    made before is read as it decoded (`TextToText.as_made`). The decoding used is recorded
    (`decoding_used`, metrics.json's `generation`).

    `max_new_tokens` unset (None) is the task's `max_target_length`: the budget covers every
    reference the task trains on, as transformers' run_summarization / run_translation generate
    up to `val_max_target_length` (= `max_target_length`, 128), Seq2SeqTrainer's
    generation_max_length, whatever the checkpoint's max_length. A fixed 64 cut IWSLT14's longer
    sentences (2-4% of its references pass 64 tokens) and lowered BLEU with no word said."""

    num_beams: int | None = schema.unpinned(was=1, min=1, max=64)
    length_penalty: float | None = schema.unpinned(was=1.0, min=-10.0, max=10.0)
    max_new_tokens: int | None = field(default=None, metadata={  # unset: its task's max_target_length
        "min": 1, "max": 4096, schema.DERIVED: lambda _, task: getattr(task, "max_target_length", None)})
    no_repeat_ngram_size: int | None = schema.unpinned(was=0, min=0, max=16)
    # when beam search stops (GenerationConfig's early_stopping): true once num_beams hypotheses are
    # finished, false when no open beam can still beat them (transformers' heuristic), "never"
    # (the canonical search); unset: the checkpoint's generation_config (BART's true, T5's and
    # Marian's none, i.e. false), as transformers' Seq2SeqTrainer reads it
    early_stopping: bool | Literal["never"] | None = schema.added(default=None, neutral=None)
    # the length and repetition constraints (GenerationConfig's names), unset: the checkpoint's;
    # each was cleared (transformers' default) until 2026-11-28, whatever the checkpoint said
    min_length: int | None = schema.added(default=None, neutral=None, min=0, max=4096)
    min_new_tokens: int | None = schema.added(default=None, neutral=None, min=0, max=4096)
    repetition_penalty: float | None = schema.added(default=None, neutral=None, min=0.01, max=10.0)
    encoder_repetition_penalty: float | None = schema.added(default=None, neutral=None, min=0.01, max=10.0)
    encoder_no_repeat_ngram_size: int | None = schema.added(default=None, neutral=None, min=0, max=16)
    # [start, factor]: past `start` new tokens the end token's score grows by `factor` a token
    # (GenerationConfig's exponential_decay_length_penalty, a length preference as length_penalty
    # is); []: none; unset: the checkpoint's. Cleared whatever the checkpoint said until 2026-11-28
    exponential_decay_length_penalty: list[float] | None = schema.added(default=None, neutral=None)

    def __post_init__(self) -> None:
        decay = self.exponential_decay_length_penalty
        if decay and (len(decay) != 2 or decay[0] != int(decay[0]) or decay[0] < 0 or decay[1] <= 0):
            raise UserError(f"task.generation.exponential_decay_length_penalty: {decay!r} is not [start, factor]: "
                            "a whole number of new tokens (0 or more) after which the end token's score grows, "
                            "and the factor it grows by each token (above 0; above 1 ends outputs sooner); "
                            "[] for none")

    def budget(self, target_length: int) -> int:
        """New tokens `generate` may write: the recipe's `max_new_tokens`, else `target_length`."""
        return target_length if self.max_new_tokens is None else self.max_new_tokens

    def chosen(self) -> dict[str, Any]:
        """The decoding settings the recipe sets (`FOLLOWED`); those unset are left out."""
        out = {k: getattr(self, k) for k in FOLLOWED if getattr(self, k) is not None}
        decay = out.get("exponential_decay_length_penalty")
        if decay is not None:  # GenerationConfig's (int, float); []: none, whatever the checkpoint says
            out["exponential_decay_length_penalty"] = (int(decay[0]), float(decay[1])) if decay else None
        return out

    def kwargs(self, target_length: int) -> dict[str, Any]:
        """What `generate` is given over the checkpoint's generation_config: the settings the
        recipe sets (`chosen`; unset: the checkpoint's, as Seq2SeqTrainer leaves them), the budget
        `budget(target_length)`, greedy or beam search (do_sample false), the decoding strategies
        and clock and bias no recipe decodes with cleared (`UNSET`) and what `generate` returns
        pinned (`ONE_TENSOR`)."""
        return {**self.chosen(), "max_new_tokens": self.budget(target_length),
                "do_sample": False, "use_cache": True, **UNSET, **ONE_TENSOR}

    def as_before(self, ran: dict, keys: set[str]) -> None:
        """A run's settings as it decoded (`ran`: its recipe.yaml's generation block, `keys`: the
        task overrides given now, which win): a run made before a constraint could be set (its
        block has no such key) had it cleared; one made before `early_stopping` searched its beams
        with true. The settings that were pinned (`schema.unpinned`) are written in its block."""
        for name, before in BEFORE.items():
            if name not in ran and f"task.generation.{name}" not in keys and getattr(self, name) is None:
                setattr(self, name, before({**ran, "num_beams": self.num_beams}) if callable(before) else before)

    def saved(self, model: Any, target_length: int) -> dict[str, Any]:
        """`kwargs` as a generation_config.json holds them (`toolkit export`, over `model`'s own:
        what the recipe leaves unset stays the checkpoint's, as the run read it): the same
        decoding, with what it ignores unset: sampling's fields (a base saved for sampling,
        temperature 0.6 say) and, greedy, the beam search's length penalty and stopping.
        transformers refuses to save a config that sets one beside greedy or beam settings, and
        `toolkit export` of such a run was a traceback with nothing exported."""
        out = {**self.kwargs(target_length), **SAMPLING_ONLY}
        out["no_repeat_ngram_size"] = in_effect(model, out, "no_repeat_ngram_size")  # a decoder's: said apart
        if in_effect(model, out, "num_beams") == 1:
            out["length_penalty"] = out["early_stopping"] = None
        return out


# the decoding settings a recipe may set (`Generation`), each unset: the checkpoint's
FOLLOWED = ("num_beams", "length_penalty", "no_repeat_ngram_size", "early_stopping", "min_length", "min_new_tokens",
            "repetition_penalty", "encoder_repetition_penalty", "encoder_no_repeat_ngram_size",
            "exponential_decay_length_penalty")
# what a run made before a setting existed decoded with, where its recipe.yaml has no such key (from
# its generation block): the constraints were cleared (transformers' defaults) until 2026-11-28, and
# beam search stopped early whatever the checkpoint said (reports.core.BEFORE_NESTED reads these)
BEFORE: dict[str, Any] = {
    "early_stopping": lambda block: True if (block.get("num_beams") or 1) > 1 else None,
    "min_length": 0, "min_new_tokens": 0, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0, "exponential_decay_length_penalty": [],
}


# generation_config fields that sampling alone reads (do_sample=True): greedy and beam search, all a
# recipe decodes with, ignore them
SAMPLING_ONLY = dict.fromkeys(("temperature", "top_p", "top_k", "typical_p", "min_p", "top_h", "epsilon_cutoff",
                               "eta_cutoff"))
# generation_config fields no recipe setting names and that `generate` is given cleared, whatever the
# checkpoint says. A checkpoint's setting is followed (as Seq2SeqTrainer and pipelines follow it) where
# greedy or beam search reads it and the text it picks depends on the model and its inputs alone: the
# recipe's settings above, the length decay (`Generation.exponential_decay_length_penalty`) and the
# token mechanics (`bad_words_ids`, `suppress_tokens`, `forced_bos_token_id`: a token the
# checkpoint's author banned or forced; the decoder's start and a target's language code are
# `TextToText.decoding_start`'s). Cleared, each for its reason:
# - the text would depend on the machine: `max_time` (outputs cut where the machine was slow), a
#   watermark (`watermarking_config`: its green lists are drawn by the device's own generator, CUDA's
#   and the CPU's apart, so the same run scored and predicted other text on a GPU than on the CPU);
# - another decoding strategy than greedy or beam search (contrastive search, DoLa, group and
#   constrained beam search), which transformers 5 refuses without remote code (a traceback after
#   training), and classifier-free guidance (`guidance_scale`: a second, unconditional forward a
#   step, which an encoder-decoder fails: "exactly one of input_ids or inputs_embeds");
# - what needs the tokenizer passed to `generate` (`stop_strings`, `token_healing`: a ValueError
#   after training; in-context prompting's stops are `stop_at`'s), and a `sequence_bias`, which
#   transformers writes to generation_config.json in a form its `generate` refuses (keys "(5,)"
#   for (5,): "has to be a dict with tuples as keys", a ValueError after training).
UNSET = dict.fromkeys(("max_time", "watermarking_config", "penalty_alpha", "dola_layers", "num_beam_groups",
                       "diversity_penalty", "constraints", "force_words_ids", "guidance_scale", "stop_strings",
                       "token_healing", "sequence_bias"))
# what `generate` returns, pinned to one tensor of one sequence per input: a checkpoint's
# generation_config with num_return_sequences 2 (beside beams) gave two rows per example, which
# scoring paired with the wrong references (exit 0), and one with return_dict_in_generate gave an
# output object the task could not read (a traceback after training)
ONE_TENSOR = {"num_return_sequences": 1, "return_dict_in_generate": False, "output_scores": False,
              "output_logits": False, "output_attentions": False, "output_hidden_states": False}


def read_records(path: Path, fields: tuple[str, ...] | None = None,
                 pick: Callable[[Any, str], tuple[str, ...]] | None = None,
                 note: Callable[[str, str], None] | None = None, role: Literal["train", "eval"] | None = None) -> Any:
    """JSON (a list of objects, or {"data": [...]}), JSONL, CSV or TSV, `.gz` too -> a Dataset of
    `fields` (or those `pick(dataset, path)` finds in the file), each text, through the shared
    reader: a missing, empty or non-text field is one error naming file, line and field; one
    written as a missing value (`NA`) is said through `note` (a task's). TSV is read as every
    other task and predict read it (tab-separated, quotes are text): it was refused here alone,
    where `toolkit predict` on the same run read the same file.

    `role` says what the last field (the target) is read for. An eval file's ("eval") may hold,
    in JSON(L), a list of texts where an example has several references, as sacreBLEU and
    evaluate's rouge take them (`reference_lists`); a train file's ("train") list is one line
    (training needs one target); None: text alone, as before."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    suffix = [s.lower() for s in path.suffixes if s.lower() != ".gz"][-1:]
    if suffix not in ([".json"], [".jsonl"], [".csv"], [".tsv"]):
        raise UserError(f"{path}: unknown format '{''.join(suffix)}'; use .json, .jsonl, .csv or .tsv "
                        "(optionally .gz), or parallel text files named with {lang}")
    fmt = readers.file_format(path, ("json", "jsonl", "csv", "tsv"))
    field = readers.document_field(path, fmt, TextToText.json_field)
    ds = readers.lift_nested(readers.read(path, fmt, field=field))
    fields = pick(ds, str(path)) if pick is not None else fields
    keys = (lambda i: [field, i]) if field else None
    for name in fields:
        if role is not None and name == fields[-1] and fmt in ("json", "jsonl") and not readers.is_text(ds, name):
            listed = reference_lists(ds, name, path, fmt, field, keys, note, role)
            if listed is not None:
                ds = listed
                continue
        readers.check_text(ds, name, path, fmt, what=f"'{name}'", keys=keys, note=note)
    return readers.as_text(ds.select_columns(list(fields)), list(fields))


def reference_lists(ds: Any, name: str, path: Path, fmt: str, field: str | None, keys: Any,
                    note: Callable[[str, str], None] | None, role: str) -> Any:
    """`ds` with target field `name` as each record's list of references, where a record of the
    JSON(L) file gives a list (None where none does: the field is checked as text). In an eval
    file a target is then a non-empty list of texts, each checked as a text is (`check_text`:
    missing, blank, a byte order mark, a missing-value mark; one line naming the record's line and
    which reference). Every target is then a list (one type per field, as the JSON reader has it:
    a text beside lists is one line). In a train file a list is one line: teacher forcing trains
    on one target per record."""
    from datasets import Dataset

    values = readers.values_in_file(path, fmt, name, field)
    if values is None or len(values) != len(ds) or not any(isinstance(v, list) for v in values):
        return None
    first = next(i for i, v in enumerate(values) if isinstance(v, list))
    at = lambda i: readers.where(path, fmt, i, keys(i) if keys else None)  # noqa: E731
    if role == "train":
        raise UserError(f"{at(first)}: '{name}' is a list ({len(values[first])} text{'s' * (len(values[first]) != 1)}), and a train file's "
                        f"target is one text: training reads one target per record (several references are "
                        f"read from an eval file, to score against); write one record per target, the source "
                        f"repeated, or keep one of them")
    for i, v in enumerate(values):
        if v is None:
            raise UserError(f"{at(i)}: '{name}' is missing; every record needs it")
        if not isinstance(v, (str, list)):
            raise UserError(f"{at(i)}: '{name}' is {readers.json_type(v)}, expected a list of texts "
                            "(the example's references)")
        if isinstance(v, list) and not v:
            raise UserError(f"{at(i)}: '{name}' is an empty list; an eval record needs at least one reference text")
        wrong = next((r for r in (v if isinstance(v, list) else []) if r is not None and not isinstance(r, str)), None)
        if wrong is not None or (isinstance(v, list) and any(r is None for r in v)):
            shown = "missing (null)" if wrong is None else readers.json_type(wrong)
            raise UserError(f"{at(i)}: '{name}' holds a reference that is {shown}; each reference is a text")
    text = next((i for i, v in enumerate(values) if isinstance(v, str)), None)
    if text is not None:  # one type per field, as the JSON reader and datasets' json builder have it
        there = at(first)[len(str(path)) + 1:].strip()
        raise UserError(f"{at(text)}: '{name}' is a text here but a list of references at "
                        f"{'line ' * there.isdigit()}{there}; where examples have several references every target "
                        "is a list (one reference: a list of one text)")
    lists = values
    for j in range(max(map(len, lists))):  # each reference as text, at its record's line
        column = [refs[j] if j < len(refs) else "-" for refs in lists]
        what = f"reference {j + 1} of '{name}'"
        readers.check_text(Dataset.from_dict({f"{name} {j + 1}": column}), f"{name} {j + 1}", path, fmt, what=what,
                           keys=keys, note=note)
    return ds.remove_columns([name]).add_column(name, lists)


def read_parallel(source: Path, target: Path) -> Any:
    """Line-aligned parallel text (`.gz` too): line i of one file translates line i of the other.
    Blank lines after the last text of both files are not lines (an editor's extra line break
    made `2 lines but ... has 3`); a blank line facing a text is refused at its line."""
    from datasets import concatenate_datasets

    src, tgt = (readers.read(p, "text") for p in (source, target))
    end = max(readers.text_end(src, "text"), readers.text_end(tgt, "text"))  # blank lines after both texts end
    src, tgt = (ds.select(range(end)) if len(ds) > end else ds for ds in (src, tgt))
    if len(src) != len(tgt):
        raise UserError(f"{source}: {len(src)} lines but {target} has {len(tgt)}; parallel files must "
                        "be line-aligned")
    readers.check_text(src, "text", source, "text", what="the source line")
    readers.check_text(tgt, "text", target, "text", what="the target line")
    return concatenate_datasets([src.rename_column("text", "source"), tgt.rename_column("text", "target")],
                                axis=1)


def read_pairs(pattern: str, source_field: str | None, target_field: str | None,
               langs: tuple[str, str] | None = None,
               pick: Callable[[Any, str], tuple[str, str]] | None = None,
               note: Callable[[str, str], None] | None = None, role: Literal["train", "eval"] | None = None) -> Any:
    """A recipe's data file -> a Dataset of `source` and `target` text: parallel text when the
    path holds `{lang}` (filled with each side's language), else JSON/JSONL/CSV/TSV records with the
    two named fields, or the two `pick(dataset, path)` finds in the file. `role`: what the file is
    read for (`read_records`: an eval file's JSON(L) target may be a list of references)."""
    if "{lang}" in pattern:
        if langs is None:
            raise UserError(f"{pattern}: '{{lang}}' in a path is for translation's parallel files")
        return read_parallel(data_path(pattern.replace("{lang}", langs[0])),
                             data_path(pattern.replace("{lang}", langs[1])))
    if pick is None and source_field == target_field:
        raise UserError(f"task: the source and target fields are both '{source_field}'")
    chosen: list[tuple[str, str]] = []

    def named(ds: Any, where: str) -> tuple[str, str]:
        chosen.append(pick(ds, where) if pick is not None else (source_field, target_field))
        return chosen[0]

    ds = read_records(data_path(pattern), pick=named, note=note, role=role)
    return ds.rename_columns({chosen[0][0]: "source", chosen[0][1]: "target"})


@dataclass
class InContext:
    """What method icl gives a text-to-text task for one eval split: per row its demonstrations
    ((source, target) pairs), the separator between prompt parts, the token limit prompts are cut
    to, the encoder of a decoder's prompt texts (the harness's, with its BOS rule), and the stop
    strings that end a generated answer; `cut`/`total` count the prompts cut to fit, `lost` the
    demonstrations they lost (not seen whole) of the `had` they had, `own` those whose example
    itself is cut."""

    demonstrations: list[list[tuple[str, str]]]
    separator: str
    limit: int
    encode: Callable[[list[str]], list[list[int]]]
    cut: int = 0
    total: int = 0
    lost: int = 0
    own: int = 0
    had: int = 0

    @property
    def stops(self) -> list[str]:
        """The harness's `until` when a task names none: its fewshot delimiter (EOS ends the
        generation by itself, and decodes to nothing)."""
        return [self.separator] if self.separator else []


@dataclass(kw_only=True)
class TextToText(TokenTask):
    """Source text -> target text, trained with teacher forcing and scored on generated text."""

    names: ClassVar[tuple[str, str]] = ("sources", "targets")  # what a cut is counted in
    json_field: ClassVar[str | None] = "data"  # read_records
    # the scores that count a capital written in lower case as a miss ("BLEU and chrF"); "": none
    case_sensitive: ClassVar[str] = ""

    max_length: int = field(default=512, metadata={"min": 8})  # source tokens
    max_target_length: int = field(default=128, metadata={"min": 1})
    prefix: str | None = None  # before the source; None: the task's default for the family
    suffix: str | None = None  # after the source (decoder-only prompts); None: the task's default
    generation: Generation = field(default_factory=Generation)
    # the language codes a multilingual tokenizer (mBART, mBART-50, M2M100, NLLB) marks sources and
    # targets with: `language_codes`; unset, translation's are found from source_lang / target_lang
    source_code: str | None = schema.added(default=None, neutral=None)
    target_code: str | None = schema.added(default=None, neutral=None)

    # --- family ------------------------------------------------------------------------------
    def ignores(self) -> dict[str, str]:
        if self.generation.num_beams == 1:  # set greedy: transformers' greedy search reads no length penalty
            return self.ignores_under_greedy("generation.num_beams: 1 is greedy search")
        return {}

    def ignores_under_greedy(self, greedy: str) -> dict[str, str]:
        """The beam-search settings greedy search never reads, and why (`greedy`: what makes it greedy)."""
        return {"task.generation.length_penalty": (
                f"it weighs beam-search hypotheses by their length, and {greedy}, which reads no length "
                "penalty; set num_beams above 1 or leave it unset"),
                "task.generation.early_stopping": (
                f"it says when beam search stops, and {greedy}, which reads none; set num_beams above 1 or "
                "leave it unset")}

    def check(self) -> None:
        """A minimum output length the recipe sets that no output within the generation budget
        can meet (`length_problem`): refused at validate, with no model read."""
        super().check()
        problem = self.length_problem(None)
        if problem:
            raise UserError(problem)

    def length_problem(self, model: Any) -> str | None:
        """A minimum length (`min_new_tokens`; an encoder-decoder's `min_length`, which counts the
        decoder's start token), the recipe's or else the checkpoint's generation_config, above
        what `generate` may write (`new_tokens`, the budget): transformers bans the end token
        until the minimum is met and only warns that it cannot be ("Unfeasible length
        constraints", a Python warning mid-run), so every output ran to the budget without its
        end and was scored so, exit 0, where the recipe asked for longer text than it got. A
        decoder-only model's `min_length` counts its prompt and is left to `generate`. `model`
        None: the recipe's settings alone (validate)."""
        budget, chosen = self.new_tokens(), self.generation.chosen()
        limits = [("min_new_tokens", budget, "")]
        if model is not None and not self.decoder_only:  # the family is known once a model is
            limits.append(("min_length", budget + 1, ", the decoder's start token among them"))
        for name, room, counted in limits:
            value = chosen.get(name) if model is None else in_effect(model, chosen, name)
            if value is None or value <= room:
                continue
            whose = "the recipe's" if name in chosen else "unset: the checkpoint's generation_config"
            return (f"task.generation.{name}: {value} ({whose}) is more than the {room} tokens{counted} "
                    f"that generation.max_new_tokens {budget} (unset: task.max_target_length) lets `generate` "
                    f"write: every output would run to that length without its end token; set {name} at most "
                    f"{room}, or raise generation.max_new_tokens")
        return None

    def model_problem(self, model: Any) -> str | None:
        """A beam-search setting (length_penalty, early_stopping) set where num_beams is unset and
        the checkpoint's generation_config says greedy search, which reads neither: the run
        recorded it as used, exit 0 (`ignores` refuses it at validate where the recipe says
        num_beams: 1). The value a pinned setting had (`schema.unpinned`'s `was`: the length
        penalty 1.0 runs made before wrote) is no request."""
        g = self.generation
        length = self.length_problem(model)
        if length or g.num_beams is not None or in_effect(model, {}, "num_beams") != 1:
            return length
        was = {f.name: f.metadata.get(schema.WAS) for f in settings_fields(g)}
        greedy = "generation.num_beams is unset and the checkpoint's generation_config says 1: greedy search"
        for key, why in self.ignores_under_greedy(greedy).items():
            name = key.rsplit(".", 1)[1]
            value = getattr(g, name)
            if value is not None and value != was[name]:
                return f"{key}: {why} (it is {value!r})"
        return None

    def model_head(self, family: str | None) -> str:
        """causal-lm for decoders, seq2seq-lm otherwise; remembered so encoding knows the layout
        (build calls this before encoding)."""
        self._family = family
        self._decoder_only = family is not None and family != "encoder-decoder" and kind_of(family) == "decoder"
        return "causal-lm" if self._decoder_only else "seq2seq-lm"

    def default_affixes(self, family: str | None, decoder_only: bool) -> tuple[str, str]:
        """(prefix, suffix) around the source when the recipe sets none."""
        return "", ""

    def prompt_basis(self) -> dict[str, Any]:
        """The settings `default_affixes` reads besides the model's family (fixed for a run)."""
        return {}

    def recorded_prompt(self) -> dict[str, Any]:
        """The default prompt as this run resolved it, for metrics.json (`prompt`): the text is
        built at run time (translation's language names), so a later toolkit that builds it
        otherwise would score, predict and export the run with a prompt it never trained on."""
        prefix, suffix = self.default_affixes(getattr(self, "_family", None), self.decoder_only)
        return {"prefix": prefix, "suffix": suffix, "task": self.name, **self.prompt_basis()}

    def unrecorded_affixes(self, family: str | None, decoder_only: bool) -> tuple[str, str]:
        """The default prompt of a run from before metrics.json recorded it: as the toolkit built
        it then (translation: a full code as written), so such a run reads as it trained."""
        return self.default_affixes(family, decoder_only)

    def as_made(self, ran: dict, keys: set[str]) -> None:
        """A run is read as it decoded (`Generation.as_before`): a setting its recipe.yaml lacks
        (made before it existed) is what the toolkit used then, not the checkpoint's, or
        `toolkit eval` / predict / export of an old run decoded other text than it scored, exit 0."""
        block = ran.get("generation")
        if isinstance(block, dict):
            self.generation.as_before(block, keys)

    def adopt_prompt(self, saved: Any) -> None:
        """The run's recorded default prompt (`recorded_prompt`), used where the recipe sets no
        prefix/suffix, when the task is the run's (the same task and the settings the prompt is
        built from: not `--task-from` another pair); None: a run that recorded none, read with
        the prompt built as it was then (`unrecorded_affixes`)."""
        if saved is None:
            self._unrecorded = True
            return
        if not isinstance(saved, dict) or not isinstance(saved.get("prefix"), str) \
                or not isinstance(saved.get("suffix"), str):
            return
        if {k: v for k, v in saved.items() if k not in ("prefix", "suffix")} \
                == {"task": self.name, **self.prompt_basis()}:
            self._recorded_affixes = (saved["prefix"], saved["suffix"])

    def affixes(self) -> tuple[str, str]:
        build = self.unrecorded_affixes if self.__dict__.get("_unrecorded") else self.default_affixes
        prefix, suffix = self.__dict__.get("_recorded_affixes") \
            or build(getattr(self, "_family", None), self.decoder_only)
        prefix = prefix if self.prefix is None else self.prefix
        return self.__dict__.get("_mark", "") + prefix, suffix if self.suffix is None else self.suffix

    def reading_limit(self) -> int | None:
        """An encoder's prompt without a suffix is cut whole at task.max_length; a source cut
        before a suffix (an encoder's, every decoder-only prompt) is no cut the tokenizer makes."""
        return None if self.decoder_only or self.affixes()[1] else self.max_length

    @property
    def decoder_only(self) -> bool:
        return getattr(self, "_decoder_only", False)

    def positions_problem(self, tokenizer: Any, max_length: int, limit: int) -> str | None:
        """A decoder-only model reads the prompt (source, suffix) and then the target and its EOS,
        or the generated tokens, as ONE sequence; an encoder-decoder's decoder reads the target
        or the generated tokens after its start token. Past `limit` the position table runs out
        (an IndexError mid-run, on whichever example is long enough)."""
        target = self.answer_room()
        if not self.decoder_only:
            if target <= limit:
                return None
            return (f"task.max_target_length: {self.max_target_length} target tokens (their EOS among "
                    f"them) or generation.max_new_tokens {self.new_tokens()} are more than the "
                    f"{limit} positions")
        _, suffix = self.affixes()
        extra = len(continued(tokenizer, [suffix])[0]) if suffix else 0
        if max_length + extra + target <= limit:
            return None
        fix = (f"use task.max_length at most {limit - extra - target}" if limit - extra - target >= 8
               else "lower task.max_target_length and generation.max_new_tokens")
        return (f"task.max_length: {max_length} source tokens, {extra} of task.suffix and {target} for the "
                f"target and its EOS (task.max_target_length {self.max_target_length}, "
                f"generation.max_new_tokens {self.new_tokens()}) are one sequence of "
                f"{max_length + extra + target} in a decoder-only model; {fix} to stay within the {limit} positions")

    def longest_sequence(self, tokenizer: Any, max_length: int) -> tuple[int, str]:
        """A decoder-only model reads the prompt (its suffix too) and the answer as one sequence;
        an encoder-decoder's decoder reads the answer alone."""
        room = self.answer_room()
        if not self.decoder_only:
            return (max_length, f"task.max_length {max_length}") if max_length >= room else \
                (room, "the target or the generated tokens")
        _, suffix = self.affixes()
        extra = len(continued(tokenizer, [suffix])[0]) if suffix else 0
        return max_length + extra + room, f"task.max_length {max_length} + {extra} suffix + {room} answer tokens"

    def answer_room(self) -> int:
        """Positions the target takes (a decoder-only model's prompt comes before): the target
        with its EOS (counted in max_target_length by an encoder-decoder's tokenizer, appended
        after it for a decoder-only model), or the generated tokens."""
        return max(self.max_target_length + int(self.decoder_only), self.new_tokens())

    def new_tokens(self) -> int:
        """The generation budget: `generation.max_new_tokens`, unset: `max_target_length`, so an
        output may be as long as any target the task trains on (`Generation`)."""
        return self.generation.budget(self.max_target_length)

    # --- what subclasses say -----------------------------------------------------------------
    def source_text(self, row: dict) -> str:
        return row["source"]

    def target_text(self, row: dict) -> str:
        """The one target the model is taught (teacher forcing) and its eval loss is of: an
        example with several references (an eval file's list, `read_records`) takes its first,
        as the loss has one target; the scores read them all (`references`)."""
        target = row["target"]
        return target if isinstance(target, str) else target[0]

    def other_references(self, row: dict) -> list[str]:
        """The references of a row besides the one it is taught (`target_text`): an eval file's
        list past its first; none for a text."""
        target = row.get("target")
        return list(target[1:]) if isinstance(target, list) else []

    def references(self, raw: Any) -> list[list[str]]:
        """Each example's references: its target, or each of them where a reader gives a list
        (the metrics score several references per example, `_text_metrics.reference_lists`)."""
        return [[t] if isinstance(t, str) else list(t) for t in raw["target"]]

    # --- references the metric can score -----------------------------------------------------
    def check_references(self, references: list[list[str]], split: str) -> None:
        """Refuse (one line) or say (`note`) references the task's metric cannot score as text
        (summarization: ROUGE's a-z/0-9 tokens; translation: a BLEU tokenizer that cannot split
        their script); `references`: each example's (`references`), every one of them checked;
        `split` is 'eval' or 'train'. Nothing here."""

    def checked(self, data: dict[str, Any]) -> dict[str, Any]:
        """`load`'s splits, the eval split's references checked before anything trains; another
        split (`toolkit eval --split train`) is checked when it is scored (`as_scored`): its
        references were scored unchecked, exit 0. The eval split is checked only where it is the
        one scored (`scoring`): `--split train` was refused for the eval file's references."""
        if self.__dict__.get("_scored_split", "eval") == "eval":
            self.check_references(self.counted_references(data["eval"][""]), "eval")
        self._unchecked = {id(ds): name for name, ds in (("train", data.get("train")),) if ds is not None}
        return data

    def as_scored(self, dataset: Any) -> Any:
        split = self.__dict__.get("_unchecked", {}).get(id(dataset))
        if split is not None:
            self.check_references(self.counted_references(dataset), split)
        return super().as_scored(dataset)

    def counted_references(self, raw: Any) -> list[list[str]]:
        """The split's references (`references`), their counts per example kept for metric_info
        (`reference_counts`, translation's nrefs): where a split is loaded, checked and scored."""
        references = self.references(raw)
        self.__dict__["_reference_counts"] = tuple(sorted({len(r) for r in references}))
        return references

    def reference_counts(self) -> tuple[int, ...]:
        """The counts of references per example of the split last read for scoring; (1,) before any."""
        return self.__dict__.get("_reference_counts", (1,))

    # --- language codes (multilingual tokenizers) ---------------------------------------------
    def language_hints(self) -> tuple[tuple[str, str | None], tuple[str, str | None]]:
        """(recipe key, value) that names the sources' and the targets' language where
        task.source_code / task.target_code are unset: none here (translation: its languages)."""
        return ("task.source_code", None), ("task.target_code", None)

    def set_languages(self, tok: Any) -> None:
        """A tokenizer that marks each text with a language code (`language_codes`) is set to the
        recipe's languages, as transformers' run_translation sets `src_lang` / `tgt_lang`:
        task.source_code / task.target_code, else the language the task names (translation's
        source_lang / target_lang: `en` is mBART-50's `en_XX`, M2M100's `en`), else the codes the
        checkpoint's tokenizer was saved with, both (transformers saves a default src_lang that
        nobody chose, en_XX or eng_Latn, beside tgt_lang null); else one line. Left alone, every source was marked
        with the tokenizer's default (mBART-50's and NLLB's English) and every target with the
        source's code (M2M100: a KeyError traceback), trained and scored with exit 0. Saved with
        the tokenizer (`init_kwargs`), so a run's model/ and its export load with them."""
        if target_marks(tok):
            return self._mark_sources(tok)
        codes = language_codes(tok)
        given = (("task.source_code", self.source_code), ("task.target_code", self.target_code))
        if codes is None:
            for key, value in given:
                if value is not None:
                    raise UserError(f"{key}: {value!r} is a language code for a tokenizer that marks texts with "
                                    f"them (mBART, M2M100, NLLB); this model's ({type(tok).__name__}) marks none: "
                                    "leave it unset")
            return
        saved = [tok.init_kwargs.get(k) for k in ("src_lang", "tgt_lang")]  # both, or the class's default
        saved = saved if all(c in codes for c in saved) else [None, None]
        chosen = []
        for (key, own), (hint_key, hint), kept, side in zip(given, self.language_hints(), saved, ("sources", "targets")):
            if own is not None or hint is not None:
                chosen.append(pick_code(codes, own if own is not None else hint, key if own is not None else hint_key,
                                        key, tok))
            elif kept is not None:
                chosen.append(kept)
            else:
                raise UserError(f"{key}: the tokenizer ({type(tok).__name__}) marks every text with its language's "
                                f"code ({', '.join(codes[:4])}, ...: {len(codes)} codes), and neither the recipe nor "
                                f"the tokenizer (src_lang and tgt_lang) says which the {side} are in; set {key}")
        tok.src_lang, tok.tgt_lang = chosen
        tok.init_kwargs["src_lang"], tok.init_kwargs["tgt_lang"] = chosen  # what save_pretrained writes

    def _mark_sources(self, tok: Any) -> None:
        """A multi-target Marian tokenizer (opus-mt-en-ROMANCE, en-mul) reads the target language
        from a `>>fr<<` token that begins each source, as its model card says to write it: the
        target's mark (task.target_code, else translation's target_lang: `fr` is `>>fr<<`, a code
        of its own `>>fra<<`) goes before every source (`affixes`), or a task.prefix that begins
        with one is that mark. Without one the model chose its output's language, exit 0."""
        marks = target_marks(tok)
        codes = [m[2:-2] for m in marks]
        if self.source_code is not None:
            raise UserError(f"task.source_code: {type(tok).__name__} marks the target language alone (a >>code<< "
                            "token before each source); leave task.source_code unset")
        (hint_key, hint) = self.language_hints()[1]
        key, wanted = ("task.target_code", self.target_code) if self.target_code is not None else (hint_key, hint)
        written = next((m for m in marks if (self.prefix or "").startswith(m)), None)
        code = pick_code(codes, wanted.strip("<>"), key, "task.target_code", tok) if wanted is not None else None
        if written is not None and code is not None and written != f">>{code}<<":
            raise UserError(f"task.prefix: it begins with {written}, the target language mark, and {key} says "
                            f"{wanted} ({'>>' + code + '<<'}); keep one of them")
        if written is None and code is None:
            raise UserError(f"task.target_code: the tokenizer ({type(tok).__name__}) translates into the language a "
                            f"token before each source names ({', '.join(marks[:4])}, ...: {len(marks)}), and the "
                            "recipe names none; set task.target_code")
        self._mark = "" if written is not None else f">>{code}<< "

    def decoding_start(self, model: Any, tok: Any) -> dict[str, Any]:
        """How an encoder-decoder's generation starts: as training's decoder input starts (the
        collator's `decoder_inputs` on the labels). Its first token is the one the labels are
        shifted behind (`config.decoder_start_token_id`; mBART's target code, which its labels end
        with and the shift puts first): `generate` read generation_config's, and a checkpoint
        whose generation_config.json names none (written by hand or by another tool) started
        from its bos_token_id (BART's <s> where training fed </s>: exit 0) or, without one, was
        a ValueError traceback after training. Where the tokenizer marks targets with a language
        code the labels begin with (mBART-50, M2M100, NLLB), that code is forced as the first
        generated token, as run_translation's `forced_bos_token_id` (without it the model chose
        its output's language). {} for a decoder-only model."""
        if self.decoder_only:
            return {}
        labels = tok(text_target="a")["input_ids"]
        start = {"decoder_start_token_id": int(decoder_inputs(model, torch.tensor([labels]), tok.pad_token_id)[0, 0])}
        codes = language_codes(tok)
        if codes is None:  # the first generated token stays the checkpoint's (forced_bos_token_id)
            return start
        return {**start, "forced_bos_token_id": labels[0] if labels[0] in code_ids(tok, codes) else None}

    # --- encoding ----------------------------------------------------------------------------
    def read_columns(self) -> list[str]:
        return ["source"]

    def encode(self, dataset: Any, tokenizer: Any) -> Any:
        self._tokenizer = tokenizer
        self.set_languages(tokenizer)
        prefix, suffix = self.affixes()
        rows = dataset.to_list()
        sources = [self.source_text(r) for r in rows]
        targets = [self.target_text(r) for r in rows]
        others = [t for r in rows for t in self.other_references(r)]  # scored, not taught
        self._note_case(tokenizer, targets + others)
        self._note_unknown(tokenizer, targets + others)
        if others:  # a reference past the generation budget is one no output can reach, as a target is
            self.note_budget(self._budget_lengths(tokenizer, others))
        if self.in_context is not None:
            features = self._encode_in_context(tokenizer, sources, targets, prefix, suffix)
        else:
            self._check_prefix_room(tokenizer, prefix, suffix)
            self._check_target_room(tokenizer)
            enc = self._encode_decoder_only if self.decoder_only else self._encode_seq2seq
            features = enc(tokenizer, [prefix + s for s in sources], targets, suffix)
        features["example_index"] = list(range(len(rows)))
        from datasets import Dataset

        encoded = Dataset.from_dict(features)
        lengths = [len(x) for x in features.get("prompt_ids", features["input_ids"])]
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # longest first: even batches
        return encoded.select(order)

    def _note_case(self, tok: Any, targets: list[str]) -> None:
        """A tokenizer that lower-cases (an uncased BERT's, MiniLM2MiniLM's) gives a model that
        never writes a capital, and a case-sensitive score (sacreBLEU's BLEU and chrF, as published)
        counts each capital of the references as a miss: Multi30k's scores were lowered with no
        word, exit 0. Said once, where references with capitals are encoded (a run's splits,
        eval's; not predict's inputs, which have none). The score itself stays as published."""
        if not self.case_sensitive or not any(any(ch.isupper() for ch in t) for t in targets):
            return
        back = lowercased(tok)
        if back is None:
            return
        self.note("lower-cased", f"the tokenizer ({type(tok).__name__}) lower-cases text ({CASE_PROBE!r} decodes as "
                  f"{back!r}), so the "
                  f"model writes no capitals, and {self.case_sensitive} (sacreBLEU, case-sensitive as published) count "
                  "every capital of the references as a miss: the scores are lower than the text deserves; use a "
                  "checkpoint with a cased tokenizer, or rescore the run's predictions*.jsonl with sacreBLEU's "
                  "lowercase option (-lc), which the toolkit does not apply")

    def scored_character(self, ch: str) -> bool:
        """Whether the task's score reads character `ch` (sacreBLEU's BLEU and chrF read every
        one but whitespace; ROUGE and SQuAD's normalisation read fewer)."""
        return True

    def _note_unknown(self, tok: Any, references: list[str]) -> None:
        """Count the references holding characters the tokenizer reads as its unknown token
        (`models.unknown_characters`: T5's SentencePiece has no `{`, `~`, `<`, `ï`, and no
        Japanese or Chinese): the model is taught the unknown token for them and `generate`'s
        text drops it (`skip_special_tokens`), so no output can hold them and every score counts
        them as misses (a T5 translation into Japanese scored BLEU near 0, exit 0). Summed over
        the splits encoded, said once (`notices`), as a lower-casing tokenizer is (`_note_case`)."""
        chars = [c for c in unknown_characters(tok, references) if self.scored_character(c)]
        done, total, seen = self.__dict__.get("_unknown", (0, 0, ()))
        unknown = set(chars)
        hit = sum(not unknown.isdisjoint(t) for t in references) if chars else 0
        self._unknown = (done + hit, total + len(references), tuple(dict.fromkeys([*seen, *chars])))

    # in-context prompting (method icl): set on the instance before each eval split is encoded
    in_context: ClassVar[InContext | None] = None

    def prompt_in_context(self, demonstrations: list[list[tuple[str, str]]], separator: str, limit: int,
                          encode: Callable[[list[str]], list[list[int]]]) -> InContext:
        """From now on, encode prompts for in-context prompting (`InContext`); returned, to read
        its counts after encoding."""
        self.in_context = InContext(demonstrations, separator, limit, encode)
        return self.in_context

    def _encode_in_context(self, tok: Any, sources: list[str], targets: list[str], prefix: str,
                           suffix: str) -> dict:
        """Prompts as lm-evaluation-harness builds and cuts a generate_until request: each row's
        own demonstrations (`doc_to_text`, the target delimiter " ", the target), the separator
        between them, then the row's `prefix + source + suffix`; encoded whole with the
        tokenizer's own special tokens (`InContext.encode`), and only cut from the left: a
        decoder's prompt to `limit - new tokens` (room for what it generates), an encoder's to
        `limit`. The source is not cut at task.max_length (the harness cuts nothing else)."""
        ic = self.in_context
        parts = [[f"{prefix}{s}{suffix} {t}" for s, t in demos] + [f"{prefix}{src}{suffix}"]
                 for src, demos in zip(sources, ic.demonstrations)]
        texts = [ic.separator.join(p) for p in parts]
        ids = ic.encode(texts) if self.decoder_only else [list(x) for x in tok(texts)["input_ids"]]
        keep = ic.limit - self.new_tokens() if self.decoder_only else ic.limit
        if keep <= 0:
            raise UserError(f"method.max_length: {ic.limit} tokens leave no room for a prompt before the "
                            f"{self.new_tokens()} generated (generation.max_new_tokens, else "
                            "task.max_target_length); raise it or lower those")
        for p, x in zip(parts, ids):  # what a cut loses: whole demonstrations first, the example last
            gone = parts_lost(tok, p, ic.separator, len(x) - keep, len(x))
            ic.cut, ic.lost, ic.own = ic.cut + (len(x) > keep), ic.lost + min(gone, len(p) - 1), ic.own + (gone >= len(p))
            ic.had += (len(x) > keep) * (len(p) - 1)
        ic.total += len(ids)
        prompts = [x[-keep:] for x in ids]
        if not self.decoder_only:
            labels = self.tokenize(tok, text_target=targets, limit=self.max_target_length)
            self.note_cut(self.names[1], "task.max_target_length", self.max_target_length, labels["cut"])
            self.note_budget([written(t, tok) for t in labels["input_ids"]])
            return {"input_ids": prompts, "attention_mask": [[1] * len(p) for p in prompts],
                    "labels": labels["input_ids"]}
        return self._join_answers(tok, prompts, targets, ic.limit)

    def _check_prefix_room(self, tok: Any, prefix: str, suffix: str) -> None:
        """The prefix is kept whole and the source after it is cut to fit task.max_length (with
        the tokenizer's special tokens, a decoder's BOS, an encoder's suffix): a prefix that fills
        it left no source at all, and every example was trained and scored on the prefix alone
        (exit 0, said as sources "cut ... the rest is not seen"). One line, as for the suffix."""
        if not prefix:
            return
        size = len(tok(prefix, add_special_tokens=False)["input_ids"])
        if self.decoder_only:
            taken, what = len(leading_special(tok)), "the tokenizer's BOS"
        else:
            before, after = special_frame(tok)
            suf = len(continued(tok, [suffix])[0]) if suffix else 0
            taken, what = len(before) + len(after) + suf, "the tokenizer's special tokens and task.suffix"
        if taken < self.max_length <= size + taken:  # a suffix that fills it alone is the suffix's line
            raise UserError(f"task.prefix: its {size} tokens and the {taken} of {what} leave no room for the source "
                            f"in task.max_length {self.max_length}: every example would be read as the prefix alone; "
                            f"raise task.max_length above {size + taken} or shorten task.prefix")

    def _check_target_room(self, tok: Any) -> None:
        """An encoder-decoder's target is its tokenizer's special tokens around the text (BART's
        <s> and </s>, T5's </s>, M2M100's language code and </s>) within task.max_target_length:
        a length they fill leaves no target token, and every example trained to write nothing
        (exit 0), or at a length below them the tokenizer does not cut at all (BART at 1: the
        targets whole, past the length the positions and the generation budget were checked
        against). One line, as for a prefix that fills task.max_length. A decoder-only model's
        EOS comes after the max_target_length text tokens."""
        if self.decoder_only:
            return
        special = len(tok(text_target="a")["input_ids"]) - len(tok("a", add_special_tokens=False)["input_ids"])
        if self.max_target_length <= special:
            raise UserError(f"task.max_target_length: {self.max_target_length} is filled by the {special} special "
                            f"token{'s' * (special > 1)} the tokenizer ({type(tok).__name__}) puts around every target, "
                            f"leaving none for its text; raise it above {special}")

    def _encode_seq2seq(self, tok: Any, sources: list[str], targets: list[str], suffix: str) -> dict:
        """The encoder reads the tokenizer's special tokens around prefix + source + suffix, the
        source alone cut to fit task.max_length: the suffix is kept whole, as a decoder's prompt
        keeps it (cut with the source, a long document lost the instruction after it, exit 0)."""
        if suffix:
            enc = self._cut_before_suffix(tok, sources, suffix)
        else:
            enc = self.tokenize(tok, sources, limit=self.max_length)
        self.note_cut(self.names[0], "task.max_length", self.max_length, enc["cut"])
        labels = self.tokenize(tok, text_target=targets, limit=self.max_target_length)
        self.note_cut(self.names[1], "task.max_target_length", self.max_target_length, labels["cut"])
        self.note_budget([written(t, tok) for t in labels["input_ids"]])
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                "labels": labels["input_ids"]}

    def _cut_before_suffix(self, tok: Any, sources: list[str], suffix: str) -> dict:
        """An encoder's ids of each source and `suffix` within task.max_length, the source cut."""
        before, after = special_frame(tok)
        suf = continued(tok, [suffix])[0]
        room = self.max_length - len(before) - len(suf) - len(after)
        if room < 1:
            raise UserError(f"task.suffix: its {len(suf)} tokens and the tokenizer's {len(before) + len(after)} "
                            f"special tokens leave no room for the source in task.max_length {self.max_length}; "
                            "raise task.max_length or shorten task.suffix")
        enc = self.tokenize(tok, sources, limit=room, add_special_tokens=False)
        ids = [before + s + suf + after for s in enc["input_ids"]]
        return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids], "cut": enc["cut"]}

    def _encode_decoder_only(self, tok: Any, sources: list[str], targets: list[str], suffix: str) -> dict:
        """prompt = what the tokenizer puts before a text (`leading_special`: BOS where it adds
        one) + source, cut together at task.max_length, + suffix; input = prompt + target + EOS;
        loss on the target. Without the BOS a Llama/Gemma/OPT decoder trained, scored and
        predicted from prompts it never read in pretraining, and its export, prompted through
        its own tokenizer (transformers' pipeline, TRL), read another sequence than the run."""
        lead = leading_special(tok)
        enc = self.tokenize(tok, sources, limit=self.max_length - len(lead), add_special_tokens=False)
        self.note_cut(self.names[0], "task.max_length", self.max_length, enc["cut"])
        suf = continued(tok, [suffix])[0] if suffix else []
        return self._join_answers(tok, [lead + s + suf for s in enc["input_ids"]], targets)

    def _join_answers(self, tok: Any, prompts: list[list[int]], targets: list[str],
                      limit: int | None = None) -> dict:
        """A decoder's sequences: prompt, then " " + target as it continues the prompt (`continued`:
        a legacy SentencePiece's " yes" alone is "▁" "▁yes", after a prompt "▁yes"), cut at
        max_target_length, and EOS, the loss on the answer alone; with `limit`, a sequence longer
        than it loses its first tokens (the prompt that `generate` reads stays whole: it was cut
        to leave the generated room)."""
        answers = continued(tok, [" " + t for t in targets])
        self.note_cut(self.names[1], "task.max_target_length", self.max_target_length,
                      [len(a) > self.max_target_length for a in answers])
        enc = {"input_ids": [a[:self.max_target_length] for a in answers]}
        self.note_budget([len(t) for t in enc["input_ids"]])  # the text's tokens: the EOS after them adds no text
        out: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "prompt_ids": []}
        end = text_end(tok)  # the answer was closed with the EOS id alone: None in every sequence under a
        # tokenizer without one (a GPT-2 on BERT's vocabulary), a TypeError traceback at the first batch
        if end is None:
            raise UserError(f"model.checkpoint: its tokenizer ({type(tok).__name__}) has no eos_token (nor a "
                            "sep_token) to end each answer with, so the model could not learn where an answer "
                            "ends; set eos_token in its tokenizer_config.json")
        for prompt, t in zip(prompts, enc["input_ids"]):
            answer = t + [end]
            start = max(0, len(prompt) + len(answer) - limit) if limit else 0  # tokens cut from the left
            seq, labels = (prompt + answer)[start:], ([IGNORE] * len(prompt) + answer)[start:]
            out["prompt_ids"].append(prompt)
            out["input_ids"].append(seq)
            out["attention_mask"].append([1] * len(seq))
            out["labels"].append(labels)
        return out

    def _budget_lengths(self, tok: Any, texts: list[str]) -> list[int]:
        """The tokens of `texts` as `note_budget` counts a target's: an encoder-decoder's labels
        up to their EOS (`written`), a decoder's answer tokens, each cut at max_target_length."""
        if self.decoder_only:
            return [min(len(a), self.max_target_length) for a in continued(tok, [" " + t for t in texts])]
        labels = self.tokenize(tok, text_target=texts, limit=self.max_target_length)
        return [written(t, tok) for t in labels["input_ids"]]

    def note_budget(self, lengths: list[int]) -> None:
        """Count targets longer than the generation budget (summed over the splits encoded): with
        `max_new_tokens` set below `max_target_length`, their outputs stop short of them."""
        done, total = self.__dict__.get("_over_budget", (0, 0))
        budget = self.new_tokens()
        self._over_budget = (done + sum(n > budget for n in lengths), total + len(lengths))

    def notices(self, run: bool = True) -> dict[str, str]:
        lines = super().notices(run)
        done, total = self.__dict__.get("_over_budget", (0, 0))
        if done:
            lines["over budget"] = (f"{done} of {total} {self.names[1]} are longer than generation.max_new_tokens="
                                    f"{self.new_tokens()} tokens: outputs stop there, short of them (lower "
                                    f"scores); leave it unset to generate up to task.max_target_length "
                                    f"({self.max_target_length})")
        done, total, chars = self.__dict__.get("_unknown", (0, 0, ()))
        if done:
            tok = self.__dict__.get("_tokenizer")
            shown = " ".join(repr(c) for c in chars[:8]) + (f" and {len(chars) - 8} more" if len(chars) > 8 else "")
            lines["unknown characters"] = (
                f"{done} of {total} {self.names[1]} hold characters the tokenizer ({type(tok).__name__}) reads as its "
                f"unknown token {getattr(tok, 'unk_token', None)!r} ({shown}): the model cannot write them (the unknown "
                f"token decodes to no text), and the scores count each as a miss; use a checkpoint whose tokenizer "
                f"covers them")
        return lines

    def collator(self, tokenizer: Any, model: Any = None) -> Any:
        return TextToTextCollator(tokenizer, model, self.decoder_only)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v for k, v in batch.items() if k != "labels" and k not in EXTRA}

    # --- evaluation --------------------------------------------------------------------------
    def eval_step(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        outputs = model(**self.model_inputs(batch))
        return {"loss": self.loss(outputs, batch).float(), "units": self.units(batch).float(),
                "example_index": batch["example_index"], "generated": self.generate(model, batch)}

    @no_grad
    def generate(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(b, new tokens) generated ids; a decoder-only model's prompt is cut off."""
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module  # generate() is the wrapped model's; nothing trains here
        tok = self._tokenizer
        kwargs = {**self.generation.kwargs(self.max_target_length), "pad_token_id": tok.pad_token_id,
                  "eos_token_id": self.end_ids(model, tok), **self.decoding_start(model, tok),
                  "synced_gpus": shards_weights(model)}  # every process runs as many forwards
        self._decoding = decoding_used(model, kwargs)
        stops = self.in_context.stops if self.in_context is not None else []
        if self.decoder_only:
            ids, mask = batch["prompt_ids"], batch["prompt_mask"]
            lengths = mask.sum(-1)  # (b,)
            # probed on the first batch whatever its lengths: every process runs the probe's forward alike
            reads = reads_padding(model, ids[int(lengths.argmax())].tolist(), tok.pad_token_id) \
                or reads_input(model, kwargs, PROMPT_READ)

            def run(i: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
                return self._generate_decoder(model, i, m, kwargs, stops)
        else:
            ids, mask = batch["input_ids"], batch["attention_mask"]
            reads = reads_input(model, kwargs, ENCODER_READ)
            if stops:
                kwargs["stopping_criteria"] = stop_at(tok, stops, 0)

            def run(i: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
                return model.generate(input_ids=i, attention_mask=m, **kwargs)
        calls = len(set(mask.sum(-1).tolist())) if reads else 1  # `generate` calls: one per input length
        if kwargs["synced_gpus"]:  # as many on every process: each call's forwards gather the weights
            for _ in range(most_across(calls, ids.device) - calls):
                run(ids, mask)  # a peer's extra call; its text unused
        return self._generate_by_length(ids, mask, run) if calls > 1 else run(ids, mask)

    def _generate_decoder(self, model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                          kwargs: dict[str, Any], stops: list[str]) -> torch.Tensor:
        """(b, new tokens) a decoder-only model writes after its left-padded prompts `ids`."""
        kwargs = dict(kwargs)
        # the ban (the recipe's, else the checkpoint's) is the continuation's alone: generate's own,
        # over the prompt too, is off (a GPT-2 saved with 3 banned the prompt's 3-grams)
        size, kwargs["no_repeat_ngram_size"] = in_effect(model, kwargs, "no_repeat_ngram_size"), 0
        if size:  # within the continuation, as an encoder-decoder's decoder has it
            kwargs["logits_processor"] = continuation_no_repeat(size, ids.shape[1])
        if stops:
            kwargs["stopping_criteria"] = stop_at(self._tokenizer, stops, ids.shape[1])
        out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        return out[:, ids.shape[1]:]  # (b, new) left padding: every prompt ends at the same column

    def _generate_by_length(self, ids: torch.Tensor, mask: torch.Tensor,
                            run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """`run` (one `generate` call) on the rows of each input length together, unpadded, their
        outputs padded back to one width: for a decoder that reads its padding
        (`models.reads_padding`), or a decoding that reads the input's tokens (`reads_input`). A
        decoder's prompts are padded on the left, an encoder's inputs on the right."""
        lengths = mask.sum(-1).tolist()
        pad = self._tokenizer.pad_token_id
        cut = (lambda t, n: t[:, -n:]) if self.decoder_only else (lambda t, n: t[:, :n])
        outs = {n: (rows, run(cut(ids[rows], n), cut(mask[rows], n)))
                for n in set(lengths) for rows in [[i for i, m in enumerate(lengths) if m == n]]}
        width = max(o.shape[1] for _, o in outs.values())
        out = torch.full((len(lengths), width), pad, dtype=ids.dtype, device=ids.device)  # (b, new)
        for rows, o in outs.values():
            out[rows, :o.shape[1]] = o
        return out

    def metric_info(self) -> dict[str, str]:
        """The decoding the scores are of (`decoding_used`), once anything was generated: the
        recipe's settings and what it leaves to the checkpoint's generation_config, which the
        recipe alone does not say."""
        used = self.__dict__.get("_decoding")
        return {**super().metric_info(), **({"generation": used} if used else {})}

    def end_ids(self, model: Any, tok: Any) -> list[int] | None:
        """Where generation ends: the checkpoint's generation_config eos_token_id and the token
        every target was trained to end with (the tokenizer's EOS, which a decoder's answer gets
        appended and an encoder-decoder's labels end with; BERT's [SEP] where it has none). With
        the latter missing (a tokenizer set to end on another token than the config, a config
        with none) the model wrote on past the answer's end to max_new_tokens, and that text,
        the end token skipped, was scored and predicted."""
        saved = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        ends = [] if saved is None else [saved] if isinstance(saved, int) else list(saved)
        trained = text_end(tok) if tok is not None else None
        ends += [trained] if trained is not None and trained not in ends else []
        return ends or None

    def decoded(self, outputs: dict[str, np.ndarray]) -> list[str]:
        """Generated texts in raw order (the loop gathered them in encoded, length-sorted, order)."""
        ids = outputs["generated"].astype(np.int64)
        ids[ids < 0] = self._tokenizer.pad_token_id  # -100 filled where batches were narrower
        texts = decode_texts(self._tokenizer, ids, self.in_context.stops if self.in_context is not None else ())
        order = np.argsort(outputs["example_index"], kind="stable")
        return [texts[i] for i in order]

    def predictions(self, outputs: dict[str, np.ndarray], raw: Any) -> list[dict] | None:
        preds, refs, rows = self.decoded(outputs), self.references(raw), raw.to_list()
        ids = [str(r.get("id", i)) for i, r in enumerate(rows)]
        return [{"id": i, "source": self.source_text(r), "references": list(ref),
                 "prediction": p} for i, r, ref, p in zip(ids, rows, refs, preds)]

    # --- prediction on new inputs (`toolkit predict`, the API's predict) -------------------------
    predicts = True

    def source_name(self) -> str:
        """The source field by the name the task's data gives it (summarization: the preset's or
        task.source_field; translation: the source language code)."""
        return "source"

    def found_source(self) -> str | None:
        """The source field a run on your own files found in them (`pick_fields`) when the recipe
        names none: found again, the same way, in the recipe's file (the found names are kept off
        the settings, so the recipe's hash stays as written). None where no such file is left."""
        if "_found_fields" in self.__dict__:
            return self.__dict__["_found_fields"][0]
        for role, name in (("eval", getattr(self, "eval_file", None)), ("train", getattr(self, "train_file", None))):
            if name and "{lang}" not in name and Path(self.expand(name)).is_file():
                self.read(name, role)
                return self.__dict__.get("_found_fields", (None,))[0]
        return None

    def predict_fields(self, model: Any) -> list[str]:
        """The source alone: new inputs carry no reference."""
        return [self.source_name()]

    def raw_input(self, row: dict) -> dict:
        """A user's row in the raw schema `encode` reads (an empty target: nothing is scored)."""
        return {"source": str(row[self.source_name()]), "target": ""}

    def predict(self, model: Any, tokenizer: Any, rows: list[dict]) -> list[dict]:
        """Per row its input fields and the generated `prediction`, decoded as the evaluation
        decodes it: the same prompt (task.prefix/suffix, the source cut at task.max_length
        tokens) and the recipe's generation settings."""
        names = self.predict_fields(model)
        texts = self.generate_texts(model, tokenizer, [self.raw_input(r) for r in rows])
        return [{**{n: r[n] for n in names}, "prediction": t} for r, t in zip(rows, texts)]

    def generate_texts(self, model: Any, tokenizer: Any, raw: list[dict], batch_size: int = 16) -> list[str]:
        """Generated text per raw row, in order: encoded and batched as in evaluation (longest
        first, a decoder's prompt left-padded), through the task's own `generate`."""
        from datasets import Dataset

        encoded = self.encode(Dataset.from_list(raw), tokenizer)
        collate, device = self.collator(tokenizer, model), next(model.parameters()).device
        found: dict[int, str] = {}
        for start in range(0, len(encoded), batch_size):
            batch = collate([encoded[i] for i in range(start, min(start + batch_size, len(encoded)))])
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            found.update(zip(batch["example_index"].tolist(), decode_texts(tokenizer, self.generate(model, batch))))
        return [found[i] for i in range(len(raw))]


def written(labels: list[int], tok: Any) -> int:
    """How many tokens `generate` writes before an encoder-decoder's target is all written: its
    labels up to its end token (EOS), which decodes to no text. BART's <s> and mBART-50's language
    code are written first (forced or learnt) and count; mBART-cc25's code after the EOS is the
    decoder's start token and is never written. Counted with its EOS and code, a target exactly
    as long as the budget was said to be cut (mBART-cc25's by two tokens, the others' by one)."""
    end = tok.eos_token_id
    return labels.index(end) if end is not None and end in labels else len(labels)


def language_codes(tok: Any) -> list[str] | None:
    """The language codes a tokenizer marks its texts with, where it does (those transformers'
    translation pipeline hands `src_lang` / `tgt_lang` to: mBART, mBART-50, M2M100, NLLB); None
    for others."""
    if not callable(getattr(tok, "_build_translation_inputs", None)) or not hasattr(tok, "src_lang"):
        return None
    table = getattr(tok, "lang_code_to_id", None)
    if isinstance(table, dict) and table:
        return [str(c) for c in table]
    extra = getattr(tok, "extra_special_tokens", None)  # NLLB's codes
    if not isinstance(extra, list):
        return None
    vocab = tok.get_vocab()
    return [str(t) for t in extra if str(t) in vocab] or None


def code_ids(tok: Any, codes: list[str]) -> set[int]:
    """The ids of a tokenizer's language codes (M2M100's `en` is the token `__en__`)."""
    table = getattr(tok, "lang_code_to_id", None) or {}
    return {table[c] if c in table else tok.convert_tokens_to_ids(c) for c in codes}


def target_marks(tok: Any) -> list[str]:
    """The `>>code<<` tokens a multi-target Marian tokenizer reads the target language from."""
    marks = getattr(tok, "supported_language_codes", None)
    return [str(m) for m in marks] if isinstance(marks, list) else []


def pick_code(codes: list[str], wanted: str, key: str, own_key: str, tok: Any) -> str:
    """The tokenizer's code for `wanted` (from recipe key `key`): itself (case, `-` or `_`
    ignored), or for a bare language (`en`) the one code of that language (mBART-50's `en_XX`);
    else one line asking for `own_key` (task.source_code / task.target_code)."""
    tag = language_tag(wanted)
    same = [c for c in codes if language_tag(c) == tag]
    if not same and len(tag) == 1:
        same = [c for c in codes if language_tag(c)[:1] == tag]
    if len(same) == 1:
        return same[0]
    near = [c for c in codes if tag and language_tag(c)[:1] == tag[:1]]
    listed = f"its codes of that language: {', '.join(near)}" if near else f"e.g. {', '.join(codes[:4])}"
    fix = f"set {own_key} to the tokenizer's code" if own_key != key else "use one of them"
    raise UserError(f"{key}: {wanted!r} is not one of the {len(codes)} language codes the tokenizer "
                    f"({type(tok).__name__}) marks texts with ({listed}); {fix}")


SPACING_PROBE = "yes, it's here. isn't it? no!"  # lower case: uncased tokenizers give it back too


def decode_texts(tokenizer: Any, ids: Any, stops: Any = ()) -> list[str]:
    """Generated ids -> the text that is scored and written, as transformers' run_summarization
    and run_translation decode (`batch_decode(..., skip_special_tokens=True)`, stripped), with
    transformers' clean-up of spaces before punctuation only where the tokenizer's decoding
    needs it (`respaces`). Those scripts score against labels decoded the same way; here the
    references are the data's own text (what sacreBLEU asks for), so the prediction is held to
    the text the model wrote: T5's decoding cleaned up turned a tokenised reference's "it 's ."
    or a French "Bonjour !" the model reproduced into "it's." and "Bonjour!".
    With `stops` (in-context prompting), each text ends before the first of them it holds, as
    lm-evaluation-harness's generate_until cuts a continuation at its `until` strings. A
    tokenizer's language codes (`language_codes`) are dropped: generation starts with the
    target's, which is no part of the text, whether the tokenizer lists it as special or not."""
    codes = language_codes(tokenizer)
    if codes:  # the target's language code is no text, special token or not (M2M100's `__de__` may not be)
        pad, drop = tokenizer.pad_token_id, code_ids(tokenizer, codes)
        ids = [[pad if i in drop else i for i in row] for row in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=respaces(tokenizer))
    for stop in (s for s in stops if s):
        texts = [t.split(stop, 1)[0] for t in texts]
    return [t.strip() for t in texts]


def respaces(tokenizer: Any) -> bool:
    """Whether the tokenizer's decoding puts a space between every two tokens (WordPiece: "it ' s
    here ."), which transformers' clean-up undoes. A tokenizer that gives back the text it read
    (byte-level BPE, SentencePiece) keeps its spaces: there the clean-up deletes spaces the
    model wrote (transformers 5 already refuses it for BPE, not for SentencePiece)."""
    ids = tokenizer(SPACING_PROBE, add_special_tokens=False)["input_ids"]
    if tokenizer.decode(ids, clean_up_tokenization_spaces=False).strip() == SPACING_PROBE:
        return False
    return tokenizer.decode(ids, clean_up_tokenization_spaces=True).strip() == SPACING_PROBE


DECODING = ("num_beams", "max_new_tokens", "length_penalty", "no_repeat_ngram_size", "early_stopping", "min_length",
            "min_new_tokens", "repetition_penalty", "encoder_repetition_penalty", "encoder_no_repeat_ngram_size",
            "exponential_decay_length_penalty")


def in_effect(model: Any, kwargs: dict[str, Any], name: str) -> Any:
    """Generation setting `name` as `generate` reads it: `kwargs`' where given, else the model's
    generation_config, else transformers' default."""
    from transformers import GenerationConfig

    if name in kwargs:
        return kwargs[name]
    value = getattr(getattr(model, "generation_config", None), name, None)
    return GenerationConfig._get_default_generation_params().get(name) if value is None else value


def decoding_used(model: Any, kwargs: dict[str, Any]) -> str:
    """`generate`'s decoding as it reads it (`in_effect`: the recipe's, else the checkpoint's),
    for metric_info: `num_beams:4|max_new_tokens:128|...`; the first five as they were recorded
    before the constraints followed the checkpoint, then those, then the length decay where it is
    in effect (a run without one records what it recorded before)."""
    used = {k: list(v) if isinstance(v, tuple) else v for k in DECODING for v in [in_effect(model, kwargs, k)]}
    return "|".join(f"{k}:{v}" for k, v in used.items() if k != DECODING[-1] or v is not None)


# the settings whose logits processors read `generate`'s input as tokens, and the value at which they read
# nothing (`reads_input`): a decoder-only model's prompt (its width counted as length by min_length) ...
PROMPT_READ = {"min_length": 0, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
               "encoder_no_repeat_ngram_size": 0}
# ... and an encoder-decoder's source
ENCODER_READ = {"encoder_repetition_penalty": 1.0, "encoder_no_repeat_ngram_size": 0}


def reads_input(model: Any, kwargs: dict[str, Any], settings: dict[str, Any]) -> bool:
    """Whether `generate` (with `kwargs` over the model's generation_config: `in_effect`) reads its
    input's tokens through one of `settings` (`PROMPT_READ`, `ENCODER_READ`). A padded input holds
    the pad token and is as wide as its batch's longest: a decoder's `min_length` (which counts
    the prompt) was met by a batch-mate's length (9 tokens alone, 1 beside a longer prompt), and
    the pad was penalised or favoured as a token of the input (T5's encoder_repetition_penalty
    made a padded row write pad tokens alone: an empty text, where alone it wrote words), so an
    example's text moved with its batch and its size, exit 0. Such a decoding runs one input
    length at a time (`TextToText._generate_by_length`), as transformers reads an unpadded input.
    `no_repeat_ngram_size` reads a decoder's continuation alone here (`continuation_no_repeat`)."""
    return any(in_effect(model, kwargs, name) not in (None, neutral) for name, neutral in settings.items())


def continuation_no_repeat(size: int, start: int) -> Any:
    """transformers' NoRepeatNGramLogitsProcessor over the tokens from column `start` on.

    `generate` bans every n-gram of `input_ids`, and a decoder-only model's input_ids begin with
    the prompt (and its left padding): `no_repeat_ngram_size: 3` forbade a GPT-2 summary every
    three words of the dialogue it summarises (names, phrases a summary copies), where for an
    encoder-decoder the same setting bans only repeats within the output. Left padding puts every
    prompt's end at one column, so the continuation starts at `start` in every row and beam."""
    from transformers import LogitsProcessor, LogitsProcessorList, NoRepeatNGramLogitsProcessor

    class Continuation(LogitsProcessor):
        inner = NoRepeatNGramLogitsProcessor(size)

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids[:, start:], scores)

    return LogitsProcessorList([Continuation()])


def stop_at(tokenizer: Any, stops: list[str], start: int) -> Any:
    """A StoppingCriteriaList that ends each row once its text from column `start` on holds one
    of `stops`, as lm-evaluation-harness's stop_sequences_criteria (the text, not the tokens: a
    stop may be written as several tokens). transformers' own `stop_strings` refuses a string no
    token of the vocabulary holds (T5 has no newline), where here it simply never matches."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    clean = respaces(tokenizer)  # decoded as decode_texts decodes, whatever the tokenizer was saved with

    class Stop(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            texts = tokenizer.batch_decode(input_ids[:, start:], skip_special_tokens=True,
                                           clean_up_tokenization_spaces=clean)
            return torch.tensor([any(s in t for s in stops) for t in texts], device=input_ids.device)

    return StoppingCriteriaList([Stop()])


class TextToTextCollator:
    """Pads a batch for training and generation.

    Encoder-decoder: what DataCollatorForSeq2Seq gives (labels -100, decoder inputs built by the
    model's `prepare_decoder_input_ids_from_labels`), always padded on the right. That collator
    pads on the tokenizer's `padding_side`: a checkpoint saved padding left (as one prepared for a
    decoder's generation is) had its labels left-padded, so the decoder read padding after its
    start token and before the target (T5's loss moved with the batch), and BART's learnt
    positions moved with each batch's padding: scores that changed with the eval batch size and
    that side (ROUGE-1 0.007 at batch 1, 0.026 at 3, on the same BART weights). Decoder
    only: inputs right-padded for the loss, the prompt alone left-padded for `generate`, and
    `logits_to_keep`: how many positions at the end of the sequence the loss needs logits for
    (from the position before the batch's first target token). The prompt's positions are -100
    in the labels, so their logits were computed and thrown away: the LM head is the largest
    matmul of a small decoder (GPT-2's 50,257-word projection), and a 128-token prompt before a
    32-token summary spent four fifths of it on the prompt. transformers' causal LMs slice the
    hidden states before the head (`logits_to_keep`, what `generate` uses for the last token);
    counting from the end keeps it right under PEFT's soft prompts, which prepend positions.
    `token_losses` lines the kept logits up with the labels' last positions."""

    def __init__(self, tokenizer: Any, model: Any, decoder_only: bool) -> None:
        self.tok, self.decoder_only, self.model = tokenizer, decoder_only, model
        self.keep_logits = decoder_only and keeps_logits(model)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        index = torch.tensor([f["example_index"] for f in features])
        pad = self.tok.pad_token_id
        if not self.decoder_only:  # on the right, whatever the tokenizer's padding_side
            batch = {"input_ids": _pad([f["input_ids"] for f in features], pad, left=False),
                     "attention_mask": _pad([f["attention_mask"] for f in features], 0, left=False),
                     "labels": _pad([f["labels"] for f in features], IGNORE, left=False)}
            if self.model is not None:
                batch["decoder_input_ids"] = decoder_inputs(self.model, batch["labels"], pad)
            return {**batch, "example_index": index}
        batch = {"input_ids": _pad([f["input_ids"] for f in features], pad, left=False),
                 "attention_mask": _pad([f["attention_mask"] for f in features], 0, left=False),
                 "labels": _pad([f["labels"] for f in features], IGNORE, left=False),
                 "prompt_ids": _pad([f["prompt_ids"] for f in features], pad, left=True),
                 "prompt_mask": _pad([[1] * len(f["prompt_ids"]) for f in features], 0, left=True)}
        if self.keep_logits:
            labelled = (batch["labels"] != IGNORE).any(0).nonzero()  # (n, 1) columns with a target token
            if len(labelled):  # logits from the position that predicts the first target token on
                width = batch["labels"].shape[1]
                batch["logits_to_keep"] = min(width, width - int(labelled[0, 0]) + 1)
        return {**batch, "example_index": index}


def keeps_logits(model: Any) -> bool:
    """Whether `model` (or the model PEFT wraps) takes transformers' `logits_to_keep`."""
    import inspect

    if model is None:
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def _pad(rows: list[list[int]], value: int, left: bool) -> torch.Tensor:
    width = max(len(r) for r in rows)
    padded = [([value] * (width - len(r)) + list(r)) if left else (list(r) + [value] * (width - len(r)))
              for r in rows]
    return torch.tensor(padded, dtype=torch.long)  # (b, width)
