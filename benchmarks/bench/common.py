"""What every section uses: the device, memory and clocks; model shapes and FLOP counts; timed
training steps; Markdown tables; and `run_row`, which measures one row in a fresh process."""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from toolkit import devices, models, provenance


ROOT = Path(__file__).resolve().parents[2]  # the checkout
PACKAGE = Path(__file__).resolve().parent  # run as `python benchmarks/bench`
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


def build_checkpoint(size: str, folder: Path) -> str:
    """A random-weight BERT of a named size with the real bert-base-uncased tokenizer (weights
    do not change speed; they do make dev accuracy meaningless)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(models.tokenizer_dir() / "bert-base-uncased")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), **SIZES[size])).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


# gpu_check --smoke's LoRA rows: the same code on a 2-layer, width-32 model
ROBERTA_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=514, type_vocab_size=1)


def roberta_base_random(num_labels: int = 2, shape: dict | None = None) -> tuple[torch.nn.Module, Any]:
    """roberta-base's shape (768 wide, 12 layers, 12 heads, 3072 FFN) with random weights, built
    from a config and the real roberta-base tokenizer; seeded, so every row builds the same model."""
    from transformers import AutoTokenizer, RobertaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(models.tokenizer_dir() / "roberta-base")
    torch.manual_seed(0)
    return RobertaForSequenceClassification(roberta_base_config(tok, num_labels, shape)), tok


def roberta_base_config(tok: Any, num_labels: int = 2, shape: dict | None = None) -> Any:
    """roberta-base's config, its vocabulary and special tokens taken from the tokenizer."""
    from transformers import RobertaConfig

    return RobertaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, num_labels=num_labels, **(shape or ROBERTA_BASE))


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


def training_step(model: torch.nn.Module, batch: dict, precision: str, fast_dropout: bool = True,
                  compiled: bool = False) -> Callable[[], None]:
    """One full optimizer step of `model` on `batch` (forward, backward, fused AdamW, as the
    toolkit's loop does, under accelerate's mixed precision), as a function. On CPU the dropouts
    are the toolkit's (toolkit.dropout, as `train.fast_dropout` defaults to) unless
    `fast_dropout` is false or the step is compiled: the loop's rule (train.py), since the
    toolkit's masks are drawn by numpy, which a compiled region breaks its graph at (a tiny
    RoBERTa's compiled step was 16 graphs, 20 breaks, where the loop's is one).
    `compiled`: the forward and loss through the toolkit's own `compiling.compile_step` (so its
    backward too), called as the loop calls it."""
    from accelerate import Accelerator

    from toolkit import compiling, dropout

    if fast_dropout and not compiled:  # compiled, dropout fuses into the graph (train.Loop)
        dropout.install(model, device())
    labels = batch.get("labels")
    if getattr(model.config, "problem_type", "") is None and model.config.num_labels > 1 and labels is not None \
            and labels.dim() == 1 and not labels.is_floating_point():
        # as the toolkit's classification task loads it: set by the first forward instead, the
        # config change recompiled the whole compiled step at the second
        model.config.problem_type = "single_label_classification"
    acc = Accelerator(mixed_precision=precision, cpu=not cuda())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, fused=True)
    model, optimizer = acc.prepare(model, optimizer)
    model.train()
    batch = {k: v.to(acc.device) for k, v in batch.items()}

    forward = compiling.compile_step(lambda b: model(**b).loss, acc.device) if compiled else None

    def step() -> None:
        if forward is None:
            acc.backward(model(**batch).loss)
        else:
            compiling.mark_step()
            acc.backward(forward(compiling.mark_dynamic(dict(batch))))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


CACHES = {"fxgraph_hit": ("inductor", "fxgraph_cache_hit"), "fxgraph_miss": ("inductor", "fxgraph_cache_miss"),
          "autograd_hit": ("aot_autograd", "autograd_cache_hit"), "autograd_miss": ("aot_autograd", "autograd_cache_miss")}


def compile_caches(since: dict | None = None) -> dict[str, int]:
    """torch's own counts of Inductor's on-disk graph cache (FX graph, AOT autograd) hits and
    misses, in this process (since `since`): a compiled row whose graphs hit was compiled before
    (an earlier row or run on this machine with the same graph) and paid a fraction of a cold
    compilation. The second H200 check's compiled-optimizer row ran the compiled bf16 row's step
    graph again: 405 samples/s over the whole run against that row's 61."""
    from torch._dynamo.utils import counters

    now = {name: int(counters[group][key]) for name, (group, key) in CACHES.items()}
    return {name: value - (since or {}).get(name, 0) for name, value in now.items()}


def timed(step: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    step()
    sync()
    return time.perf_counter() - start


def time_training_steps(model: torch.nn.Module, batch: dict, precision: str, warmup: int,
                        steps: int, fast_dropout: bool = True, memory: dict | None = None,
                        compiled: bool = False) -> list[float]:
    """Seconds of each of `steps` `training_step`s after `warmup` untimed ones (`compiled`: the
    step compiled as the toolkit's loop compiles it; its warm-up compiles it, and its seconds go
    into `memory["warmup_s"]`). With a `memory` dict, the timed steps' peak memory (`peak_mb`, as
    the toolkit reports it) goes into it, then one more step runs under the profiler (CPU) and its
    peak tensor memory (`peak_tensor_mb`)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    step = training_step(model, batch, precision, fast_dropout, compiled)
    began = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    if memory is not None:
        memory["warmup_s"] = time.perf_counter() - began
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


def run_row(kind: str, checkpoint: str) -> Any:
    """The bench again, in a new process, for one row; its result comes back on a ROW line."""
    cmd = [sys.executable, str(PACKAGE), *sys.argv[1:], "--row", kind, "--resolved-checkpoint", checkpoint]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode or not found:
        raise RuntimeError(f"row {kind} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(found[-1][4:])


def table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"
