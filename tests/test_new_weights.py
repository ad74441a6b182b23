"""Weights new to a checkpoint (a task head) start where a whole model on the CPU puts them,
whatever device a launch draws them on: under ZeRO-3 transformers draws them on the accelerator
the parameters are partitioned on (another generator: on an H100, gpt2 LoRA under ZeRO-3 differed
from the plain run by 0.48 relative from the first step, 2026-11-27), and the toolkit draws them
again on the CPU (`models.redraw_new_weights`). Walked over every family and every head it has."""

from __future__ import annotations

import importlib

import pytest
import torch
import transformers
from conftest import FAMILY_IDS
from transformers.models.auto import modeling_auto

from toolkit import heads, models
from toolkit.errors import UserError

importlib.import_module("toolkit.tasks")  # every task's head declared (NER's among them)
MODEL_TYPES = {"bert": "bert", "roberta": "roberta", "gpt2": "gpt2", "bart": "bart", "t5": "t5"}
CASES = [(family, name) for family in FAMILY_IDS for name, head in sorted(heads.HEADS.items())
         if MODEL_TYPES[family] in getattr(modeling_auto, head.table)]


def _load(checkpoint: str, head: str) -> tuple[dict, torch.Tensor]:
    """The model's weights after `models.load` from seed 7, and the CPU generator's next draw."""
    torch.manual_seed(7)
    model, _ = models.load(checkpoint, head, {"num_labels": 3} if "classification" in head else {})
    return {k: v.clone() for k, v in model.state_dict().items()}, torch.rand(8)


@pytest.mark.parametrize("family, head", CASES)
def test_new_weights_start_as_on_the_cpu_under_a_partitioned_load(monkeypatch, tiny_checkpoint, family: str,
                                                                  head: str) -> None:
    checkpoint = tiny_checkpoint(family)
    try:
        plain, plain_next = _load(checkpoint, head)
    except UserError as refused:  # not a pair the toolkit builds (bart's decoder alone): refused alike
        monkeypatch.setattr(transformers.integrations, "is_deepspeed_zero3_enabled", lambda: True)
        with pytest.raises(UserError, match="does not fit this model"):
            _load(checkpoint, head)
        assert "only a task head may be re-initialised" in str(refused)
        return

    original = transformers.PreTrainedModel._initialize_missing_keys

    def drawn_elsewhere(model, *args, **kwargs) -> None:
        """A ZeRO-3 load on an accelerator: the new weights drawn from another generator, and the
        generators left where that draw leaves them (here the CPU one moved on)."""
        original(model, *args, **kwargs)
        other = torch.Generator().manual_seed(12345)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in drawn_elsewhere.names:
                    before = param.clone()
                    param.copy_(torch.randn(param.shape, generator=other))
                    drawn_elsewhere.changed |= not torch.equal(before, param)
        torch.rand(1000)

    torch.manual_seed(7)
    cfg = transformers.AutoConfig.from_pretrained(checkpoint, **({"num_labels": 3} if "classification" in head else {}))
    bare, info = getattr(transformers, heads.get(head).auto_class).from_pretrained(
        checkpoint, config=cfg, output_loading_info=True, ignore_mismatched_sizes=True)
    drawn_elsewhere.names = {n for n, p in bare.named_parameters() if any(p is q for q in models.new_weights(bare, info))}
    monkeypatch.setattr(transformers.PreTrainedModel, "_initialize_missing_keys", drawn_elsewhere)

    drawn_elsewhere.changed = False
    monkeypatch.setattr(transformers.integrations, "is_deepspeed_zero3_enabled", lambda: True)
    fixed, fixed_next = _load(checkpoint, head)
    assert fixed.keys() == plain.keys()
    for key in plain:
        assert torch.equal(fixed[key], plain[key]), key
    assert torch.equal(fixed_next, plain_next)  # what is drawn next (LoRA's weights) is drawn alike
    assert drawn_elsewhere.changed == bool(drawn_elsewhere.names)  # the load did draw them elsewhere first


def test_every_family_has_a_head_with_new_weights(tiny_checkpoint) -> None:
    """The walk above is not empty: the classification head is new in every family."""
    for family in FAMILY_IDS:
        torch.manual_seed(0)
        cfg = transformers.AutoConfig.from_pretrained(tiny_checkpoint(family), num_labels=3)
        model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
            tiny_checkpoint(family), config=cfg, output_loading_info=True)
        assert models.new_weights(model, info), family
