"""Summarization and translation's reference (run_summarization / run_translation): an
encoder-decoder on Seq2SeqTrainer, generation, ROUGE and sacreBLEU called directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from parity.common import batched, bert_dropout, distinct, in_order, raw_splits, timed, training_arguments


# --- reference: summarization and translation (run_summarization / run_translation) -----------
def encoder_decoder(path: str, tok: Any, **config: Any) -> Any:
    """BERT2BERT as transformers documents it: both halves from the encoder checkpoint, [CLS]
    starts decoding, [SEP] ends it. `config`: encoder_/decoder_-prefixed config values."""
    from transformers import EncoderDecoderModel

    model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path, **config)
    model.config.decoder_start_token_id = tok.cls_token_id
    model.config.eos_token_id, model.config.pad_token_id = tok.sep_token_id, tok.pad_token_id
    model.generation_config.decoder_start_token_id = tok.cls_token_id
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.sep_token_id, tok.pad_token_id
    return model


def generation_kwargs(task: Any) -> dict:
    """The recipe's decoding settings; those it leaves unset stay the model's generation_config,
    as Seq2SeqTrainer leaves them."""
    return {**task.generation.chosen(), "max_new_tokens": task.new_tokens(), "do_sample": False}


def seq2seq_trainer(recipe: Any, path: str, out: Path) -> tuple[Any, Any, Callable[[Any], Any], Any]:
    """(Seq2SeqTrainer ready to train, tokenizer, features(rows), the eval rows): sources
    truncated to max_length, targets to max_target_length, DataCollatorForSeq2Seq (labels -100)."""
    from datasets import Dataset
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer, set_seed

    task = recipe.task
    train_rows, eval_rows = raw_splits(recipe)
    tok = AutoTokenizer.from_pretrained(path)
    set_seed(recipe.train.seed)
    model = encoder_decoder(path, tok, **{f"{half}_{k}": v for half in ("encoder", "decoder")
                                          for k, v in bert_dropout(recipe).items()})

    prefix = task.prefix or ""  # run_summarization's source_prefix (BERT2BERT's default prompt is none)

    def features(rows: Any) -> Any:
        enc = tok([prefix + s for s in rows["source"]], truncation=True, max_length=task.max_length)
        labels = tok(text_target=list(rows["target"]), truncation=True, max_length=task.max_target_length)
        return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                                  "labels": labels["input_ids"]})

    trainer = batched(in_order(Seq2SeqTrainer(
        model=model, args=training_arguments(recipe, out, seq2seq=True, predict_with_generate=True),
        train_dataset=features(train_rows), data_collator=DataCollatorForSeq2Seq(tok, model=model, label_pad_token_id=-100))),
        recipe, tok, train_rows)
    return trainer, tok, features, eval_rows


def reference_seq2seq(recipe: Any, path: str, out: Path) -> dict:
    """Seq2SeqTrainer with predict_with_generate (`seq2seq_trainer`), the recipe's generation
    settings, the teacher-forced loss per target token."""
    task = recipe.task
    trainer, tok, features, eval_rows = seq2seq_trainer(recipe, path, out)
    model = trainer.model
    result = trainer.train()
    test = features(eval_rows)

    def evaluate() -> tuple[list[str], dict[str, float]]:
        """Generation, the scorer and the teacher-forced loss: what the toolkit's evaluation
        timer covers (it computes the loss in the same pass as generation)."""
        ids = trainer.predict(test, **generation_kwargs(task)).predictions
        ids[ids < 0] = tok.pad_token_id
        preds = decode(tok, ids)
        refs = list(eval_rows["target"])
        scores = rouge_scores(preds, refs) if recipe.task.name == "summarization" \
            else bleu_scores(preds, refs, task.bleu_tokenize)
        scores["loss"] = seq2seq_loss(model, test, trainer.data_collator, trainer.args.per_device_eval_batch_size)
        return preds, scores

    (preds, metrics), seconds = timed(evaluate)
    return {"metrics": metrics, "train_samples_per_s": result.metrics["train_samples_per_second"],
            "eval_samples_per_s": len(preds) / seconds, "train_s": result.metrics["train_runtime"],
            "distinct_predictions": distinct(preds)}


def decode(tok: Any, ids: Any) -> list[str]:
    """Generated ids -> texts, as the toolkit decodes them (`decode_texts`): special tokens
    dropped and, for a tokenizer that spaces every token (MiniLM's WordPiece), the spaces before
    punctuation and inside contractions cleaned up ("he's", not "he ' s"). Finding: transformers 5 leaves `clean_up_tokenization_spaces` off for MiniLM's
    tokenizer, so the reference's texts had a space around every mark and the table's word
    counts read longer on its side for the same tokens (10.6 against 8.8 words on one trained
    MiniLM2MiniLM's SAMSum summaries). ROUGE scores both spellings the same (rouge-score keeps
    letters and digits only); sacreBLEU's 13a tokenizer keeps an apostrophe inside a word, so
    BLEU could differ where outputs hold contractions."""
    from toolkit.tasks._generation import decode_texts

    return decode_texts(tok, ids)


def summed_loss(model: Any, batch: dict, shifted: bool) -> tuple[float, int]:
    """(the batch's summed loss, its labelled tokens): the model's mean over the labelled tokens
    (after the causal shift when `shifted`) times their count. Summed over batches and divided by
    the total count, this is the loss per token the toolkit reports; Trainer's eval_loss averages
    the batches' means instead."""
    batch = {k: v.to(model.device) for k, v in batch.items()}  # the collator's CPU tensors, a GPU's model
    labels = batch["labels"][:, 1:] if shifted else batch["labels"]
    n = int((labels != -100).sum())
    return float(model(**batch).loss) * n, n


def seq2seq_loss(model: Any, test: Any, collate: Callable, size: int) -> float:
    """Teacher-forced loss per target token over the test set (the toolkit's eval loss)."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(test), size):
            loss, n = summed_loss(model, collate([test[j] for j in range(i, min(i + size, len(test)))]), shifted=False)
            total, count = total + loss, count + n
    return total / max(count, 1)


def rouge_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    """rouge-score F-measures with the Porter stemmer, averaged over examples; rougeLsum on one
    sentence per line (pysbd's segmentation: NLTK's punkt cannot be downloaded here)."""
    import pysbd
    from rouge_score import rouge_scorer

    seg = pysbd.Segmenter(language="en", clean=False)
    lines = lambda text: "\n".join(s.strip() for s in seg.segment(text) if s.strip())
    keys = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
    scorer = rouge_scorer.RougeScorer(keys, use_stemmer=True)
    total = dict.fromkeys(keys, 0.0)
    for p, r in zip(predictions, references):
        plain = scorer.score(r, p)
        split = scorer.score(lines(r), lines(p))
        for k in keys:
            total[k] += (split if k == "rougeLsum" else plain)[k].fmeasure
    return {k: v / max(len(predictions), 1) for k, v in total.items()}


def bleu_scores(predictions: list[str], references: list[str], tokenize: str = "13a") -> dict[str, float]:
    """sacreBLEU's BLEU (under the recipe's task.bleu_tokenize, as the toolkit scores) and chrF."""
    import sacrebleu

    return {"bleu": sacrebleu.corpus_bleu(predictions, [references], tokenize=tokenize).score,
            "chrf": sacrebleu.corpus_chrf(predictions, [references]).score}
