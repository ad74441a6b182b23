"""No host read in a training step that does not log (issue 35, part 3).

A read of a device tensor to the host (`.item()`, `.tolist()`, `bool(t)`, `float(t)`, `int(t)`,
`.cpu()`, `.numpy()`, `.to("cpu")`) makes the host wait for the GPU: a step with none of them lets
the GPU run ahead and CUDA graphs replay back to back. On the CPU every tensor is on the host, so
the test counts the calls themselves (each would be a device-to-host copy on a GPU) with a
TorchFunctionMode around every `Loop.step` and every `Loop._after_step`.

Two reads are not the loop's and are left out, each for a reason that holds on a GPU:
- toolkit/dropout.py runs on a CPU only (train.fast_dropout; on a GPU torch's dropout runs), so
  the recipe turns it off;
- transformers' eager attention-mask builder asks whether the mask is all ones
  (`masking_utils._ignore_*_mask_sdpa`), one read per forward; under `train.compile` (on CUDA by
  default) it is skipped while tracing, so the compiled step has none.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from conftest import write_recipe

READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy"}

RECIPE = """model: {{checkpoint: {checkpoint}}}
task: {{name: glue, subset: sst2, max_length: 32, max_train_samples: 40, max_eval_samples: 8}}
method: {method}
train: {{max_steps: 8, lr: 1.0e-3, batch_size: 2, log_every: 4, seed: 3, max_grad_norm: 1.0, fast_dropout: false}}
"""


class HostReads(TorchFunctionMode):
    """Counts the torch calls that bring a tensor's value to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS or (name == "to" and self._to_host(args, kwargs)):
            caller = sys._getframe(1).f_code.co_filename
            if not caller.endswith(os.path.join("transformers", "masking_utils.py")):
                self.reads.append(f"{name} ({caller.rsplit(os.sep, 2)[-1]}:{sys._getframe(1).f_lineno})")
        return func(*args, **kwargs)

    @staticmethod
    def _to_host(args: tuple, kwargs: dict) -> bool:
        """`t.to("cpu")` of a tensor that is elsewhere (always False on a CPU: nothing moves)."""
        tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
        targets = list(args[1:]) + [kwargs.get("device")]
        return tensor is not None and tensor.device.type != "cpu" and any(
            str(t) == "cpu" or (isinstance(t, torch.device) and t.type == "cpu") for t in targets)


@pytest.mark.parametrize("method, compiled_optimizer", [("{name: full}", False), ("{name: lora, r: 4}", False),
                                                       ("{name: adapters}", False), ("{name: full}", True)])
def test_a_step_that_does_not_log_reads_nothing_to_the_host(tmp_path: Path, cli, monkeypatch, tiny_checkpoint,
                                                           method: str, compiled_optimizer: bool) -> None:
    """With train.compile_optimizer the compiled function itself is compiled with fullgraph=True,
    where a host read is a graph break and so an error: the count runs around it (the counting mode
    paused inside), over the Python that feeds it (the learning rate's write, the lists)."""
    from toolkit import compiling, train

    per_step: dict[int, list[str]] = {}
    overrides, calls = [], []
    if compiled_optimizer:
        compile_step = compiling.compile_step

        def uncounted(fn, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
            compiled = compile_step(fn, *args, **kwargs)

            def call(*inputs):  # noqa: ANN002
                calls.append(len(inputs))
                with torch._C.DisableTorchFunction():
                    return compiled(*inputs)
            return call

        monkeypatch.setattr(compiling, "BACKEND", "aot_eager")
        monkeypatch.setattr(compiling, "compile_step", uncounted)
        overrides = ["train.compile_optimizer=true", "train.compile=false"]

    def counted(original):
        def wrapper(self, *args, **kwargs):
            with HostReads() as mode:
                result = original(self, *args, **kwargs)
            per_step.setdefault(self.state.step, []).extend(mode.reads)
            return result
        return wrapper

    monkeypatch.setattr(train.Loop, "step", counted(train.Loop.step))
    monkeypatch.setattr(train.Loop, "_after_step", counted(train.Loop._after_step))
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"), method=method))
    code, _, err = cli("run", recipe, *overrides, "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    assert sorted(per_step) == list(range(1, 9))
    assert len(calls) == 8 * compiled_optimizer  # every step through the compiled function
    logging = {1, 4, 8}  # step 1, every log_every, and the last (evaluation and checkpoint)
    quiet = {step: reads for step, reads in per_step.items() if step not in logging}
    assert quiet == {step: [] for step in quiet}
    assert all(per_step[step] for step in (1, 4)), per_step  # the counter sees the log steps' reads


def test_a_nonfinite_step_is_skipped_on_the_device_and_named_at_the_next_read(tmp_path: Path, cli,
                                                                           monkeypatch) -> None:
    """Steps skipped on the device leave the weights finite; past train.skip_nonfinite the run
    stops naming the step at which it went past, and no metrics.json is written. The compiled
    optimizer step (train.compile_optimizer) skips and names the same steps."""
    from toolkit import compiling

    monkeypatch.setattr(compiling, "BACKEND", "aot_eager")
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased", method="{name: full}"))
    named = []
    for setting in ("false", "true"):
        code, out, err = cli("run", recipe, "--smoke", "train.lr=1.0e+12", "train.max_grad_norm=null",
                             "train.skip_nonfinite=1", f"train.compile_optimizer={setting}", "train.compile=false",
                             "--runs-dir", tmp_path / setting)
        stop = re.search(r"error: step (\d+): the loss is not finite \(nan\)", err)
        skipped = re.search(r"step (\d+): non-finite loss; 1 optimizer step \(1 micro-batch\) skipped "
                            r"\(1 of train.skip_nonfinite=1 steps\)", out + err)
        assert code == 2 and stop and skipped, (out, err)
        assert int(skipped.group(1)) < int(stop.group(1))  # read at the end of the run, named as it happened
        assert not list((tmp_path / setting).rglob("metrics.json"))
        named.append((skipped.group(1), stop.group(1)))
    assert named[0] == named[1]


def test_the_tally_names_the_step_past_the_limit() -> None:
    from toolkit.tally import Tally

    tally = Tally(torch.device("cpu"))
    nan, one = torch.tensor(float("nan")), torch.tensor(1.0)
    for step, loss in enumerate([one, nan, one, nan, nan], start=1):
        ok = torch.isfinite(loss)
        tally.add(step, loss, one, torch.tensor(4.0), ok, allowed=1)
    r = tally.read()
    # every step's examples count toward the rate (its time does): skipped ones too
    assert (r.samples, r.skipped, r.over_step, r.over_norm) == (20, 3, 4, False)
    assert tally.read().skipped == 0  # the sums restart after a read


@pytest.mark.parametrize("method", ["{name: full}", "{name: lora, r: 4}", "{name: adalora, init_r: 4, target_r: 2}"])
def test_torch_called_directly_steps_exactly_as_accelerates_wrappers(tmp_path: Path, cli, monkeypatch,
                                                                     tiny_checkpoint, method: str) -> None:
    """One process without a loss scaler, the loop calls torch's optimizer, `zero_grad`,
    `clip_grad_norm_` and `backward` itself (`Loop._plain_steps`: less host time per step); the
    run is bit for bit the one accelerate's wrappers give: the logged losses and gradient norms
    and the trained weights. Two micro-batches a step; AdaLoRA adds its `extra_loss` and takes
    the host-checked step."""
    from safetensors.torch import load_file

    from toolkit import train

    taken: list[bool] = []
    plain_steps = train.Loop._plain_steps

    def recorded(self, accelerator):  # noqa: ANN001
        plain_steps(self, accelerator)
        taken.append(self.plain)

    def wrapped(self, accelerator):  # noqa: ANN001 - accelerate's path, as under FSDP or DeepSpeed
        plain_steps(self, accelerator)
        self.plain, self.stepper = False, self.optimizer

    text = RECIPE.format(checkpoint=tiny_checkpoint("bert"), method=method).replace(
        "max_steps: 8", "max_steps: 4, grad_accum: 2").replace("log_every: 4", "log_every: 1")
    recipe = write_recipe(tmp_path / "r.yaml", text)
    results = []
    for name, patch in (("direct", recorded), ("wrapped", wrapped)):
        monkeypatch.setattr(train.Loop, "_plain_steps", patch)
        code, _, err = cli("run", recipe, "--runs-dir", tmp_path / name)
        assert code == 0, err
        (log,) = (tmp_path / name).rglob("log.jsonl")
        entries = [json.loads(line) for line in log.read_text().splitlines()]
        (model,) = (tmp_path / name).rglob("model")
        tensors = {k: v for f in sorted(model.glob("*.safetensors")) for k, v in load_file(f).items()}
        results.append(([(e["loss"], e["grad_norm"]) for e in entries if "loss" in e], tensors))
    assert taken == [True]
    (direct_log, direct), (wrapped_log, wrapped_weights) = results
    assert len(direct_log) == 4 and direct_log == wrapped_log
    assert direct.keys() == wrapped_weights.keys()
    assert all(torch.equal(direct[k], wrapped_weights[k]) for k in direct)


def test_the_wait_at_a_read_is_training_time(tmp_path: Path, cli, monkeypatch, tiny_checkpoint) -> None:
    """A step does no host read, so on a GPU the host queues steps ahead of the device and the
    read at a log, evaluation or save step waits for them to finish: that wait is the steps' time.
    It was counted nowhere (train_runtime_s stopped before it, the log's rate was read after it,
    an evaluation was timed from after it), so on a GPU-bound run samples/s was the host's speed
    of queueing steps. On the CPU nothing runs ahead; a read that takes 0.25 s stands in for the
    wait: every one is in train_runtime_s, and in the log's rate at its step."""
    import time

    from toolkit.tally import Tally

    read, waits = Tally.read, []

    def waiting(self):  # noqa: ANN001 - the device finishing the queued steps
        time.sleep(0.25)
        waits.append(1)
        return read(self)

    monkeypatch.setattr(Tally, "read", waiting)
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"), method="{name: full}"))
    code, _, err = cli("run", recipe, "train.max_steps=4", "train.log_every=2", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    run = next((tmp_path / "runs").rglob("metrics.json")).parent
    metrics = json.loads((run / "metrics.json").read_text())
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert len(waits) == 3  # steps 1, 2 and 4 log
    assert metrics["train_runtime_s"] >= 0.25 * len(waits)
    last = [e for e in log if e.get("step") == 4 and "loss" in e][0]
    assert 2 * 4 / last["samples_per_second"] >= 0.25 * len(waits)  # the clock the rate was read off
