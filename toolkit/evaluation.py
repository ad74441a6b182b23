"""The evaluation loop: the task's evaluation step on every batch, outputs gathered across
processes in dataset order (each process taking one process's batches, whole), then the task's
scoring."""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader

from toolkit.errors import UserError


class NothingScored(UserError):
    """An eval split none of whose examples holds a unit of the loss (a masked token, a token
    to predict): its loss would be 0/0, read as 0, and perplexity exp(0) = 1, a perfect score of
    nothing (a held-out file of one-word lines under MLM's 15% masking)."""


class NotFinite(UserError):
    """The model's outputs on an eval split are NaN or infinite: nothing is scored
    from them (an argmax over NaN logits is class 0, an accuracy with exit 0). The training loop
    adds the step and stops as it does for a non-finite training loss."""


def _pad_to(t: torch.Tensor, width: int, value: float) -> torch.Tensor:
    """Pad dim 1 of a (b, w, ...) tensor to `width` with `value`."""
    if t.ndim < 2 or t.shape[1] == width:
        return t
    pad = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), value)
    return torch.cat([t, pad], dim=1)


def stack(chunks: list[torch.Tensor], value: float) -> np.ndarray:
    """Concatenate per-batch outputs; those of varying width are padded to the widest first."""
    width = max((c.shape[1] for c in chunks if c.ndim >= 2), default=0)
    return torch.cat([_pad_to(c, width, value) for c in chunks]).numpy()


@torch.no_grad()
def evaluate(model: torch.nn.Module, loaders: dict[str, Any], task: Any, accelerator: Any,
             raw: dict[str, Any], sink: dict | None = None,
             orders: dict[str, list[int]] | None = None) -> dict[str, float]:
    """Task metrics and the eval loss on every eval split; a split's suffix (MNLI's `_mm`) is
    added to its keys.

    `loaders` are unprepared: N processes take the batches one process takes, whole
    (`own_batches`), and the rows gathered are put back in the order one process serves them, so
    every example is scored in the batch it has in one process and the outputs, scores and
    predictions are one process's exactly. A task that writes predictions (generation, QA) hands
    its rows to `sink` (suffix -> rows), which the loop writes as predictions.jsonl beside
    metrics.json.

    `orders[suffix]`, when given, is the order the loader served the split in (`train.LengthOrder`:
    longest first); outputs are put back in dataset order before the task scores them.
    """
    was_training = model.training
    model.eval()
    out: dict[str, float] = {}
    for suffix, loader in loaders.items():
        collected: dict[str, list[torch.Tensor]] = defaultdict(list)
        for positions, batch in own_batches(loader, accelerator):
            step = task.eval_step(model, batch)
            step = {k: accelerator.pad_across_processes(v, dim=1, pad_index=task.eval_pad(k))
                    if v.ndim >= 2 else v for k, v in step.items()}
            for key, value in gathered(accelerator, positions, step, task.eval_pad).items():
                collected[key].append(value.cpu())
        arrays = {k: stack(v, task.eval_pad(k)) for k, v in collected.items()}
        if collected:  # one process's serving order; the fillers dropped
            served = arrays.pop(POSITION)
            keep = np.flatnonzero(served >= 0)
            keep = keep[np.argsort(served[keep], kind="stable")]
            arrays = {k: v[keep] for k, v in arrays.items()}
        refuse_nothing_scored(arrays, suffix)
        refuse_not_finite(arrays, suffix)
        if orders and suffix in orders:
            back = np.argsort(np.asarray(orders[suffix]), kind="stable")  # served position of each example
            arrays = {k: v[back] for k, v in arrays.items()}
        metrics = task.score(arrays, raw[suffix])  # sees `loss` and `units` too (perplexity)
        rows = task.predictions(arrays, raw[suffix])
        if rows is not None and sink is not None:
            sink[suffix] = rows
        metrics["loss"] = float(arrays["loss"].sum() / arrays["units"].sum())
        out.update({f"{k}{suffix}": float(v) for k, v in metrics.items()})
    model.train(was_training)
    return out


POSITION = "__served_position__"  # each gathered row's place in one process's serving order; -1: a filler


def own_batches(loader: DataLoader, accelerator: Any) -> Iterator[tuple[torch.Tensor, dict]]:
    """This process's share of an unprepared eval `loader`: the batches one process takes, each
    whole and unchanged (batch i on process i mod N), with the position each row has in one
    process's serving order, then, on a process left a step short, a repeat of the last batch
    whose positions are -1 (its outputs are dropped): every process takes as many steps (the
    gathers, FSDP's and ZeRO-3's forwards) and no example is batched with others than in one
    process. accelerate's sharded loader (`even_batches`) filled the short last batch with the
    split's first examples: the last examples were scored padded to the longest ones' width, a
    float's last bits off one process's (STS-B's pearson 1e-4 relative apart on a random model,
    exit 0), and a near tie of logits or beams could turn the other way."""
    from accelerate.utils import send_to_device

    batches = [list(b) for b in loader.batch_sampler]
    starts = np.cumsum([0] + [len(b) for b in batches])
    n, rank = accelerator.num_processes, accelerator.process_index
    mine = list(range(rank, math.ceil(len(batches) / n) * n, n))
    served = DataLoader(loader.dataset, batch_sampler=[batches[min(i, len(batches) - 1)] for i in mine],
                        collate_fn=loader.collate_fn)
    for i, batch in zip(mine, served):
        rows = len(batches[min(i, len(batches) - 1)])
        positions = torch.arange(starts[i], starts[i] + rows) if i < len(batches) else torch.full((rows,), -1)
        yield positions.to(accelerator.device), send_to_device(batch, accelerator.device)


def gathered(accelerator: Any, positions: torch.Tensor, step: dict[str, torch.Tensor],
             pad: Any) -> dict[str, torch.Tensor]:
    """One step's outputs of every process, with each row's served position (`POSITION`); the
    processes' batches may hold different numbers of rows (the last batch, a filler), so each is
    padded to the most first (positions -1: dropped)."""
    positions = accelerator.pad_across_processes(positions, dim=0, pad_index=-1)
    step = {k: _pad_rows(v, positions.shape[0], pad(k)) for k, v in step.items()}
    return accelerator.gather({**step, POSITION: positions})


def _pad_rows(t: torch.Tensor, rows: int, value: float) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_full((rows - t.shape[0], *t.shape[1:]), value)])


def refuse_not_finite(arrays: dict[str, np.ndarray], suffix: str) -> None:
    """Raise `NotFinite` where a float output (logits, scores, the per-example loss) is NaN or
    infinite. Every task's evaluation step gives a per-example `loss`, and infinite logits make it
    NaN; the outputs themselves are checked too. No task returns -inf as an output (SQuAD masks
    padded positions with the dtype's minimum inside its loss only); padding is -100."""
    loss = arrays.get("loss")
    bad_loss = int((~np.isfinite(loss)).sum()) if loss is not None else 0
    bad_keys = sorted(k for k, v in arrays.items()
                      if k != "loss" and np.issubdtype(v.dtype, np.floating) and not np.isfinite(v).all())
    what = ([f"the loss of {bad_loss} of {len(loss)} examples"] if bad_loss else []) + \
        ([f"its {', '.join(bad_keys)}"] if bad_keys else [])
    if not what:
        return
    raise NotFinite(f"the model's outputs on the eval{suffix} split are not finite ({' and '.join(what)}): "
                    "nothing is scored from them; the weights have diverged or are broken")


def refuse_nothing_scored(arrays: dict[str, np.ndarray], suffix: str) -> None:
    """Raise `NothingScored` where the split's examples hold no loss unit between them: every
    task's loss and perplexity are sums over units divided by their count, and every score of
    such a split would be made of nothing."""
    units = arrays.get("units")
    count = len(units) if units is not None else 0
    if count and units.sum() > 0:
        return
    held = (f"its {count} example(s) hold no token the loss is taken on (each too short for the task to "
            "mask, predict or label any of it)") if count else "it holds no example once encoded"
    raise NothingScored(f"the eval{suffix} split has nothing to score: {held}, so its loss would be 0 and "
                        "perplexity 1 from nothing; give the held-out data more text")


def has_units(task: Any, collate: Any, ds: Any, batch_size: int = 64) -> bool:
    """Whether an encoded split holds a loss unit anywhere: its examples collated in order until
    one batch has one (the first batch, but for a split that has none). A pure function of the
    split: training blocks are corrupted from generators seeded per block, not from the global one."""
    for start in range(0, len(ds), batch_size):
        batch = collate([ds[i] for i in range(start, min(start + batch_size, len(ds)))])
        if task.units(batch).sum() > 0:
            return True
    return False


def check_something_to_score(task: Any, collate: Any, evals: dict[str, Any]) -> None:
    """Before training: `refuse_nothing_scored`'s line at setup rather than after the training
    it would end."""
    for suffix, ds in evals.items():
        if not has_units(task, collate, ds):
            refuse_nothing_scored({"units": np.zeros(len(ds))}, suffix)


OUTPUT_KEYS = ("logits", "start_logits", "end_logits")  # what a head gives that predictions come from


@contextmanager
def finite_outputs() -> Iterator[None]:
    """Prediction outside the evaluation loop (`toolkit predict`, `toolkit.predict`): every
    module's forward output that carries logits is checked as it is made (a global forward hook:
    generation from embeddings calls the base model, not the wrapper), and the first non-finite
    one raises `NotFinite` before a label, tag, span or text is made of it."""
    def check(module: torch.nn.Module, args: Any, output: Any) -> None:
        for key in OUTPUT_KEYS:
            value = getattr(output, key, None)  # a ModelOutput's field; None on a tensor or tuple
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all():
                raise NotFinite(f"the model's outputs are not finite (its {key}): nothing is predicted from "
                                "them; the weights have diverged or are broken")

    handle = torch.nn.modules.module.register_module_forward_hook(check)
    try:
        yield
    finally:
        handle.remove()
