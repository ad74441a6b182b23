"""metrics.json: what a finished run reports, under the names the Hugging Face ecosystem uses
(speeds, sizes, the kept step, the device, versions) beside the task's scores."""

from __future__ import annotations

import hashlib
import json
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
import transformers
from accelerate import Accelerator

from toolkit import chain, devices, models, provenance, runs
from toolkit.models import BOTTLENECK_CONFIG
from toolkit.checkpoints import State, record
from toolkit.recipe_data import Recipe


def build(recipe: Recipe, setup: Any, acc: Accelerator, out: Path, state: State, metrics: dict,
          epoch: float | None = None) -> dict:
    """The metrics.json of a run whose final evaluation gave `metrics`, after `epoch` epochs."""
    result = {
        "eval": metrics,
        "trainable_params": setup.trainable, "total_params": setup.total,
        "trainable_percent": 100.0 * setup.trainable / max(setup.total, 1),
        "train_runtime_s": state.train_time,
        # none where nothing trained (an in-context run): a rate of 0.0 read as the slowest run in a report
        "train_samples_per_second": state.samples / state.train_time if state.train_time and state.samples else None,
        "eval_runtime_s": state.eval_runtime_s,
        # none where no evaluation was timed: a rate of 0.0 read as the slowest run in a report
        "eval_samples_per_second": (sum(len(v) for v in setup.raw_evals.values()) / state.eval_runtime_s
                                    if state.eval_runtime_s else None),
        # the epochs trained, a float as Trainer's `epoch` (2 epochs cut at step 3 of 4: 1.5); null: none trained
        "epoch": epoch,
        "train_steps": state.step, "train_samples": len(setup.train) if setup.train is not None and recipe.method.trains else 0,
        # the mean of the run's per-step losses (Trainer's train_loss): each optimizer step's loss is
        # its mean over the loss units of all its micro-batches and processes; a step skipped as
        # non-finite or with no loss unit is not in it; a resumed run's equals the uninterrupted one's
        "train_loss": train_loss(state),
        # optimizer steps skipped for a non-finite loss or gradient, and the micro-batches they held
        "best_step": state.best_step, "skipped_nonfinite": state.skipped_nonfinite,
        "skipped_nonfinite_micro_batches": state.skipped_nonfinite_micro_batches,
        "empty_steps": state.empty_steps,
        "kept": ({"step": state.best_step, "on": recipe.train.metric or setup.task.main_metric(),
                  "value": state.best_metric, "eval_loss": state.best_loss, "ties": "lower eval loss"}
                 if recipe.train.keep_best and state.best_step is not None else
                 {"step": state.step, "on": last_step_kept(recipe, setup)}),
        "main_metric": setup.task.main_metric(),
        # the classes read from the user's files (task.labels: null): an adapter folder has no
        # config.json to hold them, and eval/predict/export rebuild the head from these
        "label_names": getattr(setup.task, "label_names", None),
        "text_columns": getattr(setup.task, "text_columns", None),  # likewise when read from the header
        # a generation task's default prompt as built now (translation's language names): eval,
        # predict and export of the run read it back (`adopt_saved`), whatever a later toolkit builds
        **({"prompt": setup.task.recorded_prompt()} if hasattr(setup.task, "recorded_prompt") else {}),
        # a chained run's base (model.checkpoint: {run: ...}): the run folder it started from,
        # relative to the runs root, so eval/predict/export load that base without the recipe files
        "base_run": base_run(recipe, setup, out),
        # a local base folder's files that eval/predict/export load model/ onto (result_base)
        "base_files": result_base(recipe, setup, out),
        # the base's weights, configs and tokenizer every run started from, whatever its method (runs.base_record),
        # read once, on the main process: a report tells seeds on other bases apart by it (a full fine-tune's
        # model/ is whole, so base_files is none), and a finished run whose base changed since is refused
        # (chain.check_current: a chained run's upstream model/, base_run_files before 2026-11-28;
        # chain.base_current: a local folder or a Hub id's snapshot)
        "base_weights": (state.start_weights or start_weights(recipe, setup)) if acc.is_main_process else None,
        # model/ itself, as saved: its files' sizes, times and sha256 (runs.result_changed)
        "model_files": runs.result_record(out / "model") if acc.is_main_process else None,
        "metric_declarations": {k: setup.task.declaration(k).as_dict() for k in metrics},
        # the run's own (devices.run_peak_memory_mb); null where only the process's peak could be read
        "peak_memory_mb": peak_memory(state, acc),
        # what the scores are of: a report pools seeds only on one data_sha256 (the task's files)
        # and notes a comparison across eval_sha256 (the examples scored: files, subset, filters)
        "data_sha256": setup.data_sha256 or runs.data_fingerprint(setup.task.data_files()),
        "eval_sha256": examples_fingerprint(setup.raw_evals),
        # examples scored per eval split (by its metric suffix): a cap at or above a split's size
        # (task.max_eval_samples) scored it whole, and the GLUE report says so from this
        "eval_samples": {sfx: len(v) for sfx, v in setup.raw_evals.items()},
        # a Hub data set's revision, which data_sha256 (local files) does not see: eval checks it
        "hub_data": setup.task.hub_data(),
        "recipe_hash": recipe.hash, "run_id": out.name, "seed": recipe.train.seed, "method": recipe.method.name,
        "num_processes": acc.num_processes, "distributed_type": str(acc.distributed_type.value),
        "strategy": runs.strategy(),  # fsdp, zero2, zero3, ddp or none: part of the run id where sharded
        "device": str(acc.device), "mixed_precision": recipe.train.mixed_precision,
        **provenance.describe(acc.device),  # device_name, gpu, cpu, cpu_cores, git_commit, git_dirty
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     # peft's version without importing it (2 s for a run that needs no PEFT)
                     "peft": version("peft"), "python": platform.python_version()},
        **record(state),  # the code and libraries that trained it, and each resume under others
    }
    if setup.task.metric_info():  # strings beside the float metrics (sacreBLEU's signature)
        result["metric_info"] = setup.task.metric_info()
    return result


def peak_memory(state: State, acc: Accelerator) -> float | None:
    """The run's peak memory: the largest its checkpoints recorded (training itself), else read
    now; None where this process's peak is not the run's (`devices.run_peak_memory_mb`)."""
    now = devices.run_peak_memory_mb(acc.device)
    return None if now is None else (state.peak_memory_mb or now)


def train_loss(state: State) -> float | None:
    """The mean loss of the run's finite steps; None where no step was finite, nothing trained,
    or the run was resumed from a checkpoint that did not record the steps before it."""
    total, count = state.run_loss or (0.0, 0)
    return total / count if count else None


def last_step_kept(recipe: Recipe, setup: Any) -> str:
    """Why `kept` is the last step: keep_best off, nothing trained, or no evaluation gave the
    selection metric a defined value (each NaN: a correlation of constant predictions)."""
    if not recipe.train.keep_best or not recipe.method.trains:
        return "the last step (train.keep_best is false or nothing was trained)"
    metric = recipe.train.metric or setup.task.main_metric()
    return f"the last step (train.keep_best: no evaluation gave {metric} a defined value)"


def base_run(recipe: Recipe, setup: Any, out: Path) -> str | None:
    """The upstream run folder of a chained run, relative to the runs root both live in."""
    if not isinstance(recipe.model.checkpoint, dict):
        return None
    root = out.parents[len(Path(recipe.name).parts)]
    return Path(setup.source).parent.resolve().relative_to(root.resolve()).as_posix()


def saved_on_base(folder: Path) -> bool:
    """Whether a run's model/ is loaded onto its base (a PEFT or bottleneck adapter folder), not
    a whole model that loads alone."""
    return (folder / "adapter_config.json").is_file() or (folder / BOTTLENECK_CONFIG).is_file()


def result_base(recipe: Recipe, setup: Any, out: Path) -> dict | None:
    """The files of a local base folder that the finished run's result is loaded onto again
    (runs.base_record): the weights and config under an adapter or prompt folder, and the
    tokenizer too for an in-context run (its model is the base itself). A changed base would
    score and predict as another model under this run's name (a Hub id: its cached snapshot,
    which a later download moves); None where model/ is whole. A smoke run's base, the small
    random model `--smoke` builds again where eval, predict and export load the run, is recorded
    too: another transformers (or toolkit) builds it as another model under another cache key,
    and a LoRA result loaded onto that one was scored as the run's, exit 0."""
    if recipe.method.trains and not saved_on_base(out / "model"):
        return None
    patterns = runs.BASE_WEIGHTS + (("config.json",) if recipe.method.trains else runs.BASE_READ)
    return runs.base_record(base_source(recipe, setup), patterns)


def base_source(recipe: Recipe, setup: Any) -> str:
    """The folder (or Hub id) the run's model was loaded from: a smoke run's small model, found
    in the cache where setup built it (not built again), else the checkpoint as models.load got it."""
    return models.smoke_checkpoint(setup.source) if chain.rebuilt_base(recipe) else setup.source


def start_weights(recipe: Recipe, setup: Any) -> dict | None:
    """The weights, config and tokenizer of the folder the run's model was loaded from
    (runs.base_record of a local folder, a Hub id's cached snapshot, a chained run's upstream
    model/, a smoke run's small model), for every method alike: what a report tells seeds on
    another base apart by (reports.core.base_labels). Its generation_config too: the decoding a
    recipe leaves to it (metrics.json metric_info `generation`) moves a generation task's scores.
    Read by reports and by `toolkit run` of the finished run (chain.check_current, base_current);
    eval, predict and export never need it: a whole model/ loads without its base."""
    return runs.base_record(base_source(recipe, setup), chain.MODEL_FILES + ("generation_config.json",))


def examples_fingerprint(splits: dict[str, Any]) -> str:
    """sha256 over the examples of each eval split, in order (each split a datasets.Dataset)."""
    digest = hashlib.sha256()
    for name in sorted(splits):
        digest.update(name.encode())
        split = splits[name]
        for batch in (split.iter(batch_size=1000) if hasattr(split, "iter") else [list(split)]):
            digest.update(json.dumps(batch, sort_keys=True, default=str).encode())
    return digest.hexdigest()
