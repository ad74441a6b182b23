"""The advice in refusals: what a refusal names in its place is accepted for the same model and task.

Walked over the method registry, every family (BERT, RoBERTa, GPT-2, BART, T5, MiniLM, and
Llama and mT5 from local folders holding a small config) and every task type: each recipe that
`validate` refuses with advice naming other methods (`methods.instead`) or other objectives
(a pretraining task on the wrong kind of model) is validated again as advised, and must pass.
Finding: the advice was written by hand per refusal and named bitfit for every family but T5:
prompt tuning on a Llama classifier and freeze on an mT5 summarizer advised bitfit, which
refused the bias-free body as it was applied, after the model had loaded. Where the advice names
methods on a bias-free body, each is also applied to a small random model of it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import toolkit
from conftest import MINILM, SHARED, write_recipe
from toolkit import heads, models
from toolkit.errors import UserError
from toolkit.methods import METHODS, Context

TEXT = "train_file: $TOOLKIT_DATA/lm/wikitext-2/valid.txt, eval_file: $TOOLKIT_DATA/lm/wikitext-2/test.txt"
TASKS = {  # a task of each type, as a recipe's task section
    "classification": "{name: glue, subset: sst2}",
    "ner": "{name: ner}",
    "extractive-qa": "{name: squad, version: v1, mode: extractive, eval_file: $TOOLKIT_DATA/squad/v1.1/dev-v1.1.json, "
                     "split_articles: 0.834}",
    "mlm": f"{{name: mlm, {TEXT}}}",
    "clm": f"{{name: clm, {TEXT}}}",
    "denoise": f"{{name: denoise, {TEXT}}}",
    "span_corruption": f"{{name: span_corruption, {TEXT}}}",
    "summarization": "{name: summarization, subset: samsum}",
}
CHECKPOINTS = {"bert": "bert-base-uncased", "roberta": "roberta-base", "gpt2": "gpt2", "bart": "facebook/bart-base",
               "t5": "t5-base", "minilm": MINILM}
BIAS_FREE = {"llama": "gpt2", "mt5": "t5"}  # family -> the shared tokenizer its folder holds
TRAINED = sorted(n for n in METHODS.names() if METHODS.get(n).trains)
ADVICE = re.compile(r"; use ([\w, ()]+)$")
# what a warm-started encoder-decoder's advice says to set ("lora (with target_modules)", "ia3 (with
# target_modules and feedforward_modules)"): MiniLM's layers
WITH = {"target_modules": "[query, value]", "feedforward_modules": "[value]"}
COMPOSITE = "minilm2minilm"  # MiniLM warm-started as both halves of an EncoderDecoderModel


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """family -> checkpoint: the Hub ids (read off-line), and for Llama and mT5 a folder holding a
    small config of the family and a tokenizer (all validate reads)."""
    from transformers import AutoConfig, AutoTokenizer

    out = {family: f"{{checkpoint: {checkpoint}}}" for family, checkpoint in CHECKPOINTS.items()}
    out[COMPOSITE] = f"{{checkpoint: {MINILM}, warm_start: encoder-decoder}}"
    for family, tokenizer in BIAS_FREE.items():
        folder = tmp_path_factory.mktemp(family)
        tok = AutoTokenizer.from_pretrained(SHARED / "tokenizers" / tokenizer)
        AutoConfig.for_model(family, vocab_size=len(tok), hidden_size=32, d_model=32, num_hidden_layers=2,
                             num_layers=2, num_attention_heads=2, num_heads=2, intermediate_size=64, d_ff=64,
                             pad_token_id=tok.pad_token_id or 0).save_pretrained(folder)
        tok.save_pretrained(folder)
        out[family] = f"{{checkpoint: {folder}}}"
    return out


def _validate(tmp_path: Path, model: str, task: str, method: str) -> str | None:
    """validate's refusal of the recipe (`model`, `task`: its sections), or None where it passes."""
    recipe = write_recipe(tmp_path / "r.yaml", f"model: {model}\ntask: {task}\nmethod: {{name: {method}}}\n")
    try:
        toolkit.validate(recipe)
    except UserError as exc:
        return str(exc)
    return None


def _advised_methods(refusal: str) -> list[str] | None:
    """The methods a method refusal names in its place, each with the settings it says to give
    ('lora, target_modules: [query, value]'), or None where it names none."""
    found = ADVICE.search(refusal) if refusal.startswith("method.name:") else None
    advised = []
    for said in re.split(r", | or ", found.group(1)) if found else []:
        name, _, setting = said.partition(" (with ")
        if name not in METHODS:
            return None
        settings = setting.rstrip(")").split(" and ") if setting else []
        advised.append(", ".join([name] + [f"{s}: {WITH[s]}" for s in settings]))
    return advised or None


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("family", sorted({**CHECKPOINTS, **BIAS_FREE, COMPOSITE: None}))
def test_what_a_refusal_advises_is_accepted(checkpoints, tmp_path, family, task):
    """Every trained method on this family and task: a method refusal's advice, each method it
    names, passes validate (and on a bias-free body applies)."""
    model = checkpoints[family]
    followed = 0
    for method in TRAINED:
        refusal = _validate(tmp_path, model, TASKS[task], method)
        if refusal is None:
            continue
        advised = _advised_methods(refusal)
        if advised is not None:
            assert method not in [a.split(",")[0] for a in advised], refusal
            for other in advised:
                again = _validate(tmp_path, model, TASKS[task], other)
                assert again is None, f"{method} on {family}/{task}: {refusal}\n  advised {other}: {again}"
                if family in BIAS_FREE:
                    _apply(tmp_path, model, family, TASKS[task], other)
                followed += 1
    if (family, task) in (("llama", "classification"), ("mt5", "summarization"), ("t5", "classification"),
                          (COMPOSITE, "summarization")):
        assert followed, "the cases found (prompt tuning, freeze, bitfit) advise nothing here any more"


@pytest.mark.parametrize("method, named", [("freeze", ["lora", "ia3", "bitfit"]),
                                           ("prompt_tuning", ["lora", "bitfit", "full"]),
                                           ("prefix_tuning", ["lora", "bitfit", "full"])])
def test_advice_names_what_needs_target_modules_with_them(checkpoints, tmp_path, method, named):
    """On a warm-started encoder-decoder (no PEFT default target modules) a refusal names LoRA and
    IA3 with the settings they need there, and each followed so passes: freeze advised 'lora, ia3'
    (each refused as said) and then bitfit alone, leaving out the adapters that run once told where."""
    refusal = _validate(tmp_path, checkpoints[COMPOSITE], TASKS["summarization"], method)
    advised = _advised_methods(refusal or "")
    assert advised and [a.split(",")[0] for a in advised] == named, refusal
    assert "lora (with target_modules)" in refusal
    for other in advised:
        assert _validate(tmp_path, checkpoints[COMPOSITE], TASKS["summarization"], other) is None, (refusal, other)


def _apply(tmp_path: Path, model: str, family: str, task: str, method: str) -> None:
    """Apply `method` (its default settings, sized for a width-32 model) to a small random model
    of the recipe's head: the refusals found only then (bitfit on a body without biases) are
    not met either."""
    import transformers

    from toolkit import recipe as recipes

    path = write_recipe(tmp_path / "advised.yaml", f"model: {model}\ntask: {task}\nmethod: {{name: {method}}}\n")
    loaded = recipes.load(path)
    checkpoint = loaded.model.checkpoint
    head = heads.get(loaded.method.head(loaded.task, family))
    config = transformers.AutoConfig.from_pretrained(checkpoint, num_labels=2)
    model = getattr(transformers, head.auto_class).from_config(config)
    settings = {"lora": {"r": 4}, "dora": {"r": 4}, "adalora": {"init_r": 4, "target_r": 2},
                "prefix_tuning": {"num_virtual_tokens": 4}}.get(method, {})
    ctx = Context(family, models.head_names(model), head.peft_task_type, None, total_steps=10)
    trained = METHODS.get(method)(**settings).apply(model, ctx)
    assert any(p.requires_grad for p in trained.parameters())


@pytest.mark.parametrize("family", ["bert", "gpt2", "bart", "t5"])
@pytest.mark.parametrize("task", ["mlm", "clm", "denoise", "span_corruption"])
def test_what_a_pretraining_objective_advises_is_accepted(checkpoints, tmp_path, family, task):
    """A pretraining objective on the wrong kind of model names the objectives for that kind:
    each of them passes validate on the same model."""
    refusal = _validate(tmp_path, checkpoints[family], TASKS[task], "full")
    if refusal is None:
        return
    kind = models.kind_of(models.family_of(CHECKPOINTS[family]))
    found = re.search(r"^task\.name: .*; use (.*)$", refusal)
    assert found, refusal
    advised = [name for part in found.group(1).split(", ")
               for names, _, whom in [part.partition(" for ")]
               if whom.rstrip("s") == kind or (kind == "encoder-decoder" and whom in ("BART", "T5"))
               for name in names.split(" or ")]
    assert advised, refusal
    for other in advised:
        assert _validate(tmp_path, checkpoints[family], TASKS[other], "full") is None, (refusal, other)


def test_the_families_bitfit_refuses_at_validate_have_no_bias_term():
    """bitfit.BIAS_FREE is refused at validate: each family's body, built from its config, holds
    no bias term (a family wrongly listed would refuse a recipe that trains)."""
    import torch
    from transformers import AutoConfig, AutoModel

    from toolkit.methods.bitfit import BIAS_FREE as LISTED, is_bias

    for family in LISTED:
        config = AutoConfig.for_model(family)
        for key, value in models.SMALL.items():
            if hasattr(config, key):
                setattr(config, key, value)
        if "head_dim" in vars(config):  # a per-head width of its own (Gemma's, or None: Ministral's)
            config.head_dim = 16
        with torch.device("meta"):
            body = AutoModel.from_config(config)
        assert not [n for n, _ in body.named_parameters() if is_bias(n)], family


def test_a_bias_switch_in_the_config_gives_the_body_bias_terms():
    """bitfit.BIAS_SWITCHES, each key set to its value in every BIAS_FREE family's default config
    that holds it, builds a body with bias terms: validate lets bitfit through on such a
    checkpoint, and the switches read are those the family reads."""
    import torch
    from transformers import AutoConfig, AutoModel

    from toolkit.methods.bitfit import BIAS_FREE as LISTED, BIAS_SWITCHES, is_bias

    flipped = 0
    for family in LISTED:
        for key, value in BIAS_SWITCHES.items():
            config = AutoConfig.for_model(family)
            if key not in config.to_dict():
                continue
            for small, size in models.SMALL.items():
                if hasattr(config, small):
                    setattr(config, small, size)
            if "head_dim" in vars(config):
                config.head_dim = 16
            setattr(config, key, value)
            with torch.device("meta"):
                body = AutoModel.from_config(config)
            assert [n for n, _ in body.named_parameters() if is_bias(n)], (family, key)
            flipped += 1
    assert flipped >= 10  # 19 under transformers 5.23


@pytest.mark.parametrize("switches, trains", [({}, False), ({"attention_bias": False, "mlp_bias": False}, False),
                                               ({"attention_bias": True}, True), ({"mlp_bias": True}, True)])
def test_bitfit_on_a_llama_is_refused_at_validate_only_where_its_config_has_no_bias(tmp_path, switches, trains):
    """bitfit on a Llama folder: refused at validate where its config.json leaves the biases off;
    with `attention_bias` or `mlp_bias` on it passes validate and trains those biases (a Llama
    with q/k/v biases was refused as bias-free, its family's name all validate read)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SHARED / "tokenizers" / "gpt2")
    config = AutoConfig.for_model("llama", vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64, pad_token_id=0, **switches)
    config.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    refusal = _validate(tmp_path, f"{{checkpoint: {tmp_path}}}", TASKS["classification"], "bitfit")
    if not trains:
        assert refusal and "bitfit trains bias terms and llama has none" in refusal, refusal
        return
    assert refusal is None
    model = AutoModelForSequenceClassification.from_config(config)
    ctx = Context("llama", models.head_names(model), "SEQ_CLS", None, total_steps=10)
    trained = METHODS.get("bitfit")().apply(model, ctx)
    biases = [n for n, p in trained.named_parameters() if p.requires_grad and "score" not in n]
    assert biases and all(n.endswith(".bias") for n in biases), biases


# settings a method refuses with advice naming the setting that would be right (`set method.K: V`)
MIS_SET = {"prompt_tuning": "init_text: 'Classify the review:'", "prefix_tuning": "encoder_hidden_size: 16"}


@pytest.mark.parametrize("task", ["classification", "extractive-qa", "mlm", "summarization"])
@pytest.mark.parametrize("family", ["bert", "gpt2", "bart", "t5"])
@pytest.mark.parametrize("method", sorted(MIS_SET))
def test_what_a_setting_refusal_advises_is_accepted(checkpoints, tmp_path, method, family, task):
    """A setting refused with the one that would be right ('set method.init: text') is accepted
    once set, and on a model or task the method cannot run at all that refusal comes first (no
    setting lifts it): prompt tuning's init_text on a T5 classifier advised `init: text`, and
    following it met the refusal of soft prompts on that model."""
    base = _validate(tmp_path, checkpoints[family], TASKS[task], method)
    refusal = _validate(tmp_path, checkpoints[family], TASKS[task], f"{method}, {MIS_SET[method]}")
    assert refusal is not None
    if base is not None:
        assert refusal == base
        return
    found = re.search(r"; set method\.(\w+): (\w+)$", refusal)
    assert found, refusal
    advised = f"{method}, {MIS_SET[method]}, {found.group(1)}: {found.group(2)}"
    assert _validate(tmp_path, checkpoints[family], TASKS[task], advised) is None, (refusal, advised)


@pytest.mark.parametrize("family, head", [("llama", "sequence-classification"), ("llama", "causal-lm"),
                                          ("mt5", "seq2seq-lm"), ("mt5", "token-classification")])
def test_what_bitfit_advises_as_it_is_applied_is_accepted(checkpoints, tmp_path, family, head):
    """bitfit's refusal of a body found bias-free as it is applied (a family BIAS_FREE lacks)
    names the methods that take this family and head, asked as validate asks them; each
    applies to the same model."""
    import transformers

    from toolkit.methods import HeadOnly

    folder = re.search(r"checkpoint: ([^,}]+)", checkpoints[family]).group(1)
    auto = heads.get(head).auto_class

    def model():
        return getattr(transformers, auto).from_config(transformers.AutoConfig.from_pretrained(folder, num_labels=2))

    def ctx(built):
        return Context(family, models.head_names(built), heads.get(head).peft_task_type, None, total_steps=10, head=head)

    built = model()
    with pytest.raises(UserError, match=r"has none outside its head") as refused:
        METHODS.get("bitfit")().apply(built, ctx(built))
    advised = _advised_methods(str(refused.value))
    assert advised and ("freeze" in advised) == (head not in ("causal-lm", "seq2seq-lm")), refused.value
    for name in advised:
        assert METHODS.get(name)().incompatible(family, HeadOnly(head)) is None
        built = model()
        trained = METHODS.get(name)(**({"r": 4} if name == "lora" else {})).apply(built, ctx(built))
        assert any(p.requires_grad for p in trained.parameters()), name
