"""A finished run is loaded as it was built, by every entry point that uses it (eval, predict,
export and their API twins): every method's export loads as its line says and predicts what
`toolkit predict` does; a chained run finds the run it started from; a swapped attention module
comes back with its parameters; eval maps its data onto the model's own labels."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest
import torch

import toolkit
from toolkit.methods import METHODS

SHORT = ["model.checkpoint=bert-base-uncased", "task.max_train_samples=16", "task.max_eval_samples=8",
         "train.max_steps=2", "train.lr=0.05"]
TEXTS = ["a wonderful film", "a dull mess that goes on and on", "great",
         "it was [SEP] fine [CLS] ok [MASK] really", "a long " + "and dull " * 200 + "end"]  # past max_length
SETTINGS = {"lora": ", r: 4", "dora": ", r: 4", "prompt_tuning": ", num_virtual_tokens: 4",
            "prefix_tuning": ", num_virtual_tokens: 4", "p_tuning": ", num_virtual_tokens: 4"}
TRAINED = sorted(n for n in METHODS.names() if METHODS.get(n).trains)


def exported_model(out: Path, note: str, auto: str = "AutoModelForSequenceClassification") -> torch.nn.Module:
    """The model loaded exactly as the export's line says (`load it with ...: EXPR`), else the
    plain `AutoModelFor...from_pretrained(OUT)` the line names (`auto`: the run's head's class)."""
    import transformers

    import toolkit.methods.adapters  # noqa: F401  (the lines name these modules)
    import toolkit.methods.prefix_tuning  # noqa: F401
    import toolkit.methods.prompt_tuning  # noqa: F401
    from peft import PeftModel  # noqa: F401

    expr = note.split("load it with ", 1)[1].split(": ", 1)[1].split("; ")[0] if "load it with " in note else \
        f"{auto}.from_pretrained(OUT)"
    autos = {name: getattr(transformers, name) for name in dir(transformers) if name.startswith("AutoModel")}
    return eval(expr.replace("OUT/base", "OUT / 'base'"),
                {**globals(), **locals(), **autos, "OUT": out, "toolkit": toolkit})


@pytest.mark.parametrize("method", TRAINED)
def test_every_methods_export_loads_as_its_line_says_and_predicts_as_the_run(tmp_path: Path, method: str) -> None:
    from transformers import AutoTokenizer

    run = toolkit.run("demo/sst2/minilm-lora", [*SHORT, f"method={{name: {method}{SETTINGS.get(method, '')}}}"],
                      runs_dir=tmp_path / "runs", smoke=True)
    want = [r["probabilities"] for r in toolkit.predict(run, TEXTS)]
    from toolkit import recipe as recipes  # what a chain is told at validate is what was saved
    assert recipes.load(run.dir / "recipe.yaml", []).method.saves_model() == (run.dir / "model" / "config.json").is_file()
    exported = 0
    for merge in (False, True):
        out = tmp_path / f"out-{merge}"
        try:
            note = toolkit.export(run, out, merge=merge)
        except toolkit.UserError as exc:
            assert merge and re.search(r"--merge: .* (virtual tokens|non-linear layer)", str(exc)), exc
            continue
        _starts_from_export_or_refuses(out)
        model, tok = exported_model(out, note).eval(), AutoTokenizer.from_pretrained(out)
        with torch.no_grad():
            probs = model(**tok(TEXTS, return_tensors="pt", padding=True, truncation=True)).logits.softmax(-1)
        config = (model.get_base_model() if hasattr(model, "get_base_model") else model).config
        got = [{config.id2label[i]: float(p[i]) for i in range(len(p))} for p in probs]
        assert [set(g) for g in got] == [{"negative", "positive"}] * len(TEXTS)
        for g, w in zip(got, want):
            assert g == pytest.approx(w, abs=1e-5), (method, merge, note)
        if "load it with " not in note:  # a plain folder: transformers' pipeline, as the line says
            from transformers import pipeline

            classify = pipeline("text-classification", model=str(out), top_k=None, truncation=True)
            for g, w in zip(classify(TEXTS), want):
                assert {d["label"]: d["score"] for d in g} == pytest.approx(w, abs=1e-5), (method, merge, note)
        exported += 1
    assert exported >= 1


LONG = "and so on " * 150  # past every case's task.max_length: cut where the run cut it
PAIRS = [("a wonderful film", "a great movie"), ("it was [SEP] fine </s> ok", "<|endoftext|> <pad> [CLS]"),
         ("a dull mess " + LONG, "so fine")]
WORDS = [["EU", "rejects", "German", "call", "."], ["Peter", "[SEP]", "</s>", "Blackburn"], ["word"] * 300]
QUESTIONS = [("Who wrote it?", "The book was written by Anne in 1901 in Paris."),
             ("Where? [SEP]", "It happened " + LONG + "in Rome.")]
SOURCES = ["Amanda: I baked cookies. Do you want some?\nJerry: Sure!", "a short one </s> [SEP]"]
TEXTS_LM = ["the cat sat on the mat", "a text with [MASK] and </s> in it"]
# Every task type and family beside the method walk above (classification, BERT): each case a
# method that walk's classification does not show in that task type (a sequence-to-sequence or
# decoder head, a token head, a QA head), both exports where the method merges.
ROUND_TRIPS = [
    ("demo/own-data/minilm-lora-regression", "roberta", "{name: adalora}", [], PAIRS),
    ("demo/own-data/minilm-lora-ner", "bert", "{name: adapters}", [], WORDS),
    ("demo/own-data/minilm-lora-ner", "gpt2", "{name: prefix_tuning, num_virtual_tokens: 4}", [], WORDS),
    ("demo/own-data/minilm-full-qa", "bart", "{name: lora, r: 4}", [], QUESTIONS),
    ("demo/own-data/minilm2minilm-summarization", "t5", "{name: prompt_tuning, num_virtual_tokens: 4}",
     ["model.warm_start=null"], SOURCES),
    ("demo/own-data/minilm2minilm-translation", "bart", "{name: dora, r: 4}", ["model.warm_start=null"],
     ["A man rides a bike.", "Two dogs play </s> in the snow."]),
    ("demo/own-data/minilm2minilm-summarization", "gpt2", "{name: ia3}",  # the repeat ban the line says
     ["model.warm_start=null", "task.generation.no_repeat_ngram_size=0"], SOURCES),  # generate cannot hold
    ("demo/own-data/minilm-mlm", "roberta", "{name: bitfit}", [], TEXTS_LM),
    ("demo/own-data/gpt2-clm", "gpt2", "{name: full}", [], TEXTS_LM),
]
FAMILY_IDS = {"bert": "bert-base-uncased", "roberta": "roberta-base", "gpt2": "gpt2", "bart": "facebook/bart-base",
              "t5": "t5-base"}


@pytest.mark.parametrize("recipe, family, method, extra, inputs", ROUND_TRIPS,
                         ids=[f"{r.split('/')[-1]}-{f}-{m[7:].split(',')[0].rstrip('}')}" for r, f, m, _, _ in ROUND_TRIPS])
def test_every_task_types_export_loads_as_its_line_says_and_predicts_as_the_run(
        tmp_path: Path, recipe: str, family: str, method: str, extra: list[str], inputs: list) -> None:
    """The rule of `toolkit export` over the task types and families: the folder, loaded as its
    line says with plain transformers (or PEFT, or the toolkit's route the line names), gives the
    run's own model's outputs on the same ids (logits within float tolerance), and what
    `toolkit predict` gives (labels, a regression score, a word's tag, the generated text) from
    its saved tokenizer, label names, problem type and generation_config.json. Exports where
    --merge is refused say so in one line; the folder and its files take the exporter's umask (a
    bottleneck export's folder kept model/'s mode); a run interrupted after writing model/ is one
    line for every saved format (a bottleneck run's was "metrics.json: damaged (FileNotFoundError"),
    and a --smoke run's export says it is the small random model (it said nothing of it)."""
    from transformers import AutoTokenizer

    from toolkit import heads, inference, models

    run = toolkit.run(recipe, [f"model.checkpoint={FAMILY_IDS[family]}", *SHORT[1:], f"method={method}", *extra],
                      runs_dir=tmp_path / "runs", smoke=True)
    plan = inference.run_recipe(run.dir)
    want = toolkit.predict(run, inputs) if plan.task.predicts else None
    mine, run_tok = inference.load_model(run.dir, plan)
    head = plan.method.head(plan.task, models.recipe_family(inference.base_checkpoint(run.dir, plan),
                                                             plan.model.warm_start))
    exported = 0
    for merge in (False, True):
        out = tmp_path / f"out-{merge}"
        old = os.umask(0o002)  # a group's shared folder: every file and folder readable and writable by it
        try:
            note = toolkit.export(run, out, merge=merge)
        except toolkit.UserError as exc:
            assert merge and re.search(r"^--merge: .* (virtual tokens|non-linear layer)", str(exc)), exc
            assert not out.exists() and "\n" not in str(exc)
            continue
        finally:
            os.umask(old)
        assert note.endswith(f"; a --smoke run: this is the small random-weight model it trained on, not "
                             f"{FAMILY_IDS[family]}"), note
        modes = {p.relative_to(out): oct(p.stat().st_mode & 0o777) for p in [out, *out.rglob("*")]}
        assert set(modes.values()) <= {"0o775", "0o664"}, modes
        model, tok = exported_model(out, note, heads.get(head).auto_class).eval(), AutoTokenizer.from_pretrained(out)
        _predicts_as_the_run(plan.task, model, tok, mine, run_tok, inputs, want, note)
        exported += 1
    assert exported >= 1
    (run.dir / "metrics.json").unlink()  # interrupted after model/ was written: the same line for every format
    with pytest.raises(toolkit.UserError, match=r": the run is not finished \(no metrics.json\); run it to the end"):
        toolkit.export(run, tmp_path / "out-unfinished")
    assert not (tmp_path / "out-unfinished").exists()


def _predicts_as_the_run(task, model, tok, mine, run_tok, inputs: list, want: list | None, note: str) -> None:
    config = (model.get_base_model() if hasattr(model, "get_base_model") else model).config
    with torch.no_grad():
        if "generate from the prompt" in note:  # a text-to-text task: the text toolkit predict gave
            template = json.loads(re.search(r'generate from the prompt ("(?:[^"\\]|\\.)*")', note).group(1))
            decoder = not config.is_encoder_decoder
            prompts = [template.replace("{" + next(iter(task.predict_fields(mine))) + "}", text) for text in inputs]
            batch = tok(prompts, return_tensors="pt", padding=True, truncation=not decoder,
                        add_special_tokens=not decoder)
            ids = model.generate(**batch)
            ids = ids[:, batch["input_ids"].shape[1]:] if decoder else ids
            assert [t.strip() for t in tok.batch_decode(ids, skip_special_tokens=True)] == \
                [row["prediction"] for row in want], note
            return
        words = isinstance(inputs[0], list)
        args = [list(x) for x in zip(*inputs)] if isinstance(inputs[0], tuple) else [inputs]
        batch = tok(*args, return_tensors="pt", padding=True, truncation=True, is_split_into_words=words)
        got, ours = model(**batch), mine(**batch)  # the same ids: the weights as the run's
        for name in ("logits", "start_logits", "end_logits"):
            if getattr(ours, name, None) is not None:
                assert torch.allclose(getattr(got, name), getattr(ours, name), atol=1e-5), (name, note)
        if want is None or "start_logits" in got:  # nothing predicted / QA's answer search (test_squad):
            # the first input, plain text, read as the run read it (a pretraining objective's folder
            # reads "[MASK]" and "</s>" as transformers does: read_as_run)
            short = [list(x) for x in zip(*inputs[:1])] if isinstance(inputs[0], tuple) else [inputs[:1]]
            assert tok(*short)["input_ids"] == run_tok(*short)["input_ids"], note
            return
        if words:  # a word's tag: the argmax at its first sub-token, O past the cut (the line's reading)
            tags = []
            for b, sentence in enumerate(inputs):
                first = {w: t for t, w in reversed(list(enumerate(batch.word_ids(b)))) if w is not None}
                tags.append([config.id2label[int(got.logits[b, first[w]].argmax())] if w in first else "O"
                             for w in range(len(sentence))])
            assert tags == [row["tags"] for row in want], note
        elif config.problem_type == "regression":
            assert [float(s) for s in got.logits[:, 0]] == pytest.approx([row["score"] for row in want], abs=1e-5)
        else:
            probs = [{config.id2label[i]: float(p) for i, p in enumerate(row)} for row in got.logits.softmax(-1)]
            assert probs == pytest.approx([row["probabilities"] for row in want], abs=1e-5), note


def _starts_from_export_or_refuses(out: Path) -> None:
    """An export as the next run's model.checkpoint: a plain model is accepted; a base with a PEFT
    adapter beside it (transformers would load it unmerged and the method train over it, LoRA's
    new adapter replacing it) is one line at validate, naming the merged export."""
    adapter = (out / "adapter_config.json").is_file() and (out / "config.json").is_file()
    try:
        toolkit.validate("demo/sst2/minilm-lora", [f"model.checkpoint={out}"])
    except toolkit.UserError as exc:
        assert adapter or not (out / "config.json").is_file(), exc
        assert "\n" not in str(exc) and (not adapter or "holds a PEFT adapter" in str(exc) and "--merge" in str(exc)), exc
    else:
        assert not adapter, f"{out}: a base with an unmerged adapter beside it was accepted as a checkpoint"


def test_a_chained_run_is_loaded_from_the_run_it_started_from(tmp_path: Path, cli, monkeypatch) -> None:
    """model.checkpoint: {run: ...} with LoRA on top: eval gives the run's own metrics (the MLM
    base has no pooler: it starts as in the run), predict and export work from any folder, and a
    run moved away from its base is one line."""
    runs = tmp_path / "runs"
    run = toolkit.run("demo/sst2/minilm-full-from-wikitext", ["method={name: lora, r: 4}", *SHORT[1:]],
                      runs_dir=runs, smoke=True)
    assert json.loads((run.dir / "metrics.json").read_text())["base_run"].startswith("pretrain/wikitext-2/minilm-mlm/")
    monkeypatch.chdir(tmp_path)  # the recipes the chain names are not here: the run folder is enough
    got = toolkit.evaluate(run)["eval"]
    assert got == pytest.approx(json.loads((run.dir / "metrics.json").read_text())["eval"], abs=1e-6)
    (row,) = toolkit.predict(run, ["a fine film"])
    assert row["label"] in ("negative", "positive")
    assert "loads both" in toolkit.export(run, tmp_path / "out")
    moved = tmp_path / "elsewhere" / run.dir.relative_to(runs)
    moved.parent.mkdir(parents=True)
    run.dir.rename(moved)
    code, _, err = cli("predict", moved, "--input", "-")
    assert code == 2 and "whose model is not at" in err and "keep a chained run in the runs folder" in err


def test_a_swapped_attention_module_comes_back_with_its_parameters(tmp_path: Path, cli) -> None:
    from safetensors.torch import load_file

    from toolkit.inference import load_model, run_recipe

    for method in ("{name: full}", "{name: lora, r: 4}"):
        run = toolkit.run("demo/sst2/minilm-lora", [*SHORT, "model.attention=additive", f"method={method}"],
                          runs_dir=tmp_path / "runs", smoke=True)
        recipe = run_recipe(run.dir)
        model, _ = load_model(run.dir, recipe)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        assert base.config._attn_implementation == "additive"
        saved = load_file(str(run.dir / "model" / "attention.safetensors"))
        mine = {k.removeprefix("base_model.model."): v for k, v in model.state_dict().items() if "tk_attn" in k}
        assert mine and all(torch.equal(mine[k], saved[k]) for k in saved)
        code, _, err = cli("export", run.dir, tmp_path / f"out-{method[7:11]}")
        assert code == 2 and "toolkit's attention module 'additive'" in err


def write_rows(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([("premise", "hypothesis", "label"), *rows])
    return path


def test_eval_scores_a_file_on_the_models_labels(tmp_path: Path) -> None:
    rows = [(f"sentence {i} about cats", f"another {i % 3} dogs", ("maybe", "no", "yes")[i % 3]) for i in range(24)]
    train, dev = write_rows(tmp_path / "train.csv", rows), write_rows(tmp_path / "dev.csv", rows[:9])
    run = toolkit.run("demo/own-data/minilm-lora", [f"task.train_file={train}", f"task.eval_file={dev}",
                                                     "task.text_columns=[premise, hypothesis]", *SHORT[1:]],
                      runs_dir=tmp_path / "runs", smoke=True)
    two = write_rows(tmp_path / "two.csv", [r for r in rows[:9] if r[2] != "maybe"])  # a label fewer
    subset = toolkit.evaluate(run, overrides={"task.eval_file": str(two), "task.train_file": None})
    full = {r["premise"]: r["label"] for r in toolkit.predict(run, [{"premise": a, "hypothesis": b} for a, b, _ in rows[:9]])}
    right = sum(full[a] == y for a, _, y in rows[:9] if y != "maybe")
    assert subset["examples"] == {"": 6} and subset["eval"]["accuracy"] == pytest.approx(right / 6)
    other = write_rows(tmp_path / "other.csv", [(a, b, "perhaps" if y == "maybe" else y) for a, b, y in rows[:9]])
    with pytest.raises(toolkit.UserError, match=r"other.csv:2: label 'perhaps' is not one of maybe, no, yes"):
        toolkit.evaluate(run, overrides={"task.eval_file": str(other), "task.train_file": None})
    with pytest.raises(toolkit.UserError, match="the model's labels are maybe, no, yes; this task's are yes, no, maybe"):
        toolkit.evaluate(run, overrides={"task.labels": ["yes", "no", "maybe"]})


def test_predict_output_onto_its_own_input_is_refused(tmp_path: Path, cli) -> None:
    run = toolkit.run("demo/sst2/minilm-lora", SHORT, runs_dir=tmp_path / "runs", smoke=True)
    source = tmp_path / "in.txt"
    source.write_text("a fine film\n")
    os.link(source, tmp_path / "same.txt")
    for out in (source, tmp_path / "same.txt"):
        code, _, err = cli("predict", run.dir, "--input", source, "--output", out)
        assert code == 2 and "is the --input file" in err
    assert source.read_text() == "a fine film\n"


@pytest.fixture(scope="module")
def runs_on_base_folders(tmp_path_factory, tiny_checkpoint) -> dict[str, tuple[Path, Path]]:
    """A LoRA run and an in-context run, each on a local copy of a tiny base folder:
    kind -> (run folder, base folder)."""
    import shutil

    tmp = tmp_path_factory.mktemp("on-a-base")
    train, dev = write_rows(tmp / "train.csv", [(f"film {i}", "and more", ("neg", "pos")[i % 2]) for i in range(8)]), \
        write_rows(tmp / "dev.csv", [(f"play {i}", "and more", ("neg", "pos")[i % 2]) for i in range(4)])
    made = {}
    for kind, family, method in (("lora", "bert", "{name: lora, r: 4}"),
                                 ("icl", "gpt2", "{name: icl, shots: 1, verbalizers: [bad, good]}")):
        base = Path(shutil.copytree(tiny_checkpoint(family), tmp / f"base-{kind}"))
        recipe = tmp / f"{kind}.yaml"
        recipe.write_text(f"model: {{checkpoint: {base}}}\n"
                          f"task: {{name: text_classification, train_file: {train}, eval_file: {dev}, labels: [neg, pos], "
                          "text_columns: [premise, hypothesis]" + (kind != "icl") * ", max_length: 16" + "}\n"
                          f"method: {method}\n" + (kind != "icl") * "train: {max_steps: 2, batch_size: 4}\n")
        made[kind] = (toolkit.run(recipe, runs_dir=tmp / "runs").dir, base)
    return made


def _load_through(entry: str, run: Path, tmp_path: Path, cli) -> str:
    """The error line of one entry point that loads a finished run ('' when it succeeded)."""
    command, _, how = entry.partition("-")
    if how == "cli":
        args = {"eval": [], "predict": ["--input", str(tmp_path / "in.csv")], "export": [str(tmp_path / "out")]}
        write_rows(tmp_path / "in.csv", [("a fine film", "yes", "pos")])
        code, _, err = cli(command, run, *args[command])
        assert (code == 0) == (err.strip() == "" or "error:" not in err), err
        return err.strip() if code else ""
    call = {"eval": lambda: toolkit.evaluate(run), "predict": lambda: toolkit.predict(run, [("a fine film", "yes")]),
            "export": lambda: toolkit.export(run, tmp_path / "out")}[command]
    try:
        call()
    except toolkit.UserError as exc:
        return f"error: {exc}"
    return ""


# every entry point that loads a finished run, with the file of its base folder that is edited
BASE_LOADS = [(kind, f"{command}-{how}", file) for how in ("cli", "api")
              for kind, command, file in (("lora", "eval", "model.safetensors"), ("lora", "predict", "config.json"),
                                          ("lora", "export", "model.safetensors"), ("icl", "eval", "tokenizer.json"))]


@pytest.mark.parametrize("kind, entry, file", BASE_LOADS)
def test_a_result_on_a_base_folder_loads_only_on_that_base(runs_on_base_folders, tmp_path: Path, cli,
                                                          kind: str, entry: str, file: str) -> None:
    """A LoRA run's model/ holds the adapter, an in-context run's result is its base: both are
    loaded onto the base folder the recipe names, and nothing named that folder's contents. With
    the base edited after the run finished, eval, predict and export scored and predicted as
    another model under the run's name, exit 0 (the probabilities moved, the run did not); now
    each is one line naming the file. The same bytes written back (another time stamp) load."""
    run, base = runs_on_base_folders[kind]
    edited = base / file
    kept = edited.read_bytes()
    if file == "config.json":  # a setting changed (a config's whitespace and transformers_version are not the model)
        edited.write_text(json.dumps({**json.loads(kept), "layer_norm_eps": 1e-3}))
    else:
        edited.write_bytes(kept[:-1] + b" " if file.endswith(".json") else kept[:-1] + bytes([kept[-1] ^ 1]))
    try:
        said = _load_through(entry, run, tmp_path, cli)
    finally:
        edited.write_bytes(kept)
    assert said.startswith("error: ") and len(said.splitlines()) == 1, said
    assert f"{edited} changed since the run finished" in said and str(run) in said, said
    assert _load_through(entry, run, tmp_path, cli) == ""
