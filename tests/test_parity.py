"""benchmarks/parity (the package): its harness end to end on tiny random models, and each reference piece
checked by hand-worked examples and against the toolkit's own (the table compares two pipelines;
these make sure a difference in it comes from training, not from a scorer or a labeller)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def parity():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import parity

    return parity


@pytest.fixture(autouse=True)
def shared_lists(parity):
    """The harness's shared settings (SET, BATCHES: lists changed in place, so that every module
    of the package sees the change), put back after every test: `parity.main([... "--set",
    "train.epochz=2"])` left its --set to the next test in the worker, whose reference then read it."""
    saved = list(parity.SET), list(parity.BATCHES)
    yield
    parity.SET[:], parity.BATCHES[:] = saved


# --- the official SQuAD v1.1 definitions, worked by hand ------------------------------------------
@pytest.mark.parametrize("prediction, golds, em, f1", [
    ("The Broncos", ["Denver Broncos", "Broncos"], 1.0, 1.0),        # article dropped, best gold wins
    ("Denver Broncos!", ["denver broncos"], 1.0, 1.0),                # case and punctuation
    ("the Denver team", ["Denver Broncos"], 0.0, 0.5),                # 1 shared of 2 and 2: P = R = 1/2
    ("Santa Clara, California", ["Levi's Stadium"], 0.0, 0.0),
    ("a b c d", ["b c"], 0.0, 0.8),                                   # 'a' is an article: P = 2/3, R = 1
    ("", ["Broncos"], 0.0, 0.0),                                      # v1.1: empty is simply wrong
    ("blue blue", ["blue"], 0.0, 2 / 3),                              # multiset: P = 1/2, R = 1
])
def test_squad_v1_scorer_hand_worked(parity, prediction: str, golds: list[str], em: float, f1: float) -> None:
    from toolkit.tasks._text_metrics import squad_scores

    got = parity.squad_v1([prediction], [golds])
    assert got["exact_match"] == pytest.approx(em) and got["f1"] == pytest.approx(f1)
    toolkit = squad_scores([prediction], [golds], "v1")  # the toolkit's scorer on the same case
    assert toolkit["exact_match"] == pytest.approx(em) and toolkit["f1"] == pytest.approx(f1)


@pytest.mark.parametrize("prediction, golds, em, f1", [
    ("", [], 1.0, 1.0),                          # unanswerable, nothing answered: right
    ("Paris", [], 0.0, 0.0),                     # unanswerable, answered: wrong
    ("", ["Paris"], 0.0, 0.0),                   # answerable, nothing answered
    ("", ["the"], 1.0, 1.0),                     # gold normalises to nothing: "" is its one gold
    ("the Eiffel tower", ["Eiffel Tower"], 1.0, 1.0),
])
def test_squad_v2_scorer_hand_worked(parity, prediction: str, golds: list[str], em: float, f1: float) -> None:
    from toolkit.tasks._text_metrics import squad_scores

    got = parity.squad_v2([prediction], [golds])
    toolkit = squad_scores([prediction], [golds], "v2")
    for scores in (got, toolkit):
        assert scores["exact_match"] == pytest.approx(em) and scores["f1"] == pytest.approx(f1)
    # HasAns is what the file lists (the official qid_to_has_ans), on both scorers, alone and
    # beside a partner question of the other set, answered right
    split = "HasAns" if golds else "NoAns"
    assert got[f"{split}_f1"] == pytest.approx(f1) and toolkit[f"{split}_f1"] == pytest.approx(f1)
    mixed = squad_scores([prediction, ""], [golds, [] if golds else ["x"]], "v2")
    assert mixed[f"{split}_f1"] == pytest.approx(f1)


def test_qa_postprocess_null_answer_hand_worked(parity) -> None:
    """v2.0: the null score is the lowest first-token start+end over the windows (window 0:
    1 + 1 = 2; window 1: 9 + 9 = 18, so 2); the best span 'bb' scores 1.5 + 0.4 = 1.9. Null wins
    by 0.1 > 0 -> ""; at threshold 0.5 the span is kept."""
    context = "aa bb"
    offsets = [[None, (0, 2), (3, 5)], [None, (3, 5), None]]
    start = np.array([[1.0, 0.0, 1.5], [9.0, 0.2, 0.0]])
    end = np.array([[1.0, 0.0, 0.4], [9.0, 0.1, 0.0]])
    args = ([0, 0], offsets, [context], 20, 30)
    assert parity.qa_postprocess(start, end, *args, with_negative=True) == [""]
    assert parity.qa_postprocess(start, end, *args, with_negative=True, null_threshold=0.5) == ["bb"]
    assert parity.qa_postprocess(start, end, *args) == ["bb"]


def test_qa_postprocess_hand_worked(parity) -> None:
    """Two windows of one context; the best legal span wins across windows. Window 0: its top
    start (3) is after its top end (1), so its best legal span is (3, 3) 'dd' at 5.0. Window 1:
    (1, 3) is 3 tokens, over max_answer 2; (1, 2) 'bb cc' at 3.0 + 2.5 = 5.5 wins."""
    context = "aa bb cc dd"
    offsets = [[None, (0, 2), (3, 5), (6, 8)], [None, (3, 5), (6, 8), (9, 11)]]
    start = np.array([[9.0, 0.0, 1.0, 5.0], [9.0, 3.0, 0.5, 0.0]])
    end = np.array([[9.0, 4.0, 0.0, 0.0], [9.0, 0.0, 2.5, 3.0]])
    got = parity.qa_postprocess(start, end, [0, 0], offsets, [context], n_best=20, max_answer=2)
    assert got == ["bb cc"]


def test_qa_reference_windows_and_spans_equal_the_toolkits(parity) -> None:
    """run_qa's labelling written in the benchmark and the toolkit's window_features give the same
    windows and answer tokens on real SQuAD questions, and both n-best searches the same text."""
    from toolkit import models
    from toolkit.tasks._qa import best_spans, window_features

    path = models.resolve(parity.MINILM)
    tok = models.load_tokenizer(path)
    recipe = parity.resolved_recipe("qa", ["task.max_eval_samples=60", "task.max_train_samples=60"])
    train, _ = parity.raw_splits(recipe)
    rows = train[:]
    ours = parity.qa_train_features(tok, rows, 128, 32)  # short windows: many hold no answer
    theirs = window_features(tok, list(rows["question"]), list(rows["context"]), list(rows["answers"]), 128, 32)
    assert ours["input_ids"] == theirs["input_ids"]
    assert ours["start_positions"] == theirs["start_positions"] and ours["end_positions"] == theirs["end_positions"]
    feats, example_of, offsets = parity.qa_eval_features(tok, rows, 128, 32)
    width = max(len(x) for x in feats["input_ids"])
    logits = np.random.default_rng(0).normal(size=(2, len(example_of), width))
    padded = np.array([[list(o) if o else [-1, -1] for o in offs] + [[-1, -1]] * (width - len(offs))
                       for offs in offsets])
    mine = parity.qa_postprocess(logits[0], logits[1], example_of, offsets, list(rows["context"]), 20, 30)
    toolkit = best_spans(logits[0], logits[1], padded, np.array(example_of), list(rows["context"]), 20, 30)
    assert mine == [b.text for b in toolkit]


# --- T5's span corruption, rebuilt by hand -----------------------------------------------------------
def test_span_corruption_rebuilds_the_block(parity) -> None:
    """T5's layout: 'a b c d e' with spans (b c) and (e) -> input 'a <0> d <1>', target
    '<0> b c <1> e'; the rebuild puts each span back where its sentinel stands."""
    from toolkit.tasks.span_corruption import span_corruption

    s0, s1 = 100, 99
    ids, noise = [1, 2, 3, 4, 5], np.array([0, 1, 1, 0, 1], bool)
    inp, tgt = span_corruption(np.array(ids), noise, [s0, s1], eos_id=0)
    assert (inp, tgt) == ([1, s0, 4, s1, 0], [s0, 2, 3, s1, 5, 0])
    assert parity.rebuild_span_corruption(inp[:-1], tgt[:-1], [s0, s1]) == ids


# --- in-context prompting on a generation task ---------------------------------------------------------
def test_icl_batched_scoring_equals_one_at_a_time(parity, tiny_checkpoint) -> None:
    """GPT-2 with 2 demonstrations before every SAMSum dialogue: the toolkit's batched, padded
    evaluation step gives each example the target loss and the greedy continuation it gets alone."""
    got = parity.icl_check(tiny_checkpoint("gpt2"), examples=6, shots=2, batch_size=3)
    assert got["examples"] == 6
    assert got["max_relative_loss_difference"] < 1e-4
    assert got["same_generation"] == 6


# --- the harness end to end ------------------------------------------------------------------------------
def test_harness_runs_both_sides_and_renders_the_table(parity, tmp_path: Path, capsys) -> None:
    """`parity mlm --smoke --together`: the toolkit and the reference each in their own
    process, both at once, on a tiny random MiniLM; the table with both sides, the paired
    difference and the JSON."""
    out = tmp_path / "mlm.json"
    assert parity.main(["mlm", "--smoke", "--seeds", "42", "--together", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    sides = {r["side"]: r for r in result["rows"]}
    assert set(sides) == {"toolkit", "reference"}
    assert all(r["together"] for r in result["rows"])
    for row in sides.values():
        assert np.isfinite(row["metrics"]["perplexity"]) and row["metrics"]["perplexity"] > 1
        assert row["train_samples_per_s"] > 0 and row["peak_rss_mb"] > 0
    # an untrained tiny model: both sides near the uniform loss over the vocabulary
    assert sides["toolkit"]["metrics"]["loss"] == pytest.approx(sides["reference"]["metrics"]["loss"], rel=0.05)
    # both trained models scored again by one scorer on one mask set (the sides' own evaluations
    # differ by design): near each other, and not a copy of either side's own figure
    one = {s: r["metrics"]["loss_one_mask_set"] for s, r in sides.items()}
    assert one["toolkit"] == pytest.approx(one["reference"], rel=0.05)
    assert one["toolkit"] != sides["toolkit"]["metrics"]["loss"] and one["reference"] != sides["reference"]["metrics"]["loss"]
    printed = capsys.readouterr().out
    assert "| toolkit |" in printed and "| transformers (reference) |" in printed and "paired difference" in printed


def test_bad_seeds_are_one_line(parity, capsys) -> None:
    assert _refused(parity, ["mlm", "--seeds", "4x"], capsys).startswith("error: benchmarks/parity: --seeds:")


def test_reference_clm_eval_loss_is_per_predicted_token(parity, tiny_checkpoint, tmp_path: Path) -> None:
    """Finding: Trainer normalised GPT-2's causal loss by every label, not by the L-1 that the
    shift leaves, so its eval loss read (L-1)/L of the true one (10.48 for 10.82 at L = 32). Two
    blocks of 4 tokens: 3 predictions each, and the reference's loss is the mean of those 6."""
    import torch
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments, default_data_collator

    model = parity.causal_lm(tiny_checkpoint("gpt2"), None).eval()
    ids = [[10, 20, 30, 40], [50, 60, 70, 80]]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor(ids)).logits, -1)  # (2, 4, vocab)
    by_hand = -sum(float(logp[b, t, ids[b][t + 1]]) for b in range(2) for t in range(3)) / 6
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to=[], use_cpu=True)
    trainer = Trainer(model=model, args=args, data_collator=default_data_collator)
    got = trainer.evaluate(Dataset.from_dict({"input_ids": ids, "labels": ids}))["eval_loss"]
    assert got == pytest.approx(by_hand, rel=1e-5)


@pytest.mark.parametrize("task", ["mlm", "clm"])
def test_reference_blocks_equal_the_toolkits_packing(parity, task: str) -> None:
    """run_mlm / run_clm's group_texts in the benchmark and the toolkit's packing give the same
    training blocks ([CLS] doc [SEP] per document for MLM; for CLM the gpt2-clm recipe's running
    text, run_clm's lines with their \n, <|endoftext|> once at its end)."""
    from toolkit import models

    tokenizer = {"mlm": "bert-base-uncased", "clm": "gpt2"}[task]
    tok = models.load_tokenizer(str(models.tokenizer_dir() / tokenizer))
    limits = ["task.max_train_samples=40", "task.max_eval_samples=8", "task.max_length=32"]
    recipe = parity.resolved_recipe(task, limits + (["task.eval_stride=32"] if task == "clm" else []))
    train, _ = parity.raw_splits(recipe)
    end = [] if task == "mlm" else [tok.eos_token_id]
    ours = parity.grouped(tok, list(train["text"]), recipe.task.block_length(tok), task == "mlm", end,
                          breaks=recipe.task.line_breaks())
    assert recipe.task.line_breaks() == (task == "clm")
    theirs = recipe.task.pack(train, tok)
    assert len(ours["input_ids"]) == len(theirs) > 1
    assert ours["input_ids"] == [list(x) for x in theirs["input_ids"]]


def _sides_in_this_process(parity, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """`compare`'s sides run one after the other in this process, by `side` (what the fresh
    process runs with --side, reading the same SET and BATCHES): where what is compared is the
    sides' computation, not their processes (the harness test starts those), three interpreters'
    start-up spared. Returns the (task, side) run so."""
    import argparse

    ran: list[tuple[str, str]] = []

    def run_side(task: str, which: str, seed: int, smoke: bool, full: bool = False) -> dict:
        ran.append((task, which))
        return parity.sides.side(argparse.Namespace(task=task, side=which, seed=seed, smoke=smoke, full=full))

    monkeypatch.setattr(parity.cli, "run_side", run_side)
    return ran


def test_seq2seq_reference_loss_equals_the_toolkits(parity, tmp_path: Path, monkeypatch) -> None:
    """`parity translation --smoke`: MiniLM2MiniLM on both sides from the same tiny random
    weights and rows; the reference's teacher-forced loss per target token (seq2seq_loss) is the
    toolkit's eval loss, and the table carries it beside BLEU and chrF, scored under the recipe's
    task.bleu_tokenize on both sides (it reached the toolkit's scorer alone, exit 0)."""
    ran = _sides_in_this_process(parity, monkeypatch)
    tokenized = []
    scores = parity.seq2seq.bleu_scores
    monkeypatch.setattr(parity.seq2seq, "bleu_scores", lambda p, r, tokenize="13a": tokenized.append(tokenize) or scores(p, r, tokenize))
    out = tmp_path / "translation.json"
    assert parity.main(["translation", "--smoke", "--seeds", "42", "--json", str(out), "--set", "task.bleu_tokenize=char"]) == 0
    assert tokenized == ["char"]
    sides = {r["side"]: r["metrics"] for r in json.loads(out.read_text())["rows"]}
    assert np.isfinite(sides["toolkit"]["loss"]) and sides["toolkit"]["loss"] > 1
    assert sides["toolkit"]["loss"] == pytest.approx(sides["reference"]["loss"], rel=0.01)
    assert set(sides["reference"]) >= {"loss", "bleu", "chrf"}
    rows = json.loads(out.read_text())["rows"]  # both sides over the same eval examples (same_examples)
    assert rows[0]["eval_sha256"] == rows[1]["eval_sha256"] and rows[0]["eval_examples"] == rows[1]["eval_examples"] == 8
    # --only reference --reference-batches toolkit: one row, the reference's, on the toolkit's batches
    alone = tmp_path / "alone.json"
    assert parity.main(["translation", "--smoke", "--seeds", "42", "--only", "reference",
                        "--reference-batches", "toolkit", "--json", str(alone)]) == 0
    result = json.loads(alone.read_text())
    assert [(r["side"], r["batches"]) for r in result["rows"]] == [("reference", "toolkit")]
    assert result["reference_batches"] == "toolkit"
    assert result["rows"][0]["metrics"]["loss"] == pytest.approx(sides["toolkit"]["loss"], rel=0.01)
    assert ran == [("translation", "toolkit"), ("translation", "reference"), ("translation", "reference")]


@pytest.mark.parametrize("task", ["translation", "qa", "clm"])
def test_one_whole_batch_without_dropout_is_the_same_computation(parity, task: str, tmp_path: Path) -> None:
    """With dropout off and every training example in one batch (so batch order and dropout
    masks, the two things the sides draw differently, are out), three optimizer steps on each
    side end at the same model: the same teacher-forced loss, BLEU and chrF (seq2seq: labels,
    the decoder's start token, padding out of the loss, AdamW, clipping, weight decay, the
    schedule, greedy generation) and the same answers (QA: windows, span labels, n-best). Caught
    nothing so far; it is what rules the pipelines out when a seed's gap looks large. CLM: the
    blocks, labels = inputs, the loss per predicted token (the reference names loss_type)."""
    path = parity.checkpoint_path(parity.SPECS[task].checkpoint, True)
    dropped = ("task.max_train_samples", "task.max_eval_samples", "train.epochs", "train.batch_size", "train.lr")
    over = [o for o in parity.overrides(task, True, path, 42) if not o.startswith(dropped)]
    # one eval batch too: Trainer's eval_loss (run_clm's perplexity) is the mean of the batches'
    # means, which weighs a short last batch's tokens more than the toolkit's per-token mean
    # clm: the test file's first 38 lines, read as one running text (documents: text, as run_clm
    # reads it), are whole blocks of 32 tokens; with 40 (11 tokens over) the sides differ by that
    # partial block alone (1.3e-4 of the perplexity), which the toolkit's stride evaluation scores
    # and run_clm's group_texts drops
    evals = 38 if task == "clm" else 8
    over += ["task.max_train_samples=12", f"task.max_eval_samples={evals}", "train.epochs=3", "train.batch_size=512",
             "train.eval_batch_size=512", "train.warmup_ratio=0", "model.dropout=0", "train.lr=1e-3",
             "train.weight_decay=0.01"]
    theirs = parity.REFERENCES[task](parity.resolved_recipe(task, over), path, tmp_path / "reference")
    ours = parity.toolkit_side(task, over, tmp_path / "toolkit")
    for metric, value in theirs["metrics"].items():
        assert ours["metrics"][metric] == pytest.approx(value, rel=1e-4, abs=1e-6), metric
    if task != "clm":  # no outputs to compare
        assert ours["distinct_predictions"] == theirs["distinct_predictions"]
    # three steps moved the model below the uniform loss (ln 30522 = 10.33 for MiniLM's vocabulary,
    # ln 50257 = 10.82 for GPT-2's)
    uniform = {"translation": math.log(30522), "clm": math.log(50257)}
    if task in uniform:
        assert theirs["metrics"]["loss"] < uniform[task] - 0.02


@pytest.mark.parametrize("grouped", [True, False])
def test_reference_batches_as_the_recipe_does(parity, grouped: bool, tmp_path: Path) -> None:
    """Finding (H200, SAMSum full protocol, 3 seeds): the toolkit grouped batches by length and the
    reference drew them at random, and the toolkit's summaries came out shorter on every seed
    (12.5-13.1 against 13.9-16.5 words) at the same loss. A step's loss is the mean over its
    batch's target tokens, so the batching decides each token's weight: the reference now
    batches as the recipe says (Trainer's LengthGroupedSampler under train.group_by_length)."""
    import torch
    from datasets import Dataset
    from transformers import Trainer
    from transformers.trainer_pt_utils import LengthGroupedSampler

    recipe = parity.resolved_recipe("qa", [f"train.group_by_length={str(grouped).lower()}", "train.batch_size=4"])
    lengths = [1 + (7 * i) % 40 for i in range(400)]
    data = Dataset.from_dict({"input_ids": [[1] * n for n in lengths]})
    trainer = Trainer(model=torch.nn.Linear(1, 1), args=parity.training_arguments(recipe, tmp_path), train_dataset=data)
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, LengthGroupedSampler) == grouped
    order = list(sampler)
    assert sorted(order) == list(range(len(lengths)))
    # grouped: a batch's lengths lie close together, far closer than in random batches
    spread = statistics.mean(max(lengths[i] for i in order[b:b + 4]) - min(lengths[i] for i in order[b:b + 4])
                             for b in range(0, len(order), 4))
    assert (spread < 5) == grouped, spread


def test_reference_can_train_on_the_toolkits_batches(parity, tmp_path: Path, shared_lists) -> None:
    """`--reference-batches toolkit`: the Trainer's training run (two epochs, recorded at its
    collator) sees exactly the batches the toolkit's loop draws for the recipe and seed, in the
    same order, epoch by epoch; Trainer's own sampler sees others. Built to tell whether the
    Multi30k loss gap (lower on every seed on the toolkit's side) comes from the batch order."""
    from transformers import AutoTokenizer

    from toolkit.batching import EpochBatches

    path = parity.checkpoint_path(parity.MINILM, True)
    from toolkit.recipe_data import layered

    over = layered(parity.overrides("translation", True, path, 7), ["train.batch_size=3", "train.epochs=2",
                                                                      "task.max_train_samples=14"])
    recipe = parity.resolved_recipe("translation", over)
    tok = AutoTokenizer.from_pretrained(path)
    train = recipe.method.encoder(recipe.task, tok)(recipe.task.load()["train"])  # the toolkit's features
    assert train["example_index"] != sorted(train["example_index"])  # kept longest first, not in raw order
    sampler = EpochBatches([len(ids) for ids in train["input_ids"]], 3, 7, True, 3)
    expected = []
    for epoch in range(2):
        sampler.use_epoch(epoch)
        expected += [[train[i]["input_ids"] for i in batch] for batch in sampler]

    def served(batches: str) -> list:
        parity.BATCHES[:] = [batches]
        trainer = parity.seq2seq_trainer(recipe, path, tmp_path / batches)[0]
        seen, collate = [], trainer.data_collator
        trainer.data_collator = lambda rows: seen.append([r["input_ids"] for r in rows]) or collate(rows)
        trainer.train()
        return seen

    ours = served("toolkit")
    assert len(expected) == 10 and len(expected[4]) == 2  # 14 rows in batches of 3: the short one ends each epoch
    assert ours == expected
    assert served("trainer") != expected


def test_toolkit_steps_shuffle_where_trainers_grouping_runs_long_to_short(parity) -> None:
    """Finding (Multi30k, 4 seeds): the toolkit's trained model had a lower loss on every seed
    (-0.10 per token, t = -4.02) against Trainer's LengthGroupedSampler. Trainer sorts each
    mega-batch of 50 batches long to short, so consecutive steps march down in length within
    every mega-batch; the toolkit groups the same way and then shuffles the steps. Trained on the
    toolkit's very batches (`--reference-batches toolkit`), the reference lost the gap. Here the
    two orders themselves: the share of steps no longer than the one before."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from toolkit.batching import EpochBatches

    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.integers(8, 64, size=6000)]
    ours = list(EpochBatches(lengths, 32, 42, True, 32))
    order = list(LengthGroupedSampler(32, lengths=lengths, generator=torch.Generator().manual_seed(42)))
    theirs = [order[i:i + 32] for i in range(0, len(order), 32)]

    def falling(batches: list[list[int]]) -> float:
        means = [statistics.mean(lengths[i] for i in b) for b in batches]
        return statistics.mean(b <= a for a, b in zip(means, means[1:]))

    assert falling(theirs) > 0.9  # long to short but at each mega-batch's start
    assert 0.4 < falling(ours) < 0.6  # as likely up as down: no run


def _saved_result(path: Path, seed: int, f1s: tuple[float, float], full: bool = True,
                  batches: str | None = None, sides: tuple[str, ...] = ("toolkit", "reference"),
                  examples: tuple[int, str] = (400, "ab12")) -> Path:
    rows = [{"side": side, "seed": seed, "metrics": {"f1": f1, "exact_match": f1 / 2},
             "train_samples_per_s": 10.0, "eval_samples_per_s": 20.0, "peak_rss_mb": 100.0, "cpu_s": 5.0,
             "eval_examples": examples[0], "eval_sha256": examples[1]}
            for side, f1 in zip(("toolkit", "reference"), f1s) if side in sides]
    result = {"smoke": False, "full": full, "rows": rows, "baselines": {}}
    if batches:  # runs before --reference-batches existed recorded none (Trainer's own)
        result["reference_batches"] = batches
    path.write_text(json.dumps(result))
    return path


def test_merge_pairs_one_side_of_a_run_with_another_runs_other_side(parity, tmp_path: Path, capsys) -> None:
    """`--merge toolkit:A reference:B`: the toolkit's rows of a both-sided run beside an `--only
    reference` run's (here on the toolkit's batches); the table says whose batches the reference
    trained on."""
    a = _saved_result(tmp_path / "a.json", 42, (0.70, 0.50))  # its reference row (0.50) is left out
    b = _saved_result(tmp_path / "b.json", 42, (0.0, 0.66), batches="toolkit", sides=("reference",))
    out = tmp_path / "merged.json"
    assert parity.main(["qa", "--merge", f"toolkit:{a}", f"reference:{b}", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "+4.00 (1 seed)" in printed and "the reference trained on the toolkit's batches" in printed
    merged = json.loads(out.read_text())
    assert merged["reference_batches"] == "toolkit" and len(merged["rows"]) == 2


def test_merge_renders_seeds_run_apart(parity, tmp_path: Path, capsys) -> None:
    """`--merge`: seeds run in separate calls (a GPU lent a few minutes at a time) make one table,
    with the paired difference over all of them."""
    a = _saved_result(tmp_path / "a.json", 42, (0.70, 0.68))
    b = _saved_result(tmp_path / "b.json", 43, (0.60, 0.61))
    out = tmp_path / "merged.json"
    assert parity.main(["qa", "--merge", str(a), str(b), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "seeds 42, 43" in printed
    # toolkit minus reference per seed: +2 and -1 F1 points, mean +0.5
    assert "+0.50 ± 2.12 (t = +0.33, n = 2)" in printed
    assert len(json.loads(out.read_text())["rows"]) == 4


@pytest.mark.parametrize("case, message", [
    ("same seed twice", "seed 42 (toolkit) is in both"),
    ("other task", "not a `summarization` result"),
    ("budgets differ", "different budgets"),
    ("not json", "not a readable --json result"),
    ("one side", "seed 42 has one side only"),
    ("batches differ", "trained on different batches"),
    ("side absent", "no reference rows"),
    # the two sides of a seed over different eval examples: no paired difference (runs of two checkouts
    # whose load() picks other rows, paired by --merge SIDE:FILE)
    ("examples differ", "seed 42: the toolkit scored 400 eval examples and the reference 399, not the same ones"),
])
def test_merge_errors_are_one_line(parity, case: str, message: str, tmp_path: Path, capsys) -> None:
    a = _saved_result(tmp_path / "a.json", 42, (0.7, 0.6))
    task, files = "qa", [a, a]
    if case == "other task":
        task, files = "summarization", [a]
    elif case == "budgets differ":
        files = [a, _saved_result(tmp_path / "b.json", 43, (0.7, 0.6), full=False)]
    elif case == "not json":
        bad = tmp_path / "bad.json"
        bad.write_bytes(b"\xff\xfe{")
        files = [bad]
    elif case == "one side":
        files = [f"toolkit:{a}"]
    elif case == "batches differ":
        files = [a, _saved_result(tmp_path / "b.json", 43, (0.7, 0.6), batches="toolkit")]
    elif case == "examples differ":
        files = [f"toolkit:{a}", f"reference:{_saved_result(tmp_path / 'b.json', 42, (0.7, 0.6), examples=(399, 'cd34'))}"]
    elif case == "side absent":
        files = [f"reference:{_saved_result(tmp_path / 'b.json', 43, (0.7, 0.6), sides=('toolkit',))}"]
    err = _refused(parity, [task, "--merge", *map(str, files)], capsys)
    assert err.startswith("error: benchmarks/parity: --merge:") and message in err and err.count("\n") == 1


def test_end_token_weight_grows_with_grouping_only_when_lengths_go_together() -> None:
    """benchmarks/end_token_weight.py: equal targets weigh the same however batched; targets as
    long as their sources weigh their end tokens more in length-grouped batches."""
    spec = importlib.util.spec_from_file_location("end_token_weight", ROOT / "benchmarks" / "end_token_weight.py")
    etw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(etw)
    source = [5 + (37 * i) % 200 for i in range(800)]
    flat = etw.weights(source, [20] * 800, batch_size=16, seed=1, epochs=2)
    assert all(v == pytest.approx(1 / 20) for v in flat.values())
    together = etw.weights(source, list(source), batch_size=16, seed=1, epochs=2)
    random = together["toolkit, random batches"]
    assert together["toolkit, grouped by length"] > 1.5 * random
    assert together["Trainer's LengthGroupedSampler"] > 1.5 * random
    # by hand: batches [0, 1] (targets 2 + 2) and [2] (target 4): (2/4 + 1/4) / 2
    assert etw.end_weight([[0, 1], [2]], [2, 2, 4]) == pytest.approx(0.375)


def test_seq2seq_generation_equals_seq2seqtrainers(parity, tmp_path: Path) -> None:
    """Given one model, the toolkit's evaluation-time generation (length-sorted batches of its
    own collator, the recipe's beam 4, no_repeat_ngram_size 3, length penalty) and
    Seq2SeqTrainer.predict(**the same settings) on the reference's features give the same
    summaries (on the real MiniLM2MiniLM too, 24 of 24 with batches of 16 composed differently).
    Without `in_order` this fails: under length-grouped training Trainer also groups evaluation
    batches, and predict() returns the rows permuted. Checked when the GPU rows' summaries came out shorter on the toolkit's side: the
    gap is not in generation. The cross-attention and LM head are scaled up so that the untrained
    tiny model's outputs differ per input."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer

    path = parity.checkpoint_path(parity.MINILM, True)
    over = [o for o in parity.overrides("summarization", True, path, 42) if not o.startswith(("task.generation", "task.max_eval"))]
    recipe = parity.resolved_recipe("summarization", over + ["task.max_eval_samples=12", "task.generation.max_new_tokens=12"])
    task, (_, rows) = recipe.task, parity.raw_splits(recipe)
    assert task.generation.num_beams == 4 and task.generation.no_repeat_ngram_size == 3
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    model = parity.encoder_decoder(path, tok)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "crossattention" in name or "decoder.cls" in name:
                weight.mul_(8)
    model.eval()
    enc = tok(list(rows["source"]), truncation=True, max_length=task.max_length)
    labels = tok(text_target=list(rows["target"]), truncation=True, max_length=task.max_target_length)
    features = Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                                  "labels": labels["input_ids"]})
    trainer = parity.in_order(Seq2SeqTrainer(
        model=model, args=parity.training_arguments(recipe, tmp_path, seq2seq=True, predict_with_generate=True),
        data_collator=DataCollatorForSeq2Seq(tok, model=model, label_pad_token_id=-100)))
    ids = trainer.predict(features, **parity.generation_kwargs(task)).predictions
    ids[ids < 0] = tok.pad_token_id
    theirs = [t.strip() for t in tok.batch_decode(ids, skip_special_tokens=True)]
    encoded, collate = task.encode(rows, tok), task.collator(tok, model)
    ours: dict[int, str] = {}
    # one batch on each side (the reference's eval batch, 16, holds the 12): the same padding, so
    # float rounding cannot flip a near-tie between beams; what is compared is the collators, the
    # settings and the decoding
    batch = collate([encoded[j] for j in range(len(encoded))])
    for k, out in zip(batch["example_index"].tolist(), task.generate(model, batch).tolist()):
        ours[k] = tok.decode([t for t in out if t >= 0], skip_special_tokens=True).strip()
    assert len(set(theirs)) > len(theirs) // 2  # outputs that differ per input
    assert [ours[k] for k in range(len(theirs))] == theirs


def test_merge_of_the_recorded_gpu_runs_renders_the_documented_table(parity, capsys) -> None:
    """The H200 rows in docs/numbers.md come from docs/parity/*.json through --merge: on a GPU the
    table shows each side's wall time and CUDA peak memory, and the GPU's name."""
    files = [str(ROOT / "docs" / "parity" / f"h200-qa-seed{s}.json") for s in (42, 43, 44)]
    assert parity.main(["qa", "--merge", *files]) == 0
    printed = capsys.readouterr().out
    assert "the recipe's own protocol, on one NVIDIA H200; seeds 42, 43, 44" in printed
    assert "| wall s (whole side) | peak GPU MB |" in printed and "CPU s" not in printed
    assert "| toolkit | 69.86 ± 0.85 |" in printed
    assert "-0.00 ± 0.58 (t = -0.01, n = 3)" in printed
    numbers = (ROOT / "docs" / "numbers.md").read_text()
    assert printed.strip().splitlines()[4] in numbers  # the toolkit's row, as documented


def test_one_mask_set_is_one_mask_set(parity, tmp_path: Path) -> None:
    """The MLM cross-scorer draws the same masks whatever ran before it: one model scored twice,
    with torch's generator moved in between, gives the same loss to the last digit."""
    import torch
    from transformers import AutoModelForMaskedLM

    path = parity.checkpoint_path(parity.MINILM, True)
    recipe = parity.resolved_recipe("mlm", parity.overrides("mlm", True, path, 42))
    torch.manual_seed(1)  # a trained MLM's folder holds its head (the checkpoint's body has none)
    AutoModelForMaskedLM.from_pretrained(path).save_pretrained(tmp_path / "model")
    first = parity.one_mask_set_loss(str(tmp_path / "model"), path, recipe)
    torch.rand(1000)
    assert parity.one_mask_set_loss(str(tmp_path / "model"), path, recipe) == first
    assert math.isfinite(first) and first > 1


@pytest.mark.parametrize("value, message", [
    ("train.epochz=2", "error: train.epochz: unknown key"),
    ("train.seed=3", "error: --set: 'train.seed=3' is not a KEY=VALUE"),
    ("epochs", "error: --set: 'epochs' is not a KEY=VALUE"),
])
def test_bad_set_is_one_line(parity, value: str, message: str, capsys) -> None:
    said = _refused(parity, ["qa", "--smoke", "--seeds", "42", "--set", value], capsys)
    line = said.replace("\r", "\n").splitlines()[-1]  # (a fresh smoke cache's build draws a progress bar first)
    assert line.startswith(message.replace("error: ", "error: benchmarks/parity: ", 1)) and said.count("error:") == 1


def _refused(parity, argv: list[str], capsys) -> str:
    """What `benchmarks/parity ARGV` says on stderr, where it stops with exit 2 (its parser's one line)."""
    with pytest.raises(SystemExit) as stop:
        parity.main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_set_reaches_both_sides(parity, monkeypatch, shared_lists) -> None:
    """--set KEY=VALUE: in place of the budget's own value of that setting, and passed on to each side's
    process; the table's heading names it."""
    seen = []
    monkeypatch.setattr(parity.sides.subprocess, "Popen", lambda cmd, **kw: seen.append(cmd))
    parity.SET[:] = ["train.epochs=2"]
    over = parity.overrides("qa", False, "ckpt", 42)
    assert "train.epochs=2" in over and "train.epochs=1" not in over  # it replaces the budget's
    parity.start_side("qa", "reference", 42, False, False, threads=None)
    assert "--set=train.epochs=2" in seen[0]
    rows = [{"side": s, "seed": 42, "metrics": {"f1": 0.5, "exact_match": 0.4}, "train_samples_per_s": 1.0,
             "eval_samples_per_s": 1.0, "peak_rss_mb": 1.0, "cpu_s": 1.0} for s in ("toolkit", "reference")]
    head = parity.render("qa", {"smoke": False, "full": False, "set": ["train.epochs=2"], "rows": rows})
    assert head.startswith("**qa** (1,600 train questions") and "; then --set train.epochs=2; seeds 42)" in head.splitlines()[0]


@pytest.mark.parametrize("task", ["qa", "mlm", "clm", "gpt2"])
def test_set_attention_reaches_the_reference_or_is_refused(parity, monkeypatch, shared_lists, task: str, capsys) -> None:
    """--set model.attention: one of transformers' names is the reference's attn_implementation too (each
    reference's from_pretrained gets it); a toolkit module, which transformers' own model has none of, is one
    line, exit 2. Finding: the setting reached the toolkit's side only, and the table compared performer (or
    eager) with the reference's sdpa as one protocol, exit 0."""
    import transformers

    class Loaded(Exception):
        pass

    def load(path, **kwargs):
        raise Loaded(kwargs.get("attn_implementation"))

    for auto in ("AutoModelForQuestionAnswering", "AutoModelForMaskedLM", "AutoModelForCausalLM"):
        monkeypatch.setattr(getattr(transformers, auto), "from_pretrained", load)
    path = parity.checkpoint_path(parity.SPECS[task].checkpoint, True)
    parity.SET[:] = ["model.attention=eager"]
    recipe = parity.resolved_recipe(task, parity.overrides(task, True, path, 42))
    with pytest.raises(Loaded) as loaded:
        parity.REFERENCES[task](recipe, path, Path("unused"))
    assert str(loaded.value) == "eager"
    parity.SET[:] = []
    if task == "qa":
        said = _refused(parity, [task, "--smoke", "--seeds", "42", "--set", "model.attention={name: local, window: 8}"], capsys)
        line = said.replace("\r", "\n").splitlines()[-1]
        assert line.startswith("error: benchmarks/parity: model.attention: {name: local, cross: false, window: 8, causal: false} "
                               "is a toolkit module") and said.count("error:") == 1


@pytest.mark.parametrize("argv, message", [
    (["mlm", "--reference-batches", "toolkit"], "error: --reference-batches toolkit: mlm's reference is not wired"),
    (["translation", "--only", "reference", "--together"], "error: --only: --together runs both sides"),
    (["translation", "--only", "reference", "--merge", "a.json"], "error: --only: --merge runs nothing"),
    (["translation", "--merge", "a.json", "--reference-batches", "toolkit"],
     "error: --reference-batches toolkit: --merge trains nothing"),
    (["translation", "--only", "toolkit", "--reference-batches", "toolkit"],
     "error: --reference-batches toolkit: --only toolkit trains no reference"),
])
def test_reference_batches_and_only_refuse_in_one_line(parity, argv: list[str], message: str, capsys) -> None:
    err = _refused(parity, argv, capsys)
    assert err.startswith(message.replace("error: ", "error: benchmarks/parity: ", 1)) and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["objectives", "--set", "train.epochs=2"],
                                  ["qa", "--merge", "a.json", "--set", "train.epochs=2"]])
def test_set_where_nothing_trains_is_one_line(parity, argv: list[str], capsys) -> None:
    """--set is refused where it would be ignored (objectives and icl train nothing; --merge runs nothing)."""
    err = _refused(parity, argv, capsys)
    assert err.startswith("error: benchmarks/parity: --set:") and "no recipe to override" in err and err.count("\n") == 1


@pytest.mark.parametrize("ours, theirs, shown", [
    ([1.0, 2.0, 3.0], [0.5, 1.0, 2.0], "+0.83 ± 0.29 (t = +5.00, n = 3)"),  # diffs .5, 1, 1
    ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], "+0.00 ± 0.00 (equal on every seed, n = 3)"),
    ([2.0, 3.0], [1.0, 2.0], "+1.00 ± 0.00 (the same difference on every seed, n = 2)"),
    ([0.83, 0.87], [0.80, 0.84], "+0.03 ± 0.00 (the same difference on every seed, n = 2)"),  # to float rounding
    ([2.0], [1.5], "+0.50 (1 seed)"),
])
def test_paired_difference_hand_worked(parity, ours: list[float], theirs: list[float], shown: str) -> None:
    """Toolkit minus reference per seed: mean ± std and the paired t; no t where the differences
    do not spread (a metric both sides score 0 on every seed printed 't = +inf')."""
    assert parity.paired(ours, theirs) == shown


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc tunables")
def test_malloc_tunables_keep_a_freed_large_block_for_reuse() -> None:
    """benchmarks/malloc_trim.py's premise: with glibc's defaults freed large tensors (a GPT-2
    step's logits at 16 x 128 are 400 MB; here 64 MB, over glibc's largest mmap threshold, 32 MB,
    as they are) go back to the kernel, and every round of three page-faults all their 49,152
    pages again; with the two tunables the README names, the heap keeps them and a later round
    reuses them."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import malloc_trim; "
            "print(malloc_trim.refault(64))")
    spec = importlib.util.spec_from_file_location("malloc_trim", ROOT / "benchmarks" / "malloc_trim.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base = {k: v for k, v in os.environ.items() if k not in module.TUNED}
    faults = {}
    for name, env in (("default", base), ("tuned", {**base, **module.TUNED})):
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
        faults[name] = int(out.split()[-1])
    assert faults["default"] > 48_000, faults
    assert faults["tuned"] < 1_000, faults


def test_reference_decodes_as_the_toolkit_does(parity) -> None:
    """Finding: with transformers 5's default for MiniLM's tokenizer (no clean-up of tokenization
    spaces) the reference wrote "he ' s birthday ." where the toolkit writes "he's birthday.", so
    the table's word counts read longer on the reference's side with the same tokens (this is what
    made the GPU's SAMSum summaries look 15-20% shorter on the toolkit's side). The reference now
    decodes as the toolkit; ROUGE was never affected (rouge-score drops punctuation)."""
    from transformers import AutoTokenizer

    from toolkit.tasks._text_metrics import rouge

    tok = AutoTokenizer.from_pretrained(parity.checkpoint_path(parity.MINILM, True))
    text = "tom is going to buy the car. he's birthday, isn't it?"
    ids = [tok(text)["input_ids"]]
    raw = tok.batch_decode(ids, skip_special_tokens=True)[0]
    assert raw == "tom is going to buy the car. he ' s birthday, isn ' t it?"  # transformers' default here
    assert parity.decode(tok, ids) == [text]
    assert parity.distinct(parity.decode(tok, ids)) == "1/1, 11.0 words"
    assert parity.distinct([raw]) == "1/1, 15.0 words"
    reference = ["Tom will buy the car for his birthday."]
    assert rouge([raw], reference) == rouge([text], reference)


def test_malloc_trim_bad_counts_are_one_line() -> None:
    """benchmarks/malloc_trim.py: a count it cannot measure with is one line and exit 2, before
    any process starts."""
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "malloc_trim.py"), "--steps", "1"],
                         capture_output=True, text=True)
    assert got.returncode == 2
    assert got.stderr.strip() == ("error: benchmarks/malloc_trim.py: --steps must be at least 2, got 1 "
                                  "(benchmarks/malloc_trim.py --help lists its options)")


@pytest.mark.parametrize("sets", [["train.grad_accum=3"], ["train.max_steps=7", "train.grad_accum=2"],
                                  ["train.epochs=2.5", "train.warmup_ratio=0.3", "train.grad_accum=2"]])
def test_the_reference_takes_the_recipes_steps_and_schedule(parity, sets: list[str], tmp_path: Path) -> None:
    """`--set train.grad_accum=N` or `train.max_steps=N` reached the toolkit's side only: the
    Trainer reference stepped on every batch, or trained every epoch, and the table compared the
    two as one protocol (exit 0). Trainer now takes the recipe's optimizer steps, warm-up and
    accumulation: its step count, warm-up steps and accumulation equal the toolkit loop's."""
    import torch
    from datasets import Dataset
    from transformers import Trainer

    recipe = parity.resolved_recipe("qa", ["train.batch_size=4", "train.group_by_length=false", *sets])
    rows = 23
    data = Dataset.from_dict({"input_ids": [[1, 2]] * rows})
    args = parity.training_arguments(recipe, tmp_path, remove_unused_columns=False)
    trainer = Trainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=data)
    max_steps = trainer.set_initial_training_values(args, trainer.get_train_dataloader())[-1]
    total = recipe.train.optimizer_steps(rows)[1]
    assert max_steps == total and args.get_warmup_steps(total) == recipe.train.warmup(total)
    assert args.gradient_accumulation_steps == recipe.train.grad_accum


def test_the_loop_steps_as_trainer_does_on_the_same_batches(parity, tiny_checkpoint, tmp_path: Path) -> None:
    """One short CLM run of the toolkit and of transformers' Trainer from the same tiny GPT-2, on
    the same batches in the same order: 2 micro-batches of 2 accumulated (the epoch's last window
    one micro-batch), 2 epochs, warmup_ratio 0.3, weight decay 0.01, clipping at 1.0. The steps,
    the learning rate each step trained at and the final weights are Trainer's (docs/loop.md)."""
    import torch
    from safetensors.torch import load_file
    from transformers import Trainer, TrainerCallback

    import toolkit
    from toolkit.recipe import load
    from toolkit.recipe_data import RunPlan
    from toolkit.setup import build

    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(f"""model: {{checkpoint: {tiny_checkpoint("gpt2")}, dropout: 0.0}}
task: {{name: clm, max_length: 16, train_file: $TOOLKIT_DATA/lm/ptb/ptb.valid.txt,
        eval_file: $TOOLKIT_DATA/lm/ptb/ptb.test.txt, max_train_samples: 10, max_eval_samples: 4}}
method: {{name: full}}
train: {{epochs: 2, lr: 1.0e-3, batch_size: 2, grad_accum: 2, warmup_ratio: 0.3, weight_decay: 0.01,
         group_by_length: false, log_every: 1, eval_every: 0, keep_best: false, seed: 3}}
""")
    run = toolkit.run(recipe_file, runs_dir=tmp_path / "runs")
    ours = [(e["step"], e["lr"]) for e in map(json.loads, (run.dir / "log.jsonl").read_text().splitlines())
            if "loss" in e]

    recipe = load(str(recipe_file))
    setup = build(RunPlan(recipe))  # the same encoded blocks and initial weights
    assert len(setup.train) % 4 == 3  # the epoch's last window is one micro-batch
    collate = setup.task.collator(setup.tokenizer, setup.model)
    logged = []

    class Logged(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
            if logs and "loss" in logs:
                logged.append((state.global_step, logs["learning_rate"]))

    args = parity.training_arguments(recipe, tmp_path / "trainer", remove_unused_columns=False, logging_steps=1)
    args.logging_strategy = "steps"
    trainer = Trainer(model=setup.model, args=args, train_dataset=setup.train, callbacks=[Logged()],
                      data_collator=lambda rows: {k: v for k, v in collate(rows).items()
                                                  if k in ("input_ids", "attention_mask", "labels")})
    lengths = [len(ids) for ids in setup.train["input_ids"]]
    trainer._get_train_sampler = lambda dataset=None: parity.ToolkitBatches(lengths, list(range(len(lengths))), recipe)
    trainer.train()
    assert [s for s, _ in ours] == [s for s, _ in logged] == list(range(1, 9))  # 2 epochs of 4 steps
    assert [lr for _, lr in ours] == pytest.approx([lr for _, lr in logged], rel=1e-12, abs=1e-15)
    final = load_file(next((run.dir / "model").glob("*.safetensors")))
    theirs = trainer.model.state_dict()
    for key, value in final.items():
        torch.testing.assert_close(value, theirs[key], atol=2e-5, rtol=0)


# RoBERTa and BART (BERT's kinds of norms and biases, a head pooled at the end token as T5's) passed
# too when this was written; one family per kind of model keeps the suite's time
@pytest.mark.parametrize("family", ["bert", "gpt2", "t5"])
def test_classification_steps_as_trainer_does_on_the_same_batches(parity, tiny_checkpoint, tmp_path: Path,
                                                                  family: str) -> None:
    """SST-2 classification, full fine-tuning, of the toolkit and of Trainer from the same tiny
    encoder, decoder and encoder-decoder, on the same batches (2 epochs of 14 examples in
    4 + 4 + 4 + 2: every epoch's last batch short), warmup_ratio 0.3, weight decay 0.1 (each family's own norms and
    biases left out), clipping at 1.0: per step the learning rate, loss and gradient norm, and the
    final weights, are Trainer's (docs/loop.md)."""
    import torch
    from safetensors.torch import load_file
    from transformers import Trainer, TrainerCallback

    import toolkit
    from toolkit.recipe import load
    from toolkit.recipe_data import RunPlan
    from toolkit.setup import build

    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(f"""model: {{checkpoint: {tiny_checkpoint(family)}, dropout: 0.0}}
task: {{name: glue, subset: sst2, max_length: 32, max_train_samples: 14, max_eval_samples: 4}}
method: {{name: full}}
train: {{epochs: 2, lr: 1.0e-3, batch_size: 4, warmup_ratio: 0.3, weight_decay: 0.1, group_by_length: false,
         log_every: 1, eval_every: 0, keep_best: false, seed: 3}}
""")
    run = toolkit.run(recipe_file, runs_dir=tmp_path / "runs")
    ours = [(e["step"], e["lr"], e["loss"], e["grad_norm"])
            for e in map(json.loads, (run.dir / "log.jsonl").read_text().splitlines()) if "loss" in e]
    recipe = load(str(recipe_file))
    setup = build(RunPlan(recipe))
    collate = setup.task.collator(setup.tokenizer, setup.model)
    logged = []

    class Logged(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
            if logs and "loss" in logs:
                logged.append((state.global_step, logs["learning_rate"], logs["loss"], logs["grad_norm"]))

    args = parity.training_arguments(recipe, tmp_path / "trainer", remove_unused_columns=False, logging_steps=1)
    args.logging_strategy = "steps"
    keys = ("input_ids", "attention_mask", "token_type_ids", "labels")
    trainer = Trainer(model=setup.model, args=args, train_dataset=setup.train, callbacks=[Logged()],
                      data_collator=lambda rows: {k: v for k, v in collate(rows).items() if k in keys})
    lengths = [len(ids) for ids in setup.train["input_ids"]]
    trainer._get_train_sampler = lambda dataset=None: parity.ToolkitBatches(lengths, list(range(len(lengths))), recipe)
    trainer.train()
    assert [s for s, *_ in ours] == [s for s, *_ in logged] == list(range(1, 9))
    for mine, theirs in zip(ours, logged):
        assert mine[1:] == pytest.approx(theirs[1:], rel=1e-5, abs=1e-12), (mine, theirs)
    final = load_file(next((run.dir / "model").glob("*.safetensors")))
    state = trainer.model.state_dict()
    for key, value in final.items():
        torch.testing.assert_close(value, state[key], atol=1e-6, rtol=0)


# (parity task, family, head, whether Trainer 5.24 doubles its loss under 2 accumulated micro-batches)
TRAINER_GA = [("(glue)", "bert", "sequence", True), ("(ner)", "bert", "token", True),
              ("qa, qa2", "minilm", "qa", False), ("mlm", "minilm", "mlm", True),
              ("summarization, translation", "minilm2minilm", "seq2seq", True), ("(t5 recipes)", "t5", "seq2seq", True),
              ("(bart recipes)", "bart", "seq2seq", True), ("clm, gpt2", "gpt2", "clm", False)]


@pytest.mark.parametrize("tasks, family, head, doubled", TRAINER_GA, ids=[f"{f}-{h}" for _, f, h, _ in TRAINER_GA])
def test_which_heads_trainer_scales_twice_under_accumulation(tiny_checkpoint, tmp_path: Path, tasks, family, head,
                                                             doubled) -> None:
    """What docs/loop.md and docs/benchmarks.md say of the parity reference under grad_accum: Trainer
    skips its division by the accumulation steps wherever the batch has `labels` and the forward
    takes `**kwargs`, and only a loss that reads `num_items_in_batch` makes up for it
    (transformers#47688). Its logged loss over 2 micro-batches of 2 equal rows, at lr 0, against
    the mean of their losses: 2x on classification, MLM and every seq2seq head (the encoder-decoder
    of the summarization and translation rows too), 1x on QA (its batches hold no `labels`, so
    Trainer divides) and on GPT-2's CLM (its loss reads the count; (L-1)/L of it: every label counted)."""
    import torch
    import transformers as T
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from conftest import MINILM
    from toolkit import models

    path = models.smoke_checkpoint(MINILM) if family.startswith("minilm") else tiny_checkpoint(family)
    auto = {"sequence": T.AutoModelForSequenceClassification, "token": T.AutoModelForTokenClassification,
            "qa": T.AutoModelForQuestionAnswering, "mlm": T.AutoModelForMaskedLM, "clm": T.AutoModelForCausalLM,
            "seq2seq": T.AutoModelForSeq2SeqLM}[head]
    torch.manual_seed(0)
    if family == "minilm2minilm":  # what model.warm_start: encoder-decoder builds
        model = T.EncoderDecoderModel.from_encoder_decoder_pretrained(path, path)
        model.config.decoder_start_token_id, model.config.pad_token_id = 101, 0
    else:
        model = auto.from_pretrained(path, **({"num_labels": 3} if head in ("sequence", "token") else {}))
    model.eval()
    model.train = lambda mode=True: model  # Trainer's train() keeps it so: no dropout, the same forward as below
    vocab = model.config.get_text_config(decoder=True).vocab_size
    g = torch.Generator().manual_seed(1)
    rows = []
    for i in range(4):
        ids = torch.randint(5, vocab, (6,), generator=g)
        row = {"input_ids": ids, "attention_mask": torch.ones(6, dtype=torch.long)}
        row.update({"sequence": {"labels": torch.tensor(i % 3)}, "token": {"labels": ids % 3},
                    "qa": {"start_positions": torch.tensor(i), "end_positions": torch.tensor(i + 1)},
                    "mlm": {"labels": torch.where(torch.arange(6) % 2 == 0, ids, -100)}, "clm": {"labels": ids},
                    "seq2seq": {"labels": torch.randint(5, vocab, (4,), generator=g)}}[head])
        rows.append(row)
    stack = lambda batch: {k: torch.stack([r[k] for r in batch]) for k in batch[0]}  # noqa: E731
    with torch.no_grad():
        mean = sum(model(**stack(rows[i:i + 2])).loss.item() for i in (0, 2)) / 2
    logged = []

    class Logged(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
            logged.extend([logs["loss"]] if logs and "loss" in logs else [])

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, max_steps=1, learning_rate=0.0, logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True, train_sampling_strategy="sequential",
                             remove_unused_columns=False, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=rows, data_collator=stack, callbacks=[Logged()]).train()
    assert round(logged[0] / mean) == (2 if doubled else 1), (tasks, logged[0] / mean)


@pytest.mark.parametrize("verbose", [False, True])
def test_a_benchmark_is_quiet_as_the_toolkit_is(tmp_path: Path, verbose: bool) -> None:
    """`benchmarks/parity qa --smoke` with a fresh cache builds its small model first: transformers'
    "Writing model shards" bar (and DeepSpeed's CPU notice) came on stderr before the script's own
    line, where `toolkit` says nothing of the kind. Benchmark scripts parse through ScriptParser,
    which quiets the libraries as `toolkit` does; -v shows them (a --set the recipe refuses: the
    build, then one line, exit 2)."""
    env = {**os.environ, "TOOLKIT_CACHE": str(tmp_path / "cache")}
    env.pop("TOOLKIT_VERBOSE", None)
    said = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "parity"), "qa", "--smoke", "--seeds", "42",
                           "--set", "train.epochz=2", *(["-v"] if verbose else [])],
                          env=env, capture_output=True, text=True, timeout=300)
    assert said.returncode == 2 and any((tmp_path / "cache" / "smoke").iterdir()), said.stderr
    assert ("Writing model shards" in said.stderr) == verbose, said.stderr
    if not verbose:
        assert said.stderr.splitlines() == [said.stderr.strip()] and said.stderr.startswith(
            "error: benchmarks/parity: train.epochz: unknown key"), said.stderr


# --- every --set reaches both sides, or is refused in one line ------------------------------------
def test_every_recipe_setting_of_every_task_is_classified(parity) -> None:
    """Every setting of every task type's recipe (model, task, method, train; task.generation's
    spelled out) has its place in the harness's table (specs.REACH): read by the reference too,
    read by the task's load() that both sides call, changing neither side's numbers, or refused
    with the reason. A new recipe field fails here until it is placed (unplaced: refused)."""
    for task in parity.SPECS:
        path = parity.checkpoint_path(parity.SPECS[task].checkpoint, True)
        recipe = parity.resolved_recipe(task, parity.overrides(task, True, path, 42))
        unknown = [k for k in parity.settings(recipe) if parity.reach(task, k).startswith("not known")]
        assert not unknown, f"{task}: place {unknown} in benchmarks/parity/specs.py REACH"


@pytest.mark.parametrize("task, value, said", [
    ("qa", "method.name=lora", "--set: method.name ('lora') would reach the toolkit's side only: the reference trains every weight"),
    ("mlm", "task.line_by_line=true", "--set: task.line_by_line (True) would reach the toolkit's side only"),
    ("mlm", "task.whole_word_mask=true", "--set: task.whole_word_mask (True) would reach the toolkit's side only"),
    ("summarization", "task.suffix=' TL;DR:'", "--set: task.suffix (' TL;DR:') would reach the toolkit's side only: "
                                             "run_summarization / run_translation take a source prefix only"),
    ("translation", "train.length_buckets=[16,32]", "--set: train.length_buckets ([16, 32]) would reach the toolkit's"),
    ("gpt2", "train.keep_best=true", "--set: train.keep_best (True) would reach the toolkit's side only"),
    ("qa", "train.pad_multiple=8", "--set: train.pad_multiple (8) would reach the toolkit's side only"),
    ("clm", "task.eval_stride=16", "task.eval_stride: 16 scores each window with 16 tokens of context, and the "
                                   "reference (run_clm) scores non-overlapping blocks; set --set task.eval_stride=32"),
])
def test_a_set_the_reference_cannot_take_is_one_line(parity, monkeypatch, task: str, value: str, said: str,
                                                     capsys) -> None:
    """Finding: every --set went into both sides' recipe, but the reference read only some of it:
    `method.name=lora`, `task.line_by_line=true`, `train.length_buckets`, `train.keep_best=true`,
    ... changed the toolkit's side alone and the table compared two protocols as one, exit 0.
    Now one line, exit 2, before any side runs."""
    monkeypatch.setattr(parity.cli, "run_side", lambda *a, **k: pytest.fail("a side ran"))
    err = _refused(parity, [task, "--smoke", "--seeds", "42", "--set", value], capsys)
    line = err.replace("\r", "\n").splitlines()[-1]
    assert line.startswith("error: benchmarks/parity: " + said) and err.count("error:") == 1


def test_the_settings_the_reference_reads_reach_it(parity, tmp_path: Path) -> None:
    """The settings the reference now reads as the toolkit does (each reached the toolkit's side
    alone, exit 0): task.prefix is run_summarization's source prefix (the reference's features are
    the toolkit's); train.gradient_checkpointing is Trainer's; task.mask_ratio / random_ratio are
    the collator's replace probabilities; task.bleu_tokenize is sacreBLEU's (the baseline's too)."""
    from transformers import AutoTokenizer

    path = parity.checkpoint_path(parity.MINILM, True)
    parity.SET[:] = ["task.prefix='summarize this: '", "train.gradient_checkpointing=true"]
    recipe = parity.resolved_recipe("summarization", parity.overrides("summarization", True, path, 42))
    trainer, tok, _, _ = parity.seq2seq_trainer(recipe, path, tmp_path)
    ours = recipe.method.encoder(recipe.task, tok)(parity.raw_splits(recipe)[0])["input_ids"]
    theirs = trainer.train_dataset["input_ids"]
    assert sorted(map(tuple, ours)) == sorted(map(tuple, theirs))
    prefix = tok("summarize this:", add_special_tokens=False)["input_ids"]
    assert all(ids[1:1 + len(prefix)] == prefix for ids in theirs)
    assert trainer.args.gradient_checkpointing
    parity.SET[:] = ["task.mask_ratio=0.5", "task.random_ratio=0.3"]
    recipe = parity.resolved_recipe("mlm", parity.overrides("mlm", True, path, 42))
    collator = parity.masking(AutoTokenizer.from_pretrained(path), recipe.task)
    assert (collator.mask_replace_prob, collator.random_replace_prob) == (0.5, 0.3)
    parity.SET[:] = ["task.bleu_tokenize=char"]
    recipe = parity.resolved_recipe("translation", parity.overrides("translation", True, path, 42))
    copied = parity.baselines("translation", recipe)["source copied"]["bleu"]
    _, rows = parity.raw_splits(recipe)
    import sacrebleu

    assert copied == sacrebleu.corpus_bleu(list(rows["source"]), [list(rows["target"])], tokenize="char").score
    assert copied != parity.bleu_scores(list(rows["source"]), list(rows["target"]))["bleu"]
