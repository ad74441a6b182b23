"""Row kind `graph:METHOD`: the next lever of issue 35, measured before it is built into the loop.

The fourth GPU check (one H100, 2026-11-28, docs/gpu.md) found every compiled step waiting on the
host: bert-base 24.8 of 27.5 ms a step with the GPU busy 5.3 ms, spread over every part of the step
(the batch's copy, forward and backward calls through Inductor's CUDA-graph trees, clipping, the
fused AdamW update). Faster kernels cannot help such a step; fewer host calls can. This row times
one whole optimizer step (forward, loss, backward, gradient clipping, fused AdamW) captured as ONE
CUDA graph and replayed, against the same step run eagerly in the same process, alternating, for
full fine-tuning and LoRA on the random roberta-base-shaped model of the LoRA rows: what a step
costs once the host is out of it, and whether LoRA's step is then cheaper than full's (the
target, <= 0.7x, missed at 1.20x by the eager rows, which are launch-bound).

The capture follows PyTorch's documented whole-network recipe (torch.cuda.graphs: warm-up
iterations on a side stream, `set_to_none` gradients before capture so the backward allocates them
in the graph's pool, a `capturable` fused AdamW whose step count lives on the device, autocast with
its weight-cast cache off); written here because no maintained library captures a training step
whole for an arbitrary Hugging Face model. It is a measurement, not the loop: a constant learning
rate and one static batch (the loop's bucketed shapes would each be a graph of their own).

On a CPU (the suite's `--smoke`) the same step function runs without the capture, which CUDA alone
offers: the row's path is tested, the graph's time is the GPU's to give.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from typing import Callable

import torch

from bench.common import LR, cuda, device, peak_memory_mb, random_batch, reset_peak_memory, sync, time_alternating
from bench.lora import method_model

MAX_GRAD_NORM = 1.0  # the loop's default clip, so the captured step does the loop's work


def graph_model(args: argparse.Namespace, method: str) -> tuple[torch.nn.Module, int]:
    """(model, vocabulary size): the LoRA rows' model (bench.lora.method_model) on the device."""
    model, tok = method_model(args, method)
    model.to(device()).train()
    return model, len(tok)


def whole_step(model: torch.nn.Module, batch: dict, precision: str) -> tuple[Callable[[], torch.Tensor], list]:
    """(step, trainable parameters): one optimizer step as a function returning its loss tensor,
    nothing read back to the host."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, fused=True, capturable=cuda())
    kind = "cuda" if cuda() else "cpu"
    bf16 = precision == "bf16"

    def step() -> torch.Tensor:
        autocast = (torch.autocast(kind, dtype=torch.bfloat16, cache_enabled=False) if bf16
                    else contextlib.nullcontext())
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM, foreach=True)
        optimizer.step()
        return loss.detach()

    return step, [optimizer]


def graphed(step: Callable[[], torch.Tensor], optimizers: list, warmup: int = 3) -> Callable[[], None]:
    """`step` captured as one CUDA graph after `warmup` eager runs on a side stream (which also
    creates the optimizer's state outside the graph); the returned function replays it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the gradients
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def graph_row(args: argparse.Namespace, method: str) -> dict:
    """Step time of `method`'s whole step eager and as one replayed CUDA graph, alternating."""
    if args.precision not in ("no", "bf16"):  # fp16 would need a loss scaler inside the graph
        raise SystemExit(f"graph rows: --precision {args.precision} is not measured here; use no or bf16")
    precision = args.precision
    times = {}
    reset_peak_memory()
    model, vocab = graph_model(args, method)
    batch = {k: v.to(device()) for k, v in random_batch(args.lora_batch, args.lora_length, vocab).items()}
    eager, optimizers = whole_step(model, batch, precision)

    def eager_step() -> None:
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        eager()

    steps = [eager_step]
    if cuda():
        steps.append(graphed(eager, optimizers))
    measured = time_alternating(steps, warmup=1, steps=args.lora_steps)
    times["eager"] = measured[0]
    if cuda():
        times["graph"] = measured[1]
        sync()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    eager_s = statistics.median(times["eager"])
    graph_s = statistics.median(times["graph"]) if "graph" in times else None
    # step_s: the graph's where one was captured (the row's figure), else the eager step's (a CPU)
    return {"method": method, "precision": precision, "batch": args.lora_batch, "length": args.lora_length,
            "trainable": trainable, "steps": args.lora_steps, "captured": cuda(), "graph": True,
            "step_s": graph_s if graph_s is not None else eager_s, "eager_step_s": eager_s, "graph_step_s": graph_s,
            "peak_mb": peak_memory_mb(), "times": times}
