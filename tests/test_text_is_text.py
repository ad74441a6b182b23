"""A special token's string in the user's text is text (models.text_is_text): "[SEP]", "</s>",
"<|endoftext|>", "<pad>", "<mask>", "<extra_id_0>" in a sentence, a document, a target or a QA
context are tokenized as the characters they are written with, in every task, for every family's
real tokenizer. Each row encodes the same data twice, once holding every family's special strings
and once with a plain word in their place: the special ids the task put in (its [CLS] .. [SEP],
the EOS after a target or a document, padding) must be the same ones in the same numbers.
Without the rule a "</s>" ended a BART/T5 source early, an "<|endoftext|>" in a GPT-2 target or
CLM document was an end of text, a "[SEP]" opened a segment and an "<extra_id_0>" collided with
span_corruption's own sentinel."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest

from toolkit import models

SPECIALS = ["[SEP]", "[CLS]", "[MASK]", "[PAD]", "<|endoftext|>", "</s>", "<s>", "<pad>", "<mask>",
            "<extra_id_0>", "<extra_id_1>"]
FAMILIES = {"bert": "bert-base-uncased", "roberta": "roberta-base", "gpt2": "gpt2", "bart": "bart-base", "t5": "t5"}


def text(i: int, special: bool) -> str:
    fill = SPECIALS if special else ["word"] * len(SPECIALS)
    return f"sentence {i} " + " ".join(f"{w} x{j}" for j, w in enumerate(fill)) + " end"


def _write(path: Path, content: str) -> str:
    path.write_text(content)
    return str(path)


def _glue(tmp: Path, s: bool) -> dict:
    (tmp / "glue/RTE").mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        _write(tmp / "glue/RTE" / name, "index\tsentence1\tsentence2\tlabel\n" + "".join(
            f"{i}\t{text(i, s)}\t{text(i + 1, s)}\t{['entailment', 'not_entailment'][i % 2]}\n" for i in range(4)))
    return {"subset": "rte", "data_dir": str(tmp), "max_length": 256}


def _classification(tmp: Path, s: bool) -> dict:
    rows = [{"text": text(i, s), "label": i % 2} for i in range(4)]
    path = _write(tmp / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return {"train_file": path, "eval_file": path, "max_length": 256}


def _ner(tmp: Path, s: bool) -> dict:
    sentence = lambda i: "".join(f"{w} {'B-PER' if k == 0 else 'O'}\n" for k, w in enumerate(text(i, s).split())) + "\n"
    path = _write(tmp / "d.txt", "".join(sentence(i) for i in range(4)))
    return {"train_file": path, "eval_file": path, "max_length": 256}


def _pairs(tmp: Path, s: bool) -> dict:
    rows = [{"source": text(i, s), "target": text(i + 7, s)} for i in range(4)]
    path = _write(tmp / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return {"subset": "custom", "train_file": path, "eval_file": path, "max_length": 256, "max_target_length": 256}


def _translation(tmp: Path, s: bool) -> dict:
    return {**_pairs(tmp, s), "source_field": "source", "target_field": "target"}


def _squad(tmp: Path, s: bool) -> dict:
    context = f"{text(0, s)} The cat sat on the mat."
    qas = [{"id": f"q{i}", "question": f"Where did {text(i, s)} sit?",
            "answers": [{"text": "the mat", "answer_start": context.index("the mat")}]} for i in range(3)]
    path = _write(tmp / "d.json", json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}))
    return {"train_file": path, "eval_file": path, "max_length": 384}


def _documents(tmp: Path, s: bool) -> dict:
    path = _write(tmp / "d.txt", "".join(text(i, s) + "\n" for i in range(4)))
    return {"train_file": path, "eval_file": path, "max_length": 512}


ROWS: list[tuple[str, Callable, str]] = [
    *[("glue", _glue, f) for f in ("bert", "roberta", "bart", "t5")],
    *[("text_classification", _classification, f) for f in ("bert", "gpt2")],
    *[("ner", _ner, f) for f in ("bert", "roberta")],
    *[("summarization", _pairs, f) for f in ("bart", "t5", "gpt2")],
    *[("translation", _translation, f) for f in ("t5", "bert")],
    *[("squad", _squad, f) for f in ("bert", "roberta", "t5")],
    ("mlm", _documents, "bert"), ("mlm", _documents, "roberta"), ("clm", _documents, "gpt2"),
    ("denoise", _documents, "bart"), ("span_corruption", _documents, "t5"),
]


# GPT-2 adds no special token to a classified text; every pretraining objective closes each document
# with one (denoise and span_corruption add the rest of theirs to the blocks when corrupting them)
NONE_ADDED = {("text_classification", "gpt2")}


def _special_ids(task_name: str, data: Callable, family: str, tmp: Path, special: bool) -> Counter:
    """How many of each special id the task's encoded data holds (unknown-token ids aside)."""
    from toolkit.tasks import TASKS
    from toolkit.tasks._text import TextTask

    tmp.mkdir()
    task = TASKS.get(task_name)(**data(tmp, special))
    if family == "bert" and task_name in ("summarization", "translation"):
        task.model_head("bert")  # BERT2BERT
    else:
        task.model_head(family)
    tok = models.load_tokenizer(str(Path(os.environ["TOOLKIT_TOKENIZERS"]) / FAMILIES[family]),
                                words=task_name == "ner")
    raw = task.load()
    splits = [raw["train"], *raw["eval"].values()]
    if isinstance(task, TextTask):  # the blocks before corruption (masks are drawn at random)
        encoded = [task.pack(s.remove_columns([c for c in s.column_names if c != "text"]), tok) for s in splits]
    else:
        encoded = [task.encode(s, tok) for s in splits]
    control = {tok.bos_token_id, tok.eos_token_id, tok.sep_token_id, tok.cls_token_id, tok.pad_token_id}
    ids = set(tok.all_special_ids) - ({tok.unk_token_id} - control)  # GPT-2's unknown token is its EOS
    columns = ("input_ids", "prompt_ids") + (("labels",) if hasattr(task, "generation") else ())
    found: Counter = Counter()
    for ds in encoded:
        for column in columns:
            if column in ds.column_names:
                found.update(t for row in ds[column] for t in row if t in ids)
    return found


@pytest.mark.parametrize("task_name, data, family", ROWS, ids=[f"{t}-{f}" for t, _, f in ROWS])
def test_special_strings_in_text_are_text(task_name: str, data: Callable, family: str, tmp_path: Path) -> None:
    plain = _special_ids(task_name, data, family, tmp_path / "plain", False)
    assert bool(plain) == ((task_name, family) not in NONE_ADDED)  # the task's own special tokens
    assert _special_ids(task_name, data, family, tmp_path / "special", True) == plain


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_saved_run_reads_text_as_text_and_its_model_folder_as_transformers_reads(family: str, tmp_path: Path) -> None:
    """The tokenizer saved with a run (what predict, eval and a chained run load) reads special
    strings as text again when the toolkit loads it; plain transformers loading the same folder (the
    run's model/, a pretraining objective's export: fill-mask finds its [MASK]) reads them as it always
    does; every other text encodes to the same ids either way. A predicting task's export is below."""
    from transformers import AutoTokenizer

    tok = models.load_tokenizer(str(Path(os.environ["TOOLKIT_TOKENIZERS"]) / FAMILIES[family]))
    tok.save_pretrained(tmp_path)
    again, plain = models.load_tokenizer(str(tmp_path)), AutoTokenizer.from_pretrained(tmp_path)
    line = " ".join(SPECIALS) + " < <<a> end"
    control = {again.bos_token_id, again.eos_token_id, again.sep_token_id, again.cls_token_id, again.pad_token_id} - {None}
    ours = again(line, add_special_tokens=False)["input_ids"]
    assert ours == tok(line, add_special_tokens=False)["input_ids"] and not control & set(ours)
    assert control & set(plain(line, add_special_tokens=False)["input_ids"])
    words = "Plain text, with <angle> brackets & accents: café, naïve; 3 < 4."
    assert again(words)["input_ids"] == plain(words)["input_ids"]


EXPORTED = [*[("glue", _glue, f) for f in ("bert", "roberta", "bart", "t5")],
            *[("text_classification", _classification, f) for f in ("bert", "gpt2")],
            *[("ner", _ner, f) for f in ("bert", "roberta")],
            *[("summarization", _pairs, f) for f in ("t5", "gpt2")], ("squad", _squad, "bert")]


def _exported(task_name: str, data: Callable, family: str, tmp: Path, special: bool, tiny_checkpoint) -> tuple:
    """(task, the run's tokenizer as the toolkit loads it, the export's loaded by plain AutoTokenizer, the line)."""
    from transformers import AutoModelForCausalLM, AutoModelForQuestionAnswering, AutoModelForSeq2SeqLM, AutoTokenizer

    from toolkit import inference
    from toolkit.tasks import TASKS

    tmp.mkdir()
    shorter = {"max_length": 40, **({"doc_stride": 16} if task_name == "squad" else {})}  # the texts run past it
    task = TASKS.get(task_name)(**{**data(tmp, special), **shorter})
    head = task.model_head(family)
    tok = models.load_tokenizer(str(Path(os.environ["TOOLKIT_TOKENIZERS"]) / FAMILIES[family]), words=task.words_given)
    auto = {"causal-lm": AutoModelForCausalLM, "seq2seq-lm": AutoModelForSeq2SeqLM,
            "question-answering": AutoModelForQuestionAnswering}.get(head)
    model = auto.from_pretrained(tiny_checkpoint(family)) if auto else None  # what decode_as_run reads
    note = inference.read_as_run(task, model, tok)
    tok.save_pretrained(tmp / "out")
    note += inference.specials_read_otherwise(task, tmp / "out")
    return task, tok, AutoTokenizer.from_pretrained(tmp / "out"), note


def _as_predict_reads(task, tok, plain) -> tuple[list, list]:
    """The ids `toolkit predict` gives the model for the task's eval rows, and the ids the export's
    tokenizer gives them tokenized the documented way (`truncation=True`: its model_max_length)."""
    raw = next(iter(task.load()["eval"].values()))
    if task.name == "ner":
        words = list(raw["tokens"])
        return (task.tokenize(tok, words, limit=task.max_length, is_split_into_words=True)["input_ids"],
                plain(words, is_split_into_words=True, truncation=True)["input_ids"])
    if hasattr(task, "generation"):
        encoded = task.encode(raw, tok)
        order = sorted(range(len(encoded)), key=lambda i: encoded["example_index"][i])
        prefix, _ = task.affixes()
        return ([encoded["input_ids"][i] for i in order],
                plain([prefix + task.source_text(r) for r in raw.to_list()], truncation=True)["input_ids"])
    return (list(task.encode(raw, tok)["input_ids"]),
            plain(*[list(raw[c]) for c in task.text_columns], truncation=True)["input_ids"])


@pytest.mark.parametrize("task_name, data, family", EXPORTED, ids=[f"{t}-{f}" for t, _, f in EXPORTED])
def test_an_exported_tokenizer_reads_predict_inputs_as_the_run(task_name: str, data: Callable, family: str,
                                                               tmp_path: Path, tiny_checkpoint) -> None:
    """A predicting task's export, its tokenizer loaded by plain transformers (AutoTokenizer,
    pipeline), reads an input as `toolkit predict` reads it: special strings as text
    (split_special_tokens saved) and cut at task.max_length (model_max_length, with truncation=True);
    T5's tokenizer saved as TokenizersBackend (T5Tokenizer rebuilds its normalizer, and its
    vocabulary holds "</s>" as a piece); what it cannot (a prompt's source cut before its suffix)
    the line says. Finding: the export read "[SEP]" or "</s>" in a review as the control token and
    a text past task.max_length whole, so it predicted otherwise, exit 0."""
    task, tok, plain, note = _exported(task_name, data, family, tmp_path / "special", True, tiny_checkpoint)
    assert plain.split_special_tokens
    if task.reading_limit() is None:  # GPT-2's prompt: the source is cut before the suffix
        assert plain.model_max_length == tok.model_max_length > task.max_length, note
        assert "the run cut each source to fit task.max_length=40 tokens before the rest of the prompt" in note
        return
    assert plain.model_max_length == task.max_length and "cuts at task.max_length=40 tokens" in note, note
    if task_name == "squad":  # windows of max_length: the limit is what a QA reader passes
        return
    ours, theirs = _as_predict_reads(task, tok, plain)
    assert any(len(ids) == task.max_length for ids in ours)  # some were cut
    if family == "t5":  # T5Tokenizer rebuilds its normalizer: the folder names the class that reads it as saved
        assert type(plain).__name__ == "TokenizersBackend" and re.search(
            r'; its tokenizer is saved as TokenizersBackend, .* \(T5Tokenizer would read "</s>", ', note), note
    else:
        assert "TokenizersBackend" not in note and "special token" not in note, note
    assert plain("a </s> [SEP] b")["input_ids"] == tok("a </s> [SEP] b")["input_ids"]
    assert ours == theirs
