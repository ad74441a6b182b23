"""Recipes: YAML + extends + overrides -> typed dataclasses; every mistake is one line, exit 2."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest
import yaml

import toolkit
from conftest import ROOT, write_recipe
from toolkit import recipe as recipes
from toolkit.errors import UserError

RECIPE_FILES = [p for p in (ROOT / "recipes").rglob("*.yaml") if not p.name.startswith("_")]
BASE = """model: {checkpoint: bert-base-uncased}
task: {name: glue, subset: sst2}
method: {name: lora, r: 4}
train: {epochs: 1, lr: 1.0e-4}
"""


def test_extends_and_overrides_resolve_to_typed_fields(tmp_path: Path) -> None:
    write_recipe(tmp_path / "recipes" / "_base.yaml", BASE)
    child = write_recipe(tmp_path / "recipes" / "glue" / "x.yaml",
                         "extends: ../_base.yaml\ntrain: {batch_size: 8}\n")
    r = recipes.load(child, ["train.lr=3e-4", "method.r=16", "train.epochs=2"])
    assert r.name == "glue/x"
    assert (r.train.lr, r.train.batch_size, r.train.epochs) == (3e-4, 8, 2.0)
    assert isinstance(r.train.epochs, float) and r.method.r == 16 and r.method.name == "lora"
    assert r.task.subset == "sst2" and r.model.checkpoint == "bert-base-uncased"


def test_hash_is_of_the_resolved_recipe(tmp_path: Path) -> None:
    path = write_recipe(tmp_path / "a.yaml", BASE)
    same = write_recipe(tmp_path / "b.yaml", BASE.replace("lr: 1.0e-4", "lr: 0.0001, seed: 42"))
    assert recipes.load(path).hash == recipes.load(same).hash  # explicit default == implicit
    assert recipes.load(path).hash != recipes.load(path, ["train.seed=1"]).hash
    assert recipes.load(path).hash != recipes.load(path, smoke=True).hash


@pytest.mark.parametrize("override, message", [
    (["train.lrr=1"], "train.lrr: unknown key (did you mean 'lr'?)"),
    (["train.batch_size=abc"], "train.batch_size: expected int, got str 'abc'"),
    (["train.batch_size=0"], "train.batch_size: 0 is below the minimum 1"),
    (["task.subset=sst3"], "task.subset: 'sst3' is not allowed (did you mean 'sst2'?)"),
    (["task.name=glu"], "task.name: unknown task 'glu' (did you mean 'glue'?)"),
    (["method.name=lorra"], "method.name: unknown method 'lorra' (did you mean 'lora'?)"),
    (["method.rank=4"], "method.rank: unknown key"),
    (["method={name: full}", "method.r=4"], "method.r: unknown key (method full takes no settings)"),
    (["train.mixed_precision=fp8"], "train.mixed_precision: 'fp8' is not allowed"),
    (["train.mixed_precision=null"], "train.mixed_precision: 'null' is not allowed"),  # was 'None', as Python says it
    (["train.mixed_precision=true"], "train.mixed_precision: 'true' is not allowed"),
    (["model.attention=spda"], "model.attention: unknown attention 'spda' (did you mean 'sdpa'?)"),
    (["train.metric=f1"], "train.metric: 'f1' is not a metric of this task"),
    (["trian.lr=1"], "trian: unknown section (did you mean 'train'?)"),
    # a name differing in case (or in a compatibility form) alone: it listed every choice
    (["train.LR=1"], "train.LR: unknown key (did you mean 'lr'?)"),
    (["train.ＬＲ=1"], "train.ＬＲ: unknown key (did you mean 'lr'?)"),
    (["method.name=LoRA"], "method.name: unknown method 'LoRA' (did you mean 'lora'?)"),
    (["task.name=GLUE"], "task.name: unknown task 'GLUE' (did you mean 'glue'?)"),
    (["task.subset=SST2"], "task.subset: 'SST2' is not allowed (did you mean 'sst2'?)"),
    # ...or in an invisible character alone (pasted): the line showed the same name twice
    (["train.mixed_precision=fp16\u200b"], "'fp16\u200b' is not allowed (did you mean 'fp16'? it holds U+200B, an invisible"),
    (["train.lr\u00a0x=1"], "train.lr\u00a0x: unknown key (did you mean 'lr'? it holds U+00A0, an invisible character)"),
    # both used to pass, and the loop took warmup_steps without a word about the ratio
    (["train.warmup_ratio=0.1", "train.warmup_steps=5"],
     "train.warmup_steps: 5 and train.warmup_ratio: 0.1 both set the warm-up; keep one (set the other to 0)"),
    # the loop's schedule takes at least one step: 0 epochs trained one silently
    (["train.epochs=0"], "train.epochs: 0 trains no epoch, yet the run would take one optimizer step"),
    # names users bring from transformers, run_glue and PEFT say where the toolkit keeps them
    (["train.learning_rate=1e-4"], "train.learning_rate: unknown key (transformers' learning_rate is train.lr)"),
    (["train.per_device_train_batch_size=8"],
     "train.per_device_train_batch_size: unknown key (transformers' per_device_train_batch_size is "
     "train.batch_size (per process))"),
    (["task.max_seq_length=64"], "task.max_seq_length: unknown key (run_glue's max_seq_length is task.max_length)"),
    (["method.lora_r=4"], "method.lora_r: unknown key (PEFT's lora_r is method.r)"),
    (["num_train_epochs=1"], "num_train_epochs: unknown section (transformers' num_train_epochs is train.epochs)"),
    # Trainer names for what the toolkit fixes were guessed as fields of another meaning
    # (early_stopping_patience, mixed_precision, fast_dropout)
    (["train.early_stopping_threshold=0.01"], "train.early_stopping_threshold: unknown key (transformers' "
     "early_stopping_threshold is not a setting: any improvement of train.metric restarts"),
    (["train.adam_epsilon=1e-6"], "(transformers' adam_epsilon is not a setting: AdamW's eps is Trainer's default"),
    (["train.dataloader_drop_last=true"], "(transformers' dataloader_drop_last is not a setting: no batch is dropped"),
    (["train.eval_on_start=true"], "train.eval_on_start: unknown key (transformers' eval_on_start is not a "
     "setting: nothing is evaluated before the first step"),
    (["train.eval_delay=10"], "(transformers' eval_delay is not a setting: evaluations are at every"),
    (["train.save_only_model=true"], "(transformers' save_only_model is not a setting: a checkpoint holds"),
    (["train.label_smoothing_factor=0.1"], "train.label_smoothing_factor: unknown key (transformers' "
     "label_smoothing_factor is not a setting: the loss is the task's plain cross-entropy"),
])
def test_mistakes_name_the_field(tmp_path: Path, override: list[str], message: str) -> None:
    path = write_recipe(tmp_path / "r.yaml", BASE)
    with pytest.raises(UserError) as info:
        recipes.load(path, override)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_validate_cli_exit_codes(tmp_path: Path, cli) -> None:
    good = write_recipe(tmp_path / "good.yaml", BASE)
    bad = write_recipe(tmp_path / "bad.yaml", BASE.replace("r: 4", "r: 4, alpah: 3"))
    code, out, err = cli("validate", good, bad)
    assert code == 2
    assert "1 of 2 recipes valid" in out
    assert err.strip() == f"error: {bad}: method.alpah: unknown key (did you mean 'alpha'?)"
    assert cli("validate", good)[0] == 0


def test_every_shipped_recipe_validates(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shipped recipe is valid; the only refusals allowed are data files the recipe names
    that this machine does not hold (SQuAD v2.0's dev file is the user's to download): `validate`
    says so, as the run would, rather than "valid"."""
    monkeypatch.chdir(ROOT)
    code, out, err = cli("validate")
    errors = [line for line in err.splitlines() if line.strip()]
    absent = [line for line in errors if (m := re.search(r": task\.\w+_file: (\S+): no such file$", line))
              and not Path(m.group(1)).exists()]
    assert errors == absent and code == (2 if absent else 0), err
    assert f"{len(RECIPE_FILES) - len(absent)} of {len(RECIPE_FILES)} recipes valid" in out


def test_extends_with_another_method_starts_from_its_defaults(tmp_path: Path) -> None:
    """A leaf that switches method must not inherit the base method's settings (LoRA's r)."""
    write_recipe(tmp_path / "base.yaml", BASE)
    leaf = write_recipe(tmp_path / "leaf.yaml", "extends: base.yaml\nmethod: {name: full}\n")
    assert recipes.load(leaf).method.name == "full"
    same = write_recipe(tmp_path / "same.yaml", "extends: base.yaml\nmethod: {name: lora, r: 2}\n")
    assert recipes.load(same).method.r == 2


@pytest.mark.parametrize("how", ["override", "extends", "api"])
def test_an_empty_mapping_clears_the_bases_and_a_mapping_merges_key_by_key(tmp_path: Path, how: str) -> None:
    """A mapping-valued setting (method.rank_pattern / alpha_pattern) written `{}` over a base
    that sets one merged into it, so the run kept the pattern it was asked to drop, exit 0: an
    empty mapping below the sections clears, from an override, a leaf recipe and the Python API
    alike; a mapping with keys merges into the base's key by key, as settings sections do."""
    write_recipe(tmp_path / "base.yaml", BASE.replace("r: 4}", "r: 4, rank_pattern: {query: 2}, alpha_pattern: {query: 4}}"))
    if how == "extends":
        leaf = write_recipe(tmp_path / "leaf.yaml", "extends: base.yaml\nmethod: {rank_pattern: {}, alpha_pattern: {value: 8}}\n")
        method = recipes.load(leaf).method
    elif how == "override":
        method = recipes.load(tmp_path / "base.yaml", ["method.rank_pattern={}", "method.alpha_pattern={value: 8}"]).method
    else:
        resolved = toolkit.validate(tmp_path / "base.yaml", {"method.rank_pattern": {}, "method.alpha_pattern": {"value": 8}})
        method = types.SimpleNamespace(**resolved["method"])
    assert method.rank_pattern == {} and method.alpha_pattern == {"query": 4, "value": 8} and method.r == 4
    assert recipes.load(tmp_path / "base.yaml", ["method={}"]).method.rank_pattern == {"query": 2}  # a section: as before


def test_smoke_shrinks_lengths_the_task_has_and_keeps_the_rest() -> None:
    """--smoke caps sequence and generation lengths (a decoder's 512-token prompt over a 50k-word
    output layer costs seconds a step even on the smallest model), only where the task has them
    and they are longer, so every smoke recipe stays valid (strides below lengths)."""
    summ = recipes.load(ROOT / "recipes/summarization/samsum/gpt2-full.yaml", smoke=True).task
    assert (summ.max_length, summ.max_target_length, summ.generation.max_new_tokens) == (128, 32, 16)
    assert summ.generation.num_beams == recipes.load(ROOT / "recipes/summarization/samsum/gpt2-full.yaml").task.generation.num_beams
    qa = recipes.load(ROOT / "recipes/squad/v1.1/bert-base-uncased-full.yaml", smoke=True).task
    assert qa.max_length == 128 and qa.doc_stride < qa.max_length
    clm = recipes.load(ROOT / "recipes/pretrain/ptb/gpt2-clm.yaml", smoke=True).task
    assert clm.eval_stride <= clm.max_length
    glue = recipes.load(ROOT / "recipes/demo/sst2/minilm-full.yaml", smoke=True).task
    assert glue.max_length == 64  # shorter than the cap: as written


def test_validate_and_sweep_take_shipped_names(cli, tmp_path: Path) -> None:
    code, out, err = cli("validate", "demo/sst2/minilm-lora")
    assert code == 0 and out.strip() == "1 of 1 recipes valid", err
    code, out, err = cli("sweep", "demo/sst2/minilm-lora", "train.lr=1e-4,3e-4", "--dry-run",
                         "--runs-dir", tmp_path / "runs")
    assert code == 0 and "2 runs (dry run" in out, err
    code, _, err = cli("validate", "demo/sst2/minilm-lorra")
    assert code == 2 and "did you mean demo/sst2/minilm-lora, " in err


# --- strict YAML: every YAML the toolkit reads ---------------------------------------------------
def test_a_key_given_twice_is_refused_with_both_positions(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("model: {checkpoint: bert-base-uncased}\ntask: {name: glue, subset: sst2}\n"
                    "method: {name: lora}\ntrain:\n  lr: 1.0e-3\n  epochs: 1\n  lr: 1.0e-4\n")
    with pytest.raises(UserError, match=r"r.yaml: the key 'lr' is given twice in one mapping \(line 5, column 3 "
                       r"and line 7, column 3\); keep one"):
        recipes.load(path)
    with pytest.raises(UserError, match=r"override 'train=\{lr: 1, lr: 2\}': the key 'lr' is given twice"):
        recipes.load(ROOT / "recipes/demo/sst2/minilm-lora.yaml", ["train={lr: 1, lr: 2}"])
    path.write_text("model: {checkpoint: bert-base-uncased}\nmodel: {checkpoint: roberta-base}\n")
    with pytest.raises(UserError, match=r"the key 'model' is given twice .*\(line 1, column 1 and line 2, column 1\)"):
        recipes.load(path)
    # a merge key is a key too: PyYAML merged both and let the second's lr win without a word
    path.write_text(f"extends: {ROOT / 'recipes/demo/sst2/minilm-lora.yaml'}\n"
                    "train:\n  <<: {lr: 1.0e-3}\n  <<: {lr: 5.0e-5}\n")
    with pytest.raises(UserError, match=r"the key '<<' is given twice in one mapping \(line 3, column 3 and line 4, "
                       r"column 3\); merge several in one: <<: \[\*a, \*b\]"):
        recipes.load(path)
    with pytest.raises(UserError, match=r"override 'train=\{<<: \{lr: 1\}, <<: \{lr: 2\}\}': the key '<<' is given twice"):
        recipes.load(ROOT / "recipes/demo/sst2/minilm-lora.yaml", ["train={<<: {lr: 1}, <<: {lr: 2}}"])
    path.write_text(f"extends: {ROOT / 'recipes/demo/sst2/minilm-lora.yaml'}\n"
                    "train:\n  <<: [{lr: 1.0e-3}, {lr: 5.0e-5, seed: 3}]\n  seed: 4\n")
    # YAML's merge order: the first mapping named wins, the mapping's own keys over all; PyYAML
    # 6.0.4 let the last one named win (it tells a merged key by its string object's identity)
    assert (recipes.load(path).train.lr, recipes.load(path).train.seed) == (1.0e-3, 4)
    assert recipes.load(ROOT / "recipes/demo/sst2/minilm-lora.yaml",
                        ["train={<<: [{lr: 0.5}, {lr: 0.25, seed: 3}], seed: 4}"]).train.lr == 0.5


def test_only_true_and_false_are_booleans(tmp_path: Path) -> None:
    """YAML 1.1's yes/no/on/off are strings (YAML 1.2): labels `[no, yes]` stay labels, and a
    true/false setting written `yes` is refused rather than read."""
    data = tmp_path / "d.csv"
    data.write_text("text,label\ngood,yes\nbad,no\n")
    path = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}, labels: [no, yes]}}
method: {{name: lora}}
train: {{mixed_precision: no, keep_best: true}}
""")
    recipe = recipes.load(path)
    assert recipe.task.labels == ["no", "yes"] and recipe.train.mixed_precision == "no"
    assert recipes.load(path, ["task.labels=[off, on]"]).task.labels == ["off", "on"]
    with pytest.raises(UserError, match=r"train.keep_best: expected bool, got str 'yes'"):
        recipes.load(path, ["train.keep_best=yes"])


def test_every_yaml_read_is_strict() -> None:
    """No module reads YAML but through recipe_data.safe_yaml (the strict loader)."""
    import re

    readers = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "toolkit").rglob("*.py"))
               if re.search(r"yaml\.(safe_load|load|full_load|unsafe_load|compose)\(", p.read_text())]
    assert readers == ["toolkit/recipe_data.py"]


# Documents where a YAML reader may slip: YAML 1.1 lookalikes, merges, block scalars, line ends,
# a BOM, tabs, directives, and refused ones (a key twice, a control character, a lone surrogate).
YAML_CORNERS = [
    "a: [no, yes, on, off, y, n, 010, 0o17, 0x1f, 1:30, 1e-4, 1.5e3, .inf, -.Inf, .nan, ~, null, '', 2020-01-01]",
    "base: &b {lr: 1, wd: 2}\nslow: &s {lr: 3}\nx:\n  <<: [*b, *s]\n  wd: 4\n'<<': quoted\n=: eq\n",
    "a: |\n  one\n   two\n\nb: >-\n  folded\n  text\n\n  para\nc: 'it''s'\nd: \"\\t\\u00e9\\x41\"\n",
    "a: 1\r\nb: [x,\r\n  y]\r\n", "a: 1\x85b: 2", "a: 1\u2028b: 2", "\ufeffa: 1", "a:\tb", "a: b\t# c\n",
    "%YAML 1.1\n---\na: 1\n", "%YAML 1.3\n---\na: 1\n", "--- a\n...\n", "- a\n- - b\n  - c: d\n", "? [a]\n: b\n",
    "{a: [1, {b: c}], d: e f, g: 'h: i'}", "a: b: c", "a: 1\na: 2\n", "x: {<<: {a: 1}, <<: {b: 2}}",
    "a: !!binary aGk=", "a: !!set {b}", "a: 99999999999999999999", "a: -0", "a: +1", "a: 0b11", "a: 1_000",
    "a: [\tb]", "a: {\tb: c}", "a: b\tc", "key:\t", "a: 'b\tc'", "{a:1}", "[a:b]", '{"a":1, "b":[1,2]}', "a: [b: c]",
    "a: !!python/name:os.system x", "a: !!float 1", "a: &x\nb: *x", "y: {<<: *a}", "<<: 1", "- a\n---\n- b",
    "a: 'x\x07'", "a: \ud800", "[a, b", "a: *nothing", "  a: 1\n b: 2", "a: é\u00a0ü 日本", "",
    "a: !!float 0x10", "a: !!bool maybe", "a: !!null 5", "a: !!map 5", "a: [1e-400]", "a: !!float .5", "a: !!int -7",
    "a: " + "[" * 3000 + "]" * 3000, "a: " + "[" * 62 + "]" * 62, "a: " + "{b: " * 70 + "1" + "}" * 70,
]


def test_libyaml_reads_what_the_pure_reader_reads(monkeypatch) -> None:
    """safe_yaml reads by libyaml where PyYAML has it: the same value as the pure-Python reader for
    every document that reader accepts (each shipped YAML and the corners above), and the pure
    reader's own message (its positions, its words) for every one it refuses; none that it
    refuses is read by libyaml."""
    from toolkit import recipe_data

    shipped = [*sorted((ROOT / "recipes").rglob("*.yaml")), ROOT / "toolkit/data/published.yaml"]
    texts = YAML_CORNERS + [p.read_text(encoding="utf-8") for p in shipped]

    def read(text: str) -> str:
        try:
            return repr(("value", recipe_data.safe_yaml(text, "t.yaml")))
        except UserError as exc:
            return repr(("refused", str(exc)))

    assert recipe_data._FAST, "PyYAML without libyaml: the suite's YAML reads are all pure-Python"
    fast = [read(text) for text in texts]
    monkeypatch.setattr(recipe_data, "_FAST", False)
    differ = [(text[:40], got, want) for text, got, want in zip(texts, fast, map(read, texts)) if got != want]
    assert not differ and len(shipped) > 150


# --- overrides: each setting once; a mapping merges as an `extends` base does ---------------------
TWICE = [(["train.lr=1e-4", "train.lr=abc"], r"override 'train.lr=abc': train.lr is already set by 'train.lr=1e-4'"),
         (["train.lr=1e-4", " train.lr=2e-4"], r"train.lr is already set by 'train.lr=1e-4'"),
         (["train.lr=1e-4", "train={lr: 2e-4, epochs: 1}"], r"train.lr is already set by 'train.lr=1e-4'"),
         (["method={name: full}", "method.name=lora"], r"method.name is already set by 'method=\{name: full\}'")]


@pytest.mark.parametrize("overrides, message", TWICE)
def test_a_setting_given_twice_is_refused_by_every_entry_point(tmp_path: Path, cli, overrides: list[str],
                                                               message: str) -> None:
    """`train.lr=1e-4 train.lr=abc` validated and ran with 1e-4 (the last one silently won): the
    rule of a key given twice in one YAML mapping, for overrides, wherever they are taken."""
    import toolkit

    recipe = ROOT / "recipes/demo/sst2/minilm-lora.yaml"
    run = tmp_path / "run"  # a run folder as far as `eval` reads it before loading anything
    run.mkdir()
    (run / "recipe.yaml").write_text(recipes.dump(recipes.load(recipe)))
    task_twice = ["task.max_eval_samples=4", "task={max_eval_samples: 8}"]  # eval takes task.* settings only
    runs = ["--runs-dir", tmp_path / "runs"]
    for command in (["run", recipe, *overrides, *runs], ["validate", recipe, *overrides],
                    ["sweep", recipe, *overrides, "--dry-run", *runs]):
        code, _, err = cli(*command)
        assert code == 2 and len(err.strip().splitlines()) == 1, (command, err)
        said = re.search(message, err) or command[0] == "sweep" and "sweep axis 'train.lr' is given twice" in err
        assert said, (command, err)
    code, _, err = cli("eval", run, *task_twice)
    assert code == 2 and "task.max_eval_samples is already set by 'task.max_eval_samples=4'" in err, err
    with pytest.raises(UserError, match="task.max_eval_samples is already set by"):
        toolkit.evaluate(run, overrides=task_twice)
    for call in (lambda: toolkit.run(recipe, overrides, runs_dir=tmp_path / "runs"),
                 lambda: toolkit.sweep(recipe, overrides, runs_dir=tmp_path / "runs")):
        with pytest.raises(UserError, match=f"{message}|sweep axis 'train.lr' is given twice"):
            call()
    assert not (tmp_path / "runs").exists()  # refused before any run folder


def test_a_mapping_override_merges_into_the_section() -> None:
    """`train={epochs: 2}` used to replace the whole train section: the recipe's lr 1e-3, warmup
    and weight decay went silently back to the defaults. It merges as an `extends` base does; a
    plug-in section naming another plug-in still replaces (a `full` method takes no `r`)."""
    recipe = ROOT / "recipes/demo/sst2/minilm-lora.yaml"
    written = recipes.load(recipe)
    merged = recipes.load(recipe, ["train={epochs: 2}", "method={alpha: 32}"])
    assert merged.train == recipes.load(recipe, ["train.epochs=2"]).train
    assert merged.train.lr == written.train.lr == 1e-3 and merged.train.epochs == 2.0
    assert (merged.method.r, merged.method.alpha) == (written.method.r, 32)
    assert recipes.load(recipe, ["method.r=4", "method={name: lora, alpha: 32}"]).method.r == 4
    assert recipes.load(recipe, ["method={name: full}"]).method.name == "full"
    # the dotted spelling of another plug-in is the same recipe (it said `method.r: unknown key`
    # for full, and dora kept lora's section), whatever the order of the settings beside it
    for other in ("full", "dora", "ia3"):
        assert recipes.load(recipe, [f"method.name={other}"]).hash == recipes.load(recipe, [f"method={{name: {other}}}"]).hash
    assert recipes.load(recipe, ["method.r=4", "method.name=dora"]).method.r == 4
    assert recipes.load(recipe, ["method.name=dora", "method.r=4"]).method.r == 4
    assert recipes.load(recipe, ["method.name=lora"]).method == written.method  # the same plug-in: merged


# (recipe, an override naming another plug-in, the settings given beside it, what they must read)
RENAMES = [("demo/sst2/minilm-lora", "method={name: dora, r: 4}", ["method.alpha=8", "method.dropout=0.1"],
            lambda r: (r.method.name, r.method.r, r.method.alpha, r.method.dropout) == ("dora", 4, 8, 0.1)),
           ("demo/sst2/minilm-lora", "method.name=ia3", ["method.target_modules=[query, value]", "method.feedforward_modules=[value]"],
            lambda r: (r.method.name, r.method.target_modules) == ("ia3", ["query", "value"])),
           ("demo/sst2/minilm-lora", "task={name: text_classification, train_file: $TOOLKIT_DATA/glue/RTE/train.tsv}",
            ["task.eval_file=$TOOLKIT_DATA/glue/RTE/dev.tsv", "task.max_length=32"],
            lambda r: (r.task.name, r.task.eval_file, r.task.max_length) == ("text_classification",
                                                                             "$TOOLKIT_DATA/glue/RTE/dev.tsv", 32)),
           ("attention/sst2/minilm-sdpa", "model.attention.name=local", ["model.attention.window=8"],
            lambda r: (r.model.attention.name, r.model.attention.window) == ("local", 8))]


@pytest.mark.parametrize("recipe, rename, beside, reads", RENAMES, ids=[r[1] for r in RENAMES])
def test_overrides_are_one_layer_whatever_their_order(tmp_path: Path, recipe: str, rename: str,
                                                      beside: list[str], reads) -> None:
    """`method.alpha=8 method={name: dora, r: 4}` ran dora with its default alpha 16, exit 0: the
    mapping, applied after the setting, named another plug-in and replaced the section, where the
    other order kept alpha 8 (and `model.attention.window=8 model.attention.name=local` on an sdpa
    recipe was refused in one order only). The overrides are one layer over the recipe, as a leaf
    file is over its base: every order is the same recipe and the same run, in `run`, `validate`,
    the API and each point of a sweep."""
    import itertools

    from toolkit import runs, sweeps

    path = recipes.find_recipe(recipe)
    orders = [list(o) for o in itertools.permutations([rename, *beside])]
    loaded = [recipes.load(path, order) for order in orders]
    assert all(reads(r) for r in loaded), [r.to_dict() for r in loaded]
    assert len({r.hash for r in loaded}) == 1
    folders = {str(f) for order in orders[:2] for f in sweeps.plan([path], order, None, tmp_path, False)[1]}
    assert folders == {str(runs.run_dir(loaded[0], tmp_path))}


def test_a_bare_plugin_name_is_its_mapping() -> None:
    """`attention: local` is `{name: local}` (docs/recipes.md), yet as an override over a recipe
    with `{name: local, window: 16}` the bare name reset the window to 64 where the mapping kept
    16: naming the plug-in already there keeps its settings however it is spelled; another name
    starts afresh either way."""
    path = recipes.find_recipe("attention/sst2/minilm-local")
    written = recipes.load(path)
    assert written.model.attention.window == 16
    for spelling in ("model.attention=local", "model.attention={name: local}", "model.attention.name=local"):
        assert recipes.load(path, [spelling]).hash == written.hash, spelling
    assert recipes.load(path, ["model.attention=bigbird"]).hash == recipes.load(path, ["model.attention={name: bigbird}"]).hash


def test_every_dropout_and_beta_refuses_one() -> None:
    """A probability that keeps nothing: dropout 1 zeroes what it drops (LoRA's adapters saw only
    zeros and never trained, the head alone did) and an importance average with beta 1 never
    moves. Every such field of the model section and of every method is open at 1."""
    import dataclasses

    from toolkit.methods import METHODS
    from toolkit.recipe_data import ModelConfig
    from toolkit.schema import build_dataclass

    checked = []
    for cls in [ModelConfig, *(METHODS.get(n) for n in METHODS.names())]:
        for f in dataclasses.fields(cls):
            if "dropout" not in f.name and not f.name.startswith("beta"):
                continue
            base = {"checkpoint": "x"} if cls is ModelConfig else {}
            assert getattr(build_dataclass(cls, {**base, f.name: 0.5}, "s"), f.name) == 0.5
            with pytest.raises(UserError, match=rf"s.{f.name}: 1.0 must be below 1.0"):
                build_dataclass(cls, {**base, f.name: 1.0}, "s")
            checked.append(f"{cls.__name__}.{f.name}")
    assert {"ModelConfig.dropout", "Lora.dropout", "Dora.dropout", "AdaLora.dropout", "AdaLora.beta1"} <= set(checked)


# --- YAML 1.2 core scalars: a value reaches the run as written, or is one line -------------------
AS_WRITTEN = [("train.seed", "010", 10), ("train.seed", "0o17", 15), ("train.seed", "0x1f", 31),
              ("train.seed", "+7", 7), ("train.lr", "5e-5", 5e-5), ("train.lr", "1E-3", 1e-3),
              ("train.lr", ".5", 0.5), ("train.metric", "2020-01-01", "2020-01-01"),
              ("train.metric", "=", "="), ("train.mixed_precision", "no", "no"),
              ("train.lr", "!!float 1", 1.0), ("train.seed", "!!int 0x1f", 31), ("train.keep_best", "!!bool False", False),
              ("train.max_steps", "!!null ~", None), ("train.lr", "1e-320", 1e-320)]
REFUSED = [("train.seed", "1:30", r"train.seed: expected int, got str '1:30'"),  # YAML 1.1: 90
           ("train.batch_size", "1_000", r"train.batch_size: expected int, got str '1_000'"),
           ("train.lr", ".nan", r"train.lr: nan is not a finite number"),
           ("train.lr", "!!binary aGk=", r"not valid YAML at line \d+, column \d+ .*binary"),
           ("train.metric", "!!timestamp 2020-01-01", r"not valid YAML .*timestamp"),
           ("train.metric", "!!set {a}", r"not valid YAML .*set"),
           ("train.metric", "'a\x07'", r"not valid YAML: character U\+0007 at position \d+ is not allowed"),
           ("train.metric", "a\udcff", r"\\udcff.*not valid YAML: character U\+DCFF"),  # argv not UTF-8
           # an explicit core tag is read by YAML 1.2's forms too: PyYAML's YAML 1.1 ran `!!float 1:30`
           # as 90, `!!bool on` as true, dropped the 5 of `!!null 5`; `!!float 0x10`, `!!bool maybe` and
           # `!!float` alone were tracebacks
           ("train.lr", "!!float 1:30", r"not valid YAML at line \d+, column \d+ \('1:30' is not a YAML 1.2 float"),
           ("train.lr", "!!float 0x10", r"'0x10' is not a YAML 1.2 float \(e.g. 3e-4, 0.5, .inf\)"),
           ("train.lr", "!!float", r"'' is not a YAML 1.2 float"),
           ("train.batch_size", "!!int 1_000", r"'1_000' is not a YAML 1.2 integer"),
           ("train.keep_best", "!!bool on", r"'on' is not a YAML 1.2 bool \(e.g. true or false\)"),
           ("train.keep_best", "!!bool maybe", r"'maybe' is not a YAML 1.2 bool"),
           ("train.max_steps", "!!null 5", r"'5' is not a YAML 1.2 null"),
           ("train.eval_every", "!!map 5", r"the tag !!map on a scalar, not a mapping"),
           # a nonzero number past a float's smallest read as 0: lr 0, `max_grad_norm` 0 (clipping off)
           ("train.lr", "1e-400", r"1e-400 at line \d+, column \d+ is too small for a float \(it reads as 0\)"),
           ("train.max_grad_norm", "!!float -2.5E-999", r"-2.5E-999 at line \d+, column \d+ is too small"),
           ("train.max_grad_norm", "'1e-400'", r"train.max_grad_norm: 1e-400 is too small for a float"),
           # nested past what PyYAML's recursive composer reads: a RecursionError traceback, exit 1
           ("train.lr", "[" * 3000 + "]" * 3000, r"nested more than 64 levels deep \(mappings and lists inside"),
           ("train.lr", "[" * 70 + "]" * 70, r"nested more than 64 levels deep")]


def _written(tmp_path: Path, key: str, text: str) -> Path:
    """A recipe file over the demo recipe setting `key` (section.field) to `text` as written."""
    section, field = key.split(".")
    return write_recipe(tmp_path / "r.yaml", f"extends: {ROOT / 'recipes/demo/sst2/minilm-lora.yaml'}\n"
                        f"{section}:\n  {field}: {text}\n")


@pytest.mark.parametrize("key, text, value", AS_WRITTEN)
def test_a_value_reaches_the_run_as_written(tmp_path: Path, key: str, text: str, value) -> None:
    """PyYAML reads YAML 1.1: `seed: 010` ran with seed 8 (octal), `1:30` as 90, `5e-5` was a
    string, `2020-01-01` a date that crashed the recipe's hash with a TypeError. Recipes, overrides
    and a run's recipe.yaml are read as YAML 1.2's core schema: the same value from a file, an
    override and the Python API, and the saved recipe.yaml reads back as the same recipe."""
    import toolkit.api as api

    demo = ROOT / "recipes/demo/sst2/minilm-lora.yaml"
    section, field = key.split(".")
    sources = [(demo, [f"{key}={text}"]), (demo, api.override_list({key: value})), (_written(tmp_path, key, text), [])]
    if key == "train.metric":  # a string: the task's metric check names it as written
        for path, overrides in sources:
            with pytest.raises(UserError, match=f"train.metric: '{re.escape(text)}' is not a metric"):
                recipes.load(path, overrides)
        return
    loaded = [recipes.load(path, overrides) for path, overrides in sources]
    for recipe in loaded:
        got = getattr(getattr(recipe, section), field)
        assert got == value and type(got) is type(value), (recipe, got)
    saved = recipes.dump(loaded[0])
    assert recipes.parse(recipes.safe_yaml(saved, "recipe.yaml")).hash == loaded[0].hash
    assert yaml.safe_load(saved)[section][field] == value  # and a YAML 1.1 reader of recipe.yaml


@pytest.mark.parametrize("key, text, message", REFUSED)
def test_a_value_yaml_11_would_misread_is_one_line(tmp_path: Path, cli, key: str, text: str, message: str) -> None:
    """What YAML 1.2 does not read as a number (`1:30`, `1_000`), or a tag naming a type a recipe
    cannot hold, is one line naming the field or the position, from a file and an override."""
    override = ["validate", ROOT / "recipes/demo/sst2/minilm-lora.yaml", f"{key}={text}"]
    commands = [override] if "\udcff" in text else [["validate", _written(tmp_path, key, text)], override]
    for command in commands:  # a lone surrogate comes from argv only (bytes that are not UTF-8)
        code, _, err = cli(*command)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and re.search(message, lines[0]), (command, err)


@pytest.mark.parametrize("name", ["../../elsewhere", "/tmp/elsewhere", "a/../../b", "~/runs", "a//b", "."])
def test_a_name_never_puts_the_run_outside_the_runs_folder(tmp_path: Path, cli, name: str) -> None:
    """`name: /tmp/x` (in a recipe, an override or a hand-edited recipe.yaml) put the run folder at
    /tmp/x/<hash>, and `../..` above the runs folder, with exit 0: a name is a relative path of
    folder names, refused otherwise before anything is written."""
    recipe = ROOT / "recipes/demo/sst2/minilm-lora.yaml"
    written = write_recipe(tmp_path / "r.yaml", f"extends: {recipe}\nname: '{name}'\n")
    message = f"name: '{re.escape(name)}' is not a relative path of folder names"
    for path, overrides in ((written, []), (recipe, [f"name='{name}'"])):
        with pytest.raises(UserError, match=message):
            recipes.load(path, overrides)
        code, _, err = cli("run", path, *overrides, "--runs-dir", tmp_path / "runs")
        assert code == 2 and re.search(message, err) and err.count("\n") == 1, err
    assert recipes.load(recipe, ["name=my/own-name"]).name == "my/own-name"
    assert not (tmp_path / "runs").exists()


def test_extends_names_the_file_that_extends_and_reads_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing base said `recipe /x/base.yaml does not exist`, without the file that named it;
    `extends: ~/base.yaml` looked for a folder named `~`; `extends=...` as an override was `unknown
    section (did you mean 'extends'?)`."""
    home = tmp_path / "home"
    write_recipe(home / "base.yaml", BASE)
    monkeypatch.setenv("HOME", str(home))
    leaf = write_recipe(tmp_path / "leaf.yaml", "extends: ~/base.yaml\ntrain: {batch_size: 8}\n")
    assert recipes.load(leaf).train.batch_size == 8 and recipes.load(leaf).method.r == 4
    lost = write_recipe(tmp_path / "lost.yaml", "extends: [base.yaml]\n")
    with pytest.raises(UserError, match=rf"^{re.escape(str(lost))}: extends: base.yaml: {tmp_path}/base.yaml does not exist$"):
        recipes.load(lost)
    with pytest.raises(UserError, match=r"^extends: only a recipe file names its bases; an override"):
        recipes.load(leaf, ["extends=base.yaml"])


def _list_fields() -> list[tuple[str, type, str, object]]:
    """(where, settings class, field, an item of its type) for every list setting of the train and
    model sections, every method and every task."""
    import dataclasses
    import typing

    from toolkit.methods import METHODS
    from toolkit.recipe_data import ModelConfig, TrainConfig
    from toolkit.tasks import TASKS

    classes = [("train", TrainConfig), ("model", ModelConfig), *(("method", METHODS.get(n)) for n in METHODS.names()),
               *(("task", TASKS.get(n)) for n in TASKS.names())]
    out = []
    for where, cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = next((a for a in (hints[f.name], *typing.get_args(hints[f.name])) if typing.get_origin(a) is list), None)
            if tp is None:
                continue
            (inner,) = typing.get_args(tp)
            item = typing.get_args(inner)[0] if typing.get_origin(inner) is typing.Literal else 3 if inner is int else "x"
            out.append((f"{where}.{getattr(cls, 'name', cls.__name__)}.{f.name}", cls, f.name, item))
    return out


@pytest.mark.parametrize("where, cls, name, item", _list_fields(), ids=[w for w, *_ in _list_fields()])
def test_every_list_setting_refuses_an_item_given_twice(where: str, cls: type, name: str, item: object) -> None:
    """`train.report_to: [tensorboard, tensorboard]`, `method.target_modules: [query, query]`,
    `length_buckets: [64, 32, 64]` validated: another recipe hash for the same run (a sweep ran it
    twice), and for verbalizers or labels two classes nothing tells apart. Every list setting is a
    set: an item given twice is one line naming it."""
    from toolkit.recipe_data import ModelConfig
    from toolkit.schema import build_dataclass

    base = {"checkpoint": "x"} if cls is ModelConfig else {}
    with pytest.raises(UserError, match=rf"^s.{name}: {re.escape(repr(item))} is listed twice; give each once$"):
        build_dataclass(cls, {**base, name: [item, item]}, "s")


def test_a_chained_run_is_a_new_run_when_its_upstream_recipe_changes(tmp_path: Path) -> None:
    """Fine-tuning from `{run: pre.yaml}` kept its run folder when pre.yaml was edited (more
    epochs) and run again into a new folder: `toolkit run fine.yaml` said "finished already" with
    the scores of a model tuned from the old pretraining. The run id holds the upstream run's id
    (its recipe, data and processes); the recipe and its hash still say what was written."""
    from toolkit import runs

    pre = write_recipe(tmp_path / "recipes" / "pre.yaml", f"extends: {ROOT / 'recipes/pretrain/wikitext-2/minilm-mlm.yaml'}\n")
    fine = write_recipe(tmp_path / "recipes" / "fine.yaml", f"extends: {ROOT / 'recipes/demo/sst2/minilm-full.yaml'}\n"
                        f"model: {{checkpoint: {{run: {pre}}}}}\n")
    before = recipes.load(fine)
    pre.write_text(pre.read_text() + "train: {epochs: 2}\n")
    after = recipes.load(fine)
    assert before.hash == after.hash and before.upstream_id != after.upstream_id
    assert after.upstream_id == runs.run_id(recipes.load(pre))
    assert runs.run_dir(before, tmp_path) != runs.run_dir(after, tmp_path)
    plain = recipes.load(ROOT / "recipes/demo/sst2/minilm-full.yaml")  # no chain: the id is as before
    assert plain.upstream_id is None


# how the name comes -> (the name as Python holds it, what the line says of it)
ODD_NAMES = {"newline in name:": ("a\nb", r"a control character \('\\n'\)"),
             "NUL in name:": ("a\x00b", r"a control character \('\\x00'\)"),
             "tab in the file's name": ("r\tx", r"a control character \('\\t'\)"),
             "byte 0xff in the file's name": ("r\udcffx", "a byte that is not UTF-8")}


@pytest.mark.parametrize("how", sorted(ODD_NAMES))
def test_a_run_name_is_printable_text_at_every_entry_point(tmp_path: Path, cli, how: str) -> None:
    """A run's name is a folder name printed in lines, notes and report tables. `name: "a|b\\nc"`
    ran, and its report row split in two with every cell under another column's header; a NUL
    raised ValueError and a recipe file named with the byte 0xff a UnicodeEncodeError (the run's
    lock), tracebacks. A control character or a byte that is not UTF-8 in the name (`name:`, or
    the recipe file's name it defaults to) is one line at validate, run, sweep and the API."""
    import json

    name, said = ODD_NAMES[how]
    base = ROOT / "recipes/demo/sst2/minilm-lora.yaml"
    if how.endswith("name:"):
        recipe, overrides = base, [f"name={json.dumps(name)}"]  # YAML reads JSON's escapes
    else:
        recipe, overrides = write_recipe(tmp_path / f"{name}.yaml", f"extends: {base}\n"), []
    message = f"name: {re.escape(ascii(name))}.* holds {said}; a run's name is a folder name"
    runs_dir = tmp_path / "runs"
    for command in (["validate", recipe, *overrides], ["run", recipe, *overrides, "--runs-dir", runs_dir],
                    ["sweep", recipe, *overrides, "--dry-run", "--runs-dir", runs_dir]):
        code, _, err = cli(*command)
        assert code == 2 and re.search(message, err) and err.count("\n") == 1, (command, err)
    for call in (lambda: toolkit.run(recipe, overrides, runs_dir=runs_dir),
                 lambda: toolkit.sweep([recipe], overrides, runs_dir=runs_dir)):
        with pytest.raises(UserError, match=message):
            call()
    assert not runs_dir.exists()
    assert recipes.load(base, ["name='a|b é'"]).name == "a|b é"  # printable text of any kind is a name


def _with_later_field(settings, default, value):
    """`settings` as an instance of a subclass of its dataclass that has one more field, added
    later (schema.added, neutral False), with the given default and value; every other value kept."""
    import dataclasses

    from toolkit.schema import added

    cls = dataclasses.make_dataclass(type(settings).__name__, [("later_knob", bool, added(default=default, neutral=False))],
                                     bases=(type(settings),), kw_only=True)
    kept = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.init}
    return cls(**kept) if value is None else cls(**kept, later_knob=value)


# Recipe fields added with schema.added (neutral None), by section: a recipe that leaves them unset
# hashes as the whole resolved recipe did before they existed
ADDED = {"task": ("source_code", "target_code", "pair_separator", "line_by_line"), "method": ("train_layer_norms", "rank_pattern", "alpha_pattern")}
ADDED_NESTED = {("task", "generation"): ("early_stopping", "min_length", "min_new_tokens", "repetition_penalty",
                                         "encoder_repetition_penalty", "encoder_no_repeat_ngram_size",
                                         "exponential_decay_length_penalty")}  # nested


def test_a_field_added_later_keeps_every_run_id_at_its_neutral_value() -> None:
    """Finding: runs.run_id hashes the resolved recipe, so a new recipe field with a default
    renamed every run and a toolkit upgrade trained everything again. A field added later
    declares the value that reproduces the behaviour before it (schema.added(neutral=...)); a
    recipe holding that value hashes as if the field were not there. For every shipped recipe and
    each section (model, task, method, train, and a nested settings block): today's hash is the
    hash of the whole resolved recipe as before the rule, less the fields added since (`ADDED`); for
    one recipe of each (task, method), a later field at its neutral value, by default or written, leaves it; another value, or a
    default that is not the neutral one (a changed behaviour), changes it. recipe.yaml keeps the
    field either way."""
    import dataclasses
    import hashlib

    paths = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if not p.name.startswith("_"))
    loaded = {path: recipes.load(path) for path in paths}
    assert len(loaded) > 100
    kinds = set()
    for path, recipe in loaded.items():
        whole = recipe.to_dict()
        for section, names in ADDED.items():  # the fields added since, at their neutral value: not there before
            whole[section] = {k: v for k, v in whole[section].items() if not (k in names and (v is None or v is False or v == {}))}
        for (section, block), names in ADDED_NESTED.items():
            if isinstance(whole[section].get(block), dict):
                whole[section][block] = {k: v for k, v in whole[section][block].items() if not (k in names and v is None)}
        before = hashlib.sha256(json.dumps(whole, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
        assert recipe.hash_as_before == before, path  # the hash as before the canonical forms (tests/test_run_identity.py)
        if (recipe.task.name, recipe.method.name) in kinds:  # each section's settings class once
            continue
        kinds.add((recipe.task.name, recipe.method.name))
        for section in ("model", "task", "method", "train"):
            original = getattr(recipe, section)
            cases = {(False, None): True, (False, False): True, (False, True): False, (True, None): False}
            for (default, value), same in cases.items():
                changed = dataclasses.replace(recipe, **{section: _with_later_field(original, default, value)})
                assert (changed.hash == recipe.hash) is same, (path, section, default, value)
                assert "later_knob" in changed.to_dict()[section]  # recipe.yaml holds it
    generation = next(r for r in loaded.values() if dataclasses.is_dataclass(getattr(r.task, "generation", None)))
    nested = dataclasses.replace(generation.task, generation=_with_later_field(generation.task.generation, False, None))
    assert dataclasses.replace(generation, task=nested).hash == generation.hash
    nested = dataclasses.replace(generation.task, generation=_with_later_field(generation.task.generation, False, True))
    assert dataclasses.replace(generation, task=nested).hash != generation.hash



@pytest.mark.parametrize("recipe", ["demo/sst2/minilm-lora", "summarization/samsum/t5-base-lora",
                                    "squad/v1.1/bert-base-uncased-full"])
def test_smoke_true_is_smoke_however_given(tmp_path: Path, recipe: str) -> None:
    """`smoke=true` (or `smoke: true` in a recipe) swapped in the small random model but kept the
    recipe's full data, epochs and lengths: a random 2-layer model trained on all of SST-2, exit
    0, as another run than `--smoke`. It is --smoke, however given; a smoke run's saved
    recipe.yaml, read again with or without --smoke, is that same run."""
    path = recipes.find_recipe(recipe)
    smoke = recipes.load(path, smoke=True)
    assert recipes.load(path, ["smoke=true"]).hash == smoke.hash
    assert recipes.load(path, ["smoke=true"], smoke=True).hash == smoke.hash
    assert smoke.train.max_steps == 4 and smoke.task.max_train_samples == 32
    leaf = write_recipe(tmp_path / "leaf.yaml", f"extends: {path.resolve()}\nsmoke: true\n")
    assert recipes.load(leaf).hash == smoke.hash
    saved = write_recipe(tmp_path / "run" / "recipe.yaml", recipes.dump(smoke))
    assert recipes.load(saved).hash == recipes.load(saved, smoke=True).hash == smoke.hash
    assert recipes.load(saved).name == smoke.name


def test_a_checkpoint_naming_another_run_starts_afresh(tmp_path: Path) -> None:
    """A `{run: ..., overrides: [...]}` checkpoint names a recipe, and its overrides are that
    recipe's: `model.checkpoint={run: b.yaml}` over `{run: a.yaml, overrides: [train.lr=3e-4]}`
    (or a leaf file over such a base) chained from b run with a's overrides, exit 0. Naming
    another recipe replaces the reference, as naming another plug-in does; the same recipe keeps
    its overrides."""
    from toolkit import runs

    a, b = (ROOT / f"recipes/pretrain/wikitext-2/{n}-mlm.yaml" for n in ("minilm", "bert-base-uncased"))
    base = write_recipe(tmp_path / "base.yaml", f"extends: {ROOT / 'recipes/demo/sst2/minilm-full.yaml'}\n"
                        f"model: {{checkpoint: {{run: {a}, overrides: [train.lr=3.0e-4]}}}}\n")
    leaf = write_recipe(tmp_path / "leaf.yaml", f"extends: base.yaml\nmodel: {{checkpoint: {{run: {b}}}}}\n")
    own = runs.run_id(recipes.load(b))
    for path, overrides in ((leaf, []), (base, [f"model.checkpoint={{run: {b}}}"]), (base, [f"model.checkpoint.run={b}"])):
        planned = recipes.plan(path, overrides)
        assert planned.upstream.recipe.train.lr == 5e-5 and runs.run_id(planned.upstream.recipe) == own, overrides
    kept = recipes.plan(base, [f"model.checkpoint.run={a}"]).upstream.recipe
    assert kept.train.lr == 3e-4


LAYERS = [([["train.max_steps=9", "task.max_train_samples=72"], ["train={max_steps: 100, lr: 1.0e-3}"]],
           {"train.max_steps": 100, "train.lr": 1e-3, "task.max_train_samples": 72}),
          ([["train={max_steps: 9, log_every: 1}", "train.eval_every=0"], ["train.max_steps=100"]],
           {"train.max_steps": 100, "train.log_every": 1, "train.eval_every": 0}),
          ([["task.labels=[no, yes]", "train.lr=1"], ["train={lr: 2.0e-3}"]],
           {"task.labels": ["no", "yes"], "train.lr": 2e-3})]


@pytest.mark.parametrize("groups, reads", LAYERS)
def test_layered_overrides_match_settings_however_spelled(groups: list, reads: dict) -> None:
    """`layered` (a tool's own overrides under its user's: `sweep --estimate`'s caps, `make
    parity`'s budget under `--set`) matched settings by their text: a user's
    `train={max_steps: 100}` beside the tool's `train.max_steps=9` kept both, and the run was
    refused as given twice (`toolkit sweep R "train={max_steps: 100}" --estimate` failed). The
    later layer replaces what it sets, however spelled, and a user's own repeat is still refused."""
    from toolkit.recipe_data import apply_overrides, layered

    raw = apply_overrides({}, layered(*groups))
    for dotted, value in reads.items():
        node = raw
        for part in dotted.split("."):
            node = node[part]
        assert node == value and type(node) is type(value), (dotted, node)
    with pytest.raises(UserError, match="train.lr is already set by 'train.lr=2'"):
        apply_overrides({}, layered(["train.lr=1"], ["train.lr=2", "train.lr=3"]))


ICL_GLUE = "model: {checkpoint: gpt2}\ntask: {name: glue, subset: sst2}\nmethod: {name: icl}\n"
SQUAD_ON = "model: {{checkpoint: {}}}\ntask: {{name: squad, version: v1}}\nmethod: {{name: full}}\n"


@pytest.mark.parametrize("recipe, setting, default", [
    # a method that trains nothing reads no training setting (icl scores with method.batch_size)
    *[(ICL_GLUE, s, d) for s, d in (("train.lr", "2e-5"), ("train.epochs", "3"), ("train.eval_batch_size", None),
                                      ("train.grad_accum", "1"), ("train.keep_best", "true"),
                                      ("train.early_stopping_patience", "0"), ("train.compile_optimizer", "auto"))],
    (ICL_GLUE.replace("glue, subset: sst2", "summarization, subset: samsum"), "train.max_steps", None),
    (ICL_GLUE, "model.dropout", None),  # scored in eval mode: no dropout is drawn
    # icl cuts its prompts at method.max_length, not task.max_length
    (ICL_GLUE, "task.max_length", "128"),
    # an extractive SQuAD run generates nothing; a generative one makes no windows or spans
    *[(SQUAD_ON.format("bert-base-uncased"), s, d) for s, d in (
        ("task.generation.num_beams", "1"), ("task.max_target_length", "32"), ("task.prefix", None))],
    *[(SQUAD_ON.format("gpt2"), s, d) for s, d in (("task.doc_stride", "128"), ("task.n_best", "20"))],
    # without split_articles nothing is drawn with split_seed
    (SQUAD_ON.format("bert-base-uncased").replace("v1}", "v1, split_articles: null}"), "task.split_seed", "0"),
    # without demonstrations nothing goes between them (a generating task stops at it: read there)
    (ICL_GLUE, "method.separator", None),
    # an adapter sized by bottleneck_size reads no reduction_factor
    ("model: {checkpoint: bert-base-uncased}\ntask: {name: glue, subset: sst2}\n"
     "method: {name: adapters, bottleneck_size: 8}\n", "method.reduction_factor", "16"),
    # a text task's held-out file leaves no fraction to split off; files read no Hub parts
    *[("model: {checkpoint: gpt2}\ntask: {name: clm, train_file: $TOOLKIT_DATA/lm/ptb/ptb.valid.txt, "
       "eval_file: $TOOLKIT_DATA/lm/ptb/ptb.test.txt}\nmethod: {name: full}\n", s, d)
      for s, d in (("task.eval_fraction", "0.05"), ("task.dataset_config", None), ("task.train_split", "train"))],
    # a plain text file has no field to name; records (JSONL, a Hub data set) are not split into
    # documents by lines or paragraphs: each setting was ignored with exit 0, on every objective
    *[(f"model: {{checkpoint: {ckpt}}}\ntask: {{name: {name}, train_file: $TOOLKIT_DATA/lm/ptb/ptb.valid.txt}}\n"
       "method: {name: full}\n", "task.text_field", None)
      for name, ckpt in (("clm", "gpt2"), ("mlm", "bert-base-uncased"), ("denoise", "facebook/bart-base"),
                         ("span_corruption", "t5-small"))],
    *[(f"model: {{checkpoint: {ckpt}}}\ntask: {{name: {name}, dataset: wikitext, dataset_config: wikitext-2-raw-v1}}\n"
       "method: {name: full}\n", "task.documents", "line")
      for name, ckpt in (("clm", "gpt2"), ("mlm", "roberta-base"))],
    # a TSV's records are documents too (read as records, not lines)
    ("model: {checkpoint: gpt2}\ntask: {name: clm, train_file: $TOOLKIT_DATA/glue/SST-2/dev.tsv}\nmethod: {name: full}\n",
     "task.documents", "line"),
    # a Hub configuration beside files
    ("model: {checkpoint: bert-base-uncased}\ntask: {name: text_classification, eval_file: "
     "$TOOLKIT_DATA/glue/SST-2/dev.tsv}\nmethod: {name: full}\n", "task.subset", None),
    # a pair's separator on one text, and under icl (its template holds the texts)
    ("model: {checkpoint: gpt2}\ntask: {name: glue, subset: sst2}\nmethod: {name: full}\n", "task.pair_separator", None),
    (ICL_GLUE.replace("sst2", "rte"), "task.pair_separator", None),
    ("model: {checkpoint: gpt2}\ntask: {name: text_classification, eval_file: $TOOLKIT_DATA/glue/RTE/dev.tsv, "
     "text_columns: [sentence1]}\nmethod: {name: full}\n", "task.pair_separator", None),
    # greedy search reads no length penalty
    ("model: {checkpoint: t5-small}\ntask: {name: summarization, subset: samsum, generation: {num_beams: 1}}\n"
     "method: {name: full}\n", "task.generation.length_penalty", "1.0"),
    # nor when beam search stops
    *[(f"model: {{checkpoint: {c}}}\ntask: {{name: {t}, generation: {{num_beams: 1}}}}\nmethod: {{name: full}}\n",
       "task.generation.early_stopping", None)
      for c, t in (("t5-small", "summarization"), ("gpt2", "translation"), ("facebook/bart-base", "squad"))],
])
def test_a_setting_the_run_never_reads_is_refused_unless_at_its_default(tmp_path: Path, cli, recipe: str,
                                                                        setting: str, default: str | None) -> None:
    """Finding: a setting the method or task never reads here (icl's train.*, an extractive
    SQuAD run's generation) ran with exit 0, recorded in recipe.yaml as if used; now one line at
    validate (also --smoke, whose own caps stay allowed). At its default it is no request."""
    path = write_recipe(tmp_path / "r.yaml", recipe)
    odd = {"true": "false", "auto": "true", "1.0": "2.0", "1": "3", "128": "64", None: "7"}.get(default, "5")
    odd = {"task.prefix": "'answer: '", "method.separator": "' | '", "task.eval_fraction": "0.1",
           "task.train_split": "dev", "task.dataset_config": "raw", "model.dropout": "0.1",
           "task.subset": "sst2", "task.pair_separator": "eos", "task.text_field": "body",
           "task.documents": "blank_line", "task.generation.early_stopping": "true"}.get(setting, odd)
    for extra in ((), ("--smoke",), ("smoke=true",)):  # smoke=true let any value of a key --smoke sizes through
        code, _, err = cli("validate", path, f"{setting}={odd}", *extra)
        assert code == 2 and len(err.strip().splitlines()) == 1 and f"{setting}: " in err, err
    for extra in ("--smoke", "smoke=true"):
        code, _, err = cli("validate", path, *([f"{setting}={default}"] if default else []), extra)
        assert code == 0, err


@pytest.mark.parametrize("entry", ["api validate", "cli cp", "cli sweep x2"])
def test_a_base_two_listed_bases_share_lies_under_both(tmp_path: Path, cli, entry: str) -> None:
    """A diamond: `extends: [_b.yaml, _c.yaml]`, both over `_d.yaml`. Each listed base was merged
    whole, so `_d`'s `method.r: 4`, inside `_c`, went over `_b`'s own `r: 8`, a setting `_c` never
    made, exit 0. Each file's own settings now apply once, bases under the files that extend
    them, in the order listed: r is 8 (from `_b`), target_modules and lr `_c`'s, in every reader."""
    write_recipe(tmp_path / "_d.yaml", "model: {checkpoint: bert-base-uncased}\ntask: {name: glue, subset: sst2}\n"
                 "method: {name: lora, r: 4, target_modules: [query, value]}\ntrain: {lr: 1.0e-3}\n")
    write_recipe(tmp_path / "_b.yaml", "extends: _d.yaml\nmethod: {r: 8}\n")
    write_recipe(tmp_path / "_c.yaml", "extends: _d.yaml\nmethod: {target_modules: [key]}\ntrain: {lr: 2.0e-3}\n")
    leaf = write_recipe(tmp_path / "leaf.yaml", "extends: [_b.yaml, _c.yaml]\n")
    if entry == "api validate":
        got = toolkit.validate(leaf)
        assert (got["method"]["r"], got["method"]["target_modules"], got["train"]["lr"]) == (8, ["key"], 2e-3)
    elif entry == "cli cp":
        code, _, err = cli("cp", leaf, tmp_path / "copy.yaml")
        got = yaml.safe_load((tmp_path / "copy.yaml").read_text())
        assert code == 0 and got["method"] == {"name": "lora", "r": 8, "target_modules": ["key"]}, err
    else:  # x2 scales the recipe's own value: _b's 8
        code, out, err = cli("sweep", leaf, "method.r=x1,x2", "--dry-run", "--runs-dir", tmp_path / "runs")
        assert code == 0 and "method.r=16" in out and "method.r=8" in out, err


# --- a float field: one number per value, or one line -------------------------------------------
def _settings_classes() -> list[tuple[str, type]]:
    """(where, settings class) of the model and train sections, every task, method and attention
    module, and the settings blocks nested in them (a task's `generation`)."""
    import dataclasses
    import typing

    from toolkit.attention import ATTENTION
    from toolkit.methods import METHODS
    from toolkit.recipe_data import ModelConfig, TrainConfig
    from toolkit.tasks import TASKS

    out = [("model", ModelConfig), ("train", TrainConfig), *((f"method.{n}", METHODS.get(n)) for n in METHODS.names()),
           *((f"task.{n}", TASKS.get(n)) for n in TASKS.names()),
           *((f"model.attention.{n}", ATTENTION.get(n)) for n in ATTENTION.names())]
    for where, cls in list(out):
        hints = typing.get_type_hints(cls)
        out += [(f"{where}.{f.name}", hints[f.name]) for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])]
    return out


def _float_fields() -> list[tuple[str, type, str]]:
    import dataclasses
    import typing

    return [(f"{where}.{f.name}", cls, f.name) for where, cls in _settings_classes() for f in dataclasses.fields(cls)
            if float in (typing.get_type_hints(cls)[f.name], *typing.get_args(typing.get_type_hints(cls)[f.name]))]


def _build(cls: type, name: str, value: object):
    """Field `name` of `cls` built from `value`, its required fields given (a string or a choice)."""
    import dataclasses
    import typing

    from toolkit.schema import build_dataclass

    hints, required = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            choices = typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is typing.Literal else ("x",)
            required[f.name] = choices[0]
    return getattr(build_dataclass(cls, {**required, name: value}, "s"), name)


@pytest.mark.parametrize("where, cls, name", _float_fields(), ids=[w for w, *_ in _float_fields()])
def test_every_float_field_reads_one_number_per_value_or_one_line(where: str, cls: type, name: str) -> None:
    """A float field read Python's float() of any string (`lr: 1_000` ran with 1000.0, `" 3 "` with
    3.0, where YAML 1.2 and every int field refuse `1_000`), an integer past a float's range as an
    OverflowError traceback, and kept -0.0 apart from 0.0: `weight_decay: -0.0` was another run id
    of the same run. Now a decimal number (quoted too) is its float, -0.0 is 0.0, anything else
    is one line naming the field."""
    import dataclasses
    import math

    metadata = next(f for f in dataclasses.fields(cls) if f.name == name).metadata
    with pytest.raises(UserError, match=rf"^s.{name}: an integer of 401 digits is not a finite number"):
        _build(cls, name, 10 ** 400)
    for text in ("1_000", " 3 ", "\u0661", "0x10", "1e"):
        with pytest.raises(UserError, match=rf"^s.{name}: expected float, got str {re.escape(repr(text))}$"):
            _build(cls, name, text)
    for text in ("inf", "-Infinity", "nan"):
        with pytest.raises(UserError, match=rf"^s.{name}: -?(inf|nan) is not a finite number$"):
            _build(cls, name, text)
    try:
        zero = _build(cls, name, -0.0)
    except UserError as exc:  # a field whose minimum is above 0
        assert "below the minimum" in str(exc), exc
    else:
        from toolkit.schema import NONE_ALIAS

        if metadata.get(NONE_ALIAS) == 0:  # 0 means null there (max_grad_norm: clipping off)
            assert zero is None and _build(cls, name, "-0.0") is None
        else:
            assert zero == 0 and math.copysign(1, zero) == 1, zero
            assert _build(cls, name, "-0.0") == 0 and math.copysign(1, _build(cls, name, "-0.0")) == 1
    lo = metadata.get("min")
    number = 0.5 if lo is None or lo <= 0.5 else float(lo)  # within the field's bounds
    assert _build(cls, name, number) == number
    for text in (repr(number), f"{number:E}", f"+{number:e}", f"{number * 10:g}e-1"):
        assert _build(cls, name, text) == number, text


def test_a_number_spelled_otherwise_is_the_same_run_at_every_entry_point(tmp_path: Path, cli, runs_dir: Path) -> None:
    """-0.0 and 0 (a file, an override, the Python API's mapping) are one run id, and a sweep over
    both is refused as one run done twice (it trained it twice); a digit-grouped or huge number is
    one line at validate, exit 2."""
    import toolkit.api as api
    from toolkit import runs, sweeps

    demo = ROOT / "recipes/demo/sst2/minilm-lora.yaml"
    written = write_recipe(tmp_path / "r.yaml", f"extends: {demo}\ntrain: {{weight_decay: -0.0}}\n")
    ids = {runs.run_id(recipes.load(path, overrides)) for path, overrides in
           [(demo, ["train.weight_decay=0"]), (demo, ["train.weight_decay=-0.0"]), (written, []),
            (demo, api.override_list({"train.weight_decay": -0.0})), (demo, ['train.weight_decay="-0"'])]}
    assert len(ids) == 1, ids
    with pytest.raises(UserError, match="are the same run"):
        sweeps.plan([demo], ["train.weight_decay=0,-0.0"], None, runs_dir, False)
    for override, message in (("train.lr=1_000", "train.lr: expected float, got str '1_000'"),
                              ("train.lr=1" + "0" * 400, "train.lr: an integer of 401 digits is not a finite number")):
        code, _, err = cli("validate", demo, override)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    # a word past a file name's 255 bytes beside recipes is an override (it was 'file name too long')
    long = "train.lr=0.0001" + "0" * 300  # as many values as fill 255 bytes: one here
    for command, said in ((("validate", demo, long), "1 of 1 recipes valid"),
                          (("sweep", demo, long, "--dry-run", "--smoke", "--runs-dir", runs_dir), "(dry run: nothing was started)")):
        code, out, err = cli(*command)
        assert code == 0 and said in out, (command, out, err)
    with pytest.raises(UserError, match="an integer of 401 digits"):
        toolkit.validate(demo, {"train.lr": 10 ** 400})
    with pytest.raises(UserError, match="no number there"):  # a sweep scales what the schema reads as a number
        sweeps.resolve(sweeps.Point(write_recipe(tmp_path / "g.yaml", f"extends: {demo}\ntrain: {{lr: '1_0'}}\n"),
                                    ["train.lr=x2"]))


def test_smoke_caps_a_quoted_warmup_ratio_as_its_number(tmp_path: Path) -> None:
    """--smoke caps a warm-up ratio that would fill its few steps; `warmup_ratio: "0.9"` (a quoted
    number, 0.9 to the schema) was left as written and refused the smoke run that 0.9 ran."""
    demo = ROOT / "recipes/demo/sst2/minilm-lora.yaml"
    spelled = [recipes.load(demo, [override], smoke=True) for override in
               ("train.warmup_ratio=0.9", 'train.warmup_ratio="0.9"', "train.warmup_ratio='9e-1'")]
    assert {r.hash for r in spelled} == {spelled[0].hash} and spelled[0].train.warmup_ratio < 0.9


# --- run identity, walked over the schema ---------------------------------------------------------
def _flips(cls: type, name: str, default: object) -> list[object]:
    """Values for field `name` of `cls` other than `default`, of its type (the first in bounds is used)."""
    import dataclasses
    import typing

    tp = typing.get_type_hints(cls)[name]
    options = [a for a in (typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType)
                           else (tp,)) if a is not type(None)]
    out: list = []
    for option in options:
        origin = typing.get_origin(option)
        if origin is typing.Literal:
            out += [c for c in typing.get_args(option) if c != default]
        elif option is bool:
            out.append(not default if isinstance(default, bool) else True)
        elif option is int:
            base = default if isinstance(default, int) and not isinstance(default, bool) else 8
            out += [base + 1, base * 2, base - 1, 1, 0]
        elif option is float:
            base = default if isinstance(default, float) else 0.5
            out += [base / 2 if base else 0.5, base + 0.25, 0.5, 0.75, 1.5, 2.0]
        elif option is str:
            out += ["x", "other"]
        elif origin is list:
            (inner,) = typing.get_args(option)
            item = typing.get_args(inner)[0] if typing.get_origin(inner) is typing.Literal else 32 if inner is int else "x"
            out += [[item], ["a", "b"]] + ([[], [2.0, 1.5]] if inner is float else [])  # a pair (the length decay)
        elif origin is dict:  # a checkpoint's `{run: ...}`; a typed mapping of ints (rank_pattern)
            out.append({"run": "other.yaml"} if typing.get_args(option)[1:] != (int,) else {"x": 2})
        elif dataclasses.is_dataclass(option):
            continue  # walked field by field (its own class)
    return [v for v in out if v != default or type(v) is not type(default)]


def _hash_walk() -> list[tuple[str, str, str, str]]:
    """(section, plug-in, nested block or '', field) of every setting a recipe holds."""
    import dataclasses
    import typing

    from toolkit.attention import ATTENTION
    from toolkit.methods import METHODS
    from toolkit.recipe_data import ModelConfig, TrainConfig
    from toolkit.tasks import TASKS

    rows = [("model", "", "", f.name) for f in dataclasses.fields(ModelConfig) if f.name != "attention"]
    rows += [("train", "", "", f.name) for f in dataclasses.fields(TrainConfig)]
    for section, registry in (("task", TASKS), ("method", METHODS), ("attention", ATTENTION)):
        for plugin in registry.names():
            cls = registry.get(plugin)
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                if dataclasses.is_dataclass(hints[f.name]):
                    rows += [(section, plugin, f.name, g.name) for g in dataclasses.fields(hints[f.name])]
                else:
                    rows.append((section, plugin, "", f.name))
    return rows


def _walk_recipe(section: str, plugin: str, value: dict) -> object:
    """The recipe whose `section` (with plug-in `plugin`) holds `value`, the others fixed, built
    as a run's hash is (recipe.built: each field checked, no model read)."""
    raw = {"model": {"checkpoint": "bert-base-uncased"}, "task": {"name": "glue", "subset": "sst2"},
           "method": {"name": "full"}, "train": {}}
    required = {"glue": {"subset": "sst2"}, "text_classification": {}, "ner": {}}
    if section in ("model", "train"):
        raw[section] = {**raw[section], **value}
    elif section == "attention":
        raw["model"]["attention"] = {"name": plugin, **value}
    else:
        raw[section] = {"name": plugin, **(required.get(plugin, {}) if section == "task" else {}), **value}
    return recipes.built(raw)


@pytest.mark.parametrize("section, plugin, block, name", _hash_walk(),
                         ids=[".".join(p for p in row if p) for row in _hash_walk()])
def test_every_setting_is_in_the_run_id_and_its_default_written_is_the_same_run(section: str, plugin: str,
                                                                              block: str, name: str) -> None:
    """Walks every field of the schema (model, train, every task, method and attention module, and
    their nested blocks): a recipe that writes a field's default is the recipe that leaves it out
    (one run id), and any other value the schema takes is another run id, unless it is the value
    the field declares `neutral` (schema.added: the behaviour before the field, hashed as absent)
    or the field cannot change the result there (schema.NO_EFFECT: the same run id);
    the recipe.yaml a run writes of it reads back as that recipe."""
    import dataclasses

    from toolkit.runs import run_id
    from toolkit.schema import NEUTRAL, NO_EFFECT

    def nest(value: object) -> dict:
        return {block: {name: value}} if block else {name: value}

    try:
        base = _walk_recipe(section, plugin, {})
    except UserError as exc:  # a plug-in with required settings of its own: given below
        pytest.skip(f"needs settings: {exc}")
    owner = getattr(base, "model" if section == "attention" else section)
    owner = owner.attention if section == "attention" else owner
    owner = getattr(owner, block) if block else owner
    f = next(f for f in dataclasses.fields(owner) if f.name == name)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        default = getattr(owner, name)  # required: the value the base recipe gives
    else:
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    as_data = json.loads(json.dumps(default, default=lambda v: dataclasses.asdict(v)))
    assert run_id(_walk_recipe(section, plugin, nest(as_data)), 1) == run_id(base, 1), "default written"
    flipped = None
    for value in _flips(type(owner), name, default):
        if f.metadata.get(NEUTRAL, object()) == value:
            continue
        try:
            other = _walk_recipe(section, plugin, nest(value))
        except UserError:
            continue  # out of bounds, or not this field's kind: the next candidate
        flipped = value
        if NO_EFFECT in f.metadata and f.metadata[NO_EFFECT](owner):  # changes no result: one hash (test_run_identity);
            # a data_dir holding other files (none: a preset's Hub copy) is another run id by their contents
            assert other.hash == base.hash, f"{name}={value!r} changes no result, yet another recipe hash"
        else:
            assert run_id(other, 1) != run_id(base, 1), f"{name}={value!r} is another setting with the same run id"
        # and the run's recipe.yaml reads back as the same run (`toolkit run RUN/recipe.yaml`)
        assert recipes.built(recipes.safe_yaml(recipes.dump(other), "recipe.yaml")).hash == other.hash
        break
    assert flipped is not None or name in ("name",), f"no other value of {name} was taken"


@pytest.mark.parametrize("recipe", ["demo/sst2/minilm-lora", "demo/own-data/minilm-lora"])
def test_task_data_dir_is_a_user_path_and_a_folder(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                    recipe: str) -> None:
    """`task.data_dir: $MYDATA` was read as a folder named `$MYDATA` (every other path a user gives
    expands variables): a GLUE run found no local copy there and loaded the Hub's, exit 0. And a
    data_dir that is not a folder validated (TOOLKIT_DATA's is refused): one line now, at validate,
    run and the Python API, before anything is written."""
    from toolkit.recipe import check_data

    from toolkit.tasks import data_root

    shared = data_root().resolve()  # the data the suite reads (TOOLKIT_DATA)
    if not (shared / "glue" / "SST-2").is_dir() or not (shared / "glue" / "RTE").is_dir():
        pytest.skip("no local GLUE copy")
    monkeypatch.setenv("MYDATA", str(shared))
    loaded = recipes.load(recipes.find_recipe(recipe), ["task.data_dir=$MYDATA"])
    check_data(loaded)
    assert loaded.task.data_files() and all(shared in p.parents for p in map(Path, loaded.task.data_files()))
    if recipe != "demo/sst2/minilm-lora":
        return  # own files under a missing data_dir: the file is named as missing (task.check), before
    for where, message in ((tmp_path / "none", "does not exist"), (write_recipe(tmp_path / "f.yaml", BASE), "is a file")):
        line = f"task.data_dir: {where} {message}; set it to a folder of data sets"
        code, _, err = cli("validate", recipe, f"task.data_dir={where}")
        assert code == 2 and line in err and err.count("\n") == 1, err
        code, _, err = cli("run", recipe, f"task.data_dir={where}", "--smoke", "--runs-dir", tmp_path / "runs")
        assert code == 2 and line in err and err.count("\n") == 1, err
        with pytest.raises(UserError, match=re.escape(line)):
            toolkit.validate(recipe, {"task.data_dir": str(where)})
    assert not (tmp_path / "runs").exists()


def test_a_value_that_means_null_is_null_in_the_run_id(tmp_path: Path, runs_dir: Path) -> None:
    """`train.max_grad_norm: 0` turns clipping off as `null` does (docs/recipes.md), yet the two
    spellings were two run ids of one run (a sweep over `0,null` trained it twice). A field's
    declared `none_alias` is stored as null: one recipe hash, from a file, an override, the Python
    API and a sweep; every field that declares one is walked."""
    import dataclasses

    import toolkit.api as api
    from toolkit import runs, sweeps
    from toolkit.schema import NONE_ALIAS

    aliased = [(where, f.name, f.metadata[NONE_ALIAS]) for where, cls in _settings_classes()
               for f in dataclasses.fields(cls) if NONE_ALIAS in f.metadata]
    assert ("train", "max_grad_norm", 0.0) in aliased
    demo = ROOT / "recipes/demo/sst2/minilm-lora.yaml"
    for where, name, alias in aliased:
        if where not in ("model", "train"):
            continue  # a plug-in's own field: built by the same build_dataclass
        key = f"{where}.{name}"
        written = write_recipe(tmp_path / f"{name}.yaml", f"extends: {demo}\n{where}: {{{name}: {alias}}}\n")
        loaded = [recipes.load(path, overrides) for path, overrides in
                  [(demo, [f"{key}=null"]), (demo, [f"{key}={alias}"]), (demo, [f"{key}={int(alias)}"]),
                   (written, []), (demo, api.override_list({key: alias}))]]
        assert {runs.run_id(r) for r in loaded} == {runs.run_id(loaded[0])}
        assert all(getattr(getattr(r, where), name) is None for r in loaded)
        with pytest.raises(UserError, match="are the same run"):
            sweeps.plan([demo], [f"{key}={alias},null"], None, runs_dir, False)



@pytest.mark.parametrize("section, name, mapping", [("method", "full", {"name": "full"}),
                                                    ("method", "dora", {"name": "dora"}),
                                                    ("task", "squad", {"name": "squad"})])
def test_a_bare_plugin_name_is_its_mapping_everywhere(tmp_path: Path, runs_dir: Path, section: str, name: str,
                                                      mapping: dict) -> None:
    """`method=full` over a LoRA recipe was 'method: expected a mapping with a name' while
    `method={name: full}` ran, and `method=lora` (the plug-in already there) ran too: a bare name
    is its mapping, for every plug-in section, from a file, an override, the Python API and a sweep."""
    import toolkit.api as api
    from toolkit import runs, sweeps

    demo = ROOT / "recipes/demo/sst2/minilm-lora.yaml"
    as_mapping = recipes.load(demo, [f"{section}={json.dumps(mapping)}"])
    written = write_recipe(tmp_path / "r.yaml", f"extends: {demo}\n{section}: {name}\n")
    spelled = [recipes.load(demo, [f"{section}={name}"]), recipes.load(demo, api.override_list({section: name})),
               recipes.load(written)]
    assert {runs.run_id(r) for r in spelled} == {runs.run_id(as_mapping)}
    assert getattr(as_mapping, section).name == name
    with pytest.raises(UserError, match="are the same run"):
        sweeps.plan([demo], [f"{section}={name},{json.dumps(mapping)}"], None, runs_dir, False)
