"""What both sides and every task's reference share: the checkpoints, the recipe's
Trainer arguments, the toolkit's batches for the reference, timing and memory."""

from __future__ import annotations

import collections
import json
import resource
import statistics
import shutil
import time
from pathlib import Path
from typing import Any, Callable


ROOT = Path(__file__).resolve().parents[2]  # the checkout
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
GPT2 = "gpt2-random"  # a random-weight GPT-2 built from a config with the real tokenizer (below)


COMMON = (f"train.eval_every={10**9}", "train.keep_best=false")
GREEDY_SHORT = ("task.generation.num_beams=1", "task.generation.max_new_tokens=8")
SEED_LIST = "42,43,44"
SET: list[str] = []  # --set KEY=VALUE: recipe overrides after the budget's, for both sides
BATCHES = ["trainer"]  # --reference-batches: whose batches the reference's Trainer trains on

def checkpoint_path(name: str, smoke: bool) -> str:
    """A local folder for the spec's checkpoint: the real MiniLM (or its tiny random twin under
    --smoke), or the random GPT-2 built once into the toolkit's cache."""
    from toolkit import models

    if name == MINILM:
        return models.smoke_checkpoint(MINILM) if smoke else models.resolve(MINILM)
    return random_gpt2(smoke)


def random_gpt2(smoke: bool) -> str:
    """GPT-2's architecture at 4 layers x 256 (2 x 32 under --smoke), weights from seed 0, and the
    real GPT-2 tokenizer: only random-weight GPT-2s exist here, so both sides start from this one."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from toolkit import models, runs
    from toolkit.errors import cache_dir

    layers, width = (2, 32) if smoke else (4, 256)
    cache = cache_dir() / "parity"
    folder = cache / f"gpt2-random-{layers}x{width}"
    if (folder / "config.json").is_file():
        return str(folder)
    tok = AutoTokenizer.from_pretrained(str(models.tokenizer_dir() / "gpt2"))
    config = GPT2Config(vocab_size=len(tok), n_positions=1024, n_embd=width, n_layer=layers, n_head=4 if width > 32 else 2,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    cache.mkdir(parents=True, exist_ok=True)
    # modes as the umask says, as the smoke cache's (models.own_folder): mkdtemp's 0700 folder (and
    # safetensors' 0600 weights) left the entry unreadable to the rest of a group sharing TOOLKIT_CACHE
    tmp = models.own_folder(cache, ".gpt2-")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    runs.follow_umask(tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(folder)

def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports KiB), the same measure for both sides."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def distinct(predictions: list) -> str:
    """'k/n, w words': how many different outputs n inputs got (one summary for every input is a
    failure) and their mean length in words (generation time grows with it)."""
    texts = [p if isinstance(p, str) else json.dumps(p) for p in predictions if p is not None]
    if not texts:
        return ""
    return f"{len(set(texts))}/{len(texts)}, {statistics.mean(len(t.split()) for t in texts):.1f} words"


# --- reference: shared pieces -------------------------------------------------------------------
def training_arguments(recipe: Any, out: Path, seq2seq: bool = False, **extra: Any) -> Any:
    """Trainer's arguments from the recipe's train section: the same epochs or max_steps, batch,
    gradient accumulation, lr, weight decay, warm-up, clipping, mixed precision and seed (a
    `--set train.grad_accum=4` or `train.max_steps=N` reached the toolkit's side only: the
    reference trained without accumulation, or every epoch, and the table compared them as one
    protocol); no checkpoints, no evaluation during training. The same
    batching too: where the recipe groups batches by length (`train.group_by_length`, the
    toolkit's default), Trainer's own LengthGroupedSampler (mega-batches of 50 batches, each
    sorted by length); else its random sampler. Grouping changes what a step averages over (the
    loss is a mean over the batch's tokens), so the sides must share it."""
    import torch
    from transformers import Seq2SeqTrainingArguments, TrainingArguments

    t = recipe.train
    cls = Seq2SeqTrainingArguments if seq2seq else TrainingArguments
    # the recipe's train.gradient_checkpointing (transformers 5 renamed Trainer's: activation_checkpointing)
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in cls.__dataclass_fields__ \
        else "gradient_checkpointing"
    return cls(output_dir=str(out), per_device_train_batch_size=t.batch_size,
               per_device_eval_batch_size=t.eval_batch_size or 2 * t.batch_size, num_train_epochs=t.epochs,
               gradient_accumulation_steps=t.grad_accum, max_steps=t.max_steps or -1,
               bf16=t.mixed_precision == "bf16", fp16=t.mixed_precision == "fp16",
               learning_rate=t.lr, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps or t.warmup_ratio,
               max_grad_norm=t.max_grad_norm or 0.0, lr_scheduler_type="linear", seed=t.seed,
               **{checkpointing: t.gradient_checkpointing},
               save_strategy="no", eval_strategy="no", report_to=[], logging_strategy="no",
               train_sampling_strategy="group_by_length" if t.group_by_length else "random",
               use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, **extra)


class ToolkitBatches:
    """A Trainer sampler serving the toolkit's own training batches for the recipe and seed, in
    its order: `toolkit.batching.EpochBatches` over the toolkit's encoded training features,
    each mapped to the reference's feature with the same tokens (the toolkit keeps its features
    longest first, the reference in raw order; identical features are interchangeable).
    Flattened: Trainer's DataLoader cuts them back into the same batches, since every batch but
    an epoch's last is full. Trainer calls `set_epoch` before each epoch, as the toolkit's loop
    calls `use_epoch`. For `--reference-batches toolkit`: the two sides then train on the same
    batches in the same order, and what is left to differ is the random draws (initialisation,
    dropout)."""

    def __init__(self, lengths: list[int], rows: list[int], recipe: Any) -> None:
        from toolkit.batching import EpochBatches

        t = recipe.train
        self.rows = rows  # toolkit position -> reference feature
        self.batches = EpochBatches(lengths, t.batch_size, t.seed, t.group_by_length, t.batch_size * t.grad_accum)

    def set_epoch(self, epoch: int) -> None:
        self.batches.use_epoch(epoch)

    def __iter__(self) -> Any:
        return (self.rows[i] for batch in self.batches for i in batch)

    def __len__(self) -> int:
        return len(self.rows)


def batched(trainer: Any, recipe: Any, tok: Any, train_rows: Any) -> Any:
    """`trainer`, training on the toolkit's batches under `--reference-batches toolkit` (else
    Trainer's own sampler, as `training_arguments` set it). The toolkit's features are encoded
    here by its own encoder, for their order alone; every one must be one of the reference's."""
    if BATCHES[0] != "toolkit":
        return trainer
    ours = recipe.method.encoder(recipe.task, tok)(train_rows)["input_ids"]
    where: dict[tuple, list[int]] = collections.defaultdict(list)
    for i, ids in enumerate(trainer.train_dataset["input_ids"]):
        where[tuple(ids)].append(i)
    try:
        rows = [where[tuple(ids)].pop() for ids in ours]
    except IndexError:
        raise RuntimeError("--reference-batches toolkit: a toolkit training feature is none of the reference's") from None
    if len(rows) != len(trainer.train_dataset):
        raise RuntimeError("--reference-batches toolkit: the reference has training features the toolkit has not")
    trainer._get_train_sampler = lambda dataset=None: ToolkitBatches([len(ids) for ids in ours], rows, recipe)
    return trainer


def in_order(trainer: Any) -> Any:
    """`trainer` with evaluation and prediction in the dataset's order. Finding: under
    `train_sampling_strategy="group_by_length"` transformers (since PR #33514) also groups the
    evaluation batches by length, and `predict()` returns its predictions in that permuted order,
    so they no longer line up with the dataset's rows (QA features, references). Training keeps
    its length grouping; evaluation goes back to Trainer's single-process sequential sampler."""
    from torch.utils.data import SequentialSampler

    trainer._get_eval_sampler = lambda dataset: SequentialSampler(dataset)
    return trainer


def raw_splits(recipe: Any) -> tuple[Any, Any]:
    """The rows both sides train and score on: the task's own load() (the same subset)."""
    raw = recipe.task.load()
    return raw["train"], raw["eval"][""]


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def reference_attention(recipe: Any) -> dict:
    """The recipe's `model.attention` for the reference's `from_pretrained`: a transformers name
    (eager, sdpa, ...) as `attn_implementation`, none where the recipe names none (both sides then
    take transformers' default). A toolkit module (local, performer, ...) is refused in one line:
    the reference is transformers' own model, which has none of them. Finding: `--set
    model.attention=performer` reached the toolkit's side only, and the table compared performer
    with transformers' default attention as if one protocol ran on both sides (`eager` likewise
    against the reference's sdpa), exit 0."""
    from toolkit.attention import Attention, as_recipe_text

    attention = recipe.model.attention
    if attention is None:
        return {}
    if isinstance(attention, Attention):
        raise ValueError(f"model.attention: {as_recipe_text(attention)} is a toolkit module, and the reference side "
                         "is transformers' own model, which has none: the table would compare it with transformers' "
                         "default attention; compare attention modules with `make attention`, or name one of "
                         "transformers' own (eager, sdpa), which both sides load")
    return {"attn_implementation": attention}


def bert_dropout(recipe: Any) -> dict:
    """The recipe's `model.dropout` as BERT's config names it (none: the checkpoint's own)."""
    p = recipe.model.dropout
    return {} if p is None else {"hidden_dropout_prob": p, "attention_probs_dropout_prob": p}
