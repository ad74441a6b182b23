"""THE training loop. Nothing else in the toolkit steps an optimizer.

accelerate owns devices, processes and mixed precision. The loop owns what accelerate leaves to
its user and what the example scripts get subtly wrong:
- loss normalisation: each optimizer step divides the summed loss of its k micro-batches by the
  number of loss units (examples, or tokens) in all k of them, across all processes, so k
  micro-batches on N processes equal one k*N-times-larger batch exactly;
- exact resume: batches come from a per-epoch permutation seeded by (seed, epoch), checkpoints
  hold model, optimizer, scheduler, RNG states and the data position, so a resumed run takes the
  same steps an uninterrupted one takes.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from toolkit import (attention, chain, checkpoints, compiling, dropout, evaluation, models, optimizer_step, precision,
                     run_metrics, runs, sharding, tracking)
from toolkit.batching import EpochBatches, LengthOrder, eval_batch_size, eval_loaders, fit_inputs, train_loaders
from toolkit.checkpoints import MethodState, State
from toolkit.devices import check_strategy, peak_memory_mb, proc_status_mb, reset_peak_memory
from toolkit.errors import Interrupted, UserError
from toolkit.recipe import Recipe, RunPlan, dump
from toolkit.setup import Setup, build, seed_process
from toolkit.tally import Reading, Tally, clear_skip, skip_unless

# Names that tests and earlier callers reach here; they live in the modules above.
_peak_memory_mb, _proc_status_mb = peak_memory_mb, proc_status_mb
__all__ = ["EpochBatches", "LengthOrder", "Setup", "State", "build", "eval_batch_size", "eval_loaders",
           "improves", "reset_peak_memory", "run"]


def _optimizer(model: torch.nn.Module, recipe: Recipe, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel for all parameters, no temporary copies: what Trainer defaults to);
    weight decay where the method says it applies (`Method.decays`: not on biases and norms, nor
    on IA3's scales) and the attention module does (`attention.undecayed`: not on bilinear's W,
    which starts at the identity). With
    train.precision_mode: bf16_master the model is cast to bf16 on `device` here and the optimizer
    steps fp32 masters of its parameters (toolkit/precision.py)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # build() refused none
    kept = attention.undecayed(model)
    decays = [recipe.method.decays(n, p) and id(p) not in kept for n, p in named]
    groups = [{"params": [p for (_, p), d in zip(named, decays) if d], "weight_decay": recipe.train.weight_decay},
              {"params": [p for (_, p), d in zip(named, decays) if not d], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]  # ZeRO-3 drops an empty group, and the schedule's lrs with it
    if recipe.train.precision_mode == "bf16_master":
        return precision.bf16_master(model, groups, recipe.train.lr, device)
    return torch.optim.AdamW(groups, lr=recipe.train.lr, fused=True)




def run(plan: RunPlan, out: Path, resume: bool = False, stop_after: int | None = None) -> dict | None:
    """Build, train, evaluate and save one planned recipe into `out` (a chained one resolved:
    chain.resolve); returns metrics (None if stopped)."""
    from accelerate.state import AcceleratorState

    recipe = plan.recipe
    precision.check_device(recipe.train.mixed_precision)
    if not torch.cuda.is_available():
        sharding.check_cpu_launch()
    precision.check_strategy(recipe.train.precision_mode, sharding.asked())
    sharding.check_deepspeed_file(recipe.train)  # before the Accelerator: accelerate's ValueError was a traceback
    sharding.import_deepspeed_if_asked()  # before the Accelerator imports it: what its import sets is put back
    optimizer_step.check_strategy(compiling.optimizer_wanted(recipe.train.compile_optimizer), sharding.asked())
    sharding.restore_launch_kind()  # several runs in one process: each starts from the launch's state
    AcceleratorState._reset_state()  # several runs in one process may differ in mixed precision
    # step_scheduler_with_optimizer=False: accelerate would otherwise step the schedule once per
    # process per optimizer step; total_steps here already counts optimizer steps of the global batch.
    accelerator = Accelerator(mixed_precision=recipe.train.mixed_precision, cpu=not torch.cuda.is_available(),
                              step_scheduler_with_optimizer=False, log_with=recipe.train.report_to or None,
                              project_dir=tracking.project_dir(out),
                              # from pinned memory (batching.train_loaders): the copy to a GPU does
                              # not make the host wait for the step before it
                              dataloader_config=DataLoaderConfiguration(non_blocking=torch.cuda.is_available()))
    sharding.enable(accelerator, recipe)  # FSDP on CPU processes, which accelerate leaves off
    sharding.end_group_at_exit()
    check_strategy(accelerator.distributed_type.value)
    reset_peak_memory(accelerator.device)  # a sweep runs many recipes in one process
    identity = checkpoints.identity(recipe, accelerator.num_processes)  # as hashed: before build fills it in
    setup = build(plan, accelerator.num_processes)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        runs.write_whole(out / "recipe.yaml", dump(recipe))  # whole or the old one: a kill mid-write cut it
        runs.write_json(out / checkpoints.IDENTITY, identity)
    accelerator.wait_for_everyone()
    if not recipe.method.trains:
        tracking.start(accelerator, recipe.name, recipe.to_dict())
        return finish(recipe, setup, accelerator, out, State(), evaluate_only=True)
    return Loop(recipe, setup, accelerator, out).train(resume, stop_after)




class Loop:
    """One run's training: steps, evaluations and checkpoints (batching, checkpoint I/O and the
    run's metrics live in their own modules)."""

    def __init__(self, recipe: Recipe, setup: Setup, accelerator: Accelerator, out: Path) -> None:
        self.recipe, self.setup, self.acc, self.out = recipe, setup, accelerator, out
        self.cfg, self.method = recipe.train, recipe.method
        self.compiled = self._compiles(accelerator.device)
        train_loader, self.sampler, evals, self.eval_orders = train_loaders(recipe, setup, accelerator.num_processes,
                                                                            self.compiled)
        if self.cfg.fast_dropout and not self.compiled:  # compiled, dropout fuses into the graph
            dropout.install(setup.model, accelerator.device)  # before prepare: DDP wraps the same modules
        optimizer = _optimizer(setup.model, recipe, accelerator.device)
        self.steps_per_epoch, self.total_steps = self.cfg.optimizer_steps(len(setup.train), accelerator.num_processes)
        warmup = self.cfg.warmup(self.total_steps)
        from transformers import get_linear_schedule_with_warmup

        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, self.total_steps)
        prepared = sharding.prepare(accelerator, setup.model, optimizer, train_loader, scheduler)
        accelerator.register_save_state_pre_hook(checkpoints.lean_weights)
        self.model, self.optimizer, self.loader, self.scheduler = prepared[:4]
        self._plain_steps(accelerator)
        self.unwrapped = accelerator.unwrap_model(self.model)  # what the method's hooks see
        if self.method.stateful:  # its own state travels with every checkpoint
            accelerator.register_for_checkpointing(MethodState(self.method, self.unwrapped))
        self.evals = evals  # unprepared: `evaluation.own_batches` shares them out
        self.state = State()
        self.step_lr = 0.0  # the learning rate the latest optimizer step took (set before the schedule moves)
        self.evaluated = False  # in this process: a resumed run's last evaluation may be on disk only
        self.tally = Tally(accelerator.device)
        # fp16's loss scaler decides on the host; a method's after_step must not see a skipped step
        self.host_checked = accelerator.scaler is not None or self.method.steps_on_host
        self.opt_step = self._compiled_optimizer(accelerator.device)
        self.forward_loss = self._forward_loss
        if self.compiled:  # a wrapper: evaluation calls self.model, which stays eager
            self.forward_loss = compiling.compile_step(self._forward_loss, accelerator.device)
        self.metric = setup.task.declaration(self.cfg.metric or setup.task.main_metric())
        self.pad_id = setup.tokenizer.pad_token_id if setup.tokenizer.pad_token_id is not None else 0
        seed_process(self.cfg.seed, accelerator.process_index)  # built alike; each process its own masks

    def _compiles(self, device: torch.device) -> bool:
        """train.compile resolved here; a method left eager says so in one line."""
        if not compiling.wanted(self.cfg.compile, device):
            return False
        steps = self.cfg.optimizer_steps(len(self.setup.train), self.acc.num_processes)[1]
        short = compiling.too_short(self.cfg.compile, steps * self.cfg.grad_accum)
        if short:
            self._say(short)
            return False
        reason = (compiling.eager_reason(self.method.name, self.recipe.model.attention)
                  or compiling.strategy_reason(self.acc.state.deepspeed_plugin))
        if reason:
            self._say(f"train.compile: the step runs eager: {reason}")
        return reason is None

    def _compiled_optimizer(self, device: torch.device) -> optimizer_step.CompiledStep | None:
        """train.compile_optimizer resolved: clipping and the AdamW update as one compiled function
        (toolkit/optimizer_step.py), None where they run eager. fp16 and a method's after_step are
        refused with the recipe, FSDP and DeepSpeed at launch (`optimizer_step.check_strategy`)."""
        if not compiling.optimizer_wanted(self.cfg.compile_optimizer):
            return None
        if not self.plain or self.host_checked:  # what the checks above leave: accelerate steps it
            raise UserError(f"train.compile_optimizer: true needs the loop to step torch's optimizer itself "
                            f"(one process or DDP, no loss scaler; here {self.acc.distributed_type.value}); "
                            "set train.compile_optimizer: false")
        return optimizer_step.CompiledStep(
            self.stepper, self.cfg.max_grad_norm,
            lambda fn: compiling.compile_step(fn, device, fullgraph=True, dynamic=False, size_asserts=False))

    def _plain_steps(self, accelerator: Accelerator) -> None:
        """Where accelerate's optimizer and clipping wrappers only pass through (one process or
        DDP, no fp16 loss scaler), the step calls torch directly: the wrappers' per-step work
        (a package look-up on the file system in every `optimizer.step`, a signature inspection
        in every `zero_grad`, a walk over the parameters for DTensors in every clip, a division
        by 1 and its backward in every `backward`) was host time a GPU waited on (issue 35).
        FSDP, DeepSpeed, XLA and fp16 keep accelerate's path, which does real work there.
        `self.trainable` is listed once: no method changes which parameters train once the run
        has begun (a frozen parameter has no gradient for the clip to see anyway)."""
        from accelerate.utils import DistributedType

        plain = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
        self.plain = (accelerator.distributed_type in plain and accelerator.scaler is None
                      and accelerator.gradient_accumulation_steps == 1)  # the loop accumulates, not accelerate
        self.stepper = self.optimizer.optimizer if self.plain else self.optimizer  # AcceleratedOptimizer's
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]

    def _forward_loss(self, batch: dict) -> torch.Tensor:
        """The summed loss of one micro-batch (the part `train.compile` compiles)."""
        task = self.setup.task
        return task.loss(self.model(**task.model_inputs(batch)), batch).sum()

    # --- checkpoints -------------------------------------------------------------------------
    def save(self, stop: bool = False) -> None:
        self._read()  # never a checkpoint past a non-finite step the limit refuses
        keep = self.state.best_step if self.cfg.keep_best else None
        checkpoints.save(self.acc, self.out, self.state, self.cfg.save_total_limit, keep, stop=stop)

    def restore(self) -> None:
        self.state = checkpoints.restore(self.acc, self.out, self.total_steps, check=self._check_resume)

    def _base(self) -> str:
        """The folder the run's base is read from: a smoke run's small model, found in the cache
        where setup built it (the same key), else the checkpoint as models.load got it."""
        rebuilt = chain.rebuilt_base(self.recipe)
        return models.smoke_checkpoint(self.setup.source) if rebuilt else self.setup.source

    def _check_resume(self, state: State) -> None:
        """A lean checkpoint resumes on the base it trained on, or not at all; and on its data."""
        checkpoints.check_base(state.base, self._base(), state, smoke=chain.rebuilt_base(self.recipe))
        checkpoints.check_hub_data(state.hub_data, self.setup.task, state.step)

    def _keep_if_best(self, metrics: dict) -> None:
        """The best weights are the step checkpoint `save` writes right after this evaluation
        (kept from pruning): no second copy of the parameters, in memory or on disk."""
        if self.metric.name not in metrics:  # the data decides some (SQuAD v2's HasAns_*/NoAns_*)
            given = ", ".join(sorted(k for k, v in metrics.items() if isinstance(v, (int, float)) and k != "step"))
            raise UserError(f"train.metric: '{self.metric.name}' is not among what this evaluation gives "
                            f"({given}); choose one of those")
        # a tie is broken by the eval loss of the metric's own split (MNLI's accuracy_mm: loss_mm)
        split = max((s for s in self.setup.task.suffixes() if s and self.metric.name.endswith(s)), key=len, default="")
        value, loss = metrics[self.metric.name], metrics.get("loss" + split)
        if improves(self.metric, value, loss, self.state.best_metric, self.state.best_loss):
            self.state.best_metric, self.state.best_step, self.state.bad_evals = value, self.state.step, 0
            self.state.best_loss = loss
        else:
            self.state.bad_evals += 1

    # --- the loop ----------------------------------------------------------------------------
    def train(self, resume: bool, stop_after: int | None) -> dict | None:
        checkpoints.clear_partial(self.acc, self.out)  # what a kill left, settled before it is looked for
        if resume or runs.checkpoints(self.out):  # a whole checkpoint settled just now is gone on from too
            self.restore()
        if self.state.step == 0:  # what a killed attempt wrote before its first checkpoint is not this run's
            checkpoints.start(self.acc, self.out)
            self.state.base = checkpoints.base_files(self._base(), self.unwrapped)  # a smoke run's small model too
            self.state.hub_data = self.setup.task.hub_data()
            self.state.run_loss = [0.0, 0]
            if self.acc.is_main_process:  # the base as the run starts on it (metrics.json base_weights)
                self.state.start_weights = run_metrics.start_weights(self.recipe, self.setup)
        tracking.start(self.acc, self.recipe.name, self.recipe.to_dict(), self.state.step)  # where it goes on from
        self.model.train()
        bar = tqdm(total=self.total_steps, initial=self.state.step, disable=not self.acc.is_main_process,
                   desc=self.recipe.name, dynamic_ncols=True,
                   mininterval=0.5 if sys.stderr.isatty() else 30.0)
        # a run resumed after early stopping fired stays stopped, and one at or past --stop-after N
        # is not trained further (it took one more step each time: N, N+1, N+2 ...)
        stop = self._stopping(stop_after)
        try:
            while self.state.step < self.total_steps and not stop:
                stop = self._epoch(bar, stop_after)
        except KeyboardInterrupt:  # Ctrl-C: the caller says where it stopped and how to resume
            raise Interrupted(step=self.state.step, total=self.total_steps) from None
        finally:  # whatever stops the loop: its line starts on a line of its own, not after the bar
            bar.close()
        self._read()
        # early stopping that fired at step --stop-after N finished the run: it is finished, not
        # stopped (it was left unfinished, exit 0, no metrics.json, though nothing was left to train)
        if (stop_after and stop_after <= self.state.step < self.total_steps and not self._stopped_early()):
            if runs.last_step(self.out) != self.state.step:  # not twice: the second removes the first
                self.save(stop=True)  # a simulated interruption: checkpoint and leave the run unfinished
            return None
        if self.state.last_eval is None or self.state.last_eval.get("step") != self.state.step:
            self._eval_and_save()
        elif not self.evaluated:
            self._evaluate_again()
        return finish(self.recipe, self.setup, self.acc, self.out, self.state, model=self.model,
                       evals=self.evals, orders=self.eval_orders, epoch=self._epochs_done())

    def _epoch(self, bar: tqdm, stop_after: int | None) -> bool:
        """The rest of the current epoch; True when training should stop before its end."""
        self.sampler.use_epoch(self.state.epoch)
        getattr(self.loader.collate_fn, "use_epoch", lambda epoch: None)(self.state.epoch)  # fresh masks
        skip = self.state.batch_in_epoch
        batches = iter(self.acc.skip_first_batches(self.loader, skip) if skip else self.loader)
        while self.state.step < self.total_steps:
            start = time.perf_counter()  # train time counts batch fetching and collation too
            group = [b for _, b in zip(range(self.cfg.grad_accum), batches)]
            if not group:
                break
            self.state.batch_in_epoch += len(group)
            self.step(group)
            self.state.train_time += time.perf_counter() - start
            bar.update(1)
            if self._after_step(bar) or self._stopping(stop_after):
                return True
        else:  # max steps reached: inside the epoch, or with its last batch (the epoch is whole)
            if self.state.batch_in_epoch < len(self.loader):
                return False
        self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0
        if self.cfg.eval_every == 0:
            self._eval_and_save()
            return self._stopping(None)
        return False

    def _stopped_early(self) -> bool:
        """Early stopping has fired: the run's training is done."""
        patience = self.cfg.early_stopping_patience
        return bool(patience and self.state.bad_evals >= patience)

    def _stopping(self, stop_after: int | None) -> bool:
        return self._stopped_early() or bool(stop_after and self.state.step >= stop_after)

    def _say(self, line: str) -> None:
        """A line of the run's progress, said by the main process alone. Every process keeps the
        same counts (skipped and empty steps, read at the same steps from all-reduced values) and
        stops at the same step; a launch of N processes printed each such line N times."""
        if self.acc.is_main_process:
            tqdm.write(line)

    # --- one step ----------------------------------------------------------------------------
    def step(self, group: list[dict]) -> None:
        """One optimizer step over k micro-batches. Nothing is read to the host: the loss, norm,
        count and finite flag go to `self.tally`, read at the steps that log (`_read`); a
        non-finite step is skipped on the device. fp16's loss scaler and a method's `after_step`
        need the flag on the host, so they take `_host_step` (one read per step, as before)."""
        self.micro = len(group)  # what a skip of this step drops (fewer than grad_accum at an epoch's end)
        weighted = self._own_examples(group)
        units, samples = self._counts(weighted)
        loss_t = self._backward(weighted, units)  # 0/0, NaN, where the step has no loss unit:
        # every optimizer path below then skips it, and the tally counts it as empty (`_empty`)
        if self.opt_step is not None:  # clipped and stepped in one compiled call, skipped on the device
            norm_t, ok = self.opt_step(loss_t)
            self._next_step(loss_t, norm_t, samples, ok, units == 0)
            return
        norm_t = self._clip_grads()
        if norm_t is None:  # DeepSpeed without an engine's norm: the loss alone says whether the step is finite
            norm_t = torch.zeros((), device=loss_t.device)
        ok = torch.isfinite(loss_t) & torch.isfinite(norm_t)
        if self.host_checked:
            self._host_step(loss_t, norm_t, samples, ok, units)
            return
        skip_unless(self.optimizer, ok)
        self.stepper.step()
        clear_skip(self.optimizer)
        self._next_step(loss_t, norm_t, samples, ok, units == 0)

    def _next_step(self, loss_t: torch.Tensor, norm_t: torch.Tensor, samples: torch.Tensor,
                   ok: torch.Tensor, empty: torch.Tensor, schedule: bool = True) -> None:
        """After the optimizer, on every path and whatever the step did (updated, skipped as
        non-finite, empty, the fp16 scaler's overflow): the step takes its slot, so it counts
        toward max_steps and the run reads its epochs' batches once, as Trainer's global_step
        counts a skipped step. The schedule moves on with it (a skip decided on the device cannot
        hold it without a host read), except where `schedule` is False: the fp16 scaler's own
        overflow, where Trainer holds it too (`optimizer_step_was_skipped`)."""
        self.step_lr = self.scheduler.get_last_lr()[0]  # what this step trained at: the log's lr
        if schedule:
            # a skipped first step moves the schedule on purpose: not torch's "scheduler.step()
            # before optimizer.step()" misuse, which it would warn of
            getattr(self.scheduler, "scheduler", self.scheduler).optimizer._opt_called = True
            self.scheduler.step()
        self.state.step += 1
        self.stepper.zero_grad(set_to_none=True)
        self.tally.add(self.state.step, loss_t, norm_t, samples, ok, self._skips_left(), empty, self.micro)

    def _own_examples(self, group: list[dict]) -> list[tuple[dict, float]]:
        """Each micro-batch of the step cut to the epoch's own examples, with its weight: 0.0 for
        one that is all padding (`EpochBatches.own_rows`: accelerate evens out the epoch's last
        batches across processes by repeating its first examples). Such a batch still runs
        forward and backward, so every process takes part in the same collectives (DDP's
        gradient all-reduce, FSDP's gathers), and counts for nothing."""
        first = self.state.batch_in_epoch - len(group)  # this process's index of group[0]
        width = self._step_width(first // self.cfg.grad_accum)
        out = []
        for i, batch in enumerate(group):
            rows = self.sampler.own_rows((first + i) * self.acc.num_processes + self.acc.process_index)
            size = self.setup.task.batch_size(batch)
            batch = _first_rows(batch, rows, size) if 0 < rows < size else batch
            if width is not None and rows:  # an all-padding batch keeps its width: its targets may lie past it
                batch = fit_inputs(batch, width, self.pad_id)
            out.append((batch, 1.0 if rows else 0.0))
        return out

    def _step_width(self, step: int) -> int | None:
        """Where the task's loss sees the padding (extractive QA: run_qa's softmax runs over the
        padded positions), the width every micro-batch of the step is padded to: that of the
        step's longest example (bucketed as the collator buckets), on every process, so that an
        example's loss is that of one whole-step batch however the step is split. A batch
        accelerate filled with the epoch's first examples is cut back to this width with its rows
        (`fit_inputs`): it was as wide as the longest repeat, and on 2 processes the epoch's last
        step took its softmax over up to that many positions where 1 process took it over the
        step's own (extractive QA's last logged loss 5.00 against 4.09, exit 0). None elsewhere."""
        if not self.setup.task.loss_sees_padding():
            return None
        length = self.sampler.step_length(step)
        return getattr(self.loader.collate_fn, "length_of", lambda n: n)(length)

    def _counts(self, group: list[tuple[dict, float]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss units, examples) of the step over all processes, in one all-reduce; on the
        device (torch.full is a fill kernel, where torch.tensor would copy from the host)."""
        task = self.setup.task
        n = float(sum(task.batch_size(b) for b, w in group if w))
        none = torch.zeros((), device=self.acc.device)  # a process whose micro-batches are all padding
        local = torch.stack([sum((task.units(b).sum() for b, w in group if w), none).float(),
                             torch.full((), n, device=self.acc.device)])
        units, samples = self.acc.reduce(local, reduction="sum")
        return units, samples

    def _backward(self, group: list[tuple[dict, float]], units: torch.Tensor) -> torch.Tensor:
        """Forward and backward of every micro-batch (weighted: `_own_examples`); the step's mean
        loss over all processes."""
        scale = self.acc.num_processes / units.clamp(min=1)
        summed = torch.zeros((), device=self.acc.device)
        for i, (batch, weight) in enumerate(group):
            sync = nullcontext() if i == len(group) - 1 else self.acc.no_sync(self.model)
            with sync:
                loss_sum = self._forward(batch)
                if not weight:  # all padding: its gradient is zeros, for the collectives only
                    loss_sum = loss_sum * 0.0
                extra = self.method.extra_loss(self.unwrapped)  # a per-step term: 1/k per micro-batch
                loss = loss_sum * scale if extra is None else loss_sum * scale + extra / len(group)
                if self.plain:  # accelerate would divide by its accumulation steps, 1 here: two kernels
                    loss.backward()
                else:
                    self.acc.backward(loss)
            summed += loss_sum.detach()
        return self.acc.reduce(summed, reduction="sum") / units

    def _forward(self, batch: dict) -> torch.Tensor:
        if not self.compiled:
            return self.forward_loss(batch)
        compiling.mark_step()
        try:
            return self.forward_loss(compiling.mark_dynamic(batch))
        except Exception as error:  # noqa: BLE001 - a shape past the limit becomes one line
            raise compiling.step_error(error) from None

    def _clip_grads(self) -> torch.Tensor | None:
        """The gradient norm before clipping (a device tensor; None only where DeepSpeed gives
        none), measured with train.max_grad_norm off too, as the installed Trainer measures and
        logs it (a clip at an infinite norm, which scales nothing): a step whose loss is finite
        and whose gradient is not is then a skipped step with clipping on or off. Without it,
        clipping off, such a step was taken: every weight NaN, checkpointed as the "last good
        checkpoint", and the stop blamed the next step. Under fp16's loss scaler this also
        unscales the gradients, so an overflow is the scaler's skipped step (`_host_step`: no
        update, no `after_step`, its step slot taken) and a method's `after_step` sees unscaled
        gradients. Clipping a non-finite gradient is harmless: the step is skipped."""
        limit = self.cfg.max_grad_norm or math.inf
        if self.plain:  # what accelerate's clip_grad_norm_ calls here, on the parameters listed once
            if limit == math.inf:  # measured only: no multiplication by 1 of every gradient
                return torch.nn.utils.get_total_norm([p.grad for p in self.trainable if p.grad is not None])
            return torch.nn.utils.clip_grad_norm_(self.trainable, limit)
        # a DTensor under FSDP2, a float under DeepSpeed: a plain device tensor either way
        return sharding.full(self.acc.clip_grad_norm_(self.model.parameters(), limit), self.acc.device)

    def _skips_left(self) -> int:
        return self.cfg.skip_nonfinite - self.state.skipped_nonfinite

    def _host_step(self, loss_t: torch.Tensor, norm_t: torch.Tensor, samples: torch.Tensor,
                   ok: torch.Tensor, units: torch.Tensor) -> None:
        """The step with one host read, which decides only what the step does: the optimizer
        steps and the method's `after_step` runs (on the step's gradients) where the step is
        finite and has a loss unit; fp16's loss scaler skips its own overflows (its step lowers
        the scale, the schedule holds, as in Trainer: not a non-finite batch); any other batch
        makes no update; a step without an update is shown to the method's `skipped_step`, not
        its `after_step`. Every outcome then takes its step slot exactly as on the device
        (`_next_step`): the step counts, the schedule moves on, the tally says
        the skip or the empty step at its next read. A skipped step here once took no slot: each
        skip made the run read one more step of batches, past max_steps or its epochs."""
        loss, norm, count = torch.stack([loss_t.float(), norm_t.float(), units.float()]).tolist()
        if count and math.isfinite(loss) and math.isfinite(norm):
            self.optimizer.step()
            self.method.after_step(self.unwrapped, self.state.step + 1)  # gradients still in place
            precision.pull_model_writes(self.optimizer)  # bf16_master: what after_step wrote stays
        elif count and math.isfinite(loss) and self.acc.scaler is not None:
            self.optimizer.step()  # the scaler's overflow: no update, a lower scale
            self._skipped_step()
            # its loss and examples count, as in Trainer; not against skip_nonfinite; the schedule holds
            self._next_step(loss_t, norm_t, samples, torch.ones_like(ok), units == 0, schedule=False)
            return
        else:
            self._no_step()
            self._skipped_step()
        self._next_step(loss_t, norm_t, samples, ok, units == 0)

    def _skipped_step(self) -> None:
        """A step that made no update, shown to the method at the step number it takes
        (`Method.skipped_step`): AdaLoRA's re-allocation due at that count happens at it. Before,
        a skipped step on a re-allocation step delayed that re-allocation by `delta_t` steps."""
        self.method.skipped_step(self.unwrapped, self.state.step + 1)
        precision.pull_model_writes(self.optimizer)  # bf16_master: what it wrote stays

    def _no_step(self) -> None:
        """A batch that takes no optimizer step: its gradients go; under fp16 the loss scaler's
        iteration, which `_clip_grads` opened by unscaling, is closed (`update`, which lowers the
        scale where the gradients held an inf or NaN), else the next step's unscaling raised
        'unscale_() has already been called on this optimizer since the last update()'."""
        if self.acc.scaler is not None:
            self.acc.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def _nonfinite(self, loss: float, what: str, step: int, count: int = 1, micro: tuple = ()) -> None:
        """Count skipped optimizer steps while train.skip_nonfinite allows; else stop, keeping the
        last good checkpoint (the run stays unfinished, so nothing NaN is saved or reported). A
        skip drops a whole step, the k micro-batches it accumulated (`micro`: each skipped step's,
        in order; train.grad_accum each where not given): said and counted in steps and in
        micro-batches, never as "1 batch skipped" for a step of 4 dropped micro-batches."""
        allowed = min(count, self.cfg.skip_nonfinite - self.state.skipped_nonfinite)
        if allowed > 0:
            batches = sum(micro[:allowed]) if micro else allowed * self.cfg.grad_accum
            self.state.skipped_nonfinite += allowed
            self.state.skipped_nonfinite_micro_batches += batches
            self._say(f"step {step}: non-finite {what}; {allowed} optimizer step{'s' * (allowed > 1)} "
                       f"({batches} micro-batch{'es' * (batches > 1)}) skipped ({self.state.skipped_nonfinite} "
                       f"of train.skip_nonfinite={self.cfg.skip_nonfinite} steps)")
        if allowed < count:
            raise UserError(f"step {step}: the {what} is not finite ({loss}); stopped, "
                            "keeping the last good checkpoint (lower train.lr, or allow "
                            "train.skip_nonfinite: N)")

    def _empty(self, count: int, step: int) -> None:
        """Steps whose batches held no loss unit (an MLM batch in which no token drew a mask,
        a chance that short blocks make likely): their mean loss is 0/0 and their gradient zero,
        so no update is made and the run goes on; said, as a skipped batch is, never taken for
        a diverged loss."""
        self.state.empty_steps += count
        self._say(f"step {step}: {'its batch holds' if count == 1 else f'{count} steps from here hold'} no "
                   f"token the loss is taken on (nothing masked or predicted); no update made "
                   f"({self.state.empty_steps} such step{'s' * (self.state.empty_steps > 1)} so far)")

    def _read(self) -> Reading | None:
        """Bring the tally to the host (on every process, at the same steps): samples and skips
        into the state; stops the run, naming the step, if the skips went past the limit. The
        read waits for the steps queued on a GPU since the last one (a step does no host read, so
        the host runs ahead of the device): that wait is the steps' own time and counts in
        `train_runtime_s` and the rates. It counted nowhere (the log's rate was read after it, an
        evaluation timed from after it): the rate was the host's speed of queueing steps."""
        if not self.tally.pending:
            return None
        start = time.perf_counter()
        r = self.tally.read()  # waits for the steps the device still runs: training time, as theirs
        self.state.train_time += time.perf_counter() - start
        self.state.samples += r.samples
        # the logged loss is the mean over the steps since the last log, as Trainer logs tr_loss,
        # not the logged step's alone; and metrics.json's train_loss the mean over the run's steps
        # (Trainer's). Both kept in the state, so a resumed run says the same; each step's loss is
        # added on its own, in step order, so where the reads fell (a resume reads at its stop)
        # does not change a sum's rounding
        self.state.log_window = _added(self.state.log_window or [0.0, 0], r.losses)
        if self.state.run_loss is not None:  # None: resumed from a checkpoint that did not record it
            self.state.run_loss = _added(self.state.run_loss, r.losses)
        if r.empty:
            self._empty(r.empty, r.first_empty)
        if r.skipped:
            left = self.cfg.skip_nonfinite - self.state.skipped_nonfinite
            first = ("gradient norm" if r.first_norm else "loss", r.first_skip)
            if not r.over_step:
                self._nonfinite(r.loss, *first, count=r.skipped, micro=r.skipped_micro)
            elif left > 0:  # the allowed skips before it, then the stop
                self._nonfinite(r.loss, *first, count=left, micro=r.skipped_micro)
            if r.over_step:
                self._nonfinite(r.over_loss, "gradient norm" if r.over_norm else "loss", r.over_step)
        return r

    def _after_step(self, bar: tqdm) -> bool:
        """Log, evaluate on schedule; True when early stopping says stop."""
        s = self.state
        if s.step % self.cfg.log_every == 0 or s.step == 1:
            r = self._read()  # every process: a stop must stop them all
            if self.acc.is_main_process and r is not None:
                lr = self.step_lr  # the rate the logged step trained at, as Trainer logs it (not the next one's)
                total, count = self.state.log_window or (0.0, 0)
                loss = total / count if count else r.loss  # every step since the last log skipped: its loss
                entry = {"step": s.step, "epoch": self._epochs_done(), "loss": loss, "lr": lr,
                         "grad_norm": r.grad_norm,
                         "samples_per_second": s.samples / max(s.train_time, 1e-9)}
                if s.skipped_nonfinite:  # so far, in both units: as metrics.json and the console say them
                    entry.update(skipped_nonfinite=s.skipped_nonfinite,
                                 skipped_nonfinite_micro_batches=s.skipped_nonfinite_micro_batches)
                runs.append_log(self.out, entry)
                s.logged = s.step
                tracking.log(self.acc, {"train": entry}, s.step, entry["epoch"])
                bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
            self.state.log_window = None
        if self.cfg.eval_every and s.step % self.cfg.eval_every == 0:
            self._eval_and_save()
            return self._stopping(None)
        if self.cfg.save_every and s.step % self.cfg.save_every == 0:
            self.save()
        return False

    def _evaluate_again(self) -> None:
        """Resumed from the final checkpoint (killed while finishing: writing model/, the
        predictions or metrics.json): the last evaluation's metrics came back with the state, but
        its predictions were only in memory. The same evaluation again gives them, unless
        `finish` evaluates the best step's weights anyway."""
        if self.cfg.keep_best and self.state.best_step not in (None, self.state.step):
            return
        evaluation.evaluate(self.model, self.evals, self.setup.task, self.acc, self.setup.raw_evals,
                            sink=self.setup.predictions, orders=self.eval_orders)

    def _epochs_done(self) -> float:
        """The log's `epoch` at this step, as Trainer computes `state.epoch`: the epochs completed
        plus the share of the current epoch's micro-batches (this process's) taken so far, so the
        step that takes an epoch's last batch says it is done (1.0) and a step inside an epoch says
        how far (1.5). It was the whole epochs completed: a step half-way through the second
        epoch said 1 where Trainer says 1.5. Under accumulation the share counts micro-batches,
        as Trainer's does: an epoch of 5 micro-batches, 4 accumulated, is 0.8 done after step 1."""
        return self.state.epoch + self.state.batch_in_epoch / len(self.loader)

    def _eval_and_save(self) -> None:
        self.evaluated = True
        self._read()  # a run past its non-finite limit stops before evaluating
        start = time.perf_counter()
        try:
            metrics = evaluation.evaluate(self.model, self.evals, self.setup.task, self.acc, self.setup.raw_evals,
                                          sink=self.setup.predictions, orders=self.eval_orders)
        except evaluation.NotFinite as broken:  # before this step's checkpoint: none holds these weights
            raise UserError(f"step {self.state.step}: {broken}; stopped, keeping the last good checkpoint "
                            "(lower train.lr, or set train.max_grad_norm)") from None
        runtime = time.perf_counter() - start  # generation tasks: eval speed is generation speed
        self.state.eval_runtime_s = runtime
        self.state.last_eval = {"step": self.state.step, **metrics}
        self._keep_if_best(metrics)
        if self.acc.is_main_process:
            entry = {"step": self.state.step, "epoch": self._epochs_done(), "eval": metrics, "eval_runtime_s": runtime}
            runs.append_log(self.out, entry)
            self.state.logged = self.state.step
            tracking.log(self.acc, entry, self.state.step, entry["epoch"])  # as log.jsonl, its epoch too
            tqdm.write(f"step {self.state.step}: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        self.save()




def _added(window: list, losses: tuple) -> list:
    """[sum, count] with `losses` added one by one."""
    total, count = window
    for loss in losses:
        total += loss
    return [total, count + len(losses)]


def _first_rows(batch: dict, rows: int, size: int) -> dict:
    """The batch's first `rows` examples: every tensor whose first dimension is the batch's."""
    return {k: v[:rows] if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == size else v
            for k, v in batch.items()}


def improves(metric: Any, value: float, loss: float | None, best: float | None,
             best_loss: float | None) -> bool:
    """A better score, or the same score at a lower eval loss: on a small eval split the first
    evaluation often ties the last on accuracy while the model is far from trained."""
    if metric.better(value, best):
        return True
    return value == best and loss is not None and (best_loss is None or loss < best_loss)




def save_result(recipe: Recipe, model: torch.nn.Module, tokenizer: Any, folder: Path, source: str) -> None:
    """The trained result in the format plain transformers / peft load, with its tokenizer;
    `source` is the checkpoint it started from (Setup.source), which make_portable points at."""
    recipe.method.save(model, folder)
    attention.save(model, folder, recipe.model.attention)  # PEFT saves adapters only
    models.save_tokenizer(tokenizer, folder)  # as read, not as its last call left it
    if not recipe.smoke:  # a smoke run's base is the small random model: its path is its name
        models.make_portable(folder, source)
    runs.follow_umask(folder)  # safetensors writes 0600 whatever the umask


def finish(recipe: Recipe, setup: Setup, acc: Accelerator, out: Path, state: State,
            model: torch.nn.Module | None = None, evaluate_only: bool = False,
            evals: dict[str, DataLoader] | None = None, orders: dict[str, list[int]] | None = None,
            epoch: float | None = None) -> dict:
    """Final evaluation (of the best model when kept), the saved model, then metrics.json;
    `epoch`: the epochs the run trained, as its last log line says (None: nothing trained)."""
    # eval_runtime_s and eval_samples_per_second are of the evaluation whose scores metrics.json
    # reports: an in-context run's (it said 0.0 s and 0.0 examples/s: the slowest in a report) and
    # the kept best step's, evaluated again here (it said the last step's evaluation's time)
    start = time.perf_counter()
    if evaluate_only:
        model = acc.prepare_model(setup.model, evaluation_mode=True)  # no DDP: nothing trains
        metrics = recipe.method.evaluate(model, setup, acc)
        state.eval_runtime_s = time.perf_counter() - start
    else:
        unwrapped = acc.unwrap_model(model)
        acc.wait_for_everyone()
        if recipe.train.keep_best and state.best_step is not None and state.best_step != state.step:
            checkpoints.load_best(model, out / "checkpoints" / runs.step_name(state.best_step), acc)
            start = time.perf_counter()
            metrics = evaluation.evaluate(model, evals or {}, setup.task, acc, setup.raw_evals,
                                          sink=setup.predictions, orders=orders)
            state.eval_runtime_s = time.perf_counter() - start
        else:
            metrics = {k: v for k, v in (state.last_eval or {}).items() if k != "step"}
        with sharding.gathered(unwrapped, acc.is_main_process):  # FSDP: whole, plain weights
            if acc.is_main_process:
                save_result(recipe, unwrapped, setup.tokenizer, out / "model", setup.source)
    result = run_metrics.build(recipe, setup, acc, out, state, metrics, epoch)
    if setup.task.metric_info():  # strings beside the float metrics (sacreBLEU's signature)
        result["metric_info"] = setup.task.metric_info()
    if acc.is_main_process:
        for suffix, rows in setup.predictions.items():
            runs.write_predictions(out / f"predictions{suffix}.jsonl", rows,
                                   setup.task.prediction_files(rows, setup.raw_evals[suffix]),
                                   setup.task.retired_prediction_files)
        runs.write_json(out / "metrics.json", result)
        if not recipe.train.keep_checkpoints:  # the run is whole: model/ is what it leaves
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
    acc.wait_for_everyone()
    tracking.summary(acc, result, state.step)
    for tracker in acc.trackers:  # flushed and closed; not end_training(): it ends the process group
        tracker.finish()
    return result

