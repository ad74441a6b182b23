"""train.compile_optimizer: gradient clipping and the AdamW update as one compiled function.

Why: on an H100 the compiled bf16 step was host-bound (16.3 ms wall, 14.7 ms of Python and
launches, the GPU busy 5.3 ms); clipping (2.5 ms) and the optimizer with its schedule (3.2 ms) were
a third of the host's time. Compiled into one function (and on CUDA one CUDA graph), they become a
guard check and one replay.

Why not `torch.compile(optimizer.step)`: torch 2.13's dynamo does not trace the fused AdamW kernel
(`_fused_adam` is `torch.compiler.disable`d: a graph break, the kernel runs eager), and its traceable
(foreach, capturable) AdamW has no `found_inf`, which the loop needs to skip a non-finite step on
the device. So the update is written here, on the state of the run's own torch AdamW (`step`,
`exp_avg`, `exp_avg_sq`, in the layout fused AdamW keeps: the step a float32 tensor on the device),
with each result taken only where the step is finite (`torch.where`): a non-finite step leaves the
weights, both moments and the step count as they were, as fused AdamW's `found_inf` does. The
optimizer object, its param_groups (the learning rate stays a Python float there) and its
state_dict are the eager run's, so a checkpoint of one resumes in the other.

The learning rate enters as one 0-d tensor per group, written from the schedule's float before each
step (`fill_`: a kernel, not a host read), so the schedule never recompiles the function (PyTorch's
"compiled optimizer with an LR scheduler" recipe wraps the lr in a tensor for the same reason).
The state tensors and those learning rates are marked static (CUDA graphs keep their addresses).

Where it cannot be done exactly the recipe is refused in one line (toolkit/recipe.py: fp16's loss
scaler decides on the host, a method's `after_step` must not see a skipped step) or at launch
(`check_strategy`: FSDP and DeepSpeed step their own sharded optimizer).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from toolkit.errors import UserError


def check_strategy(enabled: bool, strategy: str | None) -> None:
    """Launch-time: under FSDP or DeepSpeed the optimizer steps sharded state through their own
    wrappers; the update written here would not be what they step."""
    if enabled and strategy is not None:
        raise UserError(f"train.compile_optimizer: true under {strategy}, which steps its own sharded "
                        "optimizer; set train.compile_optimizer: false")


@torch.no_grad()
def adamw_update(lrs: list[torch.Tensor], hyper: list[tuple[float, float, float, float]], loss: torch.Tensor,
                 sources: list[list[torch.Tensor]], targets: list[list[torch.Tensor]], steps: list[list[torch.Tensor]],
                 exp_avgs: list[list[torch.Tensor]], exp_avg_sqs: list[list[torch.Tensor]],
                 max_norm: float | None, masters: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One clipped AdamW step over every group (the function that is compiled). `sources` are the
    parameters whose `.grad` holds the step's gradient, `targets` what AdamW updates: the same
    tensors, or (`masters`) bf16_master's fp32 copies, written back into the bf16 sources after.
    Returns (the gradient norm before clipping, measured where not clipping too; whether the
    step was finite). The arithmetic is fused AdamW's (decoupled weight decay, bias corrections by the
    step count); it runs in the compiler's kernels, so it equals the eager step to rounding."""
    grads = [[p.grad for p in group] for group in sources]
    # measured with clipping off too (the eager loop's rule, `Loop._clip_grads`): a finite loss
    # with a non-finite gradient is a skipped step, not NaN weights
    norm = torch.nn.utils.get_total_norm([g for group in grads for g in group], 2.0)
    if max_norm:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)  # clip_grad_norm_'s factor
        grads = [torch._foreach_mul(group, coef) for group in grads]  # in the gradients' dtype, as it
    ok = torch.isfinite(loss) & torch.isfinite(norm)
    for g, src, dst, st, m, v, lr, (beta1, beta2, eps, decay) in zip(grads, sources, targets, steps, exp_avgs,
                                                                      exp_avg_sqs, lrs, hyper):
        if masters:  # the clipped bf16 gradient as fp32, as MasterAdamW.step takes it
            g = [x.to(torch.float32) for x in g]
        count = torch._foreach_add(st, 1.0)
        new_m = torch._foreach_lerp(m, g, 1 - beta1)
        new_v = torch._foreach_mul(v, beta2)
        torch._foreach_addcmul_(new_v, g, g, value=1 - beta2)
        step_size = [lr / (1 - beta1 ** c) for c in count]
        root2 = [torch.sqrt(1 - beta2 ** c) for c in count]
        denom = torch._foreach_add(torch._foreach_div(torch._foreach_sqrt(new_v), root2), eps)
        shrunk = torch._foreach_mul(dst, 1 - lr * decay) if decay else dst
        new_p = torch._foreach_sub(shrunk, torch._foreach_div(torch._foreach_mul(new_m, step_size), denom))
        for old, new in ((dst, new_p), (m, new_m), (v, new_v), (st, count)):  # a non-finite step: as it was
            torch._foreach_copy_(old, [torch.where(ok, n, o) for n, o in zip(new, old)])
        if masters:  # the weights are their masters rounded to nearest (unchanged where skipped)
            torch._foreach_copy_(src, dst)
    return norm, ok


class CompiledStep:
    """The run's optimizer stepped through `adamw_update`, compiled once: call it with the step's
    loss (a device tensor) after the backward; it clips, steps and returns (norm, finite flag),
    all on the device. The optimizer's state is made as torch's fused AdamW makes it (lazily, for
    parameters that have a gradient) and read back from the optimizer after a `load_state_dict`."""

    def __init__(self, optimizer: torch.optim.Optimizer, max_norm: float | None,
                 compile_fn: Callable[[Callable], Callable]) -> None:
        self.optimizer, self.max_norm = optimizer, max_norm
        self.masters = hasattr(optimizer, "model_params")  # precision.MasterAdamW
        self.lrs = [torch.zeros((), dtype=torch.float32, device=g["params"][0].device)
                    for g in optimizer.param_groups]
        self.last_lrs: list[float | None] = [None] * len(self.lrs)
        self.hyper = [(g["betas"][0], g["betas"][1], g["eps"], g["weight_decay"]) for g in optimizer.param_groups]
        if any(g["amsgrad"] or g["maximize"] for g in optimizer.param_groups):
            raise RuntimeError("the compiled optimizer step is AdamW without amsgrad or maximize")  # a bug
        self.fn = compile_fn(adamw_update)
        self.lists: dict[str, Any] | None = None
        optimizer.register_load_state_dict_post_hook(lambda *_: self._stale())
        for lr in self.lrs:
            torch._dynamo.mark_static_address(lr)

    def _stale(self) -> None:
        self.lists = None  # load_state_dict made new state tensors

    def _pairs(self) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Per group, (source, target) of every parameter, in the optimizer's order."""
        if not self.masters:
            return [[(p, p) for p in g["params"]] for g in self.optimizer.param_groups]
        model = iter(self.optimizer.model_params)
        return [[(next(model), m) for m in g["params"]] for g in self.optimizer.param_groups]

    def _build(self) -> dict[str, Any]:
        """The argument lists over the parameters that have a gradient now, their state made
        where missing (what fused AdamW's `_init_group` makes, so its state_dict is the same)."""
        state = self.optimizer.state
        lists: dict[str, Any] = {k: [] for k in ("sources", "targets", "steps", "exp_avgs", "exp_avg_sqs")}
        for group in self._pairs():
            kept = [(s, t) for s, t in group if s.grad is not None]
            for _, t in kept:
                if not state[t]:
                    state[t]["step"] = torch.zeros((), dtype=torch.float32, device=t.device)
                    state[t]["exp_avg"] = torch.zeros_like(t, memory_format=torch.preserve_format)
                    state[t]["exp_avg_sq"] = torch.zeros_like(t, memory_format=torch.preserve_format)
                for tensor in (t, state[t]["step"], state[t]["exp_avg"], state[t]["exp_avg_sq"]):
                    torch._dynamo.mark_static_address(tensor)  # updated in place: kept by a CUDA graph
            lists["sources"].append([s for s, _ in kept])
            lists["targets"].append([t for _, t in kept])
            for key, name in (("steps", "step"), ("exp_avgs", "exp_avg"), ("exp_avg_sqs", "exp_avg_sq")):
                lists[key].append([state[t][name] for _, t in kept])
        lists["watched"] = [s for group in self._pairs() for s, _ in group]
        lists["had"] = [s.grad is not None for s in lists["watched"]]
        return lists

    def __call__(self, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.lists is None or [s.grad is not None for s in self.lists["watched"]] != self.lists["had"]:
            self.lists = self._build()
        for i, group in enumerate(self.optimizer.param_groups):
            if group["lr"] != self.last_lrs[i]:  # the schedule's float, written on the device
                self.lrs[i].fill_(group["lr"])
                self.last_lrs[i] = group["lr"]
        lists = self.lists
        result = self.fn(self.lrs, self.hyper, loss, lists["sources"], lists["targets"], lists["steps"],
                         lists["exp_avgs"], lists["exp_avg_sqs"], self.max_norm, self.masters)
        self.optimizer._opt_called = True  # what the LR scheduler checks to tell it ran after a step
        return result
