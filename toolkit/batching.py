"""Batching: the training sampler that makes the data order a pure function of (seed, epoch),
the longest-first evaluation order, the loaders built on them, and the step count they imply."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from toolkit import schema

if TYPE_CHECKING:
    from toolkit.recipe_data import Recipe


def epoch_permutations(seed: int, epoch: int) -> Callable[[int], list[int]]:
    """The random permutations an epoch's order draws (`n` -> a permutation of range(n)), a pure
    function of (seed, epoch). Below epoch 1000 from torch's generator seeded `seed * 1000 +
    epoch`, the orders every run so far took. From epoch 1000 on that seed was another seed's
    (epoch 1000 of seed 0 took epoch 0 of seed 1's order, 1001 its epoch 1, ...), so two seeds of a
    long run on a small data set trained on the same orders, shifted; torch's CPU generator keeps
    only the low 32 bits of its seed, so no arithmetic on it can tell every (seed, epoch) apart.
    There numpy's generator seeded by the pair itself (`SeedSequence([seed, epoch])`) draws them."""
    if epoch < 1000:
        g = torch.Generator().manual_seed(seed * 1000 + epoch)
        return lambda n: torch.randperm(n, generator=g).tolist()
    rng = np.random.default_rng([seed, epoch])
    return lambda n: rng.permutation(n).tolist()


class EpochBatches(Sampler):
    """Index batches from a permutation seeded by (seed, epoch); optionally length-grouped.

    Owning the shuffle (instead of a RandomSampler drawing from the global RNG) makes the data
    order a pure function of (seed, epoch), which is what exact resume needs.

    Length grouping (the default) works in optimizer steps: `step` = batch x grad_accum x
    processes examples. The permutation is cut into mega-batches of 50 steps, each sorted by
    length and cut into steps; the steps are shuffled, and each is cut into its micro-batches in
    the order the processes take them (accelerate deals process p the batches p, p+N, ...). So a
    batch pads to a length close to its members', lengths come in random order over the epoch
    (no long-to-short run inside every 50 batches, which plain sorting would give), and an
    optimizer step holds the same examples whatever the split into processes and micro-batches:
    2 processes equal 1 with the same global batch.
    """

    MEGA = 50  # optimizer steps per mega-batch, as transformers' LengthGroupedSampler (in batches)

    def __init__(self, lengths: list[int], batch_size: int, seed: int, group_by_length: bool,
                 step: int | None = None) -> None:
        self.lengths, self.batch_size, self.seed = lengths, batch_size, seed
        self.group_by_length, self.epoch = group_by_length, 0
        self.step = step or batch_size

    def use_epoch(self, epoch: int) -> None:
        """Not `set_epoch`: accelerate calls that with its own iteration counter, which a resumed
        run does not share."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        """Copies of the epoch's batches: accelerate (1.15, `BatchSamplerShard`, `even_batches`)
        fills the epoch's short last batch in place (`batch += ...`) with its first examples, and
        the list kept for `step_length` then held them: on N processes the width of extractive
        QA's last step was that of a repeated example (exit 0)."""
        return iter([list(batch) for batch in self.epoch_batches()])

    def epoch_batches(self) -> list[list[int]]:
        """The current epoch's batches, in the order the processes take them (kept for the
        epoch: `step_length` reads them at every step)."""
        if getattr(self, "_made", (None,))[0] != self.epoch:
            self._made = (self.epoch, self._batches())
        return self._made[1]

    def _batches(self) -> list[list[int]]:
        permutation = epoch_permutations(self.seed, self.epoch)
        order = permutation(len(self.lengths))
        bs = self.batch_size
        if not self.group_by_length:
            return [order[start:start + bs] for start in range(0, len(order), bs)]
        mega, step = self.MEGA * self.step, self.step
        steps = []
        for s in range(0, len(order), mega):
            chunk = sorted(order[s:s + mega], key=lambda i: -self.lengths[i])
            steps += [chunk[b:b + step] for b in range(0, len(chunk), step)]
        # a short step (the epoch's tail) stays last, as without grouping
        tail = [steps.pop()] if steps and len(steps[-1]) < step else []
        out = []
        for i in permutation(len(steps)) + ([len(steps)] if tail else []):
            members = steps[i] if i < len(steps) else tail[0]
            out += [members[b:b + bs] for b in range(0, len(members), bs)]
        return out

    def step_length(self, step: int) -> int:
        """The longest example of the epoch's `step`-th optimizer step (0-based), over all its
        micro-batches on all processes: the width a task whose loss sees the padding
        (`Task.loss_sees_padding`) pads each of them to, so that the loss of an example does not
        depend on how its step is split into micro-batches and processes."""
        per_step = max(1, self.step // self.batch_size)  # micro-batches x processes
        batches = self.epoch_batches()[step * per_step:(step + 1) * per_step]
        return max(self.lengths[i] for b in batches for i in b)

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def own_rows(self, position: int) -> int:
        """How many leading rows of the epoch's `position`-th batch (0-based, counted over all
        processes: process p serves positions p, p+N, ...) are examples of the epoch; the rest of
        what a process is served there is padding. Only the epoch's last batch can be short
        (every step but the tail is whole), and past it there are no batches of the epoch at all.
        accelerate (`even_batches`, its default) fills a short last batch, and gives a process
        with no batch left a whole one, with examples from the epoch's start, so that every
        process takes as many equal-sized steps; counted as data they would weigh those examples
        twice in the last optimizer step of the epoch on N processes and not on one."""
        return max(0, min(self.batch_size, len(self.lengths) - position * self.batch_size))


class LengthOrder(Sampler):
    """Evaluation order: longest first, so each batch pads to a length close to its members'
    (the first batch is the largest, so an out-of-memory shows at once). `order[i]` is the
    dataset position of the i-th example served; `evaluation.evaluate` puts outputs back in
    dataset order with it before scoring."""

    def __init__(self, lengths: list[int]) -> None:
        self.order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep order

    def __iter__(self) -> Iterator[int]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


def eval_batch_size(recipe: Recipe) -> int:
    """train.eval_batch_size, else twice the training batch: evaluation keeps no activations for
    backward, so it fits about twice the examples in the same memory."""
    return schema.value_of(recipe.train, "eval_batch_size")  # its DERIVED rule


def eval_loaders(recipe: Recipe, setup: Any) -> tuple[dict[str, DataLoader], dict[str, list[int]]]:
    """One loader per encoded eval split (unprepared), served longest first, and each split's
    order (for `evaluation.evaluate`): the loop's and `toolkit eval`'s."""
    collate = setup.task.collator(setup.tokenizer, setup.model)
    loaders, orders = {}, {}
    for sfx, ds in setup.evals.items():
        sampler = None
        if "input_ids" in ds.column_names:
            sampler = LengthOrder([len(ids) for ids in ds["input_ids"]])
            orders[sfx] = sampler.order
        loaders[sfx] = DataLoader(ds, batch_size=eval_batch_size(recipe), sampler=sampler, collate_fn=collate)
    return loaders, orders




# How each sequence a collator may return is padded: (key, value); a collator's own padding.
PAD_VALUES = {"input_ids": None, "decoder_input_ids": None, "attention_mask": 0, "decoder_attention_mask": 0,
              "token_type_ids": 0, "special_tokens_mask": 1, "labels": -100, "offsets": -1,
              "word_index": -100}  # ner: the word each first sub-token starts


def bucket_length(length: int, multiple: int, buckets: list[int], limit: int | None = None) -> int:
    """The padded length of a batch whose longest member has `length` tokens: the smallest of
    `buckets` that holds it, else the next multiple of `multiple`; never past `limit` (the task's
    max_length) when the batch itself fits in it."""
    fits = [b for b in sorted(buckets) if b >= length]
    padded = fits[0] if fits else math.ceil(length / multiple) * multiple
    return min(padded, limit) if limit and length <= limit else padded


def bucket_count(max_length: int, multiple: int, buckets: list[int]) -> int:
    """How many distinct lengths `bucket_length` gives for lengths 1..max_length."""
    return len({bucket_length(n, multiple, buckets, max_length) for n in range(1, max_length + 1)})


class BucketPadding:
    """A collator's batches padded further, to a few lengths only (train.pad_multiple,
    train.length_buckets), so that an epoch has a handful of (batch, length) shapes: a compiled
    step is compiled once for every length and, on CUDA, graph-captured once per shape. The extra positions are
    masked out exactly as the collator's own padding is (attention mask 0, labels -100), so
    each example's loss is what it was. Each sequence is padded to the bucket of its own length:
    an encoder-decoder's targets get their own bucket."""

    def __init__(self, collate: Any, pad_id: int, multiple: int, buckets: list[int],
                 limit: int | None = None) -> None:
        self.collate, self.pad_id, self.multiple, self.buckets, self.limit = collate, pad_id, multiple, buckets, limit

    def length_of(self, length: int) -> int:
        """The padded length of a sequence of `length` tokens."""
        return bucket_length(length, self.multiple, self.buckets, self.limit)

    def __getattr__(self, name: str) -> Any:  # use_epoch and the like reach the task's collator
        if "collate" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["collate"], name)

    def __call__(self, features: list[dict]) -> dict:
        batch = self.collate(features)
        width = batch["input_ids"].shape[1] if isinstance(batch.get("input_ids"), torch.Tensor) else None
        for key, tensor in list(batch.items()):
            if padded_sequence(key, tensor):
                length = tensor.shape[1]
                batch[key] = pad_to(tensor, key, self.length_of(length), self.pad_id)
        if isinstance(batch.get("logits_to_keep"), int) and width is not None:
            # counted from the end: the padding adds positions there; rounded up to a bucket so
            # that it takes a few values only (more kept positions are prompt ones, labels -100)
            padded = batch["input_ids"].shape[1]
            keep = batch["logits_to_keep"] + padded - width
            batch["logits_to_keep"] = min(padded, bucket_length(keep, self.multiple, self.buckets))
        return batch


def padded_sequence(key: str, tensor: Any) -> bool:
    """Whether `tensor` is a (b, t, ...) sequence of the batch that padding may lengthen."""
    if not isinstance(tensor, torch.Tensor) or tensor.ndim < 2 or key not in PAD_VALUES:
        return False
    return not (key == "labels" and tensor.is_floating_point())  # per-example targets, not a sequence


def pad_to(tensor: torch.Tensor, key: str, length: int, pad_id: int) -> torch.Tensor:
    """A (b, t, ...) sequence padded on the right to `length` with its key's padding value."""
    extra = length - tensor.shape[1]
    if extra <= 0:
        return tensor
    value = pad_id if PAD_VALUES[key] is None else PAD_VALUES[key]
    fill = tensor.new_full((tensor.shape[0], extra, *tensor.shape[2:]), value)
    return torch.cat([tensor, fill], dim=1)  # (b, length, ...)


def fit_inputs(batch: dict, length: int, pad_id: int) -> dict:
    """The batch with its input-side sequences (those as wide as input_ids) exactly `length`
    wide: padded on the right, or cut there where the batch is wider. Cut only where every
    row's own tokens end within `length`, so that what goes is padding: a batch that accelerate
    filled with repeated examples and the loop cut back to its own rows (`Loop._own_examples`)
    was as wide as the repeats, which are gone."""
    width = batch["input_ids"].shape[1]
    return {k: (pad_to(v, k, length, pad_id) if length >= width else v[:, :length])
            if padded_sequence(k, v) and v.shape[1] == width else v
            for k, v in batch.items()}


def pad_multiple(recipe: Recipe, compiled: bool) -> int:
    """train.pad_multiple as set; unset where the step is compiled: the multiple of 16 that gives
    at most 8 lengths up to task.max_length (16 up to 128, 64 at 512): each length is a CUDA
    graph recorded, not a compilation (compiling.mark_dynamic), so the padding can stay short;
    unset and eager: 1 (each batch as long as its longest member)."""
    if recipe.train.pad_multiple is not None:
        return recipe.train.pad_multiple
    if not compiled:
        return 1
    longest = getattr(recipe.task, "max_length", None) or 128
    return 16 * max(1, math.ceil(longest / (8 * 16)))


def bucketed(collate: Any, recipe: Recipe, tokenizer: Any, compiled: bool) -> Any:
    """The training collator, with bucket padding where the recipe (or compilation) asks for it."""
    multiple, buckets = pad_multiple(recipe, compiled), recipe.train.length_buckets
    if multiple == 1 and not buckets:
        return collate
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return BucketPadding(collate, pad_id, multiple, buckets, getattr(recipe.task, "max_length", None))


def train_loaders(recipe: Recipe, setup: Any, processes: int = 1, compiled: bool = False) -> tuple[DataLoader | None, EpochBatches | None, dict, dict]:
    """(train loader, its sampler, eval loaders, eval orders), all unprepared."""
    collate = setup.task.collator(setup.tokenizer, setup.model)
    evals, orders = eval_loaders(recipe, setup)
    if setup.train is None or not recipe.method.trains:
        return None, None, evals, orders
    lengths = [len(ids) for ids in setup.train["input_ids"]]
    step = recipe.train.batch_size * recipe.train.grad_accum * processes
    sampler = EpochBatches(lengths, recipe.train.batch_size, recipe.train.seed, recipe.train.group_by_length, step)
    # Its own generator: a DataLoader draws a base seed from the global RNG at every iter(),
    # which would shift dropout masks between a resumed and an uninterrupted run.
    # pinned memory: accelerate's non-blocking copy to a GPU then waits for nothing on the host
    loader = DataLoader(setup.train, batch_sampler=sampler, collate_fn=bucketed(collate, recipe, setup.tokenizer, compiled),
                        generator=torch.Generator().manual_seed(recipe.train.seed),
                        pin_memory=torch.cuda.is_available())
    return loader, sampler, evals, orders
