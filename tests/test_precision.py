"""train.precision_mode: bf16_master (toolkit/precision.py): bf16 weights, fp32 masters in the
optimizer, checked against AdamW written out by hand, through the loop, resume and reload."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import write_recipe
from toolkit import precision

RECIPE = """model: {checkpoint: bert-base-uncased, dropout: 0.0}
task: {name: glue, subset: sst2, max_length: 32, max_train_samples: 8, max_eval_samples: 8}
method: {name: full}
train: {epochs: 1, lr: 1.0e-3, batch_size: 4, weight_decay: 0.01, seed: 3, keep_best: false,
        mixed_precision: bf16, precision_mode: bf16_master, log_every: 1}
"""


def _reference_adamw(weights: list[torch.Tensor], grads: list[list[torch.Tensor]], lr: float,
                     decays: list[float], betas: tuple[float, float] = (0.9, 0.999),
                     eps: float = 1e-8) -> list[torch.Tensor]:
    """AdamW (Loshchilov & Hutter, torch's defaults) in fp32, step by step, on given gradients."""
    b1, b2 = betas
    out = []
    for i, w in enumerate(weights):
        w, m, v = w.clone(), torch.zeros_like(w), torch.zeros_like(w)
        for t, step_grads in enumerate(grads, start=1):
            g = step_grads[i].float()
            w = w * (1 - lr * decays[i])
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
            w = w - lr * m_hat / (v_hat.sqrt() + eps)
        out.append(w)
    return out


def test_masters_follow_hand_written_adamw_on_the_bf16_gradients(tiny_checkpoint) -> None:
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_checkpoint("bert"), num_labels=2)
    params = [p for p in model.parameters() if p.requires_grad]
    start = {id(p): p.detach().clone() for p in params}
    assert all(w.dtype == torch.float32 for w in start.values())
    lr, decay = 1e-2, 0.1
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    order = groups[0]["params"] + groups[1]["params"]  # the masters' order
    start = [start[id(p)] for p in order]
    decays = [decay] * len(groups[0]["params"]) + [0.0] * len(groups[1]["params"])
    optimizer = precision.bf16_master(model, groups, lr, torch.device("cpu"))
    ids = torch.randint(5, 100, (4, 12))
    labels = torch.tensor([0, 1, 1, 0])
    seen: list[list[torch.Tensor]] = []
    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        assert all(p.dtype == torch.bfloat16 and p.grad.dtype == torch.bfloat16 for p in order)
        assert all(m.dtype == torch.float32 for m in optimizer.masters)
        seen.append([p.grad.clone() for p in order])
        optimizer.step()
        optimizer.zero_grad()
        assert all(p.grad is None for p in order) and all(m.grad is None for m in optimizer.masters)
    expected = _reference_adamw(start, seen, lr, decays)
    for master, want, p in zip(optimizer.masters, expected, order):
        torch.testing.assert_close(master, want, rtol=1e-5, atol=1e-6)
        assert torch.equal(p, master.to(torch.bfloat16))  # written back, rounded to nearest
    # the masters carry what bf16 alone would round away
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in optimizer.masters)


def test_writes_outside_the_optimizer_reach_the_masters() -> None:
    """A method's after_step writing a bf16 parameter (AdaLoRA masking ranks) is not undone by
    the next step; the untouched entries keep their fp32 masters."""
    weight = torch.nn.Parameter(torch.full((4,), 1.0 + 2 ** -12))  # between two bf16 values
    optimizer = precision.bf16_master(torch.nn.ParameterList([weight]), [{"params": [weight]}], 0.0,
                                      torch.device("cpu"))
    assert weight.dtype == torch.bfloat16 and optimizer.masters[0][0].item() == 1.0 + 2 ** -12
    with torch.no_grad():
        weight[1] = 0.0
    precision.pull_model_writes(optimizer)
    assert optimizer.masters[0].tolist() == [1.0 + 2 ** -12, 0.0, 1.0 + 2 ** -12, 1.0 + 2 ** -12]
    weight.grad = torch.zeros_like(weight)
    optimizer.step()
    assert weight.tolist() == [1.0, 0.0, 1.0, 1.0]


def test_a_non_finite_step_is_skipped_on_the_device() -> None:
    """The loop's skip (tally.skip_unless: fused AdamW's found_inf) leaves masters, weights and
    moments as they were, with no host read."""
    from toolkit.tally import clear_skip, skip_unless

    weight = torch.nn.Parameter(torch.linspace(-1, 1, 8))
    optimizer = precision.bf16_master(torch.nn.ParameterList([weight]), [{"params": [weight]}], 0.1,
                                      torch.device("cpu"))
    weight.grad = torch.ones_like(weight)
    optimizer.step()
    before = (weight.detach().clone(), optimizer.masters[0].clone(),
              optimizer.state[optimizer.masters[0]]["exp_avg"].clone())
    weight.grad = torch.full_like(weight, float("inf"))
    skip_unless(optimizer, torch.isfinite(weight.grad).all())
    optimizer.step()
    clear_skip(optimizer)
    after = (weight, optimizer.masters[0], optimizer.state[optimizer.masters[0]]["exp_avg"])
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def _run(cli, recipe: Path, runs: Path, *extra: str) -> Path:
    code, out, err = cli("run", recipe, "--smoke", "--runs-dir", runs, "train.max_steps=4", *extra)
    assert code == 0, err
    found = [p.parent for p in runs.rglob("recipe.yaml")]
    assert len(found) == 1
    return found[0]


def test_loop_steps_bf16_weights_resumes_exactly_and_saves_a_loadable_model(
        tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    dtypes: set[tuple] = set()
    step = precision.MasterAdamW.step

    def watched(self: precision.MasterAdamW, closure=None):
        dtypes.add((tuple({p.dtype for p in self.model_params}), tuple({m.dtype for m in self.masters}),
                    tuple({p.grad.dtype for p in self.model_params if p.grad is not None})))
        return step(self, closure)

    monkeypatch.setattr(precision.MasterAdamW, "step", watched)
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE)
    whole = _run(cli, recipe, tmp_path / "whole")
    assert dtypes == {((torch.bfloat16,), (torch.float32,), (torch.bfloat16,))}
    parts = tmp_path / "parts"
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", parts, "train.max_steps=4", "--stop-after", "2")
    assert code == 0, err
    resumed = _run(cli, recipe, parts)
    a, b = load_file(whole / "model" / "model.safetensors"), load_file(resumed / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert {t.dtype for t in a.values() if t.is_floating_point()} == {torch.bfloat16}
    lines = [json.loads(l) for l in (whole / "log.jsonl").read_text().splitlines()]
    losses = [l["loss"] for l in lines if "loss" in l]
    assert len(losses) == 4 and all(math.isfinite(l) for l in losses)
    model = AutoModelForSequenceClassification.from_pretrained(whole / "model")  # saved as bf16
    key = next(k for k in a if k.endswith("classifier.weight"))
    assert torch.equal(model.classifier.weight.detach().to(torch.bfloat16), a[key])


@pytest.mark.parametrize("mixed", ["no", "fp16"])
def test_bf16_master_needs_bf16_mixed_precision(tmp_path: Path, cli, mixed: str) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE)
    code, out, err = cli("validate", recipe, f"train.mixed_precision={mixed}")
    assert code == 2
    lines = [l for l in (out + err).splitlines() if "precision_mode" in l]
    assert len(lines) == 1 and f"needs train.mixed_precision: bf16 (got {mixed})" in lines[0]


def test_bf16_master_refused_under_a_sharding_strategy() -> None:
    with pytest.raises(Exception, match="bf16_master under fsdp"):
        precision.check_strategy("bf16_master", "fsdp")
    precision.check_strategy("autocast", "fsdp")  # autocast under FSDP: its own policy, allowed


def test_gpu_check_measures_bf16_master_beside_autocast() -> None:
    """gpu-check --master (the first GPU session measured it; autocast stayed the default): the
    bf16_master speed rows (compile on and off) and an accuracy row, each a bench command line
    the bench accepts and turns into the recipe field (tests/test_gpu_check.py runs the whole
    default plan with --smoke)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_check
    from bench.cli import parse
    from bench.trainer import toolkit_recipe

    args = gpu_check.parser().parse_args(["--master"])
    master = [(label, flags) for label, _, _, flags in gpu_check.plan(args, "speed", "minilm")
              if "--precision-mode" in flags]
    assert [label for label, _ in master] == [gpu_check.MASTER] * 2 + [
        f"MiniLM SST-2 accuracy, {gpu_check.MASTER_LABEL}"]
    for _, flags in master:
        bench_args = parse(flags)
        recipe = toolkit_recipe(bench_args, "bert-base-uncased")
        assert (recipe.train.precision_mode, recipe.train.mixed_precision) == ("bf16_master", "bf16")
    assert [parse(f).compile for _, f in master] == ["true", "false", "true"]
