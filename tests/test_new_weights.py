"""Weights new to a checkpoint (a task head) start where a whole model on the CPU puts them,
whatever device a launch draws them on: under ZeRO-3 transformers draws them on the accelerator
the parameters are partitioned on (another generator: on an H100, gpt2 LoRA under ZeRO-3 differed
from the plain run by 0.48 relative from the first step, 2026-11-27), and the toolkit draws them
again on the CPU (`models.redraw_new_weights`). Walked over every family and every head it has."""

from __future__ import annotations

import functools
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


@pytest.fixture(scope="module", autouse=True)
def _one_tokenizer_per_checkpoint():
    """Each case loads its model twice and a tokenizer each time (1.2 s of reading tokenizer.json,
    most of a case's time): the rule is about the model's weights, which the tokenizer neither draws
    nor sets, so each checkpoint's tokenizer is read once for the module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(models, "load_tokenizer", functools.cache(models.load_tokenizer))
        yield


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
        if "is not a left-to-right decoder" in str(refused):  # an encoder's causal-LM class without
            return  # is_decoder: the load's probe refuses it, which validate never asks for (kind_of)
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


PARTITIONED = r'''
import json, os, sys
import deepspeed, deepspeed.ops, torch
from transformers.integrations import HfDeepSpeedConfig
from toolkit import models

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
# as toolkit.sharding starts DeepSpeed on the CPU: its shm all-reduce op is not JIT-compiled with
# ninja at init (40-260 s here, and the whole test's time in a fresh clone's suite: 169 s)
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
names = ["negative", "positive"]
kwargs = {"num_labels": 2, "id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}
out = {}
for name, checkpoint in (("new head", sys.argv[1]), ("trained head, other label order", sys.argv[2])):
    torch.manual_seed(7)
    plain = {k: v.clone() for k, v in models.load(checkpoint, "sequence-classification", kwargs)[0].state_dict().items()}
    after_plain = torch.rand(4)
    launch = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    torch.manual_seed(7)
    model = models.load(checkpoint, "sequence-classification", kwargs)[0]
    after = torch.rand(4)
    partitioned = all(p.numel() == 0 for p in model.parameters())
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        whole = {k: v.clone() for k, v in model.state_dict().items()}
    from transformers.integrations import deepspeed as hf_deepspeed
    hf_deepspeed.unset_hf_deepspeed_config()
    out[name] = {"partitioned": partitioned, "same": [k for k in plain if torch.equal(plain[k], whole[k])] == list(plain),
                 "same_next_draw": torch.equal(after_plain, after)}
print("RESULT " + json.dumps(out))
'''


def test_a_real_zero3_load_gives_the_plain_weights(tmp_path, tiny_checkpoint) -> None:
    """DeepSpeed's zero.Init on a CPU process (gloo, one rank): the model loads partitioned, and
    gathered it equals the plain load, for a new head and for a trained head whose labels the
    checkpoint orders otherwise (its rows put in the task's order, each shard gathered for it)."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from conftest import ROOT

    body = tiny_checkpoint("bert")
    trained = tmp_path / "trained"
    torch.manual_seed(3)
    names = ["positive", "negative"]  # the checkpoint's order; the task's is the other
    cfg = transformers.AutoConfig.from_pretrained(body, num_labels=2, id2label=dict(enumerate(names)),
                                                  label2id={n: i for i, n in enumerate(names)})
    transformers.AutoModelForSequenceClassification.from_pretrained(body, config=cfg).save_pretrained(trained)
    transformers.AutoTokenizer.from_pretrained(body).save_pretrained(trained)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([sys.executable, "-c", PARTITIONED, body, str(trained), str(port)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[0][7:])
    assert result == {name: {"partitioned": True, "same": True, "same_next_draw": True}
                      for name in ("new head", "trained head, other label order")}
