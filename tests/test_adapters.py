"""Bottleneck adapters: identity at start, only adapters + head train, save/load round trip,
placement counts, and one-line errors for bad settings; on every family and both configs."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import write_recipe
from toolkit import models
from toolkit.errors import UserError
from toolkit.methods import Context, is_head
from toolkit.methods.adapters import (CONFIG_FILE, WEIGHTS_FILE, Adapters, Bottleneck, is_adapter,
                                      load_adapters)

FAMILIES = ["bert", "roberta", "gpt2", "bart", "t5"]
CASES = [(f, c) for f in FAMILIES for c in ("houlsby", "pfeiffer")]
TEXTS = ["a gripping, funny film", "dull and far too long", "I loved every minute", "a mess"]
LABELS = torch.tensor([1, 0, 1, 0])
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Width-32 models gain nothing from threads, and two threads on a busy 2-core machine
    spin-wait: a step measured 50x slower than on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_PRISTINE: dict[str, tuple[torch.nn.Module, dict]] = {}


def _load(tiny_checkpoint, family: str) -> tuple[torch.nn.Module, dict]:
    """A fresh copy of the sequence-classification model of `family` (eval mode: no dropout) and a
    batch; loaded from disk once per family, then deep-copied (loading dominated the run time)."""
    if family not in _PRISTINE:
        torch.manual_seed(0)  # the head's random init
        model, tok = models.load(tiny_checkpoint(family), "sequence-classification", {"num_labels": 2})
        _PRISTINE[family] = model.eval(), dict(tok(TEXTS, padding=True, return_tensors="pt"))
    model, batch = _PRISTINE[family]
    return copy.deepcopy(model), batch


def _ctx(model: torch.nn.Module) -> Context:
    return Context(family=model.config.model_type, head_names=models.head_names(model),
                   peft_task_type="SEQ_CLS", tokenizer=None)


def _logits(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def _train(model: torch.nn.Module, batch: dict, steps: int = 30) -> list[float]:
    """A few AdamW steps on one fixed batch. The tiny random BERT/RoBERTa give nearly the same
    first-token vector for every input, so the adapters need ~30 steps to pull the classes apart."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(**batch, labels=LABELS).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("family, config", CASES)
def test_starts_equal_to_base(tiny_checkpoint, family: str, config: str) -> None:
    model, batch = _load(tiny_checkpoint, family)
    before = _logits(model, batch)
    Adapters(config=config).apply(model, _ctx(model))
    assert torch.equal(_logits(model, batch), before)


@pytest.mark.parametrize("family, config", CASES)
def test_only_adapters_and_head_train(tiny_checkpoint, family: str, config: str) -> None:
    model, batch = _load(tiny_checkpoint, family)
    ctx = _ctx(model)
    Adapters(config=config).apply(model, ctx)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    losses = _train(model, batch)
    assert losses[-1] < losses[0]
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    trained = {k for k in before if is_adapter(k) or is_head(k, ctx.head_names)}
    assert changed <= trained, f"base weights changed: {sorted(changed - trained)[:3]}"
    up_biases = {k for k in trained if k.endswith(".up.bias")}
    assert up_biases and up_biases <= changed  # every adapter is wired into the loss
    assert any(k.endswith(".down.weight") for k in changed)  # and learning passes its bottleneck
    assert {k for k in trained if is_head(k, ctx.head_names)} <= changed


@pytest.mark.parametrize("family, config", CASES)
def test_save_then_load_gives_same_predictions(tiny_checkpoint, tmp_path: Path, family: str,
                                               config: str) -> None:
    model, batch = _load(tiny_checkpoint, family)
    method = Adapters(config=config)
    method.apply(model, _ctx(model))
    _train(model, batch, steps=3)
    expected = _logits(model, batch)
    method.save(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE])
    heads = models.head_names(model)
    saved = load_file(str(tmp_path / WEIGHTS_FILE))
    assert all(is_adapter(k) or is_head(k, heads) for k in saved), "base weights were saved"
    fresh, _ = _load(tiny_checkpoint, family)
    assert not torch.equal(_logits(fresh, batch), expected)
    loaded = load_adapters(fresh, tmp_path)
    torch.testing.assert_close(_logits(loaded.eval(), batch), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_houlsby_has_twice_the_adapters_of_pfeiffer(tiny_checkpoint, family: str) -> None:
    counts = {}
    for config in ("houlsby", "pfeiffer"):
        model, _ = _load(tiny_checkpoint, family)
        Adapters(config=config).apply(model, _ctx(model))
        counts[config] = sum(isinstance(m, Bottleneck) for m in model.modules())
    stacks = 2 if family in ("bart", "t5") else 1
    assert counts["pfeiffer"] == 2 * stacks  # 2 layers per stack, one adapter each
    assert counts["houlsby"] == 2 * counts["pfeiffer"]


def test_layers_and_bottleneck_size(tiny_checkpoint) -> None:
    model, _ = _load(tiny_checkpoint, "bart")
    Adapters(config="houlsby", layers=[1], bottleneck_size=5).apply(model, _ctx(model))
    names = [n for n, m in model.named_modules() if isinstance(m, Bottleneck)]
    assert len(names) == 4 and all(".layers.1." in n for n in names)  # 2 stacks x 2 places
    assert all(m.down.out_features == 5 for m in model.modules() if isinstance(m, Bottleneck))
    with pytest.raises(UserError, match=r"method.layers: .* no layer 7"):
        Adapters(layers=[7]).apply(_load(tiny_checkpoint, "bert")[0], _ctx(model))


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_layers_must_exist_in_every_stack_adapted(family: str) -> None:
    """Finding: on an encoder-decoder whose decoder is shallower than its encoder (a 12-6
    distilbart), `layers: [8]` adapted encoder layer 8 alone, exit 0. `layers` indexes each stack,
    so an index one stack lacks is one line naming each stack's layers."""
    from transformers import (BartConfig, BartForSequenceClassification, T5Config,
                              T5ForSequenceClassification)

    if family == "bart":
        model = BartForSequenceClassification(BartConfig(
            vocab_size=64, d_model=16, encoder_layers=3, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_labels=2))
        stacks = "model.encoder.layers 0..2, model.decoder.layers 0..1, so no layer 2 in model.decoder.layers"
    else:
        model = T5ForSequenceClassification(T5Config(
            vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=3, num_decoder_layers=2, num_heads=2,
            num_labels=2))
        stacks = ("transformer.encoder.block 0..2, transformer.decoder.block 0..1, so no layer 2 in "
                  "transformer.decoder.block")
    for config in ("houlsby", "pfeiffer"):
        with pytest.raises(UserError, match=rf"^method.layers: 2 indexes each stack of layers the adapters go in, "
                                            rf"and the {family} model has {stacks}$"):
            Adapters(config=config, layers=[0, 2]).targets(model)
        names = [n for n, _, _ in Adapters(config=config, layers=[1]).targets(model)]
        assert {n.split(".1.")[0] for n in names} == {s.split(" ")[0] for s in stacks.split(", ")[:2]}
    # a folder saved before (the encoder's layer 2 alone) loads as it trained
    saved = [n for n, _, _ in Adapters(layers=[2]).targets(model, saved=True)]
    assert saved and all(".encoder." in n and ".2." in n for n in saved)
    with pytest.raises(UserError, match=r"no layer 3"):
        Adapters(layers=[3]).targets(model, saved=True)


def _doubling_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """Dropout made deterministic for the test: where it would drop (training, p > 0), every
    element kept, times 2."""
    return x * 2 if training and p > 0 else x


def _sub_layer_sums(model: torch.nn.Module, projection: str, seen: dict) -> None:
    """Hooks that record, for one adapted projection, its own output x (before any hook of the
    toolkit's: prepended) and y, what its sub-layer adds to the residual stream: the output of the
    dropout module that follows it (BERT, RoBERTa, GPT-2, T5), or for BART, whose layer drops out
    with a call, the LayerNorm's input less the residual (the sub-layer's input)."""
    record = seen.setdefault(projection, {"x": [], "y": []})
    module = model.get_submodule(projection)
    module.register_forward_hook(lambda m, i, o: record["x"].append(o), prepend=True)
    if model.config.model_type != "bart":
        dropout = next(d for d in model.modules() if type(d) is torch.nn.Dropout
                       and any(getattr(h, "args", ()) == (module,) for h in d._forward_hooks.values()))
        dropout.register_forward_hook(lambda m, i, o: record["y"].append(o))  # after the adapter's
        return
    layer_name, part = re.fullmatch(r"(.*\.layers\.\d+)\.(self_attn|encoder_attn|fc2).*", projection).groups()
    layer = model.get_submodule(layer_name)
    reads, norm = {"self_attn": ("self_attn", "self_attn_layer_norm"), "fc2": ("fc1", "final_layer_norm"),
                   "encoder_attn": ("encoder_attn", "encoder_attn_layer_norm")}[part]
    residual = []
    layer.get_submodule(reads).register_forward_pre_hook(lambda m, a: residual.append(a[0]))
    layer.get_submodule(norm).register_forward_pre_hook(lambda m, a: record["y"].append(a[0] - residual.pop()))


@pytest.mark.parametrize("family", FAMILIES)
def test_houlsby_reads_the_sub_layers_dropped_output(tiny_checkpoint, monkeypatch, family: str) -> None:
    """Finding: houlsby's adapters read the projection's output before the sub-layer's dropout,
    where AdapterHub and Houlsby et al.'s code read it after (dense, dropout, adapter): in training
    the adapter's input was not dropped and its sum was (another function, exit 0; eval the same).
    BART's stayed so after the other families were fixed: its layers drop out with a call, not a
    module. With a dropout that doubles, every adapted sub-layer adds d + A(d) to its residual,
    d = 2 x, x the projection's output (not 2 (x + A(x))); BART's cross-attention, which has no
    adapter, still adds its dropped output 2 x, once."""
    model, batch = _load(tiny_checkpoint, family)
    Adapters(non_linearity="tanh").apply(model, _ctx(model))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_adapter(name):
                param.copy_(torch.randn_like(param) * 0.5)
    monkeypatch.setattr(torch.nn.functional, "dropout", _doubling_dropout)
    seen: dict[str, dict] = {}
    adapted = [n for n, m in model.named_modules() if hasattr(m, "bottleneck_adapter")]
    assert len(adapted) == 2 * 2 * (2 if family in ("t5", "bart") else 1)  # 2 per layer, 2 layers, 2 stacks
    cross = [n for n, _ in model.named_modules() if n.endswith("encoder_attn.out_proj")]
    for name in adapted + cross:
        _sub_layer_sums(model, name, seen)
    model.train()
    with torch.no_grad():
        model(**batch)
    for name in adapted + cross:
        (x,), (y,) = seen[name]["x"], seen[name]["y"]
        dropped = 2 * x
        if name in cross:
            torch.testing.assert_close(y, dropped)
            continue
        delta = model.get_submodule(name).bottleneck_adapter.delta
        torch.testing.assert_close(y, dropped + delta(dropped))
        assert not torch.allclose(y, 2 * (x + delta(x)), atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_checkpoint_holding_bottleneck_adapters_is_refused(tiny_checkpoint, tmp_path: Path, family: str) -> None:
    """transformers builds the plain model and drops the weights it has no place for: a model saved
    after `load_adapters` (the export's load line), or an adapter folder beside its base, given as
    model.checkpoint, started from the base without its adapters, exit 0. One line at validate
    (the config file, or a weight name in the safetensors header); a .bin, whose names need torch,
    when it loads. The base alone is still accepted."""
    import toolkit

    model, _ = _load(tiny_checkpoint, family)
    Adapters(config="pfeiffer").apply(model, _ctx(model))
    model.save_pretrained(tmp_path / "saved")  # its state dict holds the adapters
    base, _ = _load(tiny_checkpoint, family)
    base.save_pretrained(tmp_path / "beside")
    Adapters().save(base, tmp_path / "beside")  # bottleneck_config.json beside the base
    base.save_pretrained(tmp_path / "base")
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    (bin_folder / "config.json").write_text((tmp_path / "saved" / "config.json").read_text())
    torch.save(model.state_dict(), bin_folder / "pytorch_model.bin")
    for folder, held in (("saved", r"\.bottleneck_adapter\."), ("beside", CONFIG_FILE)):
        with pytest.raises(UserError, match=rf"model.checkpoint: .*{folder} holds bottleneck adapters \(.*{held}"):
            toolkit.validate("demo/sst2/minilm-lora", [f"model.checkpoint={tmp_path / folder}"])
    with pytest.raises(UserError, match=r"bin holds bottleneck adapters \(.*\.bottleneck_adapter\..*\), .*start from their base"):
        models.load(str(bin_folder), "sequence-classification", {"num_labels": 2},
                    tokenizer=models.load_tokenizer(tiny_checkpoint(family)))
    toolkit.validate("demo/sst2/minilm-lora", [f"model.checkpoint={tmp_path / 'base'}"])


def test_loading_twice_is_refused(tiny_checkpoint, tmp_path: Path) -> None:
    model, _ = _load(tiny_checkpoint, "gpt2")
    method = Adapters(config="pfeiffer")
    method.apply(model, _ctx(model))
    method.save(model, tmp_path)
    with pytest.raises(UserError, match="already"):
        load_adapters(model, tmp_path)


@pytest.mark.parametrize("setting, words", [
    ("config: foo", ["method.config", "houlsby, pfeiffer", "'foo'"]),
    ("non_linearity: sigmoid", ["method.non_linearity", "relu"]),
    ("reduction_factor: 0", ["method.reduction_factor", "minimum 1"]),
    ("layers: [-1]", ["method.layers"]),
])
def test_bad_setting_is_one_clear_line(cli, tmp_path: Path, setting: str, words: list[str]) -> None:
    path = write_recipe(tmp_path / "bad.yaml", (
        "model: {checkpoint: bert-base-uncased}\n"
        "task: {name: glue, subset: sst2}\n"
        f"method: {{name: adapters, {setting}}}\n"))
    code, _, err = cli("validate", path)
    assert code == 2
    line = err.strip()
    assert "\n" not in line and all(w in line for w in words), line


def test_recipes_validate(cli) -> None:
    files = sorted((ROOT / "recipes" / "glue").glob("*/*-houlsby.yaml"))
    files += sorted((ROOT / "recipes" / "glue").glob("*/*-pfeiffer.yaml"))
    assert len(files) == 12
    code, out, err = cli("validate", *files)
    assert code == 0, err
    assert "12 of 12 recipes valid" in out


def test_smoke_run_saves_only_adapters(cli, runs_dir: Path) -> None:
    """End to end through the one training loop: the run's model/ folder holds the adapters, the
    head and the tokenizer, no base weights, and reloads onto the base it names."""
    recipe = ROOT / "recipes" / "glue" / "rte" / "roberta-base-houlsby.yaml"
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", runs_dir)
    assert code == 0, err
    (config_file,) = list(runs_dir.rglob(CONFIG_FILE))
    folder = config_file.parent
    assert not list(folder.glob("model*.safetensors")) and not (folder / "config.json").exists()
    base_id = json.loads(config_file.read_text())["base_model"]
    base, tok = models.load(base_id, "sequence-classification", {"num_labels": 2})
    loaded = load_adapters(base, folder).eval()
    assert sum(isinstance(m, Bottleneck) for m in loaded.modules()) == 4
    assert torch.isfinite(_logits(loaded, dict(tok(TEXTS, padding=True, return_tensors="pt")))).all()


# the feed-forward sub-block of layer 0 of the first stack, where AdapterHub's mixins call
# bottleneck_layer_forward: (module that gives the adapted output, how to read h and x off the
# base model's modules, the layer's own LayerNorm after the residual add or None for pre-LN)
FEED_FORWARD = {"bert": "layer.0.output", "roberta": "layer.0.output", "gpt2": "h.0",
                "bart": "encoder.layers.0", "t5": "encoder.block.0.layer.1"}
ATTENTION_PARTS = ("attention", "attn", "SelfAttention", "self_attn")


def _module(model: torch.nn.Module, suffix: str) -> torch.nn.Module:
    (found,) = [m for n, m in model.named_modules() if n == suffix or n.endswith("." + suffix)]
    return found


def _h_x_ln(base: torch.nn.Module, family: str, batch: dict):
    """The feed-forward block's output h (before its residual add), the residual x, and the
    LayerNorm applied after the add (None: pre-LN), read off the base model's own modules."""
    seen = {}
    block = _module(base, FEED_FORWARD[family])
    hooks = []
    if family in ("bert", "roberta"):
        hooks.append(block.register_forward_pre_hook(lambda m, a: seen.update(h=m.dense(a[0]), x=a[1])))
        ln = block.LayerNorm
    elif family == "gpt2":
        hooks.append(block.mlp.register_forward_hook(lambda m, a, o: seen.update(h=o)))
        hooks.append(block.ln_2.register_forward_pre_hook(lambda m, a: seen.update(x=a[0])))
        ln = None
    elif family == "bart":
        hooks.append(block.fc2.register_forward_hook(lambda m, a, o: seen.update(h=o)))
        hooks.append(block.fc1.register_forward_pre_hook(lambda m, a: seen.update(x=a[0])))
        ln = block.final_layer_norm
    else:
        hooks.append(block.register_forward_pre_hook(
            lambda m, a: seen.update(x=a[0], h=m.DenseReluDense(m.layer_norm(a[0])))))
        ln = None
    with torch.no_grad():
        base(**batch)
    for hook in hooks:
        hook.remove()
    return seen["h"], seen["x"], ln


def _adapterhub(h, x, ln, adapter, config: str) -> torch.Tensor:
    """AdapterHub's bottleneck_layer_forward for one adapter at the feed-forward block
    (Adapter.pre_forward, forward, post_forward), with SeqBnConfig (pfeiffer: original_ln_before,
    residual_before_ln, original_ln_after) or DoubleSeqBnConfig (houlsby: original_ln_after only)."""
    residual = h
    hidden = h
    if config == "pfeiffer":  # original_ln_before
        hidden = h + x if ln is None else ln(h + x)
    out = adapter.delta(hidden) + residual  # no ln_before/ln_after, scaling 1
    return out + x if ln is None else ln(out + x)  # original_ln_after


@pytest.mark.parametrize("family, config", CASES)
def test_the_feed_forward_adapter_is_adapterhubs(tiny_checkpoint, family: str, config: str) -> None:
    """Finding: `config: pfeiffer` put its adapter on the feed-forward projection's output, before
    the residual add, as houlsby's second adapter; AdapterHub's Pfeiffer (SeqBnConfig) reads the
    block's output after the residual add (and the layer's LayerNorm, on a post-LN model) and adds
    to the stream there: another function of the weights, trained and scored under the name
    Pfeiffer with exit 0. Each family's feed-forward adapter, randomised, gives AdapterHub's
    output computed from the base model's own h and x; houlsby's stays what it was."""
    model, batch = _load(tiny_checkpoint, family)
    base = copy.deepcopy(model)
    Adapters(config=config).apply(model, _ctx(model))
    model.eval()
    prefix = FEED_FORWARD[family]
    adapters = {n: m for n, m in model.named_modules() if isinstance(m, Bottleneck)}
    torch.manual_seed(1)
    chosen = None
    with torch.no_grad():
        for name, adapter in adapters.items():
            mine = (f".{prefix}." in f".{name}" and not any(f".{p}." in f".{name}." for p in ATTENTION_PARTS))
            for p in adapter.parameters():
                p.copy_(torch.randn_like(p) if mine else torch.zeros_like(p))
            chosen = adapter if mine else chosen
    assert chosen is not None
    h, x, ln = _h_x_ln(base, family, batch)
    got = {}
    hook = _module(model, prefix).register_forward_hook(lambda m, a, o: got.update(out=o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        model(**batch)
        want = _adapterhub(h, x, ln, chosen, config)
    hook.remove()
    torch.testing.assert_close(got["out"], want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pfeiffer_folder_saved_before_the_adapterhub_placement_loads_as_it_ran(tiny_checkpoint, tmp_path: Path,
                                                                                family: str) -> None:
    """A folder whose config has no `placement` (saved with the feed-forward projection's
    placement) loads back to the outputs it was saved with; a new folder records its placement."""
    from toolkit.methods import set_trainable

    model, batch = _load(tiny_checkpoint, family)
    method = Adapters(config="pfeiffer")
    method.inject(model, legacy=True)
    set_trainable(model, lambda n: is_adapter(n) or is_head(n, models.head_names(model)))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.3)
    expected = _logits(model, batch)
    method.save(model, tmp_path)
    info = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert info.pop("placement") == "adapterhub"
    (tmp_path / CONFIG_FILE).write_text(json.dumps(info))
    loaded = load_adapters(_load(tiny_checkpoint, family)[0], tmp_path)
    torch.testing.assert_close(_logits(loaded.eval(), batch), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_houlsby_trains_the_layer_norms_where_asked(tiny_checkpoint, tmp_path: Path, family: str) -> None:
    """method.train_layer_norms: the base's layer normalisations train beside the adapters and the
    head, as Houlsby et al. (2019) trained them (the `adapters` library freezes them, and so did
    this toolkit, with no way to follow the paper); they are saved and loaded back with the
    adapters. Off (the default), they stay frozen and a recipe's run id is as before."""
    from toolkit.methods.adapters import layer_norm_names
    from toolkit.recipe import parse

    model, batch = _load(tiny_checkpoint, family)
    ctx = _ctx(model)
    method = Adapters(config="houlsby", train_layer_norms=True)
    method.apply(model, ctx)
    norms = layer_norm_names(model)
    assert norms and all(".bottleneck_adapter." not in n for n in norms)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == \
        {n for n, _ in model.named_parameters() if is_adapter(n) or is_head(n, ctx.head_names) or n in norms}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _train(model, batch, steps=3)
    assert all(not torch.equal(model.state_dict()[n], before[n]) for n in norms if n.endswith("weight"))
    expected = _logits(model, batch)
    method.save(model, tmp_path)
    assert norms <= set(load_file(str(tmp_path / WEIGHTS_FILE)))
    loaded = load_adapters(_load(tiny_checkpoint, family)[0], tmp_path)
    torch.testing.assert_close(_logits(loaded.eval(), batch), expected, rtol=0, atol=1e-6)
    assert {n for n, p in loaded.named_parameters() if p.requires_grad} >= norms  # trains on as it trained
    raw = {"model": {"checkpoint": "bert-base-uncased"}, "task": {"name": "glue", "subset": "sst2"},
           "method": {"name": "adapters"}}
    off = parse({**raw, "method": {"name": "adapters", "train_layer_norms": False}})
    on = parse({**raw, "method": {"name": "adapters", "train_layer_norms": True}})
    assert off.hash == parse(raw).hash != on.hash
