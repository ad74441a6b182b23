#!/usr/bin/env bash
# What `make gpu-check` carries to a lent GPU machine (docs/gpu.md), made here, in the repo root:
#   .whl/         the Python packages the GPU image lacks or has too old (Python 3.12, x86-64),
#                 at exactly the versions of requirements.lock; torch, numpy, pyarrow, pandas,
#                 accelerate, safetensors, scikit-learn, scipy, sacrebleu, typer, pytest(-xdist) and
#                 DeepSpeed's einops, msgpack, ninja, py-cpuinfo are the image's own (see
#                 /work/.library/device/KINDS.md); so is hf-xet, which an off-line run never uses.
#                 The suite's call carries .whl and .gpu/shared together: 63 of the 64 MiB a call
#                 carries, with the checkout (docs/gpu.md)
#   .gpu/shared/  a copy of the data and tokenizers the check and the suite read (TOOLKIT_DATA,
#                 TOOLKIT_TOKENIZERS)
#   .gpu/minilm/  all-MiniLM-L6-v2 for the accuracy rows, its weights stored in bfloat16 (45 MB;
#                 the 90 MB float32 file is over what one call carries; loaded back as float32)
# Each is ignored by git (.gitignore) and named in the call's `carry`. Nothing multi-GB:
# torch is the image's. Usage: scripts/gpu_wheels.sh [SHARED_DIR]   (default ../shared)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
SHARED=${1:-../shared}
PY=${PY:-python3}                       # any Python with pip: downloads and builds wheels
TOOLKIT_PY=${TOOLKIT_PY:-.venv/bin/python}  # the toolkit's environment (make install): MiniLM in bf16
LOCK=requirements.lock
# the image lacks these, or has an older version than the toolkit needs (transformers 5.17,
# huggingface_hub 1.33, no datasets, no deepspeed); each with what it needs that the image does not have
PACKAGES="transformers huggingface_hub tokenizers datasets dill multiprocess peft httpx2 httpcore2 truststore
idna anyio h11 click fsspec regex nltk defusedxml pysbd hjson pydantic pydantic_core annotated-types
typing-inspection"
SDIST_ONLY="rouge_score seqeval deepspeed"  # published as source only: built here into pure-Python wheels

{ git check-ignore -q .whl/x && git check-ignore -q .gpu/x; } || { echo ".whl/ and .gpu/ must be git-ignored (.gitignore)" >&2; exit 1; }

pinned() {  # NAME -> NAME==VERSION from requirements.lock (fails if the lock has no such line)
  local line
  line=$(grep -i "^$1==" "$LOCK") || { echo "no $1 in $LOCK" >&2; exit 1; }
  echo "$line"
}

rm -rf .whl && mkdir -p .whl
for name in $PACKAGES; do
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$(pinned "$name")"
done
for name in $SDIST_ONLY; do
  $PY -m pip wheel -q --no-deps -w .whl "$(pinned "$name")"
done

rm -rf .gpu && mkdir -p .gpu/shared
cp -r "$SHARED/data" "$SHARED/tokenizers" .gpu/shared/
PYTHONPATH=$PWD "$TOOLKIT_PY" - <<'EOF'
"""all-MiniLM-L6-v2 from its PyPI package, weights in bfloat16, config saying float32."""
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from toolkit import models

source = Path(models.resolve("sentence-transformers/all-MiniLM-L6-v2"))
target = Path(".gpu/minilm")
shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors", "*.onnx", "onnx", "openvino"))
weights = load_file(source / "model.safetensors")
save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()},
          target / "model.safetensors", metadata={"format": "pt"})
EOF
du -sh .whl .gpu/shared .gpu/minilm
echo "carry for make gpu-check: .whl .gpu/shared/data/glue/SST-2 .gpu/shared/tokenizers, and .gpu/minilm in a call before (docs/gpu.md)"
