"""Issue 37 rule 7: one line, never a traceback, for user-caused failures that used to trace back
(the label column read as text is in test_startup.py, said before any import; metrics.json of
the wrong types and `report --out FILE` are in test_report.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

import toolkit
from toolkit import runs


def test_two_exports_to_one_target_at_once(tmp_path: Path, cli) -> None:
    """The second export to a place another export is writing is refused (the run lock)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text("model: {checkpoint: x}\n")
    target = tmp_path / "export"
    with runs.locked(target):  # an export in progress holds this
        code, _, err = cli("export", str(run), str(target))
        assert code == 2 and err.count("\n") == 1
        assert f"export: {target} is being written by another export right now" in err
        with pytest.raises(toolkit.UserError, match="is being written by another export right now"):
            toolkit.export(run, target)
    assert not target.exists()


def test_weights_torch_refuses_are_named(tmp_path: Path, tiny_checkpoint) -> None:
    """A model folder whose pytorch_model.bin pickles more than tensors: one line naming it."""
    import torch

    from toolkit import heads, models

    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("bert"), folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": _Unpicklable()}, folder / "pytorch_model.bin")
    with pytest.raises(toolkit.UserError, match=rf"^model.checkpoint: {folder}/pytorch_model.bin: torch refuses "
                       r"to load it \(.+\); save the model as safetensors"):
        models.load(str(folder), heads.SEQUENCE_CLASSIFICATION, {"num_labels": 2})


class _Unpicklable:
    """An object torch's weights-only loader will not rebuild."""

    def __reduce__(self):
        return (dict, ())


# --- what the environment and the task's settings name: folders and files that are there ---------
def _task_file_settings() -> list[tuple[str, str]]:
    import dataclasses

    from toolkit.tasks import TASKS

    return [(name, f.name) for name in TASKS.names() for f in dataclasses.fields(TASKS.get(name))
            if f.name.endswith("_file")]


@pytest.mark.parametrize("task, setting", _task_file_settings())
def test_every_file_a_task_names_is_checked_before_the_run(tmp_path: Path, task: str, setting: str) -> None:
    """`toolkit validate` said "valid" for an NER, SQuAD, summarization or LM recipe whose data
    file was not there (only tasks with columns to check looked): the run then failed after torch
    and the model loaded. Every `*_file` setting of every registered task is checked as written."""
    from types import SimpleNamespace

    from toolkit import recipe as recipes
    from toolkit.schema import build_dataclass
    from toolkit.tasks import TASKS

    missing, folder, fifo = tmp_path / "nowhere.jsonl", tmp_path, tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)  # a pipe gives its bytes once; a run reads its data twice (run id, then training)
    for path, said in ((missing, "no such file"), (folder, "is not a file"),
                       (fifo, r"is a pipe, not a file; a run reads its data more than once .*save it to a file and name that")):
        settings = build_dataclass(TASKS.get(task), {setting: str(path)}, "task")
        with pytest.raises(toolkit.UserError, match=f"^task.{setting}: {path}: {said}$"):
            recipes.check_data(SimpleNamespace(task=settings))


def test_a_pipe_named_as_a_recipes_data_file_is_one_line_at_every_check(tmp_path: Path) -> None:
    """`toolkit run demo/own-data/minilm-lora task.train_file=<(zcat d.csv.gz)` said "/dev/fd/63
    does not exist" (the task's own check at load); a pipe is refused by the recipe's every file
    check in one line that says why (its bytes are read more than once), where predict --input
    reads one. The load-time check of every registered task is the test above."""
    from toolkit import recipe as recipes

    fifo, data = tmp_path / "pipe.csv", tmp_path / "d.csv"
    os.mkfifo(fifo)
    data.write_text("sentence,kind\na film,x\nanother,y\n")
    with pytest.raises(toolkit.UserError, match=f"^task.train_file: {fifo}: is a pipe, not a file; a run reads"):
        recipes.load(recipes.find_recipe("demo/own-data/minilm-lora"),
                     [f"task.train_file={fifo}", f"task.eval_file={data}"])


ENV_CASES = [("TOOLKIT_DATA", "file", "is a file; set it to a folder of data sets"),
             ("TOOLKIT_DATA", "nowhere", "does not exist; set it to a folder of data sets"),
             ("TOOLKIT_TOKENIZERS", "nowhere", "does not exist; set it to a folder of tokenizers"),
             ("TOOLKIT_CACHE", "file", "is a file; set it to a folder the toolkit may write"),
             ("TOOLKIT_RUNS", "file", "is a file; set it to a folder of runs")]


@pytest.mark.parametrize("variable, kind, said", ENV_CASES)
def test_a_toolkit_folder_variable_naming_no_folder_is_one_line_everywhere(
        tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, variable: str, kind: str, said: str) -> None:
    """TOOLKIT_CACHE set to a file crashed `toolkit run` with NotADirectoryError (the run lock),
    and TOOLKIT_DATA set to no folder validated as fine. Every entry point says the one line
    before anything runs: run, validate, sweep, eval, predict, export, and the Python API."""
    from conftest import ROOT

    target = tmp_path / "a-file" if kind == "file" else tmp_path / "nowhere"
    if kind == "file":
        target.write_text("x\n")
    monkeypatch.setenv(variable, str(target))
    recipe, runs_dir = ROOT / "recipes/demo/sst2/minilm-lora.yaml", tmp_path / "runs"
    run = tmp_path / "run"  # a run folder as far as eval/predict/export read it first
    run.mkdir()
    (run / "recipe.yaml").write_text("model: {checkpoint: x}\n")
    line = f"error: {variable}: {target} {said}"
    for command in (["run", recipe, "--runs-dir", runs_dir], ["validate", recipe],
                    ["sweep", recipe, "--dry-run", "--runs-dir", runs_dir], ["eval", run],
                    ["predict", run, "--input", recipe], ["export", run, tmp_path / "out"]):
        code, _, err = cli(*command)
        assert code == 2 and err.splitlines()[0].startswith(line) and err.count("\n") == 1, (command, err)
    for call in (lambda: toolkit.run(recipe, runs_dir=runs_dir), lambda: toolkit.sweep([recipe], runs_dir=runs_dir),
                 lambda: toolkit.evaluate(run), lambda: toolkit.predict(run, ["a"]),
                 lambda: toolkit.export(run, tmp_path / "out")):
        with pytest.raises(toolkit.UserError, match=f"^{variable}: "):
            call()
    assert not runs_dir.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["runs_dir", "report_out"])
def test_a_file_where_a_folder_goes_is_the_same_line_from_the_cli_and_the_api(tmp_path: Path, cli, where: str) -> None:
    """A file on the way to a folder the toolkit writes: the CLI said one line, the Python API
    raised a bare NotADirectoryError (report) or started the run (runs_dir under a file). Both say
    the same line now, before anything is written."""
    from conftest import ROOT
    from test_report import fake_run

    blocker = tmp_path / "notes.txt"
    blocker.write_text("x\n")
    recipe, place = ROOT / "recipes/demo/sst2/minilm-lora.yaml", blocker / "sub"
    if where == "runs_dir":
        line = f"--runs-dir: {blocker} is a file, not a folder (in {place})"
        calls = [(["run", recipe, "--runs-dir", place], lambda: toolkit.run(recipe, runs_dir=place)),
                 (["sweep", recipe, "--runs-dir", place], lambda: toolkit.sweep([recipe], runs_dir=place))]
    else:
        fake_run(tmp_path / "runs", "sst2", "lora", 42, {"accuracy": 0.8})
        line = (f"report: --out {place}: {blocker} is a file, not a folder, so {place} cannot be made under it; "
                "give a path under a folder")  # it said "{place}: not a directory", naming the folder, not the file
        calls = [(["report", tmp_path / "runs", "--out", place, "--no-plots"],
                  lambda: toolkit.report([tmp_path / "runs"], out=place))]
    for command, call in calls:
        code, _, err = cli(*command)
        assert code == 2 and err == f"error: {line}\n", (command, err)
        with pytest.raises(toolkit.UserError) as caught:
            call()
        assert str(caught.value) == line
    assert blocker.read_text() == "x\n"


NOT_UTF8 = "d\udcffir"  # the byte 0xff in a file name, as Python keeps it (a lone surrogate)


def _not_utf8_cases(tmp_path: Path, place: str, model: str) -> tuple[str, list, list]:
    """(what the line names, CLI commands, API calls) that meet a path holding bytes that are not
    UTF-8 at `place`."""
    from conftest import ROOT

    recipe, runs_dir, odd = ROOT / "recipes/demo/sst2/minilm-lora.yaml", tmp_path / "runs", tmp_path / NOT_UTF8
    run = tmp_path / "run"  # a run folder as far as eval/predict/export read it first
    run.mkdir()
    (run / "recipe.yaml").write_text("model: {checkpoint: x}\n")
    if place == "run folder":
        run = Path(shutil.copytree(run, odd / "run"))
        odd = run
    if place in ("export", "--runs-dir", "run folder"):
        out = odd if place == "export" else tmp_path / "out"
        runs_dir = odd if place == "--runs-dir" else runs_dir
        cli_calls = {"export": [["export", run, out]], "--runs-dir": [["run", recipe, "--runs-dir", runs_dir],
                                                                       ["sweep", recipe, "--runs-dir", runs_dir]],
                     "run folder": [["eval", run], ["predict", run, "--input", recipe], ["export", run, out]]}[place]
        api_calls = {"export": [lambda: toolkit.export(run, out)],
                     "--runs-dir": [lambda: toolkit.run(recipe, runs_dir=runs_dir),
                                    lambda: toolkit.sweep([recipe], runs_dir=runs_dir)],
                     "run folder": [lambda: toolkit.evaluate(run), lambda: toolkit.predict(run, ["a"]),
                                    lambda: toolkit.export(run, out)]}[place]
        return ascii(str(odd)), cli_calls, api_calls
    shutil.copytree(model, odd)  # model.checkpoint: a real model folder under that name
    over = [f"model.checkpoint={json.dumps(str(odd), ensure_ascii=True)}"]  # YAML reads the \\udcff escape
    return ascii(str(odd)), [["validate", recipe, *over], ["run", recipe, *over, "--runs-dir", runs_dir],
                             ["sweep", recipe, *over, "--runs-dir", runs_dir]], \
        [lambda: toolkit.run(recipe, {"model.checkpoint": str(odd)}, runs_dir=runs_dir),
         lambda: toolkit.sweep([recipe], [f"model.checkpoint={json.dumps(str(odd))}"], runs_dir=runs_dir)]


@pytest.mark.parametrize("place", ["TOOLKIT_DATA", "TOOLKIT_TOKENIZERS", "TOOLKIT_CACHE", "TOOLKIT_RUNS",
                                   "--runs-dir", "model.checkpoint", "export", "run folder"])
def test_a_path_with_bytes_that_are_not_utf8_is_one_line_everywhere(tmp_path: Path, cli, capsys, tiny_checkpoint,
                                                                     monkeypatch: pytest.MonkeyPatch, place: str) -> None:
    """A runs folder whose name held the byte 0xff trained a whole run, then crashed with a
    UnicodeEncodeError saving the tokenizer (tokenizers writes through Rust, UTF-8 only), after
    the lock had crashed the same way. Every path the libraries read or write (the TOOLKIT_*
    folders, --runs-dir, a local model.checkpoint, an export's target, a run folder) is one line
    now, at every entry point, before anything is written."""
    if place.startswith("TOOLKIT_"):
        from conftest import ROOT

        odd = tmp_path / NOT_UTF8
        odd.mkdir()
        monkeypatch.setenv(place, str(odd))
        recipe, run = ROOT / "recipes/demo/sst2/minilm-lora.yaml", tmp_path / "run"
        run.mkdir()
        (run / "recipe.yaml").write_text("model: {checkpoint: x}\n")
        named = ascii(str(odd))
        commands = [["run", recipe, "--runs-dir", tmp_path / "runs"], ["validate", recipe],
                    ["sweep", recipe, "--dry-run", "--runs-dir", tmp_path / "runs"], ["eval", run],
                    ["predict", run, "--input", recipe], ["export", run, tmp_path / "out"]]
        calls = [lambda: toolkit.run(recipe, runs_dir=tmp_path / "runs"), lambda: toolkit.evaluate(run),
                 lambda: toolkit.predict(run, ["a"]), lambda: toolkit.export(run, tmp_path / "out")]
    else:
        named, commands, calls = _not_utf8_cases(tmp_path, place, tiny_checkpoint("bert"))
        capsys.readouterr()  # the tiny model's build, where this test builds it first
    said = f"{named} holds bytes that are not UTF-8"
    for command in commands:
        code, _, err = cli(*command)
        assert code == 2 and said in err and err.startswith("error: ") and err.count("\n") == 1, (command, err)
    for call in calls:
        with pytest.raises(toolkit.UserError, match=re.escape(said)):
            call()
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
    assert place not in ("--runs-dir", "export") or not (tmp_path / NOT_UTF8).exists()


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_eval_of_a_run_folder_it_cannot_write_is_one_line_before_it_runs(tmp_path: Path, cli, entry: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`toolkit eval` writes eval-<split>.json into the run folder: on a shared, read-only runs
    folder it evaluated the whole split and then failed writing (permission denied), the scores
    lost. It is said first now, before anything loads."""
    import os

    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text("model: {checkpoint: x}\n")
    (run / "metrics.json").write_text("{}\n")
    real = os.access  # what a read-only folder answers (as root, chmod alone does not stop writes)
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == run else real(p, mode, **kw))
    said = f"{run}: eval writes eval-test.json (and the predictions) into the run folder, which cannot be written here"
    if entry == "cli":
        code, _, err = cli("eval", run, "--split", "test")
        assert code == 2 and err.startswith(f"error: {said}") and err.count("\n") == 1, err
    else:
        with pytest.raises(toolkit.UserError, match=re.escape(said)):
            toolkit.evaluate(run, "test")


def test_an_output_in_a_folder_that_takes_no_new_files_is_one_line_from_every_writer(tmp_path: Path, cli) -> None:
    """Finding: `report --out /proc/x` (a folder that exists and makes nothing new: ENOENT, not
    EACCES) was a FileNotFoundError traceback, as were export OUT, predict --output and
    --runs-dir there. Each writer, from the CLI and the API, says one line naming the folder; a
    file that is missing where it is read stays what it was."""
    from conftest import ROOT

    place = Path("/proc/toolkit-test-x")
    if not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    line = ("/proc: this folder takes no new files or folders (making one there said 'no such file or directory'); "
            "write elsewhere (--runs-dir, --output, --out, export's OUT)")
    recipe, runs_dir = ROOT / "recipes/demo/sst2/minilm-lora.yaml", tmp_path / "runs"
    code, out, err = cli("run", recipe, "--smoke", "--runs-dir", runs_dir)
    assert code == 0, err
    run = next(p.parent for p in runs_dir.rglob("metrics.json"))
    given = tmp_path / "in.jsonl"
    given.write_text('{"sentence": "a fine film"}\n')
    calls = [(["report", runs_dir, "--out", place, "--no-plots"], lambda: toolkit.report([runs_dir], out=place)),
             (["export", run, place], lambda: toolkit.export(run, place)),
             (["predict", run, "--input", given, "--output", place], None),
             (["run", recipe, "--smoke", "--runs-dir", place / "runs"],
              lambda: toolkit.run(recipe, runs_dir=place / "runs", smoke=True))]
    for command, call in calls:
        code, _, err = cli(*command)
        assert code == 2 and err == f"error: {line}\n", (command, err)
        if call is not None:
            with pytest.raises(toolkit.UserError) as caught:
                call()
            assert str(caught.value) == line
    from toolkit.api import _unwritable

    missing = tmp_path / "gone.txt"
    with pytest.raises(FileNotFoundError) as read:
        missing.read_text()
    assert not _unwritable(read.value)  # a read of a missing file: not the place's
    assert not list(tmp_path.glob(".toolkit-probe-*"))


TINY_CONFIGS = {  # families whose configs lack attributes BERT's and GPT-2's have (RWKV: pad_token_id)
    "rwkv": ("RwkvConfig", dict(hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                                intermediate_size=64, context_length=64)),
    "mamba": ("MambaConfig", dict(hidden_size=32, num_hidden_layers=1, state_size=4)),
    "opt": ("OPTConfig", dict(hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=2,
                              word_embed_proj_dim=32, max_position_embeddings=64)),
    "llama": ("LlamaConfig", dict(hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)),
}


@pytest.fixture(scope="module")
def tiny_families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """family -> folder of a one-layer random causal LM of it, with GPT-2's tokenizer."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(Path(os.environ["TOOLKIT_TOKENIZERS"]) / "gpt2")
    folders = {}
    for family, (name, sizes) in TINY_CONFIGS.items():
        folder = tmp_path_factory.mktemp(family)
        config = getattr(transformers, name)(vocab_size=len(tok), **sizes)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
        tok.save_pretrained(folder)
        folders[family] = str(folder)
    return folders


@pytest.mark.parametrize("head", ["causal-lm", "sequence-classification"])
@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_a_config_without_an_attribute_others_have_loads_or_is_one_line(tiny_families, family: str,
                                                                        head: str) -> None:
    """Finding: `models.load` read `config.pad_token_id`, which RWKV's config does not have (an
    AttributeError traceback); a family without the head (Mamba, RWKV: no sequence classifier)
    was transformers' ValueError listing every config class. Each loads, or is one line naming
    the family and the head."""
    from toolkit import models

    kwargs = {"num_labels": 2} if head == "sequence-classification" else {}
    try:
        model, _ = models.load(tiny_families[family], head, kwargs, dropout=0.1)
    except toolkit.UserError as exc:
        assert "\n" not in str(exc) and f"is a {family} model" in str(exc) and head in str(exc), exc
        assert (family, head) in {("rwkv", "sequence-classification"), ("mamba", "sequence-classification")}
    else:
        assert model.config.model_type == family and model.config.pad_token_id is not None
