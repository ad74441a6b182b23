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
import os
import platform
import shutil
import resource
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Sampler
from tqdm.auto import tqdm

from toolkit import attention, chain, evaluation, models, provenance, runs, tracking
from toolkit.errors import Interrupted, UserError
from toolkit.methods import Context, count_params
from toolkit.recipe import Recipe, dump
from toolkit.tasks import Task


@dataclass
class Setup:
    """Everything a run needs, built before its folder is created (user errors surface here)."""

    task: Task
    model: torch.nn.Module
    tokenizer: Any
    train: Any  # tokenized Dataset or None
    evals: dict[str, Any]  # suffix -> encoded eval split
    raw_evals: dict[str, Any]  # suffix -> the same split's raw examples (what scoring sees)
    trainable: int
    total: int
    seed: int = 0  # train.seed: what methods that draw at random (icl demonstrations) use
    predictions: dict = field(default_factory=dict)  # suffix -> rows of the latest evaluation


def build(recipe: Recipe) -> Setup:
    task = recipe.task
    raw = task.load()
    checkpoint = chain.source(recipe)  # a {run: ...} reference: that run's model (smoke-sized or not)
    if recipe.smoke and recipe.upstream is None:
        checkpoint = models.smoke_checkpoint(checkpoint)
    set_seed(recipe.train.seed)  # head and adapter initialisation depend on the seed alone
    head = recipe.method.head(task, models.recipe_family(checkpoint, recipe.model.warm_start))
    model, tok = models.load(checkpoint, head, task.head_kwargs(), recipe.model.attention, recipe.model.dropout,
                             warm_start=recipe.model.warm_start)
    limit = models.max_positions(model.config, tok)
    length = max(task.max_length, recipe.written_max_length or 0)  # --smoke: the length as written
    if limit is not None and length > limit:
        raise UserError(f"task.max_length: {length} is more than the {limit} positions "
                        f"{recipe.model.checkpoint} has; use at most {limit}")
    recipe.method.check_data(task, raw)
    if recipe.train.gradient_checkpointing and not getattr(model, "supports_gradient_checkpointing", False):
        raise UserError(f"train.gradient_checkpointing: {type(model).__name__} does not support it")
    ctx = Context(family=model.config.model_type, head_names=models.head_names(model),
                  peft_task_type=models.PEFT_TASK_TYPES.get(head, task.peft_task_type), tokenizer=tok,
                  instruction=getattr(task, "instruction", None))
    model = recipe.method.apply(model, ctx)
    if recipe.train.gradient_checkpointing:  # after the method: PEFT refuses prefix tuning on a
        # model already checkpointing (its cache route breaks under recomputation; ours does not).
        # Non-reentrant: works when the inputs do not require grad (a frozen base under PEFT)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    attention.keep_trainable(model)  # an attention module's own parameters train with every method
    trainable, total = count_params(model)
    if recipe.method.trains and trainable == 0:
        raise UserError(f"method.name: '{recipe.method.name}' left no parameter to train")
    if recipe.method.trains and raw["train"] is None:
        raise UserError(f"task: {recipe.task.name} has no train split here")
    encode = recipe.method.encoder(task, tok)
    train = encode(raw["train"]) if recipe.method.trains else raw["train"]
    evals = {sfx: encode(ds) for sfx, ds in raw["eval"].items()}
    return Setup(task, model, tok, train, evals, raw["eval"], trainable, total, recipe.train.seed)


class EpochBatches(Sampler):
    """Index batches from a permutation seeded by (seed, epoch); optionally length-grouped.

    Owning the shuffle (instead of a RandomSampler drawing from the global RNG) makes the data
    order a pure function of (seed, epoch), which is what exact resume needs.

    Length grouping (the default) works in optimizer steps: `step` = batch x grad_accum x
    processes examples. The permutation is cut into mega-batches of 50 steps, each sorted by
    length and cut into steps; the steps are shuffled, and each is cut into its micro-batches in
    the order the processes take them (accelerate deals process p the batches p, p+N, ...). So a
    batch pads to a length close to its members', lengths come in random order over the epoch
    (no long-to-short run inside every 50 batches, which plain sorting would give), and an
    optimizer step holds the same examples whatever the split into processes and micro-batches:
    2 processes equal 1 with the same global batch.
    """

    MEGA = 50  # optimizer steps per mega-batch, as transformers' LengthGroupedSampler (in batches)

    def __init__(self, lengths: list[int], batch_size: int, seed: int, group_by_length: bool,
                 step: int | None = None) -> None:
        self.lengths, self.batch_size, self.seed = lengths, batch_size, seed
        self.group_by_length, self.epoch = group_by_length, 0
        self.step = step or batch_size

    def use_epoch(self, epoch: int) -> None:
        """Not `set_epoch`: accelerate calls that with its own iteration counter, which a resumed
        run does not share."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        bs = self.batch_size
        if not self.group_by_length:
            for start in range(0, len(order), bs):
                yield order[start:start + bs]
            return
        mega, step = self.MEGA * self.step, self.step
        steps = []
        for s in range(0, len(order), mega):
            chunk = sorted(order[s:s + mega], key=lambda i: -self.lengths[i])
            steps += [chunk[b:b + step] for b in range(0, len(chunk), step)]
        # a short step (the epoch's tail) stays last, as without grouping
        tail = [steps.pop()] if steps and len(steps[-1]) < step else []
        for i in torch.randperm(len(steps), generator=g).tolist() + ([len(steps)] if tail else []):
            members = steps[i] if i < len(steps) else tail[0]
            for b in range(0, len(members), bs):
                yield members[b:b + bs]

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)


class LengthOrder(Sampler):
    """Evaluation order: longest first, so each batch pads to a length close to its members'
    (the first batch is the largest, so an out-of-memory shows at once). `order[i]` is the
    dataset position of the i-th example served; `evaluation.evaluate` puts outputs back in
    dataset order with it before scoring."""

    def __init__(self, lengths: list[int]) -> None:
        self.order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep order

    def __iter__(self) -> Iterator[int]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


def eval_batch_size(recipe: Recipe) -> int:
    """train.eval_batch_size, else twice the training batch: evaluation keeps no activations for
    backward, so it fits about twice the examples in the same memory."""
    return recipe.train.eval_batch_size or 2 * recipe.train.batch_size


def eval_loaders(recipe: Recipe, setup: Setup) -> tuple[dict[str, DataLoader], dict[str, list[int]]]:
    """One loader per encoded eval split (unprepared), served longest first, and each split's
    order (for `evaluation.evaluate`): the loop's and `toolkit eval`'s."""
    collate = setup.task.collator(setup.tokenizer, setup.model)
    loaders, orders = {}, {}
    for sfx, ds in setup.evals.items():
        sampler = None
        if "input_ids" in ds.column_names:
            sampler = LengthOrder([len(ids) for ids in ds["input_ids"]])
            orders[sfx] = sampler.order
        loaders[sfx] = DataLoader(ds, batch_size=eval_batch_size(recipe), sampler=sampler, collate_fn=collate)
    return loaders, orders


def _loaders(recipe: Recipe, setup: Setup, processes: int = 1) -> tuple[DataLoader | None, EpochBatches | None, dict, dict]:
    collate = setup.task.collator(setup.tokenizer, setup.model)
    evals, orders = eval_loaders(recipe, setup)
    if setup.train is None or not recipe.method.trains:
        return None, None, evals, orders
    lengths = [len(ids) for ids in setup.train["input_ids"]]
    step = recipe.train.batch_size * recipe.train.grad_accum * processes
    sampler = EpochBatches(lengths, recipe.train.batch_size, recipe.train.seed, recipe.train.group_by_length, step)
    # Its own generator: a DataLoader draws a base seed from the global RNG at every iter(),
    # which would shift dropout masks between a resumed and an uninterrupted run.
    loader = DataLoader(setup.train, batch_sampler=sampler, collate_fn=collate,
                        generator=torch.Generator().manual_seed(recipe.train.seed))
    return loader, sampler, evals, orders


def _optimizer(model: torch.nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel for all parameters, no temporary copies: what Trainer defaults to);
    no weight decay on biases and norms (parameters with fewer than 2 dimensions)."""
    params = [p for p in model.parameters() if p.requires_grad]  # build() refused none
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": recipe.train.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe.train.lr, fused=True)


@dataclass
class State:
    """What trainer_state.json holds: the data position and the bookkeeping beside the weights."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of `epoch` already consumed
    best_metric: float | None = None
    best_step: int | None = None
    best_loss: float | None = None  # eval loss at best_step: breaks ties on the metric
    bad_evals: int = 0
    samples: int = 0
    train_time: float = 0.0
    last_eval: dict | None = None
    peak_memory_mb: float = 0.0  # of training itself: checkpoint writing is not counted
    skipped_nonfinite: int = 0  # batches skipped for a non-finite loss or gradient
    eval_runtime_s: float = 0.0  # of the latest evaluation (every eval split)


def run(recipe: Recipe, out: Path, resume: bool = False, stop_after: int | None = None) -> dict | None:
    """Build, train, evaluate and save one recipe into `out`; returns metrics (None if stopped)."""
    from accelerate.state import AcceleratorState

    if recipe.train.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise UserError("train.mixed_precision: fp16 needs a CUDA GPU and none is here (on a CPU it "
                        "would silently run in fp32); use bf16 (slow on CPU) or no")
    if not torch.cuda.is_available():
        _check_strategy("MULTI_CPU" if runs.world_size() > 1 else "NO")
    AcceleratorState._reset_state()  # several runs in one process may differ in mixed precision
    # step_scheduler_with_optimizer=False: accelerate would otherwise step the schedule once per
    # process per optimizer step; total_steps here already counts optimizer steps of the global batch.
    accelerator = Accelerator(mixed_precision=recipe.train.mixed_precision, cpu=not torch.cuda.is_available(),
                              step_scheduler_with_optimizer=False, log_with=recipe.train.report_to or None,
                              project_dir=tracking.project_dir(out))
    _check_strategy(accelerator.distributed_type.value)
    reset_peak_memory(accelerator.device)  # a sweep runs many recipes in one process
    setup = build(recipe)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "recipe.yaml").write_text(dump(recipe))
    accelerator.wait_for_everyone()
    tracking.start(accelerator, recipe.name, recipe.to_dict())
    if not recipe.method.trains:
        return _finish(recipe, setup, accelerator, out, State(), evaluate_only=True)
    return Loop(recipe, setup, accelerator, out).train(resume, stop_after)


class Loop:
    def __init__(self, recipe: Recipe, setup: Setup, accelerator: Accelerator, out: Path) -> None:
        self.recipe, self.setup, self.acc, self.out = recipe, setup, accelerator, out
        self.cfg = recipe.train
        train_loader, self.sampler, evals, self.eval_orders = _loaders(recipe, setup, accelerator.num_processes)
        if self.cfg.fast_dropout:
            from toolkit import dropout

            dropout.install(setup.model, accelerator.device)  # before prepare: DDP wraps the same modules
        optimizer = _optimizer(setup.model, recipe)
        per_process = math.ceil(len(train_loader) / accelerator.num_processes)
        self.steps_per_epoch = math.ceil(per_process / self.cfg.grad_accum)
        self.total_steps = self.cfg.max_steps or max(1, math.ceil(self.cfg.epochs * self.steps_per_epoch))
        warmup = self.cfg.warmup_steps or math.ceil(self.cfg.warmup_ratio * self.total_steps)
        from transformers import get_linear_schedule_with_warmup

        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, self.total_steps)
        prepared = accelerator.prepare(setup.model, optimizer, train_loader, scheduler, *evals.values())
        accelerator.register_save_state_pre_hook(_lean_weights)
        self.model, self.optimizer, self.loader, self.scheduler = prepared[:4]
        self.evals = dict(zip(evals, prepared[4:]))
        self.state = State()
        self.metric = setup.task.declaration(self.cfg.metric or setup.task.main_metric())

    # --- checkpoints -------------------------------------------------------------------------
    def save(self) -> None:
        """Written under a temporary name, with a manifest of every file's size and hash, and
        renamed when whole: a kill at any moment leaves the previous checkpoints intact."""
        name = runs.step_name(self.state.step)
        folder, tmp = self.out / "checkpoints" / name, self.out / "checkpoints" / f"tmp-{name}"
        self.state.peak_memory_mb = max(self.state.peak_memory_mb, _peak_memory_mb(self.acc.device))
        if self.acc.is_main_process and tmp.exists():
            shutil.rmtree(tmp)
        self.acc.wait_for_everyone()
        self.acc.save_state(str(tmp))
        if self.acc.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.acc.device)
        self.acc.wait_for_everyone()  # every rank's RNG file is in
        if self.acc.is_main_process:
            state = {**self.state.__dict__, "manifest": runs.manifest(tmp)}
            runs.write_json(tmp / "trainer_state.json", state)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(tmp, folder)
            runs.prune(self.out, self.cfg.save_total_limit, self.state.best_step if self.cfg.keep_best else None)
        self.acc.wait_for_everyone()

    def restore(self) -> None:
        """The newest checkpoint that is whole; a truncated or corrupt one is said and skipped."""
        for folder in reversed(runs.checkpoints(self.out)):
            problem = runs.check_manifest(folder)
            if problem is None:
                try:  # not strict: a lean checkpoint holds the trainable weights only
                    self.acc.load_state(str(folder), strict=False)
                except Exception as exc:  # a file the manifest could not vouch for
                    problem = f"{type(exc).__name__} while loading it"
            if problem is not None:
                self.acc.print(f"checkpoint {folder} is unusable ({problem}); trying the one before")
                continue
            saved = runs.read_json(folder / "trainer_state.json")
            saved.pop("manifest", None)
            self.state = State(**saved)
            if self.acc.is_main_process:
                runs.truncate_log(self.out, self.state.step)
                self.acc.print(f"resuming from {folder} (step {self.state.step} of {self.total_steps})")
            return
        if runs.checkpoints(self.out):
            self.acc.print("no usable checkpoint: starting from the beginning")
        if self.acc.is_main_process:
            runs.truncate_log(self.out, 0)

    def _keep_if_best(self, metrics: dict) -> None:
        """The best weights are the step checkpoint `save` writes right after this evaluation
        (kept from pruning): no second copy of the parameters, in memory or on disk."""
        value, loss = metrics[self.metric.name], metrics.get("loss")
        if improves(self.metric, value, loss, self.state.best_metric, self.state.best_loss):
            self.state.best_metric, self.state.best_step, self.state.bad_evals = value, self.state.step, 0
            self.state.best_loss = loss
        else:
            self.state.bad_evals += 1

    # --- the loop ----------------------------------------------------------------------------
    def train(self, resume: bool, stop_after: int | None) -> dict | None:
        if resume:
            self.restore()
        self.model.train()
        bar = tqdm(total=self.total_steps, initial=self.state.step, disable=not self.acc.is_main_process,
                   desc=self.recipe.name, dynamic_ncols=True,
                   mininterval=0.5 if sys.stderr.isatty() else 30.0)
        stop = False
        try:
            while self.state.step < self.total_steps and not stop:
                stop = self._epoch(bar, stop_after)
        except KeyboardInterrupt:  # Ctrl-C: the caller says where it stopped and how to resume
            bar.close()
            raise Interrupted(step=self.state.step, total=self.total_steps) from None
        bar.close()
        if stop_after and self.state.step >= stop_after and self.state.step < self.total_steps:
            self.save()  # a simulated interruption: checkpoint and leave the run unfinished
            return None
        if self.state.last_eval is None or self.state.last_eval.get("step") != self.state.step:
            self._eval_and_save()
        return _finish(self.recipe, self.setup, self.acc, self.out, self.state, model=self.model,
                       evals=self.evals, orders=self.eval_orders)

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
            before = self.state.step
            loss = self.step(group)
            self.state.train_time += time.perf_counter() - start
            if self.state.step == before:  # a skipped non-finite batch: no step was taken
                continue
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{self.scheduler.get_last_lr()[0]:.2e}")
            if self._after_step(loss) or self._stopping(stop_after):
                return True
        else:
            return False  # max steps reached inside the epoch
        self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0
        if self.cfg.eval_every == 0:
            self._eval_and_save()
            return self._stopping(None)
        return False

    def _stopping(self, stop_after: int | None) -> bool:
        early = self.cfg.early_stopping_patience and self.state.bad_evals >= self.cfg.early_stopping_patience
        return bool(early) or bool(stop_after and self.state.step >= stop_after)

    def step(self, group: list[dict]) -> float:
        """One optimizer step over k micro-batches; returns the step's mean loss (all processes)."""
        task = self.setup.task
        # one all-reduce for both counts: loss units (normalisation) and examples (throughput)
        local = torch.stack([sum(task.units(b).sum() for b in group).float(),
                             torch.tensor(float(sum(task.batch_size(b) for b in group)), device=self.acc.device)])
        units, samples = self.acc.reduce(local, reduction="sum")
        scale = self.acc.num_processes / units.clamp(min=1)
        summed = torch.zeros((), device=self.acc.device)
        for i, batch in enumerate(group):
            sync = nullcontext() if i == len(group) - 1 else self.acc.no_sync(self.model)
            with sync:
                loss_sum = task.loss(self.model(**task.model_inputs(batch)), batch).sum()
                self.acc.backward(loss_sum * scale)
            summed += loss_sum.detach()
        loss_t = self.acc.reduce(summed, reduction="sum") / units
        grad_norm = None
        if self.cfg.max_grad_norm:  # clipping a non-finite gradient is harmless: the step is skipped
            grad_norm = self.acc.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        # one host sync per step, for the three numbers the non-finite guard and the log need
        norm_t = grad_norm if grad_norm is not None else torch.zeros((), device=loss_t.device)
        loss, norm, n = torch.stack([loss_t.float(), norm_t.float(), samples.float()]).tolist()
        if math.isfinite(loss) and not math.isfinite(norm) and self.acc.scaler is not None:
            # fp16: an overflowing gradient is the loss scaler's business; its step skips the
            # update and lowers the scale, as in Trainer. No optimizer step is counted.
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return loss
        if not math.isfinite(loss) or not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return self._nonfinite(loss)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.samples += int(n)
        self._grad_norm = None if grad_norm is None else norm
        return loss

    def _nonfinite(self, loss: float) -> float:
        """Skip the batch while train.skip_nonfinite allows; else stop, keeping the last good
        checkpoint (the run stays unfinished, so nothing NaN is saved or reported)."""
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        if self.state.skipped_nonfinite < self.cfg.skip_nonfinite:
            self.state.skipped_nonfinite += 1
            tqdm.write(f"step {self.state.step + 1}: non-finite {what}; batch skipped "
                       f"({self.state.skipped_nonfinite} of train.skip_nonfinite={self.cfg.skip_nonfinite})")
            return float("nan")
        raise UserError(f"step {self.state.step + 1}: the {what} is not finite ({loss}); stopped, "
                        "keeping the last good checkpoint (lower train.lr, or allow "
                        "train.skip_nonfinite: N)")

    def _after_step(self, loss: float) -> bool:
        """Log, evaluate on schedule; True when early stopping says stop."""
        s = self.state
        if self.acc.is_main_process and (s.step % self.cfg.log_every == 0 or s.step == 1):
            entry = {"step": s.step, "epoch": s.epoch, "loss": loss, "lr": self.scheduler.get_last_lr()[0],
                     "grad_norm": self._grad_norm, "samples_per_second": s.samples / max(s.train_time, 1e-9)}
            runs.append_log(self.out, entry)
            tracking.log(self.acc, {"train": entry}, s.step)
        if self.cfg.eval_every and s.step % self.cfg.eval_every == 0:
            self._eval_and_save()
            return self._stopping(None)
        if self.cfg.save_every and s.step % self.cfg.save_every == 0:
            self.save()
        return False

    def _eval_and_save(self) -> None:
        start = time.perf_counter()
        metrics = evaluation.evaluate(self.model, self.evals, self.setup.task, self.acc, self.setup.raw_evals,
                                      sink=self.setup.predictions, orders=self.eval_orders)
        runtime = time.perf_counter() - start  # generation tasks: eval speed is generation speed
        self.state.eval_runtime_s = runtime
        self.state.last_eval = {"step": self.state.step, **metrics}
        self._keep_if_best(metrics)
        if self.acc.is_main_process:
            runs.append_log(self.out, {"step": self.state.step, "epoch": self.state.epoch, "eval": metrics,
                                       "eval_runtime_s": runtime})
            tracking.log(self.acc, {"eval": metrics}, self.state.step)
            tqdm.write(f"step {self.state.step}: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        self.save()


def _lean_weights(models_: list, weights: list, output_dir: str) -> None:
    """accelerate's save_state hook: a checkpoint holds what trains (and the buffers), not the
    frozen base a LoRA, adapter or prompt run leaves untouched; full fine-tuning keeps it all."""
    for model, state in zip(models_, weights):
        keep = {n for n, p in model.named_parameters() if p.requires_grad}
        keep |= {n for n, _ in model.named_buffers()}
        if len(keep) < len(state):
            for name in [k for k in state if k not in keep]:
                del state[name]


def _check_strategy(got: str) -> None:
    """A launch asked for FSDP or DeepSpeed that accelerate did not set up (it enables them on
    GPUs only): refused rather than run as plain data parallel under the strategy's name."""
    for env, kind in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DEEPSPEED")):
        if os.environ.get(env, "false").lower() == "true" and got != kind:
            raise UserError(f"STRATEGY: this launch asks for {kind}, which accelerate runs on GPUs "
                            f"only; here it would run as {got}. Use "
                            "STRATEGY=ddp (or NPROC without STRATEGY) on a machine without GPUs")


def improves(metric: Any, value: float, loss: float | None, best: float | None,
             best_loss: float | None) -> bool:
    """A better score, or the same score at a lower eval loss: on a small eval split the first
    evaluation often ties the last on accuracy while the model is far from trained."""
    if metric.better(value, best):
        return True
    return value == best and loss is not None and (best_loss is None or loss < best_loss)


def _load_best(model: torch.nn.Module, folder: Path, device: torch.device) -> None:
    """The weights accelerate's save_state wrote at the best step, into the prepared model (tied
    copies are left out of that file, hence strict=False; anything unexpected is a bug)."""
    from accelerate.utils import SAFE_WEIGHTS_NAME
    from safetensors.torch import load_file

    result = model.load_state_dict(load_file(folder / SAFE_WEIGHTS_NAME, device=str(device)), strict=False)
    if result.unexpected_keys:
        raise RuntimeError(f"{folder}: weights the model does not have: {result.unexpected_keys[:3]}")


def reset_peak_memory(device: torch.device) -> None:
    """Forget the peak so far, so each run of a sweep (one process) reports its own. CUDA: the
    allocator's peak. CPU: the process's peak RSS (VmHWM), reset by writing 5 to
    /proc/self/clear_refs (Linux >= 4.0); elsewhere the peak stays the process's."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _proc_status_mb(key: str) -> float | None:
    """VmRSS / VmHWM of this process from /proc (Linux), in MiB; None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _peak_memory_mb(device: torch.device) -> float:
    """CUDA: max allocated since the last reset. CPU: peak process RSS since the last reset
    (VmHWM; getrusage's ru_maxrss where /proc is missing: it cannot be reset)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    hwm = _proc_status_mb("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _finish(recipe: Recipe, setup: Setup, acc: Accelerator, out: Path, state: State,
            model: torch.nn.Module | None = None, evaluate_only: bool = False,
            evals: dict[str, DataLoader] | None = None, orders: dict[str, list[int]] | None = None) -> dict:
    """Final evaluation (of the best model when kept), the saved model, then metrics.json."""
    import peft
    import transformers

    if evaluate_only:
        model = acc.prepare_model(setup.model, evaluation_mode=True)  # no DDP: nothing trains
        metrics = recipe.method.evaluate(model, setup, acc)
    else:
        unwrapped = acc.unwrap_model(model)
        acc.wait_for_everyone()
        if recipe.train.keep_best and state.best_step is not None and state.best_step != state.step:
            _load_best(model, out / "checkpoints" / runs.step_name(state.best_step), acc.device)
            metrics = evaluation.evaluate(model, evals or {}, setup.task, acc, setup.raw_evals,
                                          sink=setup.predictions, orders=orders)
        else:
            metrics = {k: v for k, v in (state.last_eval or {}).items() if k != "step"}
        if acc.is_main_process:
            recipe.method.save(unwrapped, out / "model")
            attention.save(unwrapped, out / "model", recipe.model.attention)  # PEFT saves adapters only
            setup.tokenizer.save_pretrained(out / "model")
            if not recipe.smoke:  # a smoke run's base is the small random model: its path is its name
                models.make_portable(out / "model", chain.source(recipe))
    result = {
        "eval": metrics,
        "trainable_params": setup.trainable, "total_params": setup.total,
        "trainable_percent": 100.0 * setup.trainable / max(setup.total, 1),
        "train_runtime_s": state.train_time,
        "train_samples_per_second": state.samples / state.train_time if state.train_time else 0.0,
        "eval_runtime_s": state.eval_runtime_s,
        "eval_samples_per_second": (sum(len(v) for v in setup.raw_evals.values()) / state.eval_runtime_s
                                    if state.eval_runtime_s else 0.0),
        "train_steps": state.step, "train_samples": len(setup.train) if setup.train is not None and recipe.method.trains else 0,
        "best_step": state.best_step, "skipped_nonfinite": state.skipped_nonfinite,
        "kept": ({"step": state.best_step, "on": recipe.train.metric or setup.task.main_metric(),
                  "value": state.best_metric, "eval_loss": state.best_loss, "ties": "lower eval loss"}
                 if recipe.train.keep_best and state.best_step is not None else
                 {"step": state.step, "on": "the last step (train.keep_best is false or nothing was evaluated)"}),
        "main_metric": setup.task.main_metric(),
        # the classes read from the user's files (task.labels: null): an adapter folder has no
        # config.json to hold them, and eval/predict/export rebuild the head from these
        "label_names": getattr(setup.task, "label_names", None),
        "text_columns": getattr(setup.task, "text_columns", None),  # likewise when read from the header
        "metric_declarations": {k: setup.task.declaration(k).as_dict() for k in metrics},
        "peak_memory_mb": state.peak_memory_mb or _peak_memory_mb(acc.device),
        "recipe_hash": recipe.hash, "run_id": out.name, "seed": recipe.train.seed, "method": recipe.method.name,
        "num_processes": acc.num_processes, "distributed_type": str(acc.distributed_type.value),
        "device": str(acc.device), "mixed_precision": recipe.train.mixed_precision,
        **provenance.describe(acc.device),  # device_name, gpu, cpu, cpu_cores, git_commit, git_dirty
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__, "python": platform.python_version()},
    }
    if setup.task.metric_info():  # strings beside the float metrics (sacreBLEU's signature)
        result["metric_info"] = setup.task.metric_info()
    if acc.is_main_process:
        for suffix, rows in setup.predictions.items():
            runs.write_jsonl(out / f"predictions{suffix}.jsonl", rows)
        runs.write_json(out / "metrics.json", result)
        if not recipe.train.keep_checkpoints:  # the run is whole: model/ is what it leaves
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
    acc.wait_for_everyone()
    for tracker in acc.trackers:  # flushed and closed; not end_training(): it ends the process group
        tracker.finish()
    return result
