"""`clm`: causal language modelling (GPT-2's objective) over packed blocks of raw text.

Training: documents end with the end-of-text token and are packed into blocks of `max_length`;
every token predicts the next. Evaluation: perplexity of the whole held-out text with a sliding
window (the "perplexity of fixed-length models" method in transformers' documentation): windows
of `max_length` tokens start every `eval_stride` tokens and each scores only the tokens the
previous window did not, so every token after the first is scored once, with up to
`max_length - eval_stride` tokens of context before it. At `eval_stride = max_length` the windows
are run_clm's blocks, and as there the first token of each block is not scored (no position
predicts it); the last, shorter block is scored, where run_clm's `group_texts` drops it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolkit.errors import UserError
from toolkit.tasks import TASKS, fingerprint
from toolkit.tasks._lm import IGNORE
from toolkit.tasks._text import HELDOUT, TextTask
from toolkit.schema import DERIVED, value_of


def sliding_windows(ids: list[int], max_length: int, stride: int) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) windows over one token stream; labels are -100 on the context each
    window shares with the previous one (the model shifts them: position t predicts t + 1)."""
    out, previous_end = [], 0
    for begin in range(0, max(len(ids) - 1, 1), stride):
        end = min(begin + max_length, len(ids))
        window = ids[begin:end]
        fresh = end - previous_end  # tokens this window scores for the first time
        out.append((window, [IGNORE] * (len(window) - fresh) + window[len(window) - fresh:]))
        previous_end = end
        if end == len(ids):
            break
    return out


@TASKS.register("clm")
@dataclass(kw_only=True)
class CausalLM(TextTask):
    head = "causal-lm"
    kind, examples = "decoder", "GPT-2"
    instead = "mlm for encoders, denoise or span_corruption for encoder-decoders"
    packs_as = "run_clm.py"
    perplexity = True  # of the labelled tokens

    eval_stride: int | None = field(default=None, metadata={"min": 1, DERIVED: lambda t, _: max(1, t.max_length // 2)})  # None: max_length // 2

    def check(self) -> None:
        super().check()
        if self.eval_stride is not None and self.eval_stride > self.max_length:
            raise UserError(f"task.eval_stride: {self.eval_stride} is above task.max_length "
                            f"{self.max_length}; tokens between windows would never be scored")

    def metric_info(self) -> dict[str, str]:
        """Which perplexity `perplexity` is: the windows and stride decide the context each token
        is scored with (a smaller stride, more context, a lower perplexity on the same model), so
        runs at another eval_stride are scored under another metric, never a grid to choose from
        (a report chose the stride that scored lowest as the best setting, exit 0)."""
        stride = value_of(self, "eval_stride")
        return {**super().metric_info(), "perplexity": f"sliding windows of {self.max_length} tokens every {stride} "
                                                       f"(up to {self.max_length - stride} tokens of context)"}

    def corrupt(self, example: dict, rng: np.random.Generator, tokenizer: Any) -> dict:
        return {"input_ids": list(example["input_ids"]), "labels": list(example["input_ids"])}

    def encode(self, dataset: Any, tokenizer: Any) -> Any:
        if HELDOUT not in dataset.column_names:
            return super().encode(dataset, tokenizer)  # packed training blocks
        stride = value_of(self, "eval_stride")
        framed = self.framed(dataset, tokenizer)  # each document framed, or a running text framed once

        def windows(batch: dict) -> dict:
            stream = [t for row in batch["input_ids"] for t in row]
            pairs = sliding_windows(stream, self.max_length, stride)
            return {"input_ids": [p[0] for p in pairs], "labels": [p[1] for p in pairs]}

        # the whole split is one stream: one batch (batch_size=None)
        return framed.map(windows, batched=True, batch_size=None, remove_columns=framed.column_names,
                          desc=f"sliding windows (stride {stride})",
                          new_fingerprint=fingerprint(framed, tokenizer, self, "windows", stride))
