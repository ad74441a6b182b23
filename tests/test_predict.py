"""The prediction path a task declares (`Task.predict_fields` / `predict`): `toolkit.predict` and
`toolkit predict` reach every predicting task through it, with no per-task code in inference.
Each task type is run small (--smoke), then predicted on new inputs through the API and the CLI:
the rows carry the task's fields and its prediction, and generated text equals a direct
`model.generate` on the prompt the task builds."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import toolkit
from toolkit.errors import UserError
from toolkit.tasks import TASKS
from toolkit.tasks._generation import decode_texts
from toolkit.tasks.ner import split_words

SHORT = ["task.max_train_samples=8", "task.max_eval_samples=4", "train.max_steps=2"]
BRIEF = ["task.generation.max_new_tokens=12"]  # generated text: short, still past the prompt
DIALOGUE = "Anna: are we still on for lunch?\nBen: yes, 12:30 at the usual place. Anna: great"
QA = {"question": "Where is the Eiffel Tower?", "context": "The Eiffel Tower is a wrought-iron "
      "lattice tower on the Champ de Mars in Paris, France. It is named after Gustave Eiffel."}
# task, recipe, extra overrides, API inputs (as a user gives them), the CLI's input file (name, text)
CASES = [
    ("glue", "demo/sst2/minilm-lora", [], ["a wonderful film", {"sentence": "boring"}],
     ("in.txt", "a wonderful film\nboring\n")),
    ("text_classification", "demo/own-data/minilm-lora", [], [("A man sleeps.", "A person rests.")],
     ("in.csv", "sentence1,sentence2\nA man sleeps.,A person rests.\n")),
    ("ner", "ner/conll2003/minilm-lora", [], ["EU rejects German call", ["Peter", "Blackburn"]],
     ("in.jsonl", '{"tokens": ["EU", "rejects", "German", "call"]}\n{"tokens": ["Peter", "Blackburn"]}\n')),
    ("summarization", "summarization/samsum/bart-base-lora", [*BRIEF, "task.generation.num_beams=2"], [DIALOGUE, {"dialogue": "Tom: hi. Ann: hello!"}],
     ("in.txt", DIALOGUE.replace("\n", " ") + "\nTom: hi. Ann: hello!\n")),
    ("translation", "translation/iwslt14/t5-base-full", BRIEF, ["ein hund läuft im park .", "zwei männer ."],
     ("in.jsonl", '{"de": "ein hund läuft im park ."}\n{"de": "zwei männer ."}\n')),
    ("squad", "squad/v1.1/gpt2-full", BRIEF, [(QA["question"], QA["context"])],
     ("in.jsonl", json.dumps(QA) + "\n")),
    ("squad", "squad/v1.1/minilm-full", [], [QA, ("Who?", QA["context"])],
     ("in.csv", f'question,context\n{QA["question"]},"{QA["context"]}"\n')),
    ("squad", "squad/v1.1/minilm-full", ["task.version=v2"], [QA, ("Who?", QA["context"] * 20)],
     ("in.jsonl", json.dumps(QA) + "\n")),
]
IDS = ["glue", "pair", "ner", "summarization-bart-lora", "translation-t5", "squad-generative-gpt2",
       "squad-extractive-v1", "squad-extractive-v2"]


def direct_generate(model: Any, tok: Any, task: Any, source: str) -> str:
    """`model.generate` on the prompt the task builds for one source (no batch, no padding)."""
    prefix, suffix = task.affixes()
    if task.decoder_only:  # the source and the suffix tokenised apart, as encoding does
        ids = tok(prefix + source, add_special_tokens=False)["input_ids"] + (
            tok(suffix, add_special_tokens=False)["input_ids"] if suffix else [])
        enc = {"input_ids": toolkit_tensor([ids]), "attention_mask": toolkit_tensor([[1] * len(ids)])}
    else:
        enc = dict(tok(prefix + source + suffix, return_tensors="pt"))
    out = model.generate(**enc, **task.generation.kwargs(task.max_target_length), pad_token_id=tok.pad_token_id)
    new = out[0, enc["input_ids"].shape[1]:] if task.decoder_only else out[0]
    return decode_texts(tok, [new])[0]  # the evaluation's decoding (spaces as the tokenizer keeps them)


def toolkit_tensor(rows: list) -> Any:
    import torch

    return torch.tensor(rows)


def loaded(run_dir: Path) -> tuple[Any, Any, Any, list[str]]:
    """(task settings, model, tokenizer, input field names) of a finished run."""
    from toolkit.inference import load_model, run_recipe

    recipe = run_recipe(run_dir)
    model, tok = load_model(run_dir, recipe)
    return recipe.task, model, tok, recipe.task.predict_fields(model)


def loaded_once(load: Any) -> Any:
    """`load_model` that loads each run once and then returns that (model, tokenizer): for the
    calls of a test that check what happens after the load (a refused input, non-finite outputs),
    a model load each being most of such a call's time."""
    made: dict[str, Any] = {}

    def once(run: Any, *args: Any, **kwargs: Any) -> Any:
        if str(run) not in made:
            made[str(run)] = load(run, *args, **kwargs)
        return made[str(run)]
    return once


def check_rows(run: tuple[Any, Any, Any, list[str]], given: list[dict], rows: list[dict]) -> None:
    """Each row: the input's fields as given, and the task's prediction of the right shape."""
    task, model, tok, names = run
    assert len(rows) == len(given)
    for inp, row in zip(given, rows):
        if task.name == "ner":
            words = split_words(inp["tokens"]) if isinstance(inp["tokens"], str) else inp["tokens"]
            assert row["tokens"] == words and len(row["tags"]) == len(words)
            assert set(row["tags"]) <= set(task.labels)
            continue
        assert {n: row[n] for n in names} == {n: inp[n] for n in names}
        if "label" in row:
            assert row["label"] in task.label_names and row["score"] == row["probabilities"][row["label"]]
            assert math.isclose(sum(row["probabilities"].values()), 1.0, rel_tol=1e-5)
        elif getattr(task, "extractive", False):
            assert row["prediction"] == "" or row["prediction"] in inp["context"]
            if task.version == "v2":  # the fields and the rule of predictions.jsonl's v2.0 rows
                assert row["best_span"] and row["best_span"] in inp["context"]
                assert row["prediction"] == ("" if row["no_answer_score"] > 0.0 else row["best_span"])
            else:
                assert "no_answer_score" not in row and row["prediction"]
        else:  # generated: the same text as the model's own generate on the task's prompt
            source = task.source_text(task.raw_input(inp))
            assert set(row) == set(names) | {"prediction"} | ({"id"} if task.name == "squad" else set())
            assert row["prediction"] == direct_generate(model, tok, task, source)
    if not getattr(task, "extractive", True):  # text-to-text: something was generated to compare
        assert any(row["prediction"] for row in rows)


def as_rows(names: list[str], inputs: list) -> list[dict]:
    """The API's inputs as rows of the task's fields (a text, a tuple in field order, a word list)."""
    out = []
    for item in inputs:
        if isinstance(item, dict):
            out.append(item)
        elif isinstance(item, list):
            out.append({names[0]: item})
        else:
            out.append(dict(zip(names, [item] if isinstance(item, str) else item)))
    return out


@pytest.mark.parametrize("task, recipe, overrides, inputs, file", CASES, ids=IDS)
def test_predict_every_task_type_api_and_cli(tmp_path: Path, cli, capsys, conll_sample, squad_sample, task: str,
                                             recipe: str, overrides: list, inputs: list, file: tuple[str, str]) -> None:
    from toolkit.inference import read_inputs

    if recipe.startswith("ner/"):  # CoNLL-2003's first sentences, not its whole train file
        overrides = [*overrides, f"task.train_file={conll_sample[0]}", f"task.eval_file={conll_sample[1]}"]
    if recipe.startswith("squad/"):  # the dev file's first articles, split by article as the recipe splits it
        overrides = [*overrides, f"task.eval_file={squad_sample}"]
    run = toolkit.run(recipe, SHORT + overrides, runs_dir=tmp_path, smoke=True)
    assert "unknown token" not in capsys.readouterr().err  # the shipped data reads as text
    trained = loaded(run.dir)
    settings, names = trained[0], trained[3]
    assert settings.name == task
    predicted = toolkit.predict(run.dir, inputs)
    check_rows(trained, as_rows(names, inputs), predicted)

    source = tmp_path / file[0]
    source.write_text(file[1])
    out = tmp_path / "out.jsonl"
    code, _, err = cli("predict", run.dir, "--input", source, "--output", out)
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    check_rows(trained, read_inputs(str(source), names, settings.predict_word_lists), rows)

    if task == "text_classification":  # a split of such text: said by the run and by eval, naming its file
        odd = tmp_path / "emoji.tsv"
        odd.write_text("index\tsentence1\tsentence2\tlabel\n" + "".join(
            f"{i}\t😂🤣 {i}\t😊👍\t{'not_entailment' if i % 2 else 'entailment'}\n" for i in range(4)))
        code, _, err = cli("eval", run.dir, f"task.eval_file={odd}")
        assert code == 0 and f"warning: task.eval_file {odd}: 80% of the input text's characters (16 of 20," in err, err
        capsys.readouterr()
        toolkit.run(recipe, [*SHORT, f"task.eval_file={odd}"], runs_dir=tmp_path, smoke=True)
        err = capsys.readouterr().err
        assert f"warning: task.eval_file {odd}: 80%" in err and "task.train_file" not in err, err
    if task in ("glue", "text_classification", "ner"):
        check_ids_kept(run.dir, cli, tmp_path, names, as_rows(names, inputs), predicted)
    check_input_fields_carried(run.dir, cli, capsys, tmp_path, names, as_rows(names, inputs), predicted)

    # a field that is not text is one line from the API and from JSONL on standard input, never
    # predicted as the text "None" or "5" (the inputs are checked after the model loads: it is
    # loaded once for these calls)
    from toolkit import inference

    first = as_rows(names, inputs)[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inference, "load_model", loaded_once(inference.load_model))
        for bad, said in ((None, "null"), (5, r"a number \(5\)"), ("  ", "blank text"), ("\u200b\x01", "blank text"),
                           ([], r"a list \(\[\]\)")):
            with pytest.raises(toolkit.UserError, match=rf"^predict: input 0: field '{names[0]}' is {said}; expected text"):
                toolkit.predict(run.dir, [{**first, names[0]: bad}])
        stdin = tmp_path / "stdin.jsonl"
        stdin.write_text(json.dumps({**first, names[0]: 5}) + "\n")
        patch.setattr("sys.stdin", stdin.open(encoding="utf-8"))
        code, _, err = cli("predict", run.dir, "--input", "-")
        assert code == 2 and f"<stdin>: example 1: field '{names[0]}' is a number (5); expected text" in err
        # an input cut to fit the model is said, as a run says it (rule 8): it was cut silently.
        # (NER's too, beside its rows' `tagged`: it was unsaid); extractive QA reads windows: nothing cut there
        long = tmp_path / "long.jsonl"
        words = ["word"] * 600
        long.write_text(json.dumps({n: words if n in settings.predict_word_lists else " ".join(words) for n in names}) + "\n")
        code, _, err = cli("predict", run.dir, "--input", long, "--output", tmp_path / "long-out.jsonl")
        cuts = not getattr(settings, "extractive", False)
        assert code == 0 and bool(re.search(r"warning: 1 of 1 [\w ]+ cut at task\.max_length=\d+ tokens \(the rest is not seen\); the run was trained at task\.max_length=\d+; a run with a higher one reads more", err)) == cuts, err
        if getattr(settings, "extractive", False):  # but a question longer than a window leaves room
            # is cut to its first tokens that fit, as in a run: said by the CLI and the API (it was unsaid)
            said = r"warning: 1 of 1 questions cut to their first \d+ tokens \(the rest is not seen\): .*the run was trained with these windows: shorten the question"
            assert re.search(said, err), err
            capsys.readouterr()
            toolkit.predict(run.dir, [{"question": " ".join(words), "context": QA["context"]}])
            assert re.search(said, capsys.readouterr().err)
        # inputs the tokenizer reads as its unknown token (emoji: BERT's and T5's, not GPT-2's or
        # BART's bytes) are said, from the API and the CLI, with the file (they predicted unsaid)
        emoji = {n: ["😂🤣", "😊"] if n in settings.predict_word_lists else "😂🤣 😊👍" for n in names}
        (tmp_path / "emoji.jsonl").write_text(json.dumps(emoji) + "\n")
        capsys.readouterr()
        toolkit.predict(run.dir, [emoji])
        api = capsys.readouterr().err
        code, _, err = cli("predict", run.dir, "--input", tmp_path / "emoji.jsonl", "--output", tmp_path / "e.jsonl")
        unread = "bart" not in recipe and "gpt2" not in recipe
        for where, e in (("predict's inputs", api), (f"--input {tmp_path / 'emoji.jsonl'}", err)):
            assert code == 0 and (f"warning: {where}: 100% of the input text's characters" in e) == unread, e
            assert ("unknown token" in e) == unread, e
        if file[0].endswith(".txt"):  # plain text: a blank line between examples is said, not dropped unsaid
            source.write_text(file[1].replace("\n", "\n\u200b\n", 1) + "\n\n")  # a line of nothing visible is blank
            code, _, err = cli("predict", run.dir, "--input", source, "--output", tmp_path / "again.jsonl")
            assert code == 0 and f"warning: {source}: 1 blank line between examples (line 2) skipped" in err
            # a one-column CSV file's line of spaces alone, which pandas skips, was dropped unsaid (3 in, 2 out)
            table = tmp_path / "one-column.csv"
            quoted = ['"' + line.replace('"', '""') + '"' for line in file[1].splitlines()]
            table.write_text(f"{names[0]}\n" + "\n  \t\n".join(quoted[:2]) + "".join(f"\n{q}" for q in quoted[2:]) + "\n\n")
            code, out, err = cli("predict", run.dir, "--input", table)
            assert code == 0 and f"warning: {table}: 1 blank line between examples (line 3) skipped" in err, err
            assert len(out.splitlines()) == len(file[1].splitlines())

    # a model whose outputs are not finite predicts nothing: one line, and no --output file
    from conftest import with_nan_weights

    broken = with_nan_weights(inference.load_model)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inference, "load_model", loaded_once(broken))  # the API's and the CLI's: one load
        with pytest.raises(toolkit.UserError, match=r"^the model's outputs are not finite \(its \w*logits\)"):
            toolkit.predict(run.dir, inputs)
        code, _, err = cli("predict", run.dir, "--input", source, "--output", tmp_path / "nan.jsonl")
    assert code == 2 and "error: the model's outputs are not finite" in err and not (tmp_path / "nan.jsonl").exists()
    if hasattr(settings, "generation") and not getattr(settings, "extractive", False):  # text-to-text
        check_export_generates_as_the_run(run.dir, predicted, tmp_path)


def check_ids_kept(run: Path, cli: Any, tmp_path: Path, names: list[str], given: list[dict], want: list[dict]) -> None:
    """Finding: a classification or NER prediction row held the input's text fields and the
    prediction alone: a test file's `id` (`idx`, `guid`, ...) was dropped, and predictions could
    be joined to their inputs by position only (QA rows start with their question's id). The id
    field, under its own name, now starts each row, from the API and from CSV and JSONL files, the
    prediction unchanged; a file without one gives rows as before (above)."""
    from toolkit import inference

    keys = ["id", "ID", "idx"][:len(given)] + ["guid"] * max(0, len(given) - 3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inference, "load_model", loaded_once(inference.load_model))
        rows = toolkit.predict(run, [{"note": "x", k: 10 + i, **r} for i, (k, r) in enumerate(zip(keys, given))])
        assert [list(r)[0] for r in rows] == keys and [r[k] for k, r in zip(keys, rows)] == [10 + i for i in range(len(rows))]
        assert [{k: v for k, v in r.items() if k not in keys + ["note"]} for r in rows] == want
        assert [r["note"] for r in rows] == ["x"] * len(rows)  # carried through (check_input_fields_carried)
        records = [{"id": f"t{i}", **r} for i, r in enumerate(given)]
        (tmp_path / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        if "tokens" not in names:  # CSV: the id column, then the texts
            (tmp_path / "ids.csv").write_text("id," + ",".join(names) + "\n" + "".join(
                f"t{i}," + ",".join(json.dumps(r[n]) for n in names) + "\n" for i, r in enumerate(given)))
        for source in sorted(tmp_path.glob("ids.*")):
            code, out, err = cli("predict", run, "--input", source)
            assert code == 0, err
            got = [json.loads(line) for line in out.splitlines()]
            assert [r["id"] for r in got] == [f"t{i}" for i in range(len(given))] and all(list(r)[0] == "id" for r in got)
            assert [{k: v for k, v in r.items() if k != "id"} for r in got] == want


def check_input_fields_carried(run: Path, cli: Any, capsys: Any, tmp_path: Path, names: list[str],
                               given: list[dict], want: list[dict]) -> None:
    """Finding: a prediction row held the fields the task read and its prediction alone: an
    input's other fields (`doc`, a nested `meta`) were dropped (a summarization or translation
    input's `id` too), so rows repeating a text could be joined back by position only. Every task,
    from the API, JSONL and CSV (and `--output -`, standard output, which wrote a file named `-`):
    the task's row as before, then the input's other fields in its order, objects whole; an input
    field of a predicted field's name (a gold `label`) kept as `input_NAME`, said in one note."""
    from toolkit import inference

    predicted = next(k for k in want[0] if k not in names and k != "id")  # label, tags, prediction
    records = [{"doc": f"d{i}", **r, "meta": {"n": i}, predicted: "gold"} for i, r in enumerate(given)]
    source = tmp_path / "carried.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inference, "load_model", loaded_once(inference.load_model))
        capsys.readouterr()
        api = toolkit.predict(run, records)
        said = f"the input's field of a predicted field's name kept beside it: '{predicted}' as 'input_{predicted}' (predict reads no labels"
        assert f"note: predict's inputs: {said}" in capsys.readouterr().err
        code, out, err = cli("predict", run, "--input", source, "--output", "-")
        assert code == 0 and f"note: --input: {said}" in err, err
        assert not Path("-").exists()
        cli_rows = [json.loads(line) for line in out.splitlines()]
    for rows in (api, cli_rows):
        assert [list(r)[-3:] for r in rows] == [["doc", "meta", f"input_{predicted}"]] * len(rows)
        assert [(r["doc"], r["meta"], r[f"input_{predicted}"]) for r in rows] == [
            (f"d{i}", {"n": i}, "gold") for i in range(len(rows))]
        mine = ("doc", "meta", f"input_{predicted}", *(["id"] if "id" not in names and "id" in want[0] else []))
        assert [{k: v for k, v in r.items() if k not in mine} for r in rows] == [
            {k: v for k, v in w.items() if k not in mine} for w in want]


def check_export_generates_as_the_run(run: Path, want: list[dict], tmp_path: Path) -> None:
    """A text-to-text run's export, loaded with plain transformers as its line says, generates
    with a bare `generate` (no settings given: those of generation_config.json, a decoder's left
    padding from the saved tokenizer) what `toolkit predict` gives, from the prompt the line
    shows (`want`: toolkit.predict's rows). Finding: the export kept the base's generation_config (greedy, 20 tokens in all), so
    the folder wrote other text than the run (no beams, cut short; GPT-2's prompt alone passed
    20 tokens), and saved GPT-2's tokenizer padding on the right."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    for merge in (False,):  # an adapter's base beside it (bart-lora) or the whole model (t5, gpt2)
        out = tmp_path / f"export-{merge}"
        note = toolkit.export(run, out, merge=merge)
        template = json.loads(re.search(r'generate from the prompt ("(?:[^"\\]|\\.)*")', note).group(1))
        tok = AutoTokenizer.from_pretrained(out)
        decoder = json.loads((out / "config.json").read_text()).get("is_encoder_decoder") is not True
        model = (AutoModelForCausalLM if decoder else AutoModelForSeq2SeqLM).from_pretrained(out).eval()
        prompts = []
        for row in want:
            prompt = template
            for name, value in row.items():
                prompt = prompt.replace("{" + name + "}", str(value))
            prompts.append(prompt)
        batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=not decoder)
        with torch.no_grad():
            ids = model.generate(**batch)
        ids = ids[:, batch["input_ids"].shape[1]:] if decoder else ids
        assert (tok.padding_side == "left") == decoder, note
        got = [t.strip() for t in tok.batch_decode(ids, skip_special_tokens=True)]
        assert got == [row["prediction"] for row in want], (merge, note)


def test_every_text_to_text_and_tagging_task_predicts() -> None:
    """The rule over the registry: only the pretraining objectives have no prediction path."""
    silent = sorted(n for n in TASKS.names() if not TASKS.get(n).predicts)
    assert silent == ["clm", "denoise", "mlm", "span_corruption"]


def test_an_input_without_the_tasks_fields_is_one_line_naming_them(tmp_path: Path, cli) -> None:
    run = toolkit.run("squad/v1.1/minilm-full", SHORT, runs_dir=tmp_path, smoke=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "Who?", "text": "Nobody.", "title": "T"}\n')  # two fields might be the context
    code, _, err = cli("predict", run.dir, "--input", bad)
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: ")
    assert ("task.context_field: " + str(bad) + " has no 'context' field (candidates: 'text', 'title'; fields: "
            "question, text, title); name them so in the input") in err
    plain = tmp_path / "plain.txt"
    plain.write_text("Who?\n")
    code, _, err = cli("predict", run.dir, "--input", plain)
    assert code == 2 and "this task reads 2 fields (question, context); give JSONL or CSV" in err
    with pytest.raises(toolkit.UserError, match=r"task.context_field: predict: each input has no 'context' field "
                                                r"\(no candidate field; fields: question\)"):
        toolkit.predict(run.dir, [{"question": "Who?"}])


def test_a_task_without_a_prediction_path_is_one_line(tmp_path: Path, cli) -> None:
    run = toolkit.run("pretrain/wikitext-2/minilm-mlm", ["train.max_steps=1", "task.max_train_samples=8",
                                                         "task.max_eval_samples=8"], runs_dir=tmp_path, smoke=True)
    code, _, err = cli("predict", run.dir, "--input", "-")
    assert code == 2 and "predict handles trained runs of the tasks" in err and "(this is mlm with" in err


def test_own_data_text_to_text_predicts_by_the_field_found_in_the_file(tmp_path: Path, cli) -> None:
    """The issue's `transcript,notes` JSONL: training found the source field in the file (no
    task.source_field set); predict reads new inputs by that name, from JSONL or the API."""
    rows = [{"transcript": f"A: shall we meet at {h}? B: yes, at {h} by the station, see you then",
             "notes": f"they meet at {h}"} for h in range(1, 9)]
    data = tmp_path / "dialogues.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = toolkit.run("demo/own-data/minilm2minilm-summarization", [*SHORT, *BRIEF, f"task.train_file={data}",
                                                                    f"task.eval_file={data}"], runs_dir=tmp_path, smoke=True)
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({"transcript": "A: lunch at noon? B: sure"}) + "\n")
    code, out, err = cli("predict", run.dir, "--input", new)
    assert code == 0, err
    (row,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]  # after the run's own lines
    assert set(row) == {"transcript", "prediction"} and row["transcript"] == "A: lunch at noon? B: sure"
    assert toolkit.predict(run.dir, [{"transcript": "A: lunch at noon? B: sure"}]) == [row]


TRICKY = ["line\u2028separator", "para\u2029graph", "next\u0085line", "tab\tnew\nline\r\nend",
          "\"quoted\", 'comma', semi; colon", "é 東京 🙂 \u00a0nbsp", " spaced ", ""]


def _read_back(path: Path, name: str) -> list[dict]:
    """The written predictions as a reader gets them: JSON lines split as str.splitlines() splits
    them, a JSON list, or CSV/TSV through the toolkit's own reader (what --input reads)."""
    import gzip

    from toolkit import readers

    raw = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
    text = raw.decode("utf-8")
    if ".jsonl" in name:
        return [json.loads(line) for line in text.splitlines()]
    if ".json" in name:
        return json.loads(text)
    plain = path.with_name("back" + name.removesuffix(".gz")[3:])
    plain.write_text(text, encoding="utf-8")
    rows = readers.read(plain, readers.file_format(plain)).to_list()
    return [{k: json.loads(v) if k in ("probabilities", "tags") else v for k, v in r.items()} for r in rows]


def _writer_task(rows: list[dict]):
    """A task predicting `rows` whatever it is given, for the tests of predict's output writer: the
    calls predict makes of a task, each doing nothing else (one place, so a call predict learns is
    added once)."""
    from types import SimpleNamespace

    return SimpleNamespace(predict=lambda model, tok, inputs: rows, predict_word_lists=(), say_notices=lambda run: None,
                           predict_files=lambda rows: {}, note_unreadable=lambda tok, texts, where: None)


@pytest.mark.parametrize("name", ["out.jsonl", "out.json", "out.csv", "out.csv.gz", "out.jsonl.gz", "out.tsv"])
def test_predictions_written_read_back_as_they_were_in_the_format_the_name_asks(tmp_path: Path, monkeypatch,
                                                                               name: str) -> None:
    """Findings: `--output preds.csv` got JSON lines (exit 0); and json.dumps(ensure_ascii=False)
    leaves U+2028, U+2029 and NEL raw, which str.splitlines() breaks a line at, so a prediction
    holding one came back as two broken rows. The output's name says its format, as the input's
    does, and every text (line breaks, tabs, quotes, the delimiter, unicode) and nested value
    (every label's probability, a word's tags) reads back as it was."""
    from types import SimpleNamespace

    from toolkit import inference

    rows = [{"source": t, "prediction": t[::-1], "probabilities": {"pos": 0.25, t or "x": 0.75}, "tags": [t, "O"]}
            for t in TRICKY]
    task = _writer_task(rows)
    monkeypatch.setattr(inference, "_predicting_run", lambda run: (SimpleNamespace(task=task, smoke=False), None, None, ["source"]))
    monkeypatch.setattr(inference, "_read_inputs", lambda source, names, lists, task=None: (rows, names))
    out = tmp_path / name
    if name.endswith(".tsv"):  # unquoted values: no tab or line break can be written in one
        with pytest.raises(UserError, match=r"--output: .*out.tsv: TSV holds no tab or line break inside a value"):
            inference.predict_run(tmp_path, "-", str(out))
        return
    assert inference.predict_run(tmp_path, "-", str(out)) == len(rows)
    back = _read_back(out, name)
    if ".csv" in name:  # a CSV cell has no null: the empty text reads back as None
        back = [{k: "" if v is None else v for k, v in r.items()} for r in back]
    assert back == rows
    written = out.read_bytes().decode("utf-8") if not name.endswith(".gz") else ""
    assert all(ch in written for ch in "é東京🙂") or name.endswith(".gz")  # text as written, not \\u-escaped


@pytest.mark.parametrize("writer", ["runs.write_predictions", "inference.render"])
def test_every_jsonl_the_toolkit_writes_reads_back_one_row_a_line(tmp_path: Path, writer: str) -> None:
    """A run folder's predictions.jsonl and predict's output alike: NEL, U+2028 and U+2029 in a
    text are escaped, so a reader splitting at any line break still sees one row a line."""
    from toolkit import inference, runs

    rows = [{"prediction": f"a{c}b", "i": i} for i, c in enumerate("\u0085\u2028\u2029\n")]
    path = tmp_path / "p.jsonl"
    if writer == "runs.write_predictions":
        runs.write_predictions(path, rows, {})
    else:
        path.write_text(inference.render(rows, "jsonl"))
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows


@pytest.mark.parametrize("writer", ["runs.write_predictions", "inference.render jsonl", "inference.render json"])
def test_every_json_the_toolkit_writes_is_strict_json(tmp_path: Path, writer: str) -> None:
    """Rule: NaN and infinities are null in every JSON the toolkit writes, as metrics.json and
    log.jsonl already wrote them. A run folder's predictions.jsonl and predict's JSONL / JSON
    output wrote `NaN` / `Infinity` (not JSON: strict readers such as jq, JavaScript's JSON.parse
    or SQuAD v2.0's official script refuse or misread them), e.g. a v2.0 question no span fits."""
    from toolkit import inference, runs

    rows = [{"prediction": "x", "no_answer_score": math.inf, "probabilities": {"a": math.nan, "b": -math.inf}}]
    path = tmp_path / "p.json"
    if writer == "runs.write_predictions":
        runs.write_predictions(path, rows, {})
    else:
        path.write_text(inference.render(rows, writer.split()[-1]))
    strict = lambda constant: pytest.fail(f"{constant} is not JSON")
    text = path.read_text()
    back = json.loads(text, parse_constant=strict) if writer.endswith("json") else \
        [json.loads(line, parse_constant=strict) for line in text.splitlines()]
    assert back == [{"prediction": "x", "no_answer_score": None, "probabilities": {"a": None, "b": None}}]


def test_an_output_that_is_a_link_is_written_where_it_points(tmp_path: Path, monkeypatch) -> None:
    """Finding: `--output LINK` replaced the link with a file of its own (the rename over it), and
    the file it names kept its old predictions, exit 0; `> LINK` writes the file it names. A link
    is now written through, checked as that file (its folder missing: one line, nothing written),
    and an --input the link names is refused as the --input file is. A missing --input is one line
    before the model loads."""
    from types import SimpleNamespace

    from toolkit import inference

    rows = [{"source": "a", "prediction": "b"}]
    task = _writer_task(rows)
    monkeypatch.setattr(inference, "_predicting_run", lambda run: (SimpleNamespace(task=task, smoke=False), None, None, ["source"]))
    monkeypatch.setattr(inference, "_read_inputs", lambda source, names, lists, task=None: (rows, names))
    target, link = tmp_path / "kept" / "preds.jsonl", tmp_path / "latest.jsonl"
    target.parent.mkdir()
    target.write_text("old\n")
    link.symlink_to(target)
    assert inference.predict_run(tmp_path, "-", str(link)) == 1
    assert link.is_symlink() and json.loads(target.read_text()) == rows[0]
    gone = tmp_path / "gone.jsonl"
    gone.symlink_to(tmp_path / "missing" / "preds.jsonl")
    with pytest.raises(UserError, match=r"^--output: the folder .*missing does not exist"):
        inference.predict_run(tmp_path, "-", str(gone))
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"source": "a"}) + "\n")
    (tmp_path / "to-input.jsonl").symlink_to(source)
    with pytest.raises(UserError, match=r"is the --input file"):
        inference.predict_run(tmp_path, str(source), str(tmp_path / "to-input.jsonl"))
    assert sorted(p.name for p in tmp_path.rglob("*.tmp")) == []
    # a missing --input (or a folder) is one line before the model loads: it was said once the model had loaded
    monkeypatch.setattr(inference, "_predicting_run", lambda run: pytest.fail("the model loaded first"))
    for given, said in ((tmp_path / "nope.jsonl", "does not exist"), (tmp_path / "kept", "is a folder; give a file")):
        with pytest.raises(UserError, match=rf"^--input: .* {said}"):
            inference.predict_run(tmp_path, str(given), str(tmp_path / "out.jsonl"))


def test_each_predict_writes_through_a_temporary_name_of_its_own(tmp_path: Path, monkeypatch) -> None:
    """Two predicts to one --output at once shared one fixed temporary name (one cut the other's
    file, or renamed it away: FileNotFoundError). Each call now writes through the run folder's
    writer (`runs.write_whole`, a name of its own); what a killed writer left (its process gone)
    is removed by the next, a running one's is left alone."""
    from types import SimpleNamespace

    from toolkit import inference

    rows = [{"source": "a", "prediction": "b"}]
    task = _writer_task(rows)
    monkeypatch.setattr(inference, "_predicting_run", lambda run: (SimpleNamespace(task=task, smoke=False), None, None, ["source"]))
    monkeypatch.setattr(inference, "_read_inputs", lambda source, names, lists, task=None: (rows, names))
    out = tmp_path / "o[1].jsonl"  # glob characters in the name are the name's own
    dead = tmp_path / f"{out.name}.{2 ** 22 + 7}-abcd.tmp"  # past pid_max: no such process
    running = tmp_path / f"{out.name}.{os.getpid()}-beef.tmp"
    other = tmp_path / "other.jsonl.1-abcd.tmp"
    for f in (dead, running, other):
        f.write_text("half")
    assert inference.predict_run(tmp_path, "-", str(out)) == 1
    assert json.loads(out.read_text()) == rows[0]
    assert sorted(p.name for p in tmp_path.glob("*.tmp")) == sorted([running.name, other.name])


# One example per case, the fields a task reads (NER: words; a pair task: two texts), and what
# reading it gives: the row itself, or the refusal said after the place it was found.
SAME_EXAMPLE = {
    "ner text beside words": (["tokens"], [{"tokens": "EU rejects"}, {"tokens": ["Peter", "Blackburn"]}], None),
    "ner words": (["tokens"], [{"tokens": ["EU", "rejects"]}], None),
    "ner text": (["tokens"], [{"tokens": "EU rejects German call"}, {"tokens": "Peter"}], None),
    "ner null word": (["tokens"], [{"tokens": ["Peter", None]}], "'tokens' word 2 (None) is null"),
    "ner blank word": (["tokens"], [{"tokens": ["Peter", "\u200b"]}], "'tokens' word 2 ('\\u200b') is blank"),
    "ner number word": (["tokens"], [{"tokens": ["Peter", 5]}], "'tokens' word 2 (5) is a number"),
    "ner no words": (["tokens"], [{"tokens": []}], "field 'tokens' is a list ([]); expected text or a list of words"),
    "ner null": (["tokens"], [{"tokens": ["EU"]}, {"tokens": None}], "field 'tokens' is null; expected text or"),
    "single text": (["sentence"], [{"sentence": "a fine film"}, {"sentence": "dull"}], None),
    "pair": (["sentence1", "sentence2"], [{"sentence1": "A man sleeps.", "sentence2": "A person, resting."}], None),
}


def _written_as(fmt: str, names: list[str], rows: list[dict], tmp_path: Path, monkeypatch) -> str:
    """`rows` written in `fmt`: the source read_inputs gets."""
    import csv
    import io
    import sys

    if fmt in ("csv", "tsv", "stdin-csv", "stdin-tsv"):  # on standard input too (its header said CSV)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, names, delimiter="\t" if fmt.endswith("tsv") else ",", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        text = buffer.getvalue()
    elif fmt == "txt":
        text = "".join(r[names[0]] + "\n" for r in rows)
    elif fmt == "json":
        text = json.dumps(rows)
    else:  # jsonl, on standard input too
        text = "".join(json.dumps(r) + "\n" for r in rows)
    if fmt.startswith("stdin"):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
        return "-"
    path = tmp_path / f"in.{fmt}"
    path.write_text(text)
    return str(path)


def _holds(fmt: str, names: list[str], rows: list[dict]) -> bool:
    """Whether `fmt` can hold the rows: CSV and TSV texts only, plain text one text a line."""
    texts = all(isinstance(r[n], str) for r in rows for n in names)
    return fmt not in ("csv", "tsv", "txt", "stdin-csv", "stdin-tsv") or texts and (fmt != "txt" or len(names) == 1)


@pytest.mark.parametrize("case, fmt", [(c, f) for c in SAME_EXAMPLE for f in ["csv", "tsv", "jsonl", "json", "txt", "stdin",
                                                                               "stdin-csv", "stdin-tsv", "api"]
                                       if _holds(f, *SAME_EXAMPLE[c][:2])])
def test_the_same_example_in_every_input_format_reads_alike_or_is_refused_alike(tmp_path: Path, monkeypatch,
                                                                                 case: str, fmt: str) -> None:
    """CSV, TSV, JSONL, a JSON list, plain text, standard input and the Python API give the same
    rows for the same example, or refuse it with the same words after its place. A .jsonl file
    read words apart from standard input: text beside word lists in one file was refused as 'a
    list, expected text' (NER reads lists), a null word was predicted as the word 'None' (exit 0),
    and a blank word or an empty list was said in other words from a file than from standard input.
    CSV or TSV on standard input (its header naming the task's fields) was read as plain text:
    the header predicted as a text and each row's cells as one text, exit 0 (a pair: refused)."""
    from toolkit.inference import _as_row, read_inputs

    names, rows, refused = SAME_EXAMPLE[case]
    lists = ("tokens",)
    if fmt == "api":
        def read() -> list[dict]:
            return [_as_row(i, r, names, lists) for i, r in enumerate(rows)]
    else:
        source = _written_as(fmt, names, rows, tmp_path, monkeypatch)

        def read() -> list[dict]:
            return read_inputs(source, names, lists)
    if refused is None:
        assert [{n: r[n] for n in names} for r in read()] == rows
        return
    with pytest.raises(UserError) as caught:
        read()
    assert refused in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)


def _train_read(task: Any, path: Path) -> Any:
    """The task's own training reader on one file."""
    from toolkit.tasks import ner, text_classification
    if hasattr(task, "read"):  # text-to-text: read_pairs / read_records
        return task.read(str(path))
    if task.name == "ner":
        return ner.read_sentences(path, "tokens", "ner_tags")
    return text_classification.read_file(path)


@pytest.mark.parametrize("recipe, overrides, fields", [
    ("summarization/samsum/t5-base-lora", [], ["dialogue", "summary"]),
    ("summarization/samsum/t5-base-lora", ["task.source_field=doc", "task.target_field=sum"], ["doc", "sum"]),
    ("translation/multi30k/t5-base-lora", [], ["en", "de"]),
    ("glue/sst2/minilm-full", [], ["sentence", "label"]),
    ("ner/conll2003/minilm-lora", [], ["tokens", "ner_tags"]),
])
def test_predict_reads_the_json_layouts_training_reads_or_refuses_alike(tmp_path: Path, recipe: str,
                                                                       overrides: list, fields: list) -> None:
    """`{"data": [...]}`, which summarization and translation train on, was refused by predict
    ("expected a JSON list of objects"); now predict takes every JSON layout the task's training
    reader takes, and refuses the others with the training reader's words."""
    from toolkit import recipe as recipe_module
    from toolkit.inference import read_inputs
    from toolkit.recipe_data import find_recipe

    task = recipe_module.plan(find_recipe(recipe), overrides).recipe.task
    values = {"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"], "label": "1"}
    records = [{f: values.get(f, f"{f} text {i}") for f in fields} for i in range(2)]
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"data": records}))
    inputs = fields[:1]
    try:
        _train_read(task, path)
    except UserError as exc:
        with pytest.raises(UserError) as caught:
            read_inputs(str(path), inputs, ("tokens",), task)
        assert str(caught.value) == str(exc)
        return
    rows = read_inputs(str(path), inputs, ("tokens",), task)
    assert [r[inputs[0]] for r in rows] == [r[inputs[0]] for r in records]


@pytest.mark.parametrize("recipe, overrides, rename", [
    ("summarization/samsum/bart-base-lora", BRIEF, {"source": "document", "target": "summary"}),
    ("translation/iwslt14/t5-base-full", BRIEF, {"source": "DE", "target": "en_US"}),
], ids=["summarization-preset", "translation-preset"])
def test_a_preset_run_predicts_on_the_fields_eval_finds(tmp_path: Path, cli, recipe: str, overrides: list,
                                                        rename: dict) -> None:
    """A preset's run (SAMSum, IWSLT14) scores `toolkit eval RUN task.eval_file=NEW` by the fields
    it finds in NEW (`document`; the source language's code in any case, `DE`), as a file of its
    own data is read; predict demanded the preset's own name (`dialogue`, `de`) of the same
    records. Now one rule: predict finds them alike, and its rows carry the input's names."""
    run = toolkit.run(recipe, SHORT + overrides, runs_dir=tmp_path, smoke=True)
    task = loaded(run.dir)[0]
    raw = task.load()["eval"][""].select(range(3))
    new = tmp_path / "new.jsonl"
    rows = [{rename[k]: r[k] for k in ("source", "target")} for r in raw]
    new.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = cli("eval", run.dir, f"task.eval_file={new}")
    assert code == 0, err
    evaluated = [json.loads(line)["prediction"] for line in (run.dir / "predictions-eval.jsonl").read_text().splitlines()]
    source = rename["source"]
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text("".join(json.dumps({source: r[source]}) + "\n" for r in rows))
    code, out, err = cli("predict", run.dir, "--input", inputs)
    assert code == 0, err
    predicted = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [p[source] for p in predicted] == [r[source] for r in rows]  # under the input's own name
    assert sorted(p["prediction"] for p in predicted) == sorted(evaluated)
    api = toolkit.predict(run.dir, [{source: r[source]} for r in rows])
    assert [p["prediction"] for p in api] == [p["prediction"] for p in predicted]


@pytest.mark.parametrize("recipe, source", [("translation/multi30k/t5-base-lora", "a dog runs in the park ."),
                                            ("translation/multi30k/gpt2-lora", "two men walk .")])
def test_a_peft_generation_export_names_where_its_generation_config_is(tmp_path: Path, recipe: str,
                                                                       source: str) -> None:
    """A PEFT generation run exported with its base apart (base/: a method transformers does not
    load as trained, DoRA here) said "the run's decoding is in generation_config.json", a file
    that folder does not have (the base's is in OUT/base/). The line names the file where it is;
    followed as written in plain transformers and PEFT (the base from the path its line names,
    `generate` with no settings given), it generates what `toolkit predict` gives."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    run = toolkit.run(recipe, [*SHORT, *BRIEF, "method={name: dora, r: 4}"], runs_dir=tmp_path, smoke=True)
    want = toolkit.predict(run, [source])
    out = tmp_path / "export"
    note = toolkit.export(run, out)
    where = re.search(r"the run's decoding is in (\S+?)[;)]", note).group(1)
    assert (out / where.removeprefix("OUT/")).is_file(), note
    base = re.search(r"PeftModel\.from_pretrained\((\w+)\.from_pretrained\(OUT/base\), OUT\)", note)
    assert base and where == "OUT/base/generation_config.json", note
    auto = {"AutoModelForCausalLM": AutoModelForCausalLM, "AutoModelForSeq2SeqLM": AutoModelForSeq2SeqLM}[base.group(1)]
    model = PeftModel.from_pretrained(auto.from_pretrained(out / "base"), out).eval()
    template = json.loads(re.search(r'generate from the prompt ("(?:[^"\\]|\\.)*")', note).group(1))
    field = re.search(r"\{(\w+)\}", template).group(1)
    tok = AutoTokenizer.from_pretrained(out)
    decoder = base.group(1) == "AutoModelForCausalLM"
    batch = tok([template.replace("{" + field + "}", source)], return_tensors="pt", add_special_tokens=not decoder)
    with torch.no_grad():
        ids = model.generate(**batch)
    ids = ids[:, batch["input_ids"].shape[1]:] if decoder else ids
    assert [t.strip() for t in tok.batch_decode(ids, skip_special_tokens=True)] == [want[0]["prediction"]], note


def test_a_csv_on_standard_input_says_its_skipped_lines_under_the_name_given(monkeypatch, capsys) -> None:
    """A CSV read from standard input (its header naming the task's field) or a pipe is read from a
    temporary copy: its warnings named that copy (/tmp/toolkit-input-.../input.csv), which the
    user never gave; they name `<stdin>`, and the rows are the file's."""
    import io
    import sys

    from toolkit.inference import read_inputs

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"sentence\nok\n \t\nfine\n")))
    assert read_inputs("-", ["sentence"]) == [{"sentence": "ok"}, {"sentence": "fine"}]
    err = capsys.readouterr().err
    assert "note: <stdin>: read as CSV: its first line is a header naming the task's field (sentence)" in err
    assert "warning: <stdin>: 1 blank line between examples (line 3) skipped" in err and "toolkit-input-" not in err
