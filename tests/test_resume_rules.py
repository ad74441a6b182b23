"""Exact resume, by rule (docs/reliability.md, "Exact resume"): for every registered task, a run
stopped and resumed ends where the uninterrupted run ends, bit for bit on CPU fp32: the loss
trace, the evaluations, the weights, the predictions. One shipped recipe per task (--smoke: the
small random model of its family, with dropout on), and between them every method family.

The stop lands after an accumulation window that ends an epoch early (3 micro-batches an epoch,
2 a step), one step into the next epoch, after an evaluation moved the best-checkpoint and
early-stopping bookkeeping; the data-side draws (masks, noise, order) and dropout must continue
as if nothing had stopped. The resumed run is then interrupted while it finishes (after model/,
before metrics.json): the rerun, from the final checkpoint, must still write every file the
uninterrupted run wrote (the predictions were lost: they were only in memory).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from test_train import weights

# task -> (shipped recipe, method override or None for the recipe's own). Every registered task
# has a row (a new task without one fails below), and each method family appears at least once.
RESUMES = {
    "glue": ("glue/stsb/bert-base-uncased-full.yaml", None),  # regression
    "text_classification": ("demo/own-data/minilm-full.yaml", "{name: adapters, config: pfeiffer}"),
    "ner": ("ner/conll2003/minilm-lora.yaml", None),
    "squad": ("squad/v1.1/roberta-base-full.yaml", "{name: prompt_tuning, num_virtual_tokens: 4}"),
    "summarization": ("summarization/samsum/t5-base-lora.yaml", None),
    "translation": ("translation/multi30k/bart-base-full.yaml", "{name: prefix_tuning, num_virtual_tokens: 4}"),
    "clm": ("pretrain/wikitext-2/gpt2-clm.yaml", "{name: lora, r: 4}"),
    "mlm": ("pretrain/wikitext-2/roberta-base-mlm.yaml", None),
    "denoise": ("pretrain/wikitext-2/bart-base-denoise.yaml", None),
    "span_corruption": ("pretrain/wikitext-2/t5-base-span_corruption.yaml", "{name: adapters, config: houlsby}"),
}
# 3 micro-batches an epoch, 2 a step: steps 2 and 4 end an epoch on a window of one; evaluations at
# 2 and 4; the stop after step 3 is one window into the second epoch, after the best moved.
# Pretraining tasks read a small text file of their own (WikiText-2 takes seconds to pack).
COMMON = ["--smoke", "model.dropout=0.1", "task.max_train_samples=12", "task.max_eval_samples=6",
          "train.batch_size=4", "train.grad_accum=2", "train.max_steps=4", "train.eval_every=2",
          "train.log_every=1", "train.keep_best=true", "train.warmup_steps=1", "train.warmup_ratio=0"]
STOP = 3


def test_every_task_has_a_resume_row() -> None:
    from toolkit.tasks import TASKS

    assert set(TASKS.names()) == set(RESUMES)


def _only(root: Path) -> Path:
    found = [p.parent for p in root.rglob("recipe.yaml")]
    assert len(found) == 1, found
    return found[0]


def _log(run: Path) -> list[dict]:
    """log.jsonl without the wall-clock fields."""
    clock = ("samples_per_second", "eval_runtime_s")
    return [{k: v for k, v in json.loads(line).items() if k not in clock}
            for line in (run / "log.jsonl").read_text().splitlines()]


def _same_run(a: Path, b: Path) -> None:
    assert _log(a) == _log(b)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []
    # the rest of model/ too, byte for byte: its tokenizer.json held the truncation and padding the
    # last tokenizer call left (the uninterrupted run encoded its data, the resumed one read the
    # encodings from the datasets cache), not the base's (models.save_tokenizer)
    saved = _model_files(a)
    assert saved == _model_files(b)
    assert [f for f in saved if (a / "model" / f).read_bytes() != (b / "model" / f).read_bytes()] == []
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    for key in ("eval", "train_steps", "best_step", "epochs", "train_loss"):
        assert ma.get(key) == mb.get(key), key
    assert ma["train_loss"] is not None  # the mean over the whole run's steps, those before the stop too
    files = sorted(p.name for p in a.glob("predictions*"))
    assert files == sorted(p.name for p in b.glob("predictions*"))
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def _model_files(run: Path) -> list[str]:
    """model/'s files but the weights (compared as tensors), by their path inside it."""
    return sorted(str(p.relative_to(run / "model")) for p in (run / "model").rglob("*")
                  if p.is_file() and p.suffix != ".safetensors")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough documents for 12 training and 6 held-out blocks of --smoke's 128 tokens."""
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex many bold jocks".split()
    path = tmp_path_factory.mktemp("text") / "docs.txt"
    path.write_text("".join(" ".join(words[(i + j) % len(words)] for j in range(40)) + " .\n" for i in range(80)))
    return path


@pytest.mark.parametrize("task", sorted(RESUMES))
def test_a_stopped_run_resumes_to_the_uninterrupted_result(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                           text_file: Path, conll_sample, squad_sample, task: str) -> None:
    from toolkit import run_metrics

    recipe, method = RESUMES[task]
    args = [f"recipes/{recipe}", *COMMON, *([f"method={method}"] if method else [])]
    if recipe.startswith("pretrain/"):  # blocks of 32 tokens: a 50,000-word output layer scores each token
        args += [f"task.train_file={text_file}", f"task.eval_file={text_file}", "task.max_length=32"]
    if task == "clm":  # its held-out windows, within the blocks
        args += ["task.eval_stride=16"]
    if task == "ner":  # CoNLL-2003's first sentences: its whole train file is read at each of the 4 launches
        args += [f"task.train_file={conll_sample[0]}", f"task.eval_file={conll_sample[1]}"]
    if task == "squad":  # the dev file's first articles, split by article as the recipe splits it
        args += [f"task.eval_file={squad_sample}"]
    code, _, err = cli("run", *args, "--runs-dir", tmp_path / "whole")
    assert code == 0, err
    code, _, err = cli("run", *args, "--runs-dir", tmp_path / "parts", "--stop-after", STOP)
    assert code == 0, err
    assert not (_only(tmp_path / "parts") / "metrics.json").exists()
    with monkeypatch.context() as m:  # killed while finishing: model/ written, metrics.json not yet
        m.setattr(run_metrics, "build", _interrupt)
        code, out, err = cli("run", *args, "--runs-dir", tmp_path / "parts")
    assert code == 130 and "resuming from" in out and f"step {STOP} of 4" in out, out + err
    code, out, err = cli("run", *args, "--runs-dir", tmp_path / "parts")
    assert code == 0 and "step 4 of 4" in out, out + err
    _same_run(_only(tmp_path / "whole"), _only(tmp_path / "parts"))


def _interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


CHANGES = {  # what changes between an interrupted run and the next launch -> what the note names
    "data": ([], "train.csv changed"),
    "lr": (["train.lr=2.0e-3"], "train.lr 0.001 (now 0.002)"),
    "seed": (["train.seed=8"], "train.seed 7 (now 8)"),
    "max_steps": (["train.max_steps=3"], "train.max_steps 2 (now 3)"),
    "method": (["method={name: lora, r: 4}"], "method.name 'full' (now 'lora')"),
    "processes": ([], "2 process(es) (now 1)"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_launch_is_another_run_and_names_what_changed(tmp_path: Path, cli, tiny_checkpoint,
                                                                 change: str) -> None:
    """The run id covers the recipe, the data and the process count, so a changed launch never
    resumes the interrupted run's checkpoint (no mix); it used to start over without a word,
    where the user expected the resume. Now one note names the run left and what differs."""
    from conftest import write_recipe

    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"sentence {i} is {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(16)))
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint('bert')}}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}, max_length: 16}}
method: {{name: full}}
train: {{max_steps: 2, lr: 1.0e-3, batch_size: 4, seed: 7}}
""")
    runs = tmp_path / "runs"
    assert cli("run", recipe, "--runs-dir", runs, "--stop-after", 1)[0] == 0
    (first,) = [p.parent for p in runs.rglob("recipe.yaml")]
    overrides, named = CHANGES[change]
    if change == "data":
        data.write_text(data.read_text().replace("sentence 3", "sentence three"))
    if change == "processes":  # the run as a 2-process launch would have left it: its own id
        identity = json.loads((first / "identity.json").read_text())
        first = first.rename(first.with_name("2-processes"))
        (first / "identity.json").write_text(json.dumps({**identity, "processes": 2}))
    before = sorted(runs.rglob("*"))
    code, out, err = cli("run", recipe, "--runs-dir", runs, *overrides, "--resume")  # asks for a checkpoint: none
    assert code == 2 and not out and err.count("\n") == 1 and str(first) in err and named in err, out + err
    assert "was never started" in err and sorted(runs.rglob("*")) == before
    code, out, err = cli("run", recipe, "--runs-dir", runs, *overrides)
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and str(first) in notes[0] and named in notes[0], err
    assert "resuming from" not in out
    assert sorted(p.name for p in (first / "checkpoints").iterdir()) == ["step-000001"]  # left as it was
    if change == "lr":  # the unchanged launch still resumes the first run
        code, out, err = cli("run", recipe, "--runs-dir", runs)
        assert code == 0 and "resuming from" in out and str(first) in out and "note:" not in err, out + err


@pytest.mark.parametrize("entry", ["fresh", "force"])
def test_a_damaged_run_beside_does_not_stop_another_run(tmp_path: Path, cli, stopped_tiny, entry: str) -> None:
    """The note on an interrupted run of the same recipe (above) read every run beside the new
    one: one with a damaged metrics.json refused the new launch in its name ("damaged ...; --force
    runs it again", exit 2), and --force of the new run did not help. A damaged run is said when it
    is launched itself; another run starts as asked."""
    from conftest import write_recipe

    recipe, runs = stopped_tiny(tmp_path, cli)
    (first,) = [p.parent for p in runs.rglob("recipe.yaml")]
    (first / "metrics.json").write_text('{"eval": ')  # a copy cut short
    other = write_recipe(tmp_path / "r.yaml", recipe.read_text().replace("lr: 1.0e-3", "lr: 2.0e-3"))
    code, _, err = cli("run", other, "--runs-dir", runs, *["--force"] * (entry == "force"))
    assert code == 0 and "metrics.json: damaged" not in err, err


def _swap_good_and_bad(base: Path) -> Path:
    """The tokenizer edited: 'good' and 'bad' trade ids (every sentence's tokens change)."""
    file = base / "tokenizer.json"
    data = json.loads(file.read_text())
    vocab = data["model"]["vocab"]
    vocab["good"], vocab["bad"] = vocab["bad"], vocab["good"]
    file.write_text(json.dumps(data))
    return file


def _more_dropout(base: Path) -> Path:
    file = base / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "hidden_dropout_prob": 0.5}))
    return file


def _shifted_query(base: Path) -> Path:
    from safetensors.torch import load_file, save_file

    file = base / "model.safetensors"
    tensors = load_file(file)
    name = next(k for k in tensors if k.endswith("query.weight"))
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, file, metadata={"format": "pt"})
    return file


# method -> what is edited in the base folder between the stop and the resume -> refused?
BASE_EDITS = {
    "lora, weights": ("{name: lora, r: 4}", _shifted_query, True),  # the checkpoint holds the adapter only
    "lora, tokenizer": ("{name: lora, r: 4}", _swap_good_and_bad, True),
    "full, tokenizer": ("{name: full}", _swap_good_and_bad, True),  # the checkpoint holds no tokenizer
    "full, config": ("{name: full}", _more_dropout, True),  # nor the config's dropout
    "full, weights": ("{name: full}", _shifted_query, False),  # it holds every weight: nothing is read
}


@pytest.mark.parametrize("case", sorted(BASE_EDITS))
def test_a_checkpoint_resumes_only_on_the_base_folder_it_trained_on(tmp_path: Path, cli, tiny_checkpoint,
                                                                     case: str) -> None:
    """The run id names a local base folder, not its contents, and a resume reads that folder
    again: its tokenizer and config always, its frozen weights where the checkpoint is lean (a
    LoRA, adapter or prompt run saves what trains). A base whose weights changed between the stop
    and the resume trained the saved adapter on other weights, and one whose tokenizer changed
    went on on other token ids, exit 0; now one line names the file. The same bytes written
    anew (another time stamp) resume; what the checkpoint holds itself (full fine-tuning's
    weights) is not checked."""
    import os
    import shutil

    method, edit, refused = BASE_EDITS[case]
    base = Path(shutil.copytree(tiny_checkpoint("bert"), tmp_path / "base"))
    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"sentence {i} is {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(16)))
    dev = tmp_path / "dev.csv"
    dev.write_text("text,label\nline 1 is good,1\nline 2 is bad,0\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""model: {{checkpoint: {base}}}
task: {{name: text_classification, train_file: {data}, eval_file: {dev}, max_length: 16}}
method: {method}
train: {{max_steps: 3, lr: 1.0e-3, batch_size: 4, seed: 7}}
""")
    runs = tmp_path / "runs"
    assert cli("run", recipe, "--runs-dir", runs, "--stop-after", 1)[0] == 0
    for file in base.iterdir():
        os.utime(file, ns=(1, 1))  # touched: the same bytes
    code, out, err = cli("run", recipe, "--runs-dir", runs, "--stop-after", 2)
    assert code == 0 and "resuming from" in out, err
    changed = edit(base)
    code, out, err = cli("run", recipe, "--runs-dir", runs)
    if refused:
        assert code == 2 and str(changed) in err and "step 2" in err and len(err.strip().splitlines()) == 1, err
    else:
        assert code == 0 and "resuming from" in out and "step 2" in out, out + err


def _rewrite_state(state_file: Path, state: dict) -> None:
    """A checkpoint's trainer_state.json as another launch would have written it: its digest with it."""
    from toolkit import runs as run_files

    state["state_sha256"] = run_files.state_digest({k: v for k, v in state.items()
                                                     if k not in ("manifest", "state_sha256")})
    state_file.write_text(json.dumps(state))


def _resume(entry: str, cli, capsys, recipe: Path, runs: Path) -> tuple[dict, str, str]:
    """(metrics, stdout, stderr) of the run resumed through the API or the CLI (which must pass)."""
    from toolkit import api

    if entry == "api":
        metrics = api.run(recipe, runs_dir=runs).metrics
        said = capsys.readouterr()
        return metrics, said.out, said.err
    code, out, err = cli("run", recipe, "--runs-dir", runs)
    assert code == 0, err
    (metrics_file,) = runs.rglob("metrics.json")
    return json.loads(metrics_file.read_text()), out, err


def _tiny_classification(tmp_path: Path, tiny_checkpoint) -> Path:
    """A 2-step text_classification recipe on the tiny BERT (seconds)."""
    from conftest import write_recipe

    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"sentence {i} is {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(16)))
    return write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint('bert')}}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}, max_length: 16}}
method: {{name: full}}
train: {{max_steps: 2, lr: 1.0e-3, batch_size: 4, seed: 7}}
""")


@pytest.fixture(scope="module")
def stopped_tiny(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint):
    """(tmp_path, cli) -> (tmp_path/r.yaml: the `_tiny_classification` recipe, tmp_path/runs: its
    run stopped after step 1). The run is trained once per module and torch thread count (a
    checkpoint records its compute; through the test's `cli`, which takes its output) and copied:
    the recipe names the same data file, so the copy is the same run id, a folder of the test's
    own to resume, damage or leave."""
    import shutil

    shared = tmp_path_factory.mktemp("tiny")
    recipe = _tiny_classification(shared, tiny_checkpoint)
    made: dict[int, Path] = {}

    def copy(tmp_path: Path, cli) -> tuple[Path, Path]:
        threads = torch.get_num_threads()
        if threads not in made:
            runs = shared / f"runs-{threads}"
            assert cli("run", recipe, "--runs-dir", runs, "--stop-after", 1)[0] == 0
            made[threads] = runs
        return Path(shutil.copy(recipe, tmp_path / "r.yaml")), Path(shutil.copytree(made[threads], tmp_path / "runs"))

    return copy


OTHER_CODE = {  # what the checkpoint says it was written under -> the entry point that resumes it
    "same": (None, "cli"),
    "torch": ("torch", "cli"),
    "scorer": ("sacrebleu", "cli"),  # a library the scores are computed by (versions.SCORING)
    "toolkit commit": ("toolkit", "api"),
    "unreadable": ("transformers", "cli"),  # and its files do not load under these versions
}


def test_a_library_the_checkpoint_did_not_record_is_no_change() -> None:
    """The scoring libraries are recorded since 2026-11-28 (versions.SCORING): a checkpoint
    written before holds none of them, and its resume is not "under other code" for that; a
    library both records hold at other versions is."""
    from toolkit import checkpoints, versions

    now = checkpoints.code_versions()
    assert set(versions.TRACKED + versions.SCORING) <= set(now) and now["sacrebleu"] and now["scikit-learn"]
    before = {k: v for k, v in now.items() if k not in versions.SCORING}
    assert checkpoints.code_changes(before, now) == ""
    assert checkpoints.code_changes({**now, "rouge-score": "0.0.1"}, now) == f"rouge-score 0.0.1 (now {now['rouge-score']})"


@pytest.mark.parametrize("case", sorted(OTHER_CODE))
def test_a_resume_under_other_code_says_so_and_the_run_records_it(tmp_path: Path, cli, capsys, stopped_tiny,
                                                                  monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """A run stopped under one torch / transformers / peft / accelerate / datasets / toolkit commit
    and resumed under another went on as an exact resume, and metrics.json named the last versions
    only. Now each checkpoint records what wrote it; a resume under other code goes on (as
    transformers' Trainer does) with one note, and metrics.json keeps the change; a checkpoint
    that will not load under the new versions is one line naming them, not a traceback."""
    from accelerate import Accelerator

    from toolkit import checkpoints

    (recipe, runs), (key, entry) = stopped_tiny(tmp_path, cli), OTHER_CODE[case]
    (state_file,) = runs.rglob("step-000001/trainer_state.json")
    state = json.loads(state_file.read_text())
    assert state["code"] == checkpoints.code_versions()  # recorded when the run started
    if key:
        state["code"][key] = "0.0.1-old"  # as the other code wrote it: its state digest with it
        _rewrite_state(state_file, state)
    if case == "unreadable":
        monkeypatch.setattr(Accelerator, "load_state", lambda *a, **k: (_ for _ in ()).throw(KeyError("slot")))
        code, _, err = cli("run", recipe, "--runs-dir", runs)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and "transformers 0.0.1-old (now" in errors[0], err
        return
    metrics, out, err = _resume(entry, cli, capsys, recipe, runs)
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert "resuming from" in out and len(notes) == (1 if key else 0), out + err
    if key:
        assert f"{key} 0.0.1-old (now {checkpoints.code_versions()[key]})" in notes[0] and "step 1" in notes[0]
    assert metrics["code"] == checkpoints.code_versions()
    if key is None:
        assert metrics["resumed_under_other_code"] is None
    else:
        (changed,) = metrics["resumed_under_other_code"]
        assert changed["step"] == 1 and changed["was"][key] == "0.0.1-old" and changed["now"] == metrics["code"]


OTHER_COMPUTE = {  # how the resume differs from the launch that wrote the checkpoint -> its entry point
    "same": "cli",
    "torch threads": "cli",  # OMP_NUM_THREADS=1 for the stop, unset (2 here) for the resume
    "instruction set": "api",  # the checkpoint says it was written on another CPU
    "before the record": "cli",  # a checkpoint written before compute was recorded: not judged
}


@pytest.mark.parametrize("case", sorted(OTHER_COMPUTE))
def test_a_resume_on_other_compute_says_so_and_the_run_records_it(tmp_path: Path, cli, capsys, stopped_tiny,
                                                                  case: str) -> None:
    """A run stopped with one torch thread count (or on one CPU instruction set, or GPU) and resumed
    with another took the same steps summed in other chunks: its weights differed from the
    uninterrupted run's in the last bits, exit 0, and nothing said the resume was not exact (a
    run stopped under OMP_NUM_THREADS=1 and resumed without it). Each checkpoint now records
    its compute; a resume on other compute goes on with one note, and metrics.json keeps it."""
    from toolkit import checkpoints

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        recipe, runs = stopped_tiny(tmp_path, cli)  # stopped under 1 thread
        (state_file,) = runs.rglob("step-000001/trainer_state.json")
        state = json.loads(state_file.read_text())
        assert state["compute"] == checkpoints.compute(torch.device("cpu"))
        if case in ("instruction set", "before the record"):
            if case == "before the record":
                del state["compute"]
            else:
                state["compute"]["instruction set"] = "VSX"
            _rewrite_state(state_file, state)
        torch.set_num_threads(2 if case == "torch threads" else 1)
        metrics, out, err = _resume(OTHER_COMPUTE[case], cli, capsys, recipe, runs)
        now = checkpoints.compute(torch.device("cpu"))  # the resume's (the test process's own count may differ)
    finally:
        torch.set_num_threads(threads)
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    changes = case not in ("same", "before the record")
    assert "resuming from" in out and len(notes) == changes, out + err
    if not changes:
        assert metrics["resumed_on_other_compute"] is None
        return
    assert "step 1 on other compute" in notes[0] and "metrics.json records it" in notes[0]
    if case == "torch threads":
        assert "torch threads 1 (now 2)" in notes[0] and "OMP_NUM_THREADS=1 resumes it exactly" in notes[0]
    else:
        assert "instruction set VSX (now " in notes[0] and "resume it where it was written" in notes[0]
    (changed,) = metrics["resumed_on_other_compute"]
    assert changed["step"] == 1 and changed["now"] == now
    assert now["torch threads"] == (2 if case == "torch threads" else 1)


@pytest.mark.parametrize("entry", ["cli", "run_one"])
def test_force_with_resume_is_one_line_and_keeps_the_checkpoint(tmp_path: Path, cli, stopped_tiny,
                                                                 entry: str) -> None:
    """`run --force --resume` asks to start again and to go on: --force emptied the run folder, then
    the run said "no checkpoint in ...: starting from the beginning" and trained from step 0, exit
    0, the checkpoint it was asked to go on from deleted. One line, exit 2, the folder as it was."""
    import toolkit
    from toolkit import api

    recipe, runs = stopped_tiny(tmp_path, cli)
    before = {p: p.read_bytes() for p in runs.rglob("*") if p.is_file()}
    if entry == "cli":
        code, out, err = cli("run", recipe, "--runs-dir", runs, "--force", "--resume")
        assert code == 2 and not out and err.count("\n") == 1 and "--force and --resume" in err, out + err
    else:
        with pytest.raises(toolkit.UserError, match="--force and --resume ask for opposite things"):
            api.run_one(recipe, [], runs_dir=runs, force=True, resume=True)
    assert {p: p.read_bytes() for p in runs.rglob("*") if p.is_file()} == before


NO_CHECKPOINT = {  # the run as --resume finds it -> what the line says
    "never started": "was never started (no run folder)",
    "stopped before its first checkpoint": "holds no checkpoint to go on from",
    "another run's checkpoint": "is an interrupted run of this recipe (checkpoint of step 1), with train.lr",
    "in-context": "trains nothing",
}


# every state through the in-process entry points; `make run` (a fresh interpreter, ~6 s a case)
# once, with an override: it hands ARGS to the same `toolkit run --resume`
@pytest.mark.parametrize("state, entry", [(s, e) for s in sorted(NO_CHECKPOINT) for e in ("cli", "api run", "api run_one")]
                         + [("another run's checkpoint", "make run")])
def test_resume_without_a_checkpoint_is_one_line_and_writes_nothing(tmp_path: Path, cli, tiny_checkpoint, stopped_tiny,
                                                                     state: str, entry: str) -> None:
    """Rule: --resume asks to go on from a checkpoint; where the run has none it is one line, exit 2,
    nothing written (transformers' Trainer: "No valid checkpoint found"). It said "no checkpoint in
    ...: starting from the beginning" on stdout and trained from step 0, exit 0, whether the run
    folder was never made (a changed recipe or data file is another run), made and killed before
    its first checkpoint, or of a method that keeps none."""
    import shutil
    import subprocess
    import sys

    import toolkit
    from toolkit import api

    if state == "never started":
        recipe, runs = _tiny_classification(tmp_path, tiny_checkpoint), tmp_path / "runs"
    else:
        recipe, runs = stopped_tiny(tmp_path, cli)
    overrides = []
    if state == "stopped before its first checkpoint":  # kill -9 before the first save: recipe.yaml, log
        shutil.rmtree(next(runs.rglob("checkpoints")))
    if state == "another run's checkpoint":
        overrides = ["train.lr=2.0e-3"]
    if state == "in-context":  # keeps no checkpoint: it scores the base
        text = recipe.read_text().replace(str(tiny_checkpoint("bert")), str(tiny_checkpoint("gpt2")))
        recipe.write_text(text.replace("method: {name: full}", "method: {name: icl, shots: 0}")
                          .replace("train: {max_steps: 2, lr: 1.0e-3, batch_size: 4, seed: 7}", "")
                          .replace(", max_length: 16", ", text_columns: [text], labels: ['0', '1']"))
    before = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    if entry == "cli":
        code, out, err = cli("run", recipe, *overrides, "--runs-dir", runs, "--resume")
    elif entry == "make run":
        done = subprocess.run(["make", "run", f"RECIPE={recipe}", f"VENV={Path(sys.executable).parent.parent}",
                               "ARGS=" + " ".join(f"'{o}'" for o in overrides) + f" --runs-dir {runs} --resume"],
                              cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=120,
                              env={k: v for k, v in __import__("os").environ.items() if "MAKE" not in k})
        code, out, err = done.returncode, "\n".join(done.stdout.splitlines()[1:]), done.stderr
        err = "\n".join(line for line in err.splitlines(keepends=True) if not line.startswith("make:"))
    else:
        with pytest.raises(toolkit.UserError) as caught:
            if entry == "api run":
                toolkit.run(recipe, overrides, runs_dir=runs, resume=True)
            else:
                api.run_one(recipe, overrides, runs_dir=runs, resume=True)
        code, out, err = 2, "", f"error: {caught.value}\n"
    assert code == 2 and not out.strip() and err.count("\n") == 1 and err.startswith("error: --resume: "), out + err
    assert NO_CHECKPOINT[state] in err and "without --resume" in err, err
    assert {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")} == before


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_resume_of_a_smoke_chain_without_a_checkpoint_runs_no_upstream_first(tmp_path: Path, cli, entry: str) -> None:
    """A chained --smoke run makes its upstream smoke run first: with --resume and no checkpoint
    of its own it trained that whole upstream run, then refused. The refusal comes first, nothing made."""
    import toolkit

    args = ["task.max_train_samples=8", "task.max_eval_samples=8", "train.max_steps=1"]
    if entry == "cli":
        code, out, err = cli("run", "demo/sst2/minilm-full-from-wikitext", *args, "--smoke", "--resume",
                             "--runs-dir", tmp_path / "runs")
    else:
        with pytest.raises(toolkit.UserError) as caught:
            toolkit.run("demo/sst2/minilm-full-from-wikitext", args, runs_dir=tmp_path / "runs", smoke=True, resume=True)
        code, out, err = 2, "", f"error: {caught.value}\n"
    assert code == 2 and err.count("\n") == 1 and "--resume: " in err and "was never started" in err, out + err
    assert not (tmp_path / "runs").exists()


def _revision(hub: Path, commit: str, source: Path, shift: float = 0.0) -> None:
    """The Hub cache's layout for org/tiny after a download of `commit` (refs/main moved there)."""
    import shutil

    repo = hub / "models--org--tiny"
    snapshot = Path(shutil.copytree(source, repo / "snapshots" / commit))
    if shift:
        from safetensors.torch import load_file, save_file

        tensors = load_file(snapshot / "model.safetensors")
        name = next(k for k in tensors if k.endswith("query.weight"))
        tensors[name] = tensors[name] + shift
        save_file(tensors, snapshot / "model.safetensors", metadata={"format": "pt"})
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def test_a_hub_id_resumes_and_loads_only_on_the_revision_it_trained_on(tmp_path: Path, cli, tiny_checkpoint,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hub id names no fixed weights: a later download moves the cache's refs/main to another
    snapshot, which the run id does not see. A LoRA run stopped on one revision resumed its
    adapter on the next one's weights, and a finished one was scored and predicted on them, exit
    0. The cached snapshot is recorded and checked as a local base folder is: a new revision with
    the same files resumes; one with other weights is one line, at resume, eval and predict."""
    import huggingface_hub.constants

    import toolkit

    hub = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    _revision(hub, "a" * 40, Path(tiny_checkpoint("bert")))
    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"sentence {i} is {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(16)))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""model: {{checkpoint: org/tiny}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}, max_length: 16, max_eval_samples: 4}}
method: {{name: lora, r: 4}}
train: {{max_steps: 2, lr: 1.0e-3, batch_size: 4, seed: 7}}
""")
    runs = tmp_path / "runs"
    for seed in (7, 8):
        assert cli("run", recipe, f"train.seed={seed}", "--runs-dir", runs, "--stop-after", 1)[0] == 0
    _revision(hub, "b" * 40, hub / "models--org--tiny" / "snapshots" / ("a" * 40))  # the same files again
    code, out, err = cli("run", recipe, "train.seed=7", "--runs-dir", runs)
    assert code == 0 and "resuming from" in out, out + err
    finished = Path(out.strip().splitlines()[-1].split(":")[0])
    _revision(hub, "c" * 40, hub / "models--org--tiny" / "snapshots" / ("b" * 40), shift=0.01)
    weights = hub / "models--org--tiny" / "snapshots" / ("c" * 40) / "model.safetensors"
    code, _, err = cli("run", recipe, "train.seed=8", "--runs-dir", runs)
    assert code == 2 and f"model.checkpoint: {weights} changed since this run's checkpoint of step 1" in err, err
    code, _, err = cli("predict", finished, "--input", data)
    assert code == 2 and f"model.checkpoint {weights} changed since the run finished" in err and err.count("\n") == 1, err
    with pytest.raises(toolkit.UserError, match="changed since the run finished"):
        toolkit.evaluate(finished)


def _fake_hub_data(monkeypatch: pytest.MonkeyPatch, root: Path, rows: dict[str, list[dict]]) -> dict:
    """A Hub whose data sets are read through datasets' own builder from `root/<revision>/`:
    `datasets.load_dataset(<hub id>, ...)` loads the revision `revision["now"]` names (the one a
    later download put in the datasets cache), each split a JSON Lines file written from `rows`
    (a revision's rows: `rows[revision][split]`). No network: HF_HUB_OFFLINE is off for the
    task's Hub path only."""
    import datasets

    real = datasets.load_dataset
    revision = {"now": None}

    def load(path, name=None, split=None, **kwargs):
        if Path(str(path)).exists() or path in ("json", "csv", "text", "parquet"):
            return real(path, name, split=split, **kwargs)
        folder = root / revision["now"]
        files = {}
        for part, records in rows[revision["now"]].items():
            file = folder / f"{part}.jsonl"
            if not file.exists():
                folder.mkdir(parents=True, exist_ok=True)
                file.write_text("".join(json.dumps(r) + "\n" for r in records))
            files[part] = str(file)
        return real("json", data_files=files, split=split, cache_dir=str(root / "cache"))

    monkeypatch.setattr(datasets, "load_dataset", load)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    return revision


def test_a_hub_data_set_resumes_and_is_scored_only_on_the_revision_it_trained_on(
        tmp_path: Path, cli, tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hub data set (task.dataset) names no fixed data: a later download puts another revision
    in the datasets cache, which neither the run id nor data_sha256 sees (data_files() is empty).
    A run stopped on one revision resumed on the next one's examples, and `toolkit eval` of a
    finished run scored them as the run's, exit 0. Each split's datasets fingerprint as loaded
    (its cache folder's commit hash) is recorded in the checkpoint and metrics.json: the same
    revision loaded again resumes and scores; another is one line at resume, CLI eval and API."""
    import toolkit

    def revision_rows(words: tuple[str, str]) -> dict:
        made = [{"text": f"sentence {i} is {words[i % 2]}", "label": i % 2} for i in range(16)]
        return {"train": made, "validation": made[:4]}

    revision = _fake_hub_data(monkeypatch, tmp_path / "hub", {"a" * 40: revision_rows(("bad", "good")),
                                                             "b" * 40: revision_rows(("poor", "fine")),
                                                             "c" * 40: revision_rows(("bad", "good"))})
    revision["now"] = "a" * 40
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""model: {{checkpoint: {tiny_checkpoint("bert")}}}
task: {{name: text_classification, dataset: org/reviews, max_length: 16}}
method: {{name: lora, r: 4}}
train: {{max_steps: 2, lr: 1.0e-3, batch_size: 4, seed: 7}}
""")
    runs = tmp_path / "runs"
    for seed in (7, 8):
        assert cli("run", recipe, f"train.seed={seed}", "--runs-dir", runs, "--stop-after", 1)[0] == 0
    code, out, err = cli("run", recipe, "train.seed=7", "--runs-dir", runs)  # the same revision: resumes
    assert code == 0 and "resuming from" in out, out + err
    finished = Path(out.strip().splitlines()[-1].split(":")[0])
    assert json.loads((finished / "metrics.json").read_text())["hub_data"]["org/reviews"].keys() == {"train", "validation"}
    code, out, err = cli("eval", finished)
    assert code == 0, out + err
    revision["now"] = "b" * 40  # the cache moved on
    code, _, err = cli("run", recipe, "train.seed=8", "--runs-dir", runs)
    assert code == 2 and "the Hub data set 'org/reviews' is not the revision this run's checkpoint of step 1" in err, err
    assert err.count("\n") == 1, err
    code, _, err = cli("eval", finished)
    assert code == 2 and "the Hub data set 'org/reviews' is not the revision this run was made with" in err, err
    with pytest.raises(toolkit.UserError, match="is not the revision this run was made with"):
        toolkit.evaluate(finished)
    revision["now"] = "c" * 40  # a new revision holding the rows the runs read: the same data
    assert cli("eval", finished)[0] == 0
    code, out, err = cli("run", recipe, "train.seed=8", "--runs-dir", runs)
    assert code == 0 and "resuming from" in out, out + err


def _hub_rows(task: str, variant: int) -> dict[str, list[dict]]:
    word = ("good", "fine")[variant]
    if task == "squad":
        made = [{"id": f"q{i}", "title": "t", "context": f"the answer is {word} {i}.", "question": f"what is {i}?",
                 "answers": {"text": [word], "answer_start": [14]}} for i in range(8)]
    elif task == "summarization":
        made = [{"id": str(i), "document": f"a long {word} document {i} of words", "summary": f"{word} {i}"}
                for i in range(8)]
    elif task == "glue":
        made = [{"sentence": f"sentence {i} is {word}", "label": i % 2, "idx": i} for i in range(8)]
    else:
        made = [{"text": f"sentence {i} is {word}", "label": i % 2} for i in range(8)]
    return {"train": made, "validation": made[:4]}


@pytest.mark.parametrize("task,settings", [
    ("text_classification", {"dataset": "org/reviews"}),
    ("clm", {"dataset": "org/wiki"}),
    ("glue", {"subset": "cola"}),
    ("squad", {"version": "v1"}),
    ("summarization", {"subset": "xsum"}),  # translation's Hub presets read through the same hub_pairs
])
def test_every_hub_loader_records_the_revision_it_read(task: str, settings: dict, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each task's Hub path records what it loaded (Task.hub_data): the same revision loaded again
    gives the same record (a resume and an eval on it go on), another revision another one,
    named by runs.hub_data_changed (refused at resume and eval) unless it holds the same examples
    (it was refused: a new revision with identical rows is the same data)."""
    from toolkit import runs
    from toolkit.tasks import TASKS

    revision = _fake_hub_data(monkeypatch, tmp_path / "hub", {"a": _hub_rows(task, 0), "b": _hub_rows(task, 1),
                                                             "c": _hub_rows(task, 0)})
    if task == "glue":
        settings = {**settings, "data_dir": str(tmp_path / "no-local-copy")}

    def loaded(rev: str) -> dict:
        revision["now"] = rev
        made = TASKS.get(task)(**settings)
        made.load()
        return made.hub_data()

    first = loaded("a")
    assert first and all(all(splits.values()) for splits in first.values()), first
    assert loaded("a") == first and runs.hub_data_changed(first, loaded("a")) is None
    assert runs.hub_data_changed(first, loaded("b")) == next(iter(first))
    # revision c holds a's rows: another datasets fingerprint (cache folder), the same examples
    same = loaded("c")
    assert same != first and runs.hub_data_changed(first, same) is None
    # a record from before the content hash (fingerprints alone) is judged by its revision
    old = {name: {s: v.split(" ")[0] for s, v in splits.items()} for name, splits in first.items()}
    assert runs.hub_data_changed(old, loaded("a")) is None and runs.hub_data_changed(old, same) == next(iter(first))


@pytest.mark.parametrize("kill", ["after its checkpoint", "before its first checkpoint"])
def test_the_trackers_hold_each_step_once_after_a_resume(tmp_path: Path, cli, tiny_checkpoint, kill: str) -> None:
    """A 3-step run killed after its checkpoint of step 1, having logged step 2 (or before any
    checkpoint: it starts again from step 0): log.jsonl keeps the lines up to the checkpoint and
    the resumed run logs the rest, but TensorBoard's files of the killed launch stayed beside the
    new one's, and its curves held step 2 (or 1 and 2) twice, exit 0. Each launch now marks where
    it goes on from (`purge_step`): the reader's curves are log.jsonl's, step for step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    recipe = _tiny_classification(tmp_path, tiny_checkpoint)
    args = [recipe, "--runs-dir", tmp_path / "runs", "train.report_to=[tensorboard]", "train.log_every=1",
            "train.eval_every=1", "train.save_total_limit=2", "train.max_steps=3"]
    assert cli("run", *args, "--stop-after", 2)[0] == 0  # steps 1 and 2 logged, checkpoints of both
    run = _only(tmp_path / "runs")
    for step in ([2] if kill == "after its checkpoint" else [1, 2]):  # the kill came before these were written
        import shutil

        shutil.rmtree(run / "checkpoints" / f"step-{step:06d}")
    code, out, err = cli("run", *args)
    assert code == 0 and ("resuming from" in out) == (kill == "after its checkpoint"), out + err
    (scalars,) = {p.parent for p in (run / "tracking").rglob("events.out.tfevents.*") if (p.parent / "..").resolve()
                  == (run / "tracking").resolve()}  # hparams go to folders below
    events = EventAccumulator(str(scalars))
    events.Reload()
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [e.step for e in events.Scalars("train.loss")] == [line["step"] for line in logged if "loss" in line] == [1, 2, 3]
    assert [e.value for e in events.Scalars("train.loss")] == pytest.approx([l["loss"] for l in logged if "loss" in l])
    assert [e.step for e in events.Scalars("eval.accuracy")] == [line["step"] for line in logged if "eval" in line]


LAUNCHES = {  # the launch Ctrl-C stopped (its environment) -> the command its line names
    "one process": ({}, "toolkit run {recipe} --runs-dir {runs} --resume"),
    "ddp": ({"WORLD_SIZE": "2"}, "make run NPROC=2 RECIPE={recipe} 'ARGS=--runs-dir {runs} --resume'"),
    "fsdp": ({"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"},
             "make run NPROC=2 STRATEGY=fsdp RECIPE={recipe} 'ARGS=--runs-dir {runs} --resume'"),
}


@pytest.mark.parametrize("launch", sorted(LAUNCHES))
def test_ctrl_c_names_the_resume_of_the_same_launch(tmp_path: Path, cli, stopped_tiny, monkeypatch: pytest.MonkeyPatch,
                                                    launch: str) -> None:
    """Ctrl-C in a launch of 2 processes said `toolkit run R --resume` goes on from the checkpoint:
    a 1-process launch, whose run id (the process count sets the global batch) is another run's,
    and `--resume` there is refused. The line names the launch this run is (`make run NPROC=N`,
    and a sharded strategy), as a chain's advice does (runs.run_command)."""
    from toolkit import api

    recipe, runs = stopped_tiny(tmp_path, cli)
    env, said = LAUNCHES[launch]
    for key in ("WORLD_SIZE", "ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    line = str(api._interrupted(KeyboardInterrupt(), _only(runs), True, str(recipe), ["--runs-dir", str(runs)]))
    assert f"keeps the checkpoint of step 1: `{said.format(recipe=recipe, runs=runs)}` goes on from there" in line, line


@pytest.mark.parametrize("entry", ["run", "run --resume", "api"])
def test_a_checkpoints_path_that_is_no_folder_is_one_line_before_anything_runs(tmp_path: Path, cli, stopped_tiny,
                                                                                entry: str) -> None:
    """A run folder whose `checkpoints/` was replaced by a file: the run started again from step 0
    without a word (no checkpoint found) and failed at its first save, after training up to it.
    It is one line naming the path, before anything runs; the folder is left as it was."""
    import toolkit
    from toolkit.errors import UserError

    recipe, runs = stopped_tiny(tmp_path, cli)
    run = _only(runs)
    import shutil

    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").write_text("not a folder\n")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    said = f"{run / 'checkpoints'}: is a file, not the folder of the run's checkpoints"
    if entry == "api":
        with pytest.raises(UserError, match=re.escape(said)):
            toolkit.run(recipe, runs_dir=runs)
    else:
        code, out, err = cli(*entry.split(), recipe, "--runs-dir", runs)
        assert code == 2 and err.splitlines()[-1].startswith(f"error: {said}") and "it/s" not in err, out + err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    if entry == "run":  # --force starts it again, the file removed with the rest
        code, out, err = cli("run", recipe, "--runs-dir", runs, "--force")
        assert code == 0 and (run / "metrics.json").is_file() and not (run / "checkpoints").exists(), err


@pytest.mark.parametrize("limit", [2, 3])
def test_a_stopped_and_resumed_run_keeps_the_checkpoints_of_the_uninterrupted_one(tmp_path: Path, cli, tiny_checkpoint,
                                                                                   limit: int) -> None:
    """`--stop-after 3` checkpoints step 3, which a run saving every 2 steps never saves: it was kept
    as a step checkpoint, so the finished run (train.keep_checkpoints) held step-3 beside step-2 and
    step-4, or step-3 and step-4 where the uninterrupted run kept step-2 and step-4. The next
    checkpoint, once whole, removes it: the finished folder's checkpoints are the uninterrupted
    run's, step for step."""
    from toolkit import runs

    recipe = _tiny_classification(tmp_path, tiny_checkpoint)
    common = ["train.max_steps=4", "train.save_every=2", "train.keep_checkpoints=true",
              f"train.save_total_limit={limit}"]
    kept, folders = {}, {}
    for name, stops in (("whole", []), ("stopped", [3])):
        root = tmp_path / name
        for stop in stops:
            assert cli("run", recipe, *common, "--runs-dir", root, "--stop-after", stop)[0] == 0
            assert runs.last_step(_only(root)) == 3  # what it goes on from
        code, out, err = cli("run", recipe, *common, "--runs-dir", root)
        assert code == 0 and ("resuming from" in out) == bool(stops), out + err
        folders[name] = _only(root)
        kept[name] = sorted(str(p.relative_to(folders[name])) for p in folders[name].rglob("*")
                            if "tracking" not in p.parts)
    assert kept["stopped"] == kept["whole"] and "checkpoints/step-000002" in kept["whole"], kept["stopped"]
    assert [p for p in kept["whole"] if p.startswith("checkpoints/step-") and p.count("/") == 1] == [
        "checkpoints/step-000002", "checkpoints/step-000004"]
    _same_run(folders["whole"], folders["stopped"])
