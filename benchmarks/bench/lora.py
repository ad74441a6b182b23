"""Section lora: LoRA against full fine-tuning on a random-weight roberta-base-shaped model."""

from __future__ import annotations

import argparse
import statistics

import torch

from toolkit import models

from bench.common import (METHODS, ROBERTA_TINY, compile_caches, cuda, current_memory_mb, device, random_batch, ratio,
                          roberta_base_random, run_row, table, time_training_steps)


def method_model(args: argparse.Namespace, method: str) -> tuple[torch.nn.Module, object]:
    """(model, tokenizer): the random roberta-base-shaped model (`--lora-model tiny`: the small
    one), `method` applied by the toolkit's own method code."""
    from toolkit.methods import METHODS as REGISTRY, Context

    model, tok = roberta_base_random(shape=ROBERTA_TINY if getattr(args, "lora_model", None) == "tiny" else None)
    ctx = Context(family="roberta", head_names=models.head_names(model), peft_task_type="SEQ_CLS", tokenizer=tok)
    return REGISTRY.get(method)(**METHODS[method]).apply(model, ctx), tok


def lora_row(args: argparse.Namespace, method: str) -> dict:
    """Step time and peak memory of one method on the random roberta-base-shaped model, batch
    x length real tokens; the method is applied by the toolkit's own method code (LoRA: r 8,
    alpha 16, PEFT's default targets query/value, the head trained as modules_to_save).
    Peak memory is also given as the increase over the memory in use right before training
    (model loaded and wrapped), which is what the method changes: gradients, optimizer state,
    activations kept for backward. With `--compile true` the step's forward and loss (so its
    backward) are compiled by the toolkit's own `compiling.compile_step`, as its loop compiles them
    (on CUDA: Inductor, mode reduce-overhead, CUDA graphs): eager, a base-size step is launch-bound
    on a GPU, where LoRA adds kernels and saves weight-gradient matmuls. A compiled row's 3 untimed
    steps compile it and record its graph; their seconds are `warmup_s`."""
    model, tok = method_model(args, method)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    batch = random_batch(args.lora_batch, args.lora_length, len(tok))
    if cuda():
        model.to(device())
        torch.cuda.reset_peak_memory_stats()
    before = current_memory_mb()
    memory: dict = {}
    from toolkit import compiling

    compiled = getattr(args, "compile", None) == "true"
    graphs, caches = compiling.graph_count(), compile_caches()
    times = time_training_steps(model, batch, args.precision, warmup=3 if compiled else 1, steps=args.lora_steps,
                                memory=memory, compiled=compiled)
    peak = memory["peak_mb"]
    config = model.config
    shape = (f"hidden {config.hidden_size}, {config.num_hidden_layers} layers, {config.num_attention_heads} heads, "
             f"FFN {config.intermediate_size}")
    return {"method": method, "shape": shape, "trainable": trainable, "batch": args.lora_batch, "length": args.lora_length,
            "steps": args.lora_steps, "step_s": statistics.median(times), "times": times, "peak_mb": peak,
            "before_training_mb": before, "increase_mb": peak - before,
            "peak_tensor_mb": memory["peak_tensor_mb"], "compile": compiled, "warmup_s": memory["warmup_s"],
            "compiled_graphs": compiling.graph_count() - graphs, "compile_cache": compile_caches(caches)}


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
    # the model's own shape: `--lora-model tiny` (32 wide, 2 layers) was labelled roberta-base's 768 x 12
    base = rows[0]["shape"] == "hidden 768, 12 layers, 12 heads, FFN 3072"
    text = (f"### LoRA vs full fine-tuning (random-weight {'roberta-base' if base else 'small roberta'} shape)\n\n"
            f"{rows[0]['shape']}, roberta-base tokenizer; batch {args.lora_batch} x "
            f"{args.lora_length} random tokens ({where}); step time: median of {args.lora_steps} steps after 1 "
            f"untimed, in each of {args.lora_repeats} processes per method, full and LoRA alternating; "
            f"LoRA r 8, alpha 16 on query/value, head trained.\n\n{lora_table(rows)}\n\n"
            "Peak tensor MB: the most memory tensors held at any moment of a step, weights and optimizer state "
            "included (CUDA: max_memory_allocated; CPU: torch.profiler's memory timeline of one more step), the "
            "measure a GPU's peak memory is. Peak process RSS adds the process's fixed overhead (Python, torch "
            "and transformers' code) and the allocator's slack; the increase over the RSS right before training "
            "is what training itself adds to the process.")
    return rows, text
