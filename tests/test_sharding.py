"""FSDP2 and DeepSpeed ZeRO-2/3 on two CPU processes (gloo), launched as users launch them
(accelerate launch with configs/accelerate/fsdp.yaml, zero2.yaml, zero3.yaml), against plain data
parallel (ddp.yaml, or one process at the same global batch, which equals it) on the same seed
and batches: the same losses, the same saved model scoring the same on dev in one process, an
interrupted run resuming exactly from its sharded checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, write_recipe
from test_distributed import _free_port
from test_train import only_run, train_losses, weights

RECIPE = """model: {{checkpoint: {checkpoint}, dropout: 0.0}}
task: {{name: glue, subset: mrpc, max_length: 48, max_train_samples: 160, max_eval_samples: 30}}
method: {method}
train: {{epochs: 1, lr: 1.0e-3, seed: 5, batch_size: 4, eval_batch_size: 8, log_every: 1, eval_every: 10,
         keep_best: true}}
"""
STEPS = 20  # 160 examples / (4 per process x 2 processes)


def launch(strategy: str, recipe: Path, runs: Path, *args: str) -> subprocess.CompletedProcess:
    """Two CPU processes under `accelerate launch --config_file configs/accelerate/<strategy>.yaml`."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / f"{strategy}.yaml"), "--num_processes", "2",
           "--main_process_port", str(_free_port()), "-m", "toolkit.cli", "run", str(recipe),
           "--runs-dir", str(runs), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (proc.stdout[-1500:], proc.stderr[-4000:])


SHARDED = {"fsdp": ("FSDP", "pytorch_model_fsdp_0"), "zero2": ("DEEPSPEED", "pytorch_model"),
           "zero3": ("DEEPSPEED", "pytorch_model")}  # distributed_type, the sharded checkpoint's folder


@pytest.mark.parametrize("strategy, family, method, reference, stop_after", [
    ("fsdp", "bert", "{name: full}", "ddp", None),  # BERT: the family accelerate 1.15 cannot shard
    # against one process with the same global batch (which equals DDP: test_distributed), to
    # spare a launch: resumed from the sharded checkpoint of step 7; T5's tied embeddings, and
    # its evaluation generating under FSDP
    ("fsdp", "gpt2", "{name: lora, r: 4}", "one", 7),
    ("fsdp", "t5", "{name: lora, r: 4}", "one", None),
    # DeepSpeed's engine on CPU processes: ZeRO-2 (optimizer state and gradients sharded); ZeRO-3
    # with zero3_init_flag (the model partitioned as it loads), resumed from the engine's own
    # checkpoint, a LoRA with no 1-d parameter to train (one optimizer group); T5 generating with
    # its parameters partitioned
    ("zero2", "bert", "{name: full}", "one", None),
    ("zero3", "gpt2", "{name: lora, r: 4}", "one", 7),
    ("zero3", "t5", "{name: lora, r: 4}", "one", None),
])
def test_sharded_equals_ddp(tmp_path: Path, cli, tiny_checkpoint, strategy: str, family: str, method: str,
                            reference: str, stop_after: int | None) -> None:
    """The small random model of the family (not --smoke, which caps a run at 4 steps)."""
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint(family), method=method))
    ddp, sharded = tmp_path / "ddp", tmp_path / strategy
    if reference == "ddp":
        _ok(launch("ddp", recipe, ddp))
    else:
        assert cli("run", recipe, "--runs-dir", ddp, "train.batch_size=8")[0] == 0
    if stop_after:
        _ok(launch(strategy, recipe, sharded, "--stop-after", str(stop_after)))
        assert not (only_run(sharded) / "metrics.json").exists()
        assert list((only_run(sharded) / "checkpoints").glob(f"step-*/{SHARDED[strategy][1]}"))  # sharded
    proc = launch(strategy, recipe, sharded)
    _ok(proc)
    assert ("resuming from" in proc.stdout) == bool(stop_after)
    a, b = only_run(ddp), only_run(sharded)
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    assert (ma["distributed_type"], mb["distributed_type"]) == ({"ddp": "MULTI_CPU", "one": "NO"}[reference], SHARDED[strategy][0])
    assert ma["train_steps"] == mb["train_steps"] == STEPS
    assert train_losses(b) == pytest.approx(train_losses(a), rel=1e-4)
    assert mb["eval"] == pytest.approx(ma["eval"], rel=1e-4)
    wa, wb = weights(a), weights(b)  # one plain folder, the same tensors (adapters: PEFT's names)
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], atol=1e-5, rtol=1e-4)
    # the saved model, loaded in this one process (from_pretrained / PEFT), scores what the run said
    code, _, err = cli("eval", b)
    assert code == 0, err
    assert json.loads((b / "eval-eval.json").read_text())["eval"] == pytest.approx(mb["eval"], rel=1e-5)


# Ran under FSDP (2 steps) and DeepSpeed ZeRO-2 and ZeRO-3 (20 steps) on 2 CPU processes (BERT,
# mrpc): each trains and saves; the rest are refused (one rule for both: sharding.unsupported).
RUNS_SHARDED = {"full", "lora", "dora", "adapters", "ia3", "bitfit", "freeze", "prefix_tuning",
                   "prompt_tuning", "p_tuning"}


def test_every_method_runs_sharded_or_is_refused_in_one_line() -> None:
    from toolkit import sharding
    from toolkit.methods import METHODS

    for name in METHODS.names():
        why = sharding.unsupported(METHODS.get(name)())
        assert (why is None) == (name in RUNS_SHARDED), (name, why)
        assert why is None or "\n" not in why


def test_smoke_model_is_built_whole_under_a_zero3_launch(tmp_path: Path, monkeypatch) -> None:
    """A --smoke run launched under ZeRO-3 (whose config accelerate registers with transformers)
    builds the cached random model whole, not as the empty local shards DeepSpeed's zero.Init
    leaves, which the cache would then hand to every later run."""
    from safetensors.torch import load_file
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    from toolkit import models

    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path))
    launch_config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        assert is_deepspeed_zero3_enabled()
        folder = models.smoke_checkpoint("bert-base-uncased")
        assert is_deepspeed_zero3_enabled()  # the launch's config is registered again afterwards
    finally:
        unset_hf_deepspeed_config()
    del launch_config
    weights = load_file(Path(folder) / "model.safetensors")
    assert weights and all(w.numel() > 0 for w in weights.values())


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_two_runs_in_one_sharded_launch_each_run_as_alone(tmp_path: Path, tiny_checkpoint, strategy: str) -> None:
    """A second run in the same launch (the Python API called twice, a script of runs): the first
    run's sharding state was left in accelerate's shared state, and the second was refused under
    FSDP ('fsdp_version: the toolkit runs FSDP2 only') and raised an AttributeError under ZeRO-3.
    Each run now starts from the launch's state (`sharding.restore_launch_kind`)."""
    from test_accounting import LAUNCHER

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("gpt2"),
                                                            method="{name: lora, r: 4}"))
    small = ["task.max_train_samples=16", "task.max_eval_samples=8", "train.eval_every=0"]
    jobs = [["run", str(recipe), "--runs-dir", str(tmp_path / f"runs-{seed}"), *small, f"train.seed={seed}"]
            for seed in (1, 2)]
    (tmp_path / "launch.py").write_text(LAUNCHER.format(root=str(ROOT)))
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / f"{strategy}.yaml"), "--num_processes", "1",
           "--main_process_port", str(_free_port()), str(tmp_path / "launch.py"), str(tmp_path / "jobs.json")]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds = [json.loads((only_run(tmp_path / f"runs-{seed}") / "metrics.json").read_text())["distributed_type"]
             for seed in (1, 2)]
    assert kinds == [SHARDED[strategy][0]] * 2
