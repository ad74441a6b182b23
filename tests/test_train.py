"""The training loop: accumulation normalisation, exact resume, saved models, real MiniLM learning."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import MINILM, write_recipe

RECIPE = """model: {{checkpoint: {checkpoint}}}
task: {{name: glue, subset: sst2, max_length: 64}}
method: {method}
train: {{epochs: 1, lr: 1.0e-3, batch_size: 8, warmup_ratio: 0.1, seed: 7, keep_best: false}}
"""


def nan_loss_at_forward(monkeypatch: pytest.MonkeyPatch, n: int) -> list:
    """The loop's `n`-th forward (counted from 1 in this process) gives a NaN loss; returns the
    list that grows by one item a forward."""
    from toolkit import train

    forward, calls = train.Loop._forward_loss, []

    def nan_at(self, batch):  # noqa: ANN001
        calls.append(1)
        loss = forward(self, batch)
        return loss * float("nan") if len(calls) == n else loss

    monkeypatch.setattr(train.Loop, "_forward_loss", nan_at)
    return calls


def make_recipe(tmp_path: Path, checkpoint: str = "bert-base-uncased", method: str = "{name: full}",
                name: str = "r") -> Path:
    return write_recipe(tmp_path / f"{name}.yaml", RECIPE.format(checkpoint=checkpoint, method=method))


def only_run(runs_dir: Path) -> Path:
    found = [p.parent for p in runs_dir.rglob("recipe.yaml")]
    assert len(found) == 1, found
    return found[0]


def weights(run: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted((run / "model").glob("*.safetensors")):
        out.update(load_file(file))
    assert out
    return out


def train_losses(run: Path) -> list[float]:
    lines = [json.loads(l) for l in (run / "log.jsonl").read_text().splitlines()]
    return [l["loss"] for l in lines if "loss" in l]


def test_accumulated_micro_batches_equal_one_large_batch(tmp_path: Path, cli) -> None:
    """7 examples as micro-batches of 3, 3 and 1 must equal one batch of 7 (per-example weighting)."""
    recipe = make_recipe(tmp_path)
    common = ["--smoke", "model.dropout=0.0", "task.max_train_samples=7", "train.max_steps=2",
              "train.log_every=1"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli("run", recipe, "--runs-dir", a, *common, "train.batch_size=3", "train.grad_accum=3")[0] == 0
    assert cli("run", recipe, "--runs-dir", b, *common, "train.batch_size=7", "train.grad_accum=1")[0] == 0
    run_a, run_b = only_run(a), only_run(b)
    assert train_losses(run_a) == pytest.approx(train_losses(run_b), abs=1e-6)
    wa, wb = weights(run_a), weights(run_b)
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=2e-6, rtol=1e-5)
    assert json.loads((run_a / "metrics.json").read_text())["train_steps"] == 2


@pytest.mark.parametrize("family_id, method, stop_after", [
    ("bert-base-uncased", "{name: full}", 1),
    ("t5-base", "{name: lora, r: 4}", 3),
    ("facebook/bart-base", "{name: adapters, config: houlsby}", 2),
    ("roberta-base", "{name: prefix_tuning, num_virtual_tokens: 4}", 1),
    ("bert-base-uncased", "{name: prompt_tuning, num_virtual_tokens: 4}", 3),
    ("roberta-base", "{name: p_tuning, num_virtual_tokens: 4}", 2),
    ("gpt2", "{name: ia3}", 1),
    ("bert-base-uncased", "{name: bitfit}", 2),
    ("gpt2", "{name: freeze}", 3),
])
def test_resumed_run_equals_uninterrupted(tmp_path: Path, cli, family_id: str, method: str, stop_after: int) -> None:
    """Stop after k steps (dropout on), resume, and land on the same weights and metrics. Stopped
    after 2 with log_every 3, the logging window is open across the stop: the loss logged at
    step 3 is the mean of steps 2 and 3 in both runs."""
    recipe = make_recipe(tmp_path, family_id, method)
    common = ["--smoke", "task.max_train_samples=12", "train.max_steps=4", f"train.log_every={3 if stop_after == 2 else 1}"]
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert cli("run", recipe, "--runs-dir", full, *common)[0] == 0
    assert cli("run", recipe, "--runs-dir", parts, *common, "--stop-after", stop_after)[0] == 0
    interrupted = only_run(parts)
    assert not (interrupted / "metrics.json").exists()
    code, out, _ = cli("run", recipe, "--runs-dir", parts, *common)
    assert code == 0 and "resuming from" in out
    a, b = only_run(full), interrupted
    assert train_losses(a) == train_losses(b)
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    assert ma["eval"] == mb["eval"] and ma["train_steps"] == mb["train_steps"] == 4
    # the run's mean loss (Trainer's train_loss) covers the steps before the stop too
    assert ma["train_loss"] == mb["train_loss"] is not None
    if stop_after != 2:  # logged at every step: the mean of the logged losses
        assert ma["train_loss"] == pytest.approx(sum(train_losses(a)) / 4, rel=1e-12)


def _reload_accuracy(model: torch.nn.Module, tokenizer, max_eval: int = 32) -> float:

    from toolkit.tasks.glue import Glue

    task = Glue(subset="sst2", max_length=64, max_eval_samples=max_eval)
    dev = task.encode(task.load()["eval"][""], tokenizer)
    batch = task.collator(tokenizer)([dev[i] for i in range(len(dev))])
    model.eval()
    with torch.no_grad():
        preds = task.outputs(model(**task.model_inputs(batch)), batch)["preds"]
    return float((preds == batch["labels"]).float().mean())


def test_full_model_reloads_with_plain_transformers(tmp_path: Path, cli, runs_dir: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    assert cli("run", make_recipe(tmp_path, "roberta-base"), "--smoke", "--runs-dir", runs_dir)[0] == 0
    run = only_run(runs_dir)
    metrics = json.loads((run / "metrics.json").read_text())
    model = AutoModelForSequenceClassification.from_pretrained(run / "model")
    assert _reload_accuracy(model, AutoTokenizer.from_pretrained(run / "model")) == metrics["eval"]["accuracy"]
    assert metrics["trainable_params"] == metrics["total_params"] > 0
    assert {"train_runtime_s", "train_samples_per_second", "peak_memory_mb", "recipe_hash", "seed",
            "eval_runtime_s", "eval_samples_per_second"} <= set(metrics)
    # what the scores are of: the task's files, and the examples scored (the 32 of max_eval_samples)
    from toolkit import run_metrics, runs
    from toolkit.tasks.glue import Glue

    task = Glue(subset="sst2", max_length=64, max_eval_samples=32)
    assert metrics["data_sha256"] == runs.data_fingerprint(task.data_files())
    assert metrics["eval_sha256"] == run_metrics.examples_fingerprint(task.load()["eval"])
    assert metrics["eval_samples"] == {"": 32}  # per eval split: the GLUE report's "scored whole"
    other = Glue(subset="sst2", max_length=64, max_eval_samples=31).load()["eval"]
    assert metrics["eval_sha256"] != run_metrics.examples_fingerprint(other)


def test_lora_adapter_reloads_with_peft(tmp_path: Path, cli, runs_dir: Path, tiny_checkpoint) -> None:
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    recipe = make_recipe(tmp_path, "gpt2", "{name: lora, r: 4}")
    assert cli("run", recipe, "--smoke", "--runs-dir", runs_dir)[0] == 0
    run = only_run(runs_dir)
    metrics = json.loads((run / "metrics.json").read_text())
    assert (run / "model" / "adapter_config.json").is_file()
    assert 0 < metrics["trainable_params"] < metrics["total_params"]
    tok = AutoTokenizer.from_pretrained(run / "model")
    base = AutoModelForSequenceClassification.from_pretrained(tiny_checkpoint("gpt2"), num_labels=2,
                                                              pad_token_id=tok.pad_token_id)
    model = PeftModel.from_pretrained(base, run / "model")
    assert _reload_accuracy(model, tok) == metrics["eval"]["accuracy"]


def test_real_minilm_learns_sst2(tmp_path: Path, cli, runs_dir: Path) -> None:
    """The real pretrained checkpoint, real data: well above chance after a short full fine-tune
    (20 steps: 0.765 on these 400; 40 steps gave 0.7575)."""
    recipe = make_recipe(tmp_path, MINILM)
    code, _, err = cli("run", recipe, "--runs-dir", runs_dir, "task.max_train_samples=320",
                       "task.max_eval_samples=400", "train.lr=3e-4", "train.batch_size=16",
                       "task.max_length=48")
    assert code == 0, err
    metrics = json.loads((only_run(runs_dir) / "metrics.json").read_text())
    assert metrics["eval"]["accuracy"] > 0.7
    losses = train_losses(only_run(runs_dir))
    assert sum(losses[-2:]) / 2 < losses[0]


@pytest.mark.parametrize("stop_after", [[], ["--stop-after", 2]])
def test_early_stopping_and_best_model(tmp_path: Path, cli, runs_dir: Path, stop_after: list) -> None:
    """lr 0: nothing improves after the first evaluation, so patience 1 stops at the second.
    `--stop-after 2`, the step early stopping fires at, finishes the run as well: it was left
    unfinished (a checkpoint, no metrics.json, nothing said, exit 0) though nothing was left to train."""
    recipe = make_recipe(tmp_path)
    code, out, err = cli("run", recipe, "--smoke", "--runs-dir", runs_dir, "train.lr=0",
                         "train.early_stopping_patience=1", "train.keep_best=true", "train.max_steps=4",
                         "train.eval_every=1", "task.max_train_samples=32", "train.batch_size=4", *stop_after)
    assert code == 0, err
    run = only_run(runs_dir)
    assert f"{run}: accuracy=" in out, out + err  # the finished run's line
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["train_steps"] == 2 and (run / "model").is_dir() and not (run / "checkpoints").exists()
    evals = [json.loads(l) for l in (run / "log.jsonl").read_text().splitlines() if "eval" in l]
    assert metrics["train_steps"] < 4 and len(evals) == 2
    assert metrics["best_step"] == evals[0]["step"] and metrics["eval"] == evals[0]["eval"]


def test_length_grouped_batches_cover_every_example_once() -> None:
    from toolkit.train import EpochBatches

    lengths = [(i * 37) % 101 for i in range(2030)]
    sampler = EpochBatches(lengths, batch_size=8, seed=1, group_by_length=True)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(2030))
    assert len(batches) == len(sampler) and len(batches[-1]) == 2030 % 8  # the short batch stays last

    def padding(bs: list[list[int]]) -> int:
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in bs)

    plain = list(EpochBatches(lengths, batch_size=8, seed=1, group_by_length=False))
    assert padding(batches) < padding(plain) / 10  # batches of similar lengths
    firsts = [lengths[b[0]] for b in batches[:50]]
    assert firsts != sorted(firsts, reverse=True)  # ...in random order, not long-to-short
    sampler.use_epoch(1)
    assert list(sampler) != batches  # a new order each epoch, from (seed, epoch) alone
    # an optimizer step holds the same examples however it is split into processes/micro-batches
    # (batch 2 x 4 micro-batches or processes per step against batch 8 x 1)
    split = list(EpochBatches(lengths, batch_size=2, seed=1, group_by_length=True, step=8))
    one = list(EpochBatches(lengths, batch_size=8, seed=1, group_by_length=True, step=8))
    assert [sorted(b) for b in one] == [sorted(sum(split[i:i + 4], [])) for i in range(0, len(split), 4)]
    sampler.use_epoch(0)
    assert list(sampler) == batches


@pytest.mark.parametrize("group_by_length", [False, True])
def test_accelerate_filling_the_last_batch_leaves_the_epoch_as_it_was(group_by_length: bool) -> None:
    """accelerate (even_batches) fills the epoch's short last batch in place with the epoch's
    first examples; the sampler's own record of the epoch (what `step_length` and so extractive
    QA's width read) held the repeats, and the last step was padded to a repeat's length. A
    batch cut back to its own rows is brought to the step's width, cut where it is wider."""
    from accelerate.data_loader import BatchSamplerShard

    from toolkit.batching import fit_inputs
    from toolkit.train import EpochBatches

    lengths = [60, 50, 40, 9, 30]  # 5 examples in batches of 2 on 2 processes: the last batch is short
    sampler = EpochBatches(lengths, batch_size=2, seed=0, group_by_length=group_by_length, step=4)
    before, widths = [list(b) for b in sampler.epoch_batches()], [sampler.step_length(s) for s in (0, 1)]
    served = [list(BatchSamplerShard(sampler, num_processes=2, process_index=p)) for p in (0, 1)]
    assert len(served[0][-1]) == 2 and served[0][-1][0] == before[-1][0]  # filled with a repeat
    assert sampler.epoch_batches() == before and [sampler.step_length(s) for s in (0, 1)] == widths
    assert widths[1] == lengths[before[-1][0]]  # the last step: its own example alone
    batch = {"input_ids": torch.ones(1, 60, dtype=torch.long), "attention_mask": torch.ones(1, 60),
             "start_positions": torch.zeros(1, dtype=torch.long)}  # a filled batch cut to its own row
    fitted = fit_inputs(batch, widths[1], pad_id=0)
    assert fitted["input_ids"].shape == fitted["attention_mask"].shape == (1, widths[1])
    assert fitted["start_positions"].shape == (1,)
    assert fit_inputs(batch, 64, pad_id=0)["attention_mask"][0, 60:].sum() == 0  # narrower: padded


@pytest.mark.parametrize("group_by_length", [False, True])
def test_no_two_seeds_share_an_epochs_order(group_by_length: bool) -> None:
    """The order of epoch e of seed s was seeded by s * 1000 + e: epoch 1000 of seed 0 was epoch 0
    of seed 1 (and 1001 of seed 0 its epoch 1, ...), so seeds of a long run on a small data set
    shared their orders (exit 0). Epochs below 1000 keep the orders runs took (and so their
    results), with and without length grouping."""
    from toolkit.train import EpochBatches

    lengths = [(i * 37) % 101 for i in range(64)]

    def order(seed: int, epoch: int) -> list[list[int]]:
        sampler = EpochBatches(lengths, batch_size=4, seed=seed, group_by_length=group_by_length)
        sampler.use_epoch(epoch)
        return list(sampler)

    plain = torch.randperm(64, generator=torch.Generator().manual_seed(3 * 1000 + 999)).tolist()
    assert group_by_length or order(3, 999) == [plain[i:i + 4] for i in range(0, 64, 4)]  # as before
    assert order(0, 1000) != order(1, 0) and order(0, 1001) != order(1, 1) and order(1, 1000) != order(2, 0)
    assert order(0, 1000) != order(0, 999) and order(0, 1000) == order(0, 1000)
    assert order(2**32 - 1, 10**6) != order(2**32 - 2, 10**6)  # the largest seeds, far epochs


def test_bf16_mixed_precision_runs(tmp_path: Path, cli, runs_dir: Path) -> None:
    code, _, err = cli("run", make_recipe(tmp_path), "--smoke", "--runs-dir", runs_dir,
                       "train.mixed_precision=bf16", "train.max_steps=2")
    assert code == 0, err
    metrics = json.loads((only_run(runs_dir) / "metrics.json").read_text())
    assert metrics["mixed_precision"] == "bf16" and metrics["train_steps"] == 2


def test_gradient_checkpointing_gives_the_same_result(tmp_path: Path, cli) -> None:
    """Recomputing activations changes memory, not the numbers: with dropout on, the recompute
    draws the forward's masks again (torch's checkpoint restores the CPU generator, which seeds
    the toolkit's fast dropout masks); at lr 1e-2 a dropout of 0.31 instead of 0.3 fails this."""
    recipe = make_recipe(tmp_path, method="{name: lora, r: 4}")
    common = ["--smoke", "model.dropout=0.3", "train.lr=1e-2", "train.max_steps=2"]
    assert cli("run", recipe, "--runs-dir", tmp_path / "a", *common)[0] == 0
    assert cli("run", recipe, "--runs-dir", tmp_path / "b", *common, "train.gradient_checkpointing=true")[0] == 0
    wa, wb = weights(only_run(tmp_path / "a")), weights(only_run(tmp_path / "b"))
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-6, rtol=1e-5)


def test_evaluation_serves_longest_first_and_scores_in_dataset_order() -> None:
    """Sorted evaluation pads less; the task still sees its outputs in dataset order."""
    import numpy as np
    from accelerate import Accelerator
    from datasets import Dataset
    from torch.utils.data import DataLoader

    from toolkit import evaluation
    from toolkit.train import LengthOrder

    lengths = [3, 9, 1, 7, 7, 2, 5]
    ds = Dataset.from_dict({"input_ids": [[1] * n for n in lengths], "pos": list(range(len(lengths)))})
    served: list[int] = []

    def collate(rows: list[dict]) -> dict:
        return {"pos": torch.tensor([r["pos"] for r in rows]),
                "width": torch.tensor([max(len(r["input_ids"]) for r in rows)] * len(rows))}

    class Toy:
        def eval_step(self, model: object, batch: dict) -> dict:
            served.extend(batch["pos"].tolist())
            n = len(batch["pos"])
            return {"pos": batch["pos"], "width": batch["width"], "loss": torch.zeros(n), "units": torch.ones(n)}

        def eval_pad(self, key: str) -> int:
            return 0

        def score(self, arrays: dict, raw: object) -> dict:
            return {"in_order": float((arrays["pos"] == np.arange(len(lengths))).all()),
                    "padded": float(arrays["width"].sum())}

        def predictions(self, arrays: dict, raw: object) -> None:
            return None

    sampler = LengthOrder(lengths)
    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(ds, batch_size=3, sampler=sampler, collate_fn=collate))
    metrics = evaluation.evaluate(torch.nn.Linear(1, 1), {"": loader}, Toy(), acc, {"": None},
                                  orders={"": sampler.order})
    assert [lengths[i] for i in served] == sorted(lengths, reverse=True)
    assert metrics["in_order"] == 1.0
    plain = acc.prepare(DataLoader(ds, batch_size=3, collate_fn=collate))
    unsorted = evaluation.evaluate(torch.nn.Linear(1, 1), {"": plain}, Toy(), acc, {"": None})
    assert metrics["padded"] < unsorted["padded"]  # widths 9,7,7 / 5,3,2 / 1 against 3,9,1 / 7,7,2 / 5


def test_peak_memory_is_reset_between_runs_of_one_process() -> None:
    """A sweep runs many recipes in one process: each must report its own peak, not the
    largest so far (getrusage's ru_maxrss cannot be reset; VmHWM can)."""
    from toolkit import train

    cpu = torch.device("cpu")
    big = torch.ones(100_000_000)  # 400 MB, touched
    big.add_(1)
    before = train._peak_memory_mb(cpu)
    del big
    train.reset_peak_memory(cpu)
    assert train._peak_memory_mb(cpu) < before - 300


def test_a_peak_that_cannot_be_reset_is_no_later_run_s_peak(tmp_path: Path, monkeypatch) -> None:
    """Where the process's peak cannot be forgotten (no /proc/self/clear_refs, or not allowed),
    the peak read in a process's second run is the process's, perhaps the first run's: it was
    written as metrics.json's peak_memory_mb of the second, exit 0. Now the first run of the
    process reports it (nothing ran before), a later one null, as the docs say."""
    from toolkit import devices

    cpu = torch.device("cpu")
    monkeypatch.setattr(devices, "_peaks", {"runs": 0, "unreset": False})
    monkeypatch.setattr(devices, "CLEAR_REFS", tmp_path / "no" / "clear_refs")  # the write fails
    devices.reset_peak_memory(cpu)
    assert devices.run_peak_memory_mb(cpu) == devices.peak_memory_mb(cpu) > 0
    devices.reset_peak_memory(cpu)
    assert devices.run_peak_memory_mb(cpu) is None
    monkeypatch.setattr(devices, "CLEAR_REFS", tmp_path / "clear_refs")  # a reset that works: the run's own
    devices.reset_peak_memory(cpu)
    assert devices.run_peak_memory_mb(cpu) == devices.peak_memory_mb(cpu)


def test_fast_dropout_changes_only_the_dropout_stream(tmp_path: Path, cli) -> None:
    """train.fast_dropout switches the CPU dropout: with dropout off the two runs are the same
    to the bit; with it on they draw other masks, so their losses differ."""
    recipe = make_recipe(tmp_path)
    common = ["--smoke", "task.max_train_samples=16", "train.max_steps=2", "train.log_every=1"]
    losses = {}
    for p in ("0.0", "0.3"):
        for fast in ("true", "false"):
            out = tmp_path / f"{p}-{fast}"
            assert cli("run", recipe, "--runs-dir", out, *common, f"model.dropout={p}", f"train.fast_dropout={fast}")[0] == 0
            losses[p, fast] = train_losses(only_run(out))
    assert losses["0.0", "true"] == losses["0.0", "false"]
    assert losses["0.3", "true"] != losses["0.3", "false"]
    assert losses["0.3", "true"][0] != losses["0.0", "true"][0]  # dropout did act


def test_fast_dropout_takes_a_bool_only(tmp_path: Path, cli) -> None:
    for value, got in (("sometimes", "str 'sometimes'"), ("null", "NoneType None")):
        code, _, err = cli("run", make_recipe(tmp_path), f"train.fast_dropout={value}", "--runs-dir", tmp_path / "runs")
        assert code == 2 and err.strip() == f"error: train.fast_dropout: expected bool, got {got}"
    assert not (tmp_path / "runs").exists()  # refused before anything is written


def test_train_loss_is_null_where_the_steps_before_a_resume_are_unknown() -> None:
    """A checkpoint written before the run's loss sum was kept resumes with none: the mean of the
    later steps alone is not the run's train_loss, so it says null; a kept sum gives its mean."""
    from toolkit import run_metrics
    from toolkit.checkpoints import State

    assert run_metrics.train_loss(State(step=3)) is None
    assert run_metrics.train_loss(State(step=3, run_loss=[0.0, 0])) is None  # no finite step
    assert run_metrics.train_loss(State(step=3, run_loss=[3.0, 2])) == 1.5


@pytest.mark.parametrize("samples, steps, epochs", [(8, [2, 4], [1, 2]), (24, [3, 4], [1, 4 / 3])])
def test_each_evaluation_logs_the_epochs_completed(tmp_path: Path, cli, runs_dir: Path, samples: int,
                                                   steps: list, epochs: list) -> None:
    """2 epochs of 2 steps: the end-of-epoch evaluations are logged at epochs 1 and 2 (the last
    one too); 2 epochs of 3 steps cut at 4 steps (--smoke's cap): the final evaluation is inside
    the second epoch, a third of it taken: 1.333, as Trainer's `state.epoch` says (it said 1)."""
    recipe = make_recipe(tmp_path)
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", runs_dir, "train.epochs=2",
                       f"train.batch_size={8 if samples == 24 else 4}",
                       f"task.max_train_samples={samples}", "task.max_eval_samples=8")
    assert code == 0, err
    evals = [json.loads(l) for l in (only_run(runs_dir) / "log.jsonl").read_text().splitlines() if "eval" in l]
    assert [(e["step"], e["epoch"]) for e in evals] == list(zip(steps, epochs))


@pytest.mark.parametrize("given, said, fits, smoke", [
    ("warmup_steps=3", "train.warmup_steps: 3 is more than the run's 2 optimizer steps", "use at most 1,",
     "warmup_steps=500"),
    ("warmup_steps=2", "train.warmup_steps: 2 is all the run's 2 optimizer steps", "use at most 1,", None),
    ("warmup_ratio=0.6", "train.warmup_ratio: 0.6 of the run's 2 optimizer steps rounds up to 2 warm-up steps",
     "use a warmup_ratio of at most 0.5 (or train.warmup_steps of at most 1)", "warmup_ratio=1.0"),
    ("warmup_ratio=1.0", "train.warmup_ratio: 1 of the run's 2 optimizer steps rounds up to 2 warm-up steps", "", None)])
def test_a_warmup_that_does_not_end_within_the_run_is_refused(tmp_path: Path, cli, runs_dir: Path, tiny_checkpoint,
                                                              given: str, said: str, fits: str,
                                                              smoke: str | None) -> None:
    """8 examples in batches of 4 are 2 optimizer steps. Step k of a warm-up of W steps trains at
    (k-1)/W of train.lr (transformers' linear schedule), so train.lr is first taken at step W+1:
    with warmup_steps 3 the run stopped at 1/3 of it, and with 2 (all of its steps; it was let
    through) at 1/2, and said nothing; a warmup_ratio whose steps round up (Trainer's ceil) to all
    of them did the same, by the CLI and the API. A warm-up of one step less reaches it at the
    last step. --smoke keeps the warm-up within its few steps, so a recipe's warm-up still smoke-runs;
    at train.lr 0 (a recipe's "before training" figure) the warm-up is not judged."""
    from toolkit import api
    from toolkit.errors import UserError

    recipe = make_recipe(tmp_path, checkpoint=tiny_checkpoint("bert"))
    by_steps = given.startswith("warmup_steps")
    common = ["task.max_train_samples=8", "task.max_eval_samples=8", "train.batch_size=4",
              *(["train.warmup_ratio=0"] if by_steps else [])]  # the recipe's is 0.1
    code, _, err = cli("run", recipe, "--runs-dir", runs_dir, *common, f"train.{given}")
    assert code == 2 and err.count("error: ") == 1, err
    assert f"error: {said}" in err and "the warm-up would not end within the run" in err and fits in err
    with pytest.raises(UserError, match="the warm-up would not end within the run"):
        api.run(recipe, [*common, f"train.{given}"], runs_dir=runs_dir)
    assert not runs_dir.exists()
    if smoke is None:  # at train.lr 0 nothing trains whatever the warm-up: a "before training" figure runs
        code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "before", *common, f"train.{given}", "train.lr=0")
        assert code == 0, err
        return
    fitting = "train.warmup_steps=1" if by_steps else "train.warmup_ratio=0.5"
    code, _, err = cli("run", recipe, "--runs-dir", runs_dir, *common, fitting, "train.log_every=1")
    assert code == 0, err
    lrs = [json.loads(l)["lr"] for l in (only_run(runs_dir) / "log.jsonl").read_text().splitlines() if '"lr"' in l]
    assert lrs == pytest.approx([0.0, 1e-3])  # the lr each step trained at: train.lr at the last
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "smoke", *common[3:], f"train.{smoke}")
    assert code == 0, err


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2", "bart", "t5"])
def test_full_fine_tuning_decays_what_trainer_decays(tiny_checkpoint, family: str) -> None:
    """The optimizer's decayed group holds the tensors Trainer decays
    (`Trainer.get_decay_parameter_names`), no more: T5's relative_attention_bias, a 2-d table of
    biases, was decayed, which Trainer keeps out by its name (exit 0)."""
    from types import SimpleNamespace

    from transformers import AutoConfig, Trainer

    from conftest import FAMILY_IDS
    from toolkit import models
    from toolkit.methods import METHODS
    from toolkit.train import _optimizer

    path = tiny_checkpoint(family)
    head = "seq2seq-lm" if AutoConfig.from_pretrained(path).is_encoder_decoder else "sequence-classification"
    model = models.load(path, head, {"num_labels": 2} if head.startswith("sequence") else {})[0]
    recipe = SimpleNamespace(method=METHODS.get("full")(),
                             train=SimpleNamespace(weight_decay=0.1, lr=1e-3, precision_mode="autocast"))
    decayed = {id(p) for p in _optimizer(model, recipe, torch.device("cpu")).param_groups[0]["params"]}
    trainer = {id(model.get_parameter(n)) for n in Trainer.get_decay_parameter_names(None, model)}
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[i] for i in decayed ^ trainer) == [], FAMILY_IDS[family]


def test_more_epochs_than_steps_can_count_is_one_line(tmp_path: Path, cli, runs_dir: Path, tiny_checkpoint) -> None:
    """A finite train.epochs whose steps pass a float's range was an OverflowError traceback."""
    recipe = make_recipe(tmp_path, checkpoint=tiny_checkpoint("bert"))
    code, _, err = cli("run", recipe, "--runs-dir", runs_dir, "task.max_train_samples=8", "task.max_eval_samples=8",
                       "train.batch_size=4", "train.epochs=1e308")
    assert code == 2 and err.count("error: ") == 1 and "Traceback" not in err, err
    assert "error: train.epochs: 1e+308 epochs of 2 optimizer steps are more steps than can be counted" in err
    assert not runs_dir.exists()


@pytest.mark.parametrize("metric, kept, loss", [("accuracy_mm", 2, 0.8), ("accuracy", 1, 1.0), ("loss_mm", 2, 0.8)])
def test_a_tie_on_the_metric_goes_to_the_lower_loss_of_its_own_split(metric: str, kept: int, loss: float) -> None:
    """MNLI is scored on two splits; selecting on accuracy_mm, a tie went to the lower eval loss of
    the matched split (the wrong step kept, and `kept.eval_loss` the other split's), exit 0."""
    from types import SimpleNamespace

    from toolkit.checkpoints import State
    from toolkit.tasks import declaration
    from toolkit.train import Loop

    loop = SimpleNamespace(metric=declaration(metric), state=State(),
                           setup=SimpleNamespace(task=SimpleNamespace(suffixes=lambda: ("", "_mm"))))
    for step, evaluation in ((1, {"accuracy": 0.5, "loss": 1.0, "accuracy_mm": 0.6, "loss_mm": 0.9}),
                             (2, {"accuracy": 0.5, "loss": 1.1, "accuracy_mm": 0.6, "loss_mm": 0.8})):
        loop.state.step = step
        Loop._keep_if_best(loop, evaluation)
    assert (loop.state.best_step, loop.state.best_loss) == (kept, loss)


def test_no_defined_score_keeps_the_last_step_and_says_why(tmp_path: Path, cli, runs_dir: Path, tiny_checkpoint,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """train.keep_best where every evaluation's metric is undefined (NaN: a correlation of
    constant predictions): no step is better, the last is kept, and `kept` said 'keep_best is
    false or nothing was evaluated', neither of which was so."""
    from toolkit import evaluation

    real = evaluation.evaluate

    def undefined(*args, **kwargs):
        return {**real(*args, **kwargs), "accuracy": float("nan")}

    monkeypatch.setattr(evaluation, "evaluate", undefined)
    recipe = make_recipe(tmp_path, checkpoint=tiny_checkpoint("bert"))
    code, _, err = cli("run", recipe, "--runs-dir", runs_dir, "task.max_train_samples=8", "task.max_eval_samples=8",
                       "train.batch_size=4", "train.keep_best=true", "train.eval_every=1")
    assert code == 0, err
    metrics = json.loads((only_run(runs_dir) / "metrics.json").read_text())
    assert metrics["best_step"] is None and metrics["train_steps"] == 2
    assert metrics["kept"] == {"step": 2, "on": "the last step (train.keep_best: no evaluation gave accuracy a "
                                                "defined value)"}


class _OverflowGrad(torch.autograd.Function):
    """A finite loss whose gradient overflows (what fp16's loss scaler exists for)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad * float("inf")


@pytest.fixture
def fp16_scaler(monkeypatch) -> list:
    """The loop under fp16's loss scaler on a CPU: accelerate's own fp16 path needs a GPU, so its
    Accelerator gets a CPU GradScaler (what it builds on CUDA) and unscales through it; compute
    stays fp32. Returns the scalers made (one per run)."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    from toolkit import train

    scalers = []

    class Scaled(Accelerator):
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            super().__init__(*args, **kwargs)
            self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
            scalers.append(self.scaler)

        def unscale_gradients(self, optimizer=None) -> None:  # noqa: ANN001 - accelerate's, off its CUDA check
            for opt in self._optimizers:
                while isinstance(opt, AcceleratedOptimizer):
                    opt = opt.optimizer
                self.scaler.unscale_(opt)

    monkeypatch.setattr(train, "Accelerator", Scaled)
    return scalers


@pytest.mark.parametrize("method", ["{name: adalora, init_r: 4, target_r: 2}"])  # the scaler's path is full's too
def test_an_fp16_overflow_is_the_scalers_skip_with_clipping_on_or_off(tmp_path: Path, cli, monkeypatch, fp16_scaler,
                                                                       tiny_checkpoint, method: str) -> None:
    """fp16's loss scaler skips a batch whose gradient overflows, with train.max_grad_norm 1.0 and
    null alike, as Trainer does: the step takes its slot (it counts toward max_steps, no batch is
    read past it), the schedule holds (Trainer steps it only where `optimizer_step_was_skipped` is
    False), a method's after_step does not see it and it is not a non-finite batch."""
    from toolkit import train

    scalers, after, skipped = fp16_scaler, [], []
    forward_loss, calls = train.Loop._forward_loss, []

    def first_overflows(self, batch):  # noqa: ANN001
        calls.append(1)
        loss = forward_loss(self, batch)
        return _OverflowGrad.apply(loss) if len(calls) == 1 else loss

    init = train.Loop.__init__

    def watched(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        init(self, *args, **kwargs)
        original = self.method.after_step
        self.method.after_step = lambda model, step: (after.append(step), original(model, step))
        self.method.skipped_step = lambda model, step: skipped.append(step)

    monkeypatch.setattr(train.Loop, "_forward_loss", first_overflows)
    monkeypatch.setattr(train.Loop, "__init__", watched)
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"), method=method))
    logged = []
    for clip in ("1.0", "null"):
        calls.clear()
        after.clear()
        skipped.clear()
        runs = tmp_path / clip
        code, out, err = cli("run", recipe, "train.max_steps=3", "train.log_every=1", "train.batch_size=4",
                           f"train.max_grad_norm={clip}", "task.max_train_samples=32", "task.max_eval_samples=8",
                           "--runs-dir", runs)
        assert code == 0, err
        log = [json.loads(line) for line in next(runs.rglob("log.jsonl")).read_text().splitlines()]
        steps = [(e["step"], e["loss"], e["lr"]) for e in log if "loss" in e]
        assert [s for s, _, _ in steps] == [1, 2, 3]
        assert len(calls) == 3  # three steps, the overflowed batch the first
        assert scalers[-1].get_scale() == 2.0 ** 7  # the scaler skipped once and backed off
        assert after == [2, 3] and skipped == [1]  # AdaLoRA's after_step: not on the skipped batch
        assert steps[0][2] == steps[1][2] and steps[1][2] != steps[2][2]  # the schedule held for the overflow
        assert "non-finite" not in out + err
        logged.append(steps)
    # steps 1 and 2 in both: their losses are taken before any update, so clipping cannot change them
    assert [loss for _, loss, _ in logged[0][:2]] == pytest.approx([loss for _, loss, _ in logged[1][:2]], abs=1e-6)
    assert [lr for _, _, lr in logged[0]] == [lr for _, _, lr in logged[1]]


@pytest.mark.parametrize("method, compiled", [("{name: full}", False), ("{name: full}", True),
                                              ("{name: adalora, init_r: 4, target_r: 2}", False)])
def test_a_finite_loss_with_a_non_finite_gradient_is_skipped_with_clipping_off(tmp_path: Path, cli, monkeypatch,
                                                                               tiny_checkpoint, method: str,
                                                                               compiled: bool) -> None:
    """train.max_grad_norm: null still measures the gradient norm (Trainer logs it too), so a
    batch whose loss is finite and whose gradient is not is a skipped batch, on the eager step,
    the compiled optimizer step and the host-checked step (AdaLoRA). It was taken: every weight
    NaN, saved as the 'last good checkpoint', and the run stopped blaming a later step."""
    from toolkit import compiling, train

    monkeypatch.setattr(compiling, "BACKEND", "aot_eager")
    forward_loss, calls = train.Loop._forward_loss, []

    def second_overflows(self, batch):  # noqa: ANN001
        calls.append(1)
        loss = forward_loss(self, batch)
        return _OverflowGrad.apply(loss) if len(calls) == 2 else loss

    monkeypatch.setattr(train.Loop, "_forward_loss", second_overflows)
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"), method=method))
    runs = tmp_path / "runs"
    code, out, err = cli("run", recipe, "train.max_steps=4", "train.log_every=1", "train.batch_size=4",
                         "train.max_grad_norm=null", "train.skip_nonfinite=1", "train.save_every=1",
                         f"train.compile_optimizer={str(compiled).lower()}", "train.compile=false",
                         "task.max_train_samples=32", "task.max_eval_samples=8", "--runs-dir", runs)
    assert code == 0, err
    assert "step 2: non-finite gradient norm; 1 optimizer step (1 micro-batch) skipped" in out + err
    run = only_run(runs)
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    losses = {e["step"]: e for e in log if "loss" in e}
    # the skipped batch keeps its step slot on every path (norm null)
    assert losses[2]["grad_norm"] is None
    assert all(isinstance(losses[s]["grad_norm"], float) for s in (1, 3, 4))  # measured and logged
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["skipped_nonfinite"] == 1 and math.isfinite(metrics["eval"]["loss"])
    assert all(torch.isfinite(t).all() for t in weights(run).values())


@pytest.mark.parametrize("length", ["train.epochs=1", "train.max_steps=2"])
def test_a_skipped_batch_takes_one_step_slot_on_the_device_and_on_the_host(tmp_path: Path, cli, monkeypatch,
                                                                           tiny_checkpoint, length: str) -> None:
    """A non-finite batch skipped within train.skip_nonfinite takes its step slot on every path:
    the device's skip (the default), the host-checked step forced on the same method, and AdaLoRA,
    whose after_step puts it on the host. The host path once took no slot: each skip read one more
    step of batches (2 micro-batches here) past the epoch or max_steps, and the schedule lagged."""
    from toolkit import train

    forward_loss, calls, init = train.Loop._forward_loss, [], train.Loop.__init__

    def third_nan(self, batch):  # noqa: ANN001 - the first micro-batch of step 2
        calls.append(1)
        loss = forward_loss(self, batch)
        return loss * float("nan") if len(calls) == 3 else loss

    monkeypatch.setattr(train.Loop, "_forward_loss", third_nan)
    seen, shown = {}, []
    for path, method in (("device", "{name: full}"), ("host", "{name: full}"),
                         ("adalora", "{name: adalora, init_r: 4, target_r: 2}")):
        def forced(self, *args, path=path, **kwargs):  # noqa: ANN001, ANN002, ANN003
            init(self, *args, **kwargs)
            if path == "host":
                self.host_checked = True
            assert self.host_checked == (path != "device")
            original = self.method.skipped_step  # AdaLoRA: its re-allocation schedule sees the skip
            self.method.skipped_step = lambda model, step: (shown.append(step), original(model, step))

        monkeypatch.setattr(train.Loop, "__init__", forced)
        calls.clear()
        recipe = write_recipe(tmp_path / f"{path}.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"), method=method))
        runs = tmp_path / path
        code, out, err = cli("run", recipe, length, "train.log_every=1", "train.batch_size=4", "train.grad_accum=2",
                             "train.skip_nonfinite=1", "task.max_train_samples=24", "task.max_eval_samples=8",
                             "--runs-dir", runs)
        assert code == 0, err
        # said in the unit skipped: the optimizer step and its grad_accum micro-batches, alike in
        # the console, log.jsonl (so far, from the line that read it) and metrics.json ("1 batch skipped" before)
        assert ("step 2: non-finite loss; 1 optimizer step (2 micro-batches) skipped "
                "(1 of train.skip_nonfinite=1 steps)") in out + err
        run = only_run(runs)
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        metrics = json.loads((run / "metrics.json").read_text())
        assert (metrics["skipped_nonfinite"], metrics["skipped_nonfinite_micro_batches"]) == (1, 2)
        assert [(e.get("skipped_nonfinite"), e.get("skipped_nonfinite_micro_batches")) for e in log if "loss" in e] \
            == [(None, None)] + [(1, 2)] * (metrics["train_steps"] - 1)
        # the run's mean loss (Trainer's train_loss) is over the finite steps: the skipped one is not in it
        finite = [e["loss"] for e in log if "loss" in e and e["loss"] is not None]
        assert len(finite) == metrics["train_steps"] - 1
        assert metrics["train_loss"] == pytest.approx(sum(finite) / len(finite), rel=1e-12)
        # the rate counts every example a step took, the skipped step's too, as its time counts
        # (Trainer's train_samples_per_second: the planned examples over the loop's time); it
        # counted the finite steps' alone, and a sweep's --estimate read the clock off it
        taken = 8 * metrics["train_steps"]
        assert metrics["train_samples_per_second"] * metrics["train_runtime_s"] == pytest.approx(taken)
        assert all(e["samples_per_second"] * metrics["train_runtime_s"] == pytest.approx(taken)
                   for e in log if e.get("step") == metrics["train_steps"] and "loss" in e)
        seen[path] = (len(calls), metrics["train_steps"], metrics["skipped_nonfinite"],
                      [(e["step"], e["lr"], e["loss"] is None) for e in log if "loss" in e])
        assert shown == ([] if path == "device" else [2]), path  # the host path shows the skip at its step
        shown.clear()
    steps = 3 if length == "train.epochs=1" else 2
    assert seen["device"][:3] == (2 * steps, steps, 1)  # 24 examples: 6 micro-batches, 3 steps an epoch
    assert [s for s, _, _ in seen["device"][3]] == list(range(1, steps + 1))
    assert [skipped for _, _, skipped in seen["device"][3]] == [s == 2 for s in range(1, steps + 1)]
    assert seen["host"] == seen["device"] and seen["adalora"] == seen["device"]


def test_an_fp16_batch_skipped_for_its_loss_lets_the_next_step_unscale(tmp_path: Path, cli, monkeypatch, fp16_scaler,
                                                                       tiny_checkpoint) -> None:
    """Under fp16 a batch whose loss is not finite, skipped within train.skip_nonfinite, had its
    gradients unscaled (clipping) and no optimizer step, so the scaler's iteration stayed open and
    the next step's unscale_ raised ('unscale_() has already been called on this optimizer since
    the last update()'): a traceback where the skip was allowed."""
    calls = nan_loss_at_forward(monkeypatch, 2)
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"), method="{name: full}"))
    code, out, err = cli("run", recipe, "train.max_steps=3", "train.batch_size=4",
                         "train.skip_nonfinite=1", "task.max_train_samples=32", "task.max_eval_samples=8",
                         "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    assert "step 2: non-finite loss; 1 optimizer step (1 micro-batch) skipped" in out + err
    metrics = json.loads((only_run(tmp_path / "runs") / "metrics.json").read_text())
    assert metrics["train_steps"] == 3 and metrics["skipped_nonfinite"] == 1 and len(calls) == 3  # its slot taken
