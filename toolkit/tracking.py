"""Experiment trackers (TensorBoard, trackio, W&B, MLflow) through accelerate's own trackers:
what log.jsonl records goes to the tracker too, with the resolved recipe as hyper-parameters."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from toolkit.errors import UserError

# tracker name -> the module it needs, and the extra that installs it
NEEDS = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb", "mlflow": "mlflow"}


def check(report_to: list[str]) -> None:
    """Refuse a tracker whose package is not installed, before anything runs."""
    for name in report_to:
        if importlib.util.find_spec(NEEDS[name]) is None:
            raise UserError(f"train.report_to: {name} is not installed; pip install "
                            f"'toolkit[{name}]' (or remove it from the list)")


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 1e-3}} -> {'train.lr': 1e-3}; lists and None as text (hparams are scalars)."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flat(value, f"{prefix}{key}."))
        return out
    value = data if isinstance(data, (int, float, str, bool)) else str(data)
    return {prefix[:-1]: value}


def start(accelerator: Any, name: str, recipe: dict, step: int = 0) -> None:
    """The trackers of a run that goes on after `step` (0: from its start). TensorBoard writes
    each launch's events into the run's folder beside the earlier launches' files, and a run
    killed after its checkpoint of step N had logged steps past N there: the resumed run logged
    them again, and the curves held those steps twice (exit 0), where log.jsonl keeps the lines
    up to its checkpoint alone (runs.truncate_log). Its `purge_step` marks the restart: readers
    drop the earlier launches' events from step N + 1 on, as they are logged anew."""
    if accelerator.log_with:
        accelerator.init_trackers(name.replace("/", "_"), config=flat(recipe),
                                  init_kwargs={"tensorboard": {"purge_step": step + 1}})


def log(accelerator: Any, entry: dict, step: int, epoch: float | None) -> None:
    """One log.jsonl entry, flattened (`eval.accuracy`), numbers only, at its step and with its
    epoch. The step is the tracker's step, not a scalar: the filter compared the flattened keys
    with `step`, and the training entry's (`train.step`) went to every tracker as a curve of its
    own. The epoch goes with every point as `train.epoch`, one curve, as Trainer sends
    `train/epoch` with its evaluations too: the evaluation points carried none (log.jsonl's
    evaluation lines have it), so an eval curve could not be read against the epoch."""
    if accelerator.log_with:
        values = {k: v for k, v in flat(entry).items() if isinstance(v, (int, float)) and k.split(".")[-1] != "step"
                  and k != "epoch"}
        if epoch is not None:
            values["train.epoch"] = epoch
        accelerator.log(values, step=step)


# what a finished run's metrics.json says of its training as a whole, sent to the trackers once
# at its last step, as Trainer sends train_loss, train_runtime and train_samples_per_second
SUMMARY = ("train_loss", "train_runtime_s", "train_samples_per_second")


def summary(accelerator: Any, metrics: dict, step: int) -> None:
    """The run's summary (SUMMARY, from metrics.json) at its last step, with its epoch
    (metrics.json's `epoch`) as every point has: the trackers had each step's and each
    evaluation's numbers but not the run's mean training loss or its time."""
    if accelerator.log_with:
        values = {k: metrics[k] for k in SUMMARY if isinstance(metrics.get(k), (int, float))}
        if values:
            log(accelerator, values, step, metrics.get("epoch") or 0.0)  # null: nothing trained, epoch 0


def project_dir(out: Path) -> str:
    return str(out / "tracking")
