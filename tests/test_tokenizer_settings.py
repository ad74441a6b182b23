"""A score never depends on settings a checkpoint's tokenizer happens to be saved with: the
padding and truncation sides, its model_max_length, its pad token, the clean-up of decoded text.
Every task is held to it: the same weights score the same with a tokenizer saved with the unusual
setting as with the default, at every eval batch size (batches pad as the family needs; texts are
cut where the task documents it). A setting with no right answer (a lower-case vocabulary read
without lower-casing, no pad token) is one line naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

# (recipe, family of its small model, overrides): a regression head on an encoder with learnt
# absolute positions (BERT) and on a decoder (GPT-2 reads the last real token), tags per
# sub-token, extractive QA windows (which side the question goes), generation by an
# encoder-decoder (its sources cut at task.max_length) and by a decoder, the generic classifier
CASES = {
    "glue-bert": ("glue/stsb/bert-base-uncased-full", "bert", ["task.max_length=12"]),
    "glue-gpt2": ("glue/stsb/gpt2-full", "gpt2", ["task.max_length=12"]),
    "text_classification-bert": ("demo/own-data/minilm-full", "bert", ["task.max_length=10"]),
    "ner-bert": ("ner/conll2003/minilm-full", "bert", ["task.max_length=10"]),
    "squad-bert": ("squad/v1.1/minilm-full", "bert", ["task.max_length=48", "task.doc_stride=16"]),
    "summarization-bart": ("summarization/samsum/bart-base-full", "bart",
                           ["task.max_length=16", "task.generation.max_new_tokens=4"]),
    "summarization-gpt2": ("summarization/samsum/gpt2-full", "gpt2",
                           ["task.max_length=16", "task.generation.max_new_tokens=4"]),
    "translation-t5": ("translation/multi30k/t5-base-full", "t5",
                       ["task.max_length=10", "task.max_target_length=8", "task.generation.max_new_tokens=4"]),
    # pretraining objectives pack blocks of their own (a small text file of their own: WikiText-2
    # takes seconds to pack); the last block is shorter, so batches do pad
    "clm-gpt2": ("pretrain/wikitext-2/gpt2-clm", "gpt2", ["task.max_length=48", "task.eval_stride=24"]),
    "mlm-roberta": ("pretrain/wikitext-2/roberta-base-mlm", "roberta", ["task.max_length=48"]),
    "denoise-bart": ("pretrain/wikitext-2/bart-base-denoise", "bart", ["task.max_length=48"]),
    "span_corruption-t5": ("pretrain/wikitext-2/t5-base-span_corruption", "t5", ["task.max_length=48"]),
}
ODD = {"padding_side": "left", "truncation_side": "left"}


def _with_tokenizer(source: str, folder: Path, **settings) -> str:
    """A copy of the checkpoint folder whose tokenizer_config.json holds `settings`."""
    shutil.copytree(source, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, **settings}))
    return str(folder)


def test_every_task_is_held_to_it() -> None:
    from toolkit.tasks import TASKS

    assert {case.split("-")[0] for case in CASES} == set(TASKS.names())


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex many bold jocks".split()
    path = tmp_path_factory.mktemp("text") / "docs.txt"
    path.write_text("".join(" ".join(words[(i + j) % len(words)] for j in range(9 + i % 7)) + " .\n" for i in range(40)))
    return path


def _scores(recipe: str, checkpoint: str, overrides: list[str], sizes: tuple[int, ...], weights=None):
    from accelerate import Accelerator
    from test_evaluation import _distinct

    from toolkit import evaluation, recipe as recipes
    from toolkit.batching import eval_loaders
    from toolkit.setup import build

    plan = recipes.plan(f"recipes/{recipe}.yaml", [f"model.checkpoint={checkpoint}", "task.max_eval_samples=6",
                                                   "task.max_train_samples=2", "train.warmup_ratio=0", *overrides])
    setup = build(plan)
    if weights is None:
        _distinct(setup.model)
    else:
        setup.model.load_state_dict(weights)
    out = []
    for size in sizes:
        plan.recipe.train.eval_batch_size = size
        loaders, orders = eval_loaders(plan.recipe, setup)
        sink: dict = {}
        scores = evaluation.evaluate(setup.model, loaders, setup.task, Accelerator(cpu=True), setup.raw_evals,
                                     sink=sink, orders=orders)
        out.append((scores, [row.get("prediction") for row in sink.get("", [])]))
    return setup, out


@pytest.mark.parametrize("case", sorted(CASES))
def test_scores_do_not_depend_on_the_tokenizers_saved_sides(case: str, tiny_checkpoint, tmp_path: Path,
                                                            text_file: Path, conll_sample, squad_sample) -> None:
    """Finding: STS-B on a tiny BERT whose tokenizer was saved with `padding_side: left` scored
    Pearson -0.26, 0.03 and -0.04 at eval batch 1, 3 and 6 on the same weights, exit 0: transformers'
    collators pad on the tokenizer's side and BERT's absolute positions moved with each batch's
    padding; a tokenizer saved with `truncation_side: left` kept the end of every text where the
    task documents its start kept; QA put the context before the question. Every tokenizer the
    toolkit loads pads and cuts on the right (a decoder's generation prompts are left-padded by the
    task itself), whatever the checkpoint says, and the run's exported tokenizer says so."""
    recipe, family, overrides = CASES[case]
    if recipe.startswith("pretrain/"):
        overrides = [*overrides, f"task.train_file={text_file}", f"task.eval_file={text_file}"]
    if recipe.startswith("ner/"):  # CoNLL-2003's first sentences, not its whole train file twice
        overrides = [*overrides, f"task.train_file={conll_sample[0]}", f"task.eval_file={conll_sample[1]}"]
    if recipe.startswith("squad/"):  # the dev file's first articles, split by article as the recipe splits it
        overrides = [*overrides, f"task.eval_file={squad_sample}"]
    base = tiny_checkpoint(family)
    plain = _with_tokenizer(base, tmp_path / "plain")
    odd = _with_tokenizer(base, tmp_path / "odd", **ODD)
    setup, ((scores, texts),) = _scores(recipe, plain, overrides, (3,))
    weights = setup.model.state_dict()
    odd_setup, seen = _scores(recipe, odd, overrides, (1, 6), weights)
    assert "loss" in scores
    for other_scores, other_texts in seen:
        assert other_scores == pytest.approx(scores, rel=1e-5, nan_ok=True)
        assert other_texts == texts
    tok = odd_setup.tokenizer
    assert (tok.padding_side, tok.truncation_side) == ("right", "right")
    tok.save_pretrained(tmp_path / "export")  # what a run's export writes beside the model
    saved = json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())
    assert (saved.get("padding_side", "right"), saved.get("truncation_side", "right")) == ("right", "right")


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_in_context_scores_do_not_depend_on_the_tokenizers_saved_sides(family: str, tiny_checkpoint,
                                                                       tmp_path: Path) -> None:
    """In-context prompting pads and cuts its prompts itself (from the left, as
    lm-evaluation-harness does), on ids: the tokenizer's saved sides change nothing."""
    from accelerate import Accelerator
    from test_evaluation import _distinct

    from toolkit import recipe as recipes
    from toolkit.setup import build

    base = tiny_checkpoint(family)
    seen = []
    for name, settings in (("plain", {}), ("odd", ODD)):
        folder = _with_tokenizer(base, tmp_path / name, **settings)
        for size in (1, 6):
            plan = recipes.plan(f"recipes/glue/sst2/{family if family == 'gpt2' else 't5-base'}-icl-4shot.yaml",
                                [f"model.checkpoint={folder}", "task.max_eval_samples=4",
                                 "method.max_length=40", f"method.batch_size={size}"])
            setup = build(plan)
            _distinct(setup.model)
            seen.append(plan.recipe.method.evaluate(setup.model, setup, Accelerator(cpu=True)))
    assert all(s == pytest.approx(seen[0], rel=1e-5, nan_ok=True) for s in seen[1:])


# settings that must change nothing: a limit above the model's positions or transformers'
# "no limit" placeholder, the pad token as the unknown one (RoBERTa computes its positions from
# the pad id), the clean-up of decoded text (BLEU and ROUGE read the generated text)
SAME = {
    "model_max_length-larger": ("glue/stsb/bert-base-uncased-full", "bert", {"model_max_length": 4096}),
    "model_max_length-placeholder": ("glue/stsb/bert-base-uncased-full", "bert",
                                     {"model_max_length": 1000000000000000019884624838656}),
    "pad-is-unk-roberta": ("glue/stsb/roberta-base-full", "roberta", {"pad_token": "<unk>"}),
    "pad-is-eos-gpt2": ("glue/stsb/gpt2-full", "gpt2", {"pad_token": "<|endoftext|>"}),
    # the inputs the tokenizer gives: BERT's token types (a pair's two sentences), the mask
    "model_input_names-no-types": ("glue/stsb/bert-base-uncased-full", "bert",
                                   {"model_input_names": ["input_ids", "attention_mask"]}),
    "model_input_names-no-mask": ("glue/stsb/bert-base-uncased-full", "bert",
                                  {"model_input_names": ["input_ids", "token_type_ids"]}),
    # byte-level BPE's offsets with the space before a word (the answer span's characters)
    "trim_offsets-squad-roberta": ("squad/v1.1/roberta-base-full", "roberta", {"trim_offsets": False}),
    "clean_up-t5": ("translation/multi30k/t5-base-full", "t5", {"clean_up_tokenization_spaces": True}),
}


@pytest.mark.parametrize("case", sorted(SAME))
def test_scores_do_not_depend_on_other_saved_settings(case: str, tiny_checkpoint, tmp_path: Path, squad_sample) -> None:
    recipe, family, settings = SAME[case]
    base = tiny_checkpoint(family)
    overrides = ["task.max_length=12", "task.generation.max_new_tokens=6"] if "clean" in case \
        else ["task.max_length=48"] + (["task.doc_stride=16"] if "squad" in case else [])  # some pairs shorter: batches pad
    if "squad" in case:  # the dev file's first articles, split by article as the recipe splits it
        overrides.append(f"task.eval_file={squad_sample}")
    setup, ((scores, texts),) = _scores(recipe, _with_tokenizer(base, tmp_path / "plain"), overrides, (3,))
    _, seen = _scores(recipe, _with_tokenizer(base, tmp_path / "odd", **settings), overrides, (1, 6),
                      setup.model.state_dict())
    for other_scores, other_texts in seen:
        assert other_scores == pytest.approx(scores, rel=1e-5, nan_ok=True)
        assert other_texts == texts


def test_decoded_text_does_not_depend_on_the_saved_clean_up(tmp_path: Path) -> None:
    """Generated text is decoded with the clean-up its tokenizer's decoding needs (WordPiece's
    spaces around punctuation undone, SentencePiece's and BPE's text kept as written), and a
    stop string is looked for in the text so decoded: never by the saved setting."""
    import torch

    from toolkit import models
    from toolkit.tasks._generation import decode_texts, stop_at

    text = ["it 's here . Bonjour !", "don't , stop ."]
    for name in ("bert-base-uncased", "t5", "gpt2"):
        base = str(models.tokenizer_dir() / name)
        seen = []
        for value in (True, False):
            tok = models.load_tokenizer(_with_tokenizer(base, tmp_path / f"{name}-{value}",
                                                        clean_up_tokenization_spaces=value))
            rows = [torch.tensor(t) for t in tok(text, add_special_tokens=False)["input_ids"]]
            ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=tok.pad_token_id)
            stops = stop_at(tok, ["'s"], 0)(ids, None).tolist()
            seen.append((decode_texts(tok, ids), stops))
        assert seen[0] == seen[1], name


# settings with no right answer here: one line naming the setting, before any model is built
REFUSED = {
    "do_lower_case": ({"do_lower_case": False}, r"saved with do_lower_case: False.*'Paris' reads as \[UNK\]"),
    "strip_accents": ({"strip_accents": False}, r"saved with strip_accents: False.*'Café' reads as \[UNK\]"),
    "no-pad": ({"pad_token": None}, r"has no pad token and no end-of-text token to pad with"),
    "model_max_length-smaller": ({"model_max_length": 16},
                                 r"task.max_length: 128 is more than the 16 positions .* has \(its tokenizer's "
                                 r"model_max_length; the model's config has \d+\); use at most 16"),
}


REFUSED_GPT2 = {
    "pad-from-text-gpt2": ({"pad_token": "!"}, r"pad token '!' is one text can tokenize to: a gpt2 classifier"),
    "pad-not-the-config's-gpt2": ({}, r"pads with '<\|endoftext\|>' \(id 50256\) and the model's config.pad_token_id is 0"),
}


REFUSED_EOS = {  # an encoder-decoder classifier reads each example at its last EOS (config.eos_token_id)
    "pad-is-eos-bart": ("bart", {"pad_token": "</s>"}, r"pads with '</s>' \(id 2\), the model's end-of-sequence "
                        r"token \(config.eos_token_id\): a bart classifier reads each example at its last"),
    "pad-is-eos-t5": ("t5", {"pad_token": "</s>"}, r"pads with '</s>' \(id 1\), the model's end-of-sequence "
                      r"token \(config.eos_token_id\): a t5 classifier"),
    "eos-not-the-config's-bart": ("bart", {}, r"ends each text with '</s>' \(id 2\) and the model's "
                                  r"config.eos_token_id is 0: a bart classifier"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_EOS))
def test_an_encoder_decoder_classifier_that_cannot_find_its_eos_is_one_line(case: str, tiny_checkpoint,
                                                                           tmp_path: Path) -> None:
    """Finding: a BART or T5 checkpoint whose tokenizer pads with its end-of-sequence token (or
    ends texts with another id than config.eos_token_id) stopped at the first padded batch on
    transformers' ValueError traceback ("All examples must have the same number of <eos>
    tokens"). One line at setup, naming the setting (training, eval and predict build the same
    collator)."""
    from toolkit import recipe as recipes
    from toolkit.errors import UserError
    from toolkit.setup import build

    family, settings, message = REFUSED_EOS[case]
    folder = _with_tokenizer(tiny_checkpoint(family), tmp_path / "odd", **settings)
    if case.startswith("eos-not"):
        config = json.loads((Path(folder) / "config.json").read_text())
        (Path(folder) / "config.json").write_text(json.dumps({**config, "eos_token_id": 0}))
    plan = recipes.plan(f"recipes/glue/stsb/{'bart' if family == 'bart' else 't5'}-base-full.yaml",
                        [f"model.checkpoint={folder}", "task.max_eval_samples=2", "task.max_train_samples=2"])
    with pytest.raises(UserError, match=message) as error:
        build(plan)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("case", sorted(REFUSED) + sorted(REFUSED_GPT2))
def test_unusable_saved_settings_are_one_line(case: str, tiny_checkpoint, tmp_path: Path) -> None:
    """Findings: an uncased BERT whose tokenizer was saved with `do_lower_case: false` (or
    `strip_accents: false`) read every capitalised (accented) word as [UNK] and scored STS-B
    Pearson 0.03 where the same weights score -0.26, exit 0; one saved without a pad token
    stopped on transformers' ValueError traceback in the collator; a model_max_length below
    task.max_length was refused as the model's own number of positions; GPT-2's classifier, whose
    tokenizer pads with a token text gives ("!"), read "Great!" at "Great"."""
    from toolkit import recipe as recipes
    from toolkit.errors import UserError
    from toolkit.setup import build

    family = "gpt2" if case in REFUSED_GPT2 else "bert"
    settings, message = {**REFUSED, **REFUSED_GPT2}[case]
    folder = _with_tokenizer(tiny_checkpoint(family), tmp_path / "odd", **settings)
    if case == "pad-not-the-config's-gpt2":  # the model's config names another pad than its tokenizer
        config = json.loads((Path(folder) / "config.json").read_text())
        (Path(folder) / "config.json").write_text(json.dumps({**config, "pad_token_id": 0}))
    plan = recipes.plan(f"recipes/glue/stsb/{'gpt2' if family == 'gpt2' else 'bert-base-uncased'}-full.yaml",
                        [f"model.checkpoint={folder}", "task.max_eval_samples=2", "task.max_train_samples=2"])
    with pytest.raises(UserError, match=message) as error:
        build(plan)
    assert "\n" not in str(error.value)


def _tiny(kind: str):
    """A random 1-layer model of `kind` with 40 position rows (and its config)."""
    import transformers as t

    common = dict(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=32, max_position_embeddings=40, pad_token_id=1)
    config = {"roberta": t.RobertaConfig, "xlm-roberta": t.XLMRobertaConfig, "camembert": t.CamembertConfig,
              "data2vec-text": t.Data2VecTextConfig, "mpnet": t.MPNetConfig, "bert": t.BertConfig}.get(kind)
    if config is not None:
        config = config(**common)
    elif kind == "gpt2":
        config = t.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=40)
    else:  # bart: learned positions with an offset of 2 rows, added to the 40 the config names
        config = t.BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                              max_position_embeddings=40)
    return t.AutoModel.from_config(config).eval(), config


@pytest.mark.parametrize("kind", ["roberta", "xlm-roberta", "camembert", "data2vec-text", "mpnet", "bert", "gpt2", "bart"])
def test_the_position_limit_is_the_longest_input_the_model_reads(kind: str) -> None:
    """Finding: RoBERTa numbers its positions from pad id + 1, so its 514 position rows hold 512
    tokens; only its tokenizer's model_max_length (512) said so. A RoBERTa checkpoint whose
    tokenizer was saved without one (or with transformers' no-limit placeholder) took
    task.max_length 514 past the check and stopped on `IndexError: index 514 is out of bounds`
    inside the model (513 likewise). `models.max_positions` with the model counts the rows no
    position reaches, for every family built so (XLM-R, CamemBERT, Data2Vec, MPNet, ...), and
    none for BERT, GPT-2 and BART: the limit is the longest input the model reads."""
    from types import SimpleNamespace

    import torch

    from toolkit import models

    model, config = _tiny(kind)
    limit = models.max_positions(config, SimpleNamespace(model_max_length=int(1e30)), model)
    assert limit == (40 - 2 if kind in ("roberta", "xlm-roberta", "camembert", "data2vec-text", "mpnet") else 40)
    ids = lambda n: torch.full((1, n), 5)
    extra = {"decoder_input_ids": ids(1)} if kind == "bart" else {}
    with torch.no_grad():
        model(input_ids=ids(limit), **extra)
        if kind != "bart":  # BART's table is 2 rows longer than it names: 41 tokens would fit too
            with pytest.raises((IndexError, RuntimeError)):
                model(input_ids=ids(limit + 1), **extra)


TASK_OF = {"glue": ("glue/stsb/roberta-base-full", []),
           "text_classification": ("demo/own-data/minilm-full", []),
           "squad": ("squad/v1.1/roberta-base-full", []),
           "ner": ("ner/conll2003/minilm-full", []),
           "mlm": ("pretrain/wikitext-2/roberta-base-mlm", [])}


@pytest.mark.parametrize("task", sorted(TASK_OF))
def test_a_roberta_tokenizer_without_a_limit_is_held_to_its_positions(task: str, tiny_checkpoint, tmp_path: Path,
                                                                      cli, text_file: Path, conll_sample,
                                                                      squad_sample) -> None:
    """The rule above at a run's setup, for every task on RoBERTa, and at `toolkit eval` with a
    task.max_length of the user's: 514 is one line naming the 512 positions, nothing trained."""
    recipe, overrides = TASK_OF[task]
    tok_config = json.loads((Path(tiny_checkpoint("roberta")) / "tokenizer_config.json").read_text())
    folder = tmp_path / "no-limit"
    shutil.copytree(tiny_checkpoint("roberta"), folder)
    tok_config.pop("model_max_length", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    if task == "text_classification":
        data = tmp_path / "t.csv"
        data.write_text("text,label\n" + "".join(f"word {'x ' * (i * 7)},{i % 2}\n" for i in range(6)))
        overrides = [f"task.train_file={data}", f"task.eval_file={data}"]
    if task == "mlm":
        overrides = [f"task.train_file={text_file}", f"task.eval_file={text_file}"]
    if task == "ner":
        overrides = [f"task.train_file={conll_sample[0]}", f"task.eval_file={conll_sample[1]}"]
    if task == "squad":
        overrides = [f"task.eval_file={squad_sample}"]
    args = [f"recipes/{recipe}.yaml", f"model.checkpoint={folder}", "task.max_train_samples=2",
            "task.max_eval_samples=2", "train.max_steps=1", "train.warmup_ratio=0", "train.eval_every=0",
            *overrides, "--runs-dir", str(tmp_path / "runs")]
    code, _, err = cli("run", *args, "task.max_length=514")
    assert code == 2 and "Traceback" not in err, err
    assert "error: task.max_length: 514 is more than the 512 positions" in err
    assert not list((tmp_path / "runs").rglob("metrics.json"))
    if task != "text_classification":
        return
    code, _, err = cli("run", *args, "task.max_length=32")
    assert code == 0, err
    (run,) = [p.parent for p in (tmp_path / "runs").rglob("metrics.json")]
    code, _, err = cli("eval", run, "task.max_length=513")
    assert code == 2 and "task.max_length: 513 is more than the 512 positions" in err and "Traceback" not in err, err


@pytest.mark.parametrize("saved", ["none", "set"])
def test_a_saved_tokenizer_has_the_truncation_and_padding_it_was_read_with(saved: str, tiny_checkpoint,
                                                                            tmp_path: Path) -> None:
    """model/tokenizer.json (and an export's) holds the backend's truncation and padding as the base's
    tokenizer.json gave them, whatever the calls before the save left there: save_pretrained wrote
    the last call's, so a run whose encoded data came from the datasets cache saved another
    tokenizer.json than the same run encoding it (truncation at 128 tokens or none, as the
    `tokenizers` library reads it): the same command twice, a resumed and an uninterrupted run,
    differed. The probes that read a folder leave the kept copy as read too."""
    from toolkit import models

    base = Path(shutil.copytree(tiny_checkpoint("bert"), tmp_path / "base"))
    spec = json.loads((base / "tokenizer.json").read_text())
    if saved == "set":
        spec["truncation"] = {"direction": "Right", "max_length": 20, "strategy": "LongestFirst", "stride": 0}
        spec["padding"] = {"strategy": {"Fixed": 20}, "direction": "Right", "pad_to_multiple_of": None,
                           "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}
    else:
        spec["truncation"] = spec["padding"] = None
    (base / "tokenizer.json").write_text(json.dumps(spec))
    written = []
    for call in ({"truncation": True, "max_length": 7, "padding": True}, {}, {"padding": "max_length", "max_length": 9}):
        tok = models.load_tokenizer(str(base))  # the second and third: copies of the one kept
        tok(["a few words to cut here and there", "a"], **call)
        out = tmp_path / f"saved{len(written)}"
        models.save_tokenizer(tok, out)
        written.append(json.loads((out / "tokenizer.json").read_text()))
        assert len(tok("a b c d e f g h i j k l", truncation=True, max_length=4)["input_ids"]) == 4  # tok works on
    assert all((w["truncation"], w["padding"]) == (spec["truncation"], spec["padding"]) for w in written), \
        [(w["truncation"], w["padding"]) for w in written]
