"""How much length-grouped batching upweights each target's end token, on a recipe's real data.

A training step's loss is the mean over its batch's target tokens, so a target token weighs
1 / (the batch's target tokens). Every target has one end token ([SEP] for BERT2BERT, </s> for
T5 and BART): the mean weight of an example's end token over an epoch is the mean over batches of
(examples / target tokens). Random batches give about 1 / (mean target length). Batches grouped
by source length give more where source and target lengths go together (short dialogues, short
summaries: their batches have few tokens, each weighing more), which pushes the model to end its
outputs sooner. This prints that weight for the toolkit's sampler grouped and not, and for
Trainer's LengthGroupedSampler, over the recipe's epochs. Pure arithmetic on token counts: no
model runs.

    python benchmarks/end_token_weight.py [RECIPE [key=value ...]] [--epochs N]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from toolkit.arguments import ScriptParser  # noqa: E402

DEFAULT = "recipes/summarization/samsum/minilm2minilm-full.yaml"


def end_weight(batches: list[list[int]], target: list[int]) -> float:
    """Mean over batches of (examples in it / target tokens in it)."""
    return statistics.mean(len(b) / sum(target[i] for i in b) for b in batches)


def weights(source: list[int], target: list[int], batch_size: int, seed: int, epochs: int) -> dict[str, float]:
    """The end token's mean weight per sampler, averaged over `epochs` epochs."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from toolkit.batching import EpochBatches

    out = {}
    for grouped in (False, True):
        per_epoch = []
        for epoch in range(epochs):
            sampler = EpochBatches(source, batch_size, seed, grouped)
            sampler.use_epoch(epoch)
            per_epoch.append(end_weight(list(sampler), target))
        out["toolkit, grouped by length" if grouped else "toolkit, random batches"] = statistics.mean(per_epoch)
    g = torch.Generator().manual_seed(seed)
    per_epoch = []
    for _ in range(epochs):
        order = list(LengthGroupedSampler(batch_size, lengths=source, generator=g))
        per_epoch.append(end_weight([order[i:i + batch_size] for i in range(0, len(order), batch_size)], target))
    out["Trainer's LengthGroupedSampler"] = statistics.mean(per_epoch)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="benchmarks/end_token_weight.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", nargs="?", default=DEFAULT)
    parser.add_argument("overrides", nargs="*", help="recipe overrides, as `toolkit run` takes them")
    parser.add_argument("--epochs", type=int, default=None, help="epochs to average (default: the recipe's)")
    args = parser.parse_args(argv)
    import numpy as np
    from transformers import AutoTokenizer

    from toolkit import models
    from toolkit.errors import UserError
    from toolkit.recipe import find_recipe, load

    try:
        recipe = load(find_recipe(args.recipe), args.overrides)
        if not hasattr(recipe.task, "max_target_length"):
            raise UserError(f"{args.recipe}: task '{recipe.task.name}' has no targets to end")
        tok = AutoTokenizer.from_pretrained(models.resolve(recipe.model.checkpoint))
        rows = recipe.task.load()["train"]
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    source = [len(x) for x in tok(list(rows["source"]), truncation=True, max_length=recipe.task.max_length)["input_ids"]]
    target = [len(x) for x in tok(text_target=list(rows["target"]), truncation=True,
                                  max_length=recipe.task.max_target_length)["input_ids"]]
    got = weights(source, target, recipe.train.batch_size, recipe.train.seed, args.epochs or max(1, round(recipe.train.epochs)))
    base = got["toolkit, random batches"]
    print(f"{args.recipe}: {len(rows)} training examples, batch {recipe.train.batch_size}, "
          f"corr(source, target length) = {np.corrcoef(source, target)[0, 1]:.2f}, mean target {np.mean(target):.1f} tokens\n")
    print("| sampler | end token's mean weight | against random batches |\n|---|---|---|")
    for name, value in got.items():
        print(f"| {name} | {value:.5f} | {value / base:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
