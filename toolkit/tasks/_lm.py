"""The base of tasks whose loss is over target tokens: generation (summarization, translation,
generative QA) and pretraining objectives (causal LM, masked LM, denoising, span corruption).

Not a plug-in itself. Labels hold -100 where no loss is taken (padding, a decoder-only model's
prompt). A batch with `decoder_input_ids` is an encoder-decoder's (the collator built them from
the labels, shifted right, as each family defines); without them the model is decoder-only or an
encoder predicting in place, and `shift` says whether position t predicts label t+1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from toolkit.errors import UserError
from toolkit.lazy import lazy
from toolkit.tasks import Task

torch = lazy("torch", globals())
F = lazy("torch.nn.functional", globals())

IGNORE = -100


def token_losses(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """(b,) summed cross-entropy over each example's labelled tokens (fp32, -100 ignored).
    Logits shorter than the labels are those of the sequence's last positions (the model was
    given `logits_to_keep`: the positions before them predict no labelled token)."""
    extra = logits.shape[1] - labels.shape[1]
    if extra > 0:  # soft prompts: PEFT prepends virtual tokens to a decoder's sequence
        logits = logits[:, extra:]
    if shift:  # position t predicts token t+1: the labels move left and the last position is
        # ignored. Moving the labels, not the logits, keeps the (b, t, vocab) logits contiguous:
        # slicing them made `reshape` copy them forward and backward (a GPT-2 step's 400 MB, 9%
        # of a CLM step on CPU); the summed losses are the same
        labels = F.pad(labels[:, 1:], (0, 1), value=IGNORE)
    if extra < 0:  # logits_to_keep: the last positions only
        labels = labels[:, -extra:]
    b, t, v = logits.shape
    flat = F.cross_entropy(logits.reshape(b * t, v).float(), labels.reshape(b * t),
                           ignore_index=IGNORE, reduction="none")  # (b*t,)
    return flat.view(b, t).sum(-1)  # (b,)


def token_hits(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """(b,) labelled tokens whose most likely prediction is the label: the numerator of the token
    accuracy run_mlm and run_clm report beside perplexity (argmax over the vocabulary, the same
    positions and labels `token_losses` scores)."""
    extra = logits.shape[1] - labels.shape[1]
    if extra > 0:
        logits = logits[:, extra:]
    if shift:
        labels = F.pad(labels[:, 1:], (0, 1), value=IGNORE)
    if extra < 0:
        labels = labels[:, -extra:]
    return ((logits.argmax(-1) == labels) & (labels != IGNORE)).sum(-1).float()


def token_units(labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """(b,) labelled tokens per example: what the loss is normalised by."""
    if shift:
        labels = labels[:, 1:]
    return (labels != IGNORE).sum(-1)


@dataclass(kw_only=True)
class TokenTask(Task):
    """Loss over labelled target tokens, normalised by their count across steps and processes."""

    causal_shift: ClassVar[bool] = True  # decoder-only: position t predicts t+1 (no decoder inputs)

    def _shift(self, batch: dict[str, torch.Tensor]) -> bool:
        return self.causal_shift and "decoder_input_ids" not in batch

    def units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return token_units(batch["labels"], self._shift(batch))

    def loss(self, outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        # token_losses drops the virtual positions PEFT's soft prompts prepend, and only when
        # there are some: even a full-length slice is an autograd node whose backward zero-fills
        # and copies the (b, t, vocab) gradient (0.3 s of a 3.5 s GPT-2 step on CPU)
        return token_losses(outputs.logits, batch["labels"], self._shift(batch))

    def score(self, outputs: dict[str, np.ndarray], raw: Any) -> dict[str, float]:
        """Default: perplexity of the labelled tokens (exp of the mean token loss), as run_clm and
        run_mlm compute it (infinite where exp overflows). It was exp(min(loss, 50)): every model
        whose loss passed 50 scored the same 5.2e21, a tie that best-model selection broke by
        order."""
        mean = float(outputs["loss"].sum() / max(outputs["units"].sum(), 1.0))
        try:
            return {"perplexity": math.exp(mean)}
        except OverflowError:
            return {"perplexity": math.inf}


def special_frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(before, after): the ids the tokenizer puts around a text's own (BART: <s> and </s>, T5:
    none and </s>, Llama/Gemma/OPT: BOS and none, GPT-2: none), found by encoding a probe with
    and without its special tokens."""
    full = list(tokenizer("a")["input_ids"])
    bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            return full[:start], full[start + len(bare):]
    return [], []


CONTINUED_PROBE = "x."  # text before a piece: ends a word, and no piece's first character here joins it


def continued(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """The ids each text has where it continues another text, tokenized apart from it (a prompt's
    suffix after its source, a decoder's " " + answer after its prompt): the tokens past the
    probe's own in probe + text, where those are the probe's alone (nothing merged across),
    else the text's alone. A tokenizer that marks the start of every text (SentencePiece's "▁")
    gave a piece apart one token more than it has in the text it continues: a legacy one's
    (Llama-2's) " yes" is "▁" "▁yes" alone and "▁yes" after a prompt, and "\nTL;DR:" gained a
    "▁" before its newline, so a decoder trained on and generated from tokens the text it was
    given never has (exit 0). For GPT-2, BERT and T5 the two are the same."""
    head = list(tokenizer(CONTINUED_PROBE, add_special_tokens=False)["input_ids"])
    joined = tokenizer([CONTINUED_PROBE + t for t in texts], add_special_tokens=False)["input_ids"]
    out = [list(j[len(head):]) if list(j[:len(head)]) == head else None for j in joined]
    merged = [i for i, ids in enumerate(out) if ids is None]  # the probe merged with the text: read alone
    if merged:
        for i, ids in zip(merged, tokenizer([texts[i] for i in merged], add_special_tokens=False)["input_ids"]):
            out[i] = list(ids)
    return out


def text_end(tokenizer: Any) -> int | None:
    """The token a decoder-only model's answer ends with, and that its generation stops at: the
    tokenizer's EOS, else the [SEP] a BERT-vocabulary tokenizer ends a text with (the GPT-2s
    trained on BERT's vocabulary, uer/gpt2-chinese-*, have no EOS); None where it has neither."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos if eos is not None else getattr(tokenizer, "sep_token_id", None)


def leading_special(tokenizer: Any) -> list[int]:
    """The ids the tokenizer puts before a text (its BOS, where it adds one); what it puts after
    (an EOS some add) is no part of a decoder's prompt."""
    return special_frame(tokenizer)[0]


def decoder_inputs(model: Any, labels: torch.Tensor, pad: int) -> torch.Tensor:
    """An encoder-decoder's decoder input for `labels`: the model's own
    `prepare_decoder_input_ids_from_labels` (mBART's shift wraps the labels' last token to the
    front), else what its forward builds from labels (M2M100, NLLB, Blenderbot: the decoder start
    token, then the labels shifted right, -100 read as padding). The loss is the task's, so the
    model gets no labels; without these inputs M2M100 and NLLB stopped at the first batch on a
    ValueError traceback."""
    if hasattr(model, "prepare_decoder_input_ids_from_labels"):
        return model.prepare_decoder_input_ids_from_labels(labels=labels)
    start = decoder_start(model)
    if start is None:
        raise UserError(f"model.checkpoint: its config sets no decoder_start_token_id, the token {type(model).__name__}'s "
                        "decoder starts from; set it in config.json")
    shifted = torch.full_like(labels, start)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE, pad)


def decoder_start(model: Any) -> int | None:
    """The token an encoder-decoder's decoder starts from: its config's, else its generation config's."""
    config = getattr(model, "config", None)
    start = getattr(config, "decoder_start_token_id", None)
    return start if start is not None else getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
