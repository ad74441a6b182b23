"""Adaptation methods: one file, one registry name, a settings dataclass with `apply`.

Every module in this package is imported here so that its `@METHODS.register(...)` runs; adding a
method is adding a file. A method never owns a loop: it changes which parameters exist and train,
and says how its result is saved and loaded.
"""

from __future__ import annotations

import functools

import importlib
import json
import pkgutil
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from toolkit.lazy import lazy
from toolkit.registry import Registry
from toolkit.errors import UserError

torch = lazy("torch", globals())

METHODS: Registry[type] = Registry("method")
# parameter names Trainer keeps out of weight decay (Trainer.get_decay_parameter_names)
NOT_DECAYED = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")


@dataclass
class Context:
    """What a method may know of the model and task it adapts (never the recipe itself)."""

    family: str | None  # config.model_type of the base model
    head_names: list[str]  # module names of the task head, trained by every training method
    peft_task_type: str  # PEFT TaskType name: SEQ_CLS, CAUSAL_LM, SEQ_2_SEQ_LM, QUESTION_ANS
    tokenizer: Any
    instruction: str | None = None  # the task's natural-language instruction, for prompt init
    total_steps: int = 0  # optimizer steps the run will take (0: it does not train)
    sized: bool = True  # False: a --smoke model, whose widths are no yardstick of the recipe's sizes
    head: str = ""  # the toolkit head (toolkit.heads) the model was loaded with; "": not said


@dataclass
class HeadOnly:
    """What `incompatible` reads of a task where only its head is at hand (a refusal found as a
    method is applied: its advice, `instead`, asks the other methods about the same head)."""

    head: str

    def model_head(self, family: str | None) -> str:
        return self.head


# The train.* settings only a training loop reads (optimizer, schedule, batches, evaluations,
# checkpoints, dropout): a method that trains nothing ignores them. train.seed (the draws),
# mixed_precision (the forward's autocast), compile (said eager, compiling.eager_reason) and
# report_to (the run's metrics are still logged) are read by every run.
TRAINING_ONLY = ("epochs", "max_steps", "lr", "batch_size", "eval_batch_size", "grad_accum", "weight_decay",
                 "warmup_ratio", "warmup_steps", "max_grad_norm", "precision_mode", "group_by_length",
                 "pad_multiple", "length_buckets", "compile_optimizer", "eval_every", "log_every", "keep_best",
                 "metric", "early_stopping_patience", "save_total_limit", "save_every", "keep_checkpoints",
                 "gradient_checkpointing", "fast_dropout", "skip_nonfinite")


@dataclass
class Method:
    """Base of every method's settings dataclass."""

    name: ClassVar[str] = ""
    trains: ClassVar[bool] = True  # False: evaluation only (in-context prompting)
    # why train.compile leaves this method's step eager (one line), None where it compiles;
    # tests/test_compile.py walks the registry: every other method compiles in one graph
    compile_eager: ClassVar[str | None] = None
    # how a user loads an unmerged export whose base is in base/ ({base}: that base's load);
    # a method whose `loaded` readies the model says the call that does it here
    export_load: ClassVar[str] = "peft: PeftModel.from_pretrained({base}, OUT)"
    # whether transformers' PEFT integration (`from_pretrained` on an export holding the base
    # beside the adapter) rebuilds this method's result as trained; where not, the base goes in
    # base/ and `export_load` says the load that does (tests/test_after_runs.py performs each)
    transformers_loads: ClassVar[bool] = False
    # adds keys and values that have no position to every attention layer (prefix tuning's
    # prefixes): a positional attention module (toolkit.attention) cannot place them
    positionless_keys: ClassVar[bool] = False
    # `save` writes a whole transformers model (config.json and every weight), which a chained
    # run (`model.checkpoint: {run: ...}`) can start from; otherwise the method's own parameters
    whole_model: ClassVar[bool] = False
    # settings a recipe gives where PEFT has no default for the family (a target_modules list),
    # each with a stand-in value: `instead` asks a candidate with them where its defaults are
    # refused, and names them in its advice ("lora (with target_modules)")
    lifted_by: ClassVar[dict[str, Any]] = {}

    def incompatible(self, family: str | None, task: Any) -> str | None:
        """Why this method cannot run on this model family and task, or None; checked at validate."""
        return None

    def incompatible_checkpoint(self, family: str | None, task: Any, config: dict) -> str | None:
        """Why this method cannot run on this checkpoint, checked at validate in place of
        `incompatible`: `config` is its config.json as written where this machine has it (a local
        or packaged folder, the Hub cache; {} where not). By default the family's refusal: a
        method whose refusal of a family a checkpoint's own settings lift (bitfit on a Llama
        with `attention_bias: true`) reads them here."""
        return self.incompatible(family, task)

    def sizes(self) -> dict[str, int]:
        """Size settings bounded by the width of the layers the method adapts ('method.r': 8): none
        may exceed the smaller side of a targeted layer (`check_sizes`)."""
        return {}

    def ignores(self, task: Any) -> dict[str, str]:
        """The recipe settings this method never reads on `task` ('train.lr', 'task.max_length',
        'method.calibrate'), each with why: one set to other than its default is refused at
        validate (recipe.refuse_ignored), as a run that did something else than its recipe.yaml
        records would be. A method that trains nothing reads none of the training settings."""
        if self.trains:
            return {}
        why = f"method {self.name} trains nothing, so no training step, evaluation schedule or checkpoint reads it"
        return {**{f"train.{name}": why for name in TRAINING_ONLY},
                "model.dropout": f"method {self.name} trains nothing and scores the model in eval mode, where no "
                                 "dropout is drawn"}

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        raise NotImplementedError

    def decays(self, name: str, param: torch.nn.Parameter) -> bool:
        """Whether train.weight_decay applies to this trainable parameter: matrices do, biases and
        norms do not: no parameter whose name says it is a bias or a norm (Trainer's
        `get_decay_parameter_names` patterns: T5's relative_attention_bias, a 2-d table of biases,
        was decayed) and, beyond Trainer, none of fewer than 2 dimensions (DoRA's magnitude
        vector, which Trainer decays: it starts at each weight row's norm). A method whose
        parameters are not weights to pull toward 0 says so (IA3's scales).
        The name read is the parameter's own (its module's name and its own: `LayerNorm.bias`,
        `down.weight`), not the modules above it: a Pfeiffer adapter hangs under the LayerNorm it
        follows (`output.LayerNorm.bottleneck_adapter.down.weight`), and its matrices were kept
        out of weight decay on BERT, RoBERTa and BART, while Houlsby's were decayed."""
        if NOT_DECAYED.search(".".join(name.split(".")[-2:]).lower()):
            return False
        return len(getattr(param, "ds_shape", param.shape)) >= 2  # ZeRO-3 leaves each an empty 1-d tensor

    def layer_sizes(self, layer: str) -> dict[str, int]:
        """The size settings bounded by adapted layer `layer` (a module name of the base model)'s
        smaller side (`check_ranks`): all of `sizes` unless the method sizes layers apart."""
        return self.sizes()

    def added_positions(self) -> int:
        """Positions the method puts ahead of every input (soft prompts fed as `inputs_embeds`),
        which the model's position table holds beside task.max_length; setup checks the sum."""
        return 0

    def train_rows_needed(self) -> int:
        """The fewest train examples this method's settings read (--smoke keeps at least these)."""
        return 0

    def check_data(self, task: Any, raw: dict[str, Any]) -> None:
        """Refuse settings that the loaded data cannot satisfy (before the run folder exists)."""

    def head(self, task: Any, family: str | None = None) -> str:
        """Which model head to load (a toolkit.heads name); in-context methods need the LM head."""
        return task.model_head(family)

    def encoder(self, task: Any, tokenizer: Any) -> Any:
        """Raw split -> model-ready split; methods that rewrite inputs (prompts) wrap this."""
        return lambda dataset: task.encode(dataset, tokenizer)

    def evaluate(self, model: torch.nn.Module, setup: Any, accelerator: Any) -> dict[str, float]:
        """Metrics of a method that does not train (trains = False)."""
        raise NotImplementedError

    # --- what the loop calls while training (the defaults do nothing) ------------------------
    def extra_loss(self, model: torch.nn.Module) -> torch.Tensor | None:
        """A term of the method's own that the loop adds to each step's loss (a regulariser:
        AdaLoRA's orthogonality penalty), or None. Tasks compute the loss from the logits, so a
        term a model adds to its own `outputs.loss` would be lost without this."""
        return None

    def after_step(self, model: torch.nn.Module, step: int) -> None:
        """Called after each optimizer step that made an update, gradients still in place, with the
        global step count (1 after the first): AdaLoRA re-allocates its ranks here. A step that
        made none (skipped as non-finite, empty, an fp16 overflow) takes its step number without
        this call, so the numbers seen may skip one (docs/loop.md); it sees `skipped_step` instead."""

    def skipped_step(self, model: torch.nn.Module, step: int) -> None:
        """Called, in place of `after_step`, on a step that made no update (skipped as non-finite,
        empty, an fp16 overflow), with the step number it took: what the method does at a given
        step count whatever the gradients (AdaLoRA's re-allocation on its schedule) happens at
        that count. Its gradients are not to be read (none, or non-finite)."""

    @property
    def steps_on_host(self) -> bool:
        """Whether the method has an `after_step` or a `skipped_step` (it reads each step's
        gradients, or whether the step updated, on the host, so a step cannot be skipped on the
        device unseen by it)."""
        return (type(self).after_step is not Method.after_step
                or type(self).skipped_step is not Method.skipped_step)

    @property
    def stateful(self) -> bool:
        """Whether the method keeps state beside the weights that a resumed run needs back."""
        return type(self).state_dict is not Method.state_dict

    def state_dict(self, model: torch.nn.Module) -> dict:
        """State beside the weights (tensors, numbers, strings) saved with every checkpoint."""
        return {}

    def load_state_dict(self, model: torch.nn.Module, state: dict) -> None:
        """Put back what `state_dict` gave, on resume."""

    # --- saving and loading the result -----------------------------------------------------------
    def load(self, folder: Path, base: Callable[[], torch.nn.Module],
             whole: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """The result `save` wrote into `folder`: a PEFT adapter on `base()` (the run's base model
        with its head), else a whole model (`whole()`, the folder as a checkpoint)."""
        if (Path(folder) / "adapter_config.json").is_file():
            from peft import PeftModel

            return self.loaded(pass_segments(PeftModel.from_pretrained(base(), str(folder))))
        return whole()

    def loaded(self, model: torch.nn.Module) -> torch.nn.Module:
        """A saved result just loaded back (`PeftModel.from_pretrained`): ready it to run."""
        return model

    def saves_model(self) -> bool:
        """Whether this run's `model/` will be a whole model another run can start from (said at
        validate for a chain, before the upstream run trains: it was said only when the chained
        run started, after the upstream had run). tests/test_after_runs.py checks it against every
        method's saved folder."""
        return self.whole_model

    def save(self, model: torch.nn.Module, path: Path) -> None:
        """Write the trained result in the format plain transformers / peft load."""
        model.save_pretrained(path)
        keep_label_maps(model.config, Path(path))


def keep_label_maps(config: Any, path: Path) -> None:
    """transformers 5 leaves `id2label` out of config.json when there are 2 labels (its generic
    default), but BartConfig's own default is 3, so plain `from_pretrained` would rebuild a 3-way
    head and refuse the saved 2-way weights. Writing the maps back keeps the saved model loadable."""
    file = path / "config.json"
    if not file.is_file():  # an adapter folder: its base config is not ours to rewrite
        return
    saved = json.loads(file.read_text())
    if getattr(config, "id2label", None) and "id2label" not in saved:
        saved["id2label"] = {str(k): v for k, v in config.id2label.items()}
        saved["label2id"] = dict(config.label2id)
        file.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")


def check_sizes(method: Method, width: int, where: str, sizes: dict[str, int] | None = None) -> None:
    """One line where a size setting of `method` (`sizes`, else all of `method.sizes()`) exceeds
    `width`, the smaller side of a layer it adapts (`where` names the layer). A LoRA update B @ A
    has rank at most min(in, out) whatever r is: PEFT builds and trains a larger r (only its MiCA
    initialisation refuses one), and the rank past that adds parameters and no direction
    (AdaLoRA's orthogonality penalty can then never reach 0); a bottleneck wider than its layer is
    none, and a reduction factor above the width sized every adapter 1 where the factor asked for less."""
    for setting, value in (method.sizes() if sizes is None else sizes).items():
        if value > width:
            raise UserError(f"{setting}: {value} is more than {where} ({width}), the most a layer it adapts "
                            f"allows; use at most {width}")


def check_ranks(method: Method, wrapped: torch.nn.Module, ctx: Context) -> None:
    """`check_sizes` against every layer PEFT adapted, with the size settings that layer takes
    (`Method.layer_sizes`: LoRA's rank_pattern entry naming it, else r): its rank is bounded by
    min(in, out) (an embedding's: its rows and width). Narrowest layer first, so the line names
    the tightest bound. Skipped on a --smoke model (`Context.sized`): validate bounded the recipe
    by the real checkpoint's width."""
    if not ctx.sized:
        return
    sides = []
    for name, module in wrapped.named_modules():
        if isinstance(getattr(module, "r", None), dict) and hasattr(module, "in_features"):
            layer = name.removeprefix("base_model.model.")
            sides.append((min(int(module.in_features), int(module.out_features)), layer))
    for side, layer in sorted(sides):
        check_sizes(method, side, f"the smaller side of layer {layer}", method.layer_sizes(layer))


def wrap_peft(model: torch.nn.Module, config: Any) -> torch.nn.Module:
    """get_peft_model, with every name of a target list matching a layer of the body. PEFT raises
    a ValueError with a paragraph of advice when no name matches, and says nothing when only some
    do (`[query, vlaue]` adapted `query` alone; a head layer's name, the head being trained
    whole, adapted nothing): either is one line with the names that would match."""
    from peft import get_peft_model

    asked = sorted(config.target_modules or [])  # PEFT fills in its defaults when None
    leaves = _linear_leaves(model, config)  # before PEFT puts its own layers in
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as exc:
        if "target" not in str(exc).lower():
            raise
        raise UserError(_refused_targets(model, asked, config, str(exc), leaves)) from None
    pass_segments(wrapped)
    found = wrapped.targeted_module_names
    unmatched = [t for t in asked if not any(n == t or n.endswith("." + t) for n in found)]
    if unmatched:
        raise UserError(_no_target(unmatched, "match no layer of this model's body", leaves))
    idle, misread = _never_run(wrapped)
    if misread:
        raise UserError(f"method.target_modules: {', '.join(misread)} {'does' if len(misread) == 1 else 'do'} not look "
                        f"up {'its' if len(misread) == 1 else 'their'} input (a learned position table, read at "
                        "positions counted from the input's shape), and PEFT's embedding adapter adds the rows of "
                        "the input it is given: the adapter would be read at the wrong rows (or fail on the "
                        "input); leave it out of the list")
    if idle:
        raise UserError(f"method.target_modules: {', '.join(idle)} never run{'s' * (len(idle) == 1)} in this model's "
                        "forward, so an adapter there trains nothing (its parameters counted as trainable); "
                        f"{_run_instead(wrapped, idle)}")
    return wrapped


def _never_run(wrapped: torch.nn.Module) -> tuple[list[str], list[str]]:
    """The adapted layers a forward pass of the model on its own dummy inputs never calls, and the
    adapted embedding layers that do not look up their input. T5's and BART's `shared` embedding
    is read through the encoder's and decoder's `embed_tokens`, which hold the same weight: LoRA
    on `shared` alone got no gradient and trained nothing, its parameters counted as trainable,
    exit 0. BART's `embed_positions` is an embedding that is given the token ids (or the
    encoder's embeddings, for their shape) and reads the rows of their positions, while PEFT's
    adapter on it adds the rows of what it is given: the encoder's stopped at the first batch
    with a traceback, the decoder's read its adapter at the token ids. Both empty where the model
    has no dummy inputs or they do not run."""
    names = list(getattr(wrapped, "targeted_module_names", None) or [])
    base = wrapped.get_base_model()
    dummy = getattr(base, "dummy_inputs", None)
    if not names or not isinstance(dummy, dict):
        return [], []
    called: set[str] = set()
    misread: list[str] = []
    hooks = [base.get_submodule(n).register_forward_hook(lambda *_, n=n: called.add(n)) for n in names]
    for n in names:
        layer = getattr(base.get_submodule(n), "base_layer", None)
        if isinstance(layer, torch.nn.Embedding):
            hooks.append(layer.register_forward_hook(functools.partial(_check_lookup, n, misread)))
    try:
        device = next(base.parameters()).device
        with torch.no_grad():
            base(**{k: v.to(device) if hasattr(v, "to") else v for k, v in dummy.items()})
    except Exception:  # noqa: BLE001 -- a check only: a model its dummy inputs cannot drive is not judged
        return [], sorted(set(misread))
    finally:
        for hook in hooks:
            hook.remove()
    return [n for n in names if n not in called], sorted(set(misread))


def _check_lookup(name: str, misread: list[str], layer: Any, args: tuple, output: Any) -> None:
    """Forward hook on an adapted embedding's own layer: `name` into `misread` where its output is
    not its table's rows at its input (times the layer's `embed_scale`, which PEFT applies too)."""
    ids = args[0] if args else None
    if (not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.numel() == 0
            or int(ids.min()) < 0 or int(ids.max()) >= layer.num_embeddings):
        misread.append(name)
        return
    scale = getattr(layer, "embed_scale", 1.0)
    want = torch.nn.functional.embedding(ids, layer.weight) * scale
    if not isinstance(output, torch.Tensor) or output.shape != want.shape or not torch.allclose(output, want.to(output.dtype)):
        misread.append(name)


def _run_instead(wrapped: torch.nn.Module, idle: list[str]) -> str:
    """What does run in their place: the layers holding the same weight."""
    base = wrapped.get_base_model()
    layers = [getattr(base.get_submodule(n), "base_layer", None) for n in idle]
    weights, kinds = {id(getattr(m, "weight", None)) for m in layers}, {type(m) for m in layers}
    sharing = sorted(n for n, m in base.named_modules() if n not in idle and id(getattr(m, "weight", None)) in weights
                     and type(m) in kinds and not n.endswith(".base_layer"))  # embeddings, not a tied LM head
    if sharing:
        return f"the model reads that weight through {', '.join(sharing)}: target those, or leave it out"
    return "leave it out of the list"


def _linear_leaves(model: torch.nn.Module, config: Any) -> list[str]:
    """The names a target list may give: the last part of each linear layer's name, the head's
    (`modules_to_save`, trained whole and never adapted) left out."""
    heads = list(config.modules_to_save or [])
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                   if type(m).__name__ in ("Linear", "Conv1D") and "." in n and not is_head(n, heads)})


def _refused_targets(model: torch.nn.Module, asked: list[str], config: Any, error: str, leaves: list[str]) -> str:
    """The line for a target list PEFT refused: the names of a kind of layer the method cannot
    adapt (PEFT's "Target module LayerNorm(...) is not supported": `[query, LayerNorm]` was said
    as both names matching no layer, `query` among them), else those matching no layer at all."""
    heads = list(config.modules_to_save or [])
    kinds = {t: {type(m).__name__ for n, m in model.named_modules()
                 if (n == t or n.endswith("." + t)) and not is_head(n, heads)} for t in asked}
    refused = re.search(r"Target module (\w+)\(", error)
    kind = refused.group(1) if refused else None
    wrong = [t for t in asked if kind in kinds[t]]
    if wrong:
        method = str(getattr(config.peft_type, "value", config.peft_type))
        return (f"method.target_modules: {wrong} {'names' if len(wrong) == 1 else 'name'} {kind} layers, which PEFT's "
                f"{method} cannot adapt (this model's linear layers: {', '.join(leaves)})")
    return _no_target([t for t in asked if not kinds[t]] or asked, "match no layer of this model", leaves)


def _no_target(names: list[str], what: str, leaves: list[str]) -> str:
    return f"method.target_modules: {names} {what} (its linear layers: {', '.join(leaves)})"


def merged(model: torch.nn.Module, setting: str = "--merge") -> torch.nn.Module:
    """A PEFT model's weight deltas folded into its base (PEFT's merge_and_unload), each
    `modules_to_save` head first put in place as its trained copy. IA3's unload took the head's
    wrapper for a layer and read its `.weight`, which a head built of several layers (RoBERTa's
    classifier, BART's and T5's classification_head) has not: `export --merge` of every such IA3
    run was an AttributeError traceback."""
    wrapper = getattr(sys.modules.get("peft.utils.other"), "ModulesToSaveWrapper", None)
    for name, module in list(model.named_modules()):
        if wrapper is not None and isinstance(module, wrapper) and not module.disable_adapters:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child,
                    module.modules_to_save[module.active_adapters[0]])
    check_mergeable(model, setting)
    return model.merge_and_unload()


def check_mergeable(model: torch.nn.Module, setting: str) -> None:
    """Refuse to merge an adapted layer whose weight another layer shares (an LM head tied to the
    input embeddings: GPT-2's `lm_head`, T5's and BART's, BERT's MLM `decoder`, when a target list
    names it). Merging writes the delta into that one tensor, so it reached the embeddings too: a
    GPT-2 saved merged 80 logits away from the model it trained, exit 0; and transformers 5 saves
    no untied copy of BART's (the reloaded encoder and decoder embeddings came out random)."""
    places: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        places.setdefault(id(param), []).append(name)
    for name, module in model.named_modules():
        weight = getattr(getattr(module, "base_layer", None), "weight", None)
        shared = [n for n in places.get(id(weight), []) if not n.startswith(name + ".")]
        if weight is not None and shared:
            layer = name.removeprefix("base_model.model.")
            raise UserError(f"{setting}: the adapted layer {layer} shares its weight with "
                            f"{shared[0].removeprefix('base_model.model.')} (tied), so merging would change both; "
                            f"keep the adapter unmerged, or leave {layer.rsplit('.', 1)[-1]} out of method.target_modules")


def pass_segments(peft_model: Any) -> Any:
    """A PEFT question-answering model given the segment ids (`token_type_ids`) it is called with;
    returns the same model. PeftModelForQuestionAnswering takes `token_type_ids` by name and hands
    it to no one, so BERT's extractive QA under LoRA, IA3, AdaLoRA, DoRA, prompt or p-tuning
    trained and scored with every token in segment 0, the question not told from the context, and
    its export (plain transformers, which passes them) answered otherwise than the run, exit 0.
    A hook on each segment-embedding module (one with `token_type_embeddings`) puts them back
    where the call lost them, zeros first for the soft prompt's positions, as PEFT's classifiers
    do. Hooks, not a replaced forward: a method's own forward (`_own_positions`) calls PEFT's."""
    task = str(getattr(peft_model.active_peft_config.task_type, "value", peft_model.active_peft_config.task_type))
    if task != "QUESTION_ANS" or getattr(peft_model, "tk_passes_segments", False):
        return peft_model
    embedders = [m for m in peft_model.modules() if hasattr(m, "token_type_embeddings")]  # found once
    peft_model.register_forward_pre_hook(functools.partial(_hold_segments, embedders), with_kwargs=True)
    for module in embedders:
        module.register_forward_pre_hook(_give_segments, with_kwargs=True)
    peft_model.tk_passes_segments = True
    return peft_model


def _hold_segments(embedders: list, model: Any, args: tuple, kwargs: dict) -> None:
    """The outer call's segment ids, held on the modules that embed them (None: none given)."""
    for module in embedders:
        module.tk_segments = kwargs.get("token_type_ids")


def _give_segments(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    held, module.tk_segments = getattr(module, "tk_segments", None), None
    if held is None or kwargs.get("token_type_ids") is not None:
        return None
    ids = kwargs.get("input_ids", args[0] if args else None)
    inputs = ids if ids is not None else kwargs.get("inputs_embeds")
    extra = inputs.shape[1] - held.shape[1]  # a soft prompt's positions ahead of the input
    if extra < 0:
        return None
    kwargs["token_type_ids"] = torch.cat([held.new_zeros(held.shape[0], extra), held], dim=1)
    return args, kwargs


def peft_task_type(ctx: Context) -> Any:
    """PEFT's TaskType for the head, or None (masked LM: PEFT has none, a plain PeftModel wraps it)."""
    from peft import TaskType

    return TaskType[ctx.peft_task_type] if ctx.peft_task_type else None


def set_trainable(model: torch.nn.Module, keep: "callable") -> None:
    """requires_grad = keep(name) for every parameter."""
    for name, param in model.named_parameters():
        param.requires_grad_(bool(keep(name)))


def is_head(name: str, head_names: list[str]) -> bool:
    return any(name == h or name.startswith(h + ".") for h in head_names)


def count_params(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total): every parameter of the model the forward computes, counted once even
    when tied, at its whole size; trainable is what the optimizer steps (train._optimizer takes
    the parameters that require grad).

    PEFT keeps a `modules_to_save` head twice: the original, frozen and idle while the adapter
    is active (kept to unload), and the trained copy the forward runs. Counting both put the head
    in total_params twice; the idle original is left out (`idle_copies`)."""
    seen: set[int] = idle_copies(model)
    trainable = total = 0
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        size = getattr(param, "ds_numel", None) or param.numel()  # ZeRO-3 partitioned at load: its whole size
        total += size
        trainable += size if param.requires_grad else 0
    return trainable, total


def idle_copies(model: torch.nn.Module) -> set[int]:
    """ids of the parameters PEFT keeps but the forward does not run: those reached only through
    the original module of a `modules_to_save` wrapper whose trained copy is active (a weight
    tied elsewhere, an LM head's to the embeddings, still counts). Empty where PEFT was never
    imported (no wrapper can exist)."""
    other = sys.modules.get("peft.utils.other")
    wrapper = getattr(other, "ModulesToSaveWrapper", None)
    if wrapper is None:
        return set()
    idle = [f"{name}.original_module." for name, module in model.named_modules()
            if isinstance(module, wrapper) and not module.disable_adapters
            and any(a in module.modules_to_save for a in module.active_adapters)]
    if not idle:
        return set()
    places: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        places.setdefault(id(param), []).append(name)
    return {pid for pid, names in places.items()
            if all(any(n.startswith(prefix) for prefix in idle) for n in names)}


_advising: list[bool] = []  # set while `instead` asks the candidates (their own advice is not read)


def instead(family: str | None, task: Any, names: tuple[str, ...], lead: str = "use") -> str:
    """A refusal's advice: 'use a, b or c', the methods of `names` (in that order) whose
    `incompatible` accepts this family and task at their default settings, so that following the
    advice is never refused at validate in turn. Written by hand per refusal, it named bitfit for
    every family but T5: prompt tuning on a Llama classifier, or freeze on an mT5 summarizer,
    advised bitfit, which then refused the bias-free body. While the candidates are asked their
    own refusals' advice is not computed (freeze's names bitfit and bitfit's freeze): '' stands in.
    A candidate refused at its defaults but accepted with the settings of its `lifted_by` (PEFT
    has no default target modules for the family) is named with them: 'lora (with
    target_modules)'. Left out, freeze on a warm-started encoder-decoder advised 'lora, ia3' when
    each, followed as said, was refused for want of target_modules."""
    if _advising:
        return ""
    _advising.append(True)
    try:
        fits = [said for said in (_fits(n, family, task) for n in names) if said]
    finally:
        _advising.clear()
    if not fits:
        return f"none of {', '.join(names)} runs it either; use another model"
    said = fits[0] if len(fits) == 1 else f"{', '.join(fits[:-1])} or {fits[-1]}"
    return f"{lead} {said}"


def _fits(name: str, family: str | None, task: Any) -> str | None:
    """How `instead` names method `name` for this family and task: its name where its defaults
    are accepted, with the settings of its `lifted_by` where those are needed, else None."""
    method = METHODS.get(name)
    if method().incompatible(family, task) is None:
        return name
    if method.lifted_by and method(**method.lifted_by).incompatible(family, task) is None:
        return f"{name} (with {' and '.join(method.lifted_by)})"
    return None


for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):  # _bottleneck: a module of adapters, not a method
        importlib.import_module(f"{__name__}.{_info.name}")
