"""Two gloo processes (torchrun) equal one process with the same global batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, write_recipe
from test_train import only_run, train_losses, weights

RECIPE = """model: {{checkpoint: {checkpoint}, dropout: 0.0}}
task: {{name: glue, subset: mrpc, max_length: 64, max_train_samples: 32, max_eval_samples: 30}}
method: {method}
train: {{epochs: 1, lr: 2.0e-3, seed: 3, eval_batch_size: 4, log_every: 1, keep_best: false}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("checkpoint, method", [
    ("roberta-base", "{name: lora, r: 4}"),
    ("bert-base-uncased", "{name: adapters, config: pfeiffer}"),
    ("roberta-base", "{name: prompt_tuning, num_virtual_tokens: 4}"),
    ("gpt2", "{name: icl, shots: 2}"),
])
def test_two_processes_equal_one(tmp_path: Path, cli, checkpoint: str, method: str) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=checkpoint, method=method))
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli("run", recipe, "--smoke", "--runs-dir", one, "train.batch_size=8")[0] == 0
    # torchrun of the interpreter running the suite (make test-oldest's venv is not .venv)
    cmd = [__import__("sys").executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(_free_port()), "-m", "toolkit.cli",
           "run", str(recipe), "--smoke", "--runs-dir", str(two), "train.batch_size=4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = only_run(one), only_run(two)
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    assert mb["num_processes"] == 2 and ma["num_processes"] == 1
    # 30 eval examples over 2 ranks in batches of 4: the padded tail must be counted once
    scores = {k: v for k, v in ma["eval"].items() if not k.startswith("loss")}
    assert scores == {k: mb["eval"][k] for k in scores}
    assert ma["eval"]["loss"] == pytest.approx(mb["eval"]["loss"], abs=1e-6)  # sums in another order
    if "icl" in method:
        assert ma["train_steps"] == mb["train_steps"] == 0
        return
    assert ma["train_steps"] == mb["train_steps"] == 4
    assert train_losses(a) == pytest.approx(train_losses(b), abs=1e-5)
    wa, wb = weights(a), weights(b)
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("env, message", [
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}, "FSDP needs a distributed launch"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1", "LOCAL_RANK": "0"}, "runs FSDP2 only"),
    ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed needs a distributed launch"),
    ({"ACCELERATE_USE_DEEPSPEED": "true", "LOCAL_RANK": "0", "deepspeed": None}, "DeepSpeed is not installed"),
])
def test_sharded_launch_that_cannot_run_here_is_refused_not_faked(tmp_path: Path, cli, monkeypatch,
                                                                   env: dict, message: str) -> None:
    """A sharded strategy the CPU cannot run as asked stops with one line before anything is
    built, rather than running as plain data parallel under its name."""
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased", method="{name: full}"))
    for key, value in env.items():
        if value is None:  # a package this machine does not have
            monkeypatch.setitem(sys.modules, key, None)
        else:
            monkeypatch.setenv(key, value)
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("strategy, kind", [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("zero2", "DEEPSPEED"),
                                            ("zero3", "DEEPSPEED")])
def test_launch_configs_load(strategy: str, kind: str) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ROOT / "configs" / "accelerate" / f"{strategy}.yaml"))
    assert config.distributed_type.value == kind
