"""A transformers user's first ten minutes: their own `text,label` CSV through the shipped
own-data recipe with two overrides, predict, and both exports loaded in a fresh offline process
with the lines the README shows, giving `toolkit predict`'s labels and scores."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GOOD = ["a wonderful film", "great acting and a moving story", "I loved every minute", "brilliant and funny",
        "a joy to watch", "superb direction", "heartfelt and beautiful", "charming and clever"]
BAD = ["a dull mess", "terrible acting and a boring plot", "I hated every minute", "awful and tedious",
       "a waste of time", "poor direction", "lifeless and ugly", "clumsy and stupid"]
TEXTS = ["a wonderful film", "a dull mess", "great acting"]

# What the README's "Your own data" section shows, run as a user would: a fresh process, offline,
# that never imports the toolkit. One such process serves the module (a request a line: texts, base,
# folders), its interpreter's start-up (torch, transformers, peft) being most of a load's time.
LOAD = """
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
for request in sys.stdin:
    texts, base, folders = json.loads(request)
    results = []
    for out in folders:
        if base:  # a prompt method: peft loads it on the base exported beside it
            from peft import PeftModel
            model = PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base), out)
        else:
            model = AutoModelForSequenceClassification.from_pretrained(out)
        tokenizer = AutoTokenizer.from_pretrained(out)
        with torch.no_grad():
            probs = model.eval()(**tokenizer(texts, return_tensors="pt", padding=True)).logits.softmax(-1)
        labels = model.config.id2label
        results.append([{labels[i]: float(p[i]) for i in range(len(p))} for p in probs])
    print("RESULT", json.dumps(results), flush=True)
"""


def write_csv(path: Path, rows: int) -> Path:
    lines = [f'"{(GOOD if i % 2 == 0 else BAD)[i // 2 % 8]} ({i})",{"pos" if i % 2 == 0 else "neg"}' for i in range(rows)]
    path.write_text("text,label\n" + "\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def load_offline(tmp_path_factory: pytest.TempPathFactory):
    """load(*folders, base="") -> each folder's probabilities for TEXTS, loaded by the module's
    fresh offline process (LOAD), which has nothing of the toolkit's: the folders alone."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("TOOLKIT_CACHE", None)
    where = tmp_path_factory.mktemp("offline")
    with (where / "stderr.txt").open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", LOAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True, env=env, cwd=where)

        def load(*folders: Path, base: str = "") -> list[list[dict[str, float]]]:
            proc.stdin.write(json.dumps([TEXTS, base, [str(f) for f in folders]]) + "\n")
            proc.stdin.flush()
            while True:  # its answer's line (a library may print lines of its own)
                ready, _, _ = select.select([proc.stdout], [], [], 300)
                line = proc.stdout.readline() if ready else ""
                assert line, (where / "stderr.txt").read_text()[-2000:]  # it died or hung: its stderr
                if line.startswith("RESULT "):
                    return json.loads(line[len("RESULT "):])

        yield load
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, (where / "stderr.txt").read_text()[-2000:]


def predicted(cli, run: Path, tmp_path: Path) -> list[dict[str, float]]:
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    code, _, err = cli("predict", run, "--input", source, "--output", tmp_path / "pred.jsonl")
    assert code == 0, err
    return [json.loads(l)["probabilities"] for l in (tmp_path / "pred.jsonl").read_text().splitlines()]


def same(got: list[dict[str, float]], want: list[dict[str, float]]) -> None:
    assert [set(g) for g in got] == [{"neg", "pos"}] * len(TEXTS)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-4)


def own_run(cli, tmp_path: Path, *overrides: str, smoke: bool = True) -> Path:
    train, dev = write_csv(tmp_path / "train.csv", 60), write_csv(tmp_path / "dev.csv", 20)
    code, _, err = cli("run", "demo/own-data/minilm-lora", f"task.train_file={train}", f"task.eval_file={dev}",
                       *overrides, *(["--smoke"] if smoke else []), "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (metrics,) = (tmp_path / "runs").rglob("metrics.json")
    return metrics.parent


def test_own_csv_predict_and_both_exports_load_offline_with_the_users_labels(tmp_path: Path, cli, load_offline) -> None:
    run = own_run(cli, tmp_path)
    want = predicted(cli, run, tmp_path)
    adapter_base = json.loads((run / "model" / "adapter_config.json").read_text())["base_model_name_or_path"]
    notes = {}
    for folder, flags in (("adapter", []), ("merged", ["--merge"])):
        code, notes[folder], err = cli("export", run, tmp_path / folder, *flags)
        assert code == 0, err
    assert "AutoModelForSequenceClassification.from_pretrained(OUT) loads both, offline" in notes["adapter"]
    exported = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert exported["base_model_name_or_path"] == adapter_base  # the name it was trained on, kept
    for folder in ("adapter", "merged"):
        config = json.loads((tmp_path / folder / "config.json").read_text())
        assert config["id2label"] == {"0": "neg", "1": "pos"} and config["label2id"] == {"neg": 0, "pos": 1}
    shutil.rmtree(tmp_path / "runs")  # the base the adapter names is gone: the export stands alone
    adapter, merged = load_offline(tmp_path / "adapter", tmp_path / "merged")
    same(adapter, want)
    same(merged, want)


def test_prompt_method_export_loads_with_peft_on_the_base_beside_it(tmp_path: Path, cli, load_offline) -> None:
    run = own_run(cli, tmp_path, "method={name: prompt_tuning, num_virtual_tokens: 4}")
    want = predicted(cli, run, tmp_path)
    code, out, err = cli("export", run, tmp_path / "o")
    assert code == 0 and "PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(OUT/base), OUT)" in out, err
    shutil.rmtree(tmp_path / "runs")
    (loaded,) = load_offline(tmp_path / "o", base=str(tmp_path / "o" / "base"))
    same(loaded, want)


def test_export_of_a_packaged_base_loads_offline_and_keeps_its_hub_id(tmp_path: Path, cli, load_offline) -> None:
    """The real all-MiniLM-L6-v2, served from its PyPI package's folder: one optimizer step."""
    run = own_run(cli, tmp_path, "train.max_steps=1", "train.warmup_ratio=0", "task.max_length=32", smoke=False)
    want = predicted(cli, run, tmp_path)
    assert cli("export", run, tmp_path / "adapter")[0] == 0
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"
    (loaded,) = load_offline(tmp_path / "adapter")
    same(loaded, want)
