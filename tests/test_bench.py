"""benchmarks/bench (the package): what its rows measure (formulas, padding, shared settings), not timings."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench  # noqa: E402


def test_mfu_is_six_flops_per_non_embedding_parameter_per_token() -> None:
    assert bench.mfu(1_000_000, 1_000.0, 6e9) == pytest.approx(1.0)
    assert bench.mfu(10_796_162, 2_000.0, 1e11) == pytest.approx(6 * 10_796_162 * 2_000 / 1e11)


def test_non_embedding_params_leave_out_the_embedding_tables() -> None:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, type_vocab_size=2)
    model = BertForSequenceClassification(config)
    total = sum(p.numel() for p in model.parameters())
    assert bench.embedding_params(model) == (1000 + 128 + 2) * 32
    assert bench.non_embedding_params(model) == total - (1000 + 128 + 2) * 32


def test_the_mfu_batch_is_all_real_tokens() -> None:
    batch = bench.random_batch(4, 16, vocab=30522)
    assert batch["input_ids"].shape == (4, 16) and bool((batch["input_ids"] >= 1000).all())
    assert bool((batch["attention_mask"] == 1).all())
    assert torch.equal(batch["input_ids"], bench.random_batch(4, 16, vocab=30522)["input_ids"])  # seeded


def test_padded_trainer_row_pads_every_example_to_max_length(tiny_checkpoint) -> None:
    from toolkit import models

    tok = models.load_tokenizer(tiny_checkpoint("bert"))
    task = bench.Glue(subset="sst2", max_length=48, max_train_samples=16, max_eval_samples=16)
    train_set, dev, collate = bench.trainer_data(task, tok, padded=True)
    assert {len(ids) for ids in train_set["input_ids"]} == {48} == {len(ids) for ids in dev["input_ids"]}
    assert collate([train_set[i] for i in range(8)])["input_ids"].shape == (8, 48)
    dynamic, _, collate = bench.trainer_data(task, tok, padded=False)
    rows = [dynamic[i] for i in range(8)]
    assert collate(rows)["input_ids"].shape == (8, max(len(r["input_ids"]) for r in rows))
    assert max(len(r["input_ids"]) for r in rows) < 48  # SST-2 sentences are short: padding is the difference


def test_counting_collator_counts_positions_and_real_tokens(tiny_checkpoint) -> None:
    from toolkit import models

    tok = models.load_tokenizer(tiny_checkpoint("bert"))
    task = bench.Glue(subset="sst2", max_length=48, max_train_samples=8, max_eval_samples=8)
    data, _, collate = bench.trainer_data(task, tok, padded=False)
    counting = bench.CountingCollator(collate)
    batch = counting([data[i] for i in range(8)])
    real = sum(len(data[i]["input_ids"]) for i in range(8))
    assert counting.per_example() == {"train_positions_per_example": batch["input_ids"].numel() / 8,
                                      "train_tokens_per_example": real / 8,
                                      "padding_overhead": batch["input_ids"].numel() / real - 1.0,
                                      "train_shapes": 1}
    assert not counting.training
    counting.use_epoch(0)  # what the toolkit's loop calls on its training collator
    assert counting.training


def test_toolkit_and_trainer_rows_share_data_lr_schedule_and_seed(tmp_path: Path) -> None:
    args = bench.parse(["--steps", "50", "--batch-size", "16", "--eval-samples", "64"])
    recipe = bench.toolkit_recipe(args, "sentence-transformers/all-MiniLM-L6-v2")
    targs = bench.trainer_arguments(args, tmp_path)
    assert recipe.task.max_train_samples == 50 * 16 == bench.glue_task(args).max_train_samples
    assert recipe.task.max_eval_samples == 64 == bench.glue_task(args).max_eval_samples
    assert (recipe.train.lr, targs.learning_rate) == (bench.LR, bench.LR)
    assert recipe.train.warmup_steps == targs.warmup_steps == math.ceil(0.06 * 50)
    assert recipe.train.weight_decay == targs.weight_decay and recipe.train.seed == targs.seed
    assert recipe.train.batch_size == targs.per_device_train_batch_size == 16
    assert recipe.train.max_steps == targs.max_steps == 50
    assert targs.per_device_eval_batch_size == 8  # Trainer's default, as the table says
    assert targs.lr_scheduler_type.value == "linear" and targs.optim.value == "adamw_torch_fused"


def test_sections_flag() -> None:
    assert bench.sections("all") == list(bench.SECTIONS)
    assert bench.sections("matmul, startup") == ["matmul", "startup"]
    with pytest.raises(argparse.ArgumentTypeError):
        bench.sections("trainer,matmull")
    assert bench.parse([]).sections == ["trainer", "matmul", "lora", "startup"]


def test_roberta_base_shape() -> None:
    from transformers import AutoTokenizer

    from toolkit import models

    tok = AutoTokenizer.from_pretrained(models.tokenizer_dir() / "roberta-base")
    config = bench.roberta_base_config(tok)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.intermediate_size) == (768, 12, 12, 3072)
    assert config.vocab_size == len(tok) and config.pad_token_id == tok.pad_token_id


def test_startup_commands_run_this_checkouts_cli() -> None:
    labels = [label for label, _, _, _ in bench.STARTUP]
    assert labels[0] == "toolkit ls" and [t for _, _, t, _ in bench.STARTUP] == [2.0, 2.0, 8.0, 1.0, 1.0]
    assert [c for *_, c in bench.STARTUP] == [0, 0, 0, 2, 2]  # the last two time the first error
    smoke = bench.STARTUP[2][1]
    assert smoke[:2] == ["run", "recipes/demo/sst2/minilm-full.yaml"] and {"--smoke", "--force"} <= set(smoke)
    cmd = bench.toolkit_command(["ls"])
    assert cmd[0] == sys.executable and "toolkit.cli" in cmd[2] and cmd[-1] == "ls"


def test_markdown_table() -> None:
    text = bench.table(["a", "b"], [[1, "x"], [2, "y"]])
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | x |", "| 2 | y |"]


def test_peak_tensor_memory_counts_weights_state_and_activations() -> None:
    """The profiler's peak: at least the weights, Adam's two states and the gradients (all
    alive at the optimizer step), and more activations with a bigger batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    optimizer = torch.optim.AdamW(model.parameters())
    weights_mb = sum(p.numel() * 4 for p in model.parameters()) / 2**20

    def peak(batch: int) -> float:
        x = torch.randn(batch, 256)

        def step() -> None:
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()  # Adam's state exists from here on, as after the bench's warm-up
        return bench.peak_tensor_mb(step)

    small, large = peak(8), peak(2048)
    assert small >= 4 * weights_mb  # weights, gradients, exp_avg, exp_avg_sq
    activations_mb = 2048 * (256 + 2 * 1024) * 4 / 2**20  # input, pre- and post-GELU kept for backward
    assert large - small >= 0.9 * activations_mb


@pytest.mark.parametrize("model, shape", [("tiny", "small roberta shape)\n\nhidden 32, 2 layers, 2 heads, FFN 64,")])
def test_the_lora_section_names_the_shape_it_ran(monkeypatch, model: str, shape: str) -> None:
    """`--lora-model tiny` ran a 32-wide, 2-layer model under a heading and text of roberta-base's
    768 x 12 layers (exit 0); the section says the shape of the model it built."""
    import bench.lora as section

    args = bench.parse(["--lora-model", model, "--lora-steps", "1", "--lora-repeats", "1", "--lora-length", "8"])
    args.lora_batch = 2
    monkeypatch.setattr(section, "run_row", lambda kind, checkpoint: section.lora_row(args, kind.split(":")[1]))
    _, text = section.section_lora(args, "unused")
    assert shape in text and "768" not in text


def test_lora_table_reports_both_memory_measures() -> None:
    rows = [{"method": "full", "trainable": 100, "step_s": 2.0, "peak_mb": 3000.0, "before_training_mb": 1000.0,
             "increase_mb": 2000.0, "peak_tensor_mb": 2000.0},
            {"method": "lora", "trainable": 1, "step_s": 1.4, "peak_mb": 2000.0, "before_training_mb": 1000.0,
             "increase_mb": 1000.0, "peak_tensor_mb": 900.0}]
    text = bench.lora_table(rows)
    assert "| LoRA / full | 1.00% | 0.70x | 0.45x | 0.67x |  | 0.50x |" in text
    rows[0]["peak_tensor_mb"] = None
    assert "| LoRA / full | 1.00% | 0.70x | n/a |" in bench.lora_table(rows)


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# every entry point under benchmarks/ (a script or a package run as `python benchmarks/NAME`), with a
# refusal of its own checks beside argparse's (an unknown option, a value of the wrong type)
ENTRY_POINTS = {
    "attention.py": ["--seeds", "x"], "checkpoint_bytes.py": [], "end_token_weight.py": [],
    "gpu_check.py": ["--rows", "nosuchrow"], "gpu_sharding.py": ["--cases", "nosuchcase"],
    "malloc_trim.py": ["--steps", "1"], "reader_memory.py": [], "bench": ["--precision", "fp16"],
    "bench/host_step.py": ["--steps", "x"], "bench/optimizer_host.py": ["--steps", "x"],
    "parity": ["qa", "--set", "nokeyvalue"],
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_benchmark_entry_point_says_a_user_error_in_one_line(entry: str, monkeypatch, capsys) -> None:
    """A user error is one line naming the script and the option, exit 2, as `toolkit`'s own
    (toolkit.arguments.ScriptParser): argparse printed the usage block first."""
    import runpy

    path = BENCHMARKS / entry
    found = [p for pattern in ("*.py", "bench/*.py", "parity/*.py") for p in BENCHMARKS.glob(pattern)
             if "ArgumentParser(" in p.read_text() or "ScriptParser(" in p.read_text()]
    assert {str(p.relative_to(BENCHMARKS)).replace("/cli.py", "") for p in found} == set(ENTRY_POINTS)  # none left out
    monkeypatch.setattr(sys, "path", list(sys.path))  # the scripts put their folders first
    task = ["qa"] if entry == "parity" else []  # its one positional, before an unknown option is looked at
    cases = [[*task, "--no-such-option"], *([ENTRY_POINTS[entry]] if ENTRY_POINTS[entry] else [])]
    if entry == "parity":
        cases.append([])  # its task is required
    for argv in cases:
        monkeypatch.setattr(sys, "argv", [str(path), *argv])
        with pytest.raises(SystemExit) as stop:
            runpy.run_path(str(path), run_name="__main__")
        err = capsys.readouterr().err
        assert stop.value.code == 2, (argv, err)
        assert err.count("\n") == 1 and err.startswith(f"error: benchmarks/{entry}: "), (argv, err)
        assert "usage:" not in err
        option = next((a for a in argv if a.startswith("--")), "task")
        assert option in err, (argv, err)
