"""A tokenizer that lower-cases, scored by a case-sensitive metric (translation's sacreBLEU BLEU
and chrF): one warning line at the start of the run and of eval; none for a cased tokenizer, nor
where the metric is case-blind (summarization's ROUGE) or the references hold no capitals."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest


LINE = "lower-cases text"
# recipe -> whether its tokenizer lower-cases. The probe (`models.lowercased`, encode and decode)
# is one path for every tokenizer, called at one place (`TextToText._note_case`): a WordPiece that
# lower-cases, a cased SentencePiece (T5, encoder-decoder) and a cased byte-level BPE (GPT-2,
# decoder-only). BART's byte-level BPE is GPT-2's kind of tokenizer on that same path (its row,
# 5.3 CPU-s, dropped 2026-11-28).
RECIPES = {"demo/own-data/minilm2minilm-translation": True, "translation/multi30k/t5-base-full": False,
           "translation/multi30k/gpt2-full": False}


@pytest.fixture
def marked(monkeypatch: pytest.MonkeyPatch):
    """Scoring writes SCORING to stderr first, so a test can tell what was said before it."""
    import sys

    from toolkit import evaluation

    scored = evaluation.evaluate

    def evaluate(*args, **kwargs):
        print("SCORING", file=sys.stderr)
        return scored(*args, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", evaluate)


def _said_before_scoring(err: str) -> int:
    lines = err.splitlines()
    scoring = next(i for i, line in enumerate(lines) if "SCORING" in line)  # after a progress bar's \r
    said = [i for i, line in enumerate(lines) if LINE in line]
    assert all(i < scoring for i in said), err
    return len(said)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_lowercasing_tokenizer_is_said_at_run_and_eval(recipe: str, tmp_path: Path, cli, marked) -> None:
    """MiniLM2MiniLM (an uncased WordPiece) on Multi30k writes no capitals, and sacreBLEU's BLEU
    and chrF counted each capital of the German references as a miss, unsaid (exit 0). T5 and
    GPT-2 (BART's kind of tokenizer) keep case: nothing is said."""
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    assert _said_before_scoring(err) == RECIPES[recipe]
    if RECIPES[recipe]:
        line = next(x for x in err.splitlines() if LINE in x)
        assert line.startswith("warning: ") and "BLEU and chrF" in line and "case-sensitive" in line
        assert "cased tokenizer" in line and "-lc" in line
    run = next(p.parent for p in (tmp_path / "runs").rglob("metrics.json"))
    code, _, err = cli("eval", run)
    assert code == 0, err
    assert _said_before_scoring(err) == RECIPES[recipe]


def _pairs(tmp_path: Path, lower: bool) -> str:
    texts = {"en": ["A man rides a horse.", "Two dogs play in Berlin."], "de": ["Ein Mann reitet.", "Zwei Hunde in Berlin."]}
    for lang, lines in texts.items():
        with gzip.open(tmp_path / f"p.{lang}.gz", "wt") as handle:
            handle.write("".join((t.lower() if lower else t) + "\n" for t in lines * 8))
    return str(tmp_path / "p.{lang}.gz")


@pytest.mark.parametrize("case", ["lower-cased references", "summarization"])
def test_nothing_is_said_where_case_cannot_cost(case: str, tmp_path: Path, cli) -> None:
    """References without capitals (IWSLT14's are lower-cased), or a metric that lower-cases both
    sides itself (ROUGE): an uncased tokenizer loses nothing there, and nothing is said."""
    if case == "summarization":
        recipe = "summarization/samsum/minilm2minilm-full"
        extra: list[str] = []
    else:
        pattern = _pairs(tmp_path, lower=True)
        recipe = "demo/own-data/minilm2minilm-translation"
        extra = [f"task.train_file={pattern}", f"task.eval_file={pattern}"]
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs", *extra)
    assert code == 0, err
    assert LINE not in err


def test_the_probe_reads_what_the_tokenizer_does(tiny_checkpoint) -> None:
    """The probe round-trips capitals through each family's tokenizer: only the uncased one loses them."""
    from toolkit import models

    lost = {f: models.lowercased(models.load_tokenizer(tiny_checkpoint(f))) for f in ("bert", "roberta", "gpt2", "bart", "t5")}
    assert lost == {"bert": "paris berlin", "roberta": None, "gpt2": None, "bart": None, "t5": None}
