"""Translation: Multi30k and IWSLT14 here, WMT from the Hub, or a user's own files.

Direction and pair come from `source_lang` / `target_lang`. Local data is line-aligned parallel
text (a path with `{lang}`, filled with each side's code; `.gz` too) or JSON/JSONL/CSV/TSV records
with one field per language. Scores are sacreBLEU corpus BLEU and chrF on the detokenised output;
their signatures are recorded in metrics.json (`metric_info`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from toolkit.errors import UserError
from toolkit.tasks import TASKS, Metric, _fields, declaration
from toolkit.tasks._generation import TextToText, read_pairs
from toolkit.tasks._text_metrics import HANGUL, SPACE_BASED, sacrebleu_scores, sacrebleu_signatures, spaceless_script, \
    written_in
from toolkit.tasks.summarization import hub_pairs, load_pairs

LANGUAGES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian", "cs": "Czech",
             "ru": "Russian", "fi": "Finnish", "tr": "Turkish", "es": "Spanish", "it": "Italian",
             "nl": "Dutch", "zh": "Chinese", "ja": "Japanese", "ko": "Korean"}
# subset -> (local train pattern, local eval pattern, languages available locally)
LOCAL = {
    "multi30k": ("$TOOLKIT_DATA/translation/multi30k/train.{lang}.gz",
                 "$TOOLKIT_DATA/translation/multi30k/test_2016_flickr.{lang}.gz", ("en", "de", "fr")),
    # no IWSLT14 train split here: valid trains, test scores (fairseq's tokenised, lower-cased text)
    "iwslt14": ("$TOOLKIT_DATA/translation/iwslt14-de-en/valid.{lang}",
                "$TOOLKIT_DATA/translation/iwslt14-de-en/test.{lang}", ("de", "en")),
}
HUB = {"wmt14": "wmt/wmt14", "wmt16": "wmt/wmt16"}
# Languages written without spaces between words -> the BLEU tokenizers that find their words
# (sacreBLEU's own choice for the language first): the space-based ones would score whole phrases
# as single words, a BLEU near 0 for a good translation
SPACELESS = {"zh": ("zh", "char"), "ja": ("ja-mecab", "char")}
# Target languages sacreBLEU scores with its own tokenizer alone (its CLI's choice for `-tl`), by
# the language part of the code (ko, ko-KR, ko_KR) -> (that tokenizer, the module it needs, the
# pip extra): Korean is written with spaces, but 13a on it is not the score sacreBLEU reports
OFFICIAL_ONLY = {"ko": ("ko-mecab", "mecab_ko", "sacrebleu[ko]")}
# the tokenizers that need a package of their own -> (that module, the pip extra)
NEEDS = {"ja-mecab": ("MeCab", "sacrebleu[ja]"), "ko-mecab": ("mecab_ko", "sacrebleu[ko]")}


def primary(code: str) -> str:
    """A language code's primary subtag, what every rule keyed by language reads (BCP 47: zh-CN,
    zh_cn, zh-Hans-TW are Chinese; case and `-`/`_` ignored). The spaceless-script refusal read
    the code whole: `target_lang: zh-CN` with 13a passed validate, refused only at load, where
    `zh` was refused at once."""
    tag = _fields.language_tag(code)
    return tag[0] if tag else ""


def language_name(code: str) -> str:
    """The language's English name for prompts (`LANGUAGES`) by the code's language part (de-DE,
    de_DE, DE); the code itself where that part is not known."""
    return LANGUAGES.get(primary(code), code)


@TASKS.register("translation")
@dataclass(kw_only=True)
class Translation(TextToText):

    names = ("source sentences", "target sentences")  # what a cut is counted in

    subset: Literal["multi30k", "iwslt14", "wmt14", "wmt16", "custom"] = "multi30k"
    source_lang: str = "en"
    target_lang: str = "de"
    train_file: str | None = None  # parallel text with {lang}, or JSON / JSONL / CSV / TSV
    eval_file: str | None = None
    field_keys: ClassVar[tuple[str, ...]] = ("source_field",)
    scored_keys: ClassVar[tuple[str, ...]] = ("target_field",)
    source_field: str | None = None  # records: default the language codes
    target_field: str | None = None
    case_sensitive: ClassVar[str] = "BLEU and chrF"  # sacreBLEU's defaults (lowercase=False), as published
    bleu_tokenize: Literal["13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "none"] = "13a"

    def check(self) -> None:
        super().check()
        if _fields.language_tag(self.source_lang) == _fields.language_tag(self.target_lang):  # zh-CN is zh_cn
            raise UserError(f"task.target_lang: '{self.target_lang}' is also the source language "
                            f"('{self.source_lang}')")
        if self.subset == "custom" and not self.eval_file:
            raise UserError("task.eval_file: subset 'custom' reads local files; set task.eval_file")
        language = primary(self.target_lang)
        official = OFFICIAL_ONLY.get(language)
        if official and self.bleu_tokenize != official[0]:
            raise UserError(f"task.bleu_tokenize: {LANGUAGES[language]} (task.target_lang {self.target_lang}) is "
                            f"scored by sacreBLEU with {official[0]}, not '{self.bleu_tokenize}'; set "
                            f"task.bleu_tokenize={official[0]} (needs pip install '{official[2]}')")
        module, extra = NEEDS.get(self.bleu_tokenize, (None, None))
        if module and importlib.util.find_spec(module) is None:
            alternative = "" if official else ", or use task.bleu_tokenize=char"
            raise UserError(f"task.bleu_tokenize: {self.bleu_tokenize} needs {module}, which is not installed "
                            f"(pip install '{extra}'){alternative}")
        fits = SPACELESS.get(language)
        if fits and self.bleu_tokenize not in fits:
            raise UserError(f"task.bleu_tokenize: '{self.bleu_tokenize}' splits words at spaces, which "
                            f"{LANGUAGES[language]} (task.target_lang {self.target_lang}) does not "
                            f"write, so BLEU would be near 0 for any translation; set task.bleu_tokenize="
                            f"{fits[0]} (sacreBLEU's for {language}) or {fits[1]}")
        if self.subset in LOCAL and not self.eval_file:
            langs = LOCAL[self.subset][2]
            for key in ("source_lang", "target_lang"):
                if getattr(self, key) not in langs:
                    raise UserError(f"task.{key}: {self.subset} here has {', '.join(langs)}, "
                                    f"not '{getattr(self, key)}'")

    def declared_metrics(self) -> list[Metric]:
        return [declaration("bleu"), declaration("chrf")]

    def language_hints(self) -> tuple[tuple[str, str | None], tuple[str, str | None]]:
        return ("task.source_lang", self.source_lang), ("task.target_lang", self.target_lang)

    def metric_info(self) -> dict[str, str]:
        # the reference counts per example of the split scored (`score`): nrefs in the signature
        return {**sacrebleu_signatures(self.bleu_tokenize, self.reference_counts()), **super().metric_info()}

    def prompt_basis(self) -> dict[str, Any]:
        return {"source_lang": self.source_lang, "target_lang": self.target_lang}

    def default_affixes(self, family: str | None, decoder_only: bool) -> tuple[str, str]:
        """T5's prompt names the languages as T5 was trained ("translate English to German: "):
        a full code (de-DE, de_DE, zh-Hans) by its language part, where that is known; an
        unknown code as written."""
        return self._affixes(family, decoder_only, language_name(self.source_lang), language_name(self.target_lang))

    def unrecorded_affixes(self, family: str | None, decoder_only: bool) -> tuple[str, str]:
        """A run from before the prompt was recorded was built by the whole code (de-DE as
        written): it reads so."""
        return self._affixes(family, decoder_only, LANGUAGES.get(self.source_lang, self.source_lang),
                             LANGUAGES.get(self.target_lang, self.target_lang))

    @staticmethod
    def _affixes(family: str | None, decoder_only: bool, src: str, tgt: str) -> tuple[str, str]:
        if family == "t5":
            return f"translate {src} to {tgt}: ", ""
        return (f"{src}: ", f"\n{tgt}:") if decoder_only else ("", "")

    def data_patterns(self) -> list[str]:
        """The files `load` reads: the recipe's or the preset's (`sources`)."""
        return [p for p in self.sources()[:2] if p]

    def head_fields(self) -> list[tuple[str, Path, list[tuple[str, str]]]]:
        """Fields a recipe names (unnamed ones are found in the file at load, `pick_fields`)."""
        named = [(f, k) for f, k in ((self.source_field, "task.source_field"),
                                     (self.target_field, "task.target_field")) if f]
        return [(f"task.{key}", Path(self.expand(value)), named)
                for key, value in (("train_file", self.train_file), ("eval_file", self.eval_file))
                if value and "{lang}" not in value]

    def sources(self) -> tuple[str | None, str | None, str | None, str | None]:
        if self.eval_file or self.train_file or self.subset == "custom":
            return self.train_file, self.eval_file, None, None
        if self.subset in LOCAL:
            return LOCAL[self.subset][0], LOCAL[self.subset][1], None, None
        pair = "-".join(sorted((self.source_lang, self.target_lang), key=lambda c: c == "en"))
        return None, None, HUB[self.subset], pair  # WMT configs are named xx-en

    def read(self, pattern: str, role: Literal["train", "eval"] | None = None) -> Any:
        return read_pairs(self.expand(pattern), self.source_field, self.target_field,
                          (self.source_lang, self.target_lang), pick=self.pick_fields, note=self.note, role=role)

    def pick_fields(self, ds: Any, where: str) -> tuple[str, str]:
        """The source and target fields of records: the recipe's, else the fields the languages'
        codes name (any case, `-` or `_`: zh-CN, zh_cn; `pt_BR` for pt where it is the one such
        field, `_fields.language_field`), else `source` / `target`; never by content (two sentences look alike), so anything else
        is one line naming task.source_field / task.target_field."""
        _fields.note_spaced(self, list(ds.column_names), where)
        source, target = self.__dict__.get("_found_fields") or (self.source_field, self.target_field)
        columns = list(ds.column_names)
        source = source or _fields.language_field(columns, self.source_lang, where)
        target = target or _fields.language_field([c for c in columns if c != source], self.target_lang, where)
        found = _fields.pick_pair(ds, where, source, target,
                                  _fields.Keys("task.source_field", "task.target_field"),
                                  (self.source_lang, "source", "src", "input"),
                                  (self.target_lang, "target", "tgt", "translation", "output"),
                                  measure=None, fill=False)
        self._found_fields = found  # not the settings: the recipe's hash stays as written
        return found

    def from_hub(self, hub_id: str, config: str | None, eval_split: str) -> tuple[Any, Any]:
        s, t = f"translation.{self.source_lang}", f"translation.{self.target_lang}"
        return hub_pairs(self, hub_id, config, "train", s, t), hub_pairs(self, hub_id, config, eval_split, s, t)

    def load(self) -> dict[str, Any]:
        data = self.checked(load_pairs(self))
        self.counted_references(data["eval"][""])  # --split train: the eval split's counts until one is scored
        return data

    def split_file(self, split: str) -> str:
        train, evaluation, _, _ = self.sources()
        return (evaluation if split == "eval" else train) or self.subset

    def check_references(self, references: list[list[str]], split: str) -> None:
        """The references themselves, wherever the language code does not say it (zh-CN, cmn,
        th, a custom code): a space-based BLEU tokenizer on text mostly in a script written
        without spaces scores a sentence as one word, BLEU near 0 for any translation. Refused
        before training, as `check` refuses it for zh and ja by their codes. References mostly in
        Hangul take ko-mecab alone, as `check` has it for ko: a Korean target named otherwise
        (NLLB's kor_Hang, kor, a code of its own) was scored with 13a, exit 0. Every reference of
        an example with several counts (their letters, all together)."""
        references = [r for refs in references for r in refs]
        if self.bleu_tokenize != OFFICIAL_ONLY["ko"][0] and written_in(references, HANGUL) > 0.5:
            where = self.split_file(split)
            raise UserError(f"task.bleu_tokenize: most letters of the references in {where} are Korean (Hangul), "
                            f"which sacreBLEU scores with ko-mecab, not '{self.bleu_tokenize}' (task.target_lang "
                            f"{self.target_lang} does not say Korean as ko does); set task.bleu_tokenize=ko-mecab "
                            "(needs pip install 'sacrebleu[ko]')")
        found = spaceless_script(references) if self.bleu_tokenize in SPACE_BASED else None
        if found:
            script, share, fits = found
            where = self.split_file(split)
            raise UserError(f"task.bleu_tokenize: '{self.bleu_tokenize}' splits words at spaces, and {share:.0%} of "
                            f"the letters of the references in {where} are {script}, written without spaces, so "
                            f"BLEU would be near 0 for any translation; set task.bleu_tokenize="
                            + " or ".join(fits))

    def source_name(self) -> str:
        if (self.train_file or self.eval_file) and not self.source_field:
            return self.found_source() or self.source_lang
        return self.source_field or self.source_lang

    def input_fields(self, names: list[str], kinds: dict[str, str], where: str) -> list[str]:
        """A run on its own files reads every file by the fields found in the first (or set), and
        its predict inputs so (`names`); a preset's run finds a file's source field anew, as
        `toolkit eval RUN task.eval_file=NEW` does (`pick_fields`: the field the source language's
        code names, any case, `-` or `_`, then `source`, `src`, `input`; never the one field left),
        and its inputs alike: predict demanded `de` where eval read NEW's `DE` or `de_DE`."""
        if self.source_field or self.train_file or self.eval_file or self.subset == "custom":
            return names
        columns = list(kinds)
        found = _fields.language_field(columns, self.source_lang, where)
        return [found or _fields.one_text(columns, where, (self.source_lang, "source", "src", "input"),
                                          lambda first: f"name it {names[0]} in the input", fill=False)]

    def score(self, outputs: dict[str, np.ndarray], raw: Any) -> dict[str, float]:
        scores, _ = sacrebleu_scores(self.decoded(outputs), self.counted_references(raw), self.bleu_tokenize)
        return scores
