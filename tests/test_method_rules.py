"""Rules every training method keeps, walked over the method registry (`METHODS`) and the
families and task types each one takes (those it refuses are left to `incompatible`'s tests).

- Generation: what `generate` writes is the trained model's own greedy choice (the forward the
  loss trains, step by step, unpadded), with the KV cache on or off, greedy or beam, under the
  task's no-repeat rule, and whatever padding a batch-mate adds.
- What validate accepts trains: for every method, head and family it lets through, something
  trains, exactly that is stepped and gets gradients, and the rest stays bit-identical.
- A merged export is plain transformers with the run's logits, on every family's classifier.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig
from transformers.utils import logging as hf_logging

from toolkit.methods import METHODS, Context

# settings that fit a 2-layer, width-32 model
SMALL = {"lora": {"r": 4}, "dora": {"r": 4}, "adalora": {"init_r": 4, "target_r": 2},
         "prompt_tuning": {"num_virtual_tokens": 4}, "prefix_tuning": {"num_virtual_tokens": 4},
         "p_tuning": {"num_virtual_tokens": 4, "encoder_hidden_size": 16}}
TRAINED = sorted(n for n in METHODS.names() if METHODS.get(n).trains)
TEXTS = ["a great movie with a lot of talking in it", "bad"]
NEW = 5


@pytest.fixture(autouse=True)
def _quiet():
    hf_logging.set_verbosity_error()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Width-32 models gain nothing from threads on a busy machine (see test_adapters.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class _LMTask:
    """What `incompatible` reads of a text-to-text task (summarization, translation)."""

    instruction = "Summarize:"

    def model_head(self, family: str | None) -> str:
        return "causal-lm" if family == "gpt2" else "seq2seq-lm"


def _generators() -> list[tuple[str, str]]:
    return [(m, f) for m in TRAINED for f in ("gpt2", "bart", "t5")
            if METHODS.get(m)(**SMALL.get(m, {})).incompatible(f, _LMTask()) is None]


_PRISTINE: dict[str, tuple[torch.nn.Module, object]] = {}


def _shaken(method: str, family: str, tiny: str) -> tuple[torch.nn.Module, object]:
    """The family's LM under `method`, every trainable parameter moved off its start (a LoRA B,
    an adapter's up-projection and IA3's scales start as the identity), in eval mode."""
    if family not in _PRISTINE:  # loaded once, then copied: loading dominated the time
        tok = AutoTokenizer.from_pretrained(tiny)
        model = (AutoModelForCausalLM if family == "gpt2" else AutoModelForSeq2SeqLM).from_pretrained(tiny)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
            model.config.pad_token_id = tok.eos_token_id
        model.generation_config.forced_eos_token_id = None  # BART's: an end token forced at the budget
        _PRISTINE[family] = model, tok
    torch.manual_seed(0)
    model, tok = copy.deepcopy(_PRISTINE[family][0]), _PRISTINE[family][1]
    ctx = Context(family, [], "CAUSAL_LM" if family == "gpt2" else "SEQ_2_SEQ_LM", tok, total_steps=10)
    model = METHODS.get(method)(**SMALL.get(method, {})).apply(model, ctx)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.5)
    return model.eval(), tok


def _generate(model, tok, texts: list[str], decoder_only: bool, no_repeat: int = 0, **settings) -> list[list[int]]:
    """New tokens per text, padded as the toolkit pads (a decoder's prompt on the left), with
    no stopping rule or logits processor but the end token and the task's no-repeat rule (for a
    decoder, within its continuation: the task's own processor)."""
    from toolkit.tasks._generation import UNSET, continuation_no_repeat

    tok.padding_side = "left" if decoder_only else "right"
    enc = tok(texts, padding=True, return_tensors="pt")
    config = GenerationConfig(max_new_tokens=NEW, do_sample=False, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id, **settings)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config.decoder_start_token_id = getattr(base.config, "decoder_start_token_id", None)
    extra = dict(UNSET)  # as the task's generate passes them
    if no_repeat and decoder_only:
        extra["logits_processor"] = continuation_no_repeat(no_repeat, enc.input_ids.shape[1])
    elif no_repeat:
        config.no_repeat_ngram_size = no_repeat
    with torch.no_grad():
        out = model.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask, generation_config=config,
                             **extra)
    out = out[:, enc.input_ids.shape[1]:] if decoder_only else out[:, 1:]
    return [[t for t in row.tolist() if t != tok.pad_token_id] for row in out]


def _greedy_by_forward(model, tok, text: str, decoder_only: bool, no_repeat: int = 0) -> list[int]:
    """The greedy continuation by the forward the loss trains on, one full pass per token; with
    `no_repeat`, no n-gram of the output (the decoder's start token included) twice."""
    from transformers import NoRepeatNGramLogitsProcessor

    ids = tok([text], return_tensors="pt").input_ids
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    seq = ids if decoder_only else torch.tensor([[base.config.decoder_start_token_id]])
    new = []
    with torch.no_grad():
        for _ in range(NEW):
            if decoder_only:
                logits = model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits
            else:
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), decoder_input_ids=seq).logits
            scores = logits[:, -1]
            if no_repeat:
                scores = NoRepeatNGramLogitsProcessor(no_repeat)(seq[:, ids.shape[1]:] if decoder_only else seq, scores)
            token = scores.argmax(-1)
            new.append(int(token))
            seq = torch.cat([seq, token[:, None]], dim=1)
            if int(token) == tok.eos_token_id:
                break
    return [t for t in new if t != tok.pad_token_id]


@pytest.mark.parametrize("method, family", _generators())
def test_generation_is_the_trained_models_choice_cache_beams_and_padding(tiny_checkpoint, method, family):
    """Finding: prompt and p-tuning on GPT-2 generated other text with the KV cache than without
    it (PEFT put the soft prompt in again at every new token: transformers 5.24 passes the
    cache as `cache`, where PEFT looks for `past_key_values`), and a short example's output
    changed with a longer batch-mate (PEFT drops the position ids, so left padding shifted the
    text's positions). Summarization and generative SQuAD were scored on that text, exit 0."""
    model, tok = _shaken(method, family, tiny_checkpoint(family))
    decoder_only = family == "gpt2"
    want = [_greedy_by_forward(model, tok, text, decoder_only) for text in TEXTS]
    assert _generate(model, tok, TEXTS, decoder_only) == want, "greedy (cached, padded)"
    beams = _generate(model, tok, TEXTS, decoder_only, num_beams=3)
    assert _generate(model, tok, TEXTS[1:], decoder_only, num_beams=3, use_cache=False) == beams[1:], \
        "beam search padded and cached, unpadded without the cache"
    want = [_greedy_by_forward(model, tok, text, decoder_only, no_repeat=2) for text in TEXTS]
    assert _generate(model, tok, TEXTS, decoder_only, no_repeat=2) == want, "greedy with no repeated bigram"


# --- what trains: every head a task may ask for, on a family that has it --------------------------
HEADS = [("bert", "token-classification"), ("roberta", "question-answering"), ("bert", "masked-lm"),
         ("gpt2", "causal-lm"), ("bart", "seq2seq-lm"), ("t5", "seq2seq-lm"),  # sequence classification: test_methods.py
         ("bart", "question-answering"), ("t5", "question-answering")]  # squad with task.mode: extractive


class _HeadTask:
    instruction = "Tag the words:"

    def __init__(self, head: str) -> None:
        self.head = head

    def model_head(self, family: str | None) -> str:
        return self.head


def _accepted() -> list[tuple[str, str, str]]:
    return [(m, f, h) for f, h in HEADS for m in TRAINED
            if METHODS.get(m)(**SMALL.get(m, {})).incompatible(f, _HeadTask(h)) is None]


_LOADED: dict[tuple[str, str], tuple[torch.nn.Module, object]] = {}


def _scalar(outputs) -> torch.Tensor:
    """A loss-like number of every output the head gives (logits, or QA's start and end)."""
    parts = [getattr(outputs, k) for k in ("logits", "start_logits", "end_logits") if getattr(outputs, k, None) is not None]
    return sum(p.float().pow(2).mean() for p in parts)


@pytest.mark.parametrize("method, family, head", _accepted())
def test_what_validate_accepts_trains_and_only_that_moves(tiny_checkpoint, method, family, head):
    """For every method, head and family `incompatible` lets through: something trains (freeze on
    the mlm task passed `toolkit validate` and stopped after loading model and data: a masked LM
    has no task head); the optimizer holds exactly the trainable parameters, each of which gets a
    gradient; a step leaves every frozen parameter bit-identical; total_params counts what the
    forward runs."""
    from types import SimpleNamespace

    importlib.import_module("toolkit.tasks")  # the tasks declare their heads
    from toolkit import heads, models
    from toolkit.methods import count_params
    from toolkit.train import _optimizer

    if (family, head) not in _LOADED:
        torch.manual_seed(0)
        _LOADED[family, head] = models.load(tiny_checkpoint(family), head, {"num_labels": 3} if "class" in head else {})
    model, tok = copy.deepcopy(_LOADED[family, head][0]), _LOADED[family, head][1]
    ctx = Context(family, models.head_names(model), heads.get(head).peft_task_type, tok,
                  instruction="Tag the words:", total_steps=10)
    spec = METHODS.get(method)(**SMALL.get(method, {}))
    model = spec.apply(model, ctx).train()
    trainable, total = count_params(model)
    assert trainable > 0, "accepted, and nothing trains"
    recipe = SimpleNamespace(method=spec, train=SimpleNamespace(weight_decay=0.1, precision_mode="fp32", lr=1e-2))
    optimizer = _optimizer(model, recipe, torch.device("cpu"))
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters() if p.requires_grad}
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == trainable
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    if head == "seq2seq-lm":
        batch["decoder_input_ids"] = batch["input_ids"][:, :3]
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    _scalar(model(**batch)).backward()
    assert not [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None], "trainable, no gradient"
    for name, table in getattr(model, "prompt_encoder", {}).items():  # every virtual token is read: PEFT's
        idle = (table.embedding.weight.grad.abs().sum(-1) == 0).nonzero().flatten().tolist()  # seq2seq prompt
        assert not idle, f"rows {idle} of the {name} prompt table are never read, and count as trainable"  # table was 2n
    optimizer.step()
    assert not [n for n, p in model.named_parameters() if n in before and not torch.equal(p, before[n])]
    for p in model.parameters():  # what the forward runs: every parameter a backward reaches
        p.requires_grad_(True)
        p.grad = None
    _scalar(model(**batch)).backward()
    reached = {id(p): p.numel() for p in model.parameters() if p.grad is not None}
    assert total == sum(reached.values())


PER_POSITION = [(m, f, h) for m, f, h in _accepted() if h in ("token-classification", "question-answering")]


@pytest.mark.parametrize("method, family, head", PER_POSITION)
def test_per_position_outputs_have_the_inputs_width_under_every_method(tiny_checkpoint, tmp_path, method, family, head):
    """A token classifier's and an extractive QA model's outputs have one position per input
    token under every method, for anyone who calls the model: PEFT's soft prompts (prompt and
    p-tuning) returned the virtual positions too, so an exported NER model loaded as the export
    line says tagged each word with the tag of the position 20 before it, and labels or answer
    positions given to it were matched to the wrong positions. Given labels, the loss is
    transformers' own over those positions; a saved soft prompt loads back (PEFT, then the
    method's `install`, as the export line says) to the same outputs."""
    import torch.nn.functional as F
    from peft import PeftModel

    from toolkit import models
    from toolkit.methods import Context

    importlib.import_module("toolkit.tasks")
    from toolkit import heads

    if (family, head) not in _LOADED:  # shared with the test above: one load per family and head
        torch.manual_seed(0)
        _LOADED[family, head] = models.load(tiny_checkpoint(family), head, {"num_labels": 3} if "class" in head else {})
    base, tok = copy.deepcopy(_LOADED[family, head][0]), _LOADED[family, head][1]
    pristine = copy.deepcopy(base)
    ctx = Context(family, models.head_names(base), heads.get(head).peft_task_type, tok,
                  instruction="Tag the words:", total_steps=10)
    spec = METHODS.get(method)(**SMALL.get(method, {}))
    model = spec.apply(base, ctx).eval()
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    width = batch["input_ids"].shape[1]
    with torch.no_grad():
        out = model(**batch)
        keys = [k for k in ("logits", "start_logits", "end_logits") if out.get(k) is not None]
        assert keys and all(out[k].shape[1] == width for k in keys), {k: out[k].shape for k in keys}
        for i, text in enumerate(TEXTS):  # padded with a batch-mate = alone, at every real position
            alone = model(**tok([text], return_tensors="pt"))
            for k in keys:
                torch.testing.assert_close(out[k][i, :alone[k].shape[1]], alone[k][0], rtol=1e-5, atol=1e-5)
        if head == "token-classification":
            labels = torch.randint(0, 3, (len(TEXTS), width)).masked_fill(batch["attention_mask"] == 0, -100)
            want = F.cross_entropy(out.logits.reshape(-1, 3), labels.reshape(-1))
            got = model(**batch, labels=labels).loss
        else:
            start, end = torch.tensor([1, 0]), torch.tensor([2, 0])
            want = (F.cross_entropy(out.start_logits, start) + F.cross_entropy(out.end_logits, end)) / 2
            got = model(**batch, start_positions=start, end_positions=end).loss
        assert torch.allclose(got, want), (got, want)
        if not getattr(getattr(model, "active_peft_config", None), "is_prompt_learning", False):
            return
        model.save_pretrained(tmp_path)
        loaded = spec.loaded(PeftModel.from_pretrained(pristine, tmp_path)).eval()  # each export line's install
        again = loaded(**batch)
        assert all(torch.equal(again[k], out[k]) for k in keys)


SEGMENTED = [m for m in TRAINED if METHODS.get(m)(**SMALL.get(m, {})).incompatible("bert", _HeadTask("question-answering")) is None]


@pytest.mark.parametrize("method", SEGMENTED)
def test_segment_ids_reach_a_question_answering_model_under_every_method(tiny_checkpoint, tmp_path, method):
    """Finding: PeftModelForQuestionAnswering takes `token_type_ids` and passes them to no one, so
    BERT's extractive QA under LoRA, IA3, AdaLoRA, DoRA, prompt and p-tuning trained and scored
    with the context in the question's segment, and its export (plain transformers passes them)
    answered otherwise than `toolkit predict` (start logits 0.46 apart), exit 0. Under every method
    the question/context segments change the outputs, as they do the plain model's, and the saved
    result loads back (`Method.load`, what eval, predict and export use) to the same outputs."""
    from transformers import AutoModelForQuestionAnswering

    from toolkit import heads, models

    head = "question-answering"
    if ("bert", head) not in _LOADED:
        torch.manual_seed(0)
        _LOADED["bert", head] = models.load(tiny_checkpoint("bert"), head, {})
    pristine, tok = _LOADED["bert", head]
    spec = METHODS.get(method)(**SMALL.get(method, {}))
    ctx = Context("bert", models.head_names(pristine), heads.get(head).peft_task_type, tok, total_steps=10)
    model = spec.apply(copy.deepcopy(pristine), ctx).eval()
    with torch.no_grad():  # an adapter's last layer, a LoRA B, IA3's scales start as the identity
        for p in (p for p in model.parameters() if p.requires_grad):
            p.add_(torch.randn_like(p) * 0.1)
    batch = dict(tok(["where is it?", "who?"], TEXTS, padding=True, return_tensors="pt"))
    assert batch["token_type_ids"].any()
    unsegmented = {**batch, "token_type_ids": torch.zeros_like(batch["token_type_ids"])}
    with torch.no_grad():
        out, flat = model(**batch), model(**unsegmented)
        assert not torch.allclose(out.start_logits, flat.start_logits), "the segment ids changed nothing"
        spec.save(model, tmp_path)
        loaded = spec.load(tmp_path, lambda: copy.deepcopy(pristine),
                           lambda: AutoModelForQuestionAnswering.from_pretrained(tmp_path)).eval()
        again = loaded(**batch)
    torch.testing.assert_close(again.start_logits, out.start_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(again.end_logits, out.end_logits, rtol=0, atol=1e-5)


ENCODER_DECODER_QA = [(m, f) for m in TRAINED for f in ("bart", "t5")
                      if METHODS.get(m)(**SMALL.get(m, {})).incompatible(f, _HeadTask("question-answering"))
                      and m in ("prompt_tuning", "p_tuning", "prefix_tuning")]


def test_soft_prompts_on_encoder_decoder_qa_are_refused():
    assert sorted(ENCODER_DECODER_QA) == sorted((m, f) for m in ("p_tuning", "prefix_tuning", "prompt_tuning")
                                                for f in ("bart", "t5"))


@pytest.mark.parametrize("method, family", ENCODER_DECODER_QA)
def test_soft_prompts_on_encoder_decoder_qa_are_refused_at_validate_and_still_needed(
        tiny_checkpoint, cli, tmp_path, runs_dir, method, family):
    """Finding: extractive SQuAD (`task.mode: extractive`) on BART or T5 under prompt, p- or
    prefix tuning passed `toolkit validate` and stopped at the first batch with a ValueError
    traceback (BartForQuestionAnswering and T5ForQuestionAnswering make the decoder's input from
    input_ids, which PEFT's soft prompts replace by inputs_embeds; PEFT lays out a QA model's
    prefixes as one stack, and these run two). Now one line at validate and at run, nothing
    written; and the refusal is still needed with these library versions."""
    from conftest import write_recipe
    from toolkit import heads, models

    importlib.import_module("toolkit.tasks")
    spec = METHODS.get(method)(**SMALL.get(method, {}))
    reason = spec.incompatible(family, _HeadTask("question-answering"))
    assert "\n" not in reason
    recipe = write_recipe(tmp_path / "r.yaml", (
        f"model: {{checkpoint: {tiny_checkpoint(family)}}}\n"
        "task: {name: squad, mode: extractive, max_length: 64, doc_stride: 16, max_train_samples: 8, max_eval_samples: 8}\n"
        f"method: {{name: {method}, num_virtual_tokens: 4}}\ntrain: {{epochs: 1, batch_size: 4}}\n"))
    for command in (("validate", recipe), ("run", recipe, "--smoke", "--runs-dir", runs_dir)):
        code, _, err = cli(*command)
        assert code == 2 and reason in err, err
    assert not runs_dir.exists()
    head = "question-answering"
    if (family, head) not in _LOADED:
        torch.manual_seed(0)
        _LOADED[family, head] = models.load(tiny_checkpoint(family), head, {})
    model, tok = copy.deepcopy(_LOADED[family, head][0]), _LOADED[family, head][1]
    ctx = Context(family, models.head_names(model), heads.get(head).peft_task_type, tok, total_steps=10)
    with pytest.raises(ValueError):
        spec.apply(model, ctx)(**dict(tok(TEXTS, padding=True, return_tensors="pt")))


@pytest.mark.parametrize("method", TRAINED)
def test_a_warm_started_encoder_decoder_runs_or_is_refused_in_one_line(method):
    """model.warm_start: encoder-decoder (MiniLM2MiniLM, an EncoderDecoderModel) under every method
    (the weight methods with the target names the composite needs): what `incompatible` lets
    through applies and trains, the decoder's new cross-attention and LM-head transform included
    (under lora, ia3 and bitfit they stayed frozen at their random start, exit 0); what it refuses
    is one line, and the soft-prompt refusal is still needed (prompt, p- and prefix tuning raised
    PEFT's ValueError "Please specify `num_layers`" after the model and data had loaded: a
    traceback mid-run)."""
    from conftest import MINILM
    from toolkit import models
    from toolkit.methods import count_params
    from toolkit.methods.prompt_tuning import COMPOSITE, composite_refusal

    targets = {"target_modules": ["query", "value"]}  # PEFT has no defaults for the composite
    settings = {**SMALL.get(method, {}), **({**targets, "feedforward_modules": []} if method == "ia3" else
                                           targets if method in ("lora", "dora", "adalora") else {})}
    spec = METHODS.get(method)(**settings)
    reason = spec.incompatible(COMPOSITE, _LMTask())
    if reason is not None and "\n" in reason:
        pytest.fail(f"a refusal of more than one line: {reason!r}")
    if COMPOSITE not in _PRISTINE:
        torch.manual_seed(0)
        _PRISTINE[COMPOSITE] = models.load(models.smoke_checkpoint(MINILM), "seq2seq-lm", {}, warm_start=COMPOSITE)
    model, tok = copy.deepcopy(_PRISTINE[COMPOSITE][0]), _PRISTINE[COMPOSITE][1]
    ctx = Context(COMPOSITE, models.head_names(model), "SEQ_2_SEQ_LM", tok, instruction="Summarize:", total_steps=10)
    if reason == composite_refusal(method, _LMTask()):
        with pytest.raises(ValueError, match="Please specify `(num_layers|token_dim)`"):  # prefix: given its layers
            spec.apply(model, ctx)
        return
    if reason is not None:
        return
    model = spec.apply(model, ctx)
    assert count_params(model)[0] > 0
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    model(**batch, decoder_input_ids=batch["input_ids"][:, :3]).logits.float().pow(2).mean().backward()
    # every trainable parameter gets a gradient: the encoder's BERT pooler, which transformers'
    # warm start built and no decoder reads, counted as trainable and never trained (dropped now)
    idle = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert idle == []
    # the decoder's cross-attention and LM-head transform start random (the checkpoint has none):
    # they train under every method (under lora they stayed frozen at their random start)
    new = [n for n, p in model.named_parameters() if ("crossattention" in n or "predictions.transform" in n)
           and "original_module" not in n]
    frozen = [n for n in new if not dict(model.named_parameters())[n].requires_grad]
    assert new and frozen == []


def test_a_warm_started_encoder_decoder_has_no_unread_pooler(tmp_path):
    """transformers' warm start builds the encoder as a whole BertModel, pooler included, which no
    decoder reads: the toolkit drops it, so the trainable count is what trains; a folder saved
    with a pooler (by transformers, or by the toolkit before) loads to the same model without it."""
    from transformers import EncoderDecoderModel

    from conftest import MINILM
    from toolkit import models
    from toolkit.methods.prompt_tuning import COMPOSITE

    base = models.smoke_checkpoint(MINILM)
    with_pooler = EncoderDecoderModel.from_encoder_decoder_pretrained(base, base)
    assert with_pooler.encoder.pooler is not None  # what transformers builds
    with_pooler.save_pretrained(tmp_path)
    torch.manual_seed(0)
    warm, tok = models.load(base, "seq2seq-lm", {}, warm_start=COMPOSITE)
    tok.save_pretrained(tmp_path)  # a saved model with its tokenizer (without it: refused, no vocabulary)
    reloaded, _ = models.load(str(tmp_path), "seq2seq-lm", {})
    for model in (warm, reloaded):
        assert model.encoder.pooler is None and not any(".pooler." in n for n, _ in model.named_parameters())
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    with torch.no_grad():
        kept = with_pooler(**batch, decoder_input_ids=batch["input_ids"][:, :3]).logits
        dropped = reloaded.eval()(**batch, decoder_input_ids=batch["input_ids"][:, :3]).logits
    assert torch.equal(kept, dropped)


# --- merging: every method whose deltas merge, on every family's classifier ----------------------
CLASSIFIERS = ["bert", "roberta", "gpt2", "bart", "t5"]


@pytest.mark.parametrize("family", CLASSIFIERS)
@pytest.mark.parametrize("method", TRAINED)
def test_merged_export_is_plain_transformers_with_the_trained_head(tiny_checkpoint, tmp_path, method, family):
    """What `export --merge` writes for a method whose result is PEFT weight deltas (the others are
    refused there, or save a whole model): a folder plain AutoModelForSequenceClassification loads
    to the same logits, trained head included. Finding: IA3's merge was an AttributeError on
    RoBERTa, BART and T5, whose classifier heads are several layers (PEFT read `.weight` off the
    head's modules_to_save wrapper)."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from toolkit import models
    from toolkit.methods import keep_label_maps, merged

    spec = METHODS.get(method)(**SMALL.get(method, {}))
    if spec.incompatible(family, _HeadTask("sequence-classification")) is not None:
        return
    if (family, "classifier") not in _LOADED:
        torch.manual_seed(0)
        _LOADED[family, "classifier"] = models.load(tiny_checkpoint(family), "sequence-classification", {"num_labels": 2})
    model, tok = copy.deepcopy(_LOADED[family, "classifier"][0]), _LOADED[family, "classifier"][1]
    ctx = Context(family, models.head_names(model), "SEQ_CLS", tok, total_steps=10)
    model = spec.apply(model, ctx)
    config = getattr(model, "peft_config", {}).get("default")
    if config is None or config.is_prompt_learning:
        return  # saved whole, or virtual tokens: export --merge is refused (test_after_runs)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    with torch.no_grad():
        want = model.eval()(**batch).logits
        plain = merged(model)
        assert not isinstance(plain, PeftModel)
        torch.testing.assert_close(plain(**batch).logits, want, rtol=1e-4, atol=1e-4)
        plain.save_pretrained(tmp_path)
        keep_label_maps(plain.config, tmp_path)  # as every save of the toolkit does
        again = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
        torch.testing.assert_close(again(**batch).logits, want, rtol=1e-4, atol=1e-4)


# an LM whose output layer is tied to its input embeddings, and a target list naming that layer
TIED = {"gpt2": ("causal-lm", "CAUSAL_LM", ["c_attn", "lm_head"]),
        "bart": ("seq2seq-lm", "SEQ_2_SEQ_LM", ["q_proj", "lm_head"]),
        "t5": ("seq2seq-lm", "SEQ_2_SEQ_LM", ["q", "lm_head"]),
        "bert": ("masked-lm", "", ["query", "decoder"])}
TARGETED = [m for m in TRAINED if "target_modules" in METHODS.get(m).__dataclass_fields__]


@pytest.mark.parametrize("family", sorted(TIED))
@pytest.mark.parametrize("method", TARGETED)
def test_merging_a_layer_tied_to_the_embeddings_is_refused(tiny_checkpoint, method, family):
    """Finding: a target list naming an LM head tied to the input embeddings (GPT-2's, BART's and
    T5's `lm_head`, BERT's MLM `decoder`) trains as asked unmerged, but merging wrote the delta into
    the one shared tensor, the embeddings too: the merged GPT-2 was 80 logits away from the model
    it trained, exit 0. `export --merge` and `method.merge` (before training) now refuse it in one
    line; with the tied layer left out the same list merges to the same logits."""
    from toolkit import models
    from toolkit.errors import UserError
    from toolkit.methods import merged

    head, peft_type, targets = TIED[family]
    if (family, head) not in _LOADED:
        _LOADED[family, head] = models.load(tiny_checkpoint(family), head, {})
    base, tok = _LOADED[family, head]
    ctx = Context(family, models.head_names(base), peft_type, tok, total_steps=10)
    settings = {**SMALL.get(method, {}), **({"feedforward_modules": []} if method == "ia3" else {})}
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    if family in ("bart", "t5"):
        batch["decoder_input_ids"] = batch["input_ids"][:, :3]
    for names, tied in ((targets, True), (targets[:1], False)):
        torch.manual_seed(0)
        model = METHODS.get(method)(target_modules=names, **settings).apply(copy.deepcopy(base), ctx).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 0.3)
            want = model(**batch).logits
            if not tied:
                torch.testing.assert_close(merged(model)(**batch).logits, want, rtol=1e-4, atol=1e-4)
                continue
            with pytest.raises(UserError, match=rf"^--merge: the adapted layer \S*{names[-1]} shares its weight"):
                merged(model)
        if "merge" in METHODS.get(method).__dataclass_fields__:
            with pytest.raises(UserError, match=r"^method\.merge: .*tied.*leave \w+ out of method\.target_modules$"):
                METHODS.get(method)(target_modules=names, merge=True, **settings).apply(copy.deepcopy(base), ctx)


@pytest.mark.parametrize("family", ["t5", "bart"])
@pytest.mark.parametrize("method", ["lora", "dora"])  # AdaLoRA and IA3 take no embedding layer (one line already)
def test_a_targeted_layer_that_never_runs_is_refused(tiny_checkpoint, method, family):
    """Finding: T5's and BART's `shared` embedding is read through the encoder's and decoder's
    `embed_tokens` (the same weight, other modules): LoRA on `shared` got no gradient and trained
    nothing, its parameters counted as trainable, exit 0. A targeted layer that the model's forward
    never calls is one line naming the layers that do read the weight; targeting those applies."""
    from toolkit import models
    from toolkit.errors import UserError

    head = "seq2seq-lm"
    if (family, head) not in _LOADED:
        _LOADED[family, head] = models.load(tiny_checkpoint(family), head, {})
    base, tok = _LOADED[family, head]
    ctx = Context(family, models.head_names(base), "SEQ_2_SEQ_LM", tok, total_steps=10)
    settings = SMALL.get(method, {})
    with pytest.raises(UserError, match=r"^method\.target_modules: \S*shared never runs in this model's forward.*"
                                        r"through \S*decoder\.embed_tokens, \S*encoder\.embed_tokens: target those"):
        METHODS.get(method)(target_modules=["shared"], **settings).apply(copy.deepcopy(base), ctx)
    METHODS.get(method)(target_modules=["embed_tokens"], **settings).apply(copy.deepcopy(base), ctx)


# every embedding each family's forward looks up at its input (accepted), and BART's learned
# position table, read at positions counted from the input's shape (refused)
LOOKUPS = {"bert": ["word_embeddings", "position_embeddings", "token_type_embeddings"], "roberta": ["position_embeddings"],
           "gpt2": ["wte", "wpe"], "bart": ["embed_tokens"], "t5": ["embed_tokens", "relative_attention_bias"]}


@pytest.mark.parametrize("family", sorted(LOOKUPS))
@pytest.mark.parametrize("method", ["lora", "dora"])  # AdaLoRA and IA3 take no embedding layer (one line already)
def test_an_embedding_that_does_not_look_up_its_input_is_refused(tiny_checkpoint, method, family):
    """Finding: PEFT's embedding adapter adds the rows of the input its layer is given. BART's
    `embed_positions` is given the encoder's embeddings (for their shape) or the decoder's token
    ids, and reads the rows of their positions: LoRA or DoRA there stopped at the first batch with
    a traceback (the encoder's), or read its rows at the token ids (the decoder's). One line as
    the method is applied, on the classifier and the seq2seq LM; every embedding that is looked up
    at its input (each family's) is still adapted."""
    from toolkit import models
    from toolkit.errors import UserError

    heads = {"bert": "masked-lm", "roberta": "masked-lm", "gpt2": "causal-lm"}
    for head in ("sequence-classification", heads.get(family, "seq2seq-lm")):
        if (family, head) not in _LOADED:
            _LOADED[family, head] = models.load(tiny_checkpoint(family), head, {"num_labels": 2} if head.startswith("seq") else {})
        base, tok = _LOADED[family, head]
        task_type = {"sequence-classification": "SEQ_CLS", "seq2seq-lm": "SEQ_2_SEQ_LM", "causal-lm": "CAUSAL_LM"}.get(head, "")
        ctx = Context(family, models.head_names(base), task_type, tok, total_steps=10)
        # r 2: BERT's token types and T5's relative_attention_bias (2 heads here) are 2 wide (check_ranks)
        METHODS.get(method)(target_modules=LOOKUPS[family], r=2).apply(copy.deepcopy(base), ctx)
        if family != "bart":
            continue
        for names, said in ((["embed_positions"], "model.encoder.embed_positions"),
                            (["decoder.embed_positions"], "model.decoder.embed_positions")):
            with pytest.raises(UserError, match=rf"^method\.target_modules: {said} does not look up its input .*leave it "
                                                r"out of the list$"):
                METHODS.get(method)(target_modules=names, **SMALL.get(method, {})).apply(copy.deepcopy(base), ctx)


_FROM_MLM: dict[str, tuple[torch.nn.Module, object, str]] = {}


@pytest.mark.parametrize("method", TRAINED)
def test_weights_the_checkpoint_lacks_train_under_every_method(tiny_checkpoint, tmp_path_factory, method):
    """Finding: a BERT classifier loaded from a masked LM (every `model.checkpoint: {run: ...}`
    chained from mlm; a masked-LM folder saves no pooler) has a new, random pooler between the
    body and the classifier, and every method but full left it frozen at its random start (bitfit
    trained its bias only): LoRA, IA3, the prompt methods, adapters and freeze fine-tuned through
    a random tanh layer, exit 0. Under every method it now trains with the head, gets a gradient,
    is saved, and loads back (`Method.load`, what eval, predict and export use) as trained."""
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

    from toolkit import models

    if "bert" not in _FROM_MLM:
        folder = tmp_path_factory.mktemp("mlm")
        AutoModelForMaskedLM.from_pretrained(tiny_checkpoint("bert")).save_pretrained(folder)  # as a run saves it
        models.load_tokenizer(tiny_checkpoint("bert")).save_pretrained(folder)
        torch.manual_seed(0)
        model, tok = models.load(str(folder), "sequence-classification", {"num_labels": 2})
        _FROM_MLM["bert"] = model, tok, str(folder)
    pristine, tok, folder = _FROM_MLM["bert"]
    assert "bert.pooler" in models.head_names(pristine)
    spec = METHODS.get(method)(**SMALL.get(method, {}))
    ctx = Context("bert", models.head_names(pristine), "SEQ_CLS", tok, instruction="Classify:", total_steps=10)
    model = spec.apply(copy.deepcopy(pristine), ctx).train()
    pooler = {n: p for n, p in model.named_parameters() if ".pooler." in n and "original_module" not in n}
    assert pooler and all(p.requires_grad for p in pooler.values()), sorted(pooler)
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    model(**batch).logits.pow(2).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in pooler.values())
    with torch.no_grad():
        for p in pooler.values():
            p.add_(torch.randn_like(p))
    model.eval()
    with torch.no_grad():
        want = model(**batch).logits
    out = tmp_path_factory.mktemp("saved")
    spec.save(model, out)
    loaded = spec.load(out, lambda: copy.deepcopy(pristine),
                       lambda: AutoModelForSequenceClassification.from_pretrained(out)).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, want, rtol=0, atol=1e-5)


OVERSIZED = [("lora", "r: 33", "method.r: 33"), ("dora", "r: 64", "method.r: 64"),
             ("adalora", "init_r: 40, target_r: 8", "method.init_r: 40"),
             ("adapters", "bottleneck_size: 33", "method.bottleneck_size: 33"),
             ("adapters", "reduction_factor: 64", "method.reduction_factor: 64")]


@pytest.mark.parametrize("entry", ["cli validate", "api run"])
@pytest.mark.parametrize("method, settings, said", OVERSIZED)
def test_a_size_above_the_models_width_is_one_line_at_validate(tiny_checkpoint, tmp_path, cli, monkeypatch, capsys,
                                                               entry, method, settings, said):
    """Finding: LoRA's and DoRA's r, AdaLoRA's init_r and a bottleneck's size or reduction factor
    were not bounded by the model: r 64 on a width-32 model trained (an update of rank 32 at most,
    with twice its parameters), a reduction factor above the width sized every adapter 1, exit
    0. A size above the checkpoint's width is one line at validate naming the setting, the width
    and the limit; a run stops there, no weights read."""
    import toolkit
    from conftest import write_recipe
    from toolkit import models
    from toolkit.errors import UserError

    path = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {tiny_checkpoint('bert')}}}\n"
                        "task: {name: glue, subset: sst2, max_length: 32}\n"
                        f"method: {{name: {method}, {settings}}}\n")
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("the weights were loaded"))
    capsys.readouterr()  # the small model's build, said once a session
    if entry == "cli validate":
        code, _, err = cli("validate", path)
        assert code == 2 and err.count("\n") == 1, err
        line = err
    else:
        with pytest.raises(UserError) as raised:
            toolkit.run(path, runs_dir=tmp_path / "runs")
        line = str(raised.value)
    assert f"{said} is more than the width of " in line and "(32), the most a layer it adapts allows; " \
        "use at most 32" in line, line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json"))


@pytest.mark.parametrize("method, settings", [("lora", {"r": 20}), ("dora", {"r": 20}),
                                              ("adalora", {"init_r": 20, "target_r": 8})])
def test_a_rank_is_bounded_by_the_narrowest_layer_it_adapts(method, settings):
    """Past validate's bound (the hidden width, 32), the rank is bounded by each adapted layer's
    smaller side: a grouped-query key projection 16 wide takes r 16 and refuses r 20 in one line
    naming it; a --smoke model (`Context.sized` False) is no yardstick and is not asked."""
    import transformers

    from toolkit.errors import UserError

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    targets = {"target_modules": ["q_proj", "k_proj"]}
    ctx = Context("llama", [], "CAUSAL_LM", None, total_steps=10)
    with pytest.raises(UserError, match=rf"method.{next(iter(settings))}: 20 is more than the smaller side of layer "
                                        r"model.layers.0.self_attn.k_proj \(16\), .*use at most 16"):
        METHODS.get(method)(**settings, **targets).apply(transformers.LlamaForCausalLM(config), ctx)
    fitting = {k: min(v, 16) for k, v in settings.items()}
    METHODS.get(method)(**fitting, **targets).apply(transformers.LlamaForCausalLM(config), ctx)
    ctx.sized = False
    METHODS.get(method)(**settings, **targets).apply(transformers.LlamaForCausalLM(config), ctx)


PATTERNED = sorted(n for n in METHODS.names() if "rank_pattern" in {f.name for f in dataclasses.fields(METHODS.get(n))})


# family -> (target_modules with a 2-wide table among them, that table's name, a query projection's
# name and the end of layer 1's): BERT's token types, T5's relative_attention_bias (2 heads here)
NARROW = {"bert": (["query", "value", "token_type_embeddings"], "token_type_embeddings", "query",
                   "layer.1.attention.self.query"),
          "t5": (["q", "v", "relative_attention_bias"], "relative_attention_bias", "q", "block.1.layer.0.SelfAttention.q")}


@pytest.mark.parametrize("family", sorted(NARROW))
@pytest.mark.parametrize("method", PATTERNED)
def test_rank_pattern_sizes_each_layer_by_its_own_rank(tiny_checkpoint, tmp_path, method, family):
    """Finding: a LoRA rank above a targeted small table's side (BERT's 2-row token-type
    embeddings, T5's relative position bias with few heads) was refused, and PEFT's per-layer
    `rank_pattern` / `alpha_pattern` were not settings, so such a layer had to be left out or r
    lowered everywhere. They are recipe fields now, and the width check bounds each layer by its
    own rank: the table takes r 2 beside r 8 elsewhere, a pattern rank above its layer's side is
    one line naming the pattern's key, a key that names no adapted layer (PEFT ignored it with a
    warning: other ranks than the recipe's, exit 0) or a layer two keys name (the first written
    won) is one line (a --smoke model, 2 layers deep, is not asked whether a key names a layer).
    The adapter saves and loads back with its ranks and scales (the same logits)."""
    import re

    from toolkit import models
    from toolkit.errors import UserError

    if (family, "sequence-classification") not in _LOADED:
        _LOADED[family, "sequence-classification"] = models.load(tiny_checkpoint(family), "sequence-classification",
                                                                 {"num_labels": 2})
    base, tok = _LOADED[family, "sequence-classification"]
    ctx = Context(family, models.head_names(base), "SEQ_CLS", tok, total_steps=10)
    targets, table, query, deep = NARROW[family]
    spec = METHODS.get(method)
    with pytest.raises(UserError, match=rf"^method\.r: 8 is more than the smaller side of layer \S*\.{table} \(2\).*"
                                        r"use at most 2$"):
        spec(r=8, target_modules=targets).apply(copy.deepcopy(base), ctx)
    with pytest.raises(UserError, match=rf"^method\.rank_pattern\.{table}: 4 is more than the smaller side of layer "
                                        rf"\S*\.{table} \(2\).*use at most 2$"):
        spec(r=8, target_modules=targets, rank_pattern={table: 4}).apply(copy.deepcopy(base), ctx)
    for setting in ("rank_pattern", "alpha_pattern"):
        with pytest.raises(UserError, match=rf"^method\.{setting}: key 'nowhere' names no layer the method adapts \(the "
                                            rf"adapted layers end in: {', '.join(sorted(targets))}\)"):
            spec(r=2, target_modules=targets, **{setting: {"nowhere": 2}}).apply(copy.deepcopy(base), ctx)
        with pytest.raises(UserError, match=rf"^method\.{setting}: keys '{query}' and '{re.escape(deep)}' both name "
                                            rf"layer \S*{re.escape(deep)}; give each layer one key"):
            spec(r=2, target_modules=targets, **{setting: {query: 1, deep: 2}}).apply(copy.deepcopy(base), ctx)
    smoke = Context(family, ctx.head_names, "SEQ_CLS", tok, total_steps=10, sized=False)  # 2 layers: no yardstick
    spec(r=2, target_modules=targets, rank_pattern={deep.replace("1", "11", 1): 1}).apply(copy.deepcopy(base), smoke)
    settings = spec(r=8, alpha=16, target_modules=targets, rank_pattern={table: 2}, alpha_pattern={deep: 4})
    model = settings.apply(copy.deepcopy(base), ctx)
    ranks = {n.removeprefix("base_model.model."): (m.r["default"], m.scaling["default"])
             for n, m in model.named_modules() if isinstance(getattr(m, "r", None), dict)}
    assert {v for k, v in ranks.items() if k.endswith(table)} == {(2, 8.0)}, ranks
    assert {v for k, v in ranks.items() if k.endswith(deep)} == {(8, 0.5)}, ranks
    rest = {v for k, v in ranks.items() if not k.endswith(table) and not k.endswith(deep)}
    assert rest == {(8, 2.0)}, ranks
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    if "token_type_ids" in batch:
        batch["token_type_ids"] = torch.ones_like(batch["input_ids"])  # the adapted table's second row read
    with torch.no_grad():
        want = model(**batch).logits
    settings.save(model, tmp_path)
    loaded = settings.load(tmp_path, lambda: copy.deepcopy(base), lambda: pytest.fail("not a whole model")).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", PATTERNED)
@pytest.mark.parametrize("setting, said", [("rank_pattern: {'query(': 2}", "method.rank_pattern: key 'query(' is not a "
                                            "regular expression PEFT can read"),
                                           ("rank_pattern: {query: 0}", "method.rank_pattern.query: 0 is below the minimum 1"),
                                           ("alpha_pattern: {query: two}", "method.alpha_pattern.query: expected int"),
                                           ("alpha_pattern: [query]", "method.alpha_pattern: expected a mapping"),
                                           ("rank_pattern: {query: 33}", "method.rank_pattern.query: 33 is more than the "
                                            "width of ")])
def test_a_wrong_rank_or_alpha_pattern_is_one_line_at_validate(tiny_checkpoint, tmp_path, cli, monkeypatch, capsys,
                                                               method, setting, said):
    """rank_pattern / alpha_pattern are checked at validate as every setting is: a key PEFT would
    stop on (a regular expression that does not compile: a traceback after loading), a rank or
    alpha that is no positive integer, a rank above the checkpoint's width: one line, exit 2, no
    weights read. Empty (the default) they leave the run id as it was before they existed."""
    from conftest import write_recipe
    from toolkit import models
    from toolkit import recipe as recipes

    head = (f"model: {{checkpoint: {tiny_checkpoint('bert')}}}\ntask: {{name: glue, subset: sst2, max_length: 32}}\n"
            f"method: {{name: {method}, r: 4")
    path = write_recipe(tmp_path / "r.yaml", f"{head}, {setting}}}\n")
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("the weights were loaded"))
    capsys.readouterr()
    code, _, err = cli("validate", path)
    assert code == 2 and err.count("\n") == 1 and said in err, err
    plain = recipes.load(write_recipe(tmp_path / "p.yaml", f"{head}}}\n"))
    empty = recipes.load(write_recipe(tmp_path / "e.yaml", f"{head}, rank_pattern: {{}}, alpha_pattern: {{}}}}\n"))
    assert empty.hash == plain.hash
    assert recipes.load(write_recipe(tmp_path / "s.yaml", f"{head}, rank_pattern: {{query: 2}}}}\n")).hash != plain.hash
