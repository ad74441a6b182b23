"""AdaLoRA and DoRA, the methods that prove the method contract: the loop adds AdaLoRA's
orthogonality penalty (equal to what PEFT adds to `outputs.loss`), calls its re-allocation after
every step with the run's step count, and checkpoints its rank allocator, so a resumed run equals
an uninterrupted one; DoRA's magnitudes train and its saved adapter reloads to the same scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from test_train import make_recipe, only_run, train_losses, weights
from toolkit import models
from toolkit.methods import METHODS, Context

TEXTS = ["a great movie", "terrible, boring and far too long", "fine", "I loved it"]
LABELS = torch.tensor([1, 0, 1, 1])
ADALORA = "{name: adalora, init_r: 4, target_r: 2, delta_t: 1, tinit_ratio: 0.0, tfinal_ratio: 0.25}"


def _adapted(tiny_checkpoint, name: str, total_steps: int = 8, **settings):
    torch.manual_seed(0)
    path = tiny_checkpoint("bert")
    tok = models.load_tokenizer(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    ctx = Context("bert", models.head_names(model), "SEQ_CLS", tok, total_steps=total_steps)
    method = METHODS.get(name)(**settings)
    return method, method.apply(model, ctx), tok(TEXTS, padding=True, return_tensors="pt")


def test_adalora_extra_loss_is_what_peft_adds_to_its_own_loss(tiny_checkpoint) -> None:
    method, model, batch = _adapted(tiny_checkpoint, "adalora", init_r=4, target_r=2)
    with torch.no_grad():  # the adapters start orthogonal-ish but not exactly: make the term large
        for n, p in model.named_parameters():
            if "lora_A" in n or "lora_B" in n:
                p.normal_()
    plain = model(**batch, labels=LABELS).loss  # PEFT's forward, orth_reg_weight 0 in the config
    model.peft_config["default"].orth_reg_weight = 0.5
    with_penalty = model(**batch, labels=LABELS).loss
    extra = method.extra_loss(model)
    assert extra.item() > 0.1
    torch.testing.assert_close(extra, with_penalty - plain)


def test_adalora_steps_shrink_the_ranks_to_the_target(tiny_checkpoint) -> None:
    method, model, batch = _adapted(tiny_checkpoint, "adalora", total_steps=6, init_r=4, target_r=2,
                                    delta_t=1, tinit_ratio=0.0, tfinal_ratio=0.2)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for step in range(1, 7):
        loss = torch.nn.functional.cross_entropy(model(**batch).logits, LABELS) + method.extra_loss(model)
        loss.backward()
        opt.step()
        method.after_step(model, step)
        opt.zero_grad()
        losses.append(loss.item())
        if step == 2:  # while ranks are being allocated, the allocator holds its estimates
            state = method.state_dict(model)
            assert set(state) == {"ipt", "exp_avg_ipt", "exp_avg_unc", "rank_pattern"} and state["ipt"]
    assert losses[-1] < losses[0]
    pattern = model.peft_config["default"].rank_pattern
    kept = [sum(v) for v in pattern.values()]
    assert len(kept) == 4 and sum(kept) == 2 * len(kept)  # 2 layers x (query, value), 2 on average


@pytest.mark.parametrize("skipped", [None, 5, 6, 7])
def test_adalora_finalizes_its_ranks_when_the_finalizing_step_is_skipped(tiny_checkpoint, skipped: int | None) -> None:
    """A step that makes no update (non-finite, empty, an fp16 overflow) takes its step slot but
    is not shown to after_step (the loop's rule, docs/loop.md). PEFT finalizes the ranks at
    exactly step total - tfinal (6 here): where that step was skipped the final ranks were never
    set, and the steps after it masked with the last, larger budget's pattern (or raised on None)."""
    method, model, batch = _adapted(tiny_checkpoint, "adalora", total_steps=8, init_r=4, target_r=2,
                                    delta_t=1, tinit_ratio=0.0, tfinal_ratio=0.25)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(1, 9):
        torch.nn.functional.cross_entropy(model(**batch).logits, LABELS).backward()
        if step != skipped:
            opt.step()
            method.after_step(model, step)
        opt.zero_grad()
    kept = [sum(v) for v in model.peft_config["default"].rank_pattern.values()]
    assert len(kept) == 4 and sum(kept) == 2 * len(kept)  # the target budget: 2 on average
    assert not model.base_model.rankallocator.ipt  # finalized: PEFT clears its estimates then


@pytest.mark.parametrize("skipped", [2, 4, 6])
def test_adalora_reallocates_at_its_step_count_when_that_step_is_skipped(tiny_checkpoint, skipped: int) -> None:
    """Re-allocations fall every delta_t steps (2, 4 here) and the finalizing one at total - tfinal
    (6). A step that made no update is shown to `skipped_step`, not `after_step` (the loop's
    rule): the allocation due at its count happens at it, to that step's budget. It was not seen:
    a skipped step 4 kept step 2's larger budget (10 ranks of 16 where the schedule says 8) for
    delta_t more steps, exit 0. The ranks kept after every step equal those of a run without the
    skip, and the singular values masked at an allocation are the pattern's."""
    kept, patterns = {}, {}
    for skip in (None, skipped):
        method, model, batch = _adapted(tiny_checkpoint, "adalora", total_steps=8, init_r=4, target_r=2,
                                        delta_t=2, tinit_ratio=0.0, tfinal_ratio=0.25)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        kept[skip] = []
        for step in range(1, 9):
            torch.nn.functional.cross_entropy(model(**batch).logits, LABELS).backward()
            if step == skip:
                opt.zero_grad()
                method.skipped_step(model, step)
            else:
                opt.step()
                method.after_step(model, step)
                opt.zero_grad()
            pattern = model.peft_config["default"].rank_pattern
            kept[skip].append(None if pattern is None else sum(sum(v) for v in pattern.values()))
            if step in (2, 4) or step >= 6:  # masked now (in between, the optimizer moves masked values)
                values = [p for n, p in model.named_parameters() if "lora_E" in n]
                assert sum(int((v != 0).sum()) for v in values) == kept[skip][-1]
        patterns[skip] = model.peft_config["default"].rank_pattern
    assert kept[None] == [None, 10, 10, 8, 8, 8, 8, 8]  # PEFT's cubic schedule: 16 ranks down to 8
    assert kept[skipped] == kept[None]
    if skipped == 6:  # PEFT finalizes on the estimates of the steps before: the skip changes nothing
        assert patterns[skipped] == patterns[None]
    assert not model.base_model.rankallocator.ipt  # finalized


def test_adalora_saved_adapter_is_the_kept_steps_model(tiny_checkpoint, tmp_path: Path) -> None:
    """Finding: train.keep_best restores an earlier step's weights, but the rank pattern PEFT saves
    (and prunes the saved ranks by) was the last step's: the adapter dropped ranks the scored model
    used, and `toolkit eval` of the run gave another loss than the run (GPT-2: 1.0477 for 1.0457),
    exit 0. The saved adapter now reloads to the outputs of the weights it was given."""
    method, model, batch = _adapted(tiny_checkpoint, "adalora", total_steps=8, init_r=4, target_r=1,
                                    delta_t=1, tinit_ratio=0.0, tfinal_ratio=0.25)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.2)  # ranks that matter
    kept = None
    for step in range(1, 6):
        (torch.nn.functional.cross_entropy(model(**batch).logits, LABELS) + method.extra_loss(model)).backward()
        opt.step()
        method.after_step(model, step)
        opt.zero_grad()
        if step == 2:  # the step train.keep_best keeps
            kept = {n: p.detach().clone() for n, p in model.named_parameters()}
            early = dict(model.peft_config["default"].rank_pattern)
    assert model.peft_config["default"].rank_pattern != early  # the allocation moved on after it
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(kept[n])
    model.eval()
    with torch.no_grad():
        want = model(**batch).logits
    method.save(model, tmp_path / "model")

    def base():
        torch.manual_seed(0)
        return AutoModelForSequenceClassification.from_pretrained(tiny_checkpoint("bert"), num_labels=2)

    loaded = method.load(tmp_path / "model", base, None).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, want, rtol=0, atol=1e-6)


def test_adalora_refuses_a_target_above_its_start(tmp_path: Path, cli) -> None:
    recipe = make_recipe(tmp_path, "bert-base-uncased", "{name: adalora, init_r: 4, target_r: 8}")
    code, _, err = cli("validate", recipe)
    assert code == 2 and "method.target_r: 8 is more than method.init_r (4)" in err


def test_dora_trains_magnitudes_and_directions(tiny_checkpoint) -> None:
    method, model, batch = _adapted(tiny_checkpoint, "dora", r=4)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("lora_magnitude_vector" in n for n in names) and any("lora_A" in n for n in names)


def resumed_and_uninterrupted(tmp_path: Path, cli, recipe: Path, stop_after: int, common: list[str]) -> tuple[Path, Path]:
    """(uninterrupted run, run stopped after `stop_after` steps and resumed), checked equal in
    losses, weights and eval metrics."""
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert cli("run", recipe, "--runs-dir", full, *common)[0] == 0
    assert cli("run", recipe, "--runs-dir", parts, *common, "--stop-after", stop_after)[0] == 0
    code, out, _ = cli("run", recipe, "--runs-dir", parts, *common)
    assert code == 0 and "resuming from" in out
    a, b = only_run(full), only_run(parts)
    assert train_losses(a) == train_losses(b)
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    assert ma["eval"] == mb["eval"] and ma["train_steps"] == mb["train_steps"]
    return a, b


@pytest.mark.parametrize("method, stop_after", [(ADALORA, 2), ("{name: dora, r: 4}", 1)])
def test_resumed_run_equals_uninterrupted(tmp_path: Path, cli, method: str, stop_after: int) -> None:
    """Stop after k steps, resume, and land on the same losses, weights, ranks and metrics."""
    recipe = make_recipe(tmp_path, "bert-base-uncased", method)
    common = ["--smoke", "task.max_train_samples=12", "train.max_steps=4", "train.log_every=1"]
    a, b = resumed_and_uninterrupted(tmp_path, cli, recipe, stop_after, common)
    ca, cb = (json.loads((p / "model" / "adapter_config.json").read_text()) for p in (a, b))
    assert ca.get("rank_pattern") == cb.get("rank_pattern")
    assert json.loads((a / "metrics.json").read_text())["train_steps"] == 4


def test_adalora_run_saves_its_ranks_and_evaluates_again(tmp_path: Path, cli, runs_dir: Path) -> None:
    """The saved adapter holds the allocated ranks; `toolkit eval` reloads it to the run's score."""
    recipe = make_recipe(tmp_path, "bert-base-uncased", ADALORA)
    assert cli("run", recipe, "--smoke", "--runs-dir", runs_dir, "task.max_train_samples=16",
               "task.max_eval_samples=16", "train.max_steps=4", "train.keep_checkpoints=true")[0] == 0
    run = only_run(runs_dir)
    config = json.loads((run / "model" / "adapter_config.json").read_text())
    assert config["peft_type"] == "ADALORA" and config["rank_pattern"]
    assert any((run / "checkpoints").glob("*/custom_checkpoint_0.pkl"))  # the allocator's state
    code, out, err = cli("eval", run)
    assert code == 0, err
    saved = json.loads((run / "metrics.json").read_text())["eval"]["accuracy"]
    assert json.loads((run / "eval-eval.json").read_text())["eval"]["accuracy"] == saved
