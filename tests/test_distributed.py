"""Two gloo processes (torchrun) equal one process with the same global batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import as_launched, launch_env, ROOT, write_recipe
from test_train import nan_loss_at_forward, only_run, train_losses, weights

RECIPE = """model: {{checkpoint: {checkpoint}, dropout: 0.0}}
task: {{name: glue, subset: mrpc, max_length: 64, max_train_samples: 32, max_eval_samples: 30}}
method: {method}
train: {{epochs: 1, lr: 2.0e-3, seed: 3, eval_batch_size: 4, log_every: 1, keep_best: false}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TWO_PROCESS_CASES = [
    ("roberta-base", "{name: lora, r: 4}"),
    ("bert-base-uncased", "{name: adapters, config: pfeiffer}"),
    ("roberta-base", "{name: prompt_tuning, num_virtual_tokens: 4}"),
    ("gpt2", "{name: icl, shots: 2, batch_size: 4}"),
]
# icl reads no training setting nor task.max_length (refused where set): its batches are its own
ICL_RECIPE = """model: {{checkpoint: {checkpoint}}}
task: {{name: glue, subset: mrpc, max_train_samples: 32, max_eval_samples: 30}}
method: {method}
train: {{seed: 3}}
"""


def _case(checkpoint: str, method: str, batch_size: int) -> tuple[str, list[str]]:
    """A two-process case's recipe and the batch override its one- or two-process run takes."""
    if "icl" in method:
        return ICL_RECIPE.format(checkpoint=checkpoint, method=method), []
    return RECIPE.format(checkpoint=checkpoint, method=method), [f"train.batch_size={batch_size}"]


# test_accounting's launcher, where a job may also be {"args": [...], "nan": [rank, call]}: that
# process's forward gives a NaN loss at its call-th micro-batch of the run
FAULT_LAUNCHER = """import atexit, json, os, sys
sys.path.insert(0, {root!r})
import torch
from toolkit import train
from toolkit.cli import main
# registered before every run: the last exit handler to run, it sees what the toolkit's left at exit
atexit.register(lambda: open(sys.argv[1] + ".ended" + os.environ["RANK"], "w").write(
    json.dumps(torch.distributed.is_initialized())))
forward, calls, fault = train.Loop._forward_loss, [], [None]

def faulty(self, batch):
    calls.append(1)
    loss = forward(self, batch)
    nan = fault[0] is not None and os.environ["RANK"] == str(fault[0][0]) and len(calls) == fault[0][1]
    return loss * float("nan") if nan else loss

train.Loop._forward_loss = faulty
# first, in the launch's first generation: a sweep of 2 points, each point's `toolkit run` processes
# launched by the sweep of every process; what rank 0's sweep says is kept for the test
import contextlib, io
said = io.StringIO()
with contextlib.redirect_stdout(said):
    code = main(json.loads(open(sys.argv[1]).read())["sweep"])
if os.environ["RANK"] == "0":
    open(sys.argv[1] + ".sweep-said", "w").write(said.getvalue())
if code != 0:
    sys.exit(f"failed: the sweep ({{said.getvalue()[-500:]}})")
for job in json.loads(open(sys.argv[1]).read())["runs"]:
    args, fault[0] = (job["args"], job["nan"]) if isinstance(job, dict) else (job, None)
    calls.clear()
    if main(args) != 0:
        sys.exit(f"failed: {{args}}")
fault[0] = None
"""
# AdaLoRA re-allocating at every step (delta_t 1) over 4 steps, finalizing at step 3: a host-checked step
SKIPPED = ("bert-base-uncased", "{name: adalora, init_r: 4, target_r: 2, delta_t: 1, tinit_ratio: 0.0, "
                                "tfinal_ratio: 0.25}")
SKIP_ARGS = ["train.skip_nonfinite=1"]


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory: pytest.TempPathFactory, _smoke_cache: Path) -> dict[tuple[str, str], Path]:
    """(checkpoint, method) -> (recipe, runs folder of its 2-process run): every case's run in one
    torchrun launch, in turn (test_accounting's launcher), made once for the module: a launch's
    start-up (two interpreters importing torch and transformers) is most of a --smoke run's time.
    The same launch then makes and scores every task type's run (EVERY_TASK: its jobs and the
    launch's folder under "every_task")."""
    from test_accounting import _torchrun

    tmp = tmp_path_factory.mktemp("two")
    out, jobs = {}, []
    for i, (checkpoint, method) in enumerate(TWO_PROCESS_CASES):
        text, batch = _case(checkpoint, method, 4)
        recipe = write_recipe(tmp / str(i) / "r.yaml", text)
        out[checkpoint, method] = (recipe, tmp / str(i) / "two")
        jobs.append(["run", str(recipe), "--smoke", "--runs-dir", str(tmp / str(i) / "two"), *batch])
    # dropout on, every step checkpointed: each process's random state, step by step
    recipe = write_recipe(tmp / "dropout" / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased",
                                                                     method="{name: full}"))
    out["dropout"] = (recipe, tmp / "dropout" / "two")
    jobs.append(["run", str(recipe), "--smoke", "--runs-dir", str(tmp / "dropout" / "two"), "train.batch_size=4",
                 "model.dropout=0.1", "train.save_every=1", "train.save_total_limit=4", "train.keep_checkpoints=true"])
    # the host-checked path's skip: process 1 alone draws a NaN loss at step 2
    recipe = write_recipe(tmp / "skipped" / "r.yaml", RECIPE.format(checkpoint=SKIPPED[0], method=SKIPPED[1]))
    out["skipped"] = (recipe, tmp / "skipped" / "two")
    jobs.append({"args": ["run", str(recipe), "--smoke", "--runs-dir", str(tmp / "skipped" / "two"),
                          "train.batch_size=4", *SKIP_ARGS], "nan": [1, 2]})
    every = []
    for name, text in EVERY_TASK.items():
        in_context = "name: icl" in text  # trains nothing, and takes no training setting
        recipe = write_recipe(tmp / "every" / name / "r.yaml", text + ("\ntrain: {seed: 3}" if in_context else TRAINED))
        every.append([name, str(recipe), str(tmp / "every" / name / "runs")])
    out["every_task"] = (every, tmp)
    # a sweep of 2 points on the launch's processes (test_a_sweep_under_torchrun_runs_every_point_...)
    recipe = write_recipe(tmp / "sweep" / "s.yaml", RECIPE.format(checkpoint="bert-base-uncased", method="{name: freeze}"))
    out["sweep"] = (tmp / "jobs.json.sweep-said", tmp / "sweep" / "runs")
    sweep = ["sweep", str(recipe), "train.lr=1e-3,2e-3", "--seeds", "42", "--smoke", "--runs-dir",
             str(tmp / "sweep" / "runs"), "task.max_train_samples=8", "task.max_eval_samples=4", "train.batch_size=2"]
    _torchrun(tmp, {"runs": jobs, "every_task": every, "sweep": sweep}, FAULT_LAUNCHER + EVERY_TASK_LAUNCH)
    return out


def test_a_sweep_under_torchrun_runs_every_point_on_the_launchs_processes(two_process_runs) -> None:
    """Rule: under a launch each point's runs (one `toolkit run` per process) meet in a rendezvous
    store of their own. In the launcher's store, shared by every point, the second point's
    processes read the first point's addresses and gloo failed to connect to processes gone
    ("Connection refused", a traceback): the sweep stopped at its second point
    (`sharding.point_launch`). The sweep is the shared launch's first job (its launch's first
    generation, as a sweep launched alone)."""
    said, runs_dir = two_process_runs["sweep"]
    assert said.read_text().splitlines()[-1] == "sweep: 2 runs done"
    finished = sorted(runs_dir.rglob("metrics.json"))
    assert len(finished) == 2
    assert [json.loads(m.read_text())["num_processes"] for m in finished] == [2, 2]


def test_each_process_draws_its_own_dropout_masks(two_process_runs) -> None:
    """The model is built alike on every process (train.seed), and then each process draws its
    own masks: seeded alike (as transformers' Trainer seeds them), 2 processes drew the same
    dropout masks, row for row, for their two shares of every step. Process 0 keeps train.seed's
    stream (a 1-process run's); the random state each process checkpoints differs at every step."""
    from accelerate.utils import RNG_STATE_NAME

    _, two = two_process_runs["dropout"]
    steps = sorted((only_run(two) / "checkpoints").glob("step-*"))
    assert len(steps) == 4
    for step in steps:
        ranks = [torch.load(step / f"{RNG_STATE_NAME}_{p}.pkl", weights_only=False)["torch_manual_seed"]
                 for p in (0, 1)]
        assert not torch.equal(*ranks), step.name


def test_a_step_skipped_on_one_process_is_skipped_on_both_on_the_host_checked_path(tmp_path: Path, cli,
                                                                                   monkeypatch, two_process_runs):
    """AdaLoRA's step is checked on the host (its after_step; fp16's scaler takes the same
    `_host_step`). A NaN loss on process 1 alone at step 2 is skipped by both processes alike:
    the same step slot, the schedule moved on, AdaLoRA's re-allocation due at step 2 made at it
    (`skipped_step`) on both, and the run equals a 1-process run at the same global batch whose
    step 2 was skipped: steps, learning rates, losses, metrics and the saved adapter."""
    recipe, two = two_process_runs["skipped"]
    nan_loss_at_forward(monkeypatch, 2)
    one = tmp_path / "one"
    code, out, err = cli("run", recipe, "--smoke", "--runs-dir", one, "train.batch_size=8", *SKIP_ARGS)
    assert code == 0 and "step 2: non-finite loss; 1 optimizer step (1 micro-batch) skipped" in out + err, err
    a, b = only_run(one), only_run(two)
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    assert mb["num_processes"] == 2 and ma["train_steps"] == mb["train_steps"] == 4
    assert ma["skipped_nonfinite"] == mb["skipped_nonfinite"] == 1
    la, lb = ([(e["step"], e["lr"], e["loss"]) for e in _log(p) if "loss" in e] for p in (a, b))
    assert [s for s, _, _ in la] == [s for s, _, _ in lb] == [1, 2, 3, 4] and la[1][2] is None is lb[1][2]
    assert [lr for _, lr, _ in la] == [lr for _, lr, _ in lb]
    assert [x for _, _, x in la if x is not None] == pytest.approx([x for _, _, x in lb if x is not None], abs=1e-5)
    assert ma["eval"]["loss"] == pytest.approx(mb["eval"]["loss"], abs=1e-5)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=1e-4)


def _log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_process_zero_keeps_the_seeds_stream() -> None:
    """A 1-process run and process 0 draw what train.seed gives; process 1 another stream."""
    from toolkit.setup import seed_process

    def draws(process: int) -> torch.Tensor:
        torch.manual_seed(3)
        seed_process(3, process)
        return torch.rand(4)

    torch.manual_seed(3)
    seeds = torch.rand(4)
    assert torch.equal(draws(0), seeds) and not torch.equal(draws(1), seeds)


@pytest.mark.parametrize("checkpoint, method", TWO_PROCESS_CASES)
def test_two_processes_equal_one(tmp_path: Path, cli, two_process_runs, checkpoint: str, method: str) -> None:
    recipe, two = two_process_runs[checkpoint, method]
    one = tmp_path / "one"
    assert cli("run", recipe, "--smoke", "--runs-dir", one, *_case(checkpoint, method, 8)[1])[0] == 0
    a, b = only_run(one), only_run(two)
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    assert mb["num_processes"] == 2 and ma["num_processes"] == 1
    # 30 eval examples over 2 ranks in batches of 4: the padded tail must be counted once
    scores = {k: v for k, v in ma["eval"].items() if not k.startswith("loss")}
    assert scores == {k: mb["eval"][k] for k in scores}
    assert ma["eval"]["loss"] == pytest.approx(mb["eval"]["loss"], abs=1e-6)  # sums in another order
    if "icl" in method:
        assert ma["train_steps"] == mb["train_steps"] == 0
        return
    assert ma["train_steps"] == mb["train_steps"] == 4
    assert train_losses(a) == pytest.approx(train_losses(b), abs=1e-5)
    wa, wb = weights(a), weights(b)
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=1e-4)


# One smoke run of every task type, made and scored under one launch of 2 processes and scored
# again by one: 13 eval examples (QA: their windows, several an example) in batches of 4, so the
# last batch is short and on one process alone; generation pads each process's outputs to its
# own width; MLM's held-out masks; CLM's perplexity token counts; in-context label words and
# generation.
EVERY_TASK = {
    "classification": "model: {checkpoint: bert-base-uncased}\ntask: {name: glue, subset: sst2, max_length: 32}",
    "regression": "model: {checkpoint: bert-base-uncased}\ntask: {name: glue, subset: stsb, max_length: 48}",
    "ner": "model: {checkpoint: bert-base-uncased}\ntask: {name: ner, max_length: 48}",
    "squad_v1": "model: {checkpoint: bert-base-uncased}\ntask: {name: squad, version: v1, max_length: 64, doc_stride: 20, "
                "eval_file: $TOOLKIT_DATA/squad/v1.1/dev-v1.1.json, split_articles: 0.834, split_seed: 0}",
    "squad_v2": "model: {checkpoint: bert-base-uncased}\ntask: {name: squad, version: v2, max_length: 64, doc_stride: 20, "
                "eval_file: $TOOLKIT_DATA/squad/v1.1/dev-v1.1.json, split_articles: 0.834, split_seed: 0}",
    "summarization": "model: {checkpoint: t5-base}\ntask: {name: summarization, subset: samsum, max_length: 96, "
                     "max_target_length: 24, generation: {num_beams: 2, max_new_tokens: 8}}",
    "translation": "model: {checkpoint: gpt2}\ntask: {name: translation, subset: multi30k, source_lang: en, "
                   "target_lang: de, max_length: 48, max_target_length: 24, generation: {max_new_tokens: 8}}",
    "mlm": "model: {checkpoint: roberta-base}\ntask: {name: mlm, max_length: 32, train_file: "
           "$TOOLKIT_DATA/lm/wikitext-2/valid.txt, eval_file: $TOOLKIT_DATA/lm/wikitext-2/test.txt}",
    "clm": "model: {checkpoint: gpt2}\ntask: {name: clm, max_length: 32, train_file: $TOOLKIT_DATA/lm/ptb/ptb.valid.txt, "
           "eval_file: $TOOLKIT_DATA/lm/ptb/ptb.test.txt}",
    "icl": "model: {checkpoint: t5-base}\ntask: {name: glue, subset: rte}\nmethod: {name: icl, shots: 2, batch_size: 3}",
    "icl_generation": "model: {checkpoint: gpt2}\ntask: {name: summarization, subset: samsum, generation: "
                      "{max_new_tokens: 8}}\nmethod: {name: icl, shots: 1, batch_size: 3}",
}
TRAINED = "\nmethod: {name: full}\ntrain: {max_steps: 1, eval_batch_size: 4, seed: 3}"
EVERY_TASK_LAUNCH = """import json, os, sys
sys.path.insert(0, {root!r})
import toolkit
for name, recipe, runs in json.loads(open(sys.argv[1]).read())["every_task"]:
    run = toolkit.run(recipe, ["task.max_train_samples=8", "task.max_eval_samples=13"], runs_dir=runs, smoke=True)
    toolkit.evaluate(run)  # the API's, split over the launch as `toolkit eval`
    if os.environ["RANK"] == "0":  # kept apart from the one-process evaluation's files
        for made in ("eval-eval.json", "predictions-eval.jsonl"):
            if os.path.exists(os.path.join(run, made)):
                os.rename(os.path.join(run, made), os.path.join(run, "two-" + made))
# text-to-text generation under FSDP2 (the launch's gloo group): a decoding that runs one prompt length
# at a time (min_length reads the prompt), 1 length on process 0 and 2 on process 1
import torch
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
from transformers import AutoModelForCausalLM, AutoTokenizer
from toolkit import models
from toolkit.tasks._generation import Generation
from toolkit.tasks.summarization import Summarization
path = models.smoke_checkpoint("gpt2")
tok = AutoTokenizer.from_pretrained(path)
tok.pad_token = tok.eos_token
model = AutoModelForCausalLM.from_pretrained(path).eval()
plain = models.shards_weights(model)
for layer in model.transformer.h:
    fully_shard(layer)
fully_shard(model)
register_fsdp_forward_method(model, "generate")
task = Summarization(generation=Generation(max_new_tokens=6, min_length=12))
task.model_head("gpt2")
task._tokenizer = tok
rank = int(os.environ["RANK"])
rows = [[11, 12, 13]] if rank == 0 else [list(range(20, 40)), [11, 12, 13]]
width = max(map(len, rows))
ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
seen = [plain, models.shards_weights(model), task.generate(model, {{"prompt_ids": ids, "prompt_mask": mask}}).tolist()]
open(sys.argv[1] + f".synced{{rank}}", "w").write(json.dumps(seen))
"""


def test_a_launch_ends_its_process_group_before_the_interpreter_does(two_process_runs) -> None:
    """Every process of a launch that ran the toolkit (runs, evaluations) finds the process group
    destroyed at its exit: left to the interpreter's finalization, gloo's threads aborted a process
    that had finished and written everything (SIGABRT, 'terminate called without an active
    exception': the launch exit 1, a finished run a crash)."""
    _, launched = two_process_runs["every_task"]
    assert [json.loads((launched / f"jobs.json.ended{r}").read_text()) for r in (0, 1)] == [False, False]


def test_every_task_scores_on_two_processes_what_one_process_scores(two_process_runs) -> None:
    """Evaluation on 2 processes, in the run and through the API (`toolkit.evaluate`, as `toolkit
    eval`), gives the 1-process evaluation's metrics and predictions files exactly, for every task
    type. accelerate's sharded loader filled the short last batch with the split's first examples,
    so the last examples were scored padded to another width (STS-B's pearson 1e-4 relative off);
    in-context label words were scored in contiguous slices, batched otherwise at their edges (the
    eval loss 6e-8 relative off); both exit 0."""
    import toolkit

    jobs, launched = two_process_runs["every_task"]  # made in the module's launch, after its other runs
    # text-to-text generation's rule of a sharded launch: every process makes as many `generate`
    # calls, in step (`models.shards_weights`: FSDP2's DTensor weights; a peer's count of prompt
    # lengths): process 0's one call and process 1's two ran (with 1 call, process 1's second
    # generate waited on process 0 to the group's timeout), the same prompt the same text
    (plain0, sharded0, out0), (plain1, sharded1, out1) = (json.loads((launched / f"jobs.json.synced{r}").read_text())
                                                          for r in (0, 1))
    assert (plain0, sharded0, plain1, sharded1) == (False, True, False, True)
    assert len(out0) == 1 and len(out1) == 2 and out0[0] == out1[1]
    for name, _, runs in jobs:
        run = only_run(Path(runs))
        in_run = json.loads((run / "metrics.json").read_text())
        assert in_run["num_processes"] == 2
        toolkit.evaluate(run)  # one process: this one (the files: a threshold of -inf is null there)
        alone, api = (json.loads((run / f"{two}eval-eval.json").read_text())["eval"] for two in ("", "two-"))
        # exact but for a float's last bits, which the weights' place in memory moves (MKL's kernels
        # follow the alignment: a CPU launch copies the model to accelerate's `cpu:0`)
        for scored in (in_run["eval"], api):
            assert scored.keys() == alone.keys(), name
            assert all(scored[k] == (alone[k] if alone[k] is None else pytest.approx(alone[k], rel=1e-6))
                       for k in alone), (name, scored, alone)
        if (run / "predictions.jsonl").exists() or name not in ("classification", "regression", "ner", "mlm",
                                                                 "clm", "icl"):
            one = (run / "predictions-eval.jsonl").read_text()
            assert (run / "predictions.jsonl").read_text() == one == (run / "two-predictions-eval.jsonl").read_text(), name


@pytest.mark.parametrize("env, message", [
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}, "FSDP needs a distributed launch"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1", "LOCAL_RANK": "0"}, "runs FSDP2 only"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "LOCAL_RANK": "0", "FSDP_OFFLOAD_PARAMS": "true"},
     "fsdp_offload_params: true offloads to the CPU from a GPU"),
    ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed needs a distributed launch"),
    ({"ACCELERATE_USE_DEEPSPEED": "true", "LOCAL_RANK": "0", "deepspeed": None}, "DeepSpeed is not installed"),
])
def test_sharded_launch_that_cannot_run_here_is_refused_not_faked(tmp_path: Path, cli, monkeypatch,
                                                                   env: dict, message: str) -> None:
    """A sharded strategy the CPU cannot run as asked stops with one line before anything is
    built, rather than running as plain data parallel under its name."""
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased", method="{name: full}"))
    for key, value in env.items():
        if value is None:  # a package this machine does not have
            monkeypatch.setitem(sys.modules, key, None)
        else:
            monkeypatch.setenv(key, value)
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("strategy, kind", [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("zero2", "DEEPSPEED"),
                                            ("zero3", "DEEPSPEED")])
def test_launch_configs_load(strategy: str, kind: str) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ROOT / "configs" / "accelerate" / f"{strategy}.yaml"))
    assert config.distributed_type.value == kind


NODES_RECIPE = """model: {{checkpoint: {checkpoint}, dropout: 0.0}}
task: {{name: glue, subset: sst2, max_length: 32, max_train_samples: 96, max_eval_samples: 24}}
method: {{name: full}}
train: {{max_steps: 12, lr: 1.0e-3, eval_every: 3, log_every: 1, save_total_limit: 2, seed: 5}}
"""


def _nodes(recipe: Path, runs: Path, port: int, *args: str) -> list[subprocess.Popen]:
    """Two "machines" of one process each: two torchrun launchers with their own node rank and
    the first one's address, as `accelerate launch` with num_machines 2 starts them. Each
    worker is its node's local rank 0: only the global main process may write the run folder."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank),
                              "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                              "-m", "toolkit.cli", "run", str(recipe), "--runs-dir", str(runs), "train.batch_size=4",
                              *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
            for rank in (0, 1)]


def test_two_nodes_write_the_run_once_and_resume_after_one_dies(tmp_path: Path, cli, tiny_checkpoint) -> None:
    """Issue 36 part 6 on one machine: a two-node launch (each node's worker is local rank 0)
    writes one run folder, each step logged once; a node killed (SIGKILL, its whole launcher)
    after a checkpoint leaves a run that the same two commands resume, ending where one process
    with the same global batch ends."""
    import signal
    import time

    recipe = write_recipe(tmp_path / "r.yaml", NODES_RECIPE.format(checkpoint=tiny_checkpoint("bert")))
    assert cli("run", recipe, "--runs-dir", tmp_path / "one", "train.batch_size=8")[0] == 0
    runs = tmp_path / "nodes"
    nodes = _nodes(recipe, runs, _free_port())
    deadline = time.time() + 300
    while time.time() < deadline and all(n.poll() is None for n in nodes):
        if any(p.parent.name == "checkpoints" for p in runs.rglob("step-000006")):  # renamed: whole
            break
        time.sleep(0.05)
    os.killpg(nodes[1].pid, signal.SIGKILL)  # the second machine dies
    # the survivor waits on its dead peer (gloo's timeout, minutes): stopped as well, at once (a
    # wait of 5 s for it to end by itself ended in this kill every time, 5 s of an idle worker)
    os.killpg(nodes[0].pid, signal.SIGKILL)
    for node in nodes:
        node.communicate()
    assert nodes[1].returncode != 0  # it was killed before the end: the resume below is a real one
    resumed = _nodes(recipe, runs, _free_port())
    for node in resumed:
        out, err = node.communicate(timeout=600)
        assert node.returncode == 0, err[-3000:]
    a, b = only_run(tmp_path / "one"), only_run(runs)  # one run folder
    logged = [json.loads(line) for line in (b / "log.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in logged if "loss" in e]
    # written by one process only: the killed attempt's steps 1..k (k >= 6), then the resumed 7..12
    head, tail = steps[:-6], steps[-6:]
    assert tail == list(range(7, 13)) and head == list(range(1, len(head) + 1)) and len(head) >= 6, steps
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    assert mb["num_processes"] == 2 and ma["train_steps"] == mb["train_steps"] == 12
    assert ma["eval"]["accuracy"] == mb["eval"]["accuracy"]
    assert ma["eval"]["loss"] == pytest.approx(mb["eval"]["loss"], abs=1e-5)
    wa, wb = weights(a), weights(b)
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=1e-4)


def _commands() -> list[str]:
    import argparse

    from toolkit.cli import parser

    (sub,) = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(sub.choices)


@pytest.mark.parametrize("command", _commands())
def test_a_one_process_command_under_a_launch_of_several_is_refused_in_one_line(tmp_path: Path, cli, monkeypatch,
                                                                                 command: str) -> None:
    """Every command of the CLI as one process of a 2-process launch (torchrun's WORLD_SIZE): those
    that split their work over the processes go on; any other is one line, exit 2, nothing
    written (`predict` printed each prediction once per process, exit 0)."""
    from toolkit import sharding

    monkeypatch.setenv("WORLD_SIZE", "2")
    if command in sharding.SHARED_ACROSS_PROCESSES:
        sharding.check_command(command)
        for env in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):  # eval is not sharded: not under their name
            monkeypatch.setenv(env, "true")
            if command == "eval":
                code, out, err = cli("eval", tmp_path / "run")
                assert code == 2 and err.startswith("error: toolkit eval: under STRATEGY=") and len(err.splitlines()) == 1
            else:
                sharding.check_command(command)
            monkeypatch.delenv(env)
        return
    args = {"predict": [tmp_path / "run", "--input", tmp_path / "in.jsonl"], "export": [tmp_path / "run", tmp_path / "out"],
            "cp": ["recipes/demo/sst2/minilm-lora.yaml", tmp_path / "out"], "report": [tmp_path]}.get(command, [])
    code, out, err = cli(command, *args)
    assert code == 2 and err.startswith(f"error: toolkit {command}: runs in one process, and this launch has 2"), err
    assert len(err.strip().splitlines()) == 1 and not out
    assert sorted(tmp_path.iterdir()) == []


# A launch whose process `rank` stops on an error of its own: a full disk as rank 0 alone writes
# metrics.json, or a user error in rank 1's evaluation while rank 0 gathers.
FAILING_LAUNCHER = """import errno, json, os, sys
sys.path.insert(0, {root!r})
from toolkit import evaluation, runs
from toolkit.errors import UserError
rank, failing = os.environ["RANK"], os.environ["FAILING_RANK"]
write_json, evaluate = runs.write_json, evaluation.evaluate

def full_disk(path, *args, **kwargs):
    if rank == failing == "0" and path.name == "metrics.json":
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return write_json(path, *args, **kwargs)

def refused(*args, **kwargs):
    if rank == failing == "1":
        raise UserError("rank 1 refuses")
    return evaluate(*args, **kwargs)

runs.write_json, evaluation.evaluate = full_disk, refused
from toolkit.cli import main
sys.exit(main(json.loads(sys.argv[1])))
"""


@pytest.mark.parametrize("rank, said", [(0, "error: no space left on the device while writing"),
                                        (1, "error: rank 1 refuses")])
def test_an_error_in_one_process_stops_the_launch_in_one_line_per_process(tmp_path: Path, tiny_checkpoint,
                                                                          rank: int, said: str) -> None:
    """Rule: a process of a launch that stops on its own error (one line, exit 2) stops the others
    with one line each, not a traceback: the others' next collective fails on the lost peer
    (gloo's `Connection closed by peer` from a barrier, 40 lines each, the first error buried
    under them), or the launcher stops them first (SIGTERM: its one line, or silent)."""
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"), method="{name: full}"))
    (tmp_path / "launch.py").write_text(FAILING_LAUNCHER.format(root=str(ROOT)))
    args = ["run", str(recipe), "--runs-dir", str(tmp_path / "runs"), "train.batch_size=4", "task.max_train_samples=8"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(_free_port()), str(tmp_path / "launch.py"), json.dumps(args)], cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "FAILING_RANK": str(rank)}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0
    assert "[rank" not in proc.stderr, proc.stderr[-3000:]  # no process's traceback
    # (rank 0's progress bar and rank 1's line share the launch's stderr: a line may follow the bar)
    lines = [line[line.index("error:"):] for line in proc.stderr.splitlines()
             if "error:" in line and "traceback : " not in line]  # not the launcher's report of them
    other = (f"error: process {1 - rank} of 2 stopped with the launch: another of its processes stopped first (its "
             "own `error:` line, or the launcher's report of its exit, says why)")
    # or, where the launcher's SIGTERM reaches the other process before its collective fails (a loaded
    # machine), that process's own one line of the signal
    stopped = "error: SIGTERM: interrupted; nothing more was written"
    assert lines[0].startswith(said) and lines[1:] in ([], [other], [stopped]), proc.stderr[-3000:]
    assert "exitcode  : 2 (pid: " in proc.stderr  # the launcher's report: the first to stop, exit 2
    # whose root cause is a process's own line (TORCHELASTIC_ERROR_FILE), not a link to torch's docs
    causes = [line.split("traceback : ", 1)[1] for line in proc.stderr.splitlines() if "traceback : " in line]
    # (the other process, SIGTERMed inside its run, names what its run kept: `interrupted outside the
    # training steps; ... keeps the checkpoint of step N: ... --resume goes on from there`)
    assert causes and all(c in (said, other, stopped) or c.startswith((said, "Signal ", "error: SIGTERM: interrupted "))
                          for c in causes), causes
    assert "To enable traceback see" not in proc.stderr
    assert not list((tmp_path / "runs").rglob("metrics.json"))
    # what is left: the checkpoint before the full disk (the same command resumes from it), or
    # nothing where the error came before the first checkpoint (rank 0 left the half-made folder)
    left = sorted(p.name for p in (tmp_path / "runs").rglob("*") if p.is_file())
    assert ("recipe.yaml" in left) == (rank == 0) and (left == []) == (rank == 1), left
    assert bool(list((tmp_path / "runs").rglob("step-*"))) == (rank == 0)


@pytest.mark.parametrize("main", [True, False])
def test_the_loop_s_progress_lines_are_said_by_the_main_process_alone(capsys, main: bool) -> None:
    """A skipped non-finite batch and a step with no loss unit are counted by every process (from
    all-reduced values, so all of them stop at the same step) and said by rank 0 alone: a launch
    of 2 processes printed each `step N: non-finite loss; 1 optimizer step ... skipped` and `step N: its
    batch holds no token ...` line twice (2026-11-28, glue with lr 1e30 and MLM on 2 gloo
    processes). The stop past train.skip_nonfinite is every process's error (each stops)."""
    from types import SimpleNamespace

    from toolkit import train
    from toolkit.errors import UserError

    loop = object.__new__(train.Loop)
    loop.acc = SimpleNamespace(is_main_process=main)
    loop.cfg = SimpleNamespace(skip_nonfinite=1, grad_accum=2)
    loop.state = train.State()
    loop._nonfinite(float("nan"), "loss", 2)
    loop._empty(1, 3)
    with pytest.raises(UserError, match="step 4: the loss is not finite"):
        loop._nonfinite(float("nan"), "loss", 4)
    assert (loop.state.skipped_nonfinite, loop.state.empty_steps) == (1, 1)  # the same counts on every rank
    out, err = capsys.readouterr()
    said = [line for line in (out + err).splitlines() if line.startswith("step ")]
    # a skipped step is said in its units: one optimizer step, its grad_accum micro-batches
    assert said == (["step 2: non-finite loss; 1 optimizer step (2 micro-batches) skipped "
                     "(1 of train.skip_nonfinite=1 steps)",
                     "step 3: its batch holds no token the loss is taken on (nothing masked or predicted); "
                     "no update made (1 such step so far)"] if main else [])


@pytest.fixture(scope="module")
def finished_tiny_run(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint) -> Path:
    from toolkit.cli import main

    tmp = tmp_path_factory.mktemp("tiny")
    recipe = write_recipe(tmp / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"), method="{name: full}"))
    assert main(["run", str(recipe), "--runs-dir", str(tmp / "runs"), "train.max_steps=1",
                 "task.max_train_samples=4", "task.max_eval_samples=4"]) == 0
    return only_run(tmp / "runs")


@pytest.mark.parametrize("function", ["export", "report"])
def test_the_api_s_writers_in_a_script_under_a_launch_write_from_rank_0_alone(tmp_path: Path, monkeypatch,
                                                                              finished_tiny_run: Path,
                                                                              function: str) -> None:
    """`toolkit.export` / `toolkit.report` in a script that torchrun starts twice wrote the same
    folder from both processes at once (2 gloo processes: one wrote it, the other failed with a
    bare `OSError: [Errno 39] Directory not empty`). The call is rank 0's; any other rank is
    refused in one line with nothing written, and a script that calls it from rank 0 alone works."""
    import shutil

    import toolkit

    runs_copy = tmp_path / "runs"
    shutil.copytree(finished_tiny_run.parent.parent, runs_copy)
    call = {"export": lambda: toolkit.export(only_run(runs_copy), tmp_path / "out"),
            "report": lambda: toolkit.report([runs_copy])}[function]
    written = {"export": tmp_path / "out", "report": runs_copy / "report.md"}[function]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(toolkit.UserError, match=rf"^toolkit.{function}: writes .* once, and this is process 1 of "
                                                r"a launch of 2 \(RANK=1\); call it from rank 0 alone"):
        call()
    assert not written.exists()
    monkeypatch.setenv("RANK", "0")
    call()
    assert written.exists()


@pytest.mark.parametrize("launch, processes, under", [("ddp", 2, ""), ("fsdp", 1, " under STRATEGY=fsdp")])
def test_a_chain_names_its_upstream_run_finished_under_another_process_count(tmp_path: Path, cli, monkeypatch,
                                                                            tiny_checkpoint, launch: str,
                                                                            processes: int, under: str) -> None:
    """A chained run looks for its upstream run at its own launch's process count and strategy
    (another count is another run: the global batch; FSDP or ZeRO another computation). Pretrained
    in 1 process and fine-tuned under a launch of 2, it said the upstream "has not been run" and
    named the command that would train it again; now the line names the finished run, its process
    count and both ways on, exit 2, nothing written. Under FSDP on 1 process the upstream had the
    plain run's id: the FSDP launch fine-tuned the plain run's model as its own upstream's."""
    pre = write_recipe(tmp_path / "recipes" / "pre.yaml", f"""model: {{checkpoint: {tiny_checkpoint("bert")}}}
task: {{name: glue, subset: mrpc, max_length: 32, max_train_samples: 4, max_eval_samples: 4}}
method: {{name: full}}
train: {{max_steps: 1, batch_size: 4}}
""")
    fine = write_recipe(tmp_path / "recipes" / "fine.yaml", f"""model: {{checkpoint: {{run: {pre}}}}}
task: {{name: glue, subset: mrpc, max_length: 32, max_train_samples: 4, max_eval_samples: 4}}
method: {{name: full}}
train: {{max_steps: 1, batch_size: 4}}
""")
    runs_root = tmp_path / "runs"
    as_launched(monkeypatch, {})
    assert cli("run", pre, "--runs-dir", runs_root)[0] == 0
    (pre_run,) = (runs_root / "pre").iterdir()
    as_launched(monkeypatch, launch_env(launch, processes))
    code, out, err = cli("run", fine, "--runs-dir", runs_root)
    assert code == 2, err
    assert err.startswith(f"error: model.checkpoint: run {pre} has not been run on {processes} process(es){under}, "
                          "the count of this launch") and f"it finished on 1 process(es) ({pre_run})" in err, err
    assert "launch this one as that one was (NPROC=1)" in err and len(err.strip().splitlines()) == 1
    assert f"make run NPROC={processes}{under.replace(' under', '')} RECIPE=" in err, err
    assert not (runs_root / "fine").exists()


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_process_stopped_by_a_signal_leaves_its_line_for_the_launcher_s_report(tmp_path: Path, monkeypatch, capsys,
                                                                                 rank: str) -> None:
    """A process the launcher stops with SIGTERM after another stopped first (the one whose
    collective had not failed yet) exits 143 saying nothing (rank > 0: rank 0 says a signal once),
    and left no error file: the launcher's report of it read `To enable traceback see:
    https://pytorch.org/...` (seen in a loaded suite run). Its line is in the file, said or not."""
    import signal

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from toolkit import cli as cli_module
    from toolkit.errors import Interrupted

    def stopped(command: str) -> None:
        raise Interrupted("interrupted; nothing more was written", signal=signal.SIGTERM)

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(cli_module.sharding, "check_command", stopped)
    code = cli_module.main(["ls", "recipes"])
    err = capsys.readouterr().err
    line = "error: SIGTERM: interrupted; nothing more was written"
    assert code == 143 and err == (line + "\n" if rank == "0" else "")
    report = ChildFailedError("toolkit.cli", {0: ProcessFailure(0, 1, 143, str(error_file))}).format_msg()
    (cause,) = [text.split("traceback : ", 1)[1] for text in report.splitlines() if "traceback : " in text]
    assert cause == line, report


@pytest.mark.parametrize("argv, rank, said", [
    (["run", "no/such/recipe"], "0", True),
    (["run", "--no-such-option"], "1", False),  # the command line: said by rank 0 alone, in every file
    (["ls", "recipes"], "0", None),  # done (one process): no file
])
def test_a_failed_process_leaves_its_line_for_the_launcher_s_report(tmp_path: Path, monkeypatch, capsys,
                                                                     argv: list, rank: str, said: bool | None) -> None:
    """Under torch elastic (a bare `accelerate launch`, `torchrun`) the launcher's report of a
    failed process said `traceback : To enable traceback see: https://pytorch.org/docs/...` under
    the process's own `error:` line; the process now leaves that line in the error file elastic
    names (TORCHELASTIC_ERROR_FILE), and the report gives it as the root cause."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from toolkit.cli import main

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("WORLD_SIZE", "1" if said is None else "2")
    monkeypatch.setenv("RANK", rank)
    code = main(argv)
    err = capsys.readouterr().err
    if said is None:
        assert code == 0 and not error_file.exists()
        return
    assert code == 2 and bool(err) == said
    report = ChildFailedError("toolkit.cli", {0: ProcessFailure(0, 1, 2, str(error_file))}).format_msg()
    (cause,) = [line.split("traceback : ", 1)[1] for line in report.splitlines() if "traceback : " in line]
    assert cause.startswith("error: toolkit") or cause.startswith("error: recipe"), report
    assert err in ("", cause + "\n")


def _followed(command: str, monkeypatch) -> tuple[list[str], Path]:
    """What a named command runs, and the run folder it runs, as its launch sees it: `make run
    NPROC=N [STRATEGY=S] RECIPE=R ARGS=A` a launch of N with S's config (the Makefile's), else one
    process."""
    import shlex

    from toolkit import api, runs

    words = shlex.split(command)
    if words[:2] == ["make", "run"]:
        given = dict(word.split("=", 1) for word in words[2:])
        as_launched(monkeypatch, launch_env(given.get("STRATEGY", "ddp"), int(given["NPROC"])))
        recipe, rest = given["RECIPE"], shlex.split(given["ARGS"])
    else:
        assert words[:2] == ["toolkit", "run"], command
        as_launched(monkeypatch, {})
        recipe, rest = words[2], words[3:]
    root = rest[rest.index("--runs-dir") + 1]
    overrides = [w for w in rest if "=" in w and not w.startswith("-")]
    return rest, runs.run_dir(api._checked(recipe, overrides, "--smoke" in rest).recipe, runs.runs_root(root))


@pytest.mark.parametrize("launch, processes", [("one", 1), ("ddp", 2), ("fsdp", 1), ("zero3", 2)])
@pytest.mark.parametrize("kept", [True, False])
def test_an_interrupted_launch_names_the_command_that_goes_on_with_its_own_run(tmp_path: Path, cli, monkeypatch,
                                                                             launch: str, processes: int,
                                                                             kept: bool) -> None:
    """Ctrl-C or SIGTERM to `make run NPROC=2` said `... keeps the checkpoint of step 20: \\`toolkit
    run R --runs-dir D --resume\\` goes on from there`: in one process that is another run (a run id
    counts the processes and a sharded strategy), refused ('--resume: ... was never started'), and
    without --resume it trained that other run from step 0. The command named (to resume, or to
    start again where nothing was kept) is this launch's, and runs this very folder."""
    from toolkit import api, runs, train

    as_launched(monkeypatch, launch_env(launch, processes))
    own = runs.run_dir(api._checked("demo/sst2/minilm-lora", ["train.lr=1e-3"], True).recipe, tmp_path / "runs")

    def stopped(plan, out, **kwargs):
        if kept:
            (out / "checkpoints" / "step-000002").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "run", stopped)
    code, _, err = cli("run", "demo/sst2/minilm-lora", "--smoke", "--runs-dir", tmp_path / "runs", "train.lr=1e-3")
    assert code == 130, err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    said = "keeps the checkpoint of step 2: `" if kept else "before any checkpoint: nothing was kept; `"
    assert said in line, line
    command = line.split(said, 1)[1].split("`", 1)[0]
    if launch != "one":
        assert command.startswith(f"make run NPROC={processes} "), command
    rest, folder = _followed(command, monkeypatch)
    assert ("--resume" in rest) == kept and "train.lr=1e-3" in rest and "--smoke" in rest
    assert folder == own and own.exists() == kept  # nothing kept: the folder this launch made is gone


@pytest.mark.parametrize("ended, code", [
    ("signal INT", 130), ("signal TERM", 143), ("finished", 0),
    ("failed 2", 2), ("failed -9", 1), ("failed 1,143", 1),
    # process 1's user error (or its kill), process 0 stopped by the launcher's SIGTERM after it
    ("failed 143,2", 2), ("failed -15,2", 2), ("failed 143,-9", 1),
    ("failed 143,143", 143),  # SIGTERM to the processes themselves
    # a process killed (or failed) while the other, its collective losing it, stopped with the
    # launch (exit 3): the launch's code is the kill's 1 (it was that one's 2), or the error's 2
    ("failed -9,3", 1), ("failed 3,-9", 1), ("failed 3,2", 2), ("failed 3,3", 1), ("failed 143,3", 1),
])
def test_make_run_nproc_2_ends_with_its_processes_exit_code(monkeypatch, capsys, ended: str, code: int) -> None:
    """`make run NPROC=2` (toolkit.launch) ends as its processes end: a user error's 2, a process
    killed by a signal 1 (as torchrun), success 0; Ctrl-C or SIGTERM to the launch 128 + the signal
    (the processes stopped, rank 0 said its one line): it was torch elastic's `SignalException`
    traceback (25 lines after that line) and exit 1. The code is the failed process's, not that of
    one the launcher stopped after it: a user error in process 1 alone ended the launch with 143
    where process 0 took the launcher's SIGTERM inside its run (the first positive code by rank)."""
    import logging
    import signal

    from accelerate.commands import launch as accelerate_launch
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from toolkit import launch

    def launched(args) -> None:
        kind, _, value = ended.partition(" ")
        if kind == "signal":
            raise SignalException("got signal", sigval=signal.Signals[f"SIG{value}"])
        if kind == "failed":
            raise ChildFailedError("toolkit.cli", {rank: ProcessFailure(rank, 1, int(c), "")
                                                   for rank, c in enumerate(value.split(","))})

    monkeypatch.setattr(accelerate_launch, "launch_command", launched)
    argv = ["--config_file", str(ROOT / "configs" / "accelerate" / "ddp.yaml"), "--num_processes", "2", "-m",
            "toolkit.cli", "run", "demo/sst2/minilm-lora"]
    for name in launch.LAUNCHER_LOGGERS:  # (main quiets them for the launcher's process)
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    assert launch.main(argv) == code
    # a process killed by a signal (not the launcher's SIGTERM) is named in one line: torch elastic's
    # lines (`failed (exitcode: -9) local_rank: 1 ...`) are not shown, and it said nothing itself
    codes = [int(c) for c in ended.partition(" ")[2].split(",")] if ended.startswith("failed") else []
    said = [f"error: process {rank} of the launch was killed by SIGKILL (what the out-of-memory killer sends), "
            "and the launch stopped with it" for rank, c in enumerate(codes) if c == -9]
    assert capsys.readouterr().err.splitlines() == said
    assert not logging.getLogger(launch.LAUNCHER_LOGGERS[0]).isEnabledFor(logging.ERROR)


@pytest.mark.parametrize("where", ["in the run", "outside it"])
def test_a_process_stopped_because_a_peer_stopped_exits_with_its_own_code(tmp_path: Path, cli, monkeypatch,
                                                                          where: str) -> None:
    """A process whose collective lost its peer said `stopped with the launch` and exited 2, a
    user error's code: beside a process killed by SIGKILL (which says nothing) the launch ended
    with 2. It exits errors.STOPPED_WITH_THE_LAUNCH, which toolkit.launch passes over."""
    from toolkit import cli as command, train
    from toolkit.errors import STOPPED_WITH_THE_LAUNCH

    as_launched(monkeypatch, launch_env("ddp", 2))

    def lost(*args, **kwargs):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")

    monkeypatch.setattr(*(train, "run") if where == "in the run" else (command, "run_one"), lost)
    code, _, err = cli("run", "demo/sst2/minilm-lora", "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == STOPPED_WITH_THE_LAUNCH == 3, err
    assert err.splitlines()[-1].startswith("error: process 0 of 2 stopped with the launch: "), err


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_process_stopped_under_a_launch_removes_no_folder_it_did_not_make(tmp_path: Path, cli, monkeypatch,
                                                                             rank: str) -> None:
    """A second launch of a run another launch is training, before that one's first checkpoint:
    its rank 0 stops on the run's lock (one line, exit 2), and the launcher stops the others with
    SIGTERM. Rank 1, which holds no lock (rank 0 holds them for the launch), took the folder for one
    this launch had made and removed it whole on the signal, `shutil.rmtree` under the training
    launch. Only rank 0 removes a run folder, and only one its launch made."""
    from toolkit import api, runs, train

    as_launched(monkeypatch, {**launch_env("ddp", 2), "RANK": rank, "LOCAL_RANK": rank})
    out = runs.run_dir(api._checked("demo/sst2/minilm-lora", [], True).recipe, tmp_path / "runs")
    out.mkdir(parents=True)
    (out / "log.jsonl").write_text('{"step": 1, "loss": 0.7}\n')  # the other launch's, training

    def stopped(plan, folder, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "run", stopped)
    code, _, err = cli("run", "demo/sst2/minilm-lora", "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 130, err
    assert (out / "log.jsonl").read_text() == '{"step": 1, "loss": 0.7}\n'


@pytest.mark.parametrize("launch, processes", [("ddp", 2), ("fsdp", 1)])
def test_a_chain_under_a_launch_names_the_launch_that_makes_its_upstream_again(tmp_path: Path, monkeypatch,
                                                                              launch: str, processes: int) -> None:
    """A chained run whose upstream of this launch finished but lost its model/ said `run that run
    again: toolkit run ... --force`: a 1-process run, another run than the launch's upstream, and
    the line came back however often it was followed. It names the launch's command, which makes
    this very upstream folder again."""
    import json

    from toolkit import chain, recipe as recipes, runs
    from toolkit.errors import UserError

    as_launched(monkeypatch, launch_env(launch, processes))
    root = tmp_path / "runs"
    plan = recipes.plan(recipes.find_recipe("demo/sst2/minilm-full-from-wikitext"))
    upstream = runs.run_dir(plan.upstream.recipe, root)
    upstream.mkdir(parents=True)
    (upstream / "metrics.json").write_text(json.dumps({"eval": {}}))
    with pytest.raises(UserError) as said:
        chain.resolve(plan, root)
    command = str(said.value).split("run that run again: ", 1)[1]
    rest, folder = _followed(command, monkeypatch)
    assert folder == upstream and rest[-1] == "--force", command
