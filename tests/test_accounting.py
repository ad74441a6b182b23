"""Loss normalisation and batch accounting, walked over the task types.

Rule A: the training trajectory does not depend on how a global batch is split: 8 x 1 micro-batch
on one process equals 2 x 4 accumulated on one (the epoch's last window has fewer micro-batches)
and 2 x 2 accumulated on each of 2 processes, with an epoch whose last step is short (30 examples
in steps of 8: the last has 6, in 3 micro-batches of 2 over 2 processes, the fourth one padding
that accelerate adds; glue runs 4 x 1 on 26, where a process's whole last step is that padding;
squad's last step is one window of 36 tokens, which accelerate fills on the first process with a
repeat of 64: cut back to its own row, its micro-batch is as wide as the step's own examples).
Rule B: the schedule, the logged steps, epochs and samples count optimizer steps and examples.
Rule C (evaluation on 2 processes scores what one process scores, every task type) is
tests/test_distributed.py::test_every_task_scores_on_two_processes_what_one_process_scores.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, write_recipe
from test_train import only_run, train_losses, weights

# One recipe per kind of loss the tasks have: per example (classification), per token with a
# causal shift (CLM), per token with random masks (MLM), per target token of an encoder-decoder
# (summarization, translation), per tagged word (NER), per window (extractive QA, several per
# example at this doc_stride).
TASKS = {
    "glue": "model: {checkpoint: bert-base-uncased}\ntask: {name: glue, subset: mrpc, max_length: 64}",
    "clm": "model: {checkpoint: gpt2}\ntask: {name: clm, max_length: 32, train_file: $TOOLKIT_DATA/lm/ptb/ptb.valid.txt, "
           "eval_file: $TOOLKIT_DATA/lm/ptb/ptb.test.txt}",
    "mlm": "model: {checkpoint: roberta-base}\ntask: {name: mlm, max_length: 32, "
           "train_file: $TOOLKIT_DATA/lm/wikitext-2/valid.txt, eval_file: $TOOLKIT_DATA/lm/wikitext-2/test.txt}",
    "summarization": "model: {checkpoint: t5-base}\ntask: {name: summarization, subset: samsum, max_length: 96, "
                     "max_target_length: 24, generation: {num_beams: 2, max_new_tokens: 8}}",
    "translation": "model: {checkpoint: gpt2}\ntask: {name: translation, subset: multi30k, source_lang: en, "
                   "target_lang: de, max_length: 48, max_target_length: 24, generation: {max_new_tokens: 8}}",
    "ner": "model: {checkpoint: bert-base-uncased}\ntask: {name: ner, max_length: 48}",
    "squad": "model: {checkpoint: bert-base-uncased}\ntask: {name: squad, version: v1, max_length: 64, "
             "eval_file: $TOOLKIT_DATA/squad/v1.1/dev-v1.1.json, split_articles: 0.834, split_seed: 0, "
             "doc_stride: 20, max_answer_length: 10}",
}
# Registered tasks whose loss and batches take the path of one above: text_classification is
# glue's classification loss and collator on the user's files; denoise (BART) and span_corruption
# (T5) are an encoder-decoder's target-token loss (as summarization) on noise drawn per example and
# epoch by the same collator as MLM's (tasks/_text.py).
SAME_PATH = {"text_classification": "glue", "denoise": "mlm", "span_corruption": "mlm"}
TRAIN = """
method: {method}
train: {{epochs: 1, lr: 1.0e-2, warmup_steps: 1, seed: 3, eval_batch_size: 4, log_every: 1, keep_best: false,
         eval_every: 0}}
"""
# Training examples (lines, QA examples) giving under 32 rows (blocks, windows) and not a multiple
# of 8: the epoch's last step is short. 13 eval examples: not a multiple of 2 processes x 4.
TRAIN_EXAMPLES = {"mlm": 8, "squad": 3, "glue": 26}  # 26 blocks, 25 windows; the others' are rows
# (batch, grad_accum) of each of the 2 processes: 2 x 2, and for glue 4 x 1, where 26 examples are 7
# batches, so the second process's last step is one batch that accelerate made all of repeats
TWO_PROCESSES = {"glue": (4, 1)}
COMMON = ["--smoke", "model.dropout=0.0", "task.max_eval_samples=13"]
# Parameters whose gradient is 0 in exact arithmetic (a shift of every logit a softmax sees)
NO_OUTPUT_CHANGES = {"squad": ("qa_outputs.bias",)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# One launch of 2 processes runs every task's 2-process run in turn (each `toolkit run` resets
# accelerate's state, as a sweep does): a launch's start-up is most of a tiny run's time.
LAUNCHER = """import json, sys
sys.path.insert(0, {root!r})
from toolkit.cli import main
for args in json.loads(open(sys.argv[1]).read()):
    if main(args) != 0:
        sys.exit(f"failed: {{args}}")
"""


def _torchrun(tmp: Path, jobs: list, launcher: str = LAUNCHER) -> None:
    """`toolkit run` with each of `jobs` on 2 gloo processes (torchrun of the interpreter running
    the suite: make test-oldest's venv is not .venv); `launcher` reads the jobs file."""
    (tmp / "launch.py").write_text(launcher.format(root=str(ROOT)))
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(_free_port()), str(tmp / "launch.py"), str(tmp / "jobs.json")]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def _metrics(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


@pytest.fixture(scope="module")
def split_runs(tmp_path_factory: pytest.TempPathFactory, _smoke_cache: Path) -> dict[str, tuple[Path, Path, Path]]:
    """task -> (8 x 1 on one process, 2 x 4 accumulated on one, 2 x 2 accumulated (glue: 4 x 1)
    on each of 2 processes), made once for the rules that read them."""
    from toolkit.cli import main

    tmp = tmp_path_factory.mktemp("split")
    two_process_jobs = []
    for task in TASKS:
        method = "{name: prompt_tuning, num_virtual_tokens: 3}" if task == "clm" else "{name: full}"
        recipe = write_recipe(tmp / task / "r.yaml", TASKS[task] + TRAIN.format(method=method))
        common = [*COMMON, f"task.max_train_samples={TRAIN_EXAMPLES.get(task, 30)}"]
        for name, batch, accum in (("one", 8, 1), ("accum", 2, 4)):
            assert main(["run", str(recipe), "--runs-dir", str(tmp / task / name), *common,
                         f"train.batch_size={batch}", f"train.grad_accum={accum}"]) == 0
        batch, accum = TWO_PROCESSES.get(task, (2, 2))
        two_process_jobs.append(["run", str(recipe), "--runs-dir", str(tmp / task / "two"), *common,
                                 f"train.batch_size={batch}", f"train.grad_accum={accum}"])
    _torchrun(tmp, two_process_jobs)
    return {task: tuple(only_run(tmp / task / name) for name in ("one", "accum", "two")) for task in TASKS}


def test_every_registered_task_is_walked() -> None:
    """A task added to the registry fails here until the rules below walk it (or its path)."""
    from toolkit import tasks

    assert sorted(tasks.TASKS.names()) == sorted([*TASKS, *SAME_PATH])


@pytest.mark.parametrize("task", sorted(TASKS))
def test_rule_a_trajectory_is_the_same_however_the_global_batch_is_split(split_runs, task: str) -> None:
    """Per-step losses, learning rates, epochs and final weights of 8 x 1 on one process equal
    those of 2 x 4 accumulated (the epoch's last window has fewer micro-batches, its last one
    short) and of 2 x 2 on each of 2 processes (where accelerate pads the epoch's last batches)."""
    one, *others = split_runs[task]
    reference = _metrics(one)
    examples, steps = reference["train_samples"], reference["train_steps"]
    per_epoch = math.ceil(examples / 8)
    assert examples % 8 and steps >= per_epoch  # the epoch's short step was taken
    taken = steps // per_epoch * examples + steps % per_epoch * 8  # only an epoch's last step is short
    for run in (one, *others):
        m = _metrics(run)
        assert (m["train_samples"], m["train_steps"]) == (examples, steps)
        # the examples the steps took (metrics.json has their rate and the time), each once
        assert m["train_samples_per_second"] * m["train_runtime_s"] == pytest.approx(taken)
    two = TWO_PROCESSES.get(task, (2, 2))
    for run, batch, accum, processes in ((one, 8, 1, 1), (others[0], 2, 4, 1), (others[1], *two, 2)):
        # the log's epoch is Trainer's: the share of the epoch's micro-batches (one process's) taken
        per_process = math.ceil(math.ceil(examples / batch) / processes)
        epochs = [divmod(s, math.ceil(per_process / accum)) for s in range(1, steps + 1)]
        assert [e["epoch"] for e in _log(run) if "loss" in e] == [done + min(taken * accum, per_process) / per_process
                                                                 for done, taken in epochs]
        # metrics.json's train_loss is Trainer's: the mean of the steps' losses (logged at each step)
        assert _metrics(run)["train_loss"] == pytest.approx(sum(train_losses(run)) / steps, rel=1e-12)
    for run in others:
        m = _metrics(run)
        la, lb = ([(e["step"], e["lr"]) for e in _log(r) if "loss" in e] for r in (one, run))
        assert la == lb
        assert train_losses(run) == pytest.approx(train_losses(one), abs=2e-5)
        assert m["train_loss"] == pytest.approx(reference["train_loss"], abs=2e-5)
        # the last step's update, which no logged loss sees: the final model's eval loss
        assert m["eval"]["loss"] == pytest.approx(reference["eval"]["loss"], rel=2e-5)
        # Weights: within a tenth of train.lr. AdamW turns float noise on a gradient that is 0 in
        # exact arithmetic (QA's qa_outputs.bias: a softmax does not see a shift of all its
        # logits) into steps of about lr, in directions that change no output (the eval loss
        # above); a wrongly weighted step moves the weights that matter by about lr. Such a
        # parameter is left out: its steps are the noise's sign, up to lr each (0.0024 seen here)
        wa, wb = weights(one), weights(run)
        for key in wa:
            if key not in NO_OUTPUT_CHANGES.get(task, ()):
                torch.testing.assert_close(wb[key], wa[key], atol=1e-3, rtol=0)


def test_rule_b_schedule_and_counts_are_in_optimizer_steps(tmp_path: Path, cli, tiny_checkpoint) -> None:
    """10 examples in micro-batches of 2, 2 accumulated: 3 optimizer steps an epoch (the last of
    one micro-batch); max_steps 5 cuts the second epoch after 2 of its 3 steps. The warm-up (2)
    and the decay to 0 at step 5 count optimizer steps, the log's epoch at each step is the one
    the installed Trainer logs on the same shape of run (1.0 after the first epoch's last step,
    1.4 one step into the next: it said the whole epochs done, 1), the examples counted are those
    the 5 steps took (4 + 4 + 2 + 4 + 4), and train_loss is Trainer's, the mean step loss."""
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint("bert")}, dropout: 0.0}}
task: {{name: glue, subset: mrpc, max_length: 32, max_train_samples: 10, max_eval_samples: 8}}
method: {{name: full}}
train: {{epochs: 3, max_steps: 5, lr: 1.0e-3, warmup_steps: 2, batch_size: 2, grad_accum: 2, log_every: 1,
         eval_every: 0, keep_best: false, seed: 3}}
""")
    code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    run = only_run(tmp_path / "runs")
    log = _log(run)
    steps = [(e["step"], e["epoch"]) for e in log if "loss" in e]
    # Trainer's epoch: the epochs completed and the share of the current one's 5 micro-batches
    # taken (step 3 ends the first with its window of one; the cut at step 5 is 4 of 5 into the next)
    assert steps == [(1, 0.4), (2, 0.8), (3, 1.0), (4, 1.4), (5, 1.8)]
    # each step's lr is the one it trained at, as Trainer logs it: transformers' linear schedule read
    # after the optimizer's step and before the schedule's (the next step's lr was logged: step 5
    # said 0.0, and step 1 said half the peak though it trained at 0)
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    schedule, trained_at = get_scheduler("linear", optimizer, num_warmup_steps=2, num_training_steps=5), []
    for _ in range(5):
        optimizer.step()
        trained_at.append(schedule.get_last_lr()[0])
        schedule.step()
    assert trained_at == pytest.approx([0.0, 5e-4, 1e-3, 1e-3 * 2 / 3, 1e-3 / 3])
    assert [e["lr"] for e in log if "loss" in e] == pytest.approx(trained_at)
    assert [(e["step"], e["epoch"]) for e in log if "eval" in e] == [(3, 1.0), (5, 1.8)]  # the epoch's end, the cut
    m = _metrics(run)
    assert m["train_steps"] == 5 and m["train_samples"] == 10
    assert m["train_samples_per_second"] * m["train_runtime_s"] == pytest.approx(18)
    # logged every 2 steps (and at step 1), the same run logs the mean loss since the last logged step,
    # as Trainer does, across the epoch-end evaluation at step 3 that read the steps in between
    losses = [e["loss"] for e in log if "loss" in e]
    code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "every2", "train.log_every=2")
    assert code == 0, err
    every2 = [(e["step"], e["loss"]) for e in _log(only_run(tmp_path / "every2")) if "loss" in e]
    assert every2 == [(1, pytest.approx(losses[0])), (2, pytest.approx(losses[1])),
                      (4, pytest.approx((losses[2] + losses[3]) / 2))]
    # metrics.json's train_loss is the run's mean step loss, the steps after the last logged one too
    assert _metrics(run)["train_loss"] == pytest.approx(sum(losses) / 5, rel=1e-12)
    assert _metrics(only_run(tmp_path / "every2"))["train_loss"] == _metrics(run)["train_loss"]
    # the installed Trainer on the same shape of run (10 examples, 2 x 2, max_steps 5) says those
    # epochs, and its train_loss is the mean of its steps' logged losses
    epochs, logged, train_loss = _trainer_run(tmp_path / "trainer", examples=10, batch=2, accum=2, max_steps=5)
    assert [e for _, e in steps] == epochs
    assert train_loss == pytest.approx(sum(logged) / len(logged), rel=1e-6)


def _trainer_run(out: Path, examples: int, batch: int, accum: int, max_steps: int) -> tuple[list, list, float]:
    """(epoch of each logged step, each step's logged loss, train_loss) of transformers' Trainer
    training a 1-weight model on `examples` rows, logging every step."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
            return {"loss": ((self.w * x - labels) ** 2).mean()}

    data = Dataset.from_dict({"x": [float(i) for i in range(examples)], "labels": [0.5] * examples})
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=batch, gradient_accumulation_steps=accum,
                             max_steps=max_steps, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                             learning_rate=1e-2, disable_tqdm=True)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data)
    result = trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    return [h["epoch"] for h in history], [h["loss"] for h in history], result.training_loss


FAMILIES = {"bert-base-uncased": "bert", "gpt2": "gpt2", "roberta-base": "roberta", "t5-base": "t5"}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_a_warmup_ratio_rounding_up_to_the_whole_run_is_refused(tmp_path: Path, cli, tiny_checkpoint,
                                                                 task: str) -> None:
    """A shipped own-data recipe's warmup_ratio 0.06 on a few examples (one optimizer step an
    epoch) rounds up, as Trainer rounds it, to a warm-up of the whole run: its only step trained at
    (1-1)/1 of train.lr = 0, so the saved model was the base model, scored and reported with exit 0.
    Refused like a warmup_steps of the whole run, on every task's step count (rows, LM blocks, QA
    windows), before anything is written."""
    family = FAMILIES[TASKS[task].split("checkpoint: ")[1].split("}")[0]]
    recipe = write_recipe(tmp_path / "r.yaml", TASKS[task] + TRAIN.format(method="{name: full}"))
    code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs", f"model.checkpoint={tiny_checkpoint(family)}",
                       "train.warmup_steps=0", "train.warmup_ratio=0.06", "train.batch_size=64",
                       f"task.max_train_samples={TRAIN_EXAMPLES.get(task, 30)}", "task.max_eval_samples=4")
    assert code == 2 and err.count("error: ") == 1, err
    assert ("error: train.warmup_ratio: 0.06 of the run's 1 optimizer step rounds up to 1 warm-up step (as Trainer "
            "rounds it), all of the run: the warm-up would not end within the run") in err
    assert "(its only step trains at 0); set warmup_ratio: 0, or train more than one step" in err
    assert not (tmp_path / "runs").exists()
