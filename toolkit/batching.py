"""Batching: the training sampler that makes the data order a pure function of (seed, epoch),
the longest-first evaluation order, the loaders built on them, and the step count they imply."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch.utils.data import DataLoader, Sampler

if TYPE_CHECKING:
    from toolkit.recipe_data import Recipe


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
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        bs = self.batch_size
        if not self.group_by_length:
            for start in range(0, len(order), bs):
                yield order[start:start + bs]
            return
        mega, step = self.MEGA * self.step, self.step
        steps = []
        for s in range(0, len(order), mega):
            chunk = sorted(order[s:s + mega], key=lambda i: -self.lengths[i])
            steps += [chunk[b:b + step] for b in range(0, len(chunk), step)]
        # a short step (the epoch's tail) stays last, as without grouping
        tail = [steps.pop()] if steps and len(steps[-1]) < step else []
        for i in torch.randperm(len(steps), generator=g).tolist() + ([len(steps)] if tail else []):
            members = steps[i] if i < len(steps) else tail[0]
            for b in range(0, len(members), bs):
                yield members[b:b + bs]

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)


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
    return recipe.train.eval_batch_size or 2 * recipe.train.batch_size


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




def train_loaders(recipe: Recipe, setup: Any, processes: int = 1) -> tuple[DataLoader | None, EpochBatches | None, dict, dict]:
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
    loader = DataLoader(setup.train, batch_sampler=sampler, collate_fn=collate,
                        generator=torch.Generator().manual_seed(recipe.train.seed))
    return loader, sampler, evals, orders
