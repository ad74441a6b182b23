"""Section trainer: the toolkit's loop against transformers' Trainer on the same model, data,
batch, learning rate and schedule (and section methods: the loop per adaptation method)."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import torch

from toolkit import models, recipe as recipes, train
from toolkit.tasks.glue import Glue

from bench.common import (LR, METHODS, SEED, WARMUP_RATIO, WEIGHT_DECAY, compile_caches, cuda, peak_memory_mb,
                          ratio, reset_peak_memory, run_row, sync, table)


def glue_task(args: argparse.Namespace) -> Glue:
    """SST-2 with the bench's training subset (steps x batch examples, the same seeded subset for
    every row) and dev set (all 872, or --eval-samples of them)."""
    return Glue(subset="sst2", max_length=args.max_length, max_train_samples=args.steps * args.batch_size,
                max_eval_samples=args.eval_samples)


class CountingCollator:
    """A collator that also counts what it hands the model: examples, positions (batch x padded
    width) and real tokens (attention mask). Rows that train on the same examples in another
    order or padding do different work; these counts say how much. `use_epoch` is what the
    toolkit's loop calls on its training loader's collator only, which marks that one."""

    def __init__(self, collate: Callable) -> None:
        self.collate, self.training = collate, False
        self.examples = self.positions = self.tokens = 0
        self.shapes: set[tuple[int, ...]] = set()

    def __call__(self, features: list) -> Any:
        batch = self.collate(features)
        ids = batch["input_ids"]
        self.shapes.add(tuple(ids.shape))
        self.examples += ids.shape[0]
        self.positions += ids.numel()
        self.tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else ids.numel()
        return batch

    def use_epoch(self, epoch: int) -> None:
        self.training = True
        getattr(self.collate, "use_epoch", lambda _: None)(epoch)

    def per_example(self) -> dict:
        n = max(self.examples, 1)
        return {"train_positions_per_example": self.positions / n, "train_tokens_per_example": self.tokens / n,
                "padding_overhead": self.positions / max(self.tokens, 1) - 1.0, "train_shapes": len(self.shapes)}


def count_toolkit_collators() -> list[CountingCollator]:
    """Wrap every collator the GLUE task builds from now on (in this process) in a CountingCollator,
    and the training collator once more outside the loop's bucket padding (what the model is fed):
    the last one made that the loop calls `use_epoch` on is that one."""
    from toolkit import batching

    made: list[CountingCollator] = []
    original, bucketed = Glue.collator, batching.bucketed

    def collator(self: Glue, tokenizer: Any, model: Any = None) -> CountingCollator:
        made.append(CountingCollator(original(self, tokenizer, model)))
        return made[-1]

    def fed_collator(*args: Any, **kwargs: Any) -> CountingCollator:
        made.append(CountingCollator(bucketed(*args, **kwargs)))
        return made[-1]

    Glue.collator, batching.bucketed = collator, fed_collator
    return made


def seed(args: argparse.Namespace) -> int:
    """The run's train.seed (--seed; 42 unless given): the head's initialisation, the data order and
    the dropout masks; the training subset and dev set stay the same for every seed."""
    return SEED if getattr(args, "seed", None) is None else args.seed


def warmup_steps(args: argparse.Namespace) -> int:
    """The linear schedule's warm-up, in steps, given to the toolkit and Trainer alike."""
    return math.ceil(WARMUP_RATIO * args.steps)


def toolkit_recipe(args: argparse.Namespace, checkpoint: str, method: str = "full",
                   train_overrides: dict | None = None) -> Any:
    """The recipe of row (a): the bench's data, batch, lr and schedule; one evaluation at the end."""
    raw = {"model": {"checkpoint": checkpoint, "attention": args.attention},
           "task": {"name": "glue", "subset": "sst2", "max_length": args.max_length,
                    "max_train_samples": args.steps * args.batch_size, "max_eval_samples": args.eval_samples},
           "method": {"name": method, **METHODS[method]},
           "train": {"epochs": 1, "max_steps": args.steps, "batch_size": args.batch_size,
                     "eval_batch_size": args.eval_batch_size, "lr": LR, "weight_decay": WEIGHT_DECAY,
                     "warmup_steps": warmup_steps(args), "seed": seed(args),
                     "mixed_precision": args.precision, "keep_best": False, "eval_every": 0}}
    if args.group_by_length is not None:  # else the toolkit's default
        raw["train"]["group_by_length"] = args.group_by_length
    for key, value in speed_settings(args).items():
        raw["train"][key] = value
    raw["train"].update(train_overrides or {})
    return recipes.parse(raw, name=f"bench/{method}")


def speed_settings(args: argparse.Namespace) -> dict:
    """The toolkit's few-shapes, compile (step and optimizer) and precision-mode settings the bench
    was given (else its defaults)."""
    out: dict[str, Any] = {}
    if getattr(args, "compile", None) is not None:
        out["compile"] = {"true": True, "false": False}.get(args.compile, args.compile)
    if getattr(args, "compile_optimizer", None) is not None:
        out["compile_optimizer"] = {"true": True, "false": False}.get(args.compile_optimizer, args.compile_optimizer)
    if getattr(args, "precision_mode", None) is not None:
        out["precision_mode"] = args.precision_mode
    if getattr(args, "pad_multiple", None) is not None:
        out["pad_multiple"] = args.pad_multiple
    if getattr(args, "length_buckets", None):
        out["length_buckets"] = [int(v) for v in str(args.length_buckets).split(",")]
    return out


def step_compilations() -> int | None:
    """Compiled variants of the loop's step in this process: the guarded cache entries dynamo
    keeps on its code object (a second count beside `compiling.graph_count`, which the first GPU
    check read as 0 for an fp32 row that ran compiled at twice the eager speed)."""
    from torch._dynamo import eval_frame

    entries = getattr(eval_frame, "_debug_get_cache_entry_list", None)  # private: None where a torch lacks it
    return len(entries(train.Loop._forward_loss.__code__)) if entries else None


class StepProfile:
    """Where the loop's steady steps spend their time: `count` optimizer steps from `start` on,
    each step's wall time (entry to entry: the batch's fetch and collation included), the host
    time inside `Loop.step`, and the device's busy time (the profiled kernels' own time; on a CPU
    the ops' self time). Wall far above the device's busy time: the step waits on the host, and
    `host_parts_ms` says where: the forward call (compiled: guards and graph replay), autograd's
    backward, the loss-unit count, clipping, and the rest (optimizer, schedule, tally), with the
    batch's fetch as wall less the step. Patches `train.Loop` while in use; read `result` after.

    The profiled steps are slower than the others (the profiler records every kernel, and reading
    its events back takes seconds in an eager run), so they are kept out of the row's rates:
    `span` is the wall time from the profiler's start to its end, `steps` the steps inside it,
    and the events are read only after the run (`__exit__`). Left in, 10 profiled steps of a
    60-step MiniLM run on a CPU took its steady rate from 80-103 to 49-50 samples/s, and the second
    GPU check's rates (2026-11-27) were halved by them."""

    PARTS = ("_forward", "_backward", "_counts", "_clip_grads")  # Loop methods timed (_backward calls _forward)

    def __init__(self, start: int, count: int, trace: bool = True) -> None:
        """`trace=False`: the parts timed, the profiler off (the device's busy time is then not
        measured: on a CPU the profiler's per-op recording would dominate a tiny model's step)."""
        self.start, self.count, self.result, self.trace = start, count, {}, trace
        self.entries: list[float] = []
        self.host = 0.0
        self.parts = dict.fromkeys(self.PARTS, 0.0)
        self.prof: Any = None
        self.originals: dict[str, Any] = {}
        self.span, self.steps, self.began = 0.0, 0, 0.0  # the profiled steps' wall, count, start

    def _timed(self, name: str) -> Any:
        original, me = getattr(train.Loop, name), self

        def timed(loop: Any, *args: Any) -> Any:
            if me.prof is None or me.steps:
                return original(loop, *args)
            begin = time.perf_counter()
            try:
                return original(loop, *args)
            finally:
                me.parts[name] += time.perf_counter() - begin

        return timed

    def __enter__(self) -> StepProfile:
        from torch.profiler import ProfilerActivity, profile

        original, me = train.Loop.step, self
        self.original = original
        if self.count <= 0:
            return self

        def step(loop: Any, group: list[dict]) -> None:
            done = loop.state.step
            if done == me.start and me.prof is None:
                me.began = time.perf_counter()
                sync()
                me.prof = (profile(activities=[ProfilerActivity.CUDA] if cuda() else [ProfilerActivity.CPU])
                           if me.trace else nullcontext())
                me.prof.__enter__()
            tracing = me.prof is not None and not me.steps
            if tracing:
                me.entries.append(time.perf_counter())
            begin = time.perf_counter()
            original(loop, group)
            if tracing:
                me.host += time.perf_counter() - begin
                if loop.state.step >= me.start + me.count:
                    sync()
                    me.entries.append(time.perf_counter())
                    me.prof.__exit__(None, None, None)
                    me.steps = len(me.entries) - 1
                    me.span = time.perf_counter() - me.began

        self.originals = {name: getattr(train.Loop, name) for name in self.PARTS}
        for name in self.PARTS:
            setattr(train.Loop, name, self._timed(name))
        train.Loop.step = step
        return self

    def _summarise(self, steps: int) -> None:
        events = self.prof.key_averages() if self.trace else []
        busy = sum((e.self_device_time_total if cuda() else e.self_cpu_time_total) for e in events) / 1e6
        wall = self.entries[-1] - self.entries[0]
        ms = {name: 1000 * value / steps for name, value in self.parts.items()}
        host = 1000 * self.host / steps
        parts = {"fetch and collate": 1000 * wall / steps - host, "loss units": ms["_counts"],
                 "forward call": ms["_forward"], "backward": ms["_backward"] - ms["_forward"], "clip": ms["_clip_grads"],
                 "optimizer, schedule, tally": host - ms["_counts"] - ms["_backward"] - ms["_clip_grads"]}
        self.result = {"steps": steps, "wall_ms": 1000 * wall / steps, "host_in_step_ms": host,
                       "device_busy_ms": 1000 * busy / steps if self.trace else None, "host_parts_ms": parts}

    def __exit__(self, *exc: Any) -> None:
        if self.steps:
            self._summarise(self.steps)
        train.Loop.step = self.original
        for name, original in self.originals.items():
            setattr(train.Loop, name, original)


class CudagraphSkips:
    """CUDA graph recordings Inductor declined while in use (`mode="reduce-overhead"` compiles
    the step and then runs it without graphs, with a warning nobody sees in a row's captured
    output): torch's own counter and each distinct reason. The second GPU checks found the
    compiled step's forward and backward calls at 2-6 ms of host time, which a replayed graph
    would not take; this says whether the graphs ran."""

    def __init__(self) -> None:
        self.count, self.reasons = 0, []

    def __enter__(self) -> CudagraphSkips:
        import logging

        from torch._dynamo.utils import counters

        me = self

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                text = record.getMessage()
                if text.startswith("skipping cudagraphs") and text not in me.reasons:
                    me.reasons.append(text)

        self.counters, self.before = counters, counters["inductor"]["cudagraph_skips"]
        # Inductor's package logger: the skip is said by a logger below it (torch 2.13's
        # `cudagraphs` artifact, older ones' perf hints), whichever the GPU image's torch has
        self.logger, self.handler = logging.getLogger("torch._inductor"), Keep()
        self.logger.addHandler(self.handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.logger.removeHandler(self.handler)
        self.count = self.counters["inductor"]["cudagraph_skips"] - self.before


def toolkit_row(args: argparse.Namespace, checkpoint: str, out: Path, method: str = "full",
                train_overrides: dict | None = None) -> dict:
    """Row (a): `train.run`, the same function `toolkit run` calls. Train samples/s is the
    toolkit's own (examples / summed step time, batch fetching included); eval samples/s is dev
    examples / the `eval_runtime_s` that `_eval_and_save` logs to log.jsonl."""
    from toolkit import compiling

    recipe = toolkit_recipe(args, checkpoint, method, train_overrides)
    collators = count_toolkit_collators()
    graphs, variants, caches = compiling.graph_count(), step_compilations(), compile_caches()
    with StepProfile(max(1, (3 * args.steps) // 5), getattr(args, "profile_steps", 0)) as profiled, \
            CudagraphSkips() as skipped:  # steady steps profiled; CUDA graphs declined, and why
        metrics = train.run(recipes.RunPlan(recipe), out)
    training = [c for c in collators if c.training]  # none if the loop stops calling use_epoch
    counts = {**training[-1].per_example(), "compiled_graphs": compiling.graph_count() - graphs,
              "step_compilations": None if variants is None else step_compilations() - variants} if training else {}
    logged = list(map(json.loads, (out / "log.jsonl").read_text().splitlines()))
    evals = [e for e in logged if "eval_runtime_s" in e]
    n_eval = len(glue_task(args).load()["eval"][""])
    return {"row": "a", "tool": "toolkit", "method": method, "padding": "dynamic", "precision": args.precision,
            "compile": recipe.train.compile, **speed_settings(args),
            "train_batch": args.batch_size, "eval_batch": train.eval_batch_size(recipe),
            "train_samples_per_s": without_profile(metrics, args.batch_size, profiled),
            "eval_samples_per_s": n_eval / evals[-1]["eval_runtime_s"], "eval_examples": n_eval,
            "peak_mb": metrics["peak_memory_mb"], "accuracy": metrics["eval"]["accuracy"],
            "trainable": metrics["trainable_params"], "steps": metrics["train_steps"],
            "steady_samples_per_s": steady_rate(logged, args.batch_size, profiled), **counts,
            "cudagraph_skips": skipped.count, "cudagraph_skip_reasons": skipped.reasons,
            "compile_cache": compile_caches(caches),
            **({"step_profile": profiled.result} if profiled.result else {})}


def without_profile(metrics: dict, batch: int, profiled: StepProfile) -> float:
    """The run's train samples/s (the loop's own: examples / summed step time) less the profiled
    steps and their time (`StepProfile`)."""
    rate = metrics["train_samples_per_second"]
    if not profiled.steps:
        return rate
    samples = metrics["train_steps"] * batch
    seconds = samples / rate - profiled.span
    return (samples - profiled.steps * batch) / seconds if seconds > 0 else rate


def steady_rate(logged: list[dict], batch: int, profiled: StepProfile | None = None) -> float | None:
    """Train samples/s between the logged step nearest a fifth of the run and the last one: the
    rate once compilation and warm-up are over (train_samples_per_second counts them), less the
    profiled steps and their time where they fall inside."""
    points = [(e["step"], e["step"] * batch / e["samples_per_second"])
              for e in logged if e.get("samples_per_second")]
    if len(points) < 3:
        return None
    first = points[max(1, len(points) // 5)]
    steps, seconds = points[-1][0] - first[0], points[-1][1] - first[1]
    if profiled is not None and profiled.steps and profiled.start >= first[0]:
        steps, seconds = steps - profiled.steps, seconds - profiled.span
    return steps * batch / seconds if seconds > 0 and steps > 0 else None


def padded_encode(task: Glue, dataset: Any, tokenizer: Any, max_length: int) -> Any:
    """run_glue.py's default encoding: every example padded (and truncated) to max_length."""
    cols = task.text_columns

    def tok(batch: dict) -> dict:
        out = tokenizer(*[batch[c] for c in cols], padding="max_length", max_length=max_length, truncation=True)
        out["labels"] = batch["label"]
        return out

    return dataset.map(tok, batched=True, remove_columns=dataset.column_names)


def trainer_data(task: Glue, tokenizer: Any, padded: bool) -> tuple[Any, Any, Any]:
    """(train, dev, collator) for row (c) when padded, else row (b): the toolkit's own encoding
    (truncation only) batched by the task's DataCollatorWithPadding."""
    from transformers import default_data_collator

    raw = task.load()
    if padded:
        return (padded_encode(task, raw["train"], tokenizer, task.max_length),
                padded_encode(task, raw["eval"][""], tokenizer, task.max_length), default_data_collator)
    return task.encode(raw["train"], tokenizer), task.encode(raw["eval"][""], tokenizer), task.collator(tokenizer)


def trainer_arguments(args: argparse.Namespace, out: Path) -> Any:
    """Trainer's defaults (fused AdamW, linear schedule, random sampler, eval batch 8, grad-norm
    clip 1.0) with the bench's batch, steps, lr, weight decay, warm-up and seed."""
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(out), per_device_train_batch_size=args.batch_size,
                             per_device_eval_batch_size=args.trainer_eval_batch_size, max_steps=args.steps,
                             learning_rate=LR, weight_decay=WEIGHT_DECAY, warmup_steps=warmup_steps(args),
                             lr_scheduler_type="linear", seed=seed(args), save_strategy="no", eval_strategy="no",
                             report_to=[], bf16=args.precision == "bf16", fp16=args.precision == "fp16",
                             use_cpu=not cuda())


def accuracy(prediction: Any) -> dict:
    import numpy as np

    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


def trainer_row(args: argparse.Namespace, checkpoint: str, out: Path, padded: bool) -> dict:
    """Rows (b) and (c): Trainer.train(), then Trainer.evaluate() on the dev set. Samples/s are
    Trainer's own (train: examples / the training loop's wall time; eval: examples / evaluate's).
    The head is initialised from the same seed as the toolkit's (set_seed before loading)."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import set_seed
    from transformers import Trainer

    task = glue_task(args)
    set_seed(seed(args))
    model, tok = models.load(checkpoint, "sequence-classification", task.head_kwargs(), args.attention)
    train_set, dev, collator = trainer_data(task, tok, padded)
    collator = CountingCollator(collator)
    AcceleratorState._reset_state()  # the warm-up's accelerate state is not Trainer's
    trainer = Trainer(model=model, args=trainer_arguments(args, out), train_dataset=train_set, eval_dataset=dev,
                      data_collator=collator, compute_metrics=accuracy)
    result = trainer.train()
    counts = collator.per_example()
    evaluated = trainer.evaluate()
    return {"row": "c" if padded else "b", "tool": "transformers Trainer", "method": "full",
            "padding": f"max_length {args.max_length}" if padded else "dynamic",
            "train_batch": args.batch_size, "eval_batch": args.trainer_eval_batch_size,
            "train_samples_per_s": result.metrics["train_samples_per_second"],
            "eval_samples_per_s": evaluated["eval_samples_per_second"], "eval_examples": len(dev),
            "peak_mb": peak_memory_mb(), "accuracy": evaluated["eval_accuracy"],
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad), "steps": result.global_step,
            **counts}


def eval_row(args: argparse.Namespace, checkpoint: str) -> dict:
    """Evaluation speed, the toolkit's against Trainer's, interleaved in this one process on one
    model: the toolkit's evaluation as its loop runs it (train.eval_loaders: longest first at
    its eval batch, accelerate-prepared, evaluation.evaluate) and Trainer.evaluate() with row
    (b)'s data and collator at per_device_eval_batch_size; each `--eval-repeats` times,
    alternating, after one untimed pass of each. The rows above measure evaluation in separate
    processes minutes apart, where this VM's speed drifts; here both see the same minutes."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import set_seed
    from transformers import Trainer

    from toolkit import evaluation

    recipe = toolkit_recipe(args, checkpoint)
    set_seed(SEED)
    setup = train.build(recipes.RunPlan(recipe))
    AcceleratorState._reset_state()
    acc = Accelerator(cpu=not cuda())
    model = acc.prepare_model(setup.model, evaluation_mode=True)
    loaders, orders = train.eval_loaders(recipe, setup)
    loaders = {k: acc.prepare(v) for k, v in loaders.items()}
    task = glue_task(args)
    dev = task.encode(task.load()["eval"][""], setup.tokenizer)
    out = tempfile.TemporaryDirectory()  # Trainer's output_dir; it writes nothing there (save_strategy no)
    trainer = Trainer(model=setup.model, args=trainer_arguments(args, Path(out.name)), eval_dataset=dev,
                      data_collator=task.collator(setup.tokenizer), compute_metrics=accuracy)

    def toolkit_eval() -> float:
        sync()
        start = time.perf_counter()
        evaluation.evaluate(model, loaders, setup.task, acc, setup.raw_evals, orders=orders)
        sync()
        return len(dev) / (time.perf_counter() - start)

    def trainer_eval() -> float:
        return trainer.evaluate()["eval_samples_per_second"]

    toolkit_eval(), trainer_eval()
    ours, theirs = [], []
    for _ in range(args.eval_repeats):
        ours.append(toolkit_eval())
        theirs.append(trainer_eval())
    out.cleanup()
    return {"eval_examples": len(dev), "repeats": args.eval_repeats, "eval_batch": train.eval_batch_size(recipe),
            "trainer_eval_batch": args.trainer_eval_batch_size,
            "toolkit_samples_per_s": statistics.median(ours), "trainer_samples_per_s": statistics.median(theirs),
            "toolkit_all": ours, "trainer_all": theirs}


def warm_up(args: argparse.Namespace, checkpoint: str, folder: Path) -> None:
    """The same untimed warm-up before every trainer row: a short toolkit run of the same model
    and batch (kernels, allocator, tokenizer and data caches), then the peak is reset. Eager
    always, the step and the optimizer alike: a compiled row's compilation is part of its run (its
    whole-run rate counts it, its steady rate does not), and compiling twice per row cost the first
    GPU check ~40 s a row. (The warm-up of the train.compile_optimizer row compiled its optimizer
    step, whose guards the measured run's optimizer then passed: that compilation was paid in the
    warm-up and missing from the row's whole-run rate; torch's counters on a CPU, 2026-11-28.)"""
    import gc

    warm = argparse.Namespace(**{**vars(args), "steps": min(args.steps, 10), "eval_samples": 64, "compile": "false",
                                 "compile_optimizer": "false"})
    train.run(recipes.RunPlan(toolkit_recipe(warm, checkpoint)), folder)
    gc.collect()
    if cuda():
        torch.cuda.empty_cache()
    reset_peak_memory()


def fed(row: dict) -> str:
    """Mean positions per training example (padded width) and, in brackets, real tokens; then
    the padded-token overhead (positions over real tokens, less 1)."""
    if "train_positions_per_example" not in row:
        return "n/a"
    return (f"{row['train_positions_per_example']:.1f} ({row['train_tokens_per_example']:.1f}), "
            f"+{100 * row['padding_overhead']:.0f}% padding")


def trainer_table(args: argparse.Namespace, rows: list[dict]) -> str:
    """Rows (a), (b), (c) and the toolkit's train and eval speed over each row's."""
    a = rows[0]
    names = {"a": "(a) toolkit", "b": "(b) Trainer, dynamic padding", "c": f"(c) Trainer, padded to {args.max_length}"}
    body = [[names[r["row"]], r["train_batch"], r["eval_batch"], fed(r), f"{r['train_samples_per_s']:.1f}",
             f"{r['eval_samples_per_s']:.1f}", f"{r['peak_mb']:.0f}", f"{100 * r['accuracy']:.2f}",
             ratio(a["train_samples_per_s"], r["train_samples_per_s"]),
             ratio(a["eval_samples_per_s"], r["eval_samples_per_s"])] for r in rows]
    memory = "max allocated (CUDA)" if cuda() else "peak process RSS after the warm-up"
    return table(["row", "train batch", "eval batch", "train tokens/example: fed (real)", "train samples/s", "eval samples/s", f"peak MB ({memory})",
                  "dev accuracy %", "(a) ÷ row, train", "(a) ÷ row, eval"], body)


def trainer_settings(args: argparse.Namespace) -> str:
    """The settings every trainer row shares, and the toolkit's own knobs."""
    return (f"model {args.model_label}, SST-2 train subset {args.steps * args.batch_size} (seeded, same for "
            f"every row), dev {args.eval_samples or 872}, max_length {args.max_length}, {args.steps} steps of "
            f"batch {args.batch_size}, lr {LR}, linear schedule with {warmup_steps(args)} warm-up steps, "
            f"weight decay {WEIGHT_DECAY}, seed {seed(args)}, fused AdamW, attention {args.attention}; "
            f"toolkit: train.group_by_length="
            f"{'default (true)' if args.group_by_length is None else args.group_by_length}, train.eval_batch_size="
            f"{args.eval_batch_size or f'unset (= 2 x batch_size = {2 * args.batch_size})'}, evaluation longest "
            "first; Trainer: "
            f"per_device_eval_batch_size={args.trainer_eval_batch_size} (its default 8), other defaults; "
            "one process per row, each after the same warm-up (a short toolkit run)")


def section_trainer(args: argparse.Namespace, checkpoint: str) -> tuple[list[dict], str]:
    rows = [run_row(kind, checkpoint) for kind in ("toolkit", "trainer-dynamic", "trainer-padded")]
    ev = run_row("eval", checkpoint)
    rows[0]["eval_interleaved"] = ev
    evaluation_table = table(
        ["", "eval batch", "samples/s (median)", "each pass"],
        [["toolkit", ev["eval_batch"], f"{ev['toolkit_samples_per_s']:.1f}", ", ".join(f"{x:.0f}" for x in ev["toolkit_all"])],
         ["Trainer.evaluate()", ev["trainer_eval_batch"], f"{ev['trainer_samples_per_s']:.1f}",
          ", ".join(f"{x:.0f}" for x in ev["trainer_all"])],
         ["toolkit ÷ Trainer", "", f"**{ratio(ev['toolkit_samples_per_s'], ev['trainer_samples_per_s'])}**", ""]])
    text = (f"### Toolkit vs Trainer\n\n{trainer_settings(args)}\n\n{trainer_table(args, rows)}\n\n"
            "Train tokens/example: positions per training example the model was fed (batch x padded width), "
            "real tokens in brackets; rows that pad each batch to its longest example differ by the order of "
            "the examples only. Train samples/s: each tool's own figure (toolkit: examples / summed step time; "
            "Trainer: train_samples_per_second). Eval samples/s: dev examples / evaluation wall time "
            "(toolkit: eval_runtime_s in log.jsonl; Trainer: evaluate()'s eval_samples_per_second).\n\n"
            f"**Evaluation, interleaved in one process** (one model, the dev set above, {ev['repeats']} passes each, "
            "toolkit and Trainer alternating after one untimed pass of each; this VM's speed drifts between the "
            f"minutes the rows above ran in):\n\n{evaluation_table}")
    return rows, text


def section_methods(args: argparse.Namespace, checkpoint: str) -> tuple[list[dict], str]:
    rows = [run_row(f"method:{m}", checkpoint) for m in args.methods]
    base = rows[0]["train_samples_per_s"]
    body = [[r["method"], f"{r['train_samples_per_s']:.1f}", ratio(r["train_samples_per_s"], base),
             f"{r['eval_samples_per_s']:.1f}", f"{r['trainable']:,}", f"{r['peak_mb']:.0f}",
             f"{100 * r['accuracy']:.2f}"] for r in rows]
    text = (f"### Toolkit methods\n\n{trainer_settings(args)}\n\n"
            + table(["method", "train samples/s", f"vs {rows[0]['method']}", "eval samples/s", "trainable",
                     "peak MB", "dev accuracy %"], body))
    return rows, text
