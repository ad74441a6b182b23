"""The training step's numbers, kept on the device between the steps that log.

Reading a number to the host (`.item()`, `.tolist()`, `float(t)`, `if t:`) makes the host wait
for every queued kernel: on a GPU the step becomes launch-bound, and CUDA graphs cannot run ahead.
So the loop adds each step's loss, gradient norm, sample count and finite flag here with device
operations only, and reads them back in one transfer at the steps that log, evaluate or save, and
at the end (`read`). A non-finite step is skipped on the device by the optimizer itself (fused
AdamW's `found_inf`, the mechanism the fp16 loss scaler uses), so the weights never take a
non-finite update while nobody is looking; `read` then names the step at which the run went past
`train.skip_nonfinite`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Reading:
    """What one `Tally.read` brings to the host."""

    loss: float  # the last step's loss
    grad_norm: float  # the last step's (clipped-from) gradient norm; 0.0 where not clipped
    samples: int  # examples of the finite steps since the last read
    skipped: int  # non-finite steps since the last read (skipped on the device)
    first_skip: int  # the first skipped step since the last read; 0: none
    first_norm: bool  # that step's loss was finite: its gradient norm was not
    over_step: int  # the step at which the skips went past the limit; 0: not past it
    over_loss: float  # that step's loss
    over_norm: bool  # that step's loss was finite: its gradient norm was not


class Tally:
    """Device-side sums between two reads; `allowed` is how many more skips the run may take."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        zero = torch.zeros((), device=self.device)
        self.loss, self.norm, self.over_loss = zero, zero, zero
        self.counts = torch.zeros(6, dtype=torch.long, device=self.device)
        # samples, skipped, over_step, over_norm, first_skip, first_norm
        self.pending = False

    def add(self, step: int, loss: torch.Tensor, norm: torch.Tensor, samples: torch.Tensor,
            ok: torch.Tensor, allowed: int) -> None:
        """Record optimizer step `step` (1-based); device operations only, no host read."""
        bad = (~ok).long()
        samples_c, skipped_c = self.counts[0] + samples.long() * ok.long(), self.counts[1] + bad
        over = bad.bool() & (skipped_c > allowed) & (self.counts[2] == 0)
        over_step = torch.where(over, torch.full_like(self.counts[2], step), self.counts[2])
        over_norm = torch.where(over, torch.isfinite(loss).long(), self.counts[3])
        first = bad.bool() & (self.counts[4] == 0)
        first_skip = torch.where(first, torch.full_like(self.counts[4], step), self.counts[4])
        first_norm = torch.where(first, torch.isfinite(loss).long(), self.counts[5])
        self.counts = torch.stack([samples_c, skipped_c, over_step, over_norm, first_skip, first_norm])
        self.over_loss = torch.where(over, loss.float(), self.over_loss)
        self.loss, self.norm, self.pending = loss.float(), norm.float(), True

    def read(self) -> Reading:
        """One transfer to the host (two tensors of different dtypes), then the sums restart."""
        floats = torch.stack([self.loss, self.norm, self.over_loss]).tolist()
        counts = self.counts.tolist()
        self.reset()
        return Reading(loss=floats[0], grad_norm=floats[1], samples=counts[0], skipped=counts[1], first_skip=counts[4], first_norm=bool(counts[5]),
                       over_step=counts[2], over_loss=floats[2], over_norm=bool(counts[3]))


def skip_unless(optimizer: torch.optim.Optimizer, ok: torch.Tensor) -> None:
    """Make the next `optimizer.step()` a no-op on the device where `ok` is False: fused AdamW
    skips its whole update (moments, step count, weight decay) when `found_inf` is 1, exactly as
    under the fp16 loss scaler. Call `clear_skip` after the step."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
    if not all(group.get("fused") for group in inner.param_groups):
        raise RuntimeError("skipping a step on the device needs a fused optimizer (found_inf)")  # a bug
    inner.found_inf = (~ok).float()


def clear_skip(optimizer: torch.optim.Optimizer) -> None:
    inner = getattr(optimizer, "optimizer", optimizer)
    if hasattr(inner, "found_inf"):
        del inner.found_inf
