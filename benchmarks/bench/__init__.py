"""Speed and memory of the toolkit against transformers' Trainer, and of the machine it runs on.

Sections (`--sections`, default all four; each can run alone):

  trainer  the toolkit's loop against Trainer on the same model, data, batch, learning rate and
           schedule: (a) the toolkit, (b) Trainer with dynamic padding (the task's
           DataCollatorWithPadding, Trainer's default random sampler), (c) Trainer with every
           example padded to max_length, as run_glue.py does by default (padding="max_length",
           default_data_collator). Train and eval samples/s, peak memory, dev accuracy after the
           same steps, and the toolkit's speed over each Trainer row.
  matmul   the machine's measured matmul throughput (GFLOP/s) and the model-FLOPs utilisation of
           one full fine-tuning step on 32 x 128 real tokens.
  lora     LoRA against full fine-tuning on a random-weight roberta-base-shaped model: step time
           and peak memory, and their ratios.
  startup  wall time of `toolkit ls`, `toolkit validate` and a `--smoke` run, against targets.
  methods  (not in the default set) the toolkit's loop per adaptation method, same data and steps.

`python benchmarks/bench/host_step.py --before REV` (a script of its own, CPU): the host ms of
the loop's step by part, tiny BERT, compiled (aot_eager) and eager, before and after a revision.

Every measured row runs in its own process (no row inherits another's warm kernels, caches or
memory) after the same warm-up; tables are Markdown under a header naming the device, torch
version, precision and date. `--json PATH` writes every row.

    python benchmarks/bench                                  # all sections, CPU-sized defaults
    python benchmarks/bench --sections trainer --steps 3 --eval-samples 64   # a quick check
    python benchmarks/bench --precision bf16 --steps 200 --lora-batch-size 32   # on a GPU
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's toolkit

# The sections' names, importable as `bench.X` (tests, other benchmarks).
from toolkit.tasks.glue import Glue  # noqa: E402  (the trainer section's task)
from bench.common import (  # noqa: E402
    EXTRA_SECTIONS, LR, METHODS, MINILM, PACKAGE, ROBERTA_BASE, ROOT, SECTIONS, SEED, SIZES, STEP_PARTS,
    WARMUP_RATIO, WEIGHT_DECAY, build_checkpoint, cuda, current_memory_mb, device, device_name,
    embedding_params, header, mfu, non_embedding_params, peak_memory_mb, peak_tensor_mb, random_batch,
    ratio, reset_peak_memory, roberta_base_config, roberta_base_random, run_row, step_breakdown, sync,
    table, time_alternating, time_training_steps, timed, training_step)
from bench.trainer import (  # noqa: E402
    CountingCollator, accuracy, count_toolkit_collators, eval_row, fed, glue_task, padded_encode,
    section_methods, section_trainer, toolkit_recipe, toolkit_row, trainer_arguments, trainer_data,
    trainer_row, trainer_settings, trainer_table, warm_up, warmup_steps)
from bench.levers import (  # noqa: E402
    LEVERS, compile_row, lever_row, section_levers)
from bench.matmul import (  # noqa: E402
    matmul_gflops, matmul_row, matmul_sizes, matmul_tables, section_matmul)
from bench.lora import (  # noqa: E402
    lora_row, lora_table, section_lora)
from bench.startup import (  # noqa: E402
    STARTUP, STARTUP_RECIPE, section_startup, startup_rows, startup_table, toolkit_command)
from bench.cli import (  # noqa: E402
    RUNNERS, main, measure, parse, parser, sections, trainer_section_row)
