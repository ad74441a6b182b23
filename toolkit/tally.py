"""The training step's numbers, kept on the device between the steps that log.

Reading a number to the host (`.item()`, `.tolist()`, `float(t)`, `if t:`) makes the host wait
for every queued kernel: on a GPU the step becomes launch-bound, and CUDA graphs cannot run ahead.
So the loop adds each step's loss, gradient norm, sample count and finite flag here with one
device operation, and reads them back in one transfer at the steps that log, evaluate or save,
and at the end (`read`). A non-finite step is skipped on the device by the optimizer itself (fused
AdamW's `found_inf`, the mechanism the fp16 loss scaler uses), so the weights never take a
non-finite update while nobody is looking; `read` then names the step at which the run went past
`train.skip_nonfinite`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Reading:
    """What one `Tally.read` brings to the host."""

    loss: float  # the last step's loss
    grad_norm: float  # the last step's gradient norm before clipping (measured with clipping off too)
    samples: int  # examples the steps since the last read took (skipped ones too: their time counts)
    skipped: int  # non-finite steps since the last read (skipped on the device)
    first_skip: int  # the first skipped step since the last read; 0: none
    first_norm: bool  # that step's loss was finite: its gradient norm was not
    over_step: int  # the step at which the skips went past the limit; 0: not past it
    over_loss: float  # that step's loss
    over_norm: bool  # that step's loss was finite: its gradient norm was not
    empty: int = 0  # steps since the last read whose batches held no loss unit (no update made)
    # the micro-batches of each skipped step, in step order (train.grad_accum, fewer at an epoch's
    # end): a skip drops the step's whole accumulation window, and is said in both units
    skipped_micro: tuple = ()
    first_empty: int = 0  # the first of them; 0: none
    # the finite steps' losses since the last read, in step order: the logged loss is a mean over the
    # steps since the last log, and metrics.json's train_loss over the run's; each is summed one by one
    losses: tuple = ()


class Tally:
    """Each step's loss, gradient norm, examples and finite flag, one small device tensor per step,
    between two reads; the counting (samples, skips, the step past the limit) is done on the host
    at the read. One stack per step: the sums this once kept on the device took some forty small
    ops per step, each a kernel launch the host paid for on a GPU (issue 35)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.rows: list[torch.Tensor] = []  # per step: loss, norm, samples, finite (float32, on the device)
        self.steps: list[tuple[int, int, int]] = []  # per step: (its number, the skips still allowed, micro-batches)

    @property
    def pending(self) -> bool:
        return bool(self.rows)

    def add(self, step: int, loss: torch.Tensor, norm: torch.Tensor, samples: torch.Tensor,
            ok: torch.Tensor, allowed: int, empty: torch.Tensor | None = None, micro: int = 1) -> None:
        """Record optimizer step `step` (1-based); device operations only, no host read. `empty`:
        the step's batches held no loss unit (an MLM batch that drew no mask): its loss is 0/0,
        no update was made, and it is counted as such, not as a non-finite step. `micro`: the
        micro-batches the step accumulated (on the host: no device read)."""
        flag = torch.zeros_like(ok, dtype=torch.float32) if empty is None else empty.float()
        self.rows.append(torch.stack([loss.float(), norm.float(), samples.float(), ok.float(), flag]))
        self.steps.append((step, allowed, micro))

    def read(self) -> Reading:
        """One transfer to the host, then the record restarts."""
        real = bool(self.rows)  # an empty read stands in one finite step of loss 0: not a loss to average
        values = torch.stack(self.rows).tolist() if real else [[0.0, 0.0, 0.0, 1.0, 0.0]]
        steps = self.steps or [(0, 0, 0)]
        self.reset()
        samples = skipped = first_skip = over_step = empty = first_empty = 0
        first_norm = over_norm = False
        over_loss = 0.0
        losses, skipped_micro = [], []
        for (loss, _, n, ok, none), (step, allowed, micro) in zip(values, steps):
            samples += int(n)  # fed forward and backward, its time counted: a skipped step's too
            if none:
                empty, first_empty = empty + 1, first_empty or step
            if ok or none:
                if not none:  # an empty step's loss is 0/0: not a loss to average
                    losses.append(loss)
                continue
            skipped += 1
            skipped_micro.append(micro)
            if not first_skip:
                first_skip, first_norm = step, math.isfinite(loss)
            if skipped > allowed and not over_step:
                over_step, over_loss, over_norm = step, loss, math.isfinite(loss)
        return Reading(loss=values[-1][0], grad_norm=values[-1][1], samples=samples, skipped=skipped,
                       first_skip=first_skip, first_norm=first_norm, over_step=over_step, over_loss=over_loss,
                       over_norm=over_norm, empty=empty,
                       first_empty=first_empty, losses=tuple(losses) if real else (),
                       skipped_micro=tuple(skipped_micro))


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
