"""A battery of malformed inputs: each is one `error:` line naming the file, row or field, exit
code 2, and no run folder that looks finished."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from conftest import write_recipe

GOOD = """model: {checkpoint: bert-base-uncased}
task: {name: glue, subset: sst2, max_length: 32}
method: {name: lora, r: 4}
train: {epochs: 1, batch_size: 8}
"""


def recipe_text(text: str) -> Callable[[Path], list]:
    return lambda tmp: ["run", write_recipe(tmp / "r.yaml", text), "--smoke"]


def recipe_bytes(data: bytes) -> Callable[[Path], list]:
    def make(tmp: Path) -> list:
        (tmp / "r.yaml").write_bytes(data)
        return ["validate", tmp / "r.yaml"]
    return make


def override(*items: str) -> Callable[[Path], list]:
    return lambda tmp: ["run", write_recipe(tmp / "r.yaml", GOOD), *items, "--smoke"]


def extends_cycle(tmp: Path) -> list:
    write_recipe(tmp / "a.yaml", "extends: b.yaml\n")
    write_recipe(tmp / "b.yaml", "extends: a.yaml\n")
    return ["validate", tmp / "a.yaml"]


def user_data(content: bytes, name: str = "d.csv", extra: str = "") -> Callable[[Path], list]:
    """The text_classification task on one file written with `content`."""
    def make(tmp: Path) -> list:
        (tmp / name).write_bytes(content)
        recipe = write_recipe(tmp / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: text_classification, train_file: {tmp / name}, eval_file: {tmp / name}{extra}}}
method: {{name: full}}
""")
        return ["run", recipe, "--smoke"]
    return make


def glue_dev(content: bytes) -> Callable[[Path], list]:
    def make(tmp: Path) -> list:
        folder = tmp / "data" / "glue" / "SST-2"
        folder.mkdir(parents=True)
        (folder / "train.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
        (folder / "dev.tsv").write_bytes(content)
        return ["run", write_recipe(tmp / "r.yaml", GOOD), f"task.data_dir={tmp / 'data'}", "--smoke"]
    return make


def checkpoint_folder(files: dict[str, str]) -> Callable[[Path], list]:
    """A checkpoint folder of `files` beside BERT's real tokenizer (the case is the model's files)."""
    def make(tmp: Path) -> list:
        from toolkit.models import tokenizer_dir

        folder = tmp / "ckpt"
        shutil.copytree(tokenizer_dir() / "bert-base-uncased", folder)
        for name, text in files.items():
            (folder / name).write_text(text)
        return ["run", write_recipe(tmp / "r.yaml", GOOD.replace("bert-base-uncased", str(folder)))]
    return make


def cut_weights(tmp: Path) -> list:
    """A model folder whose model.safetensors was cut short (a copy or a run's save that stopped):
    an upstream run's model/ named by `{run: ...}` as much as any folder."""
    import shutil

    from toolkit.models import smoke_checkpoint

    folder = tmp / "ckpt"
    shutil.copytree(smoke_checkpoint("bert-base-uncased"), folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    return ["run", write_recipe(tmp / "r.yaml", GOOD.replace("bert-base-uncased", str(folder)))]


def _save_small_bert(folder: Path) -> None:
    """A one-layer BERT's weights and config into `folder`, with transformers' progress bar off:
    the save's own bar is not the command's output these tests read."""
    from transformers import BertConfig, BertModel
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=32)).save_pretrained(folder)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def mismatched_tokenizer(tmp: Path) -> list:
    """A small BERT (30522 embeddings) saved with GPT-2's tokenizer (50257 tokens)."""
    from transformers import AutoTokenizer

    from toolkit.models import tokenizer_dir

    folder = tmp / "mixed"
    _save_small_bert(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir() / "gpt2").save_pretrained(folder)
    return ["run", write_recipe(tmp / "r.yaml", GOOD.replace("bert-base-uncased", str(folder)))]


def mismatched_warm_start(tmp: Path) -> list:
    """The same folder warm-started as an encoder-decoder (BERT2BERT), which builds the model
    its own way: its tokenizer is held to its embeddings all the same."""
    args = mismatched_tokenizer(tmp)
    return [*args, "model.warm_start=encoder-decoder", "task.name=summarization", "task.subset=samsum",
            "task.max_length=32", "task.max_target_length=8", "task.max_train_samples=8", "task.max_eval_samples=8",
            "train.max_steps=1", "method.name=full"]


def _tokenizer_folder(tmp: Path, damage: str) -> Path:
    """A small BERT saved with BERT's real tokenizer, its tokenizer files then damaged."""
    from toolkit.models import tokenizer_dir

    folder = tmp / f"tok-{damage}"
    shutil.copytree(tokenizer_dir() / "bert-base-uncased", folder)
    _save_small_bert(folder)
    config = folder / "tokenizer_config.json"
    if damage == "no tokenizer files":  # the model saved alone: transformers builds an empty tokenizer
        for file in folder.iterdir():
            if file.name not in ("config.json", "model.safetensors"):
                file.unlink()
    elif damage == "a key that clashes":
        config.write_text(json.dumps({**json.loads(config.read_text()), "add_special_tokens": False}))
    elif damage == "config not JSON":
        config.write_text("{nope")
    elif damage == "tokenizer.json of another shape":
        (folder / "tokenizer.json").write_text('{"x": 1}')
    elif damage == "tokenizer.json not UTF-8":
        (folder / "tokenizer.json").write_bytes(b"\xff\xfe garbage")
    return folder


TOKENIZER_DAMAGE = {"no tokenizer files": "it has no vocabulary", "a key that clashes": "AttributeError: add_special_tokens",
                    "config not JSON": "JSONDecodeError", "tokenizer.json of another shape": "KeyError",
                    "tokenizer.json not UTF-8": "UnicodeDecodeError"}


def damaged_tokenizer(damage: str) -> Callable[[Path], list]:
    def make(tmp: Path) -> list:
        folder = _tokenizer_folder(tmp, damage)
        return ["run", write_recipe(tmp / "r.yaml", GOOD.replace("bert-base-uncased", str(folder)))]
    return make


def runs_dir_is_a_file(tmp: Path) -> list:
    (tmp / "runs-file").write_text("not a folder")
    return ["run", write_recipe(tmp / "r.yaml", GOOD), "--smoke", "--runs-dir", tmp / "runs-file"]


def corrupt_metrics(tmp: Path) -> list:
    run = tmp / "runs" / "x" / "abc"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text('{"eval": {"accuracy": 0.9')
    return ["report", tmp / "runs", "--no-plots"]


BOMB = b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n".encode()
    for p, c in zip("abcdefgh", "bcdefghi")) + b"model: *i\n"

CASES: dict[str, tuple[Callable[[Path], list], str]] = {
    "yaml syntax error": (recipe_text("model: {checkpoint: x\n"), "not valid YAML"),
    "yaml list as recipe": (recipe_text("- model\n- task\n"), "a recipe is a mapping of sections, got list"),
    "yaml scalar as recipe": (recipe_text("hello\n"), "a recipe is a mapping of sections, got str"),
    "non-utf8 recipe": (recipe_bytes(b"model: {checkpoint: caf\xe9}\n"), "not UTF-8 text"),
    "binary recipe": (recipe_bytes(b"model:\x00\x01\x02"), "NUL bytes"),
    "alias bomb": (recipe_bytes(BOMB), "expands to more than 100,000 YAML nodes"),
    "huge recipe": (recipe_bytes(b"# " + b"x" * (1 << 20) + b"\n"), "is not a recipe"),
    "extends cycle": (extends_cycle, "'extends' loops back to itself"),
    "extends a number": (recipe_text("extends: 5\n"), "extends: expected a file name or a list"),
    "extends a missing file": (recipe_text("extends: nope.yaml\n"), "nope.yaml does not exist"),
    "unknown section": (recipe_text(GOOD + "trian: {}\n"), "trian: unknown section (did you mean 'train'?)"),
    "override of a missing key": (override("train.lrr=1"), "train.lrr: unknown key (did you mean 'lr'?)"),
    "override without =": (override("train.lr"), "override 'train.lr': expected key=value"),
    "override YAML can't parse": (override("train.lr=[1,"), "override 'train.lr=[1,': not valid YAML"),
    "lr nan": (override("train.lr=.nan"), "train.lr: nan is not a finite number"),
    "epochs inf": (override("train.epochs=.inf"), "train.epochs: inf is not a finite number"),
    "dropout nan": (override("model.dropout=.nan"), "model.dropout: nan is not a finite number"),
    "negative seed": (override("train.seed=-1"), "train.seed: -1 is below the minimum 0"),
    "lora r zero": (override("method.r=0"), "method.r: 0 is below the minimum 1"),
    "wrong type under --smoke": (override("train.batch_size=abc"), "train.batch_size: expected int"),
    "unknown method": (override("method.name=lorra"), "method.name: unknown method 'lorra' (did you mean 'lora'?)"),
    "unknown glue subset": (override("task.subset=sst3"), "task.subset: 'sst3' is not allowed"),
    "max_length beyond positions": (override("task.max_length=600"), "task.max_length: 600 is more than the 512 positions"),
    "empty data file": (user_data(b""), "the file is empty"),
    "header only": (user_data(b"text,label\n"), "has a header and no rows"),
    "wrong delimiter": (user_data(b"text;label\ngood;1\nbad;0\n"), "column 'label' is missing (it has: 'text;label')"),
    "missing column": (user_data(b"sentence,label\ngood,1\nbad,0\n", extra=", text_columns: [text]"),
                       "column 'text' is missing"),
    "columns to guess": (user_data(b"review,title,label\ngood,a,1\nbad,b,0\n"),
                         "cannot tell which columns hold the text ('review', 'title'); set task.text_columns"),
    "non-utf8 data": (user_data(b"text,label\ngood,1\nb\xe4d,0\n"), "d.csv:3: not UTF-8 text"),
    "ragged row": (user_data(b"text,label\ngood,1\nbad,0,0\n"), "d.csv:3: expected 2 fields"),
    "label outside labels": (user_data(b"text,label\ngood,1\nbad,2\n", extra=", labels: [0, 1]"),
                             "d.csv:3: label '2' is not one of 0, 1"),
    "empty text": (user_data(b"text,label\ngood,1\n ,0\n"), "d.csv:3: column 'text' is empty"),
    "one label only": (user_data(b"text,label\ngood,1\nfine,1\n"), "has 1 distinct label(s)"),
    "bad json line": (user_data(b'{"text": "a", "label": 1}\n{"text": \n', "d.jsonl"), "d.jsonl:2: not valid JSON"),
    "json not a list": (user_data(b'{"text": "a", "label": 1}', "d.json"), "expected a JSON list of objects"),
    "regression label not a number": (user_data(b"text,label\na,1.5\nb,high\n", extra=", problem: regression"),
                                      "d.csv:3: label 'high' is not a number"),
    "glue dev empty": (glue_dev(b""), "dev.tsv: the file is empty"),
    "glue dev header only": (glue_dev(b"sentence\tlabel\n"), "dev.tsv: has no rows"),
    "glue dev non-utf8": (glue_dev(b"sentence\tlabel\nb\xe4d\t0\n"), "dev.tsv:2: not UTF-8 text (byte 0xe4)"),
    "glue unknown label": (glue_dev(b"sentence\tlabel\nok\t7\n"), "dev.tsv:2: label '7' is not one of 0, 1"),
    "checkpoint without weights": (checkpoint_folder({"config.json": json.dumps({"model_type": "bert"})}),
                                   "has no loadable weights"),
    "checkpoint with cut weights": (cut_weights, "a weights file is damaged (Error while deserializing header"),
    "checkpoint with broken config": (checkpoint_folder({"config.json": "{nope"}), "config.json is not valid JSON"),
    "tokenizer that does not match": (mismatched_tokenizer, "they do not belong together"),
    "tokenizer that does not match, warm-started": (mismatched_warm_start, "they do not belong together"),
    **{f"tokenizer: {d}": (damaged_tokenizer(d), "the tokenizer in " if d == "no tokenizer files" else
                           "model.checkpoint: no usable tokenizer in ") for d in TOKENIZER_DAMAGE},
    "runs dir is a file": (runs_dir_is_a_file, "--runs-dir: "),
    "corrupt metrics.json": (corrupt_metrics, "unreadable metrics.json"),
    "attention ignored by a warm start": (override("model.checkpoint=sentence-transformers/all-MiniLM-L6-v2",
                                                   "model.warm_start=encoder-decoder", "model.attention=local",
                                                   "task.name=summarization", "task.subset=samsum"),
                                          "model.attention: a warm-started encoder-decoder keeps"),
    "uncached hub id offline": (override("model.checkpoint=someone/not-here"), "cannot read the config of 'someone/not-here' off-line"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_clear_line(tmp_path: Path, cli, case: str) -> None:
    make, fragment = CASES[case]
    args = make(tmp_path)
    if args[0] == "run" and "--runs-dir" not in args:
        args += ["--runs-dir", tmp_path / "runs"]
    code, _, err = cli(*args)
    lines = [l for l in err.splitlines() if l.strip()]
    assert code == 2, err
    assert len(lines) == 1 and fragment in lines[0], err
    assert lines[0].startswith("error: ") or args[0] == "validate"
    assert not list(tmp_path.rglob("metrics.json")) or case == "corrupt metrics.json"


def test_crlf_line_ends_and_long_rows_are_read_not_refused(tmp_path: Path) -> None:
    from toolkit.tasks.text_classification import TextClassification

    path = tmp_path / "d.csv"
    path.write_bytes(b"text,label\r\ngood,pos\r\n" + b"very " * 2000 + b"long,neg\r\n")
    task = TextClassification(train_file=str(path), eval_file=str(path))
    data = task.load()
    assert task.label_names == ["neg", "pos"] and data["train"]["label"] == [1, 0]


def test_stop_after_must_be_positive(tmp_path: Path, cli) -> None:
    code, _, err = cli("run", write_recipe(tmp_path / "r.yaml", GOOD), "--stop-after", "0")
    assert code == 2 and "must be at least 1" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("damage", list(TOKENIZER_DAMAGE))
def test_a_tokenizer_the_libraries_refuse_or_build_empty_is_one_line_wherever_it_is_read(tmp_path: Path,
                                                                                         damage: str) -> None:
    """Rule: a checkpoint's tokenizer files that cannot give the model its text are one line,
    wherever a tokenizer is read (`models.load_tokenizer`: run, and a finished run's eval,
    predict and export read its saved copy through it). transformers 5 builds an empty tokenizer
    (special tokens alone) from a folder with none of its files, and a model saved without its
    tokenizer trained and scored on [UNK] alone, exit 0; the other damages were tracebacks."""
    from toolkit import models
    from toolkit.errors import UserError

    folder = _tokenizer_folder(tmp_path, damage)
    with pytest.raises(UserError) as caught:
        models.load_tokenizer(str(folder))
    assert TOKENIZER_DAMAGE[damage] in str(caught.value) and str(folder) in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


def _name_settings() -> list[tuple[str, str, bool]]:
    """(task, setting, is a list) for every task setting naming a column or a field of the data."""
    import dataclasses

    from toolkit.tasks import TASKS

    return [(name, f.name, "list[" in str(f.type)) for name in TASKS.names()
            for f in dataclasses.fields(TASKS.get(name)) if f.name.endswith(("_column", "_columns", "_field", "_fields"))]


NAME_SETTINGS = _name_settings()


@pytest.mark.parametrize("task, setting, listed", NAME_SETTINGS)
@pytest.mark.parametrize("given, said", [("1", "'1'"), ("2.5", "'2.5'"), ("true", "written quoted: 'true'")])
def test_a_column_name_that_yaml_reads_as_a_number_is_told_to_be_quoted(tmp_path: Path, cli, task, setting,
                                                                          listed, given, said) -> None:
    """A column or field named `1` (a CSV headed `id,1`), given unquoted in a recipe or an
    override, is read by YAML as a number: refused as 'expected str, got int 1' with no word of
    the quotes; now the line says to quote it, in the recipe and on the command line alike."""
    assert len(NAME_SETTINGS) >= 10
    value = f"[{given}]" if listed else given
    recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: bert-base-uncased}}\n"
                                               f"task: {{name: {task}, {setting}: {value}}}\nmethod: {{name: full}}\n")
    code, _, err = cli("validate", recipe)
    assert code == 2 and f"task.{setting}" in err and "expected str" in err and said in err, err
    bare = write_recipe(tmp_path / "bare.yaml", f"model: {{checkpoint: bert-base-uncased}}\ntask: {{name: {task}}}\n"
                                                "method: {name: full}\n")
    code, _, again = cli("validate", bare, f"task.{setting}={value}")
    assert code == 2 and said in again, again
