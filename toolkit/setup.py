"""What a run is made of, built before its folder exists: the task's data, the model with its
head and attention, the method applied, the splits encoded. User errors surface here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from accelerate.utils import set_seed

from toolkit import attention, chain, evaluation, heads, models, runs
from toolkit.errors import UserError
from toolkit.methods import Context, count_params
from toolkit.recipe_data import RunPlan, largest_warmup_ratio
from toolkit.tasks import Task


@dataclass
class Setup:
    """Everything a run needs, built before its folder is created (user errors surface here)."""

    task: Task
    model: torch.nn.Module
    tokenizer: Any
    train: Any  # tokenized Dataset or None
    evals: dict[str, Any]  # suffix -> encoded eval split
    raw_evals: dict[str, Any]  # suffix -> the same split's raw examples (what scoring sees)
    trainable: int
    total: int
    seed: int = 0  # train.seed: what methods that draw at random (icl demonstrations) use
    predictions: dict = field(default_factory=dict)  # suffix -> rows of the latest evaluation
    source: str = ""  # the checkpoint as models.load got it before --smoke (a chained run's model/)
    scores_train: bool = False  # the eval splits are the train split (toolkit evaluate --split train)
    # the task's files as this launch read them (runs.data_fingerprint), taken before they are read:
    # metrics.json's data_sha256, what eval checks the data against. Taken when the run finished, a
    # file edited while the run trained was recorded as the data it was made with, exit 0
    data_sha256: str = ""


def seed_process(seed: int, process: int) -> None:
    """Each process's own random stream for what training draws (dropout masks), set once the
    model is built: everything built is the same on every process (all drew from train.seed, as
    the weights must be), and what a step draws is not. Process 0 keeps train.seed's stream, a
    1-process run's; process r > 0 takes torch's generators from the pair (seed, r). Seeded alike,
    as transformers' Trainer seeds them (transformers#31412), N processes applied the same masks,
    row for row and layer for layer, to their N shares of every step: a 2-process run's dropout
    was not a 1-process run's at the same global batch (exit 0). Data order and the pretraining
    objectives' masks have generators of their own (batching, the tasks' collators)."""
    if process:
        torch.manual_seed(int(np.random.SeedSequence([seed, process]).generate_state(1)[0]))


def check_units(task: Task, collate: Any, train: Any, evals: dict[str, Any]) -> None:
    """Something to learn from and something to score, before the model trains: a training split
    with no example would have the loop wait forever for its first batch (evaluating and saving
    step 0 again and again), one with no loss unit (text too short to mask) would stop at step 1
    as if the loss had diverged, and an eval split with none would score perplexity 1 from nothing."""
    if len(train) == 0 or not evaluation.has_units(task, collate, train):
        held = "no example" if len(train) == 0 else f"{len(train)} example(s) and no token the loss is taken on"
        raise UserError(f"task: the {task.name} training split holds {held} once encoded (its text is too "
                        "short for the task to make, mask or predict any of it); give it more text")
    evaluation.check_something_to_score(task, collate, evals)


def check_warmup(train: Any, steps: int) -> None:
    """Step k of a warm-up of W steps trains at (k-1)/W of train.lr (transformers' linear
    schedule, step 1 at 0): train.lr is first reached at step W+1, so a warm-up of all the run's
    steps never reaches it and never decays, and a 1-step run trains at 0 (its model is the
    base's, exit 0). Refused however the warm-up is given: `warmup_steps`, or a `warmup_ratio`
    whose steps round up (Trainer's ceil) to all of a short run's (0.06 of a 1-step run is 1).
    A run at train.lr 0 trains nothing whatever its warm-up (the "before training" figure of a
    recipe, `train.lr=0 train.max_steps=1`): not refused."""
    warmup = train.warmup(steps)
    if warmup < steps or not train.lr:
        return
    why = ("the warm-up would not end within the run (its step k trains at (k-1)/W of train.lr, W the "
           "warm-up's steps), and the learning rate would stop short of train.lr")
    if train.warmup_steps:
        raise UserError(f"train.warmup_steps: {train.warmup_steps} is "
                        f"{'all' if train.warmup_steps == steps else 'more than'} the run's {steps} "
                        f"optimizer steps: {why}; use at most {steps - 1}, or train.warmup_ratio")
    largest = largest_warmup_ratio(steps)
    fix = (f"use a warmup_ratio of at most {largest:g} (or train.warmup_steps of at most {steps - 1})"
           if largest else "set warmup_ratio: 0, or train more than one step")
    raise UserError(f"train.warmup_ratio: {train.warmup_ratio:g} of the run's {steps} optimizer "
                    f"step{'s' * (steps > 1)} rounds up to {warmup} warm-up step{'s' * (warmup > 1)} (as Trainer "
                    f"rounds it), all of the run: {why}{' (its only step trains at 0)' if steps == 1 else ''}; "
                    f"{fix}")


def check_positions(recipe: Any, model: torch.nn.Module, tok: Any, length: int) -> None:
    """One line where a sequence of `length` (task.max_length) tokens, with the method's virtual
    tokens, or a longer one the task builds from it, does not fit the model's positions: when a
    run is built, and when a finished run is scored with a task.max_length of the user's
    (`toolkit eval RUN task.max_length=4096`: an IndexError traceback inside the model)."""
    task = recipe.task
    limit = models.max_positions(model.config, tok, model)
    if limit is not None and length > limit:
        own = models.max_positions(model.config, None, model)
        held = (f" (its tokenizer's model_max_length; the model's config has {own})" if limit != own else "")
        raise UserError(f"task.max_length: {length} is more than the {limit} positions "
                        f"{recipe.model.checkpoint} has{held}; use at most {limit}")
    added = recipe.method.added_positions()  # soft prompts come first, and lengthen every sequence
    if limit is not None and added and length + added > limit:
        raise UserError(f"task.max_length: {length} tokens after the method's {added} virtual tokens "
                        f"(method.num_virtual_tokens) are more than the {limit} positions "
                        f"{recipe.model.checkpoint} has; " + (f"use task.max_length at most {limit - added}"
                        if limit - added >= 8 else "use fewer method.num_virtual_tokens"))
    limit = limit - added if limit is not None else None  # what the task's own sequences may use
    problem = task.positions_problem(tok, length, limit) if limit is not None else None
    if problem:
        raise UserError(f"{problem} {recipe.model.checkpoint} has")


def build(plan: RunPlan, processes: int = 1) -> Setup:
    """Data, model and method in the order their errors should surface; the data is encoded
    before the method applies, so the method's context knows the run's optimizer steps. The plan,
    not the recipe, says where a chained run's model is and the length as written (--smoke)."""
    recipe = plan.recipe
    task = recipe.task
    data_sha256 = runs.data_fingerprint(task.data_files())  # what is read next, as the run id hashed it
    raw = task.load()
    task.note_eval_in_train(raw)  # said with the data's notices
    source = chain.source(plan)  # a {run: ...} reference: that run's model (smoke-sized or not)
    checkpoint = models.smoke_checkpoint(source) if recipe.smoke and plan.upstream is None else source
    set_seed(recipe.train.seed)  # head and adapter initialisation depend on the seed alone
    head = recipe.method.head(task, models.recipe_family(checkpoint, recipe.model.warm_start))
    model, tok = models.load(checkpoint, head, task.head_kwargs(), recipe.model.attention, recipe.model.dropout,
                             warm_start=recipe.model.warm_start, words=task.words_given)
    task.adapt_tokenizer(tok)  # saved with the run (train.save_result)
    task.note_unreadable_splits(tok, raw)  # input text the tokenizer reads as unknown: said with the notices
    length = max(task.max_length, plan.written_max_length or 0)  # --smoke: the length as written
    check_positions(recipe, model, tok, length)
    problem = task.model_problem(model)  # a setting the checkpoint's own config leaves unread
    if problem:
        raise UserError(problem)
    added = recipe.method.added_positions()
    longest, parts = task.longest_sequence(tok, length)
    dense = attention.dense_warning(recipe.model.attention, longest + added,
                                    parts + (f" + {added} virtual tokens" if added else ""))
    if dense:
        task.note("dense attention", dense)  # said with the data's notices, once per run
    recipe.method.check_data(task, raw)
    if recipe.train.gradient_checkpointing and not getattr(model, "supports_gradient_checkpointing", False):
        raise UserError(f"train.gradient_checkpointing: {type(model).__name__} does not support it")
    if recipe.method.trains and raw["train"] is None:
        raise UserError(f"task: {recipe.task.name} has no train split here")
    encode = recipe.method.encoder(task, tok)
    train = encode(raw["train"]) if recipe.method.trains else raw["train"]
    evals = {sfx: encode(ds) for sfx, ds in raw["eval"].items()}
    if recipe.method.trains:  # a method that does not train scores by its own rules (evaluate)
        check_units(task, task.collator(tok, model), train, evals)
    steps = recipe.train.optimizer_steps(len(train), processes)[1] if recipe.method.trains else 0
    if recipe.method.trains:
        check_warmup(recipe.train, steps)
    ctx = Context(family=model.config.model_type, head_names=models.head_names(model),
                  peft_task_type=heads.get(head).peft_task_type, tokenizer=tok,
                  instruction=getattr(task, "instruction", None), total_steps=steps, sized=not recipe.smoke,
                  head=head)
    model = recipe.method.apply(model, ctx)
    if recipe.train.gradient_checkpointing:  # after the method: PEFT refuses prefix tuning on a
        # model already checkpointing (its cache route breaks under recomputation; ours does not).
        # Non-reentrant: works when the inputs do not require grad (a frozen base under PEFT)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    attention.keep_trainable(model)  # an attention module's own parameters train with every method
    trainable, total = count_params(model)
    if recipe.method.trains and trainable == 0:
        raise UserError(f"method.name: '{recipe.method.name}' left no parameter to train")
    task.say_notices()  # what was cut or may be misread, over every split: once per run that starts
    return Setup(task, model, tok, train, evals, raw["eval"], trainable, total, recipe.train.seed, source=source,
                 data_sha256=data_sha256)
