"""Shared test set-up: offline, real data and tokenizers from ../shared, small models built once."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOOLKIT_SHARED", ROOT.parent / "shared"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOOLKIT_DATA", str(SHARED / "data"))
os.environ.setdefault("TOOLKIT_TOKENIZERS", str(SHARED / "tokenizers"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One Hub id per family; --smoke maps each to a small random model with the real tokenizer.
FAMILY_IDS = {"bert": "bert-base-uncased", "roberta": "roberta-base", "gpt2": "gpt2",
              "bart": "facebook/bart-base", "t5": "t5-base"}
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="session", autouse=True)
def _smoke_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small models are built into a per-session cache (subprocesses inherit it)."""
    cache = tmp_path_factory.mktemp("toolkit-cache")
    os.environ["TOOLKIT_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_checkpoint(_smoke_cache: Path):
    """family -> folder of a 2-layer, width-32 random model of that family with its real tokenizer."""
    from toolkit import models

    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            built[family] = models.smoke_checkpoint(FAMILY_IDS[family])
        return built[family]

    return get


@pytest.fixture(scope="session")
def conll_sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(train, eval): the shared CoNLL-2003 files cut to their first 200 and 50 sentences, for NER
    runs whose rule is not about the data set (they read a dozen sentences of it): the whole train
    file is 0.6 s of CPU a load, paid by each run, resume and eval of a NER recipe."""
    folder = tmp_path_factory.mktemp("conll")
    cut = []
    for name, count in (("train.txt", 200), ("valid.txt", 50)):
        blocks = (Path(os.environ["TOOLKIT_DATA"]) / "ner" / "conll2003" / name).read_text().split("\n\n")
        (folder / name).write_text("\n\n".join(blocks[:count]).strip("\n") + "\n")
        cut.append(folder / name)
    return cut[0], cut[1]


@pytest.fixture(scope="session")
def squad_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared SQuAD v1.1 dev file cut to its first 6 articles (split by article as the
    recipes split the whole file), for QA runs whose rule is not about the data set."""
    import json

    data = json.loads((Path(os.environ["TOOLKIT_DATA"]) / "squad" / "v1.1" / "dev-v1.1.json").read_text())
    path = tmp_path_factory.mktemp("squad") / "dev-v1.1.json"
    path.write_text(json.dumps({**data, "data": data["data"][:6]}))
    return path


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture):
    """Run `toolkit ...` in-process; returns (exit code, stdout, stderr)."""
    from toolkit.cli import main

    def call(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return call


def with_nan_weights(load):
    """`load` (inference.load_model) giving a model whose float weights are all NaN: a run that
    diverged, for the tests that every prediction path refuses non-finite outputs."""
    def broken(*args, **kwargs):
        import torch

        model, tok = load(*args, **kwargs)
        with torch.no_grad():
            for param in (p for p in model.parameters() if p.is_floating_point()):
                param.fill_(float("nan"))
        return model, tok
    return broken


def write_recipe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


PYTHON = sys.executable


@functools.lru_cache(maxsize=16)
def _tokenizer_read(path: str, settings: tuple) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, **dict(settings))


def shared_tokenizer(path: str | Path, **settings) -> object:
    """`AutoTokenizer.from_pretrained(path, **settings)` of a folder no test writes (the shared
    tokenizers), read once per worker: each caller gets its own copy (the toolkit's own
    `models._lent`, Python side and backend), which it may change freely. A read takes 0.1 to
    0.5 s (GPT-2's and RoBERTa's 50,000 merges); tests that tokenize a few lines read the same
    folders dozens of times."""
    from toolkit import models

    kept = _tokenizer_read(str(path), tuple(sorted(settings.items())))
    if not getattr(kept, "is_fast", False):  # a Python-only one: no backend to lend
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), **settings)
    return models._lent(kept)


@pytest.fixture
def position_lookups(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every look-up of a record's file:line (toolkit.readers._line_of, which reads the file up to
    that record): an error path only. Done for every record of a valid file, it made reading
    quadratic (MRPC's 4,076 labels: 19 s of a 32 s --smoke run). Tests assert it stays empty."""
    from toolkit import readers

    calls: list = []
    real = readers._line_of
    monkeypatch.setattr(readers, "_line_of", lambda *args: calls.append(args) or real(*args))
    return calls


def launch_env(strategy: str, processes: int = 2, config_file: Path | None = None) -> dict[str, str]:
    """The environment a process of `accelerate launch --config_file configs/accelerate/<strategy>.yaml
    --num_processes N` gets (accelerate's own preparation of it, as its launchers do, and torch
    elastic's WORLD_SIZE / RANK / LOCAL_RANK); 'one' is a plain `toolkit run`. `config_file`: a
    DeepSpeed config file in the launch (`--deepspeed_config_file`)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    if strategy == "one":
        return {}
    argv = ["--config_file", str(ROOT / "configs" / "accelerate" / f"{strategy}.yaml"), "--num_processes",
            str(processes), *(["--deepspeed_config_file", str(config_file)] if config_file else []), "x.py"]
    with mock.patch.dict(os.environ):  # (accelerate starts from os.environ: none of a launch faked before)
        for key in [k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_"))]:
            del os.environ[key]
        args = _validate_launch_command(launch_command_parser().parse_args(argv))[0]
        if args.use_deepspeed:
            args.deepspeed_fields_from_accelerate_config = ""  # set by launch_command itself
            env = prepare_deepspeed_cmd_env(args)[1]
        else:
            env = prepare_multi_gpu_env(args)
    wanted = {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}
    return {**wanted, "WORLD_SIZE": str(processes), "RANK": "0", "LOCAL_RANK": "0"}


def as_launched(monkeypatch, env: dict[str, str]) -> None:
    """This process as one of a launch with `env` (and nothing of another launch left over)."""
    for key in list(os.environ):
        if key.startswith(("ACCELERATE_", "FSDP_")) or key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
