"""AdaLoRA through PEFT (Zhang et al. 2023): LoRA in SVD form whose rank budget is re-allocated
during training, from `init_r` per layer down to `target_r` on average, to the layers where the
singular values matter most.

It uses every hook of the method contract: the schedule needs the run's optimizer steps
(`Context.total_steps`); PEFT's `update_and_allocate` runs after each optimizer step; the
orthogonality penalty (PEFT adds it to `outputs.loss`, which the toolkit's tasks do not use) is
added by the loop through `extra_loss`; the rank allocator's importance estimates and the rank
pattern are checkpointed, so a resumed run allocates exactly as an uninterrupted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, check_mergeable, check_ranks, peft_task_type, wrap_peft
from toolkit.methods.lora import no_default_targets, save_merged
from toolkit.schema import UNORDERED

torch = lazy("torch", globals())

ALLOCATOR_STATE = ("ipt", "exp_avg_ipt", "exp_avg_unc")  # PEFT RankAllocator's running estimates


@METHODS.register("adalora")
@dataclass
class AdaLora(Method):
    compile_eager = "its after_step re-allocates ranks with host reads every step"

    init_r: int = field(default=12, metadata={"min": 1})  # rank of every layer at the start
    target_r: int = field(default=8, metadata={"min": 1})  # average rank at the end
    alpha: int = field(default=16, metadata={"min": 1})
    dropout: float = field(default=0.0, metadata={"min": 0.0, "below": 1.0})  # 1: the adapters see zeros, never train
    target_modules: list[str] | None = field(default=None, metadata={"min_items": 1, UNORDERED: True})  # None: PEFT's AdaLoRA default for the family (RoBERTa: query, key, value, dense)
    tinit_ratio: float = field(default=0.1, metadata={"min": 0.0, "max": 1.0})  # steps at full rank first
    tfinal_ratio: float = field(default=0.2, metadata={"min": 0.0, "max": 1.0})  # steps at the final ranks last
    delta_t: int = field(default=10, metadata={"min": 1})  # steps between two re-allocations
    beta1: float = field(default=0.85, metadata={"min": 0.0, "below": 1.0})  # importance smoothing (1: never updated)
    beta2: float = field(default=0.85, metadata={"min": 0.0, "below": 1.0})  # uncertainty smoothing
    orth_reg_weight: float = field(default=0.5, metadata={"min": 0.0})
    merge: bool = False  # save the weights merged into the base: a plain transformers folder
    lifted_by: ClassVar[dict[str, Any]] = {"target_modules": ["query"]}  # no PEFT default for the family

    def incompatible(self, family: str | None, task: Any) -> str | None:
        if self.target_r > self.init_r:
            return f"method.target_r: {self.target_r} is more than method.init_r ({self.init_r}); ranks only shrink"
        if self.tinit_ratio + self.tfinal_ratio >= 1.0:
            return (f"method.tinit_ratio + method.tfinal_ratio: {self.tinit_ratio} + {self.tfinal_ratio} "
                    "leave no steps to re-allocate ranks in; keep their sum below 1")
        return no_default_targets(self.target_modules, family, "ADALORA")  # PEFT's own table for AdaLoRA

    def sizes(self) -> dict[str, int]:
        return {"method.init_r": self.init_r}  # target_r is at most init_r (incompatible)

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        from peft import AdaLoraConfig

        steps = max(ctx.total_steps, 1)
        tinit, tfinal = math.floor(self.tinit_ratio * steps), math.floor(self.tfinal_ratio * steps)
        config = AdaLoraConfig(
            task_type=peft_task_type(ctx), init_r=self.init_r, target_r=self.target_r,
            lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=self.target_modules,
            tinit=tinit, tfinal=tfinal, deltaT=self.delta_t, beta1=self.beta1, beta2=self.beta2,
            orth_reg_weight=0.0,  # the loop adds it (extra_loss): PEFT would add it to outputs.loss
            total_step=steps, modules_to_save=list(ctx.head_names) or None,
        )
        wrapped = wrap_peft(model, config)
        check_ranks(self, wrapped, ctx)
        if self.merge:  # before training: the save would refuse it after the whole run
            check_mergeable(wrapped, "method.merge")
        return wrapped

    # --- the loop's hooks ----------------------------------------------------------------------
    def extra_loss(self, model: torch.nn.Module) -> torch.Tensor | None:
        """PEFT's orthogonality penalty, as its AdaLoraModel.forward computes it: the mean over
        the adapter's A and B matrices of ||A A^T - I||_F and ||B^T B - I||_F, times the weight."""
        if not self.orth_reg_weight:
            return None
        name = model.active_adapter
        terms = []
        for n, p in model.named_parameters():
            if ("lora_A" in n or "lora_B" in n) and name in n:
                cov = p @ p.T if "lora_A" in n else p.T @ p  # (r, r)
                terms.append(torch.linalg.matrix_norm(cov - torch.eye(cov.shape[0], device=p.device, dtype=p.dtype)))
        return self.orth_reg_weight * torch.stack(terms).mean() if terms else None

    def after_step(self, model: torch.nn.Module, step: int) -> None:
        """PEFT's update_and_allocate, which finalizes the ranks at exactly step total - tfinal
        and afterwards only masks with that final pattern. A step that made no update (skipped
        as non-finite, empty, an fp16 overflow) still takes its slot but is not seen here
        (`skipped_step` is); where it could not finalize there (no importance estimated yet),
        the first step past it finalizes instead (the importance PEFT clears when finalizing is
        still held): else the final ranks were never set, and masking raised on a None pattern
        or kept the last, larger, budget's."""
        config = model.peft_config[model.active_adapter]
        final = config.total_step - config.tfinal
        if step > final and (model.base_model.rankallocator.ipt or config.rank_pattern is None):
            step = final
        model.base_model.update_and_allocate(step)

    def skipped_step(self, model: torch.nn.Module, step: int) -> None:
        """A step that made no update: its gradients add nothing to the importance estimates,
        but a re-allocation due at its count (every `delta_t` steps between tinit and
        total - tfinal, and the finalizing one at total - tfinal) happens at it, on the
        estimates so far, to that step's budget, as PEFT's `update_and_allocate` would
        (without its `update_ipt`). Not seen before: a skipped step on the re-allocation
        schedule kept the previous, larger, budget's ranks for `delta_t` more steps (exit 0)."""
        config = model.peft_config[model.active_adapter]
        allocator, final = model.base_model.rankallocator, config.total_step - config.tfinal
        if step > final or not allocator.exp_avg_ipt:  # finalized, or nothing estimated to allocate by
            return
        budget, due = allocator.budget_schedule(step)
        if due or step == final:
            config.rank_pattern = allocator.mask_to_budget(model.base_model.model, budget)
        if step == final:
            allocator.reset_ipt()

    def state_dict(self, model: torch.nn.Module) -> dict:
        allocator = model.base_model.rankallocator
        state = {key: {n: t.cpu() for n, t in getattr(allocator, key).items()} for key in ALLOCATOR_STATE}
        state["rank_pattern"] = model.peft_config[model.active_adapter].rank_pattern
        return state

    def load_state_dict(self, model: torch.nn.Module, state: dict) -> None:
        allocator = model.base_model.rankallocator
        device = next(model.parameters()).device
        for key in ALLOCATOR_STATE:
            setattr(allocator, key, {n: t.to(device) for n, t in state[key].items()})
        model.peft_config[model.active_adapter].rank_pattern = state["rank_pattern"]

    def saves_model(self) -> bool:
        return self.merge  # merged: a plain transformers folder; else the adapter alone

    def save(self, model: torch.nn.Module, path: Path) -> None:
        """merge: the SVD-form deltas folded into the base weights (PEFT's merge_and_unload)."""
        if not self.merge:
            pattern_of_weights(model)
            return super().save(model, path)
        save_merged(model, Path(path))


def pattern_of_weights(model: torch.nn.Module) -> None:
    """The rank pattern PEFT saves beside the weights (and prunes the saved ranks by), made the
    one the weights hold: a rank is kept where its singular value (lora_E) is not 0. The pattern
    in the config is the last step's allocation, while train.keep_best restores an earlier step's
    weights (the method's state stays the last step's), whose masked ranks differ: the saved
    adapter dropped ranks the scored model used and `toolkit eval` of the run gave another loss
    (GPT-2: 1.0477 for the run's 1.0457), exit 0. A rank whose value is 0 adds nothing, so the
    pattern read from the weights reloads the model that was scored, exactly."""
    name = model.active_adapter
    config = model.peft_config[name]
    if config.rank_pattern is None:
        return  # never re-allocated: every rank is saved
    suffix = f"lora_E.{name}"
    config.rank_pattern = {n: (p.detach().view(-1) != 0).tolist()
                           for n, p in model.base_model.model.named_parameters() if n.endswith(suffix)}
