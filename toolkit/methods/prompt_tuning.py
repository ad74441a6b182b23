"""Prompt tuning through PEFT (Lester et al. 2021): trainable soft tokens before the input.

The task head trains alongside as `modules_to_save`. `init: text` starts the soft tokens from the
embeddings of the task's instruction (PEFT's PromptTuningInit.TEXT), which Lester et al. found
converges faster and more stably than random vectors on smaller models.

A decoder-only model (GPT-2) generates through `soft_prompt_generate` (see `install`), not PEFT's
own `generate`, which gave other text than the trained model with transformers 5.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from toolkit import heads, hf_tables
from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, instead, pass_segments, peft_task_type
from toolkit.models import kind_of

torch = lazy("torch", globals())

SEQ_CLS_HEAD = "sequence-classification"
# heads of an encoder-decoder model (BART, T5) that run the encoder and the decoder on input_ids:
# the classifier pools the EOS token it finds in them, and both make the decoder's input from them
# (T5's token classifier is its encoder alone, and takes inputs_embeds)
DECODER_FROM_IDS = (SEQ_CLS_HEAD, "question-answering")


# PEFT's prompt-learning models are chosen by task type, and PEFT has none for masked LM.
MLM_REFUSAL = "{method} needs a PEFT task type and PEFT has none for masked LM (the mlm task); {instead}"
MLM_INSTEAD = ("lora", "ia3", "adapters", "bitfit", "full")
# the methods that adapt weights, named by a soft prompt's refusal where the model cannot take one
# (each asked by `methods.instead`: bitfit is left out on a bias-free family)
WEIGHTS = ("lora", "ia3", "bitfit")
# a decoder's classifier: prefixes reach it through attention, and it still reads input_ids
DECODER_CLS_INSTEAD = ("prefix_tuning",) + WEIGHTS


def mlm_refusal(method: str, family: str | None, task: Any) -> str:
    return MLM_REFUSAL.format(method=method, instead=instead(family, task, MLM_INSTEAD))


# a warm-started EncoderDecoderModel (model.warm_start: encoder-decoder): its config nests the
# encoder's and the decoder's, where PEFT's prompt-learning methods read the layer count, heads and
# width from the top level; PEFT raised a ValueError when the method was applied, after the model
# and the data had loaded (a traceback mid-run)
COMPOSITE = "encoder-decoder"
COMPOSITE_REFUSAL = ("{method}: PEFT reads the layer count, heads and width from the model's config, and "
                     "an EncoderDecoderModel (model.warm_start: encoder-decoder) keeps them in its "
                     "encoder's and decoder's configs; {instead}")
COMPOSITE_INSTEAD = ("lora", "bitfit", "full")


def composite_refusal(method: str, task: Any) -> str:
    return COMPOSITE_REFUSAL.format(method=method, instead=instead(COMPOSITE, task, COMPOSITE_INSTEAD))


def read_prompts(ctx: Context, every_row_feeds_all: bool = False) -> dict[str, Any]:
    """PEFT's `num_transformer_submodules` for a soft prompt that only the input reads: 1.

    For a seq2seq LM (BART, T5 generating) PEFT makes the prompt table twice
    `num_virtual_tokens` long, a half per "transformer submodule", and its prompt and p-tuning
    forward and generate put only the first half before the encoder's input: the decoder's half
    was never read, never trained, and counted in `trainable_params` (prompt tuning on t5-base at
    20 tokens: 30,720 trainable, 15,360 trained; the reports' trainable % and accuracy-vs-parameters
    plots, twice the method's size, exit 0). One submodule makes the table the rows the forward
    reads, in PEFT's own format (its config holds the number; older folders load as saved).
    `every_row_feeds_all`: an encoder whose outputs each read every row (p-tuning's LSTM runs over
    the whole table) keeps PEFT's layout, since there no row is idle."""
    if ctx.peft_task_type == "SEQ_2_SEQ_LM" and not every_row_feeds_all:
        return {"num_transformer_submodules": 1}
    return {}


def encoder_decoder_head(family: str | None, head: str) -> str | None:
    """transformers' class for `head` on an encoder-decoder `family` where that head runs the
    decoder on input_ids (a classifier, extractive QA), else None."""
    if head not in DECODER_FROM_IDS or not family or kind_of(family) != "encoder-decoder":
        return None
    return hf_tables.model_table(heads.get(head).table).get(family) or f"{family}'s {head} model"


def soft_prompt_refusal(method: str, family: str | None, task: Any, head: str) -> str | None:
    """Why soft tokens fed as `inputs_embeds` cannot drive this family's head.

    PEFT prepends prompt embeddings and calls the model with `inputs_embeds` only. With
    transformers 5.x, BART/T5 classification heads need `input_ids` to find the EOS token they
    pool, BART/T5 extractive QA to make the decoder's input (both passed validate and stopped
    at the first batch with a ValueError traceback), and a decoder-only family's classifier
    (GPT-2's, OPT's, Llama's, ...: every one pools the last non-pad token it finds in input_ids)
    cannot find the last real token without them, so right-padded examples would be classified
    from a pad position (predictions would change with the batch they are padded in). It was
    refused for GPT-2 alone: OPT under prompt tuning passed validate and its logits moved by 5
    with a batch-mate's padding, exit 0.
    """
    if head == "masked-lm":
        return mlm_refusal(method, family, task)
    if family == COMPOSITE:
        return composite_refusal(method, task)
    cls = encoder_decoder_head(family, head)
    if cls is not None:
        why = ("to find the EOS token it classifies from" if head == SEQ_CLS_HEAD
               else "to make its decoder's input")
        return f"{method} feeds the model inputs_embeds, and {cls} refuses them (it needs input_ids {why}); {instead(family, task, WEIGHTS)}"
    if head == SEQ_CLS_HEAD and kind_of(family) == "decoder":
        cls = hf_tables.model_table(heads.get(head).table).get(family) or f"{family}'s sequence classifier"
        return (f"{method} feeds the model inputs_embeds, from which {cls} "
                "cannot find the last non-pad token, so padded examples would be classified from a "
                f"pad position; {instead(family, task, DECODER_CLS_INSTEAD)}")
    return None


@METHODS.register("prompt_tuning")
@dataclass
class PromptTuning(Method):
    num_virtual_tokens: int = field(default=20, metadata={"min": 1})
    init: Literal["random", "text"] = "random"  # text: from the task's instruction (or init_text)
    init_text: str | None = None  # overrides the task's instruction when init is text

    export_load: ClassVar[str] = ("peft and the toolkit's soft-prompt route (generation, per-token outputs): "
                                  "toolkit.methods.prompt_tuning.install(PeftModel.from_pretrained({base}, OUT))")

    def incompatible(self, family: str | None, task: Any) -> str | None:
        # the family's refusal first, which no setting lifts: a setting's advice followed on a
        # model that cannot take soft prompts met that refusal next
        refused = soft_prompt_refusal(self.name, family, task, self.head(task))
        if refused:
            return refused
        if self.init_text is not None and not self.init_text.strip():  # `or` took the instruction instead
            return ("method.init_text is empty, so there is no text to start the prompt from (the task's "
                    "instruction was used instead); give the text, or leave init_text out for the instruction")
        if self.init_text is not None and self.init != "text":  # PEFT reads it under TEXT only
            return (f"method.init_text is read with method.init: text only, and init is {self.init} "
                    "(the prompt would start random); set method.init: text")
        if self.init == "text" and not (self.init_text or getattr(task, "instruction", None)):
            return "method.init is text but the task has no instruction; set method.init_text"
        return None

    def added_positions(self) -> int:
        return self.num_virtual_tokens

    def _init_kwargs(self, ctx: Context) -> dict[str, Any]:
        """PEFT re-loads the tokenizer by name to embed the init text, so pass where ours came from."""
        from peft import PromptTuningInit

        if self.init == "random":
            return {"prompt_tuning_init": PromptTuningInit.RANDOM}
        # PEFT loads the tokenizer again by name: one the run reads words with (NER) adds the space
        # before the first word too, and without it the prompt started from other tokens ('Tag', not 'ĠTag')
        spaced = {"add_prefix_space": True} if getattr(ctx.tokenizer, "add_prefix_space", False) is True else {}
        return {"prompt_tuning_init": PromptTuningInit.TEXT,
                "prompt_tuning_init_text": self.init_text or ctx.instruction,
                "tokenizer_name_or_path": ctx.tokenizer.name_or_path, "tokenizer_kwargs": spaced or None}

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        from peft import PromptTuningConfig, get_peft_model

        config = PromptTuningConfig(
            task_type=peft_task_type(ctx), num_virtual_tokens=self.num_virtual_tokens,
            modules_to_save=list(ctx.head_names) or None, **self._init_kwargs(ctx), **read_prompts(ctx),
        )
        return install(get_peft_model(model, config))

    def loaded(self, model: torch.nn.Module) -> torch.nn.Module:
        return install(model)


# --- generation with soft prompts -----------------------------------------------------------------
def install(peft_model: Any) -> Any:
    """A PEFT prompt model (prompt tuning, p-tuning) made to answer as the run did; returns the
    same model. A decoder-only one generates with `soft_prompt_generate`. A token classifier's or
    extractive QA model's outputs keep the input's own positions only (`_own_positions`). Other
    task types keep PEFT's forward and generate: an encoder-decoder's prompt is in its encoder
    input, read once; a sequence classifier reads one position."""
    task = str(getattr(peft_model.active_peft_config.task_type, "value", peft_model.active_peft_config.task_type))
    pass_segments(peft_model)  # QA: PEFT drops the segment ids
    if task == "CAUSAL_LM":  # a str enum, or the str when loaded
        peft_model.generate = types.MethodType(soft_prompt_generate, peft_model)
    elif task in ("TOKEN_CLS", "QUESTION_ANS") and not getattr(peft_model, "tk_own_positions", False):
        peft_model.forward = types.MethodType(_own_positions, peft_model)
        peft_model.tk_own_positions = True
    return peft_model


def _own_positions(self: Any, input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """PEFT's forward, its logits cut to the input's positions, the loss taken over those.

    PEFT puts the soft prompt before the input and returns logits for the virtual positions too
    (PeftModelForTokenClassification, PeftModelForQuestionAnswering): an exported NER model
    loaded as the export line said gave each word the tag of the position `num_virtual_tokens`
    before it, and labels or answer positions given to it were matched to the wrong positions
    (start/end positions silently, labels with a shape error). The toolkit's tasks cut the logits
    themselves (`tag_logits`, squad's `_logits`); this does the same for anyone who calls the
    model, and computes the loss as transformers' heads do (cross-entropy over the tags,
    ignoring -100; the mean of the start and end cross-entropies, positions clamped)."""
    import torch.nn.functional as F

    labels, start, end = (kwargs.pop(k, None) for k in ("labels", "start_positions", "end_positions"))
    out = type(self).forward(self, input_ids=input_ids, **kwargs)
    if not hasattr(out, "keys"):
        raise ValueError("a soft-prompt token classifier or QA model returns its outputs as a dict (no return_dict=False)")
    width = (input_ids if input_ids is not None else kwargs["inputs_embeds"]).shape[1]
    for key in ("logits", "start_logits", "end_logits"):
        if out.get(key) is not None:
            out[key] = out[key][:, -width:]
    if labels is not None and out.get("logits") is not None:
        out["loss"] = F.cross_entropy(out["logits"].reshape(-1, out["logits"].shape[-1]), labels.reshape(-1))
    elif start is not None and end is not None and out.get("start_logits") is not None:
        start, end = start.reshape(-1).clamp(0, width), end.reshape(-1).clamp(0, width)
        out["loss"] = (F.cross_entropy(out["start_logits"], start, ignore_index=width)
                       + F.cross_entropy(out["end_logits"], end, ignore_index=width)) / 2
    return out


def soft_prompt_generate(self: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         **kwargs: Any) -> torch.Tensor:
    """The soft prompt embedded once before the (left-padded) input, and transformers' own
    `generate` from those embeddings; returns the input ids followed by the new tokens, as
    `generate` on input ids does.

    PEFT's route (its `prepare_inputs_for_generation`) broke twice with transformers 5, exit 0:
    it looks for the cache under `past_key_values`, which transformers 5.24 passes as `cache`, so
    with the cache on it put the prompt in again at every new token (other text than without
    the cache); and it drops the position ids, so a left-padded prompt's tokens took positions
    shifted by their padding (a batch-mate changed an example's output). Here the prompt comes
    first, the mask covers it, and `generate` counts positions from the mask: the prompt at
    0..n-1 and the text at n.., as in training (right-padded), with or without padding."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    embeds = self.word_embeddings(input_ids)
    prompts = self.get_prompt(batch_size=input_ids.shape[0]).to(embeds.dtype)
    mask = torch.cat([attention_mask.new_ones(prompts.shape[:2]), attention_mask], dim=1)
    if "min_length" in kwargs and kwargs["min_length"] is None:  # unset (the task's UNSET): no minimum,
        kwargs["min_length"] = 0  # which from embeddings transformers subtracts the input's length from
    if kwargs.get("logits_processor"):
        kwargs["logits_processor"] = _seeing_the_input(kwargs["logits_processor"], input_ids)
    out = self.get_base_model().generate(inputs_embeds=torch.cat([prompts, embeds], dim=1),
                                         attention_mask=mask, **kwargs)
    if not isinstance(out, torch.Tensor):
        raise ValueError("soft-prompt generation returns token ids only (no return_dict_in_generate)")
    rows = out.shape[0] // input_ids.shape[0]  # num_return_sequences
    return torch.cat([input_ids.repeat_interleave(rows, dim=0), out], dim=1)


def _seeing_the_input(processors: Any, input_ids: torch.Tensor) -> Any:
    """The caller's logits processors, each shown the input ids before the new tokens, as
    `generate` on input ids shows them: from embeddings `generate` shows the new tokens alone,
    and a processor counting columns from the prompt's end (the toolkit's no-repeat rule for a
    decoder's continuation) read the wrong tokens."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class SeeingInput(LogitsProcessor):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __call__(self, seen: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            before = input_ids.repeat_interleave(seen.shape[0] // input_ids.shape[0], dim=0)  # beams
            return self.inner(torch.cat([before.to(seen.device), seen], dim=1), scores)

    return LogitsProcessorList([SeeingInput(p) for p in processors])
