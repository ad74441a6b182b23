"""Name -> plug-in lookup shared by methods, tasks and attention modules."""

from __future__ import annotations

import difflib
import unicodedata
from typing import Callable, Generic, TypeVar

from toolkit.errors import UserError

T = TypeVar("T")


def _folded(name: str) -> str:
    """A name without its case and its compatibility forms (fullwidth `ＬＲ` is `lr`)."""
    return unicodedata.normalize("NFKC", name).casefold()


def did_you_mean(name: str, choices: list[str]) -> str:
    """A ' (did you mean X?)' suffix, or the list of valid choices when nothing is close. A name
    that differs from a choice in case alone is that choice (`train.LR`, `method.name=LoRA`,
    `task.subset=SST2` listed every choice: spelling's ratio of 'LR' to 'lr' is 0)."""
    folded = [c for c in choices if _folded(c) == _folded(name)]
    close = folded[:1] or difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    if close:
        return f" (did you mean '{close[0]}'?{' ' + _hidden(name) if _hidden(name) else ''})"
    return f" (choose from: {', '.join(sorted(choices))}{'; ' + _hidden(name) if _hidden(name) else ''})"


def _hidden(name: str) -> str:
    """'it holds U+200B, an invisible character' where a name holds one: pasted from a web page,
    `fp16<U+200B>` was said as "'fp16' is not allowed (did you mean 'fp16'?)", the difference unseen."""
    hidden = [c for c in name if not c.isprintable() and c != " "]
    return f"it holds U+{ord(hidden[0]):04X}, an invisible character" if hidden else ""


# Names users bring from transformers' TrainingArguments, its run_glue / run_qa / run_summarization /
# run_translation example scripts and PEFT's configs -> (where the toolkit keeps that setting, whose
# name it is). Read by the did-you-mean of unknown keys, before spelling-based guesses, which mislead
# for these.
FOREIGN_NAMES: dict[str, tuple[str, str]] = {
    "learning_rate": ("train.lr", "transformers'"),
    "num_train_epochs": ("train.epochs", "transformers'"),
    "per_device_train_batch_size": ("train.batch_size (per process)", "transformers'"),
    "per_device_eval_batch_size": ("train.eval_batch_size", "transformers'"),
    "gradient_accumulation_steps": ("train.grad_accum", "transformers'"),
    "lr_scheduler_type": ("not a setting: the schedule is linear decay after warmup (the Trainer's default)",
                          "transformers'"),
    "bf16": ("train.mixed_precision=bf16", "transformers'"),
    "fp16": ("train.mixed_precision=fp16", "transformers'"),
    "eval_steps": ("train.eval_every", "transformers'"),
    "eval_strategy": ("train.eval_every (0: each epoch, N: every N steps)", "transformers'"),
    "logging_steps": ("train.log_every", "transformers'"),
    "save_steps": ("train.save_every", "transformers'"),
    "evaluation_strategy": ("train.eval_every (0: each epoch, N: every N steps)", "transformers'"),
    "save_strategy": ("train.save_every (0: at each evaluation)", "transformers'"),
    "load_best_model_at_end": ("train.keep_best", "transformers'"),
    # Trainer's names for what the toolkit fixes: said, where spelling guessed a field of another
    # meaning (early_stopping_threshold -> early_stopping_patience, adam_epsilon -> mixed_precision)
    "greater_is_better": ("not a setting: each metric declares its direction (loss and perplexity "
                          "lower, scores higher)", "transformers'"),
    "early_stopping_threshold": ("not a setting: any improvement of train.metric restarts "
                                 "train.early_stopping_patience's count (EarlyStoppingCallback's threshold 0)",
                                 "transformers'"),
    "optim": ("not a setting: the optimizer is fused AdamW (adamw_torch_fused)", "transformers'"),
    "adam_beta1": ("not a setting: AdamW's betas are Trainer's defaults, 0.9 and 0.999", "transformers'"),
    "adam_beta2": ("not a setting: AdamW's betas are Trainer's defaults, 0.9 and 0.999", "transformers'"),
    "adam_epsilon": ("not a setting: AdamW's eps is Trainer's default, 1e-8", "transformers'"),
    "dataloader_drop_last": ("not a setting: no batch is dropped (a short last batch weighs by its examples)",
                             "transformers'"),
    "label_smoothing_factor": ("not a setting: the loss is the task's plain cross-entropy, Trainer's default 0 "
                               "(no label smoothing)", "transformers'"),
    "lr_scheduler_kwargs": ("not a setting: the schedule is linear decay after warmup (the Trainer's default)",
                            "transformers'"),
    "logging_first_step": ("not a setting: step 1 is always logged", "transformers'"),
    "data_seed": ("not a setting: train.seed orders the data (task.max_train_samples subsets with seed 0)",
                  "transformers'"),
    "metric_for_best_model": ("train.metric", "transformers'"),
    # guessed by spelling as eval_every / save_total_limit, settings of another meaning
    "eval_on_start": ("not a setting: nothing is evaluated before the first step; the first evaluation is at "
                      "step train.eval_every, or at the first epoch's end", "transformers'"),
    "eval_delay": ("not a setting: evaluations are at every train.eval_every steps from the first (0: each "
                   "epoch's end) and at the last step", "transformers'"),
    "save_only_model": ("not a setting: a checkpoint holds the optimizer, schedule and RNG states (exact resume); "
                        "model/ holds the weights alone", "transformers'"),
    "dataloader_num_workers": ("not a setting: batches are collated in the training process; the data order "
                               "is a function of train.seed and the epoch", "transformers'"),
    "torch_compile": ("train.compile", "transformers'"),
    "logging_strategy": ("train.log_every (optimizer steps)", "transformers'"),
    "output_dir": ("the --runs-dir flag", "transformers'"),
    "max_seq_length": ("task.max_length", "run_glue's"),
    "model_name_or_path": ("model.checkpoint", "run_glue's"),
    "validation_file": ("task.eval_file", "run_glue's"),
    "attn_implementation": ("model.attention", "transformers'"),
    # run_summarization's / run_translation's arguments (Seq2SeqTrainingArguments' too): spelling
    # guessed fields of another meaning (max_source_length -> max_target_length, source_prefix ->
    # source_field, text_column -> target_code), and a user who followed it set the target's length
    "source_prefix": ("task.prefix", "run_summarization's"),
    "max_source_length": ("task.max_length", "run_summarization's"),
    "val_max_target_length": ("task.generation.max_new_tokens (unset: task.max_target_length)", "run_summarization's"),
    "generation_max_length": ("task.generation.max_new_tokens", "transformers'"),
    "generation_num_beams": ("task.generation.num_beams", "transformers'"),
    "num_beams": ("task.generation.num_beams", "run_summarization's"),
    "text_column": ("task.source_field", "run_summarization's"),
    "summary_column": ("task.target_field", "run_summarization's"),
    "forced_bos_token": ("task.target_code", "run_translation's"),
    "predict_with_generate": ("not a setting: every evaluation generates (and computes the teacher-forced loss)",
                              "transformers'"),
    "ignore_pad_token_for_loss": ("not a setting: label padding is always -100, out of the loss", "run_summarization's"),
    "pad_to_max_length": ("not a setting: a batch is padded to its longest example (train.pad_multiple rounds "
                          "a training batch up)", "run_summarization's"),
    "lora_r": ("method.r", "PEFT's"),
    "lora_alpha": ("method.alpha", "PEFT's"),
    "lora_dropout": ("method.dropout", "PEFT's"),
}


def foreign_hint(name: str) -> str | None:
    """' (transformers' learning_rate is train.lr)' for a name another tool uses, else None."""
    if name not in FOREIGN_NAMES:
        return None
    where, whose = FOREIGN_NAMES[name]
    return f" ({whose} {name} is {where})"


class Registry(Generic[T]):
    """A named table of plug-ins; `get` of an unknown name is a UserError with a did-you-mean."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: file the plug-in under `name` and set its `name` to it (said once, here)."""
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = obj
            obj.name = name  # type: ignore[attr-defined]
            return obj

        return add

    def get(self, name: str, field: str | None = None) -> T:
        if name not in self._entries:
            where = f"{field}: " if field else ""
            raise UserError(f"{where}unknown {self.kind} '{name}'{did_you_mean(name, self.names())}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
