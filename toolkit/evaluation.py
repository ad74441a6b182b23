"""The evaluation loop: predictions gathered across processes, the padded tail counted once."""

from __future__ import annotations

from typing import Any

import torch


@torch.no_grad()
def evaluate(model: torch.nn.Module, loaders: dict[str, Any], task: Any, accelerator: Any) -> dict[str, float]:
    """Task metrics on every eval split; a split's suffix (MNLI's `_mm`) is added to its keys.

    `gather_for_metrics` drops the examples accelerate repeats to even out the last batch, so
    N processes score exactly the examples one process would.
    """
    was_training = model.training
    model.eval()
    out: dict[str, float] = {}
    for suffix, loader in loaders.items():
        preds, labels = [], []
        for batch in loader:
            outputs = model(**task.model_inputs(batch))
            pred, label = accelerator.gather_for_metrics((task.predictions(outputs, batch), batch["labels"]))
            preds.append(pred.cpu())
            labels.append(label.cpu())
        metrics = task.compute_metrics(torch.cat(preds).numpy(), torch.cat(labels).numpy())
        out.update({f"{k}{suffix}": v for k, v in metrics.items()})
    model.train(was_training)
    return out
