"""bf16 weights with an fp32 master copy in the optimizer: `train.precision_mode: bf16_master`.

`train.mixed_precision: bf16` alone is accelerate's autocast over fp32 weights: every forward
casts every weight to bf16 again, gradients are fp32, the update is fp32. With `bf16_master` the
model's parameters (and so its activations and gradients) are bf16, and the optimizer holds an
fp32 copy of each trained parameter: each step it takes the bf16 gradients as fp32, runs torch's
fused AdamW on the fp32 copies, and writes them back into the bf16 parameters, rounded to nearest.
accelerate's autocast stays on over the bf16 weights, so the ops autocast keeps in fp32 (softmax,
layer norm, the loss on fp32 logits) still run in fp32; only the per-step weight casts go.

Gradients accumulate in bf16, in the parameters' own `.grad` (autograd's, across the k
micro-batches of `train.grad_accum`), and become fp32 once per optimizer step. Why: everything the
loop does with gradients between backward and step reads `.grad` as it is (DDP's bucketed
all-reduce and `no_sync`, `clip_grad_norm_`, the on-device finite check), and keeping them bf16
halves their memory; the cost is one bf16 rounding per accumulated micro-batch (relative error
about k * 2**-9 for k micro-batches; none beyond bf16's own at grad_accum 1, where the backward
produces each gradient once, in bf16, anyway). The fp32 master copy is what keeps small updates
(lr * update << 2**-8 of the weight) from vanishing in the rounding, which is the known failure
of pure bf16 training.

Why a wrapper of our own (about 60 lines) rather than a library, checked for torch 2.13:
- torchao.optim (0.18) `AdamW(bf16_stochastic_round=True)` keeps bf16 weights *without* an fp32
  master (stochastic rounding stands in for it) and is not torch's fused AdamW, so it has no
  `found_inf`, which the loop's on-device skip of a non-finite step needs (toolkit/tally.py);
- accelerate's `mixed_precision` is autocast only; fp32 masters over bf16 weights exist there only
  inside its FSDP/DeepSpeed plugins (their mixed-precision policies), which the toolkit already
  uses when a launch shards (so `bf16_master` is refused there: it would be a second master);
- transformers' Trainer has no master-weight option (`bf16` is the same autocast; its
  `adamw_anyprecision` needs torchdistx, which is unmaintained).
So `MasterAdamW` is a subclass of torch's fused AdamW: the loop, the schedule, accelerate's
prepare, `skip_unless` and the checkpoints see an ordinary fused AdamW; its state_dict adds the
fp32 masters, so accelerate's save_state/load_state resume exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from toolkit.errors import UserError


def check_device(mixed_precision: str, run: Any = None) -> None:
    """fp16 autocast needs a CUDA GPU: on a CPU accelerate computes in fp32 instead, saying
    nothing (no silent fallback). `run`: the finished run that eval or predict would compute with
    (it computes in its recorded precision), or None for `toolkit run`."""
    if mixed_precision != "fp16" or torch.cuda.is_available():
        return
    if run is None:
        raise UserError("train.mixed_precision: fp16 needs a CUDA GPU and none is here (on a CPU it "
                        "would silently run in fp32); use bf16 (slow on CPU) or no")
    raise UserError(f"{run}: the run computed in train.mixed_precision: fp16, which needs a CUDA GPU, and none "
                    "is here (on a CPU it would compute in fp32, not as the run did); evaluate or predict "
                    "with it on a machine with a CUDA GPU")


def as_trained(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """A finished run's model (loaded in fp32) in the dtype its weights had when the run scored
    it: `bf16_master` computed with bf16 weights (and buffers, as `bf16_master` casts them), so
    its eval and predictions do too; autocast alone kept fp32 weights."""
    return model.to(torch.bfloat16) if mode == "bf16_master" else model


def check_strategy(mode: str, strategy: str | None) -> None:
    """Launch-time: FSDP and DeepSpeed keep fp32 masters of their own (their mixed-precision
    policy over sharded weights); a second copy here would not be what they step. (The recipe's
    own check, bf16_master only with mixed_precision: bf16, is toolkit/recipe.py's: torch-free.)"""
    if mode == "bf16_master" and strategy is not None:
        raise UserError(f"train.precision_mode: bf16_master under {strategy}, which keeps its own fp32 "
                        "master weights (its mixed-precision policy); use precision_mode: autocast")


class MasterAdamW(torch.optim.AdamW):
    """Fused AdamW over fp32 copies of `groups`' parameters; `step` reads their (bf16) gradients
    and writes the updated copies back into them. Build it before the model is cast to bf16
    (`bf16_master`), so that the masters start from the full-precision weights."""

    def __init__(self, groups: list[dict[str, Any]], lr: float) -> None:
        self.model_params: list[torch.nn.Parameter] = []
        master_groups = []
        for group in groups:
            params = list(group["params"])
            self.model_params += params
            masters = [p.detach().to(torch.float32, copy=True) for p in params]
            master_groups.append({**group, "params": masters})
        super().__init__(master_groups, lr=lr, fused=True)
        self.masters: list[torch.Tensor] = [m for g in self.param_groups for m in g["params"]]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for p, m in zip(self.model_params, self.masters):
            m.grad = None if p.grad is None else p.grad.to(torch.float32)
        loss = super().step(closure)  # a skipped step (found_inf) leaves the masters as they were
        torch._foreach_copy_(self.model_params, self.masters)  # rounded to nearest bf16
        for m in self.masters:  # the fp32 gradients live for the step only
            m.grad = None
        return loss

    @torch.no_grad()
    def pull_model_writes(self) -> None:
        """Take into the masters what was written into the bf16 parameters outside `step` (a
        method's `after_step`: AdaLoRA masks pruned ranks in place); where a parameter is still the
        rounding of its master, the master keeps its fp32 value. Else the next step would undo
        the write."""
        for p, m in zip(self.model_params, self.masters):
            m.copy_(torch.where(p == m.to(p.dtype), m, p.to(m.dtype)))

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for p in self.model_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["master_weights"] = list(self.masters)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        saved = state.pop("master_weights")
        super().load_state_dict(state)
        with torch.no_grad():
            torch._foreach_copy_(self.masters, [s.to(m.device) for s, m in zip(saved, self.masters)])
            torch._foreach_copy_(self.model_params, self.masters)


def bf16_master(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float,
                device: torch.device) -> MasterAdamW:
    """The model on `device` in bf16 (every floating parameter and buffer, trained or frozen), and
    the optimizer over fp32 masters of the trained ones, taken before the cast."""
    model.to(device)  # the masters are made where the model will train (prepare keeps it there)
    optimizer = MasterAdamW(groups, lr)
    model.to(torch.bfloat16)  # in place: the parameters stay the same objects
    return optimizer


def pull_model_writes(optimizer: torch.optim.Optimizer) -> None:
    """After code outside the optimizer wrote parameters (a method's `after_step`): their masters
    follow (`MasterAdamW.pull_model_writes`); nothing to do for any other optimizer."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
    if isinstance(inner, MasterAdamW):
        inner.pull_model_writes()
