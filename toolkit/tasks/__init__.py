"""Tasks: splits, preprocessing, collator, loss, metrics and the head a model needs.

A task class is registered under its name and built from the recipe's TaskConfig; its constructor
checks the config (subset names, ...) without touching data, so `toolkit validate` stays cheap.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from pathlib import Path
from typing import Any

import torch

from toolkit.registry import Registry

TASKS: Registry[type] = Registry("task")


class Task:
    """Base of every task. Subclasses fill in the data side; the loop only calls these methods."""

    name: str = ""
    head: str = "sequence-classification"  # which AutoModelFor... the model gets
    peft_task_type: str = "SEQ_CLS"

    def metric_names(self) -> list[str]:
        raise NotImplementedError

    def main_metric(self) -> str:
        raise NotImplementedError

    def head_kwargs(self) -> dict[str, Any]:
        """Extra from_pretrained kwargs for the head (num_labels, problem_type)."""
        return {}

    def load(self) -> dict[str, Any]:
        """{'train': Dataset | None, 'eval': {suffix: Dataset}} of raw examples."""
        raise NotImplementedError

    def encode(self, dataset: Any, tokenizer: Any) -> Any:
        raise NotImplementedError

    def collator(self, tokenizer: Any) -> Any:
        raise NotImplementedError

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the model's forward takes: the loss is the task's, so labels stay out."""
        return {k: v for k, v in batch.items() if k != "labels"}

    def units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """How many loss terms a micro-batch holds (examples; tokens for language modelling)."""
        return torch.tensor(batch["labels"].shape[0], device=batch["labels"].device)

    def loss(self, outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The SUM of the per-unit losses of one micro-batch.

        The loop divides by the units of the whole accumulated step across all processes, so k
        micro-batches equal one k-times-larger batch exactly.
        """
        raise NotImplementedError

    def predictions(self, outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def compute_metrics(self, preds: Any, labels: Any) -> dict[str, float]:
        raise NotImplementedError


def data_root(override: str | None = None) -> Path:
    """$TOOLKIT_DATA, else the shared data folder beside the checkout, else ./data."""
    if override:
        return Path(override).expanduser()
    if os.environ.get("TOOLKIT_DATA"):
        return Path(os.environ["TOOLKIT_DATA"]).expanduser()
    repo = Path(__file__).resolve().parents[2]
    for candidate in (repo / "data", repo.parent / "data", repo.parent / "shared" / "data"):
        if candidate.is_dir():
            return candidate
    return Path("data")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
