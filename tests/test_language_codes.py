"""Multilingual tokenizers (mBART-50, mBART, NLLB, M2M100) mark every source and target with a
language code: the run sets them from the recipe (`task.source_code` / `task.target_code`, else
translation's `source_lang` / `target_lang`), generation starts with the target's code as
transformers' run_translation has it, in every entry point, or the run stops in one line.

Each tokenizer is a real transformers class built here from a tiny vocabulary (M2M100's from a
SentencePiece model trained on the fly), beside a random 1-layer model of its family."""

from __future__ import annotations

import io
import json
import string
from pathlib import Path

import pytest

from conftest import write_recipe
from toolkit import models
from test_train import only_run

LETTERS = string.ascii_lowercase
# kind -> (the codes of English and German as the tokenizer writes them, recipe task settings beyond
# the languages: NLLB's codes are not ISO 639-1, so they are named)
KINDS = {"mbart50": ("en_XX", "de_DE", ""), "mbart": ("en_XX", "de_DE", ""),
         "nllb": ("eng_Latn", "deu_Latn", ", source_code: eng_Latn, target_code: deu_Latn"),
         "m2m100": ("en", "de", "")}
SOURCES = ["the red car is fast", "a dog runs", "the cat sleeps", "two men walk"]
TARGETS = ["das rote auto ist schnell", "ein hund rennt", "die katze schlaeft", "zwei maenner gehen"]


def _unigram() -> list[tuple[str, float]]:
    return ([("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
            + [(c, -3.0) for c in LETTERS] + [("▁" + c, -3.5) for c in LETTERS])


def _tokenizer(kind: str, out: Path):
    import transformers

    if kind == "mbart50":
        return transformers.MBart50Tokenizer(vocab=_unigram())
    if kind == "mbart":
        return transformers.MBartTokenizer(vocab=_unigram())
    if kind == "nllb":
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "▁": 4}
        for c in LETTERS:
            vocab[c], vocab["▁" + c] = len(vocab), len(vocab) + 1
        return transformers.NllbTokenizer(vocab=vocab, merges=[("▁", c) for c in LETTERS])
    model = _spm(out)
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_proto=model)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    (out / "vocab.json").write_text(json.dumps(vocab))
    return transformers.M2M100Tokenizer(str(out / "vocab.json"), str(out / "sentencepiece.bpe.model"))


def _spm(out: Path) -> bytes:
    """A tiny SentencePiece model of the test sentences, written as out/sentencepiece.bpe.model."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter((SOURCES + TARGETS + [LETTERS]) * 10),
                                             model_writer=model, vocab_size=30, hard_vocab_limit=False,
                                             model_type="unigram", character_coverage=1.0, bos_id=-1, eos_id=-1,
                                             pad_id=-1, unk_id=0, minloglevel=3)
    (out / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    return model.getvalue()


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory: pytest.TempPathFactory):
    """kind -> a folder with a random 1-layer model of the family and its multilingual tokenizer."""
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind in built:
            return built[kind]
        out = tmp_path_factory.mktemp(kind)
        tok = _tokenizer(kind, out)
        _model(kind, models.id_span(tok), out)
        tok.save_pretrained(out)
        built[kind] = out
        return out

    return get


def _model(kind: str, rows: int, out: Path) -> None:
    """A random 1-layer model of the kind's family, `rows` embedding rows, saved in `out`."""
    import torch
    import transformers

    family = "MBart" if kind.startswith("mbart") else "M2M100"
    config = getattr(transformers, f"{family}Config")(
        vocab_size=rows, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=64,
        pad_token_id=1, eos_token_id=2, bos_token_id=0, decoder_start_token_id=2)
    torch.manual_seed(0)
    getattr(transformers, f"{family}ForConditionalGeneration")(config).save_pretrained(out)


def _code_id(tok, code: str) -> int:
    table = getattr(tok, "lang_code_to_id", None) or {}
    return table[code] if code in table else tok.convert_tokens_to_ids(code)


RECIPE = """model: {{checkpoint: {checkpoint}, dropout: 0.0}}
task: {{name: {task}, subset: custom, train_file: {data}, eval_file: {data}, max_length: 24,
        max_target_length: 8{extra}}}
method: {{name: full}}
train: {{epochs: 1, max_steps: 1, lr: 1.0e-3, batch_size: 4, seed: 1, eval_batch_size: 4, keep_best: false}}
"""


def _records(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"en": s, "de": t, "source": s, "target": t}) + "\n"
                            for s, t in zip(SOURCES, TARGETS)))
    return path


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_entry_point_marks_the_recipes_languages_and_starts_with_the_target_code(
        tmp_path: Path, cli, multilingual, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training (labels), the run's evaluation, `toolkit eval`, `toolkit predict`, the API's
    predict and `toolkit export` read sources marked with the source language's code and
    targets with the target's, and generate starting as training's decoder input starts: the
    target code forced first (mBART-50, NLLB, M2M100) or as the decoder start (mBART). Without
    it the sources were marked English by default and the targets with the source's code (M2M100:
    a traceback), and the model was left to choose its output's language."""
    import transformers

    import toolkit

    source, target, extra = KINDS[kind]
    checkpoint = multilingual(kind)
    tok = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    src_id, tgt_id = _code_id(tok, source), _code_id(tok, target)
    seen: list[dict] = []
    real_generate = transformers.GenerationMixin.generate

    def generate(self, *args, **kwargs):
        out = real_generate(self, *args, **kwargs)
        seen.append({"sources": kwargs["input_ids"].tolist(), "out": out.tolist(),
                     "forced": kwargs.get("forced_bos_token_id"), "start": kwargs.get("decoder_start_token_id")})
        return out

    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    labels: list = []  # what the decoder reads in training and in the eval loss
    family = transformers.MBartForConditionalGeneration if kind.startswith("mbart") else \
        transformers.M2M100ForConditionalGeneration
    real_forward = family.forward

    def forward(self, *args, **kwargs):
        if kwargs.get("decoder_input_ids") is not None and kwargs.get("cache") is None:
            labels.extend(kwargs["decoder_input_ids"].tolist())  # the labels shifted: teacher forcing
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(family, "forward", forward)
    data = _records(tmp_path)
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(
        checkpoint=checkpoint, task="translation", data=data, extra=", source_lang: en, target_lang: de" + extra))
    code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    run = only_run(tmp_path / "runs")
    steps = {"run": list(seen)}
    for name, call in (("eval", lambda: cli("eval", run)[0]),
                       ("predict", lambda: cli("predict", run, "--input", data)[0]),
                       ("api predict", lambda: toolkit.predict(run, SOURCES[:2]) and 0)):
        seen.clear()
        assert call() == 0, name
        steps[name] = list(seen)
    forced, start = (None, tgt_id) if kind == "mbart" else (tgt_id, 2)
    for name, calls in steps.items():
        assert calls, name
        for call in calls:
            assert all(src_id in row and tgt_id not in row for row in call["sources"]), name
            assert (call["forced"], call["start"]) == (forced, start), name
            assert all(row[0] == start and (forced is None or row[1] == forced) for row in call["out"]), name
    assert labels and all(tgt_id in row and src_id not in row for row in labels)
    written = [r["prediction"] for r in map(json.loads, (run / "predictions.jsonl").read_text().splitlines())]
    written += [r["prediction"] for r in toolkit.predict(run, SOURCES[:2])]
    token = tok.convert_ids_to_tokens(tgt_id)  # M2M100's `__de__`: not always a special token
    assert written and not any(token in text for text in written)  # the forced code is no text
    assert cli("export", run, tmp_path / "out")[0] == 0
    saved = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert (saved.get("forced_bos_token_id"), saved.get("decoder_start_token_id")) == (forced, start)
    exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert (exported.src_lang, exported.tgt_lang) == (source, target)
    assert src_id in exported(SOURCES[0])["input_ids"] and tgt_id in exported(text_target=TARGETS[0])["input_ids"]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_id_the_tokenizer_writes_is_a_row_of_the_models_embeddings(
        tmp_path: Path, cli, multilingual, kind: str) -> None:
    """M2M100 numbers its language codes past its vocabulary, outside `len(tokenizer)`: a model
    one row short of the tokenizer's largest id (language codes included) is one line before the
    run folder (it was an IndexError traceback mid-run for M2M100, whose `len` passed), and the
    small model `--smoke` builds on the checkpoint's tokenizer has a row for each of them (it was
    built with `len(tokenizer)` rows: the same IndexError on every M2M100 smoke run)."""
    import shutil

    from toolkit.tasks._generation import code_ids, language_codes

    checkpoint = multilingual(kind)
    tok = models.load_tokenizer(str(checkpoint))
    span = models.id_span(tok)
    assert max(code_ids(tok, language_codes(tok))) < span and len(tok) <= span
    short = tmp_path / "short"
    shutil.copytree(checkpoint, short)
    _model(kind, span - 1, short)
    source, target, extra = KINDS[kind]
    languages = ", source_lang: en, target_lang: de" + extra
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=short, task="translation",
                                                             data=_records(tmp_path), extra=languages))
    code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    line = err.strip().splitlines()[-1]  # after the progress of _model's save
    assert code == 2 and "Traceback" not in err and line.startswith("error: model.checkpoint: "), err
    assert f"writes ids up to {span - 1} ({tok.convert_ids_to_tokens(span - 1)!r}) and the model embeds {span - 1}" in line
    assert not (tmp_path / "runs").exists()
    recipe = write_recipe(tmp_path / "s.yaml", RECIPE.format(checkpoint=short.rename(tmp_path / f"smoke-{kind}"),
                                                             task="translation", data=_records(tmp_path), extra=languages))
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err


@pytest.mark.parametrize("case, kind, task, extra, says", [
    ("nllb codes are not ISO 639-1", "nllb", "translation", ", source_lang: en, target_lang: de",
     "task.source_lang: 'en' is not one of the 202 language codes the tokenizer (NllbTokenizer) marks texts with"),
    ("a code the tokenizer lacks", "mbart50", "translation", ", source_lang: en, target_lang: de, target_code: de_CH",
     "task.target_code: 'de_CH' is not one of the 52 language codes the tokenizer (MBart50Tokenizer) marks texts "
     "with (its codes of that language: de_DE); use one of them"),
    ("a regional code is not its language's other region", "mbart50", "translation",
     ", source_lang: en, target_lang: pt-BR", "task.target_lang: 'pt-BR' is not one of the 52 language codes"),
    ("summarization names no language", "m2m100", "summarization", "",
     "task.source_code: the tokenizer (M2M100Tokenizer) marks every text with its language's code"),
    ("a code for a tokenizer without codes", "bart", "summarization", ", source_code: en_XX",
     "task.source_code: 'en_XX' is a language code for a tokenizer that marks texts with them"),
])
def test_languages_a_multilingual_tokenizer_cannot_mark_are_one_line_before_the_run(
        tmp_path: Path, cli, multilingual, tiny_checkpoint, case: str, kind: str, task: str, extra: str,
        says: str) -> None:
    checkpoint = tiny_checkpoint("bart") if kind == "bart" else multilingual(kind)
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=checkpoint, task=task,
                                                             data=_records(tmp_path), extra=extra))
    code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    assert code == 2, case
    assert says in err and err.count("\n") == 1 and "Traceback" not in err, (case, err)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("metrics.json"))


def test_summarization_marks_the_codes_the_recipe_names(tmp_path: Path, multilingual) -> None:
    """A task that names no language takes task.source_code / task.target_code for every text."""
    from datasets import Dataset

    from toolkit import models
    from toolkit.tasks.summarization import Summarization

    tok = models.load_tokenizer(str(multilingual("mbart50")))
    task = Summarization(subset="custom", eval_file="x", source_code="de_DE", target_code="de_DE")
    task.model_head("mbart")
    encoded = task.encode(Dataset.from_dict({"source": TARGETS, "target": TARGETS}), tok)
    de, en = _code_id(tok, "de_DE"), _code_id(tok, "en_XX")
    assert all(row["input_ids"][0] == de and row["labels"][0] == de and en not in row["input_ids"]
               for row in encoded)


MARKS = (">>de<<", ">>fr<<", ">>es<<")


@pytest.fixture(scope="module")
def marian(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 1-layer Marian model whose tokenizer translates into three languages, named by a
    `>>code<<` token before each source (as opus-mt-en-ROMANCE's)."""
    import sentencepiece
    import torch
    import transformers

    out = tmp_path_factory.mktemp("marian")
    sp = sentencepiece.SentencePieceProcessor(model_proto=_spm(out))
    for name in ("source.spm", "target.spm"):
        (out / name).write_bytes((out / "sentencepiece.bpe.model").read_bytes())
    (out / "sentencepiece.bpe.model").unlink()
    vocab = {"</s>": 0, "<unk>": 1, **{m: 2 + i for i, m in enumerate(MARKS)}}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab))
    tok = transformers.MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"))
    config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=64,
        pad_token_id=vocab["<pad>"], eos_token_id=0, decoder_start_token_id=vocab["<pad>"])
    torch.manual_seed(0)
    transformers.MarianMTModel(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_a_multi_target_marian_source_begins_with_the_target_languages_mark_in_every_entry_point(
        tmp_path: Path, cli, marian: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training, evaluation, `toolkit eval`, `toolkit predict` and the API read `>>de<<` first in
    every source of an English to German run (it was left out: the model chose the language)."""
    import transformers

    import toolkit

    mark = json.loads((marian / "vocab.json").read_text())[">>de<<"]
    sources: dict[str, list] = {}
    real = transformers.MarianMTModel.forward
    step = ["run"]

    def forward(self, *args, **kwargs):
        if kwargs.get("input_ids") is not None:
            sources.setdefault(step[0], []).extend(kwargs["input_ids"].tolist())
        return real(self, *args, **kwargs)

    def generate(self, *args, **kwargs):
        sources.setdefault(step[0], []).extend(kwargs["input_ids"].tolist())
        return real_generate(self, *args, **kwargs)

    real_generate = transformers.GenerationMixin.generate
    monkeypatch.setattr(transformers.MarianMTModel, "forward", forward)
    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    data = _records(tmp_path)
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=marian, task="translation", data=data,
                                                             extra=", source_lang: en, target_lang: de"))
    code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    run = only_run(tmp_path / "runs")
    for name, call in (("eval", lambda: cli("eval", run)[0]),
                       ("predict", lambda: cli("predict", run, "--input", data)[0]),
                       ("api predict", lambda: toolkit.predict(run, SOURCES[:2]) and 0)):
        step[0] = name
        assert call() == 0, name
    assert set(sources) == {"run", "eval", "predict", "api predict"}
    assert all(row[0] == mark for rows in sources.values() for row in rows)


@pytest.mark.parametrize("task, extra, says", [
    ("summarization", "", "task.target_code: the tokenizer (MarianTokenizer) translates into the language a token "
                          "before each source names (>>de<<, >>fr<<, >>es<<"),
    ("translation", ", source_lang: en, target_lang: de, prefix: '>>fr<< '",
     "task.prefix: it begins with >>fr<<, the target language mark, and task.target_lang says de (>>de<<)"),
    ("translation", ", source_lang: en, target_lang: it", "task.target_lang: 'it' is not one of the 3 language codes"),
])
def test_a_multi_target_marian_without_one_target_language_is_one_line(tmp_path: Path, cli, marian: Path, task: str,
                                                                        extra: str, says: str) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=marian, task=task, data=_records(tmp_path),
                                                             extra=extra))
    code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    assert code == 2 and says in err and err.count("\n") == 1, err


def test_a_smoke_model_without_the_checkpoints_tokenizer_names_the_shared_tokenizers_tokens(tmp_path: Path, cli) -> None:
    """A Marian checkpoint folder without its vocabulary files: the small model borrows the shared
    encoder-decoder tokenizer (BART's), and its config named Marian's defaults (start 58100, past
    the rows; end 0, BART's <s>); reading the folder's tokenizer was a TypeError traceback."""
    import transformers

    folder = tmp_path / "opus-mt-config-only"
    transformers.MarianConfig().save_pretrained(folder)
    small = Path(models.smoke_checkpoint(str(folder)))
    built = json.loads((small / "config.json").read_text())
    tok = models.load_tokenizer(str(small))
    assert (built["eos_token_id"], built["forced_eos_token_id"], built["pad_token_id"], built["decoder_start_token_id"]) \
        == (tok.eos_token_id, tok.eos_token_id, tok.pad_token_id, tok.pad_token_id)
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=folder, task="translation", data=_records(tmp_path),
                                                             extra=", source_lang: en, target_lang: de"))
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err


@pytest.mark.parametrize("kind", [*sorted(KINDS), "marian"])
def test_a_smoke_model_names_the_tokens_of_the_checkpoints_own_config(tmp_path: Path, cli, multilingual, marian: Path,
                                                                      kind: str) -> None:
    """`--smoke` on a checkpoint of a family without a recipe of its own (Marian, mBART, M2M100,
    NLLB) builds the family's default config, shrunk, beside the checkpoint's tokenizer: its
    token ids were the family's largest checkpoint's (Marian's decoder_start_token_id 58100), past
    the small model's rows, and every opus-mt smoke run stopped on an IndexError. They are now the
    checkpoint's own, and its rows cover every id the tokenizer writes."""
    folder = marian if kind == "marian" else multilingual(kind)
    small = Path(models.smoke_checkpoint(str(folder)))
    built, own = (json.loads((f / "config.json").read_text()) for f in (small, folder))
    assert built["vocab_size"] >= models.id_span(models.load_tokenizer(str(folder)))
    named = {k: own[k] for k in models.TOKEN_ID_KEYS if isinstance(own.get(k), int) and k in built}
    assert named and {k: built[k] for k in named} == named
    if kind == "marian":  # the others run --smoke in test_every_id_the_tokenizer_writes_is_a_row_...
        recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=marian, task="translation",
                                                                 data=_records(tmp_path),
                                                                 extra=", source_lang: en, target_lang: de"))
        code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
        assert code == 0, err
