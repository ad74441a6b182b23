"""Speed and memory of the toolkit against transformers' Trainer, and of the machine it runs on.

Sections (`--sections`, default all four; each can run alone):

  trainer  the toolkit's loop against Trainer on the same model, data, batch, learning rate and
           schedule: (a) the toolkit, (b) Trainer with dynamic padding (the task's
           DataCollatorWithPadding, Trainer's default random sampler), (c) Trainer with every
           example padded to max_length, as run_glue.py does by default (padding="max_length",
           default_data_collator). Train and eval samples/s, peak memory, dev accuracy after the
           same steps, and the toolkit's speed over each Trainer row.
  matmul   the machine's measured matmul throughput (GFLOP/s) and the model-FLOPs utilisation of
           one full fine-tuning step on 32 x 128 real tokens.
  lora     LoRA against full fine-tuning on a random-weight roberta-base-shaped model: step time
           and peak memory, and their ratios.
  startup  wall time of `toolkit ls`, `toolkit validate` and a `--smoke` run, against targets.
  methods  (not in the default set) the toolkit's loop per adaptation method, same data and steps.

Every measured row runs in its own process (no row inherits another's warm kernels, caches or
memory) after the same warm-up; tables are Markdown under a header naming the device, torch
version, precision and date. `--json PATH` writes every row.

    python benchmarks/bench.py                                  # all sections, CPU-sized defaults
    python benchmarks/bench.py --sections trainer --steps 3 --eval-samples 64   # a quick check
    python benchmarks/bench.py --precision bf16 --steps 200 --lora-batch-size 32   # on a GPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from toolkit import batching, devices, models, provenance, recipe as recipes, train  # noqa: E402
from toolkit.tasks.glue import Glue  # noqa: E402

SECTIONS = ("trainer", "matmul", "lora", "startup")  # the default set, in the order they run
EXTRA_SECTIONS = ("methods", "levers")
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SIZES = {"minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
         "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)}
ROBERTA_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                    max_position_embeddings=514, type_vocab_size=1)
METHODS = {"full": {}, "freeze": {}, "lora": {"r": 8, "alpha": 16}, "bitfit": {}, "ia3": {},
           "adapters": {"config": "houlsby"}, "prompt_tuning": {"num_virtual_tokens": 20}}
# Shared by every trainer row: the demo recipe's optimiser settings, seed 42.
LR, WEIGHT_DECAY, WARMUP_RATIO, SEED = 1e-4, 0.01, 0.06, 42
STARTUP_RECIPE = "recipes/demo/sst2/minilm-full.yaml"
STARTUP = [  # (label, toolkit arguments, target seconds); {runs} is a fresh temporary folder
    ("toolkit ls", ["ls"], 2.0),
    (f"toolkit validate {STARTUP_RECIPE}", ["validate", STARTUP_RECIPE], 2.0),
    (f"toolkit run {STARTUP_RECIPE} --smoke", ["run", STARTUP_RECIPE, "--smoke", "--runs-dir", "{runs}", "--force"], 8.0),
]


# --- the device, memory and clocks ----------------------------------------------------------------
def cuda() -> bool:
    return torch.cuda.is_available()


def device() -> torch.device:
    return torch.device("cuda" if cuda() else "cpu")


def sync() -> None:
    """Wait for queued GPU work, so that a clock read after it counts that work."""
    if cuda():
        torch.cuda.synchronize()


def device_name() -> str:
    """The GPU's name, or the CPU's model name with the cores this process may use."""
    if cuda():
        return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    return f"{provenance.cpu_model()}, {provenance.cpu_cores()} cores, {torch.get_num_threads()} torch threads"


def header(args: argparse.Namespace) -> dict:
    """What every table is read against: device, software, precision, date."""
    import transformers

    return {"device": device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
            "precision": args.precision, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "git_commit": provenance.git_commit()}


def reset_peak_memory() -> None:
    """Forget the peak so far (the toolkit's own reset: CUDA allocator peak, CPU VmHWM), so a
    row's peak is not the warm-up's."""
    devices.reset_peak_memory(device())


def peak_memory_mb(_device: Any = None) -> float:
    """Peak since the last reset, as the toolkit reports it in metrics.json."""
    return devices.peak_memory_mb(device())


def current_memory_mb() -> float:
    """Memory in use now: CUDA memory_allocated, CPU process RSS (VmRSS)."""
    if cuda():
        return torch.cuda.memory_allocated() / 2**20
    rss = devices.proc_status_mb("VmRSS")
    return rss if rss is not None else 0.0


# --- models ---------------------------------------------------------------------------------------
def build_checkpoint(size: str, folder: Path) -> str:
    """A random-weight BERT of a named size with the real bert-base-uncased tokenizer (weights
    do not change speed; they do make dev accuracy meaningless)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(models.tokenizer_dir() / "bert-base-uncased")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), **SIZES[size])).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def roberta_base_random(num_labels: int = 2) -> tuple[torch.nn.Module, Any]:
    """roberta-base's shape (768 wide, 12 layers, 12 heads, 3072 FFN) with random weights, built
    from a config and the real roberta-base tokenizer; seeded, so every row builds the same model."""
    from transformers import AutoTokenizer, RobertaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(models.tokenizer_dir() / "roberta-base")
    torch.manual_seed(0)
    return RobertaForSequenceClassification(roberta_base_config(tok, num_labels)), tok


def roberta_base_config(tok: Any, num_labels: int = 2) -> Any:
    """roberta-base's config, its vocabulary and special tokens taken from the tokenizer."""
    from transformers import RobertaConfig

    return RobertaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, num_labels=num_labels, **ROBERTA_BASE)


def embedding_params(model: torch.nn.Module) -> int:
    """Parameters of the model's nn.Embedding tables (word, position, token type)."""
    return sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding)
               for p in m.parameters(recurse=False))


def non_embedding_params(model: torch.nn.Module) -> int:
    """Every parameter outside the embedding tables: what the 6N FLOPs-per-token rule counts
    (Kaplan et al. 2020). A lookup costs no matmul, so embeddings are left out; the pooler and
    head, which see one token per sequence, are counted (well under 2% of a MiniLM)."""
    return sum(p.numel() for p in model.parameters()) - embedding_params(model)


def mfu(non_embedding: int, tokens_per_s: float, flops_per_s: float) -> float:
    """Model-FLOPs utilisation: 6 FLOPs per non-embedding parameter per token (2 forward, 4
    backward) times tokens/s, over the measured matmul FLOP/s. Attention's own score and
    context matmuls (12 x layers x length x width per token) are left out, as in the 6N rule."""
    return 6.0 * non_embedding * tokens_per_s / flops_per_s


def random_batch(batch: int, length: int, vocab: int, num_labels: int = 2, seed: int = 0) -> dict:
    """Token ids drawn at random (ids >= 1000: no special or padding token), attention on every
    position, random labels: every token is real, nothing is padding."""
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(1000, vocab, (batch, length), generator=g),
            "attention_mask": torch.ones(batch, length, dtype=torch.long),
            "labels": torch.randint(0, num_labels, (batch,), generator=g)}


def training_step(model: torch.nn.Module, batch: dict, precision: str, fast_dropout: bool = True) -> Callable[[], None]:
    """One full optimizer step of `model` on `batch` (forward, backward, fused AdamW, as the
    toolkit's loop does, under accelerate's mixed precision), as a function. On CPU the dropouts
    are the toolkit's (toolkit.dropout, as `train.fast_dropout` defaults to) unless
    `fast_dropout` is false."""
    from accelerate import Accelerator

    from toolkit import dropout

    if fast_dropout:
        dropout.install(model, device())
    acc = Accelerator(mixed_precision=precision, cpu=not cuda())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, fused=True)
    model, optimizer = acc.prepare(model, optimizer)
    model.train()
    batch = {k: v.to(acc.device) for k, v in batch.items()}

    def step() -> None:
        acc.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def timed(step: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    step()
    sync()
    return time.perf_counter() - start


def time_training_steps(model: torch.nn.Module, batch: dict, precision: str, warmup: int,
                        steps: int, fast_dropout: bool = True, memory: dict | None = None) -> list[float]:
    """Seconds of each of `steps` `training_step`s after `warmup` untimed ones. With a `memory`
    dict, the timed steps' peak memory (`peak_mb`, as the toolkit reports it) goes into it, then
    one more step runs under the profiler (CPU) and its peak tensor memory (`peak_tensor_mb`)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    step = training_step(model, batch, precision, fast_dropout)
    for _ in range(warmup):
        step()
    times = [timed(step) for _ in range(steps)]
    if memory is not None:
        memory["peak_mb"] = peak_memory_mb()  # before the profiler, whose own records take memory
        memory["peak_tensor_mb"] = memory["peak_mb"] if cuda() else peak_tensor_mb(step)
    return times


def time_alternating(steps_: list[Callable[[], None]], warmup: int, steps: int) -> list[list[float]]:
    """Seconds of each step function's steps, taken in turn (a, b, a, b, ...) after `warmup`
    untimed rounds: both see the same minutes of a machine whose speed drifts."""
    for _ in range(warmup):
        for step in steps_:
            step()
    times: list[list[float]] = [[] for _ in steps_]
    for _ in range(steps):
        for i, step in enumerate(steps_):
            times[i].append(timed(step))
    return times


STEP_PARTS = {  # aten op names -> what they are, for the MFU's breakdown of one step's time
    "linear layers' matmuls (the 6N FLOPs)": ("aten::mm", "aten::addmm"),
    "attention's own matmuls (not in 6N; a GPU's fused sdpa kernel)": (
        "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash", "aten::_scaled_dot_product_efficient",
        "aten::_scaled_dot_product_cudnn", "aten::_flash_attention", "aten::_efficient_attention"),
    "dropout masks (random draws)": ("aten::bernoulli_", "aten::random_", "aten::uniform_", "aten::ge"),
    "optimizer (fused AdamW)": ("aten::_fused_adamw_",),
}


def step_breakdown(step: Callable[[], None]) -> dict[str, float]:
    """Seconds of one profiled `step()` per part (STEP_PARTS), the rest (elementwise, norms,
    softmax, copies, autograd) as "everything else". CPU: each op's self time. CUDA: kernel
    time, each part's being the device time under its aten ops (their kernels), the total every
    kernel's."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda() else [])]) as prof:
        step()
        sync()
    parts = dict.fromkeys(STEP_PARTS, 0.0)
    total = 0.0
    for event in prof.key_averages():
        total += (event.self_device_time_total if cuda() else event.self_cpu_time_total) / 1e6
        part = next((k for k, names in STEP_PARTS.items() if event.key.startswith(names)), None)
        if part is not None:
            parts[part] += (event.device_time_total if cuda() else event.self_cpu_time_total) / 1e6
    parts["everything else"] = max(total - sum(parts.values()), 0.0)
    return parts


def peak_tensor_mb(step: Callable[[], None]) -> float | None:
    """The most memory held by tensors at any moment of one `step()`, counting those alive when
    it starts (weights, optimizer state) and what it allocates (activations, gradients,
    temporaries): on CPU what CUDA's max_memory_allocated is on a GPU, without the runtime,
    libraries and allocator slack that process RSS adds. From torch.profiler's memory timeline
    (`export_memory_timeline`, deprecated in torch 2.13 for a CUDA-only successor, still exact
    on CPU); None where it cannot run."""
    import warnings

    from torch.profiler import ProfilerActivity, profile

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                         with_stack=True) as prof:
                step()
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "timeline.json"
                prof.export_memory_timeline(str(path), device=str(device()) if not cuda() else "cuda:0")
                _, sizes = json.loads(path.read_text())
    except Exception:  # noqa: BLE001 - a profiler that cannot give it: the column says n/a
        return None
    return max(sum(s) for s in sizes) / 2**20


# --- section trainer: the toolkit against Trainer -----------------------------------------------
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

    def __call__(self, features: list) -> Any:
        batch = self.collate(features)
        ids = batch["input_ids"]
        self.examples += ids.shape[0]
        self.positions += ids.numel()
        self.tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else ids.numel()
        return batch

    def use_epoch(self, epoch: int) -> None:
        self.training = True
        getattr(self.collate, "use_epoch", lambda _: None)(epoch)

    def per_example(self) -> dict:
        n = max(self.examples, 1)
        return {"train_positions_per_example": self.positions / n, "train_tokens_per_example": self.tokens / n}


def count_toolkit_collators() -> list[CountingCollator]:
    """Wrap every collator the GLUE task builds from now on (in this process) in a CountingCollator."""
    made: list[CountingCollator] = []
    original = Glue.collator

    def collator(self: Glue, tokenizer: Any, model: Any = None) -> CountingCollator:
        made.append(CountingCollator(original(self, tokenizer, model)))
        return made[-1]

    Glue.collator = collator
    return made


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
                     "warmup_steps": warmup_steps(args), "seed": SEED,
                     "mixed_precision": args.precision, "keep_best": False, "eval_every": 0}}
    if args.group_by_length is not None:  # else the toolkit's default
        raw["train"]["group_by_length"] = args.group_by_length
    raw["train"].update(train_overrides or {})
    return recipes.parse(raw, name=f"bench/{method}")


def toolkit_row(args: argparse.Namespace, checkpoint: str, out: Path, method: str = "full",
                train_overrides: dict | None = None) -> dict:
    """Row (a): `train.run`, the same function `toolkit run` calls. Train samples/s is the
    toolkit's own (examples / summed step time, batch fetching included); eval samples/s is dev
    examples / the `eval_runtime_s` that `_eval_and_save` logs to log.jsonl."""
    recipe = toolkit_recipe(args, checkpoint, method, train_overrides)
    collators = count_toolkit_collators()
    metrics = train.run(recipe, out)
    training = [c for c in collators if c.training]  # none if the loop stops calling use_epoch
    counts = training[0].per_example() if len(training) == 1 else {}
    evals = [e for e in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "eval_runtime_s" in e]
    n_eval = len(glue_task(args).load()["eval"][""])
    return {"row": "a", "tool": "toolkit", "method": method, "padding": "dynamic",
            "train_batch": args.batch_size, "eval_batch": train.eval_batch_size(recipe),
            "train_samples_per_s": metrics["train_samples_per_second"],
            "eval_samples_per_s": n_eval / evals[-1]["eval_runtime_s"], "eval_examples": n_eval,
            "peak_mb": metrics["peak_memory_mb"], "accuracy": metrics["eval"]["accuracy"],
            "trainable": metrics["trainable_params"], "steps": metrics["train_steps"], **counts}


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
                             lr_scheduler_type="linear", seed=SEED, save_strategy="no", eval_strategy="no",
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
    set_seed(SEED)
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
    setup = train.build(recipe)
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
    and batch (kernels, allocator, tokenizer and data caches), then the peak is reset."""
    import gc

    warm = argparse.Namespace(**{**vars(args), "steps": min(args.steps, 10), "eval_samples": 64})
    train.run(toolkit_recipe(warm, checkpoint), folder)
    gc.collect()
    if cuda():
        torch.cuda.empty_cache()
    reset_peak_memory()


def trainer_section_row(args: argparse.Namespace, kind: str, checkpoint: str) -> dict:
    """One row of the trainer (or methods) section, in this fresh process, after the warm-up."""
    with tempfile.TemporaryDirectory() as tmp:
        warm_up(args, checkpoint, Path(tmp) / "warmup")
        if kind == "toolkit":
            return toolkit_row(args, checkpoint, Path(tmp) / "toolkit")
        if kind.startswith("method:"):
            return toolkit_row(args, checkpoint, Path(tmp) / "method", kind.split(":", 1)[1])
        if kind.startswith("lever:"):
            return lever_row(args, checkpoint, Path(tmp) / "lever", kind.split(":", 1)[1])
        return trainer_row(args, checkpoint, Path(tmp) / "trainer", padded=kind == "trainer-padded")


# --- section levers: what each of the loop's speed choices is worth --------------------------------
LEVERS: dict[str, tuple[str, Callable[[argparse.Namespace], dict]]] = {
    # name -> (what changes against the toolkit's defaults, its train overrides from the bench's args)
    "defaults": ("none: length-grouped batches, evaluation longest first at 2x batch", lambda a: {}),
    "no-grouping": ("train.group_by_length=false (random batches)", lambda a: {"group_by_length": False}),
    "eval-unsorted": ("evaluation in dataset order", lambda a: {}),
    "eval-batch-1x": ("train.eval_batch_size = batch_size", lambda a: {"eval_batch_size": a.batch_size}),
    "one-thread": ("torch.set_num_threads(1)", lambda a: {}),
    "grad-checkpointing": ("train.gradient_checkpointing=true", lambda a: {"gradient_checkpointing": True}),
    "torch-dropout": ("train.fast_dropout=false (torch's bernoulli_ masks)", lambda a: {"fast_dropout": False}),
    "eager-attention": ("model.attention=eager (transformers' eager attention instead of sdpa)", lambda a: {}),
    "loader-worker": ("training batches fetched and collated by 1 DataLoader worker process", lambda a: {}),
}


def lever_row(args: argparse.Namespace, checkpoint: str, out: Path, lever: str) -> dict:
    """The toolkit row with one lever turned off (or on), in this fresh process."""
    what, overrides_of = LEVERS[lever]
    overrides = overrides_of(args)
    if lever == "eval-unsorted":
        served = batching.eval_loaders  # what train_loaders builds the loop's eval loaders with

        def unsorted(recipe: Any, setup: Any) -> tuple[dict, dict]:
            from torch.utils.data import DataLoader

            loaders, _ = served(recipe, setup)
            return ({k: DataLoader(v.dataset, batch_size=v.batch_size, collate_fn=v.collate_fn)
                     for k, v in loaders.items()}, {})

        batching.eval_loaders = unsorted
    if lever == "one-thread":
        torch.set_num_threads(1)
    if lever == "eager-attention":
        args = argparse.Namespace(**{**vars(args), "attention": "eager"})
    if lever == "loader-worker":  # the loop's own loader, with a worker (pinned memory needs a GPU)
        from torch.utils.data import DataLoader

        built = train.train_loaders

        def with_worker(recipe: Any, setup: Any, processes: int = 1) -> tuple:
            loader, sampler, evals, orders = built(recipe, setup, processes)
            if loader is not None:
                loader = DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn,
                                    generator=loader.generator, num_workers=1, persistent_workers=True,
                                    pin_memory=cuda())
            return loader, sampler, evals, orders

        train.train_loaders = with_worker
    return {"lever": lever, "what": what, **toolkit_row(args, checkpoint, out, train_overrides=overrides)}


def compile_row(args: argparse.Namespace, checkpoint: str) -> dict:
    """Full fine-tuning step time, eager against torch.compile (default inductor backend), at
    fixed shapes (every batch the same size: compile's best case) and with the first compiled
    steps' time (compilation) reported separately."""
    results = {}
    for compiled in (False, True):
        model, tok = models.load(checkpoint, "sequence-classification", {"num_labels": 2}, args.attention)
        if compiled:
            model = torch.compile(model)
        batch = random_batch(args.mfu_batch_size, args.compile_length, len(tok))
        start = time.perf_counter()
        # eager as the toolkit runs it; compiled with torch's dropout, which inductor draws itself
        times = time_training_steps(model, batch, args.precision, warmup=2, steps=args.mfu_steps or 3,
                                    fast_dropout=not compiled)
        total = time.perf_counter() - start
        results["compiled" if compiled else "eager"] = {
            "step_s": statistics.median(times), "warmup_s": total - sum(times)}
    return {"batch": args.mfu_batch_size, "length": args.compile_length, **results}


def section_levers(args: argparse.Namespace, checkpoint: str) -> tuple[dict, str]:
    rows = [run_row(f"lever:{name}", checkpoint) for name in LEVERS]
    # the defaults once more, last: how far this VM's speed drifted over the section
    rows.append({**run_row("lever:defaults", checkpoint), "lever": "defaults, again", "what": "none (drift check: run last)"})
    base = rows[0]
    body = [[r["lever"], r["what"], f"{r['train_samples_per_s']:.1f}", ratio(r["train_samples_per_s"], base["train_samples_per_s"]),
             f"{r['eval_samples_per_s']:.1f}", ratio(r["eval_samples_per_s"], base["eval_samples_per_s"]),
             f"{r['peak_mb']:.0f}", f"{100 * r['accuracy']:.2f}"] for r in rows]
    comp = run_row("compile", checkpoint)
    e, c = comp["eager"], comp["compiled"]
    text = (f"### Levers\n\n{trainer_settings(args)}\n\nEach row is the toolkit row with one change, in its "
            "own process after the same warm-up; ratios are against the defaults row. The last row repeats the "
            "defaults: its distance from 1.00x is this machine's drift over the section, which any other row's "
            "ratio inherits.\n\n"
            + table(["lever", "change", "train samples/s", "vs defaults", "eval samples/s", "vs defaults",
                     "peak MB", "dev accuracy %"], body)
            + f"\n\ntorch.compile (inductor), full fine-tuning step at fixed shape {comp['batch']} x "
            f"{comp['length']}:\n\n"
            + table(["", "step s (median)", "first 2 steps s (incl. compilation)"],
                    [["eager", f"{e['step_s']:.3f}", f"{e['warmup_s']:.1f}"],
                     ["compiled", f"{c['step_s']:.3f}", f"{c['warmup_s']:.1f}"],
                     ["compiled / eager", ratio(c["step_s"], e["step_s"]), ""]]))
    return {"rows": rows, "compile": comp}, text


# --- section matmul: the machine's throughput and the model's utilisation ----------------------
def matmul_gflops(n: int, dtype: torch.dtype, reps: int = 10) -> float:
    """GFLOP/s of an n x n @ n x n matmul (2 n^3 FLOPs), median of `reps` timed after 3 warm-ups."""
    a = torch.randn(n, n, device=device()).to(dtype)
    b = torch.randn(n, n, device=device()).to(dtype)
    for _ in range(3):
        a @ b
    times = [timed(lambda: a @ b) for _ in range(reps)]
    return 2 * n**3 / statistics.median(times) / 1e9


def matmul_sizes(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(dtype, size, note): fp32 always; bf16 on CUDA at full size, on CPU only at a small size
    (most CPUs have no bf16 matrix units: a bf16 matmul is several times slower than fp32, and a
    bf16 autocast training step far slower still); fp16 on CUDA when asked for."""
    n = args.matmul_size or (8192 if cuda() else 2048)
    rows = [("fp32", n, "")]
    if cuda():
        rows.append(("bf16", n, ""))
        if args.precision == "fp16":
            rows.append(("fp16", n, ""))
    else:
        rows.append(("bf16", args.cpu_bf16_size, f"CPU: small size only (--cpu-bf16-size)"))
    return rows


def matmul_row(args: argparse.Namespace, checkpoint: str) -> dict:
    """Matmul GFLOP/s per dtype, then the MFU of a full fine-tuning step of the bench's model on
    a batch-size x length batch of real tokens, against the matmul rate of the run's precision."""
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    matmuls = [{"dtype": name, "size": n, "gflops": matmul_gflops(n, dtypes[name]), "note": note}
               for name, n, note in matmul_sizes(args)]
    reference = next(m for m in matmuls if m["dtype"] == {"no": "fp32"}.get(args.precision, args.precision))
    steps = args.mfu_steps or (6 if not cuda() else 20)
    # On CPU the step as the toolkit runs it and with torch's dropout (train.fast_dropout=false),
    # two fresh models, their steps alternating; on a GPU the dropout is torch's either way.
    variants = [True, False] if not cuda() else [True]
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    loaded = [models.load(checkpoint, "sequence-classification", {"num_labels": 2}, args.attention)
              for _ in variants]
    batch = random_batch(args.mfu_batch_size, args.mfu_length, len(loaded[0][1]))
    step_fns = [training_step(model, batch, args.precision, fast) for (model, _), fast in zip(loaded, variants)]
    all_times = time_alternating(step_fns, warmup=2, steps=steps)
    n = non_embedding_params(loaded[0][0])
    rows = []
    for fast, times, step in zip(variants, all_times, step_fns):
        step_s = statistics.median(times)
        tokens_per_s = args.mfu_batch_size * args.mfu_length / step_s
        rows.append({"model": args.model_label, "non_embedding_params": n, "batch": args.mfu_batch_size,
                     "length": args.mfu_length, "precision": args.precision, "steps": steps,
                     "dropout": ("torch" if not fast or cuda() else "toolkit (default)" if args.precision == "no"
                                 else "toolkit's flag on; autocast's bf16/fp16 tensors keep torch's"),
                     "step_s": step_s, "tokens_per_s": tokens_per_s, "model_gflops": 6 * n * tokens_per_s / 1e9,
                     "reference": f"{reference['dtype']} matmul, n={reference['size']}",
                     "reference_gflops": reference["gflops"],
                     "mfu": mfu(n, tokens_per_s, reference["gflops"] * 1e9), "breakdown": step_breakdown(step)})
    return {"matmul": matmuls, "mfu": rows[0], "mfu_rows": rows}


# --- section lora: LoRA against full fine-tuning ------------------------------------------------
def lora_row(args: argparse.Namespace, method: str) -> dict:
    """Step time and peak memory of one method on the random roberta-base-shaped model, batch
    x length real tokens; the method is applied by the toolkit's own method code (LoRA: r 8,
    alpha 16, PEFT's default targets query/value, the head trained as modules_to_save).
    Peak memory is also given as the increase over the memory in use right before training
    (model loaded and wrapped), which is what the method changes: gradients, optimizer state,
    activations kept for backward."""
    from toolkit.methods import METHODS as REGISTRY, Context

    model, tok = roberta_base_random()
    ctx = Context(family="roberta", head_names=models.head_names(model), peft_task_type="SEQ_CLS", tokenizer=tok)
    model = REGISTRY.get(method)(**METHODS[method]).apply(model, ctx)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    batch = random_batch(args.lora_batch, args.lora_length, len(tok))
    if cuda():
        model.to(device())
        torch.cuda.reset_peak_memory_stats()
    before = current_memory_mb()
    memory: dict = {}
    times = time_training_steps(model, batch, args.precision, warmup=1, steps=args.lora_steps, memory=memory)
    peak = memory["peak_mb"]
    return {"method": method, "trainable": trainable, "batch": args.lora_batch, "length": args.lora_length,
            "steps": args.lora_steps, "step_s": statistics.median(times), "times": times, "peak_mb": peak,
            "before_training_mb": before, "increase_mb": peak - before,
            "peak_tensor_mb": memory["peak_tensor_mb"]}


# --- section startup ----------------------------------------------------------------------------
def toolkit_command(arguments: list[str]) -> list[str]:
    """What the `toolkit` console script runs (toolkit.cli:main), with this interpreter."""
    return [sys.executable, "-c", "import sys; from toolkit.cli import main; sys.exit(main())", *arguments]


def startup_rows(repeats: int = 3) -> list[dict]:
    """Wall time of each start-up command as a subprocess from this checkout, median of
    `repeats`; the smoke run gets a fresh runs folder each time (and --force)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    rows = []
    for label, arguments, target in STARTUP:
        times = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                cmd = toolkit_command([a.replace("{runs}", tmp) for a in arguments])
                start = time.perf_counter()
                done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
                times.append(time.perf_counter() - start)
            if done.returncode:
                raise RuntimeError(f"{label} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        rows.append({"command": label, "median_s": statistics.median(times), "min_s": min(times),
                     "max_s": max(times), "repeats": repeats, "target_s": target,
                     "met": statistics.median(times) < target})
    return rows


# --- one row per process ------------------------------------------------------------------------
def measure(args: argparse.Namespace) -> Any:
    """The row `--row` names, measured in this (fresh) process."""
    kind = args.row
    if kind.startswith("lora:"):
        return lora_row(args, kind.split(":", 1)[1])
    if kind == "matmul":
        return matmul_row(args, args.resolved_checkpoint)
    if kind == "compile":
        return compile_row(args, args.resolved_checkpoint)
    if kind == "eval":
        return eval_row(args, args.resolved_checkpoint)
    return trainer_section_row(args, kind, args.resolved_checkpoint)


def run_row(kind: str, checkpoint: str) -> Any:
    """This script again, in a new process, for one row; its result comes back on a ROW line."""
    cmd = [sys.executable, __file__, *sys.argv[1:], "--row", kind, "--resolved-checkpoint", checkpoint]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode or not found:
        raise RuntimeError(f"row {kind} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(found[-1][4:])


# --- tables -------------------------------------------------------------------------------------
def table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def fed(row: dict) -> str:
    """Mean positions per training example (padded width) and, in brackets, real tokens."""
    if "train_positions_per_example" not in row:
        return "n/a"
    return f"{row['train_positions_per_example']:.1f} ({row['train_tokens_per_example']:.1f})"


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
            f"weight decay {WEIGHT_DECAY}, seed {SEED}, fused AdamW, attention {args.attention}; "
            f"toolkit: train.group_by_length="
            f"{'default (true)' if args.group_by_length is None else args.group_by_length}, train.eval_batch_size="
            f"{args.eval_batch_size or f'unset (= 2 x batch_size = {2 * args.batch_size})'}, evaluation longest "
            "first; Trainer: "
            f"per_device_eval_batch_size={args.trainer_eval_batch_size} (its default 8), other defaults; "
            "one process per row, each after the same warm-up (a short toolkit run)")


def matmul_tables(result: dict) -> str:
    first = table(["dtype", "n (n x n @ n x n)", "GFLOP/s", "note"],
                  [[r["dtype"], r["size"], f"{r['gflops']:.1f}", r["note"]] for r in result["matmul"]])
    second = table(["model", "non-embedding params", "batch x length", "precision", "dropout", "step s (median)",
                    "tokens/s", "model GFLOP/s (6N x tokens/s)", "reference", "MFU"],
                   [[m["model"], f"{m['non_embedding_params']:,}", f"{m['batch']} x {m['length']}",
                     m["precision"], m.get("dropout", "torch"), f"{m['step_s']:.3f}", f"{m['tokens_per_s']:.0f}",
                     f"{m['model_gflops']:.1f}", f"{m['reference']}: {m['reference_gflops']:.1f} GFLOP/s",
                     f"{100 * m['mfu']:.1f}%"] for m in result.get("mfu_rows", [result["mfu"]])])
    rows = [m for m in result.get("mfu_rows", []) if m.get("breakdown")]
    if rows:
        parts = list(rows[0]["breakdown"])
        second += "\n\nWhere one profiled step's time goes (seconds, by op self time; the profiler adds a little):\n\n"
        second += table(["part", *(f"dropout: {m['dropout']}" for m in rows)],
                        [[part, *(f"{m['breakdown'][part]:.3f} ({100 * m['breakdown'][part] / sum(m['breakdown'].values()):.0f}%)"
                                  for m in rows)] for part in parts])
        gemm = rows[0]["breakdown"][parts[0]]
        second += (f"\n\nThe linear layers' matmuls alone run at {6 * rows[0]['non_embedding_params'] * rows[0]['batch'] * rows[0]['length'] / gemm / 1e9:.0f} "
                   f"GFLOP/s in the first row: the gap to 100% MFU is the rest of the step.")
    return first + "\n\n" + second


def lora_table(rows: list[dict]) -> str:
    full, lora = rows
    memory = "CUDA max allocated" if cuda() else "peak process RSS"
    before = "allocated" if cuda() else "RSS"

    def mb(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.0f}"

    tensors = [r.get("peak_tensor_mb") for r in rows]
    body = [[r["method"], f"{r['trainable']:,}", f"{r['step_s']:.3f}", mb(r.get("peak_tensor_mb")),
             f"{r['peak_mb']:.0f}", f"{r['before_training_mb']:.0f}", f"{r['increase_mb']:.0f}"] for r in rows]
    body.append(["LoRA / full", f"{100 * lora['trainable'] / full['trainable']:.2f}%",
                 ratio(lora["step_s"], full["step_s"]),
                 ratio(tensors[1], tensors[0]) if None not in tensors else "n/a",
                 ratio(lora["peak_mb"], full["peak_mb"]), "", ratio(lora["increase_mb"], full["increase_mb"])])
    return table(["method", "trainable", "step s (median)", "peak tensor MB (max allocated)", f"peak MB ({memory})",
                  f"{before} MB before training", "increase MB (peak - before)"], body)


def startup_table(rows: list[dict]) -> str:
    return table(["command", "median s", "min-max s", "target", "met"],
                 [[f"`{r['command']}`", f"{r['median_s']:.2f}", f"{r['min_s']:.2f}-{r['max_s']:.2f}",
                   f"< {r['target_s']:.0f} s", "yes" if r["met"] else "NO"] for r in rows])


# --- sections -----------------------------------------------------------------------------------
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


def section_matmul(args: argparse.Namespace, checkpoint: str) -> tuple[dict, str]:
    result = run_row("matmul", checkpoint)
    m = result["mfu"]
    text = (f"### Matmul throughput and MFU\n\n{matmul_tables(result)}\n\n"
            f"Step: forward, backward and fused AdamW over every parameter, {m['batch']} x {m['length']} random "
            f"tokens, no padding, median of {m['steps']} steps after 2 untimed; on CPU with the toolkit's "
            "dropout (train.fast_dropout, the default) and with torch's, two fresh models whose steps "
            "alternate. MFU = 6 x non-embedding params x tokens/s / measured matmul FLOP/s of the run's precision.")
    return result, text


def section_lora(args: argparse.Namespace, checkpoint: str) -> tuple[list[dict], str]:
    """Full and LoRA rows alternate, `--lora-repeats` times each (this VM's speed drifts between
    minutes); a method's step time is the median of all its steps, its memory from its first row."""
    runs = [run_row(f"lora:{method}", checkpoint) for _ in range(args.lora_repeats) for method in ("full", "lora")]
    rows = []
    for method in ("full", "lora"):
        mine = [r for r in runs if r["method"] == method]
        times = [t for r in mine for t in r["times"]]
        rows.append({**mine[0], "times": times, "step_s": statistics.median(times), "repeats": len(mine)})
    where = "on CPU, a batch small enough to finish; pass --lora-batch-size for more" if not cuda() else "CUDA"
    text = (f"### LoRA vs full fine-tuning (random-weight roberta-base shape)\n\n"
            f"hidden 768, 12 layers, 12 heads, FFN 3072, roberta-base tokenizer; batch {args.lora_batch} x "
            f"{args.lora_length} random tokens ({where}); step time: median of {args.lora_steps} steps after 1 "
            f"untimed, in each of {args.lora_repeats} processes per method, full and LoRA alternating; "
            f"LoRA r 8, alpha 16 on query/value, head trained.\n\n{lora_table(rows)}\n\n"
            "Peak tensor MB: the most memory tensors held at any moment of a step, weights and optimizer state "
            "included (CUDA: max_memory_allocated; CPU: torch.profiler's memory timeline of one more step), the "
            "measure a GPU's peak memory is. Peak process RSS adds the process's fixed overhead (Python, torch "
            "and transformers' code) and the allocator's slack; the increase over the RSS right before training "
            "is what training itself adds to the process.")
    return rows, text


def section_startup(args: argparse.Namespace, checkpoint: str) -> tuple[list[dict], str]:
    rows = startup_rows(args.startup_repeats)
    text = (f"### Start-up\n\nEach command a fresh `python -c 'from toolkit.cli import main; main()'` (what "
            f"the `toolkit` script runs) from {ROOT}, wall time, median of {args.startup_repeats}.\n\n"
            f"{startup_table(rows)}")
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


RUNNERS: dict[str, Callable[[argparse.Namespace, str], tuple[Any, str]]] = {
    "trainer": section_trainer, "matmul": section_matmul, "lora": section_lora, "startup": section_startup,
    "methods": section_methods, "levers": section_levers}


# --- command line -------------------------------------------------------------------------------
def sections(value: str) -> list[str]:
    """`trainer,lora` -> ['trainer', 'lora']; `all` -> the default four."""
    names = [s.strip() for s in value.split(",") if s.strip()]
    if names == ["all"]:
        return list(SECTIONS)
    unknown = [s for s in names if s not in SECTIONS + EXTRA_SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown section(s) {unknown}; choose from "
                                         f"{', '.join(SECTIONS + EXTRA_SECTIONS)} or all")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", type=sections, default=list(SECTIONS),
                   help=f"comma-separated, from {', '.join(SECTIONS + EXTRA_SECTIONS)} (default: all but methods)")
    model = p.add_mutually_exclusive_group()
    model.add_argument("--checkpoint", default=MINILM, help=f"model of the trainer and matmul sections (default {MINILM})")
    model.add_argument("--size", choices=sorted(SIZES), default=None,
                       help="a random-weight BERT of this size instead of --checkpoint")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps per trainer row")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--eval-samples", type=int, default=None, help="dev examples (default: all 872)")
    p.add_argument("--eval-batch-size", type=int, default=None, help="the toolkit's train.eval_batch_size")
    p.add_argument("--trainer-eval-batch-size", type=int, default=8, help="Trainer's per_device_eval_batch_size")
    p.add_argument("--eval-repeats", type=int, default=3, help="passes each in the interleaved evaluation row")
    p.add_argument("--group-by-length", action=argparse.BooleanOptionalAction, default=None,
                   help="the toolkit's train.group_by_length (default: the toolkit's default, true)")
    p.add_argument("--precision", choices=["no", "bf16", "fp16"], default="no")
    p.add_argument("--attention", default="sdpa")
    p.add_argument("--matmul-size", type=int, default=None, help="n of the matmul (default 2048 CPU, 8192 CUDA)")
    p.add_argument("--cpu-bf16-size", type=int, default=512, help="n of the bf16 matmul on CPU")
    p.add_argument("--mfu-batch-size", type=int, default=32)
    p.add_argument("--mfu-length", type=int, default=128)
    p.add_argument("--mfu-steps", type=int, default=None, help="timed steps (default 6 CPU, 20 CUDA)")
    p.add_argument("--compile-length", type=int, default=64, help="sequence length of the levers' compile rows")
    p.add_argument("--lora-batch-size", dest="lora_batch", type=int, default=None, help="default 8 CPU, 32 CUDA")
    p.add_argument("--lora-length", type=int, default=128)
    p.add_argument("--lora-steps", type=int, default=3)
    p.add_argument("--lora-repeats", type=int, default=2, help="processes per LoRA-section row, alternating")
    p.add_argument("--startup-repeats", type=int, default=3)
    p.add_argument("--methods", nargs="*", default=list(METHODS), help="the methods section's methods")
    p.add_argument("--json", default=None, help="also write every row here")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: the row this process measures
    p.add_argument("--resolved-checkpoint", default=None, help=argparse.SUPPRESS)
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    args = parser().parse_args(argv)
    if args.precision == "fp16" and not cuda():
        parser().error("--precision fp16 needs a CUDA GPU (the toolkit refuses it on CPU)")
    args.lora_batch = args.lora_batch or (32 if cuda() else 8)
    args.model_label = f"random {args.size}" if args.size else args.checkpoint
    return args


def main() -> None:
    """Each section's rows run in their own processes; this one prints the tables."""
    import datasets
    import transformers

    args = parse()
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    if args.row:
        print("ROW " + json.dumps(measure(args)))
        return
    info = header(args)
    print(f"# make bench\n\n{info['device']} | torch {info['torch']}, transformers {info['transformers']} | "
          f"precision {info['precision']} | {info['date']} | commit {(info['git_commit'] or '?')[:10]}\n", flush=True)
    results: dict[str, Any] = {"header": info, "args": {k: v for k, v in vars(args).items() if k not in ("row",)}}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_checkpoint(args.size, Path(tmp) / "model") if args.size else args.checkpoint
        for name in args.sections:
            start = time.perf_counter()
            try:
                results[name], text = RUNNERS[name](args, checkpoint)
            except RuntimeError as exc:
                failed.append(name)
                text = f"### {name}: FAILED\n\n```\n{exc}\n```"
            print(f"{text}\n\n({name}: {time.perf_counter() - start:.0f} s)\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if failed:
        sys.exit(f"failed sections: {', '.join(failed)}")


if __name__ == "__main__":
    main()
