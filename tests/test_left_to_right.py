"""Every use of a model as a left-to-right decoder (the causal-lm head: clm, in-context prompting,
decoder-only text-to-text and generative QA) needs a model whose output at a position depends on no
later token. `models.kind_of` calls every family in transformers' causal-LM table and in neither the
masked-LM nor the seq2seq table a decoder; some of them attend both ways.

Finding: XLNet (a permutation LM: its LM head attends to later tokens without a perm_mask),
BertGenerationDecoder with `is_decoder` false (the checkpoints' setting; transformers only warns)
and a Gemma config with `use_bidirectional_attention` passed validate for clm, icl and
summarization and trained or scored with exit 0: a loss that read the token it predicted
(bert-generation clm: 2 steps, perplexity written, exit 0)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolkit import api, models
from toolkit.errors import UserError

REFUSED = "is not a left-to-right decoder"
RECIPES = {"clm": "pretrain/wikitext-2/gpt2-clm.yaml", "icl": "glue/sst2/gpt2-icl-0shot.yaml",
           "summarization": "summarization/samsum/gpt2-full.yaml", "squad": "squad/v1.1/gpt2-full.yaml"}
RECIPE_DIR = Path(__file__).resolve().parents[1] / "toolkit" / "recipes"


def _configs(tok) -> dict:
    import transformers as t

    ids = {"pad_token_id": tok.eos_token_id, "bos_token_id": tok.eos_token_id, "eos_token_id": tok.eos_token_id}
    bert = {"vocab_size": len(tok), "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "max_position_embeddings": 256, **ids}
    gemma = {"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 256, **ids}
    return {"xlnet": t.XLNetConfig(vocab_size=len(tok), d_model=32, n_layer=2, n_head=2, d_inner=64, **ids),
            "bert-generation": t.BertGenerationConfig(**bert),
            "gemma-bidirectional": t.GemmaConfig(use_bidirectional_attention=True, **gemma),
            "bert-generation-decoder": t.BertGenerationConfig(is_decoder=True, **bert),
            "gemma": t.GemmaConfig(**gemma),
            "opt": t.OPTConfig(vocab_size=len(tok), hidden_size=32, word_embed_proj_dim=32, num_hidden_layers=2,
                               ffn_dim=64, num_attention_heads=2, max_position_embeddings=256, **ids),
            "llama": t.LlamaConfig(**gemma)}


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint, tmp_path_factory) -> dict[str, str]:
    """name -> folder of a 2-layer, width-32 random causal-LM model of that config, GPT-2's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint("gpt2"))
    folders = {}
    for name, config in _configs(tok).items():
        folder = tmp_path_factory.mktemp(name)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(config).save_pretrained(folder)
        tok.save_pretrained(folder)
        folders[name] = str(folder)
    return folders


BOTH_WAYS = ["xlnet", "bert-generation", "gemma-bidirectional"]


@pytest.mark.parametrize("use", sorted(RECIPES))
@pytest.mark.parametrize("name", BOTH_WAYS)
def test_every_left_to_right_use_refuses_a_model_that_reads_both_ways(tiny, cli, runs_dir, use, name):
    """validate and run (CLI and API) of clm, icl, decoder-only summarization and generative QA
    refuse at validate, in one line naming the model and the fix, and leave nothing behind."""
    recipe, override = str(RECIPE_DIR / RECIPES[use]), f"model.checkpoint={tiny[name]}"
    code, _, err = cli("validate", recipe, override)
    assert code == 2 and REFUSED in err and f"({name.split('-bi')[0]})" in err
    fix = {"bert-generation": '"is_decoder": true', "gemma-bidirectional": "use_bidirectional_attention"}
    assert fix.get(name, "use a causal decoder") in err
    code, _, err = cli("run", recipe, override, "--runs-dir", runs_dir)
    assert code == 2 and REFUSED in err and len(err.strip().splitlines()) == 1
    assert not runs_dir.exists()
    with pytest.raises(UserError, match=REFUSED):
        api.validate(recipe, [override])
    with pytest.raises(UserError, match=REFUSED):
        api.run(recipe, [override], runs_dir=runs_dir)
    assert not runs_dir.exists()


@pytest.mark.parametrize("name", BOTH_WAYS)
def test_a_load_that_skips_validate_refuses_too(tiny, name):
    """models.load (run, eval, predict and export of a run all load through it) refuses as validate does."""
    with pytest.raises(UserError, match=REFUSED):
        models.load(tiny[name], "causal-lm", {})
    if name == "gemma-bidirectional":  # a head not read left to right: no refusal (the others have none here)
        models.load(tiny[name], "sequence-classification", {"num_labels": 2})


def test_the_probe_sees_what_no_config_says(tiny, tiny_checkpoint, cli):
    """check_left_to_right reads the model, not its config: each model that attends both ways is
    refused (none of which any config check is asked about here); every causal one passes, its
    training mode and the random stream as they were. The same families set to read left to
    right (is_decoder true, no use_bidirectional_attention) validate and load as decoders."""
    from transformers import AutoModelForCausalLM

    for name in BOTH_WAYS:
        model = AutoModelForCausalLM.from_pretrained(tiny[name])
        with pytest.raises(UserError, match=f"{REFUSED}: changing the last of 4 tokens moved its outputs"):
            models.check_left_to_right(name, model)
    causal = [tiny[name] for name in ("bert-generation-decoder", "gemma", "opt", "llama")] + [tiny_checkpoint("gpt2")]
    for folder in causal:
        model = AutoModelForCausalLM.from_pretrained(folder).train()
        state = torch.random.get_rng_state()
        models.check_left_to_right(folder, model)
        assert model.training and torch.equal(state, torch.random.get_rng_state())
    for name in ("bert-generation-decoder", "gemma"):
        code, _, err = cli("validate", str(RECIPE_DIR / RECIPES["clm"]), f"model.checkpoint={tiny[name]}")
        assert code == 0, err
        assert models.load(tiny[name], "causal-lm", {})[0].config.model_type == name.split("-dec")[0]


def test_a_smoke_model_reads_as_its_checkpoint(tiny):
    """--smoke's small model of a family the toolkit has no recipe for took the family's defaults,
    is_decoder false among them: the smoke run of a bert-generation decoder was refused at load
    (before the refusal, it trained a model attending both ways in place of the decoder)."""
    folder = models.smoke_checkpoint(tiny["bert-generation-decoder"])
    model, _ = models.load(folder, "causal-lm", {})
    assert model.config.is_decoder is True
    with pytest.raises(UserError, match=REFUSED):  # and one that reads both ways stays so
        models.load(models.smoke_checkpoint(tiny["gemma-bidirectional"]), "causal-lm", {})


def test_a_config_saying_no_position_limit_limits_nothing() -> None:
    """Finding: XLNet's config says `max_position_embeddings: -1` (relative positions, no
    limit), and every XLNet task was refused as "task.max_length: 32 is more than the -1
    positions". A number below 1 is no limit: the tokenizer's, where it has one, else none."""
    from types import SimpleNamespace

    from transformers import XLNetConfig

    from toolkit.models import max_positions

    config = XLNetConfig()
    assert config.max_position_embeddings == -1
    assert max_positions(config, SimpleNamespace(model_max_length=int(1e30))) is None
    assert max_positions(config, SimpleNamespace(model_max_length=256)) == 256
    assert max_positions(SimpleNamespace(model_type="gpt2", n_positions=1024), SimpleNamespace(model_max_length=int(1e30))) == 1024
