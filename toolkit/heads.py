"""Model heads by name: which transformers auto class loads a model with it, the table that says
which model types have one, and the PEFT task type that wraps it.

A task names its head (`Task.head` / `model_head`); a task that needs a head the toolkit has not
used before declares it in its own file with `declare`, so adding a task touches no shared table.
Names, not classes: importing transformers' auto classes imports torch, and `toolkit validate`
reads only the tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.errors import UserError
from toolkit.registry import did_you_mean


@dataclass(frozen=True)
class Head:
    auto_class: str  # transformers' AutoModelFor... class name
    table: str  # its model_type -> class name table in transformers.models.auto.modeling_auto
    peft_task_type: str = ""  # PEFT TaskType name; "": PEFT has none (a plain PeftModel wraps it)
    # read left to right: the output at a position may depend on no later token (a causal LM's
    # loss and generation rely on it); models.check_head and models.load refuse a model that is not
    left_to_right: bool = False


HEADS: dict[str, Head] = {}


def declare(name: str, head: Head) -> str:
    """Make `name` a head models.load can build; returns the name (for a task's `head = ...`)."""
    if HEADS.get(name, head) != head:
        raise ValueError(f"head '{name}' is declared twice, differently")
    HEADS[name] = head
    return name


def get(name: str) -> Head:
    if name not in HEADS:
        raise UserError(f"unknown model head '{name}'{did_you_mean(name, sorted(HEADS))}")
    return HEADS[name]


SEQUENCE_CLASSIFICATION = declare("sequence-classification", Head(
    "AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "SEQ_CLS"))
CAUSAL_LM = declare("causal-lm", Head("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "CAUSAL_LM",
                                      left_to_right=True))
SEQ2SEQ_LM = declare("seq2seq-lm", Head(
    "AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "SEQ_2_SEQ_LM"))
QUESTION_ANSWERING = declare("question-answering", Head(
    "AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "QUESTION_ANS"))
MASKED_LM = declare("masked-lm", Head("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"))
