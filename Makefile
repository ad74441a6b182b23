# Everything a user runs. TOOLKIT_DATA defaults to the shared data folder beside the checkout.
PY          ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
TORCH       ?= torch==2.13.0
PIP_VERSION ?= 26.3
LOCK        := requirements.lock
export TOOLKIT_DATA ?= $(abspath $(firstword $(wildcard ../shared/data ../data data)))
export TOOLKIT_TOKENIZERS ?= $(abspath $(firstword $(wildcard ../shared/tokenizers ../tokenizers tokenizers)))
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
RUNS        ?= runs
comma       := ,
# where the targets' runs go; RUNS= (an unset variable exported) put them at the filesystem's root (/demo)
RUNS_DIR     = $(if $(strip $(RUNS)),$(RUNS),$(error RUNS is empty: give the folder for the runs, e.g. RUNS=runs (the default)))
RECIPE      ?= recipes/demo/sst2/minilm-lora.yaml
ARGS        ?=
NPROC       ?= 1
STRATEGY    ?= ddp
MODEL       ?=
METHOD      ?= lora
SEEDS       ?= 3
GLUE_MODEL  := $(or $(MODEL),roberta-base)
GLUE_TASKS  ?= $(sort $(notdir $(patsubst %/,%,$(dir $(wildcard recipes/glue/*/$(GLUE_MODEL)-$(METHOD).yaml)))))
TASK        ?= demo/sst2
METHODS     ?= full lora houlsby prompt_tuning bitfit
EPOCHS      ?=
LR_GRID     ?= x1
COMPARE_MODEL := $(or $(MODEL),minilm)
COMPARE_RUNS  ?= $(RUNS_DIR)/compare-$(subst /,-,$(TASK))-$(COMPARE_MODEL)
BENCH_ARGS  ?=
PARITY_ARGS ?=
ATTENTION_ARGS ?=
PRETRAIN    ?= recipes/pretrain/wikitext-2/minilm-mlm.yaml
FINETUNE    ?= recipes/demo/sst2/minilm-full.yaml
PRETRAIN_ARGS ?=
# glue/compare/demo: the sweep, then (--report) the report of its own runs alone: a folder holding the runs of
# another EPOCHS, LR_GRID or ARGS made before (or by another make at once) chose each cell's "best" across both
# as if a grid. None after --dry-run/--estimate; a sweep that stopped at a failed point makes no report; one
# under --keep-going that ran every other point is reported (the failed seeds counted in their cells, "1 not
# finished") and make still exits with the sweep's status (2)

GPU_PY      ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_SITE    ?= /tmp/site

.PHONY: install lock test-latest test-next test-oldest test demo run glue compare chain bench gpu-check parity attention validate smoke clean

install:  ## .venv with exactly the versions in requirements.lock, the package (editable) and its test tools
	rm -rf toolkit.egg-info  # an older build's metadata would shadow this one's
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q "pip==$(PIP_VERSION)"
	$(BIN)/pip install -q --no-deps -r $(LOCK)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
# an editable install compiles nothing: every interpreter compiled the toolkit's sources again (~0.3 CPU-s a
# `toolkit run`; PYTHONDONTWRITEBYTECODE=1 writes no cache); compiled once here, as pip does a wheel's
	$(BIN)/python -m compileall -q toolkit benchmarks
	$(BIN)/pip check
	@echo "installed: $(BIN)/toolkit (or 'source $(BIN)/activate' and then 'toolkit')"

# A fresh venv $(1) with the requirement set $(2) of scripts/deps.py (latest, next or oldest).
define fresh_env
	rm -rf $(1) toolkit.egg-info && $(PY) -m venv $(1)
	$(1)/bin/pip install -q "pip==$(PIP_VERSION)" "setuptools>=68"
	$(1)/bin/python scripts/deps.py $(2) --torch "$(TORCH)" > $(1)/requirements.txt
	$(1)/bin/pip install -q -r $(1)/requirements.txt
	$(1)/bin/pip install -q --no-deps --no-build-isolation -e .
	$(1)/bin/pip check
	$(1)/bin/pip freeze --all --exclude-editable | grep -v '^pip==' > $(1)/freeze.txt
endef

lock:  ## rewrite requirements.lock: the newest versions pyproject allows, resolved in a fresh venv
	$(call fresh_env,.venv-lock,latest)
	{ echo "# make lock, $$(date -u +%F): pip freeze of a fresh venv with the newest versions pyproject.toml allows"; \
	  echo "# (scripts/deps.py latest). make install installs exactly these, with --no-deps."; \
	  cat .venv-lock/freeze.txt; } > $(LOCK)
	rm -rf .venv-lock

test-latest:  ## the suite in .venv-latest: the newest releases pyproject allows (freeze in .venv-latest/freeze.txt)
	$(call fresh_env,.venv-latest,latest)
	OMP_NUM_THREADS=1 .venv-latest/bin/pytest -q -n 2

test-next:  ## the suite with torch/transformers/peft/accelerate/datasets past their upper bounds (before raising one)
	$(call fresh_env,.venv-next,next)
	OMP_NUM_THREADS=1 .venv-next/bin/pytest -q -n 2

test-oldest:  ## the suite on every lower bound of pyproject.toml
	$(call fresh_env,.venv-oldest,oldest)
	OMP_NUM_THREADS=1 .venv-oldest/bin/pytest -q -n 2

test:  ## the whole suite, offline, on CPU (2 workers, one thread each: the fastest split of 2 cores)
	OMP_NUM_THREADS=1 $(BIN)/pytest -q -n 2 --dist worksteal --durations=30  # an idle worker takes the other's queued tests; the 30 slowest listed

demo:  ## LoRA vs full fine-tuning of the real all-MiniLM-L6-v2 on SST-2, one table
	$(BIN)/toolkit sweep recipes/demo/sst2/minilm-full.yaml recipes/demo/sst2/minilm-lora.yaml \
	  --runs-dir "$(RUNS_DIR)/demo" $(ARGS) --report=

run:  ## make run RECIPE=... ARGS="train.epochs=1" [NPROC=8] [STRATEGY=ddp|fsdp|zero2|zero3]
ifeq ($(NPROC)$(STRATEGY),1ddp)
	$(BIN)/toolkit run "$(RECIPE)" $(ARGS)
else
	@case '$(NPROC)' in ''|*[!0-9]*|0|00*) echo "NPROC=$(NPROC): the number of processes, a whole number from 1 (make run NPROC=2)" >&2; exit 2;; esac
	@test -f configs/accelerate/$(STRATEGY).yaml || { echo "STRATEGY=$(STRATEGY): use ddp, fsdp, zero2 or zero3 (configs/accelerate/)" >&2; exit 2; }
	@if ! $(BIN)/python -c "import sys, torch; sys.exit(torch.cuda.device_count() < $(NPROC))"; then \
	  echo "fewer than $(NPROC) GPUs here: $(NPROC) CPU processes (gloo), STRATEGY=$(STRATEGY)"; \
	fi
	$(BIN)/python -m toolkit.launch --config_file configs/accelerate/$(STRATEGY).yaml --num_processes $(NPROC) \
	  -m toolkit.cli run "$(RECIPE)" $(ARGS)
endif

glue:  ## every GLUE task with a recipe for MODEL x METHOD, SEEDS seeds; GLUE table beside published numbers
# GLUE_TASKS given empty was said as a MODEL x METHOD with no recipe, of a pair that has them
	$(if $(strip $(GLUE_TASKS)),,$(if $(filter command line environment,$(origin GLUE_TASKS)),$(error make glue: GLUE_TASKS is empty; name the tasks (e.g. GLUE_TASKS="rte mrpc"), or leave it out for every task with a recipe for $(GLUE_MODEL)-$(METHOD))))
	$(if $(strip $(GLUE_TASKS)),,$(error make glue: no recipes/glue/*/$(GLUE_MODEL)-$(METHOD).yaml; MODEL and METHOD name a shipped pair, e.g. MODEL=roberta-base METHOD=lora (toolkit ls recipes)))
	$(BIN)/toolkit sweep $(foreach t,$(GLUE_TASKS),recipes/glue/$(t)/$(GLUE_MODEL)-$(METHOD).yaml) \
	  --seeds "$(SEEDS)" --runs-dir "$(RUNS_DIR)/glue" $(ARGS) --report=--glue

compare:  ## METHODS on TASK x MODEL, SEEDS seeds, EPOCHS and an LR_GRID per method (best on dev); table + plots
# one line before anything runs: no METHODS (the sweep said "no recipe given, e.g. toolkit sweep ...");
# EPOCHS=3,10 swept a grid of budgets, each method reported at its best on dev (EPOCHS is one budget for
# every method), EPOCHS="1 2" and LR_GRID="x1, x3" made their second word a recipe ("recipe 2 does not exist")
	$(if $(strip $(METHODS)),,$(error make compare: METHODS is empty; name the methods to compare, e.g. METHODS="full lora" (the default: full lora houlsby prompt_tuning bitfit)))
	$(if $(filter-out 0 1,$(words $(EPOCHS)))$(findstring $(comma),$(EPOCHS)),$(error make compare: EPOCHS=$(EPOCHS): one number of epochs, the one budget of every method (e.g. EPOCHS=3); a grid of budgets, each method reported at its best on dev, is ARGS=train.epochs=3,10 with EPOCHS unset))
	$(if $(filter-out 1,$(words $(LR_GRID))),$(error make compare: LR_GRID=$(LR_GRID): one comma-separated list with no spaces, e.g. LR_GRID=x0.3,x1,x3))
	$(BIN)/toolkit sweep $(foreach m,$(METHODS),recipes/$(TASK)/$(COMPARE_MODEL)-$(m).yaml) \
	  $(if $(EPOCHS),train.epochs=$(EPOCHS)) train.lr=$(LR_GRID) --seeds "$(SEEDS)" --runs-dir "$(COMPARE_RUNS)" $(ARGS) \
	  --report="--rows task --cols method"

chain:  ## continued pretraining, then fine-tuning from its result [PRETRAIN_ARGS=key=value ...] [ARGS=--smoke]
# an empty PRETRAIN or FINETUNE is one line before anything runs (FINETUNE= trained the whole pretraining first)
	$(foreach v,PRETRAIN FINETUNE,$(if $(strip $($(v))),,$(error make chain: no recipe given ($(v) is empty); give a recipe file, e.g. $(v)=$(if $(filter PRETRAIN,$(v)),recipes/pretrain/wikitext-2/minilm-mlm.yaml,recipes/demo/sst2/minilm-full.yaml) (the default))))
# the fine-tuning names the run the pretraining makes: each override word of PRETRAIN_ARGS and ARGS as the
# shell splits it (ARGS reaches the pretraining too: left out, `ARGS=train.epochs=1` fine-tuned from another
# run than the one just made), one YAML string (joining on spaces split 'method={name: lora, merge:
# true}' into four, a comma into two); flags and their values (--smoke, --stop-after 3) are not overrides.
# The fine-tuning (with the pretraining recipe it names) is validated first, with ARGS's overrides and
# --smoke: a fine-tuning recipe refused at its start was refused after the whole pretraining had run
	set -- $(PRETRAIN_ARGS) $(ARGS); refs=; for a in "$$@"; do case "$$a" in -*) continue;; *=*) ;; *) continue;; esac; \
	  refs="$$refs$${refs:+, }'$$(printf '%s' "$$a" | sed "s/'/''/g")'"; done; \
	ref="model.checkpoint={run: '$(subst ','',$(PRETRAIN))', overrides: [$$refs]}"; \
	set -- $(ARGS); n=$$#; for a in "$$@"; do case "$$a" in --smoke) ;; -*) continue;; *=*) ;; *) continue;; esac; \
	  set -- "$$@" "$$a"; done; shift $$n; \
	$(BIN)/toolkit validate "$(FINETUNE)" "$$ref" "$$@" >/dev/null && \
	$(BIN)/toolkit run "$(PRETRAIN)" $(PRETRAIN_ARGS) --runs-dir "$(RUNS_DIR)/chain" $(ARGS) && \
	$(BIN)/toolkit run "$(FINETUNE)" "$$ref" --runs-dir "$(RUNS_DIR)/chain" $(ARGS)
	$(BIN)/toolkit report "$(RUNS_DIR)/chain"

bench:  ## toolkit vs Trainer, matmul/MFU, LoRA vs full, start-up: Markdown tables [BENCH_ARGS="--sections trainer --json bench.json"]
	$(BIN)/python benchmarks/bench $(BENCH_ARGS)

gpu-check:  ## GPU speed (issue 35): one table + gpu-check.json [ARGS=--suite: the suite here; --smoke: on a CPU]; docs/gpu.md
	@if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
	  --target $(GPU_SITE) .whl/*.whl || exit 1; fi
	$(if $(wildcard .gpu/shared),TOOLKIT_DATA=$(CURDIR)/.gpu/shared/data TOOLKIT_TOKENIZERS=$(CURDIR)/.gpu/shared/tokenizers) \
	  PYTHONPATH=$(if $(wildcard .whl),$(GPU_SITE):)$(CURDIR) PYTHONUNBUFFERED=1 \
	  $(GPU_PY) benchmarks/gpu_check.py $(if $(wildcard .gpu/minilm),--minilm .gpu/minilm) $(ARGS)

parity:  ## a task type against transformers' own pipeline: TASK=qa|qa2|summarization|translation|mlm|clm|gpt2|objectives|icl [PARITY_ARGS="--seeds 42,43,44 --together" or "--smoke"]
	$(BIN)/python benchmarks/parity $(if $(filter command line environment,$(origin TASK)),$(TASK),qa) $(PARITY_ARGS)

attention:  ## every attention module on the demo setting + a length sweep: report.md and sweep.png
	$(BIN)/python benchmarks/attention.py --runs-dir "$(RUNS_DIR)/attention" $(ATTENTION_ARGS)

validate:  ## every recipe checked without loading weights
	$(BIN)/toolkit validate

smoke:  ## every recipe end to end on a small random model
	@for r in $$(find recipes -name '*.yaml' ! -name '_*' | sort); do \
	  $(BIN)/toolkit run $$r --smoke --runs-dir "$(RUNS_DIR)/smoke" || exit $$?; done

clean:
	rm -rf "$(RUNS_DIR)" .pytest_cache
