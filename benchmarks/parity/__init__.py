"""Every task type against transformers' own pipeline: the toolkit's recipe beside a reference
run built on transformers' machinery (Trainer / Seq2SeqTrainer, the example scripts' recipes),
on the same checkpoint, data subset, tokenisation limits, hyper-parameters, schedule and seeds.

    python benchmarks/parity qa                      # the real budget, seeds 42,43,44
    python benchmarks/parity summarization --seeds 42
    python benchmarks/parity qa --smoke              # tiny random models, seconds: the harness
    make parity TASK=qa PARITY_ARGS="--seeds 42"

Tasks: qa (SQuAD v1.1, MiniLM, extractive), qa2 (the same on a SQuAD v2.0-format file made from
the v1.1 dev set: unanswerable questions, run_qa's null answer, the official v2.0 scorer), summarization (SAMSum, MiniLM2MiniLM), translation
(Multi30k en-de, MiniLM2MiniLM), mlm (WikiText-2, MiniLM), clm (WikiText-2, a random-weight
GPT-2), gpt2 (decoder-only summarization of SAMSum, the same GPT-2, prompt masked from the loss),
objectives (T5 span corruption and BART denoising measured against their papers' definitions on
10k blocks, no training), icl (in-context prompting on a generation task: the toolkit's batched
scoring and generation against one example at a time).

Each side of each seed runs in a fresh process (this package again with --side) and returns one
ROW line: its metrics, training and evaluation samples/s, and the process's peak resident memory.
The parent prints per task the metric on both sides (mean +- std over the seeds), the paired
difference (mean, std and a paired t statistic), the speeds, peak memory and the data-driven
baselines (QA: first sentence of the context, and for v2.0 no answer anywhere; summarization: Lead-3 utterances; translation:
the source copied).

What is shared between the sides on purpose: the raw examples (each task's own `load()`, so the
subset is the same rows) and the hyper-parameters (read from the one resolved recipe). What each
reference writes itself, after transformers' example scripts (run_qa, run_summarization,
run_translation, run_mlm, run_clm), not taken from the toolkit: tokenisation and windowing,
labels, the collator, Trainer's loop, n-best span post-processing, generation, and scoring (the
official SQuAD v1.1 and v2.0 definitions written out in qa.py; rouge-score and sacreBLEU called directly).

The package: common (what the sides share); one module per reference (qa, seq2seq, lm, gpt2),
objectives and icl (measured without training); specs (the task types, budgets, baselines and
the toolkit's side); sides (one side in its own process); tables; cli.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's toolkit

# Every name, importable as `parity.X` (tests, other benchmarks).
from parity.common import (  # noqa: E402
    BATCHES, COMMON, GPT2, GREEDY_SHORT, MINILM, ROOT, SEED_LIST, SET, ToolkitBatches, batched,
    bert_dropout, checkpoint_path, distinct, in_order, peak_rss_mb, random_gpt2, raw_splits, reference_attention,
    timed, training_arguments)
from parity.qa import (  # noqa: E402
    first_sentence, normalize_answer, qa_eval_features, qa_postprocess, qa_train_features,
    reference_qa, squad_f1, squad_v1, squad_v2, squad_v2_file)
from parity.seq2seq import (  # noqa: E402
    bleu_scores, decode, encoder_decoder, generation_kwargs, reference_seq2seq, rouge_scores,
    seq2seq_loss, seq2seq_trainer, summed_loss)
from parity.lm import (  # noqa: E402
    causal_lm, grouped, masking, one_mask_set_loss, reference_lm)
from parity.gpt2 import (  # noqa: E402
    gpt2_evaluate, reference_gpt2)
from parity.objectives import (  # noqa: E402
    denoise_stats, objective_blocks, rebuild_span_corruption, span_corruption_stats)
from parity.specs import (  # noqa: E402
    BATCHABLE, BOTH, DATA, NEUTRAL, ONLY_SOME, REACH, REFERENCES, SPECS, Spec, baselines, one_sided, overrides, reach,
    requirements, resolved_recipe, settings, toolkit_side)
from parity.icl import (  # noqa: E402
    icl_check)
from parity.sides import (  # noqa: E402
    finish_side, gpu_memory, run_side, side, start_side)
from parity.tables import (  # noqa: E402
    cpu_seconds, mean_std, paired, render, scale, table)
from parity.cli import (  # noqa: E402
    compare, main, merge, parse_seeds, same_examples)
