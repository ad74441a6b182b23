"""Recipe data: the typed sections, the resolved recipe and its hash, the run plan beside it (what
a launch found: chained runs, the --smoke length as written), YAML files with `extends:`
and `key=value` overrides, --smoke sizes, and finding shipped recipes. Nothing here knows a
plug-in: building and checking a recipe against the registries, models and chained runs is
toolkit/recipe.py, above this.

A recipe is data. `extends:` names base files (relative to the recipe) that are deep-merged
underneath it; every other key is a typed field of the dataclasses below, or of the method's own
settings dataclass (see toolkit/methods). The resolved recipe is what gets saved and hashed.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from toolkit.errors import UserError, user_path
from toolkit.schema import DECIMAL, DERIVED, NO_EFFECT, NONE_ALIAS, UNORDERED, UNUSED_WHEN, decimal_float, unhashed


def _min(v: float) -> dict:
    return {"min": v}


@dataclass
class ModelConfig:
    checkpoint: str | dict  # a Hub id or folder, or {run: RECIPE, overrides: [...]} (toolkit/chain.py)
    # str | dict | None: a transformers name (eager, sdpa, ...), a toolkit module ({name: local,
    # window: 64}, or its bare name) built into its settings at parse time; None = the default
    attention: Any = None
    dropout: float | None = field(default=None, metadata={"min": 0.0, "below": 1.0})  # 1 drops everything
    # encoder-decoder: an EncoderDecoderModel warm-started from the checkpoint as both encoder and
    # decoder (Rothe et al. 2020), so an encoder such as MiniLM can summarize
    warm_start: Literal["encoder-decoder"] | None = None


@dataclass
class TrainConfig:
    epochs: float = field(default=3.0, metadata={"min": 0.0, UNUSED_WHEN: lambda t: t.max_steps is not None})
    max_steps: int | None = field(default=None, metadata=_min(1))
    lr: float = field(default=2e-5, metadata=_min(0.0))
    batch_size: int = field(default=32, metadata=_min(1))
    eval_batch_size: int | None = field(default=None, metadata={"min": 1, DERIVED: lambda t, _: 2 * t.batch_size})
    grad_accum: int = field(default=1, metadata=_min(1))
    weight_decay: float = field(default=0.0, metadata=_min(0.0))
    warmup_ratio: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    warmup_steps: int = field(default=0, metadata=_min(0))
    max_grad_norm: float | None = field(default=1.0, metadata={"min": 0.0, NONE_ALIAS: 0.0})  # 0: off, as null
    seed: int = field(default=42, metadata={"min": 0, "max": 2**32 - 1})
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    # bf16 only: autocast over fp32 weights, or bf16 weights with fp32 masters in the optimizer
    # (toolkit/precision.py, docs/gpu.md)
    precision_mode: Literal["autocast", "bf16_master"] = "autocast"
    group_by_length: bool = True  # batches of similar length, in random order (train.EpochBatches)
    # few shapes (docs/gpu.md): a training batch pads to the smallest of length_buckets that holds
    # it, else to a multiple of pad_multiple; unset: a multiple of 16 giving <= 8 lengths when compiled, else 1
    pad_multiple: int | None = field(default=None, metadata={  # unset and eager (compile: false): 1
        "min": 1, DERIVED: lambda t, _: 1 if t.compile is False else None})
    length_buckets: list[int] = field(default_factory=list, metadata={"min": 1, UNORDERED: True})  # the smallest that holds
    compile: bool | Literal["auto"] = "auto"  # torch.compile the step; auto: on a CUDA GPU only
    # clipping and the AdamW update as one compiled function (toolkit/optimizer_step.py); auto: off
    # (measured on an H200: no faster than fused AdamW; docs/gpu.md)
    compile_optimizer: bool | Literal["auto"] = "auto"
    eval_every: int = field(default=0, metadata=_min(0))  # optimizer steps; 0 = end of each epoch
    log_every: int = field(default=10, metadata={"min": 1, NO_EFFECT: lambda t: True})  # the log's cadence only
    keep_best: bool = True  # the final model is the best evaluated one
    metric: str | None = None  # selection metric; default: the task's main metric
    early_stopping_patience: int = field(default=0, metadata=_min(0))  # evals without gain; 0 = off
    # how many step checkpoints, and how often: what a stop resumes from, and what a finished run
    # keeps only with keep_checkpoints (else it keeps model/ alone: not in the run id there)
    save_total_limit: int = field(default=1, metadata={"min": 1, NO_EFFECT: lambda t: not t.keep_checkpoints})
    save_every: int = field(default=0, metadata={  # also checkpoint every N steps; 0 = at evaluations only
        "min": 0, NO_EFFECT: lambda t: not t.keep_checkpoints})
    keep_checkpoints: bool = False  # a finished run keeps its step checkpoints (else model/ only)
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30% more time
    fast_dropout: bool = True  # CPU: dropout by toolkit.dropout (2-3x faster than torch's); false = torch's
    skip_nonfinite: int = field(default=0, metadata=_min(0))  # batches with a NaN/inf loss to skip
    # the trackers told of the run's metrics: not in the run id (they change no number)
    report_to: list[Literal["tensorboard", "trackio", "wandb", "mlflow"]] = field(
        default_factory=list, metadata={UNORDERED: True, NO_EFFECT: lambda t: True})

    def optimizer_steps(self, examples: int, processes: int = 1) -> tuple[int, int]:
        """(optimizer steps per epoch, total optimizer steps) of `examples` training examples: the
        loop's schedule, known before any model loads (AdaLoRA's budget, a sweep's --dry-run)."""
        per_process = math.ceil(math.ceil(examples / self.batch_size) / processes)
        per_epoch = math.ceil(per_process / self.grad_accum)
        if self.max_steps:
            return per_epoch, self.max_steps
        if not math.isfinite(self.epochs * per_epoch):  # finite epochs, steps past a float: OverflowError
            raise UserError(f"train.epochs: {self.epochs:g} epochs of {per_epoch} optimizer steps are more steps "
                            "than can be counted; use fewer epochs, or train.max_steps")
        return per_epoch, max(1, math.ceil(self.epochs * per_epoch))

    def warmup(self, total: int) -> int:
        """The warm-up of a `total`-step run in optimizer steps: `warmup_steps`, or the ratio's
        steps rounded up, as Trainer's `get_warmup_steps` rounds them (ceil(total x ratio): a
        ratio never rounds to no warm-up)."""
        return self.warmup_steps or math.ceil(self.warmup_ratio * total)


def largest_warmup_ratio(total: int) -> float:
    """The largest warmup_ratio, in 3 decimals, whose warm-up ends within a `total`-step run
    (at most total - 1 steps; 0 for a 1-step run), checked as `TrainConfig.warmup` rounds."""
    ratio = math.floor((total - 1) / total * 1000) / 1000 if total > 1 else 0.0
    while ratio > 0 and math.ceil(ratio * total) >= total:  # float products rounding up
        ratio = round(ratio - 0.001, 3)
    return ratio


# a recipe's sections, in the order recipe.yaml writes them (`Recipe.to_dict`)
SECTION_NAMES = ("model", "task", "method", "train")


@dataclass
class Recipe:
    model: ModelConfig
    task: Any  # an instance of the task's settings dataclass (toolkit.tasks)
    method: Any  # an instance of the method's settings dataclass (toolkit.methods)
    train: TrainConfig
    name: str = "recipe"
    smoke: bool = False
    # a chained run (model.checkpoint: {run: ...}): the run folder id of the run it starts from,
    # set when the chain is planned (toolkit/recipe.py). Not in the hash (the recipe says the same);
    # in the run id, so an upstream recipe edited and run again makes this a new run too
    upstream_id: str | None = field(default=None, repr=False, compare=False)
    # ...and as the run ids before the canonical forms named it (runs.run_ids: runs made then are found)
    upstream_id_before: str | None = field(default=None, repr=False, compare=False)
    # ...and as the first canonical forms named it (runs.run_ids)
    upstream_id_first: str | None = field(default=None, repr=False, compare=False)
    # model.checkpoint as the recipe wrote it, where planning put it in its one form (a {run: ...}:
    # chain.canonical; a local folder: its absolute path): what the hash before those forms covered
    checkpoint_as_written: str | dict | None = field(default=None, repr=False, compare=False)
    # the task's data path settings as the recipe wrote them, where planning put them in their one
    # form (tasks.canonical_data_paths: `$TOOLKIT_DATA/...` or absolute): what the hash before covered
    task_as_written: dict | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """The resolved recipe as plain data: what recipe.yaml holds and the hash covers."""
        out: dict = {}
        for section in SECTION_NAMES:
            out[section] = dataclasses.asdict(getattr(self, section))
        out["task"] = {"name": self.task.name, **out["task"]}
        out["method"] = {"name": self.method.name, **out["method"]}
        if dataclasses.is_dataclass(self.model.attention):  # settings: keep the module's name
            out["model"]["attention"] = self.model.attention.to_dict()
        out["smoke"] = self.smoke
        return out

    def hashed_dict(self, canonical: bool = True, latest: bool = True) -> dict:
        """`to_dict` without the fields added later that hold the value of the behaviour before
        them (schema.added): what the hash covers. recipe.yaml keeps every field. With `canonical`
        (docs/reliability.md, "one computation, one run id"): set-like lists sorted, a derived
        default written out as unset, a setting that is not read as its default (schema.UNORDERED,
        DERIVED, UNUSED_WHEN; `train.metric` naming the task's main metric too), a setting that
        cannot change the result as its default (schema.NO_EFFECT), and model.checkpoint and the
        data file settings as planning put them (`checkpoint_as_written`, `task_as_written`).
        Without `latest`, the first canonical forms (2026-11-28, before the data files' form and
        NO_EFFECT: `hash_as_first_forms`, which finds the runs made under them). Without: the hash as it was
        before those forms (`hash_as_before`)."""
        out = self.to_dict()
        if not canonical and self.checkpoint_as_written is not None:
            out["model"]["checkpoint"] = json.loads(json.dumps(self.checkpoint_as_written))
        if not (canonical and latest) and self.task_as_written:
            out["task"].update(self.task_as_written)
        # --smoke writes the train sizes itself (max_steps, eval_batch_size): there they are hashed as
        # written, with the epochs beside them, so the smoke ids of the recipes stay as they were
        written = {"train": (*(k for s, k in SMOKE_CAPS if s == "train"), "epochs")} if self.smoke else {}
        for section in SECTION_NAMES:
            out[section] = unhashed(getattr(self, section), out[section], canonical, written.get(section, ()),
                                    no_effect=latest)
        if canonical and self.train.metric is not None and self.train.metric == _main_metric(self.task):
            out["train"]["metric"] = None  # unset selects on the task's main metric (run_metrics)
        return out

    @property
    def hash(self) -> str:
        return self.digest(self.hashed_dict())

    @property
    def hash_as_first_forms(self) -> str:
        """The hash under the first canonical forms (sorted lists, derived defaults, a chain's and a
        base folder's one form), before the data files' form and NO_EFFECT: runs made in between."""
        return self.digest(self.hashed_dict(latest=False))

    @property
    def hash_as_before(self) -> str:
        """The hash before the canonical forms: a run made then is in the folder this names."""
        return self.digest(self.hashed_dict(canonical=False))

    @staticmethod
    def digest(hashed: dict) -> str:
        """The hash of a `hashed_dict` (a run's recipe.yaml is checked against it, inference)."""
        blob = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _main_metric(task: Any) -> str | None:
    """The metric an unset train.metric selects on (the task's main one), None where unknown."""
    try:
        return task.main_metric()
    except (NotImplementedError, AttributeError, IndexError, TypeError, ValueError):  # not known before loading
        return None


@dataclass
class RunPlan:
    """A recipe as one launch runs it. The `Recipe` is what the YAML says and what the run folder's
    hash and recipe.yaml hold; what loading and resolving it found on the way is kept here, beside
    it, so that no runtime state can leak into the hash or a saved recipe.

    toolkit/recipe.py builds the plan (`plan`), toolkit/chain.py resolves it against a runs root,
    toolkit/setup.py builds the run from it."""

    recipe: Recipe
    upstream: RunPlan | None = None  # the run model.checkpoint names ({run: ...}), planned the same way
    written_max_length: int | None = None  # --smoke: task.max_length as written (its check still applies)
    checkpoint_path: str | None = None  # the upstream run's model/ folder, once resolved (chain.resolve)

    @property
    def saved_dropout(self) -> tuple[float, str] | None:
        """The model.dropout the model this plan loads was saved with, and the run it names: the
        nearest upstream run's of a `{run: ...}` chain that sets one (its model/ config.json holds
        it); None where none does (the base checkpoint's config holds the dropout)."""
        plan = self
        while plan.upstream is not None:
            ref = plan.recipe.model.checkpoint
            plan = plan.upstream
            if plan.recipe.model.dropout is not None:
                return plan.recipe.model.dropout, str(ref["run"]) if isinstance(ref, dict) else str(ref)
        return None

    @property
    def base(self) -> Recipe:
        """The recipe at the bottom of the chain: continued pretraining keeps its model family."""
        plan = self
        while plan.upstream is not None:
            plan = plan.upstream
        return plan.recipe


SECTIONS = {"model": ModelConfig, "train": TrainConfig}


# The keys by which a mapping names what its other keys belong to: a plug-in's `name`, and the
# recipe a chained checkpoint `{run: ..., overrides: [...]}` names (the overrides are that recipe's)
NAMING = ("name", "run")


def _deep_merge(base: dict, top: dict, depth: int = 0) -> dict:
    """`top` over `base`, mapping by mapping; a mapping that names something else (a plug-in
    section naming another plug-in, a `{run: ...}` checkpoint naming another recipe) replaces the
    base's, whose settings belong to the other one (`model.checkpoint={run: b.yaml}` over
    `{run: a.yaml, overrides: [...]}` ran b with a's overrides). A bare name is the mapping
    `{name: ...}` (`attention: local` is `{name: local}`): naming the plug-in already there keeps
    its settings, however it is spelled (`model.attention=local` reset a recipe's window 16 to
    the default 64, where `model.attention={name: local}` kept it). An empty mapping below the
    sections (`method.rank_pattern={}`, a leaf's `rank_pattern: {}`) clears the base's: merged, it
    changed nothing, and the run kept the pattern it was asked to drop, exit 0."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, str) and isinstance(out.get(key), dict) and out[key].get("name") == value:
            value = {"name": value}
        renamed = isinstance(value, dict) and isinstance(out.get(key), dict) and \
            any(k in value and out[key].get(k) not in (None, value[k]) for k in NAMING)
        if isinstance(value, dict) and isinstance(out.get(key), dict) and not renamed and (value or not depth):
            out[key] = _deep_merge(out[key], value, depth + 1)
        else:
            out[key] = value
    return out


MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of settings; a megabyte is not one
MAX_YAML_NODES = 100_000  # after alias expansion: what stops a "billion laughs" file cheaply


MAX_YAML_DEPTH = 64  # mappings and lists inside each other: a recipe's deepest is about 5


def _expanded_size(node: Any, memo: dict[int, int], depth: int = 0) -> int:
    """Nodes the document would have once every alias is expanded, without expanding it; a
    document nested deeper than MAX_YAML_DEPTH is refused (_TooDeep)."""
    if depth > MAX_YAML_DEPTH:
        raise _TooDeep
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a cycle counts once
    children: list = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    memo[id(node)] = 1 + sum(_expanded_size(c, memo, depth + 1) for c in children)
    return memo[id(node)]


class _Said(yaml.YAMLError):
    """A refusal whose message is whole: said as it is, not as 'not valid YAML'."""


class _KeyTwice(_Said):
    """A key written twice in one mapping (YAML forbids it; PyYAML keeps the last silently)."""


def _at(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


_MERGE = object()  # the merge key `<<`, apart from a quoted "<<" (a plain string key)


def _node_key(node: yaml.Node) -> Any:
    """What makes two key nodes one key for merging: a scalar's resolved tag and text."""
    return (node.tag, node.value) if isinstance(node, yaml.ScalarNode) else id(node)


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader, strict: a key given twice in one mapping is refused with both positions,
    and plain scalars resolve as YAML 1.2's core schema says (`CORE_SCALARS`), not as PyYAML's
    YAML 1.1: there `no`/`on`/`y` are booleans (labels `[no, yes]` became False, True), `010` is
    octal 8, `1:30` is 90, `1e-4` is a string and `2020-01-01` a date. Only what JSON holds comes
    out (an explicit `!!binary`, `!!set` or `!!timestamp` is refused with its position). Every
    YAML the toolkit reads (recipes, overrides, a run's recipe.yaml) goes through it."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if not isinstance(node, yaml.MappingNode):  # `!!map 5`: its text was unpacked as pairs (a traceback)
            raise yaml.constructor.ConstructorError(None, None, f"the tag !!map on a {node.id}, not a mapping",
                                                    node.start_mark)
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            merge = key_node.tag == "tag:yaml.org,2002:merge"  # `<<` twice: PyYAML let the last one win
            key = _MERGE if merge else self.construct_object(key_node, deep=True)
            if key in seen:
                raise _KeyTwice(f"the key '{'<<' if merge else key}' is given twice in one mapping "
                                f"({_at(seen[key])} and {_at(key_node)}); "
                                + ("merge several in one: <<: [*a, *b] (the first named wins)" if merge else "keep one"))
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """YAML's merge key (yaml.org/type/merge.html): a mapping's own keys win over merged ones,
        and in `<<: [*a, *b]` the keys of a win over b's. PyYAML 6.0.4 tells a key already merged
        by the identity of its string object, so two equal keys both went in and the last mapping
        named won (`<<: [*fast, *slow]` read slow's lr)."""
        merged, seen, own = [], set(), []
        for key_node, value_node in node.value:
            if key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.tag == "tag:yaml.org,2002:value":  # as PyYAML: `=` as a plain key
                    key_node.tag = "tag:yaml.org,2002:str"
                own.append((key_node, value_node))
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in sources:
                if not isinstance(source, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"expected a mapping or a list of mappings to merge, but found {source.id}", source.start_mark)
                self.flatten_mapping(source)
                for pair in source.value:
                    if _node_key(pair[0]) not in seen:
                        seen.add(_node_key(pair[0]))
                        merged.append(pair)
        mine = {_node_key(k) for k, _ in own}  # each key once: a mapping merged later reads it so
        node.value = [pair for pair in merged if _node_key(pair[0]) not in mine] + own

    def _core_text(self, node: yaml.Node, tag: str) -> str:
        """The text of a scalar tagged `tag`, one of the core schema's forms of it (`CORE_SCALARS`).
        An explicit tag (`!!float 0x10`, `!!bool yes`, `!!null 5`, `!!int 1_000`) was read by PyYAML's
        YAML 1.1 rules: `!!float 1:30` ran with 90.0, `!!bool on` with true where a plain `on` is
        refused, `!!null 5` dropped the 5, `!!float 0x10` and `!!bool maybe` were tracebacks."""
        text = self.construct_scalar(node)
        name, pattern, example = _CORE_FORMS[tag]
        if not pattern.fullmatch(text):
            raise yaml.constructor.ConstructorError(None, None, f"'{text}' is not a YAML 1.2 {name} (e.g. {example})",
                                                    node.start_mark)
        return text

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """YAML 1.2 core: decimal (`010` is ten), `0o17` octal, `0x1f` hexadecimal."""
        text = self._core_text(node, _INT)
        if text[:2] in ("0o", "0x"):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text, 10)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        """YAML 1.2 core: a decimal, `.inf`, `.nan`; a nonzero one past a float's smallest is
        refused (`1e-400` read as 0.0: `train.lr=1e-400` trained with lr 0, exit 0)."""
        text = self._core_text(node, _FLOAT)
        if text.lower().lstrip("+-") in (".inf", ".nan"):
            return super().construct_yaml_float(node)
        try:
            return decimal_float(text)
        except ValueError as exc:
            raise _Said(f"{text} at {_at(node)} {exc}") from None

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool:
        return self._core_text(node, _BOOL).lower() == "true"

    def construct_yaml_null(self, node: yaml.ScalarNode) -> None:
        self._core_text(node, _NULL)
        return None


# YAML 1.2 core schema (yaml.org/spec/1.2.2 10.3.2): the only plain scalars that are not strings
_INT, _FLOAT, _BOOL = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
CORE_SCALARS = [
    (_NULL, r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    (_BOOL, r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    (_INT, r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    (_FLOAT, rf"^(?:{DECIMAL}|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", list("-+0123456789.")),
]
StrictLoader.yaml_implicit_resolvers = {  # `<<` merge keys stay: anchors and merges are YAML
    first: [(tag, regexp) for tag, regexp in resolvers if tag == "tag:yaml.org,2002:merge"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _tag, _regexp, _first in CORE_SCALARS:  # int before float: the float pattern matches `10` too
    StrictLoader.add_implicit_resolver(_tag, re.compile(_regexp), _first)
# ...and what a scalar tagged explicitly with one of them must spell (StrictLoader._core_text)
_CORE_FORMS = {tag: (tag.rpartition(":")[2].replace("int", "integer"), re.compile(regexp), example)
               for (tag, regexp, _), example in zip(CORE_SCALARS, ("null, ~ or nothing", "true or false",
                                                                 "1000, 0o17, 0x1f", "3e-4, 0.5, .inf"))}
StrictLoader.yaml_constructors = {tag: make for tag, make in yaml.SafeLoader.yaml_constructors.items()
                                  if tag not in {f"tag:yaml.org,2002:{t}" for t in
                                                 ("binary", "timestamp", "omap", "pairs", "set")}}
for _tag, _make in ((_INT, StrictLoader.construct_yaml_int), (_FLOAT, StrictLoader.construct_yaml_float),
                    (_BOOL, StrictLoader.construct_yaml_bool), (_NULL, StrictLoader.construct_yaml_null)):
    StrictLoader.add_constructor(_tag, _make)


class StrictDumper(yaml.SafeDumper):
    """Writes what StrictLoader reads back unchanged, and any YAML 1.1 reader too: a string that
    either schema would read as something else (`1e-4`, `0o17`, `no`, `2020-01-01`) is quoted."""


StrictDumper.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeDumper.yaml_implicit_resolvers.items()}
for _tag, _regexp, _first in CORE_SCALARS:
    StrictDumper.add_implicit_resolver(_tag, re.compile(_regexp), _first)


def dump_yaml(data: Any) -> str:
    """YAML that every reader, StrictLoader and YAML 1.1 ones alike, reads back as `data`."""
    return yaml.dump(data, Dumper=StrictDumper, sort_keys=False)


_FAST = bool(getattr(yaml, "__with_libyaml__", False))  # PyYAML built with libyaml (its wheels are)

if _FAST:
    class _CStrictLoader(yaml.cyaml.CParser, StrictLoader):
        """StrictLoader's constructor and resolver over libyaml's parser: the same nodes, tags and
        values as StrictLoader, parsed several times faster than by PyYAML's pure-Python reader and
        scanner. Only a document it reads without error is taken from it (`safe_yaml`)."""

        def __init__(self, stream: str) -> None:
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)


def _strict_load(text: str, loader: type) -> Any:
    node = yaml.compose(text, Loader=loader)
    if node is not None and _expanded_size(node, {}) > MAX_YAML_NODES:
        raise _TooLarge
    made = loader(text)  # what yaml.load does, with this (safe) loader
    try:
        return made.get_single_data()
    finally:
        made.dispose()


class _TooLarge(Exception):
    """A document whose aliases expand past MAX_YAML_NODES."""


class _TooDeep(Exception):
    """A document nested past MAX_YAML_DEPTH, or past what PyYAML's recursive composer reads
    (`[[[...]]]` 3,000 deep was a RecursionError traceback)."""


def safe_yaml(text: str, where: str) -> Any:
    """Strict YAML (StrictLoader), refusing documents whose aliases expand past MAX_YAML_NODES.
    Read by libyaml where PyYAML has it; a document libyaml refuses (or any error on the way) is
    read again by the pure-Python StrictLoader, whose messages (positions in characters, the
    problem's words) are the ones given. A document with a tab is the pure reader's alone: libyaml
    takes a tab after `key:` or inside `[ ]` as a space (`a: b<TAB>c` read as b, tab, c) where the
    pure reader refuses it. Otherwise a document reads the same either way (tests/test_recipe.py
    checks every shipped YAML and the corner cases on both)."""
    if _FAST and "\t" not in text:
        try:
            return _strict_load(text, _CStrictLoader)
        except Exception:  # the pure-Python reader says what and where, as before
            pass
    try:
        try:
            return _strict_load(text, StrictLoader)
        except RecursionError:
            raise _TooDeep from None
    except _TooDeep:
        raise UserError(f"{where}: nested more than {MAX_YAML_DEPTH} levels deep (mappings and lists inside each "
                        "other); a recipe is a page of settings") from None
    except _TooLarge:
        raise UserError(f"{where}: expands to more than {MAX_YAML_NODES:,} YAML nodes "
                        "(aliases repeated); a recipe is a page of settings") from None
    except _Said as exc:
        raise UserError(f"{where}: {exc}") from None
    except yaml.reader.ReaderError as exc:  # a control character, a lone surrogate (undecodable argv)
        char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in where)
        raise UserError(f"{shown}: not valid YAML: character {char} "
                        f"at position {exc.position} is not allowed ({exc.reason})") from None
    except yaml.YAMLError as exc:  # the position and the problem, never the file's text
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise UserError(f"{where}: not valid YAML{at} ({problem})") from None


RECIPE_KEYS = {"model", "task", "method", "train", "extends", "name", "smoke"}


def read_yaml(path: Path) -> dict:
    """Load a recipe file with its `extends:` bases merged underneath: each file's own settings
    once, bases before the files that extend them, in the order listed (`_layers`). A base two
    listed bases share (a diamond: `extends: [_b.yaml, _c.yaml]`, both over `_d.yaml`) lies under
    both: merging each listed base whole put `_d`'s `method.r: 4` (inside `_c`) over `_b`'s own
    `r: 8`, a setting `_c` never made, exit 0."""
    merged: dict = {}
    for _, own in _layers(path, ()):
        merged = _deep_merge(merged, own)
    return merged


def _layers(path: Path, seen: tuple[Path, ...]) -> list[tuple[Path, dict]]:
    """(file, its own settings) from the bottom base up to `path`, each file once, where first
    reached (its bases' layers before its own; the bases in the order listed)."""
    if path.is_dir() and (path / "recipe.yaml").is_file():  # `toolkit.run(run)`: a run folder, not a recipe
        raise UserError(f"recipe {path} is a run folder; its recipe is {path / 'recipe.yaml'}, which finds "
                        "the same run")
    if path.is_dir():  # `toolkit validate recipes/demo`: the recipes are the files in it
        raise UserError(f"recipe {path} is a folder; give its .yaml files (e.g. {path}/*.yaml)")
    if path.exists() and not path.is_file():
        raise UserError(f"recipe {path} is not a regular file (a device or a pipe); give a .yaml file")
    if not path.is_file():
        raise UserError(f"recipe {path} does not exist")
    if path.resolve() in seen:
        raise UserError(f"{path}: 'extends' loops back to itself")
    if path.stat().st_size > MAX_RECIPE_BYTES:
        raise UserError(f"{path}: {path.stat().st_size:,} bytes is not a recipe (at most "
                        f"{MAX_RECIPE_BYTES:,})")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}); a recipe is a YAML text file") from None
    if "\x00" in text:
        raise UserError(f"{path}: holds NUL bytes; a recipe is a YAML text file")
    raw = safe_yaml(text, str(path)) or {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a recipe is a mapping of sections, got {type(raw).__name__}")
    if raw and not set(map(str, raw)) & RECIPE_KEYS:  # some other YAML file: never echo its keys
        raise UserError(f"{path}: is not a recipe (it has no model, task, method, train or extends "
                        "section)")
    bases = raw.pop("extends", [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise UserError(f"{path}: extends: expected a file name or a list of them, got {bases!r}")
    layers: list[tuple[Path, dict]] = []
    for base in bases:
        file = path.parent / Path(os.path.expandvars(base)).expanduser()  # relative to this file
        if not file.is_file():
            raise UserError(f"{path}: extends: {base}: {file} " + ("is not a file" if file.exists() else "does not exist"))
        layers += [layer for layer in _layers(file, seen + (path.resolve(),))
                   if all(layer[0] != done for done, _ in layers)]
    return layers + [(path.resolve(), raw)]


def _leaves(value: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The dotted paths a value sets: a mapping sets each of its keys, anything else its own path."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, path + (str(k),))]
    return [path]


def override_leaves(overrides: list[str]) -> list[tuple[str, ...]]:
    """The dotted settings `key=value` overrides set, however spelled: `task={eval_file: x}` sets
    task.eval_file as `task.eval_file=x` does."""
    out: list[tuple[str, ...]] = []
    for item in overrides:
        key, _, value = item.partition("=")
        out += _leaves(safe_yaml(value, f"override '{item}'") if value != "" else None, tuple(key.strip().split(".")))
    return out


def layered(*groups: Any) -> list[str]:
    """Lists of overrides, each later list replacing the settings an earlier one gives (a tool's
    own defaults under what its user asked): one override per setting, as apply_overrides wants.
    For tools that build overrides in layers; a user's own repeated setting stays an error (both
    are kept, and apply_overrides refuses them). Settings are matched by what they set, however
    spelled: a user's `train={max_steps: 100}` replaces a tool's `train.max_steps=9` (matched by
    their text, both were kept and the run refused), and a tool's mapping keeps the settings the
    user left to it."""
    out: list[tuple[list[tuple[str, ...]], str]] = []
    for group in groups:
        mine = [(_item_leaves(item), item) for item in group]
        covered = [leaf for leaves, _ in mine for leaf in leaves]
        kept: list[tuple[list[tuple[str, ...]], str]] = []
        for leaves, item in out:
            rest = [leaf for leaf in leaves if not any(_overlap(leaf, c) for c in covered)]
            if len(rest) == len(leaves):
                kept.append((leaves, item))
            else:  # a mapping some of whose settings were replaced: the others, one by one
                kept += [([leaf], _leaf_item(item, leaf)) for leaf in rest]
        out = kept + mine
    return [item for _, item in out]


def _item_leaves(item: str) -> list[tuple[str, ...]]:
    key, _, value = item.partition("=")
    return _leaves(safe_yaml(value, f"override '{item}'") if value != "" else None, tuple(key.strip().split(".")))


def _overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return a[:len(b)] == b or b[:len(a)] == a


def _leaf_item(item: str, leaf: tuple[str, ...]) -> str:
    """`train={lr: 1, epochs: 2}`, ('train', 'epochs') -> `train.epochs=2` (JSON: a YAML value)."""
    key, _, value = item.partition("=")
    node = safe_yaml(value, f"override '{item}'")
    for part in leaf[len(key.strip().split(".")):]:
        node = node[part]
    return f"{'.'.join(leaf)}={json.dumps(node)}"


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """`train.lr=3e-4 method.r=16`: values are parsed as YAML scalars. A mapping value merges into
    the section as an `extends` base's would (`train={epochs: 1}` keeps the recipe's lr), and a
    setting given twice (`train.lr=1 train.lr=2`, or `train.lr` and `train={lr: ...}`) is refused,
    as a key given twice in one YAML mapping is: neither silently wins.

    The overrides are one layer over the recipe, as a leaf file is over its base: each sets its
    own settings (none twice), so they are gathered into one mapping first and merged once. Their
    order then cannot matter: `method.alpha=8 method={name: dora}` kept no alpha (the mapping,
    applied second, named another plug-in and replaced the section), where the reverse order
    kept it."""
    raw = json.loads(json.dumps(raw))
    given: dict[tuple[str, ...], str] = {}
    layer: dict = {}
    parsed_items = []
    for item in overrides:  # each parsed and checked in the order written
        if "=" not in item:
            raise UserError(f"override '{item}': expected key=value, e.g. train.lr=3e-4")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise UserError(f"override '{item}': empty key part; write section.key=value")
        parsed = safe_yaml(value, f"override '{item}'") if value != "" else None
        leaves = _leaves(parsed, tuple(parts))
        for leaf in leaves:
            earlier = next((given[p] for p in given if p[:len(leaf)] == leaf or leaf[:len(p)] == p), None)
            if earlier is not None:
                raise UserError(f"override '{item}': {'.'.join(leaf)} is already set by '{earlier}'; "
                                "give each setting once")
        given.update(dict.fromkeys(leaves, item))
        parsed_items.append((item, parts))
        layer = _deep_merge(layer, _nested(parts, parsed))  # disjoint settings: a plain union
    for item, parts in parsed_items:  # `model.attention.window=8` where the recipe says `attention: sdpa`
        node, named = raw, layer
        for part in parts[:-1]:
            node, named = node.get(part) if isinstance(node, dict) else None, named[part]
            if node is not None and not isinstance(node, dict) and not set(NAMING) & set(named):
                raise UserError(f"override '{item}': '{part}' is not a section")
    # A section that names another plug-in (`method.name=full`, `method={name: full}`) starts
    # afresh: lora's `r` is not full's. The settings given beside the name are kept.
    return _deep_merge(raw, layer)


def _nested(parts: list[str], value: Any) -> dict:
    """`['method', 'r'], 4` -> {'method': {'r': 4}}."""
    for part in reversed(parts):
        value = {part: value}
    return value


def recipe_name(path: Path) -> str:
    """`recipes/glue/sst2/roberta-base-lora.yaml` -> `glue/sst2/roberta-base-lora`."""
    resolved = path.resolve()
    for parent in resolved.parents:
        if parent.name == "recipes":
            return str(resolved.relative_to(parent).with_suffix(""))
    return resolved.stem


# --smoke keeps the recipe's code path and shrinks its size: a handful of examples, a few steps.
SMOKE_CAPS = {("task", "max_train_samples"): 32, ("task", "max_eval_samples"): 32,
              ("train", "batch_size"): 8, ("train", "eval_batch_size"): 16, ("train", "max_steps"): 4}


# ...and lengths, where the task has them and they are longer: a decoder's 512-token summarisation
# prompt with a 50k-word output layer costs seconds a step even on the smallest model.
SMOKE_LENGTHS = {"max_length": 128, "max_target_length": 32, "doc_stride": 32, "eval_stride": 64}
SMOKE_NEW_TOKENS = 16  # task.generation.max_new_tokens


def smoke_sized(raw: dict, task: Any = None, train: TrainConfig | None = None, method: Any = None) -> dict:
    """`raw` shrunk for --smoke; `task` (the recipe's task as written) says which lengths it has,
    `train` (its train section as built) the warm-up as the schema read it: a quoted
    `warmup_ratio: "0.9"` is 0.9, yet the raw string was not capped (0.9 was), so the same ratio
    refused the smoke run that its number's spelling ran. `method` (as written) says how many train
    examples it reads at least (`Method.train_rows_needed`: icl's demonstrations), which the train
    cap keeps: a 40-shot recipe was refused under --smoke ("more than the 32 train examples")."""
    raw = json.loads(json.dumps(raw))
    needed = method.train_rows_needed() if method is not None else 0
    for (section, key), cap in SMOKE_CAPS.items():
        if (section, key) == ("task", "max_train_samples"):
            cap = max(cap, needed)
        node = raw.setdefault(section, {})
        if isinstance(node, dict):
            value = node.get(key)
            node[key] = cap if not isinstance(value, int) or isinstance(value, bool) else min(value, cap)
    warmup = raw["train"].get("warmup_steps") if isinstance(raw["train"], dict) else None
    if isinstance(warmup, int) and not isinstance(warmup, bool):  # a warm-up that ends within the few steps
        raw["train"]["warmup_steps"] = min(warmup, raw["train"]["max_steps"] - 1)
    ratio = raw["train"].get("warmup_ratio") if isinstance(raw["train"], dict) else None
    if train is not None and ratio is not None:
        ratio = train.warmup_ratio
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0:  # ...as a ratio too
        raw["train"]["warmup_ratio"] = min(ratio, largest_warmup_ratio(raw["train"]["max_steps"]))
    node = raw.get("task")
    if task is None or not isinstance(node, dict):
        return raw
    for key, cap in SMOKE_LENGTHS.items():
        value = getattr(task, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            node[key] = cap
    budget = task.new_tokens() if hasattr(task, "new_tokens") else 0  # unset: the target length
    if budget > SMOKE_NEW_TOKENS and isinstance(node.get("generation", {}), dict):
        node["generation"] = {**node.get("generation", {}), "max_new_tokens": SMOKE_NEW_TOKENS}
        for key in ("min_new_tokens", "min_length"):  # a minimum within the budget as written stays within the smoke one
            value = getattr(getattr(task, "generation", None), key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > SMOKE_NEW_TOKENS:
                node["generation"][key] = SMOKE_NEW_TOKENS
    return raw


def dump(recipe: Recipe) -> str:
    """The resolved recipe as YAML: itself a valid recipe (`toolkit run runs/.../recipe.yaml`)."""
    return dump_yaml({"name": recipe.name, **recipe.to_dict()})


# --- finding recipes: a path, or the name of a shipped one ------------------------------------
def recipes_root() -> Path:
    """./recipes in a checkout; else the recipes that ship inside the installed package (a wheel
    puts them in toolkit/recipes; an editable install leaves them beside the package)."""
    package = Path(__file__).resolve().parent  # toolkit/
    for candidate in (Path("recipes"), package / "recipes", package.parent / "recipes"):
        if candidate.is_dir():
            return candidate
    raise UserError("no recipes/ folder here and none shipped with the package; give recipe paths")


def recipe_files(paths: list[str]) -> list[Path]:
    if paths:
        return [Path(p) for p in paths]
    root = recipes_root()
    return sorted(p for p in root.rglob("*.yaml") if not p.name.startswith("_"))


def closest_recipes(name: str, names: list[str]) -> str:
    """' (did you mean a, b or c? `toolkit ls recipes` lists all N)': at most three names, never
    the whole list on one line."""
    close = difflib.get_close_matches(name.removesuffix(".yaml").removeprefix("recipes/"), names, n=3, cutoff=0.5)
    listed = f"`toolkit ls recipes` lists all {len(names)}"
    if not close:
        return f" ({listed})"
    said = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}"
    return f" (did you mean {said}? {listed})"


def find_recipe(name: str) -> Path:
    """A recipe file: a path, or the name of a shipped one (`glue/sst2/roberta-base-lora`). An
    empty name (`make run RECIPE=`, an unset shell variable) was read as the folder `.`."""
    if not name.strip():
        raise UserError("no recipe given (an empty name); give a recipe file or a shipped recipe's name, "
                        "e.g. demo/sst2/minilm-lora (`toolkit ls recipes` lists them)")
    path = user_path(name)  # `~` and variables, as every path a user gives
    if path.is_file() or path.suffix == ".yaml" and path.exists():
        return path
    shipped = recipes_root() / (name if name.endswith(".yaml") else name + ".yaml")
    if shipped.is_file():
        return shipped
    if not path.exists() and not shipped.exists():
        names = [str(p.relative_to(recipes_root()).with_suffix("")) for p in recipe_files([])]
        raise UserError(f"recipe {name} does not exist{closest_recipes(name, names)}")
    return path
