"""The `--smoke` small-model cache is keyed by what each small model is built from (the family and
the content of the checkpoint's config and tokenizer files), never by the checkpoint's name."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import SHARED, write_recipe
from toolkit import models

# family -> (shared tokenizer folder, a config field that differs between the two same-named folders)
FOLDERS = {"bert": ("bert-base-uncased", "bert"), "gpt2": ("gpt2", "gpt2"), "bart": ("bart-base", "bart"),
           "t5": ("t5", "t5"), "marian": ("bart-base", "marian")}


def _checkpoint(root: Path, family: str, extra_token: str | None) -> Path:
    """A local checkpoint folder named `my-model` under `root`: a config of the family and a real
    tokenizer, with one more token added where `extra_token` is given (a larger vocabulary)."""
    import transformers

    tokenizer, model_type = FOLDERS[family]
    folder = root / "my-model"
    tok = transformers.AutoTokenizer.from_pretrained(str(SHARED / "tokenizers" / tokenizer))
    if extra_token:
        tok.add_tokens([extra_token])
    tok.save_pretrained(folder)
    config = transformers.AutoConfig.for_model(model_type, vocab_size=len(tok))
    config.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", sorted(FOLDERS))
def test_two_folders_of_one_name_get_their_own_small_models(family: str, tmp_path: Path) -> None:
    """/a/my-model and /b/my-model, their tokenizers of another vocabulary size: the cache was
    keyed by family and folder name, so the second got the first's small model (its vocabulary
    and tokenizer), exit 0. The same folder again reuses its entry."""
    first = models.smoke_checkpoint(str(_checkpoint(tmp_path / "a", family, None)))
    second = models.smoke_checkpoint(str(_checkpoint(tmp_path / "b", family, "zzqxnewtoken")))
    assert first != second
    rows = [json.loads((Path(f) / "config.json").read_text())["vocab_size"] for f in (first, second)]
    assert rows[1] == rows[0] + 1
    assert len(models.load_tokenizer(second)) == len(models.load_tokenizer(first)) + 1
    stamp = (Path(first) / "config.json").stat().st_mtime_ns
    assert models.smoke_checkpoint(str(tmp_path / "a" / "my-model")) == first  # reused, not rebuilt
    assert (Path(first) / "config.json").stat().st_mtime_ns == stamp
    copy = tmp_path / "c" / "my-model"  # the same files elsewhere: the same small model
    shutil.copytree(tmp_path / "a" / "my-model", copy)
    assert models.smoke_checkpoint(str(copy)) == first


def test_a_changed_config_is_another_small_model(tmp_path: Path) -> None:
    """The checkpoint's own config names the token ids a small model of a family without a recipe
    of its own takes (Marian): a folder whose config changed is built again."""
    folder = _checkpoint(tmp_path, "marian", None)
    before = models.smoke_checkpoint(str(folder))
    config = json.loads((folder / "config.json").read_text())
    config["decoder_start_token_id"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    after = models.smoke_checkpoint(str(folder))
    assert after != before
    assert json.loads((Path(after) / "config.json").read_text())["decoder_start_token_id"] == 3


def test_two_processes_building_one_entry_leave_one_whole_folder(tmp_path: Path) -> None:
    """The entry is written to a temporary folder and renamed: a process that finds the entry
    written by another meanwhile keeps that one, and leaves no temporary folder behind."""
    folder = _checkpoint(tmp_path, "bert", None)
    built = Path(models.smoke_checkpoint(str(folder)))
    stamp = (built / "config.json").stat().st_mtime_ns
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    again = models._build_small(built, "bert", tok, transformers.AutoConfig.from_pretrained(str(folder)))
    assert again == str(built) and (built / "config.json").stat().st_mtime_ns == stamp
    assert not [p for p in built.parent.iterdir() if p.name.startswith(".")]


def test_a_build_that_fails_or_is_killed_leaves_no_folder_in_the_cache(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk (or Ctrl-C) while the small model was saved left its temporary folder in the
    cache, and so did a build killed by SIGKILL: a copy of the weights that nothing reads, there for
    good. A failed build removes its folder, and the next build of the entry removes those of
    builds whose process is gone (not those of a build still running)."""
    import errno
    import os
    import subprocess

    import transformers

    folder = _checkpoint(tmp_path, "bert", None)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    config = transformers.AutoConfig.from_pretrained(str(folder))
    target = tmp_path / "cache" / "smoke" / "bert-my-model-0123"
    target.parent.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    killed = target.parent / f".{target.name}-{gone.pid}-a1b2c3d4e5f6"  # what a SIGKILL left
    running = target.parent / f".{target.name}-{os.getpid()}-a1b2c3d4e5f6"  # a build in progress
    for left in (killed, running):
        left.mkdir()
        (left / "model.safetensors").write_bytes(b"half")

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full)
    with pytest.raises(OSError, match="No space left"):
        models._build_small(target, "bert", tok, config)
    assert sorted(p.name for p in target.parent.iterdir()) == [running.name]
    monkeypatch.undo()
    assert models._build_small(target, "bert", tok, config) == str(target)
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([running.name, target.name])


@pytest.mark.parametrize("name", ["locks", "smoke"])
def test_a_file_in_the_place_of_a_cache_folder_is_one_line(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                          name: str) -> None:
    """A file where $TOOLKIT_CACHE keeps its run locks or its small models was `error:
    .../locks: file exists`, which says neither what that folder is nor what to do."""
    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / name).write_text("the user's own")
    code, _, err = cli("run", "demo/sst2/minilm-lora", "train.max_steps=1", "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {tmp_path / 'cache' / name}: is a file, where the toolkit keeps ")
    assert "move it away" in err and not (tmp_path / "runs").exists()
    assert (tmp_path / "cache" / name).read_text() == "the user's own"


def test_a_cache_that_cannot_be_written_is_one_line_naming_it(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """$TOOLKIT_CACHE where nothing can be made (a read-only home, /proc): `predict`, which writes
    nothing but takes the run's lock there, said "/proc: this folder takes no new files ...; write
    elsewhere (--runs-dir, --output, --out, export's OUT)", options that do not move the cache."""
    if not Path("/proc/sys").is_dir():
        pytest.skip("no /proc here")
    monkeypatch.setenv("TOOLKIT_CACHE", "/proc/sys/toolkit-test")
    code, _, err = cli("run", "demo/sst2/minilm-lora", "train.max_steps=1", "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: /proc/sys/toolkit-test/") and "set TOOLKIT_CACHE to a folder this process can write" in err
    assert not (tmp_path / "runs").exists()


def test_the_shared_tokenizer_entry_is_keyed_by_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint off-line without its files borrows the shared tokenizer of its kind: another
    TOOLKIT_TOKENIZERS folder whose bert-base-uncased holds another vocabulary is another model."""
    first = models.smoke_checkpoint("bert-base-uncased")
    other = tmp_path / "tokenizers"
    shutil.copytree(SHARED / "tokenizers" / "bert-base-uncased", other / "bert-base-uncased")
    with open(other / "bert-base-uncased" / "vocab.txt", "a") as handle:
        handle.write("zzqxnewtoken\n")
    for name in ("tokenizer.json",):
        (other / "bert-base-uncased" / name).unlink(missing_ok=True)
    monkeypatch.setenv("TOOLKIT_TOKENIZERS", str(other))
    second = models.smoke_checkpoint("bert-base-uncased")
    assert second != first
    rows = [json.loads((Path(f) / "config.json").read_text())["vocab_size"] for f in (first, second)]
    assert rows[1] == rows[0] + 1


def test_a_smoke_run_trains_the_small_model_of_its_own_folder(tmp_path: Path, cli) -> None:
    """Through `toolkit run --smoke`: the run of /b/my-model saves a model of its own vocabulary."""
    recipe = """
model: {{checkpoint: {checkpoint}}}
task: {{name: glue, subset: sst2}}
method: {{name: full}}
train: {{epochs: 1}}
"""
    sizes = []
    for where, extra in (("a", None), ("b", "zzqxnewtoken")):
        folder = _checkpoint(tmp_path / where, "bert", extra)
        path = write_recipe(tmp_path / where / "r.yaml", recipe.format(checkpoint=folder))
        code, _, err = cli("run", path, "--smoke", "--runs-dir", tmp_path / where / "runs")
        assert code == 0, err
        saved = next((tmp_path / where / "runs").rglob("model/config.json"))
        sizes.append(json.loads(saved.read_text())["vocab_size"])
    assert sizes[1] == sizes[0] + 1


def test_a_smoke_run_is_scored_only_on_the_small_model_it_trained_on(tmp_path: Path, cli,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A smoke LoRA run's result is loaded onto the small random model `--smoke` builds again; the
    cache key holds the transformers version, and another version (or toolkit) may build that
    model otherwise: eval, predict and export loaded the result onto the new one and scored it as
    the run's, exit 0. The run records its small base's files (metrics.json base_files): built
    alike (another version, the same bytes) it is scored as before; built otherwise, one line."""
    import sys

    import toolkit

    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path / "cache"))
    run = toolkit.run("demo/sst2/minilm-lora", ["task.max_train_samples=8", "task.max_eval_samples=8",
                                                "train.max_steps=1"], runs_dir=tmp_path / "runs", smoke=True)
    assert json.loads((run.dir / "metrics.json").read_text())["base_files"]
    code, _, err = cli("eval", run.dir)
    assert code == 0, err
    scores = json.loads((run.dir / "eval-eval.json").read_text())["eval"]
    transformers = sys.modules["transformers"]  # (the module object a build left there)
    monkeypatch.setattr(transformers, "__version__", "99.0.0")  # another key: built again, alike
    code, _, err = cli("eval", run.dir)
    assert code == 0, err
    assert json.loads((run.dir / "eval-eval.json").read_text())["eval"] == scores
    assert len(list((tmp_path / "cache" / "smoke").iterdir())) == 2
    tiny = models._tiny_config

    def otherwise(*args, **kwargs):  # a version whose small model starts from other weights
        config = tiny(*args, **kwargs)
        config.initializer_range = 0.5
        return config

    monkeypatch.setattr(transformers, "__version__", "99.1.0")
    monkeypatch.setattr(models, "_tiny_config", otherwise)
    said = (r"a --smoke run, whose result is loaded onto the small random model it trained on; this toolkit and "
            r"transformers 99.1.0 build that model otherwise \((config.json|model.safetensors) differs; the run was made under "
            r"transformers \S+\), .*run the recipe again with --smoke --force")
    for command in (["eval", run.dir], ["export", run.dir, tmp_path / "export"]):
        code, _, err = cli(*command)
        assert code == 2 and re.search(said, err), err
    with pytest.raises(toolkit.UserError, match=said):
        toolkit.predict(run.dir, ["a fine film"])
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize("umask, mode", [(0o002, 0o775), (0o077, 0o700)])
def test_cache_folders_follow_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask: int, mode: int) -> None:
    """A TOOLKIT_CACHE a group shares (umask 002): the smoke entry was 0700 (tempfile.mkdtemp,
    renamed), unreadable to the others, whose --smoke runs stopped on a PermissionError. Every
    folder the toolkit makes in its cache is made as the umask says, as the Hub cache's are; the
    parity harness's random GPT-2 entry too (it was mkdtemp's 0700 with 0600 weights)."""
    import os

    from toolkit import runs

    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from parity.common import random_gpt2

    old = os.umask(umask)
    try:
        entry = Path(models.smoke_checkpoint("bert-base-uncased"))
        gpt2 = Path(random_gpt2(smoke=True))
        lock = runs._lock_file(tmp_path / "run")
    finally:
        os.umask(old)
    for folder in (tmp_path / "cache", entry.parent, entry, lock.parent, gpt2.parent, gpt2):
        assert folder.stat().st_mode & 0o777 == mode, folder
    for folder in (entry, gpt2):
        assert all(f.stat().st_mode & 0o777 == mode & 0o666 for f in folder.iterdir()), folder
    assert [f.name for f in gpt2.parent.iterdir()] == [gpt2.name]  # no temporary folder left


def _built_otherwise(monkeypatch: pytest.MonkeyPatch, version: str, alike: bool) -> None:
    """Another transformers version (another smoke cache key) whose small models are built alike
    (the same bytes) or otherwise (from other initial weights)."""
    import sys

    transformers = sys.modules["transformers"]  # (the module object a build left there)
    monkeypatch.setattr(transformers, "__version__", version)
    if not alike:
        tiny = models._tiny_config

        def otherwise(*args, **kwargs):
            config = tiny(*args, **kwargs)
            config.initializer_range = 0.5
            return config

        monkeypatch.setattr(models, "_tiny_config", otherwise)


@pytest.mark.parametrize("recipe", ["demo/sst2/minilm-lora", "demo/sst2/minilm-full"])
def test_a_smoke_run_resumes_only_on_the_small_model_it_trained_on(tmp_path: Path, cli, recipe: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A smoke run's checkpoint goes on from the small random model `--smoke` builds; resumed under
    another transformers that builds it otherwise, the run went on training another model (a LoRA
    run: other frozen weights; a full run: another config) under the same run id, only noted as a
    resume under other code, exit 0. As eval/predict/export: built alike, it resumes; built
    otherwise, one line, exit 2, and the checkpoint is left as it was."""
    import toolkit

    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path / "cache"))
    args = [recipe, "task.max_train_samples=8", "task.max_eval_samples=8", "train.max_steps=2",
            "--smoke", "--runs-dir", tmp_path / "runs"]
    code, _, err = cli("run", *args, "--stop-after", "1")
    assert code == 0, err
    out = next(p.parent for p in (tmp_path / "runs").rglob("identity.json"))
    saved = sorted(p.name for p in out.rglob("*") if p.is_file())
    with monkeypatch.context() as patched:
        _built_otherwise(patched, "99.1.0", alike=False)
        said = (r"a --smoke run, whose checkpoint of step 1 goes on from the small random model it trained on; this "
                r"toolkit and transformers 99.1.0 build that model otherwise \((config.json|model.safetensors) "
                r"differs; the checkpoint was written under transformers \S+\), .*run the recipe again with "
                r"--smoke --force")
        code, _, err = cli("run", *args, "--resume")
        assert code == 2 and re.search(said, err), err
        assert len(err.strip().splitlines()) == 1, err  # said before 'resuming from', no note beside it
        with pytest.raises(toolkit.UserError, match=said):
            toolkit.run(recipe, args[1:4], runs_dir=tmp_path / "runs", smoke=True, resume=True)
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == saved
    with monkeypatch.context() as patched:
        _built_otherwise(patched, "99.0.0", alike=True)
        code, said_out, err = cli("run", *args, "--resume")
        assert code == 0 and "resuming from" in said_out, err
    assert (out / "metrics.json").is_file()


def test_a_chains_smoke_upstream_resumes_only_on_the_small_model_it_trained_on(tmp_path: Path, cli,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`run --smoke` of a chained recipe first finishes the smoke run of its upstream, resuming it
    where it stopped: built otherwise under another transformers, that resume is the one line too,
    and nothing of the chained run is made."""
    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path / "cache"))
    upstream = "recipes/pretrain/wikitext-2/minilm-mlm.yaml"
    code, _, err = cli("run", upstream, "--smoke", "--runs-dir", tmp_path / "runs", "--stop-after", "1")
    assert code == 0, err
    made = sorted(p.parent for p in (tmp_path / "runs").rglob("identity.json"))
    _built_otherwise(monkeypatch, "99.1.0", alike=False)
    code, _, err = cli("run", "demo/sst2/minilm-full-from-wikitext", "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and re.search(r"a --smoke run, whose checkpoint of step 1 goes on from the small random model "
                                   r"it trained on; this toolkit and transformers 99.1.0 build that model otherwise",
                                   err), err
    assert sorted(p.parent for p in (tmp_path / "runs").rglob("identity.json")) == made


@pytest.mark.parametrize("umask", [0o002, 0o077])
def test_run_checkpoint_and_export_files_follow_the_umask(tmp_path: Path, cli, umask: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A runs folder a group shares (umask 002): every *.safetensors a run, its checkpoints and its
    exports hold was 0600 (safetensors' writer, whatever the umask), the JSON beside them 0664, and
    a teammate's `toolkit eval` stopped on a PermissionError. Every file and folder the toolkit
    writes there is made as the umask says (077: private, as asked)."""
    import os

    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path / "cache"))
    old = os.umask(umask)
    try:
        code, _, err = cli("run", "demo/sst2/minilm-lora", "task.max_train_samples=8", "task.max_eval_samples=8",
                           "train.max_steps=1", "train.keep_checkpoints=true", "--smoke",
                           "--runs-dir", tmp_path / "runs")
        assert code == 0, err
        run = next(p.parent for p in (tmp_path / "runs").rglob("identity.json"))
        for merge in ([], ["--merge"]):
            code, _, err = cli("export", run, tmp_path / f"export{'-'.join(merge)}", *merge)
            assert code == 0, err
    finally:
        os.umask(old)
    made = [p for where in ("runs", "export", "export--merge") for p in (tmp_path / where).rglob("*")]
    assert any(p.name == "model.safetensors" and "checkpoints" in p.parts for p in made)
    assert {p.name for p in made} >= {"adapter_model.safetensors", "model.safetensors", "metrics.json"}
    wrong = [f"{oct(p.stat().st_mode & 0o777)} {p}" for p in made
             if p.stat().st_mode & 0o777 != (0o777 if p.is_dir() else 0o666) & ~umask]
    assert not wrong, wrong


def test_a_base_config_saved_again_by_another_transformers_is_the_same_base(tmp_path: Path) -> None:
    """Finding: a base's record held config.json's bytes, and transformers stamps its own version
    into every config it saves: a --smoke run's small model, rebuilt after an upgrade with the same
    settings and weights, was refused by eval, predict, export and resume as another model. A
    config is its JSON content without `transformers_version`; any other change is still one."""
    import json
    import os

    from toolkit import runs

    folder = tmp_path / "base"
    folder.mkdir()
    config = {"model_type": "bert", "hidden_size": 32, "transformers_version": "5.24.0"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"weights")
    record = runs.base_record(str(folder), ("config.json", "*.safetensors"))

    def rewrite(**change: object) -> None:
        (folder / "config.json").write_text(json.dumps({**config, **change}, indent=1))
        os.utime(folder / "config.json", ns=(1, 1))

    rewrite(transformers_version="5.30.0")
    assert runs.base_changed(record, str(folder)) is None
    rewrite(transformers_version="5.30.0", hidden_size=64)
    assert runs.base_changed(record, str(folder)) == folder / "config.json"
    # a record made before (config.json by its bytes) still passes the same bytes written anew
    (folder / "config.json").write_text(json.dumps(config))
    old = runs.base_record(str(folder), ("config.json", "*.safetensors"))
    old["files"]["config.json"][2] = runs.data_fingerprint([folder / "config.json"])
    os.utime(folder / "config.json", ns=(2, 2))
    assert runs.base_changed(old, str(folder)) is None


def test_a_smoke_run_of_an_xlnet_checkpoint_keeps_its_head_size_and_trains_its_head(tmp_path: Path, cli) -> None:
    """The small model of a family without a recipe of its own is its defaults shrunk: XLNet's
    d_head stayed 64 beside d_model 32 over 2 heads, and every --smoke run of an XLNet checkpoint
    stopped on a traceback from its config's check (d_head == d_model // n_head). A per-head size
    the family derives from its width now stays derived; and XLNet's sequence head
    (sequence_summary, logits_proj) is a task head, re-initialised on load as every task head is."""
    import transformers

    folder = tmp_path / "xlnet"
    tok = transformers.AutoTokenizer.from_pretrained(str(SHARED / "tokenizers" / "bert-base-uncased"))
    tok.save_pretrained(folder)
    transformers.AutoConfig.for_model("xlnet", vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                      bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id).save_pretrained(folder)
    small = json.loads((Path(models.smoke_checkpoint(str(folder))) / "config.json").read_text())
    assert small["d_head"] * small["n_head"] == small["d_model"] == 32
    path = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {folder}}}\ntask: {{name: glue, subset: sst2}}\n"
                                             "method: {name: full}\ntrain: {epochs: 1}\n")
    code, out, err = cli("run", path, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    assert re.search(r"accuracy=\d", out + err)
