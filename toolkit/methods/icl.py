"""In-context prompting: a frozen language model labels examples by scoring label words.

No parameter changes. Each test example becomes a prompt (k demonstrations from the train split,
then the example), and the label whose verbalizer is the most probable continuation wins
(Brown et al. 2020). A continuation is scored as lm-evaluation-harness scores one
(`HFLM._encode_pair`, `_loglikelihood_tokens`), so that a k-shot number here is the harness's:
the whitespace that ends the prompt moves onto the label word (" positive"); a decoder scores the
tokens the whole text has beyond the prompt's own (no special token of the word), an
encoder-decoder the word alone as decoder target (no BOS, no EOS: T5's `</s>` and BART's
`<s>`/`</s>` are not scored); a too-long decoder prompt is cut from the left to fit
`max_length + 1` tokens with its label word (the last token only a target), an encoder-decoder's
to `max_length`. Label words of different lengths are compared by one of the rules the harness
names its multiple-choice accuracies after (`method.choose_by`): `acc`, the summed
log-probability (the default: the harness's GLUE tasks report it); `acc_norm`, that sum per
character of the word (without the whitespace before it); `acc_bytes`, per UTF-8 byte. The chosen rule
makes the task's metrics (`accuracy`, `f1`, ...), which reports compare; all three harness
accuracies are recorded beside them, uncalibrated as the harness computes them, so that a number
is never read under another rule's name. With `calibrate`, the chosen scores' label probabilities
are divided by those the same prompt gives a content-free input ("N/A") and renormalised (Zhao et
al. 2021, "Calibrate Before Use"), which removes the model's prior for one label word over another.

Demonstrations are drawn as the harness's default sampler draws them: for each eval split one
`random.Random(seed)`, and for each example in order a plain (not label-balanced) sample without
replacement of `shots` train rows, so each example has its own (with train.seed 1234, the
harness's default fewshot seed, and the same train split, the same ones); where the split scored
is the train split itself (`toolkit eval --split train`), `shots + 1` are drawn and the example
left out, as the harness does for its fewshot split; from any split, a drawn row equal to the
example is dropped, as the harness drops it (`x != doc`). What may make a k-shot
number something else is said in one `warning:` line each (rule 8): prompts cut from the left to
fit the model (their first demonstrations lost), eval examples that are train rows too, left out
of their own demonstrations (scored with one fewer), and eval examples whose text is among their
own demonstrations otherwise (another label: that label in their prompt). Text-to-text tasks draw theirs the same way
(`demonstration_sets`); the task builds, cuts and stops each prompt as the harness's
generate_until does (`TextToText._encode_in_context`, `stop_at`).
"""

from __future__ import annotations

import random
import sys
import string
from itertools import groupby
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np

from toolkit import readers
from toolkit.errors import UserError
from toolkit.lazy import lazy, no_grad
from toolkit.methods import METHODS, Context, Method, set_trainable
from toolkit.tasks._lm import special_frame
from toolkit.models import as_harness_reads, kind_of, max_positions, parts_lost, reads_padding, token_limit

torch = lazy("torch", globals())

CONTENT_FREE = "N/A"


def lm_head(family: str | None) -> str | None:
    """The head (a toolkit.heads name) a family scores continuations with; None: it cannot. By
    the toolkit's one rule for a family's kind (`models.kind_of`, as the clm task and text-to-text
    tasks read it): a family with a masked-LM head is an encoder even where transformers also has
    a CausalLM class for it (RemBERT, BigBird, RoFormer, ERNIE, ...: loaded so, an MLM checkpoint
    attends both ways and scored continuations it could see, exit 0)."""
    if family is None:
        return "causal-lm"  # unknown family: the model loader will say if it has no LM head
    return {"encoder-decoder": "seq2seq-lm", "decoder": "causal-lm"}.get(kind_of(family) or "")


def default_template(task: Any) -> str:
    """The task's own instruction as the question, its text columns as labelled lines. A task
    with no instruction (a user's own data: none is known) asks none (an AttributeError at
    validate, a traceback, before)."""
    cols = task.text_columns
    if len(cols) == 1:
        lines = [f"Sentence: {{{cols[0]}}}"]
    else:
        lines = [f"Sentence {i + 1}: {{{c}}}" for i, c in enumerate(cols)]
    if task.instruction:
        lines.append("Question: " + task.instruction.replace("{", "{{").replace("}", "}}"))
    return "\n".join([*lines, "Answer: {label}"])


def parse(template: str, names: Sequence[str] = ()) -> list[tuple[str, str | None, str | None, str | None]]:
    """`string.Formatter().parse(template)`, but a field whose whole text between its braces is
    one of `names` (the columns and "label") is that name, with no format spec or conversion: a
    column called "review: text" was read as field `review` with format spec " text", and one
    called "wow!" as a conversion str.format cannot parse, so neither could be named in a template,
    and the default template refused its own column ("unknown field '{review}'"). A field's extent
    is found as str.format finds it: to the matching '}', braces nesting inside a format spec."""
    out, literal, i = [], [], 0
    while i < len(template):
        c = template[i]
        if c in "{}" and template[i:i + 2] == c * 2:  # an escaped brace
            literal.append(c)
            i += 2
        elif c == "}":
            raise ValueError("Single '}' encountered in format string")
        elif c == "{":
            depth, j = 1, i + 1
            while j < len(template) and depth:
                depth += {"{": 1, "}": -1}.get(template[j], 0)
                j += 1
            if depth:
                raise ValueError("expected '}' before end of string")
            inner = template[i + 1:j - 1]
            if inner in names:
                out.append(("".join(literal), inner, "", None))
            else:
                ((_, name, spec, conversion),) = string.Formatter().parse("{" + inner + "}")
                out.append(("".join(literal), name, spec, conversion))
            literal, i = [], j
        else:
            literal.append(c)
            i += 1
    if literal:
        out.append(("".join(literal), None, None, None))
    return out


def template_problem(template: str, columns: Sequence[str]) -> str | None:
    """Why `template` cannot format an example of these columns, or None."""
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in parse(template, (*columns, "label")) if f is not None]
    except ValueError as exc:
        return f"method.template: not a format string ({exc})"
    names = [f for f, _, _ in fields]
    nested = next((f"{{{f}:{spec}}}" for f, spec, _ in fields if "{" in (spec or "")), None)
    if nested:  # its inner field is looked up at fill time, past these checks (a KeyError traceback)
        return f"method.template: '{nested}' has a field inside its format spec; give the spec literally"
    if names.count("label") != 1 or ("label", "", None) not in fields:  # an escaped {{label}} is text
        return "method.template: needs '{label}' exactly once (where the label word goes)"
    unknown = [n for n in names if n not in (*columns, "label")]
    if unknown:
        return (f"method.template: unknown field '{{{unknown[0]}}}' "
                f"(this task has: {', '.join('{' + c + '}' for c in (*columns, 'label'))})")
    # every text of an example is shown: an RTE template without {text_b} labels entailment from
    # the premise alone (an SST-2 template reused, exit 0)
    missing = [c for c in columns if c not in names]
    if missing:
        return (f"method.template: does not show '{{{missing[0]}}}', a text of every example of this task "
                f"(it has: {', '.join('{' + c + '}' for c in columns)}); each must come before '{{label}}'")
    # The query is the template up to the label word: a field after it is never shown for the
    # example being labelled, and with none before it every example gets the same prompt
    after = names[names.index("label") + 1:]
    if after or not names.index("label"):
        field = f"'{{{after[0]}}}' comes after '{{label}}'" if after else "no field comes before '{label}'"
        return (f"method.template: {field}; an example is shown up to its label word, so every "
                "field of it must come before '{label}'")
    return None


class _WholeNames(string.Formatter):
    """str.format, a field's name looked up whole: a column called "review.text" or "1" is that
    column (str.format reads "review.text" as attribute `text` of `review`, a KeyError traceback,
    and "1" as the second positional argument), and a field that is a name of `values` whole
    ("review: text", "wow!") is that name (`parse`)."""

    def __init__(self, names: Sequence[str] = ()) -> None:
        self.names = tuple(names)

    def parse(self, format_string: str) -> list[tuple[str, str | None, str | None, str | None]]:
        return parse(format_string, self.names)

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        return kwargs[field_name], field_name


def fill(template: str, values: dict[str, Any]) -> str:
    """`template` with its fields filled from `values` by their whole names (`_WholeNames`)."""
    return _WholeNames(list(values)).vformat(template, (), values)


def before_label(template: str, columns: Sequence[str] = ()) -> str:
    """The template up to its `{label}` field, as a format string: found by parsing (`parse`, the
    fields named by `columns` whole), not by the text "{label}", which an escaped "{{label}}"
    before the field also holds (the prompt was cut there, a "Single '{'" traceback)."""
    out = []
    for literal, name, spec, conversion in parse(template, (*columns, "label")):
        out.append(literal.replace("{", "{{").replace("}", "}}"))
        if name == "label":
            break
        if name is not None:
            out.append("{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}")
    return "".join(out)


def _check_shots(train: Any, shots: int, drawn: int | None = None) -> None:
    if train is None:
        raise UserError(f"method.shots: {shots} demonstrations need a train split and this task "
                        "has none; set method.shots=0")
    if (drawn or shots) > len(train):
        raise UserError(f"method.shots: {shots} is more than the {len(train)} train examples"
                        + (f" less the example scored (the eval split is the train split: {drawn} are "
                           "drawn and the example itself left out)" if drawn else ""))


def demonstration_sets(train: Any, shots: int, seed: int, n: int,
                       scored: Sequence[dict] | None = None,
                       examples: Sequence[dict] | None = None) -> list[list[dict]]:
    """The demonstrations of each of `n` eval examples, in order, as lm-evaluation-harness's
    default ContextSampler draws them: one `random.Random(seed)` for the split, then per example
    `rnd.sample(train, shots)` (Random.sample picks by index from the length alone, so drawing
    from range(len(train)) gives the harness's rows), and the drawn rows equal to the example
    dropped (its `[x for x in fewshotex if x != doc][:num_fewshot]`, whatever split they come
    from): `examples`, the eval rows, where known. A train row equal to an eval example (own train
    and eval files that overlap, the eval file the train file) was kept in that example's prompt,
    its own label shown (exit 0 with a warning, where the harness leaves it out); the example is
    then scored with one demonstration fewer, as the harness scores it (`left_out_warning`).
    `scored`: the eval rows when they are the train split itself (`toolkit evaluate --split
    train`); then, as the harness does when its fewshot split is the split it scores, `shots + 1`
    are drawn, so that `shots` are left after the example is dropped."""
    if shots == 0:
        return [[] for _ in range(n)]
    drawn = shots + 1 if scored is not None else shots
    _check_shots(train, shots, drawn if scored is not None else None)
    rnd, rows = random.Random(seed), {}
    draws = [rnd.sample(range(len(train)), drawn) for _ in range(n)]
    for i in {i for d in draws for i in d}:
        rows[i] = train[i]
    own = scored if scored is not None else examples
    if own is None:
        return [[rows[i] for i in d] for d in draws]
    return [[rows[i] for i in d if rows[i] != own[j]][:shots] for j, d in enumerate(draws)]


def left_out_warning(short: int, total: int, shots: int) -> str:
    """One line: eval examples that are train examples too, each left out of its own drawn
    demonstrations (`demonstration_sets`), so scored with fewer than `shots`."""
    return (f"warning: {short} of {total} eval examples are train examples too (every field the same) and "
            f"were drawn among their own {shots} demonstrations: each is left out of them, as "
            f"lm-evaluation-harness leaves it out, so it is scored with fewer than method.shots={shots}")


@dataclass
class Prompter:
    """Turns examples into prompt text: demonstrations, separator, then the unlabelled query."""

    template: str
    verbalizers: list[str]
    columns: list[str]
    separator: str = "\n\n"

    def demonstration(self, row: dict) -> str:
        return fill(self.template, {**{c: row[c] for c in self.columns}, "label": self.verbalizers[int(row["label"])]})

    def query(self, row: dict, demos: Sequence[dict] = ()) -> tuple[str, str]:
        """(prompt, gap): the text up to the label word, and the whitespace that precedes it.

        The gap moves onto the label word (" positive"), as the harness's _encode_pair moves a
        context's trailing whitespace onto its continuation (byte-level BPE tokenizes a word with
        its leading space); the prompt then ends where the demonstrations' label words begin.
        """
        prefix = fill(before_label(self.template, self.columns), {c: row[c] for c in self.columns})
        return self.separator.join(self.parts(row, demos)), prefix[len(prefix.rstrip()):]

    def parts(self, row: dict, demos: Sequence[dict] = ()) -> list[str]:
        """The prompt of `query` as its parts: each demonstration, then the example up to its gap."""
        prefix = fill(before_label(self.template, self.columns), {c: row[c] for c in self.columns})
        return [self.demonstration(d) for d in demos] + [prefix.rstrip()]

    def content_free(self, demos: Sequence[dict] = ()) -> tuple[str, str]:
        return self.query({c: CONTENT_FREE for c in self.columns}, demos)

    def shown(self, rows: Any, demo_sets: Sequence[Sequence[dict]]) -> int:
        """How many of `rows` are one of their own demonstrations (the same text in every field
        the template shows): such an example has its text's label in its prompt, so it scores as
        seen (a train duplicate with another label; one equal in every field is dropped from the
        demonstrations, `demonstration_sets`)."""
        def key(row: dict) -> tuple:
            return tuple(str(row[c]) for c in self.columns)
        return sum(key(row) in {key(d) for d in demos} for row, demos in zip(rows, demo_sets) if demos)


def _scored(setup: Any, suffix: str) -> Any:
    """The raw rows of eval split `suffix` when it is the train split itself (demonstration_sets
    leaves each example out of its own draw), else None."""
    return setup.raw_evals[suffix] if getattr(setup, "scores_train", False) else None


def _left_out(sets: list[list[dict]], shots: int, setup: Any, suffix: str) -> int:
    """How many eval examples of split `suffix` were left out of their own demonstrations, which
    are then fewer than `shots`: none said where the split scored is the train split (each is left
    out of a draw of shots + 1, so all keep `shots`)."""
    return 0 if _scored(setup, suffix) is not None else sum(len(d) < shots for d in sets)


def _read_back(tokenizer: Any, separator: str) -> str:
    """'a' + separator + 'b' encoded and decoded: whether the tokenizer keeps the separator (T5
    reads a newline as a space)."""
    return tokenizer.decode(tokenizer("a" + separator + "b", add_special_tokens=False)["input_ids"])


def _batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _prefix_token(tokenizer: Any) -> int:
    """What the harness conditions on when there is no context: BOS, else EOS (prefix_token_id)."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def _encode(tokenizer: Any, texts: list[str], decoder: bool) -> list[list[int]]:
    """The tokenizer's ids with its own special tokens, except for a text that already starts with
    the prefix token's text (a template opening with "<s>"), as the harness's tok_encode
    (has_bos_prefix): its BOS is not doubled. A `decoder`'s prompt keeps what the tokenizer puts
    before a text (its BOS) and not what it puts after: a tokenizer that ends every text with EOS
    (Llama's `add_eos_token`, T5's `</s>`) ended each prompt with it, so the model generated after
    an end of text, and a label word's continuation (the tokens past the prompt's count) lost its
    first token and scored the EOS in its place (exit 0). An encoder's input keeps both."""
    prefix = _prefix_token(tokenizer)
    mark = tokenizer.decode([prefix]) if prefix is not None else ""
    plain = [bool(mark) and t.startswith(mark) for t in texts]
    out = tokenizer(texts)["input_ids"] if texts and not all(plain) else [None] * len(texts)
    if any(plain):
        own = tokenizer([t for t, p in zip(texts, plain) if p], add_special_tokens=False)["input_ids"]
        out = [own.pop(0) if p else ids for ids, p in zip(out, plain)]
    after = special_frame(tokenizer)[1] if decoder else []
    return [list(ids[:len(ids) - len(after)]) if after and not p and list(ids[len(ids) - len(after):]) == after
            else list(ids) for ids, p in zip(out, plain)]


def encode_pairs(tokenizer: Any, queries: list[tuple[str, str]], verbalizers: Sequence[str],
                 seq2seq: bool) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) of every (query, label word), query-major, by the harness's
    `_encode_pair`: the context is the prompt with the tokenizer's own special tokens; the
    continuation is the gap and the word, for a decoder the tokens of the whole text beyond the
    prompt's count (so it never holds a BOS the tokenizer puts first), for an encoder-decoder the
    gap and word encoded alone without special tokens (no EOS scored). No context at all (an
    empty prompt and gap) is, for every family, the harness's prefix token (BOS, else EOS) before
    the word encoded alone, or the word's own first token when that is it; so is a decoder's
    context of whitespace alone (no token; the harness stops there on an assertion).
    Special tokens are not added to a text that starts with the prefix token's text (_encode)."""
    ctx = _encode(tokenizer, [p for p, _ in queries], decoder=not seq2seq)
    if seq2seq:
        texts = {g + w for _, g in queries for w in verbalizers}
        own = {t: tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts}
        conts = [own[g + w] for _, g in queries for w in verbalizers]
    else:
        whole = _encode(tokenizer, [p + g + w for p, g in queries for w in verbalizers], decoder=True)
        conts = [whole[i][len(ctx[i // len(verbalizers)]):] for i in range(len(whole))]
    pairs = []
    for i, cont in enumerate(conts):
        c, word = list(ctx[i // len(verbalizers)]), verbalizers[i % len(verbalizers)]
        if not cont:  # the word merged into the prompt's last token: nothing of it to score
            raise UserError(f"method.template: the label word {word!r} joins the token before it in "
                            f"{'...' + queries[i // len(verbalizers)][0][-20:]!r}; put a space or a colon before "
                            "'{label}'")
        if not "".join(queries[i // len(verbalizers)]):  # no context at all: the word alone
            c, cont = [], tokenizer(word, add_special_tokens=False)["input_ids"]
        if not c:
            prefix = _prefix_token(tokenizer)
            c, cont = ([prefix], cont) if cont[0] != prefix else (cont[:1], cont[1:])
        pairs.append((c, cont))
    return pairs


def window(ctx: list[int], cont: list[int], max_length: int, seq2seq: bool) -> list[int]:
    """The model's input for one pair, cut from the left as the harness cuts it: an
    encoder-decoder's context to its last `max_length` tokens; a decoder's context and
    continuation to their last `max_length + 1` tokens, less the last one (only a target)."""
    if seq2seq:
        return ctx[-max_length:]
    return (ctx + cont)[-(max_length + 1):-1]


def is_cut(ctx: list[int], cont: list[int], max_length: int, seq2seq: bool) -> bool:
    return len(ctx) > max_length if seq2seq else len(ctx) + len(cont) > max_length + 1


@no_grad
def _causal_batch(model: torch.nn.Module, pairs: list[tuple[list[int], list[int]]], pad: int) -> torch.Tensor:
    """Summed log-prob of each continuation, its input being the window (context and all of the
    continuation but its last token); left padding so that every input ends at the last position
    and only the last k logits are computed, the last len(cont) of them predicting it."""
    device = next(model.parameters()).device
    b, t, k = len(pairs), max(len(p) for p, _ in pairs), max(len(c) for _, c in pairs)
    ids = torch.full((b, t), pad, dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.long)
    targets = torch.zeros((b, k), dtype=torch.long)
    for i, (p, c) in enumerate(pairs):
        ids[i, t - len(p):], mask[i, t - len(p):] = torch.tensor(p), 1
        targets[i, k - len(c):] = torch.tensor(c)
    ids, mask, targets = ids.to(device), mask.to(device), targets.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (b, t): 0.. from each row's first real token
    # the last k positions, sliced here too: a forward that takes no logits_to_keep (TrOCR, Whisper's
    # decoder, xLSTM: **kwargs) returns every position, and the first k of them were scored, exit 0
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                   logits_to_keep=k).logits[:, -k:].float()  # (b, k, V): positions t-k .. t-1
    token_lp = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (b, k)
    lengths = torch.tensor([len(c) for _, c in pairs], device=device)
    is_cont = torch.arange(k, device=device)[None, :] >= (k - lengths)[:, None]  # (b, k)
    return torch.where(is_cont, token_lp, 0.0).sum(-1).cpu()


@no_grad
def _seq2seq_batch(model: torch.nn.Module, pairs: list[tuple[list[int], list[int]]], pad: int) -> torch.Tensor:
    """Summed log-prob of each target as the decoder's output given its prompt as encoder input
    (the decoder starts from the model's decoder_start_token_id, as `labels=` makes it)."""
    device = next(model.parameters()).device
    b, t, k = len(pairs), max(len(p) for p, _ in pairs), max(len(c) for _, c in pairs)
    ids = torch.full((b, t), pad, dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.long)
    labels = torch.full((b, k), -100, dtype=torch.long)
    for i, (p, c) in enumerate(pairs):
        ids[i, :len(p)], mask[i, :len(p)], labels[i, :len(c)] = torch.tensor(p), 1, torch.tensor(c)
    ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
    decoder_in = model.prepare_decoder_input_ids_from_labels(labels=labels)  # (b, k), shifted right
    logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_in).logits.float()
    token_lp = logits.log_softmax(-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (b, k)
    return torch.where(labels != -100, token_lp, 0.0).sum(-1).cpu()


def scorable_pairs(tokenizer: Any, queries: list[tuple[str, str]], verbalizers: Sequence[str],
                   max_length: int, seq2seq: bool) -> list[tuple[list[int], list[int]]]:
    """encode_pairs, and one line for a label word that cannot be scored: one that merges into the
    prompt's last token (encode_pairs says it), or one longer than `max_length` tokens (the
    harness stops on an assertion at both), or two words that are the same tokens after a prompt
    (T5 reads every character it does not know, Chinese or '{', as one <unk>, and drops trailing
    spaces: tied scores, the first word picked for every example, exit 0)."""
    pairs = encode_pairs(tokenizer, queries, verbalizers, seq2seq)
    for i, (_, cont) in enumerate(pairs):
        if len(cont) > max_length:
            raise UserError(f"method.max_length: {max_length} tokens cannot hold the label word "
                            f"{verbalizers[i % len(verbalizers)]!r} ({len(cont)} tokens); raise it or shorten the word")
    n = len(verbalizers)
    for q in range(len(queries)):  # words the tokenizer does not tell apart always score the same
        seen: dict[tuple, int] = {}
        for j, (ctx, cont) in enumerate(pairs[q * n:(q + 1) * n]):
            if (key := (tuple(ctx), tuple(cont))) in seen:
                raise UserError(
                    f"method.verbalizers: {verbalizers[seen[key]]!r} and {verbalizers[j]!r} are the same tokens "
                    f"to this tokenizer ({tokenizer.convert_ids_to_tokens(list(cont))}) after "
                    f"{'...' + queries[q][0][-20:]!r}, so they always score the same and the first would win every "
                    "example; use words it tells apart (a character it does not know is its unknown token)")
            seen[key] = j
    return pairs


def label_scores(model: torch.nn.Module, tokenizer: Any, queries: list[tuple[str, str]],
                 verbalizers: Sequence[str], max_length: int, batch_size: int,
                 progress: str | None = None, accelerator: Any = None) -> torch.Tensor:
    """(n, L) log-probabilities of every label word for every query, in batches of
    (query, label) pairs encoded and cut to `max_length` as the harness does (encode_pairs, window);
    a decoder that reads its padding (`reads_padding`) in batches of windows of one length, so that
    a score never depends on what else its batch holds.

    Under a launch of N processes (`accelerator`), batch i is scored by process i mod N and every
    process gets all the scores back: each pair is scored in the batch it has in one process.
    Scored as contiguous slices of the queries, the batches at a slice's edges held other pairs,
    padded to another width: the scores a float's last bits off one process's (the eval loss 6e-8
    relative apart, exit 0), and a near tie between label words could turn the other way."""
    seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
    pairs = [(window(ctx, cont, max_length, seq2seq), cont)
             for ctx, cont in scorable_pairs(tokenizer, queries, verbalizers, max_length, seq2seq)]
    batch = _seq2seq_batch if seq2seq else _causal_batch
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else _prefix_token(tokenizer)
    if not pairs:
        return torch.zeros((0, len(verbalizers)))
    order = list(range(len(pairs)))
    chunks = _batches(order, batch_size)
    padded = batch_size > 1 and len({len(p) for p, _ in pairs}) > 1
    if padded and not seq2seq and reads_padding(model, max(pairs, key=lambda pc: len(pc[0]))[0], pad):
        length = lambda i: len(pairs[i][0])  # noqa: E731
        chunks = [c for _, same in groupby(sorted(order, key=length), key=length)
                  for c in _batches(list(same), batch_size)]  # windows of one length: no padding
    shared = accelerator is not None and accelerator.num_processes > 1
    if shared:  # every process probed alike above; each takes its share of the batches
        chunks = chunks[accelerator.process_index::accelerator.num_processes]
    if progress and len(chunks) > 1:  # scoring thousands of prompts takes minutes on a CPU
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc=progress, mininterval=0.5 if sys.stderr.isatty() else 30.0)
    scored = [(chunk, batch(model, [pairs[i] for i in chunk], pad).cpu()) for chunk in chunks]
    if shared:
        from accelerate.utils import gather_object

        scored = gather_object(scored)
    out = torch.zeros(len(pairs))
    for chunk, scores in scored:
        out[chunk] = scores
    return out.view(len(queries), len(verbalizers))  # (n*L,) -> (n, L)


def cut_tokens(tokenizer: Any, queries: list[tuple[str, str]], verbalizers: Sequence[str],
               max_length: int, seq2seq: bool) -> list[tuple[int, int]]:
    """Per prompt, (the tokens label_scores cuts from its left to fit `max_length`, the most over
    its label words; its context's length): each cut loses its first demonstrations, or with none
    left, the start of its example (rule 8: what is cut is said, with its count)."""
    if not queries:
        return []
    pairs = encode_pairs(tokenizer, queries, verbalizers, seq2seq)
    n, out = len(verbalizers), []
    for i in range(len(queries)):
        mine = pairs[i * n:(i + 1) * n]
        most = max(len(c) - max_length if seq2seq else len(c) + len(w) - (max_length + 1) for c, w in mine)
        out.append((max(most, 0), len(mine[0][0])))
    return out


def cut_prompts(tokenizer: Any, queries: list[tuple[str, str]], verbalizers: Sequence[str],
                max_length: int, seq2seq: bool) -> int:
    """How many prompts label_scores cuts from the left to fit `max_length` (`cut_tokens`)."""
    return sum(dropped > 0 for dropped, _ in cut_tokens(tokenizer, queries, verbalizers, max_length, seq2seq))


def cut_counts(tokenizer: Any, prompts: list[list[str]], separator: str,
               cuts: list[tuple[int, int]], shots: int) -> tuple[int, int, int, int]:
    """(prompts cut, demonstrations not seen whole, examples cut themselves, demonstrations the cut
    prompts had: fewer than shots each where an example was left out of its own) of prompts given as
    their parts (demonstrations, then the example) and `cuts` (`cut_tokens`): the harness cuts
    a prompt from the left whatever it holds, so an example longer than the limit by itself loses
    its own start, which is said apart from the demonstrations lost."""
    cut = lost = own = had = 0
    for parts, (dropped, length) in zip(prompts, cuts):
        if dropped > 0:
            gone = parts_lost(tokenizer, parts, separator, dropped, length)
            cut, lost, own = cut + 1, lost + min(gone, len(parts) - 1), own + (gone >= len(parts))
            had += len(parts) - 1
    return cut, lost, own, had


def cut_warning(cut: int, total: int, max_length: int, shots: int, lost: int, own: int,
                had: int | None = None) -> str:
    """One line: the prompts cut to fit, the demonstrations they lost (of the `had` they had,
    unset: `shots` each), and the examples whose own start is cut (longer than the limit with no
    demonstration left)."""
    said = []
    if lost:
        said.append(f"{lost} of their {cut * shots if had is None else had} demonstrations not seen whole (scored with fewer than "
                    f"method.shots={shots}; lower method.shots to keep them)")
    if own:
        said.append(f"{own} example{'s' * (own > 1)} longer than that by {'themselves' if own > 1 else 'itself'}, "
                    "its start not seen (shorten the template or the texts, or raise method.max_length)")
    return (f"warning: {cut} of {total} prompts cut from the left at {max_length} tokens (method.max_length or "
            f"the model's positions): " + "; ".join(said or ["a demonstration's start not seen"]))


def seen_warning(seen: int, total: int, shots: int, answer: str = "label") -> str:
    return (f"warning: {seen} of {total} eval examples are among their own {shots} demonstrations "
            f"(the same text in train, with another {answer} or other fields): each has its text's {answer} in "
            "its prompt, so it scores as seen; remove them from the eval data, or draw other demonstrations "
            "(train.seed)")


def calibrated(scores: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """p(y|x) / p(y|content-free), renormalised: Zhao et al.'s diagonal W = diag(prior)^-1, b = 0;
    `prior` one (L,) for all, or (n, L): each example's own (its demonstrations, then "N/A")."""
    return calibrated_log(scores, prior).exp()


def calibrated_log(scores: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """The log of `calibrated`, computed in log space: label words whose log-probabilities are
    ~100 nats apart (long words under acc) underflowed to probability 0, the gold label's loss
    -log 0 = inf or a prior's 0/0 = NaN, and a working model's run stopped as "not finite"."""
    return (scores.log_softmax(-1) - prior.log_softmax(-1)).log_softmax(-1)  # (n, L) - (L,) or (n, L)


# lm-evaluation-harness's names for its multiple-choice accuracies, by what divides a choice's
# summed log-probability before the argmax: nothing, its characters, its UTF-8 bytes
CHOICE_RULES = ("acc", "acc_norm", "acc_bytes")


def per_rule(scores: torch.Tensor, words: Sequence[str], rule: str) -> torch.Tensor:
    """(n, L) summed log-probabilities of the label words -> what `rule` compares: divided by
    each word's length in characters (acc_norm) or UTF-8 bytes (acc_bytes), the word without the
    whitespace before it, as the harness measures its choices without their target delimiter.
    That whitespace is the delimiter wherever it is written: in the template (`Answer: {label}`,
    moved onto the word) or in the verbalizer (`Answer:{label}` with " yes", the same tokens);
    counted in the second, " yes" was 4 characters and " no" 3, not the harness's 3 and 2, and
    acc_norm / acc_bytes picked and lost otherwise than for the same prompt spelled the first way."""
    if rule == "acc":
        return scores
    shown = [w.lstrip() for w in words]
    lengths = [len(w) if rule == "acc_norm" else len(w.encode("utf-8")) for w in shown]
    return scores / torch.tensor(lengths, dtype=scores.dtype)


def harness_picks(scores: torch.Tensor, words: Sequence[str]) -> torch.Tensor:
    """(n, len(CHOICE_RULES)) the label each harness rule picks (the first of tied ones, as
    numpy's argmax in the harness)."""
    return torch.stack([per_rule(scores, words, r).argmax(-1) for r in CHOICE_RULES], -1)


def _max_positions(model: torch.nn.Module, tokenizer: Any) -> int:
    """The length prompts are cut to, resolved as the harness resolves it (resolve_max_length):
    the (text) config's n_positions, max_position_embeddings or n_ctx, the first set; else the
    tokenizer's model_max_length; else 2048."""
    config = getattr(model.config, "text_config", None) or model.config
    limit = next((getattr(config, a) for a in ("n_positions", "max_position_embeddings", "n_ctx")
                  if getattr(config, a, None) is not None), None)
    return int(limit or token_limit(tokenizer) or 2048)


@METHODS.register("icl")
@dataclass
class ICL(Method):
    """k-shot in-context prompting of a frozen decoder or encoder-decoder LM (no training)."""

    trains = False
    compile_eager = "it does not train (it scores continuations in context; nothing is stepped)"

    shots: int = field(default=0, metadata={"min": 0})
    template: str | None = None  # format string over text_a, [text_b], label; None: per task
    verbalizers: list[str] | None = None  # one word per label; None: the task's
    choose_by: Literal["acc", "acc_norm", "acc_bytes"] = "acc"  # CHOICE_RULES: sum, per char, per byte
    calibrate: bool = False
    separator: str = "\n\n"
    max_length: int | None = field(default=None, metadata={"min": 8})  # None: the model's limit
    batch_size: int = field(default=8, metadata={"min": 1})  # (example, label) pairs per forward

    def ignores(self, task: Any) -> dict[str, str]:
        """Besides the training settings: task.max_length (prompts are cut at method.max_length,
        as the harness cuts them), and on a text-to-text task what only label words use."""
        out = {**super().ignores(task), "task.max_length": (
            "icl cuts its prompts at method.max_length (unset: the model's limit), as "
            "lm-evaluation-harness does; set that instead")}
        if hasattr(task, "pair_separator"):  # a classifier's pairs: icl fills its template with the texts
            out["task.pair_separator"] = ("icl writes a pair's texts into method.template, not through the "
                                          "tokenizer's pair encoding; put the separator in the template")
        if hasattr(task, "generation"):  # a text-to-text task: demonstrations, then generation
            prompts = ("this task generates its answers from prompts of its own (task.prefix, the source, "
                       "task.suffix) and fills no template with label words; set task.prefix / task.suffix "
                       "to change the prompt")
            out.update({"method.template": prompts, "method.verbalizers": prompts,
                        "method.calibrate": "calibration divides label-word probabilities by their prior, and "
                                            "this task generates its answers (no label words)"})
        elif self.shots == 0:  # a generating task stops each answer at the separator, whatever the shots
            out["method.separator"] = ("it goes between demonstrations, and method.shots: 0 shows none; "
                                       "set shots above 0 to use it")
        return out

    def incompatible(self, family: str | None, task: Any) -> str | None:
        head = lm_head(family)
        if head is None:
            return (f"'{family}' is encoder-only and cannot score a continuation; use a decoder "
                    "(gpt2) or encoder-decoder (t5, bart) model") if kind_of(family) == "encoder" else (
                f"'{family}' has no language-model head to score a continuation with; use a decoder "
                "(gpt2) or encoder-decoder (t5, bart) model")
        if hasattr(task, "generation"):  # a text-to-text task: demonstrations, then generation
            wanted = task.model_head(family) if family is not None else head
            if wanted != head:  # SQuAD with task.mode: extractive: a span head reads the answers
                return (f"icl writes its answers with the model's LM head, and this task reads them off "
                        f"a {wanted} head (a span of the context); let the task generate them "
                        "(squad: task.mode: generative or auto)")
            if self.choose_by != "acc":
                return (f"method.choose_by: {self.choose_by} compares label words, and this task "
                        "generates its answers (none are compared); leave it at acc")
            # what only label words use would be ignored here: refused by `ignores`
            if head == "causal-lm" and self.max_length is not None and self.max_length <= task.new_tokens():
                return (f"method.max_length: {self.max_length} tokens leave no room for a prompt before the "
                        f"{task.new_tokens()} a decoder generates in them (task.generation.max_new_tokens, else "
                        "task.max_target_length); raise it or lower those")
            return None
        # own data says its problem; its label names, read from the files later, are not known yet
        # (is_regression reads their absence as a regression: own data with labels unset was refused
        # as "a regression (STS-B)")
        if task.problem == "regression" if hasattr(task, "problem") else getattr(task, "is_regression", False):
            return ("icl scores label words and this task is a regression ("
                    + ("task.problem: regression)" if hasattr(task, "problem") else "STS-B)"))
        if hasattr(task, "text_columns") and task.text_columns is None:
            return "icl fills its template from task.text_columns; set them for your own files"
        names = getattr(task, "label_names", None)
        if hasattr(task, "problem") and names is None:  # own data, labels read from the files: no order
            return ("icl pairs method.verbalizers with task.labels in order; set task.labels "
                    "(the label names, in the order of the verbalizers)")
        if not getattr(task, "verbalizers", None) or not hasattr(task, "text_columns") or names is None:
            return "icl needs a classification task with label words (GLUE)"
        words = self._words(task)
        # a word of whitespace alone ([" ", good]) shows no label, and two words that differ only by
        # the whitespace around them ("bad", "bad ") are one word: the model's preference between
        # the spaces picked the label, exit 0 (a tokenizer that drops the space ties them: T5)
        blank = next((w for w in words if readers.blank(w)), None)
        same = next(((v, w) for i, w in enumerate(words) for v in words[:i] if v.strip() == w.strip()), None)
        if len(words) != len(names) or len(set(words)) != len(words) or blank is not None or same is not None:
            why = (f" ({blank!r} shows nothing)" if blank is not None and len(words) == len(names) else
                   f" ({same[1]!r} is {same[0]!r} but for the whitespace around it)"
                   if same is not None and len(set(words)) == len(words) == len(names) else "")
            return (f"method.verbalizers: need {len(names)} distinct non-empty words, "
                    f"one per label ({', '.join(names)}), got {words}{why}")
        return template_problem(self._template(task), task.text_columns)

    def train_rows_needed(self) -> int:
        """`shots` demonstrations per example, and one more where the train split itself is
        scored (`toolkit eval RUN --split train` leaves the example out of its own draw)."""
        return self.shots + 1 if self.shots else 0

    def check_data(self, task: Any, raw: dict[str, Any]) -> None:
        if self.shots:  # the shots bound, said up front
            _check_shots(raw.get("train"), self.shots)

    def head(self, task: Any, family: str | None = None) -> str:
        """Decoder or encoder-decoder LM head by family (incompatible() has refused the rest)."""
        return lm_head(family) or "causal-lm"

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        """Frozen; and the label words checked against every eval example's prompt here, while the
        run is being built (before its folder exists), not minutes later at evaluation."""
        set_trainable(model, lambda _: False)
        if ctx is not None:
            self._limit(model, ctx.tokenizer)
        for task, dataset in self.__dict__.pop("_unchecked", []):
            self.check_words(model, as_harness_reads(ctx.tokenizer), task, dataset)
        return model.eval()

    def _limit(self, model: torch.nn.Module, tokenizer: Any) -> int:
        """The length prompts are cut to: method.max_length, else the model's (`_max_positions`).
        A method.max_length past the model's position table is one line (prompts that long were an
        IndexError traceback inside the model, a device-side assert on a GPU); T5's relative
        positions have no table."""
        most = max_positions(model.config, tokenizer, model)
        if self.max_length is not None and most is not None and self.max_length > most:
            raise UserError(f"method.max_length: {self.max_length} is more than the {most} positions "
                            f"this {model.config.model_type} model has; use at most {most}, or leave it unset")
        return self.max_length or _max_positions(model, tokenizer)

    def encoder(self, task: Any, tokenizer: Any) -> Any:
        """Prompts are built at evaluation, from raw examples: the rows pass as they are, and a
        label-word task's eval splits are kept for `apply`, which has the model to check them by."""
        def keep(dataset: Any) -> Any:
            if not hasattr(task, "generation"):
                self.__dict__.setdefault("_unchecked", []).append((task, dataset))
            return dataset
        return keep

    def check_words(self, model: torch.nn.Module, tokenizer: Any, task: Any, dataset: Any) -> None:
        """Every label word can be scored after every example's prompt (`scorable_pairs`), or one
        line. The prompts are the examples alone: what the word follows is the end of its own
        example's text, which demonstrations before it (after the separator) leave as it is."""
        prompter = self.prompter(task)
        queries = list(dict.fromkeys(prompter.query(row) for row in dataset))
        scorable_pairs(tokenizer, queries, prompter.verbalizers, self._limit(model, tokenizer),
                       bool(getattr(model.config, "is_encoder_decoder", False)))

    def _words(self, task: Any) -> list[str]:
        return list(self.verbalizers) if self.verbalizers is not None else list(task.verbalizers)

    def _template(self, task: Any) -> str:
        return self.template if self.template is not None else default_template(task)

    def prompter(self, task: Any) -> Prompter:
        return Prompter(self._template(task), self._words(task), list(task.text_columns), self.separator)

    def evaluate(self, model: torch.nn.Module, setup: Any, accelerator: Any) -> dict[str, float]:
        """The processes share out the batches of label-word scores one process scores
        (`label_scores`) and each gets them all back, so N processes predict exactly what one
        does, in the same order."""
        from toolkit import evaluation

        model = accelerator.unwrap_model(model).eval()
        self.__dict__.pop("_unchecked", None)  # `toolkit evaluate` encodes without apply: checked below
        task, tok = setup.task, as_harness_reads(setup.tokenizer)
        if hasattr(task, "generation"):
            return self._generate(model, setup, accelerator)
        prompter = self.prompter(task)
        limit = self._limit(model, tok)
        demos = {sfx: demonstration_sets(setup.train, self.shots, setup.seed, len(ds), _scored(setup, sfx), ds)
                 for sfx, ds in setup.evals.items()}
        queries = {sfx: [prompter.query(row, d) for row, d in zip(ds, demos[sfx])] for sfx, ds in setup.evals.items()}

        def scores(qs: list[tuple[str, str]]) -> torch.Tensor:
            with accelerator.autocast():
                return label_scores(model, tok, qs, prompter.verbalizers, limit, self.batch_size,
                                    progress="scoring" if accelerator.is_main_process else None,
                                    accelerator=accelerator)

        if accelerator.is_main_process:  # every prompt of every eval split, counted once
            every = [q for qs in queries.values() for q in qs]
            seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
            parts = [prompter.parts(row, d) for sfx, ds in setup.evals.items() for row, d in zip(ds, demos[sfx])]
            cuts = cut_tokens(tok, every, prompter.verbalizers, limit, seq2seq)
            cut, lost, own, had = cut_counts(tok, parts, prompter.separator, cuts, self.shots)
            if cut:
                print(cut_warning(cut, len(every), limit, self.shots, lost, own, had), file=sys.stderr)
            if short := sum(_left_out(demos[sfx], self.shots, setup, sfx) for sfx in setup.evals):
                print(left_out_warning(short, len(every), self.shots), file=sys.stderr)
            if seen := sum(prompter.shown(ds, demos[sfx]) for sfx, ds in setup.evals.items()):
                print(seen_warning(seen, len(every), self.shots), file=sys.stderr)
        out: dict[str, float] = {}
        for suffix, dataset in setup.evals.items():
            scored = scores(queries[suffix])  # (n, L) summed log-probs, in every process
            prior = self._priors(prompter, demos[suffix], scores) if self.calibrate else None
            gold = torch.tensor([int(row["label"]) for row in dataset], dtype=torch.long)
            rows = self._choices(scored, prior, prompter.verbalizers, gold)  # every process the same rows
            evaluation.refuse_not_finite({"loss": np.asarray([nll for _, nll, _ in rows], dtype=float)}, suffix)
            out.update({f"{k}{suffix}": v for k, v in self._metrics(task, rows, dataset).items()})
        return out

    @staticmethod
    def _priors(prompter: Prompter, demo_sets: list[list[dict]], scores: Any) -> torch.Tensor:
        """(n, L) label-word scores of each example's content-free prompt (its own demonstrations,
        then "N/A"), each distinct prompt scored once (with no shots, one for all)."""
        free = [prompter.content_free(d) for d in demo_sets]
        distinct = list(dict.fromkeys(free))
        if not distinct:
            return torch.zeros((0, len(prompter.verbalizers)))
        at = {q: i for i, q in enumerate(distinct)}
        return scores(distinct)[[at[q] for q in free]]

    def _choices(self, scores: torch.Tensor, prior: torch.Tensor | None, words: Sequence[str],
                 gold: torch.Tensor) -> list[tuple[int, float, list[int]]]:
        """Per example (the label the chosen rule picks, calibrated if asked; the cross-entropy of
        the gold label among the label words under that rule; the label each harness rule picks)."""
        chosen = per_rule(scores, words, self.choose_by)
        if prior is not None:
            logp = calibrated_log(chosen, per_rule(prior, words, self.choose_by))  # (n, L) priors
        else:
            logp = chosen.log_softmax(-1)  # over the label words
        nll = -logp.gather(-1, gold.view(-1, 1)).squeeze(-1) if len(gold) else torch.zeros(0)
        return list(zip(logp.argmax(-1).tolist(), nll.tolist(), harness_picks(scores, words).tolist()))

    @staticmethod
    def _metrics(task: Any, rows: list[tuple[int, float, list[int]]], dataset: Any) -> dict[str, float]:
        """The task's metrics of the chosen picks, the eval loss, and each harness accuracy."""
        labels = np.asarray(dataset["label"])
        metrics = task.compute_metrics(np.asarray([p for p, _, _ in rows]), labels)
        # the eval loss: cross-entropy of the gold label among the label words
        metrics["loss"] = float(np.mean([l for _, l, _ in rows])) if rows else float("nan")
        picks = np.asarray([r for _, _, r in rows]).reshape(len(rows), len(CHOICE_RULES))
        for j, rule in enumerate(CHOICE_RULES):
            metrics[rule] = float(np.mean(picks[:, j] == labels)) if rows else float("nan")
        return metrics

    def _generate(self, model: torch.nn.Module, setup: Any, accelerator: Any) -> dict[str, float]:
        """Text-to-text tasks: each eval example after its own demonstrations, drawn as for label
        words (`demonstration_sets`), then the task's own evaluation step (loss of the reference,
        generation, its metrics); the task builds, cuts and stops its prompts as the harness's
        generate_until (`TextToText._encode_in_context`)."""
        from torch.utils.data import DataLoader

        from toolkit import evaluation

        task, tok = setup.task, as_harness_reads(setup.tokenizer)
        task.model_head(model.config.model_type)  # the prompt layout follows the family
        limit = self._limit(model, tok)
        collate = task.collator(tok, model)
        loaders, contexts, seen, short = {}, [], 0, 0
        for sfx, raw in setup.raw_evals.items():
            sets = demonstration_sets(setup.train, self.shots, setup.seed, len(raw), _scored(setup, sfx), raw)
            short += _left_out(sets, self.shots, setup, sfx)
            pairs = [[(task.source_text(d), task.target_text(d)) for d in demos] for demos in sets]
            seen += sum(task.source_text(row) in {s for s, _ in p} for row, p in zip(raw, pairs))
            contexts.append(task.prompt_in_context(pairs, self.separator, limit, lambda texts: _encode(tok, texts, decoder=True)))
            loaders[sfx] = DataLoader(task.encode(raw, tok), batch_size=self.batch_size, collate_fn=collate)
        task.say_notices()  # what encoding the splits here found (targets cut, over the budget): the run
        # said its notices before (build), when nothing of these splits had been encoded yet
        total = sum(c.total for c in contexts)
        if accelerator.is_main_process:
            if cut := sum(c.cut for c in contexts):
                print(cut_warning(cut, total, limit, self.shots, sum(c.lost for c in contexts),
                                  sum(c.own for c in contexts), sum(c.had for c in contexts)), file=sys.stderr)
            if short:
                print(left_out_warning(short, total, self.shots), file=sys.stderr)
            if seen:
                print(seen_warning(seen, total, self.shots, "answer"), file=sys.stderr)
            if self.separator and self.separator not in _read_back(tok, self.separator):
                print(f"warning: method.separator {self.separator!r} does not survive this tokenizer (it reads "
                      f"{'a' + self.separator + 'b'!r} back as {_read_back(tok, self.separator)!r}): the demonstrations run "
                      "together and no answer can stop at it, so each is written to generation.max_new_tokens "
                      "(what follows its answer scored with it); use a separator the tokenizer keeps",
                      file=sys.stderr)
        return evaluation.evaluate(model, loaders, task, accelerator, setup.raw_evals,
                                   sink=getattr(setup, "predictions", None))
