"""FSDP2 and DeepSpeed ZeRO-2/3 on two CPU processes (gloo), launched as users launch them
(accelerate launch with configs/accelerate/fsdp.yaml, zero2.yaml, zero3.yaml), against plain data
parallel (ddp.yaml, or one process at the same global batch, which equals it) on the same seed
and batches: the same losses, the same saved model scoring the same on dev in one process, an
interrupted run resuming exactly from its sharded checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, as_launched, launch_env, write_recipe
from test_distributed import _free_port
from test_train import only_run, train_losses, weights

RECIPE = """model: {{checkpoint: {checkpoint}, dropout: 0.0}}
task: {{name: glue, subset: mrpc, max_length: 48, max_train_samples: 96, max_eval_samples: 30}}
method: {method}
train: {{epochs: 1, lr: 1.0e-3, seed: 5, batch_size: 4, eval_batch_size: 8, log_every: 1, eval_every: 6,
         keep_best: true}}
"""
STEPS = 12  # 96 examples / (4 per process x 2 processes): two evaluations, the stop before the first


# One launch per strategy runs every case's runs in turn (an interrupted run, then its resumption,
# as two runs in the launch); the main process marks where each run starts in the output and
# lists the runs folder after it: a launch's start-up (two interpreters importing torch,
# transformers and DeepSpeed) is most of a tiny run's time. Several runs in one launch each run as
# alone (`sharding.restore_launch_kind`: the second was refused under FSDP and raised an
# AttributeError under ZeRO-3): every case below is then also a later run of its launch.
LAUNCHER = """import json, os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from toolkit.cli import main
first = os.environ.get("RANK", "0") == "0"
for i, (args, runs) in enumerate(json.loads(open(sys.argv[1]).read())):
    print(f"=== run {{i}}", flush=True) if first else None
    if main(args) != 0:
        sys.exit(f"failed: {{args}}")
    if first:
        listing = sorted(str(p.relative_to(runs)) for p in Path(runs).rglob("*"))
        Path(f"{{sys.argv[1]}}.{{i}}").write_text(json.dumps(listing))
"""


def launch(strategy: str, tmp: Path, jobs: list[tuple[list[str], Path]]) -> list[tuple[str, list[str]]]:
    """`jobs` (toolkit.cli arguments, runs folder) in turn on two CPU processes under
    `accelerate launch --config_file configs/accelerate/<strategy>.yaml`: per job, what the main
    process printed and the runs folder's files after it."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "launch.py").write_text(LAUNCHER.format(root=str(ROOT)))
    (tmp / "jobs.json").write_text(json.dumps([[[str(a) for a in args], str(runs)] for args, runs in jobs]))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / f"{strategy}.yaml"), "--num_processes", "2",
           "--main_process_port", str(_free_port()), str(tmp / "launch.py"), str(tmp / "jobs.json")]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-1500:], proc.stderr[-4000:])
    printed = proc.stdout.split("=== run ")[1:]
    assert [int(p.split("\n")[0]) for p in printed] == list(range(len(jobs)))
    return [(p, json.loads(Path(f"{tmp / 'jobs.json'}.{i}").read_text())) for i, p in enumerate(printed)]


SHARDED = {"fsdp": ("FSDP", "pytorch_model_fsdp_0"), "zero2": ("DEEPSPEED", "pytorch_model"),
           "zero3": ("DEEPSPEED", "pytorch_model")}  # distributed_type, the sharded checkpoint's folder
# Each family's one method and its reference: plain data parallel (ddp.yaml) for BERT, the family
# accelerate 1.15 cannot shard; one process at the same global batch (which equals DDP:
# test_distributed) for the others, to spare a launch. Each reference serves every strategy.
METHODS = {"bert": "{name: full}", "gpt2": "{name: lora, r: 4}", "t5": "{name: lora, r: 4}"}
REFERENCE = {"bert": "ddp", "gpt2": "one", "t5": "one"}
CASES = [
    ("fsdp", "bert", None),
    # resumed from the sharded checkpoint of step 5; T5's tied embeddings, and its evaluation
    # generating under FSDP
    ("fsdp", "gpt2", 5),
    ("fsdp", "t5", None),
    # DeepSpeed's engine on CPU processes: ZeRO-2 (optimizer state and gradients sharded); ZeRO-3
    # with zero3_init_flag (the model partitioned as it loads), resumed from the engine's own
    # checkpoint, a LoRA with no 1-d parameter to train (one optimizer group); T5 generating with
    # its parameters partitioned
    ("zero2", "bert", None),
    ("zero3", "gpt2", 5),
    ("zero3", "t5", None),
]


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint):
    """(strategy, family) -> (reference run, sharded run, what its last run printed, the runs
    folder's files after the interrupted run or None). Each strategy's launch and each family's
    reference is made when a test first asks for it, once for the module (a worker that takes
    only some of these tests launches only what they need)."""
    from toolkit.cli import main

    tmp = tmp_path_factory.mktemp("sharded")
    recipes = {family: write_recipe(tmp / family / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint(family),
                                                                          method=method))
               for family, method in METHODS.items()}
    references: dict[str, Path] = {}
    launched: dict[str, dict] = {}

    def reference(family: str) -> Path:
        if family not in references:
            runs = tmp / family / "reference"
            if REFERENCE[family] == "ddp":
                launch("ddp", tmp / "ddp", [(["run", recipes[family], "--runs-dir", runs], runs)])
            else:
                assert main(["run", str(recipes[family]), "--runs-dir", str(runs), "train.batch_size=8"]) == 0
            references[family] = only_run(runs)
        return references[family]

    def get(strategy: str, family: str) -> tuple[Path, Path, str, list[str] | None]:
        if strategy not in launched:
            jobs, last, stopped = [], {}, {}
            for s, f, stop_after in CASES:
                if s == strategy:
                    runs = tmp / strategy / f
                    run = ["run", recipes[f], "--runs-dir", runs]
                    if stop_after:
                        stopped[f] = len(jobs)
                        jobs.append(([*run, "--stop-after", stop_after], runs))
                    last[f] = len(jobs)
                    jobs.append((run, runs))
            done = launch(strategy, tmp / strategy, jobs)
            launched[strategy] = {f: (only_run(tmp / strategy / f), done[i][0],
                                      done[stopped[f]][1] if f in stopped else None) for f, i in last.items()}
        run, printed, stopped = launched[strategy][family]
        return reference(family), run, printed, stopped

    return get


@pytest.mark.parametrize("strategy, family, stop_after", CASES)
def test_sharded_equals_ddp(cli, sharded_runs, strategy: str, family: str, stop_after: int | None) -> None:
    """The small random model of the family (not --smoke, which caps a run at 4 steps)."""
    a, b, printed, stopped = sharded_runs(strategy, family)
    if stop_after:  # the interrupted run left a sharded checkpoint and no result
        assert stopped and not any(p.endswith("/metrics.json") for p in stopped)
        assert any("/checkpoints/step-" in p and p.endswith("/" + SHARDED[strategy][1]) for p in stopped)
    else:
        assert stopped is None
    assert ("resuming from" in printed) == bool(stop_after)
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    assert (ma["distributed_type"], mb["distributed_type"]) == ({"ddp": "MULTI_CPU", "one": "NO"}[REFERENCE[family]],
                                                                SHARDED[strategy][0])
    # the strategy recorded, and in the run id: the same recipe on 2 processes is another run under it
    assert (ma["strategy"], mb["strategy"]) == ({"ddp": "ddp", "one": "none"}[REFERENCE[family]], strategy)
    assert (a.name != b.name) and (REFERENCE[family] == "one" or (a.parent.name, mb["num_processes"]) ==
                                   (b.parent.name, ma["num_processes"]))
    assert ma["train_steps"] == mb["train_steps"] == STEPS
    assert train_losses(b) == pytest.approx(train_losses(a), rel=1e-4)
    assert mb["eval"] == pytest.approx(ma["eval"], rel=1e-4)
    wa, wb = weights(a), weights(b)  # one plain folder, the same tensors (adapters: PEFT's names)
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], atol=1e-5, rtol=1e-4)
    # the saved model, loaded in this one process (from_pretrained / PEFT), scores what the run said
    code, _, err = cli("eval", b)
    assert code == 0, err
    assert json.loads((b / "eval-eval.json").read_text())["eval"] == pytest.approx(mb["eval"], rel=1e-5)


# Ran under FSDP (2 steps) and DeepSpeed ZeRO-2 and ZeRO-3 (20 steps) on 2 CPU processes (BERT,
# mrpc): each trains and saves; the rest are refused (one rule for both: sharding.unsupported).
RUNS_SHARDED = {"full", "lora", "dora", "adapters", "ia3", "bitfit", "freeze", "prefix_tuning",
                   "prompt_tuning", "p_tuning"}


def test_every_method_runs_sharded_or_is_refused_in_one_line() -> None:
    from toolkit import sharding
    from toolkit.methods import METHODS

    for name in METHODS.names():
        why = sharding.unsupported(METHODS.get(name)())
        assert (why is None) == (name in RUNS_SHARDED), (name, why)
        assert why is None or "\n" not in why


def test_smoke_model_is_built_whole_under_a_zero3_launch(tmp_path: Path, monkeypatch) -> None:
    """A --smoke run launched under ZeRO-3 (whose config accelerate registers with transformers)
    builds the cached random model whole, not as the empty local shards DeepSpeed's zero.Init
    leaves, which the cache would then hand to every later run."""
    from safetensors.torch import load_file
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    from toolkit import models

    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path))
    launch_config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        assert is_deepspeed_zero3_enabled()
        folder = models.smoke_checkpoint("bert-base-uncased")
        assert is_deepspeed_zero3_enabled()  # the launch's config is registered again afterwards
    finally:
        unset_hf_deepspeed_config()
    del launch_config
    weights = load_file(Path(folder) / "model.safetensors")
    assert weights and all(w.numel() > 0 for w in weights.values())


# What each launch writes into a checkpoint folder (accelerate's save_state; the sharded ones as the
# launches above wrote them: test_checkpoint_layouts_are_what_the_launches_wrote), with its process count
LAYOUTS = {
    ("no strategy", 1): ["model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"],
    ("ddp", 2): ["model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl", "random_states_1.pkl"],
    ("fsdp", 2): ["pytorch_model_fsdp_0/__0_0.distcp", "pytorch_model_fsdp_0/__1_0.distcp", "optimizer_0/__0_0.distcp",
                  "optimizer_0/__1_0.distcp", "scheduler.bin", "random_states_0.pkl", "random_states_1.pkl"],
    ("fsdp", 1): ["pytorch_model_fsdp_0/__0_0.distcp", "optimizer_0/__0_0.distcp", "scheduler.bin",
                  "random_states_0.pkl"],
    ("zero2", 2): ["pytorch_model/mp_rank_00_model_states.pt", "pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                   "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt", "latest", "scheduler.bin",
                   "random_states_0.pkl", "random_states_1.pkl"],
    ("zero3", 2): [*(f"pytorch_model/zero_pp_rank_{r}_mp_rank_00_{k}_states.pt" for r in (0, 1) for k in ("model", "optim")),
                   "latest", "scheduler.bin", "random_states_0.pkl", "random_states_1.pkl"],
}


def _launch(strategy: str, processes: int):
    """What `sharding.launched_as` reads of an Accelerator launched so."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    kind = {"fsdp": DistributedType.FSDP, "zero2": DistributedType.DEEPSPEED, "zero3": DistributedType.DEEPSPEED,
            "ddp": DistributedType.MULTI_CPU, "no strategy": DistributedType.NO}[strategy]
    plugin = SimpleNamespace(zero_stage={"zero2": 2, "zero3": 3}.get(strategy))
    return SimpleNamespace(distributed_type=kind, num_processes=processes, is_main_process=True,
                           state=SimpleNamespace(deepspeed_plugin=plugin), print=print,
                           wait_for_everyone=lambda: None)


# the other files FSDP writes under another fsdp_state_dict_type than the configs' SHARDED_STATE_DICT
OTHER_LAYOUTS = [(("fsdp", 2), ["pytorch_model_fsdp.bin", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl"]),
                 (("fsdp", 2), ["pytorch_model_fsdp_rank0.bin", "pytorch_model_fsdp_rank1.bin", "optimizer_rank0.bin",
                                "optimizer_rank1.bin", "random_states_0.pkl", "random_states_1.pkl"])]


@pytest.mark.parametrize("written, files", [*LAYOUTS.items(), *OTHER_LAYOUTS])
def test_resume_under_another_strategy_or_process_count_is_refused_in_one_line(tmp_path: Path, monkeypatch,
                                                                                written: tuple, files: list) -> None:
    """A whole checkpoint (its manifest vouches for every file) resumed under every launch: under
    the one that wrote it the loader reads it; under any other, one line naming both launches,
    before the loader (an FSDP checkpoint under ZeRO-2 was a bare AssertionError in DeepSpeed's)."""
    from toolkit import checkpoints, runs
    from toolkit.errors import UserError

    folder = tmp_path / "run" / "checkpoints" / "step-000003"
    for rel in files:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(b"x")
    runs.write_json(folder / "trainer_state.json", {"step": 3, "manifest": runs.manifest(folder)})

    class Loaded(Exception):
        pass

    def load(acc, path):
        raise Loaded

    monkeypatch.setattr(checkpoints, "_load", load)
    for launch in LAYOUTS:
        if launch == written:
            with pytest.raises(Loaded):
                checkpoints.restore(_launch(*launch), tmp_path / "run", 10)
            continue
        with pytest.raises(UserError) as refused:
            checkpoints.restore(_launch(*launch), tmp_path / "run", 10)
        said = str(refused.value)
        assert "\n" not in said and "--force" in said, said
        def named(s: tuple) -> str:
            return "1 plain process" if s[0] == "no strategy" else f"STRATEGY={s[0]} on {s[1]} process(es)"
        assert f"written under {named(written)}, but this launch is {named(launch)};" in said, said
        assert f"(NPROC={written[1]}{'' if written[0] == 'no strategy' else ' STRATEGY=' + written[0]})" in said, said


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_checkpoint_layouts_are_what_the_launches_wrote(sharded_runs, strategy: str) -> None:
    """LAYOUTS' sharded rows against the files the interrupted runs above left (no extra launch)."""
    stopped = sharded_runs(strategy, "gpt2")[3]
    step = next(p.split("/checkpoints/")[1].split("/")[0] for p in stopped if "/checkpoints/step-" in p)
    files = {p.split(f"/checkpoints/{step}/")[1] for p in stopped if f"/checkpoints/{step}/" in p}
    expected = set(LAYOUTS[strategy, 2])
    assert expected - {"latest"} <= files, sorted(files)
    assert not {f for f in files if f.endswith((".pt", ".distcp", ".pkl"))} - expected  # folders listed too


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2", "bart", "t5"])
def test_a_model_loaded_as_zero3_loads_it_saves_the_names_a_plain_load_saves(tmp_path: Path, tiny_checkpoint,
                                                                            family: str) -> None:
    """transformers' ZeRO-3 load path (`_load_state_dict_into_zero3_model`, here on whole
    parameters: the names do not depend on the partitioning) keeps every weight renaming for the
    save, used or not: BERT's saved LayerNorms were `gamma`/`beta` after a ZeRO-3 run. Saved as
    the loop saves under ZeRO-3 (`sharding.save_names_as_loaded`), every family's file has the
    plain save's names and tensors."""
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.integrations.deepspeed import _load_state_dict_into_zero3_model
    from transformers.modeling_utils import LoadStateDictConfig

    from toolkit import sharding

    checkpoint = tiny_checkpoint(family)
    torch.manual_seed(0)
    plain = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    plain.save_pretrained(tmp_path / "plain")
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    state = plain.state_dict()
    _load_state_dict_into_zero3_model(model, {k: v.clone() for k, v in state.items()},
                                      LoadStateDictConfig(weight_mapping=get_model_conversion_mapping(model)))
    model.load_state_dict(state)  # (off a ZeRO-3 launch that loader sets the renamings, not the values)
    model.save_pretrained(tmp_path / "as-loaded")
    sharding.save_names_as_loaded(model)
    model.save_pretrained(tmp_path / "zero3")
    want, got = (load_file(tmp_path / d / "model.safetensors") for d in ("plain", "zero3"))
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    if family in ("bert", "roberta"):  # the names it saved before: the test sees the difference
        assert load_file(tmp_path / "as-loaded" / "model.safetensors").keys() != want.keys()


@pytest.mark.parametrize("launch", list(LAYOUTS))
def test_a_checkpoint_cut_short_while_written_is_passed_over_said_and_removed(tmp_path: Path, monkeypatch, capsys,
                                                                              launch: tuple) -> None:
    """A process (one rank of a sharded launch) killed while the step-6 checkpoint is written
    leaves `tmp-step-000006` with some ranks' files only: the resume loads the whole step 3,
    says so, and the cut one is named and removed (it stayed on disk until that step was saved
    again, a sharded model's size each)."""
    from toolkit import checkpoints, runs

    run = tmp_path / "run"
    whole, cut = run / "checkpoints" / "step-000003", run / "checkpoints" / "tmp-step-000006"
    for folder, files in ((whole, LAYOUTS[launch]), (cut, LAYOUTS[launch][: len(LAYOUTS[launch]) // 2])):
        for rel in files:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(b"x")
    runs.write_json(whole / "trainer_state.json", {"step": 3, "manifest": runs.manifest(whole)})
    (run / "log.jsonl").write_text("".join(f'{{"step": {i}, "loss": 1.0}}\n' for i in (1, 2, 3)))  # the run's log, kept
    loaded = []
    monkeypatch.setattr(checkpoints, "_load", lambda acc, folder: loaded.append(folder))
    acc = _launch(*launch)
    state = checkpoints.restore(acc, run, 10)
    checkpoints.clear_partial(acc, run)
    said = capsys.readouterr()
    assert state.step == 3 and loaded == [whole]
    assert f"resuming from {whole} (step 3 of 10)" in said.out
    assert f"note: {cut} is the checkpoint a stopped attempt was writing, not whole: not used" in said.err
    assert not cut.exists() and whole.exists()


def _prepared(strategy: str):
    """What `sharding.enable` reads of an Accelerator that the launch made FSDP2 or DeepSpeed."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    config = {"zero_optimization": {"stage": {"zero2": 2, "zero3": 3}.get(strategy, 0)}, "gradient_clipping": 1.0,
              "train_micro_batch_size_per_gpu": "auto"}
    plugin = SimpleNamespace(deepspeed_config=config, is_auto=lambda key: config.get(key) == "auto")
    kind = DistributedType.FSDP if strategy == "fsdp" else DistributedType.DEEPSPEED
    return SimpleNamespace(distributed_type=kind, is_fsdp2=strategy == "fsdp", num_processes=2,
                           state=SimpleNamespace(deepspeed_plugin=plugin))


@pytest.mark.parametrize("strategy", ["fsdp", "zero2", "zero3"])
def test_every_method_under_every_strategy_runs_or_is_refused_at_launch_in_one_line(strategy: str) -> None:
    """Each cell of the method x strategy matrix as the launch decides it (`sharding.enable`, before
    any weight loads): the methods that ran equal to one process on 2 CPU processes go on
    (docs/distributed.md), the others are one line naming the method and the strategy; under
    DeepSpeed the loop's settings its engine would not honour are refused for every method."""
    from types import SimpleNamespace

    from toolkit import sharding
    from toolkit.errors import UserError
    from toolkit.methods import METHODS

    for name in METHODS.names():
        train = SimpleNamespace(grad_accum=1, max_grad_norm=1.0, skip_nonfinite=0, batch_size=4)
        recipe = SimpleNamespace(method=METHODS.get(name)(), train=train)
        recipe.method.name = name
        if name in RUNS_SHARDED:
            sharding.enable(_prepared(strategy), recipe)
            for setting, value in (("grad_accum", 2), ("max_grad_norm", 0.5), ("skip_nonfinite", 3)):
                bad = SimpleNamespace(method=recipe.method, train=SimpleNamespace(**{**vars(train), setting: value}))
                if strategy == "fsdp":
                    sharding.enable(_prepared(strategy), bad)
                else:
                    with pytest.raises(UserError, match=f"^train.{setting}: "):
                        sharding.enable(_prepared(strategy), bad)
            continue
        with pytest.raises(UserError) as refused:
            sharding.enable(_prepared(strategy), recipe)
        said = str(refused.value)
        kind = "FSDP" if strategy == "fsdp" else "DEEPSPEED"
        assert said.startswith(f"method.name: '{name}' under {kind}: ") and "\n" not in said, said


@pytest.mark.parametrize("steps, refused", [(2, True), (1, False), ("auto", False)])
def test_a_deepspeed_config_file_that_accumulates_is_refused_in_one_line(tmp_path: Path, monkeypatch,
                                                                         steps, refused: bool) -> None:
    """A DeepSpeed config file (`deepspeed_config_file:` in accelerate's config) with
    `gradient_accumulation_steps: 2`: accelerate takes DeepSpeed's value over its own, and the
    engine, stepped at every micro-batch (each a boundary: the loop does not accumulate under
    DeepSpeed), scaled every loss by 1/2. On 2 CPU processes (ZeRO-2, BERT, 4 steps) the logged
    gradient norms were half the gas-1 run's (0.28 against 0.57 at step 1), so train.max_grad_norm
    clipped at twice its value; AdamW's scale invariance left the losses equal, exit 0 (the yaml's
    own `gradient_accumulation_steps` reaches the run as ACCELERATE_GRADIENT_ACCUMULATION_STEPS,
    refused already). Read from the plugin accelerate builds from the file."""
    from types import SimpleNamespace

    from accelerate.utils import DeepSpeedPlugin

    from toolkit import sharding
    from toolkit.errors import UserError

    pytest.importorskip("deepspeed")
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0,
                                  "gradient_accumulation_steps": steps, "train_micro_batch_size_per_gpu": "auto"}))
    monkeypatch.delenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", raising=False)
    plugin = DeepSpeedPlugin(hf_ds_config=str(config))
    train = SimpleNamespace(grad_accum=1, max_grad_norm=1.0, skip_nonfinite=0, batch_size=4)
    if not refused:
        sharding.deepspeed_conflict(train, plugin)
        return
    with pytest.raises(UserError, match=r"^gradient_accumulation_steps: 2 in the DeepSpeed config: its engine would "
                                        r"scale every loss by 1/2 for an accumulation the loop does not do") as said:
        sharding.deepspeed_conflict(train, plugin)
    assert "\n" not in str(said.value)


@pytest.mark.parametrize("section, precision, said", [
    ({"fp16": {"enabled": True}}, "no", r"^fp16.enabled: true in the DeepSpeed config, but train.mixed_precision is "
                                        r"no: its engine would train in fp16"),
    ({"bf16": {"enabled": "true"}}, "no", r"^bf16.enabled: true in the DeepSpeed config, but train.mixed_precision "
                                          r"is no"),
    ({"fp16": {"enabled": True}}, "fp16", None),
    ({"bf16": {"enabled": "auto"}}, "no", None),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 3e-5}}}, "no", r"^optimizer: in the DeepSpeed config; the run's "
                                                                      r"AdamW \(train.lr, train.weight_decay\)"),
    ({"scheduler": {"type": "WarmupLR"}}, "no", r"^scheduler: in the DeepSpeed config; the run's learning-rate"),
])
def test_a_deepspeed_config_file_that_decides_what_the_recipe_does_is_refused_in_one_line(
        tmp_path: Path, section: dict, precision: str, said: str | None) -> None:
    """A DeepSpeed config file's own precision, optimizer or schedule. accelerate fills an "auto"
    `fp16.enabled` / `bf16.enabled` from the run's precision and keeps a written value: a file
    saying `fp16: {enabled: true}` under a float32 recipe had the engine train in fp16 while the
    run recorded float32 (the plugin read back: fp16 enabled after `set_mixed_precision("no")`).
    An `optimizer` or `scheduler` section was accelerate's ValueError at prepare, a traceback."""
    from types import SimpleNamespace

    from accelerate.utils import DeepSpeedPlugin

    from toolkit import sharding
    from toolkit.errors import UserError

    pytest.importorskip("deepspeed")
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0,
                                  "train_micro_batch_size_per_gpu": "auto", **section}))
    plugin = DeepSpeedPlugin(hf_ds_config=str(config))
    plugin.set_mixed_precision(precision)  # what the Accelerator does with the run's precision
    train = SimpleNamespace(grad_accum=1, max_grad_norm=1.0, skip_nonfinite=0, batch_size=4, mixed_precision=precision)
    if said is None:
        sharding.deepspeed_conflict(train, plugin)
        return
    with pytest.raises(UserError, match=said) as refused:
        sharding.deepspeed_conflict(train, plugin)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("file, fields, precision, said", [
    ({"fp16": {"enabled": True}}, "deepspeed_config_file", "bf16",
     r"^fp16.enabled: true in the DeepSpeed config .*ds.json, but train.mixed_precision is bf16: .* set it to \"auto\" "
     r"\(the recipe decides\) or train.mixed_precision: fp16$"),
    ({"bf16": {"enabled": "true"}}, "deepspeed_config_file", "fp16", r"^bf16.enabled: true in the DeepSpeed config "),
    ({"bf16": {"enabled": True}}, "deepspeed_config_file", "bf16", None),
    ({"bf16": {"enabled": "auto"}}, "deepspeed_config_file", "fp16", None),
    ({}, "deepspeed_config_file,mixed_precision", "no",
     r"^mixed_precision: in the accelerate config beside deepspeed_config_file: .*ds.json, which accelerate takes "
     r"alone; remove mixed_precision from the accelerate config \(train.mixed_precision decides the precision\)$"),
    ({}, "deepspeed_config_file,zero3_init_flag,zero_stage", "no",
     r"^zero_stage: in the accelerate config beside deepspeed_config_file: .*ds.json, .* \(set it in .*ds.json\)$"),
    ({}, "deepspeed_config_file,zero3_init_flag", "no", None),
])
def test_a_deepspeed_config_file_that_accelerate_refuses_is_refused_in_one_line(
        tmp_path: Path, monkeypatch, file: dict, fields: str, precision: str, said: str | None) -> None:
    """Before the Accelerator is made (toolkit.train.run calls it before `Accelerator(...)`):
    a DeepSpeed config file enabling one half precision under a recipe of the other, or an
    accelerate config naming `mixed_precision` (or `zero_stage`, `gradient_clipping`, ...) beside
    `deepspeed_config_file`, was accelerate's own ValueError traceback as the Accelerator was made
    (checked here against accelerate's plugin); now one line naming the key, the file and the fix."""
    from types import SimpleNamespace

    from accelerate.utils import DeepSpeedPlugin

    from toolkit import sharding
    from toolkit.errors import UserError

    pytest.importorskip("deepspeed")
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto", **file}))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(config))
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", fields)
    train = SimpleNamespace(mixed_precision=precision, batch_size=4, grad_accum=1)
    if said is None:
        sharding.check_deepspeed_file(train)
        DeepSpeedPlugin().set_mixed_precision(precision)  # and accelerate accepts it
        return
    with pytest.raises(ValueError):  # what accelerate says of it, a traceback before
        DeepSpeedPlugin().set_mixed_precision(precision)
    with pytest.raises(UserError, match=said) as refused:
        sharding.check_deepspeed_file(train)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("sizes, said", [
    ({"train_micro_batch_size_per_gpu": 8}, r"^train_micro_batch_size_per_gpu: 8 in the DeepSpeed config, but each "
                                            r"process's batch is train.batch_size: 4; set it to \"auto\" or 4$"),
    ({"train_batch_size": 32}, r"^train_batch_size: 32 in the DeepSpeed config, but the run's batch is "
                               r"train.batch_size 4 x 2 process\(es\) = 8; set it to \"auto\" or 8"),
    ({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": 4}, r"^train_batch_size: 4 in"),
    ({"train_micro_batch_size_per_gpu": 4, "train_batch_size": 8}, None),
    ({"train_batch_size": 8}, None),
    ({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto"}, None),
])
def test_a_deepspeed_config_file_with_another_batch_is_refused_in_one_line(tmp_path: Path, sizes: dict,
                                                                           said: str | None) -> None:
    """A DeepSpeed config file's own batch sizes (2 processes, train.batch_size 4): accelerate keeps
    a written `train_micro_batch_size_per_gpu` / `train_batch_size` (its `deepspeed_config_process`
    fills "auto" only, must_match=False), so a micro-batch other than the recipe's had the engine
    count a batch the loop does not feed, a `train_batch_size` other than 4 x 2 was DeepSpeed's
    batch AssertionError at prepare, and one without a micro-batch had DeepSpeed derive its own
    (32 / 2 = 16 per process). Refused in one line; a file without a micro-batch gets the recipe's."""
    from types import SimpleNamespace

    from accelerate.utils import DeepSpeedPlugin

    from toolkit import sharding
    from toolkit.errors import UserError

    pytest.importorskip("deepspeed")
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0, **sizes}))
    plugin = DeepSpeedPlugin(hf_ds_config=str(config))
    train = SimpleNamespace(grad_accum=1, max_grad_norm=1.0, skip_nonfinite=0, batch_size=4, mixed_precision="no")
    if said is None:  # and the engine's micro-batch is the recipe's, as `sharding.enable` sets it
        from accelerate.utils import DistributedType

        from toolkit.methods import METHODS

        name = sorted(RUNS_SHARDED)[0]
        recipe = SimpleNamespace(method=METHODS.get(name)(), train=train)
        recipe.method.name = name
        sharding.enable(SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, is_fsdp2=False, num_processes=2,
                                        state=SimpleNamespace(deepspeed_plugin=plugin)), recipe)
        assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == 4
        return
    with pytest.raises(UserError, match=said) as refused:
        sharding.deepspeed_conflict(train, plugin, 2)
    assert "\n" not in str(refused.value)


# --- the strategy as part of a run's identity -------------------------------------------------
STRATEGY_LAUNCHES = [("one", 1, "none"), ("ddp", 2, "ddp"), ("fsdp", 2, "fsdp"), ("fsdp", 1, "fsdp"),
                     ("zero2", 2, "zero2"), ("zero3", 2, "zero3")]


def test_the_strategy_is_part_of_a_run_id_where_it_changes_the_computation(tmp_path: Path, monkeypatch,
                                                                           tiny_checkpoint) -> None:
    """FSDP, ZeRO-2 and ZeRO-3 launches of one recipe on 2 processes had the DDP launch's run id
    (only metrics.json's distributed_type told them apart): a ZeRO-3 launch after the DDP one said
    "finished already" and stood on the DDP run's metrics, exit 0. The strategy, one name on CPU
    and GPU, is in the id now where it is another computation; one process and DDP keep the ids
    they had (the formula before it), and a DeepSpeed config file's stage is the one that counts."""
    import hashlib

    from toolkit import checkpoints, recipe as recipes, runs

    recipe = recipes.load(write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"),
                                                                         method="{name: full}")), [])
    ids = {}
    for strategy, processes, name in STRATEGY_LAUNCHES:
        as_launched(monkeypatch, launch_env(strategy, processes))
        assert runs.strategy() == name, (strategy, processes)
        ids[strategy, processes] = runs.run_id(recipe)
        assert checkpoints.identity(recipe, processes)["strategy"] == name
    assert len(set(ids.values())) == len(ids), ids
    before = {n: hashlib.sha256(f"{recipe.hash}|{n}|{runs.data_fingerprint(recipe.task.data_files())}".encode())
              .hexdigest()[:12] for n in (1, 2)}
    assert (ids["one", 1], ids["ddp", 2]) == (before[1], before[2])  # the runs made before keep their ids
    # a DeepSpeed config file: its zero_optimization.stage is the stage (accelerate reads it there)
    for stage in (2, 3):
        config = tmp_path / f"ds{stage}.json"
        config.write_text(json.dumps({"zero_optimization": {"stage": stage}}))
        launch = launch_env("zero2", 2, config)
        launch.pop("ACCELERATE_DEEPSPEED_ZERO_STAGE", None)
        as_launched(monkeypatch, launch)
        assert runs.strategy() == f"zero{stage}" and runs.run_id(recipe) == ids[f"zero{stage}", 2]
    # an interrupted run under another strategy is named with what differs (its identity.json)
    then, now = ({**checkpoints.identity(recipe, 2), "strategy": s} for s in ("fsdp", "ddp"))
    assert checkpoints._differences(then, now) == ["STRATEGY=fsdp (now ddp)"]
    old = {k: v for k, v in now.items() if k != "strategy"}  # an identity.json from before the record: DDP
    assert checkpoints._differences(old, {**now, "strategy": "zero3"}) == ["STRATEGY=ddp (now zero3)"]
    assert checkpoints._differences({**old, "processes": 1}, now) == ["1 process(es) (now 2)"]  # none -> ddp: the count
    # an FSDP run interrupted before the record (at the DDP id now): its checkpoint's layout says FSDP
    as_launched(monkeypatch, launch_env("ddp", 2))
    interrupted = runs.run_dir(recipe, tmp_path / "runs")
    step = interrupted / "checkpoints" / "step-000003"
    for rel in LAYOUTS["fsdp", 2]:
        (step / rel).parent.mkdir(parents=True, exist_ok=True)
        (step / rel).write_bytes(b"x")
    runs.write_json(interrupted / checkpoints.IDENTITY, old)
    as_launched(monkeypatch, launch_env("zero3", 2))
    said = checkpoints.other_interrupted(runs.run_dir(recipe, tmp_path / "runs"), recipe, 2)
    assert said and said.endswith(", with STRATEGY=fsdp (now zero3)"), said


@pytest.fixture(scope="module")
def finished_one_process_run(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint) -> tuple[Path, Path]:
    """(recipe, its finished one-process run): BERT full, 1 step."""
    from toolkit.cli import main

    tmp = tmp_path_factory.mktemp("finished")
    recipe = write_recipe(tmp / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint("bert")}}}
task: {{name: glue, subset: mrpc, max_length: 32, max_train_samples: 4, max_eval_samples: 4}}
method: {{name: full}}
train: {{max_steps: 1, batch_size: 4}}
""")
    assert main(["run", str(recipe), "--runs-dir", str(tmp / "runs")]) == 0
    return recipe, only_run(tmp / "runs")


@pytest.mark.parametrize("recorded, said", [
    ({}, None),  # this toolkit's run: finished for its own launch
    ({"strategy": None, "distributed_type": "NO"}, None),  # a run from before the record, one plain process
    ({"strategy": None, "distributed_type": "FSDP"}, "fsdp"),  # an FSDP run made before: the id one process has now
    ({"strategy": None, "distributed_type": "DEEPSPEED"}, "deepspeed"),
    ({"strategy": "zero3"}, "zero3"),
])
@pytest.mark.parametrize("entry", ["run", "sweep", "api"])
def test_a_run_finished_under_another_strategy_is_not_finished_for_this_launch(
        finished_one_process_run, cli, monkeypatch, recorded: dict, said: str | None, entry: str) -> None:
    """A run at this launch's id whose metrics.json says it ran under another strategy (an FSDP or
    ZeRO run made before the strategy was part of the id sits at the id the plain launch of its
    process count has now) was "finished already", its metrics standing for this launch, exit 0:
    one line naming both strategies now, exit 2, the run left as it is; for its own strategy it is
    finished (runs made before the record read as what their distributed_type says)."""
    import toolkit
    from toolkit.errors import UserError

    recipe, run = finished_one_process_run
    as_launched(monkeypatch, {})
    metrics = run / "metrics.json"
    kept = metrics.read_text()
    data = json.loads(kept)
    assert data["strategy"] == "none"
    metrics.write_text(json.dumps({k: v for k, v in {**data, **recorded}.items() if v is not None}))
    try:
        if entry == "api":
            try:
                toolkit.run(recipe, runs_dir=run.parents[1])
                code, err = 0, ""
            except UserError as exc:
                code, err = 2, f"error: {exc}\n"
        else:
            code, out, err = cli(entry, recipe, "--runs-dir", run.parents[1])
        assert sorted(run.parent.iterdir()) == [run]  # nothing trained
        if said is None:
            assert code == 0, err
            return
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{run}: finished under STRATEGY={said} on 1 process(es)" in err, err
        assert "this launch is STRATEGY=none" in err and "--force" in err, err
        assert json.loads(metrics.read_text()).get("distributed_type") == recorded.get("distributed_type",
                                                                                       data["distributed_type"])
    finally:
        metrics.write_text(kept)


@pytest.mark.parametrize("launch, recorded, said", [("fsdp", "FSDP", "fsdp"), ("zero3", "DEEPSPEED", "deepspeed"),
                                                    ("zero3", "FSDP", None)])
def test_a_sharded_launch_names_the_run_of_its_strategy_made_before_the_record(
        finished_one_process_run, cli, monkeypatch, launch: str, recorded: str, said: str | None) -> None:
    """An FSDP or ZeRO run made before the strategy was in the run id sits at the plain launch's id:
    the same launch now has its own id and trains from step 0; a note names the earlier run (here
    the launch stops after it: one CPU process runs neither)."""
    recipe, run = finished_one_process_run
    metrics = run / "metrics.json"
    kept = metrics.read_text()
    data = {k: v for k, v in json.loads(kept).items() if k != "strategy"}
    metrics.write_text(json.dumps({**data, "distributed_type": recorded}))
    try:
        as_launched(monkeypatch, launch_env(launch, 1))
        code, out, err = cli("run", recipe, "--runs-dir", run.parents[1])
        assert code == 2, err  # refused as it starts (one CPU process: plain, not sharded)
        note = f"note: {run} is a finished run of this recipe under STRATEGY={said}"
        assert (note in err) == (said is not None), err
        assert sorted(run.parent.iterdir()) == [run]
    finally:
        metrics.write_text(kept)


STUB_DEEPSPEED = '''import logging, os, sys
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # as deepspeed/__init__.py does
os.environ["STUB_DEEPSPEED_CHANGED"] = "by the import"
logger = logging.getLogger("DeepSpeed")  # as deepspeed.utils.logging's LoggerFactory does
logger.setLevel(logging.INFO)
logger.propagate = False
logger.addHandler(logging.StreamHandler(sys.stdout))
'''


@pytest.mark.parametrize("entry", ["run's launch check", "import_deepspeed"])
def test_importing_deepspeed_leaves_the_process_as_it_found_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               entry: str) -> None:
    """`import deepspeed` set PYTORCH_NVML_BASED_CUDA_CHECK in os.environ and gave the "DeepSpeed"
    logger (which quiet's filters had made) a level, a stdout handler and propagate False, for the
    rest of the process: the first run of a process (or of the API) ran without them, every later
    one with them. The toolkit's import (before a DeepSpeed launch's Accelerator, and where it
    gathers ZeRO-3's partitions) puts them back; a stub stands for DeepSpeed, imported or not."""
    import logging

    from toolkit import quiet, sharding

    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "deepspeed" / "__init__.py").write_text(STUB_DEEPSPEED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    for key in ("PYTORCH_NVML_BASED_CUDA_CHECK", "STUB_DEEPSPEED_CHANGED"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("STUB_DEEPSPEED_CHANGED", "the user's")
    quiet._log_filters()  # the logger exists, with quiet's filter, before a run imports DeepSpeed
    logger = logging.getLogger("DeepSpeed")
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    before = (dict(os.environ), logger.level, logger.propagate, list(logger.handlers), list(logger.filters))
    if entry == "run's launch check":
        monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
        before[0]["ACCELERATE_USE_DEEPSPEED"] = "true"
        sharding.import_deepspeed_if_asked()
    else:
        assert sharding.import_deepspeed().__file__ == str(tmp_path / "deepspeed" / "__init__.py")
    assert "deepspeed" in sys.modules and sys.modules["deepspeed"].__file__.startswith(str(tmp_path))
    assert (dict(os.environ), logger.level, logger.propagate, list(logger.handlers), list(logger.filters)) == before
    assert sharding.import_deepspeed() is sys.modules["deepspeed"]  # imported once: returned as it is
